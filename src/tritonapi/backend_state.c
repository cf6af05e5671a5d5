/*
 * This file contains TRITONBACKEND_State: implicit state of the sequence
 * batcher (its `state` list) for Triton backends.
 */
#include <stdlib.h>
#include <string.h>

#include "tritonapi/backend_objects.h"

/* ---- Implicit state (sequence batcher `state`) ----
 * The state is an output of the request named after the state's
 * output_name, which the sequence batcher keeps as the sequence's next
 * input state. As in Triton, TRITONBACKEND_StateUpdate commits it: the
 * buffer StateBuffer gives is the adapter's own until then (a state never
 * updated leaves the sequence's state as it was). With
 * use_same_buffer_for_input_output the buffer of the same size is the
 * request's input state itself, which is the sequence's buffer (the
 * scheduler lends it): a write is the new state, StateUpdate or not. */

/* The state config with this output_name, or NULL. */
static const tb_state_cfg_t *state_config(const TRITONBACKEND_Model *m, const char *name)
{
    for (size_t i = 0; i < m->n_states; i++)
        if (strcmp(m->states[i].output_name, name) == 0) return &m->states[i];
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_StateNew(TRITONBACKEND_State **state,
                                           TRITONBACKEND_Request *request, const char *name,
                                           const TRITONSERVER_DataType datatype,
                                           const int64_t *shape, const uint32_t dims_count)
{
    if (!state || !name || (!shape && dims_count)) return null_arg("state, name and shape");
    *state = NULL;
    TRITONSERVER_Error *err = live(request);
    if (err) return err;
    const TRITONBACKEND_Model *m = request->inst->model;
    const tb_state_cfg_t *cfg = state_config(m, name);
    if (!cfg)
        return m->n_states ? terr(TRITONSERVER_ERROR_INVALID_ARG,
                                  "state '%s' is not a valid state name.", name)
                           : terr(TRITONSERVER_ERROR_INVALID_ARG,
                                  "unable to add state '%s'. State configuration is missing for "
                                  "model '%s'.",
                                  name, model_name(m));
    size_t name_bytes = strlen(name) + 1;
    size_t shape_at = (sizeof(struct TRITONBACKEND_State) + name_bytes + 7) & ~(size_t)7;
    TRITONBACKEND_State *st = calloc(1, shape_at + dims_count * sizeof(int64_t) + 1);
    if (!st) return terr(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    memcpy(st->name, name, name_bytes);
    st->shape = (int64_t *)((char *)st + shape_at);
    if (dims_count) memcpy(st->shape, shape, dims_count * sizeof(int64_t));
    st->rank = dims_count;
    st->datatype = (nereid_datatype_t)datatype;
    st->cfg = cfg;
    st->request = request;
    st->next = request->states;
    request->states = st;
    *state = st;
    return NULL;
}

/* The request's input state when it can be the state's buffer (single
 * buffer, same size), else NULL. */
static void *single_buffer(TRITONBACKEND_State *st, uint64_t byte_size)
{
    if (!st->cfg->single_buffer) return NULL;
    nereid_datatype_t dt;
    const int64_t *shape;
    size_t rank, size;
    const void *data;
    nereid_error_t *e = nereid_batch_request_input(
        st->request->batch, st->request->r, st->cfg->input_name, &dt, &shape, &rank, &data, &size);
    if (e) {
        nereid_error_free(e);
        return NULL;
    }
    /* The sequence batcher's own buffer, lent for this request: writable. */
    return size == byte_size ? (void *)data : NULL;
}

TRITONSERVER_Error *TRITONBACKEND_StateBuffer(TRITONBACKEND_State *state, void **buffer,
                                              const uint64_t buffer_byte_size,
                                              TRITONSERVER_MemoryType *memory_type,
                                              int64_t *memory_type_id)
{
    if (!state || !buffer || !memory_type || !memory_type_id)
        return null_arg("state and out-parameters");
    *buffer = NULL;
    TRITONSERVER_Error *err = live(state->request);
    if (err) return err;
    /* Host memory always. Asked for GPU or pinned memory, it is reported as
     * CPU_PINNED: Triton's fallback for a state it cannot place on a GPU. */
    TRITONSERVER_MemoryType type = *memory_type == TRITONSERVER_MEMORY_CPU
                                       ? TRITONSERVER_MEMORY_CPU
                                       : TRITONSERVER_MEMORY_CPU_PINNED;
    if (!state->allocated || buffer_byte_size != state->attrs.byte_size) {
        /* First time, or another size: a new buffer (Triton reallocates). */
        void *b = single_buffer(state, buffer_byte_size);
        if (!b) {
            void *own = realloc(state->own, buffer_byte_size ? buffer_byte_size : 1);
            if (!own) return terr(TRITONSERVER_ERROR_INTERNAL, "out of memory");
            state->own = b = own;
        }
        state->buffer = b;
        state->allocated = true;
        state->attrs.byte_size = buffer_byte_size;
    }
    state->attrs.memory_type = type;
    state->attrs.memory_type_id = 0;
    *buffer = state->buffer;
    *memory_type = type;
    *memory_type_id = 0;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_StateBufferAttributes(TRITONBACKEND_State *state,
                                                        TRITONSERVER_BufferAttributes **attrs)
{
    if (!state || !attrs) return null_arg("state and buffer_attributes");
    *attrs = &state->attrs;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_StateUpdate(TRITONBACKEND_State *state)
{
    if (!state) return null_arg("state");
    TRITONSERVER_Error *err = live(state->request);
    if (err) return err;
    if (!state->allocated)
        return terr(TRITONSERVER_ERROR_INVALID_ARG,
                    "state '%s' has no buffer: call TRITONBACKEND_StateBuffer first", state->name);
    if (state->buffer != state->own) return NULL; /* the sequence's buffer, written in place */
    if (!state->committed) {
        nereid_error_t *e = nereid_batch_request_output(
            state->request->batch, state->request->r, state->name, state->datatype, state->shape,
            state->rank, state->attrs.byte_size, &state->committed);
        if (e) return (TRITONSERVER_Error *)e;
        state->committed_bytes = state->attrs.byte_size;
    } else if (state->committed_bytes != state->attrs.byte_size) {
        return terr(TRITONSERVER_ERROR_INVALID_ARG,
                    "state '%s' was already updated with a buffer of %zu bytes", state->name,
                    state->committed_bytes);
    }
    memcpy(state->committed, state->own, state->attrs.byte_size);
    return NULL;
}
