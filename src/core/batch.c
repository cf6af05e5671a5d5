/*
 * This file contains batch execution: the functions a backend calls during
 * execute (nereid_batch_* in backend.h), gathering inputs across requests,
 * allocating outputs (straight into the response for a batch of one),
 * scattering batched outputs back to the requests, and batch statistics.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/loader.h"
#include "core/core.h"
#include "core/rate_limiter.h"
#include "core/trace.h"
#include "core/decoupled.h"
#include "core/util.h"
#include "core/watchdog.h"
#include "sched/scheduler.h"

static void free_tensors(batch_tensor_t **t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(t[i]->name);
        if (t[i]->owned) free(t[i]->data);
        free(t[i]);
    }
    free(t);
}

void batch_reset(batch_t *batch)
{
    free_tensors(batch->inputs, batch->n_inputs);
    free_tensors(batch->outputs, batch->n_outputs);
    batch->inputs = batch->outputs = NULL;
    batch->n_inputs = batch->n_outputs = 0;
    batch->n_reqs = 0;
    batch->total_batch = 0;
    batch->filler_rows = 0;
    batch->timing_reported = false;
    batch->t_start_ns = batch->t_input_end_ns = batch->t_infer_end_ns = batch->t_end_ns = 0;
}

void batch_destroy(batch_t *batch)
{
    batch_reset(batch);
    free(batch->reqs);
    batch->reqs = NULL;
    batch->cap_reqs = 0;
}

/* Tensors are allocated one by one so pointers handed to a backend (shape,
 * data) stay valid while later tensors are added. */
static batch_tensor_t *push_tensor(batch_tensor_t ***arr, size_t *n, const char *name)
{
    *arr = xrealloc(*arr, (*n + 1) * sizeof **arr);
    batch_tensor_t *t = xcalloc(1, sizeof *t);
    (*arr)[(*n)++] = t;
    t->name = xstrdup(name);
    return t;
}

static batch_tensor_t *find_tensor(batch_tensor_t **arr, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(arr[i]->name, name) == 0) return arr[i];
    return NULL;
}

/* ---- Inputs ---- */

size_t nereid_batch_request_count(const nereid_batch_t *batch)
{
    return batch->n_reqs;
}

int64_t nereid_batch_size(const nereid_batch_t *batch)
{
    return batch->total_batch;
}

size_t nereid_batch_input_count(const nereid_batch_t *batch)
{
    return batch->n_reqs ? batch->reqs[0]->n_inputs : 0;
}

const char *nereid_batch_input_name(const nereid_batch_t *batch, size_t i)
{
    if (!batch->n_reqs || i >= batch->reqs[0]->n_inputs) return NULL;
    return batch->reqs[0]->inputs[i].name;
}

/* Ragged batching (Triton's allow_ragged_batch): a batching model gets such
 * an input as one flat tensor of the batch's elements, shape [elements]. */
static bool input_ragged(const model_t *m, const char *name)
{
    if (m->max_batch_size <= 0) return false;
    for (size_t i = 0; i < m->config->n_input; i++)
        if (strcmp(m->config->input[i]->name, name) == 0)
            return m->config->input[i]->allow_ragged_batch;
    return false;
}

/* The source input of a BATCH_SCATTER_WITH_INPUT_SHAPE batch output whose
 * target is `output`, or NULL: the backend produces such an output flat, and
 * each request gets its part shaped like its source input. */
static const char *scatter_source(const model_t *m, const char *output)
{
    if (m->max_batch_size <= 0) return NULL;
    for (size_t i = 0; i < m->config->n_batch_output; i++) {
        const Inference__BatchOutput *bo = m->config->batch_output[i];
        if (bo->kind != INFERENCE__BATCH_OUTPUT__KIND__BATCH_SCATTER_WITH_INPUT_SHAPE ||
            bo->n_source_input != 1)
            continue;
        for (size_t k = 0; k < bo->n_target_name; k++)
            if (strcmp(bo->target_name[k], output) == 0) return bo->source_input[0];
    }
    return NULL;
}

static int64_t elements(const int64_t *shape, size_t rank)
{
    int64_t n = 1;
    for (size_t d = 0; d < rank; d++)
        n *= shape[d];
    return n;
}

/* Gathers input `name` of every request into one tensor: [total_batch, ...]
 * or, for a ragged input, flat [elements] (then a single request's own
 * memory is used, not copied). */
static nereid_error_t *gather_input(nereid_batch_t *batch, const char *name, bool ragged,
                                    batch_tensor_t **out)
{
    size_t total = 0;
    int64_t count = 0;
    req_input_t *first = NULL;
    for (size_t r = 0; r < batch->n_reqs; r++) {
        req_input_t *in = request_find_input(batch->reqs[r], name);
        if (!in)
            return nereid_error_new(NEREID_ERROR_NOT_FOUND,
                                    "input '%s' is missing from request %zu of the batch", name, r);
        if (!first) first = in;
        total += in->byte_size;
        count += elements(in->shape, in->rank);
    }
    if (!ragged && (batch->instance->model->max_batch_size <= 0 || first->rank == 0))
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "cannot batch input '%s' of a non-batching model", name);
    batch_tensor_t *t = push_tensor(&batch->inputs, &batch->n_inputs, name);
    t->datatype = first->datatype;
    t->byte_size = total;
    if (ragged) {
        t->rank = 1;
        t->shape[0] = count;
    } else {
        t->rank = first->rank;
        memcpy(t->shape, first->shape, first->rank * sizeof *first->shape);
        t->shape[0] = batch->total_batch;
    }
    if (batch->n_reqs == 1) {
        t->data = (void *)first->data; /* the request's own memory, not owned */
    } else {
        t->data = xmalloc(total ? total : 1);
        t->owned = true;
        size_t off = 0;
        for (size_t r = 0; r < batch->n_reqs; r++) {
            req_input_t *in = request_find_input(batch->reqs[r], name);
            if (in->byte_size) memcpy((char *)t->data + off, in->data, in->byte_size);
            off += in->byte_size;
        }
    }
    *out = t;
    return NULL;
}

/* The batch_input whose target is `name`, or NULL. */
static const Inference__BatchInput *batch_input_for(const model_t *m, const char *name)
{
    if (m->max_batch_size <= 0) return NULL;
    for (size_t i = 0; i < m->config->n_batch_input; i++) {
        const Inference__BatchInput *bi = m->config->batch_input[i];
        for (size_t k = 0; k < bi->n_target_name; k++)
            if (strcmp(bi->target_name[k], name) == 0) return bi;
    }
    return NULL;
}

static void put_number(batch_tensor_t *t, size_t i, int64_t v)
{
    if (t->datatype == NEREID_TYPE_FP32)
        ((float *)t->data)[i] = (float)v;
    else
        ((int32_t *)t->data)[i] = (int32_t)v;
}

/* Computes batch input `bi` (Triton's BackendInputCollector: shapes from
 * BatchInputShape, values as ProcessBatchInput writes them) over the
 * batch's requests, from the shapes of its source input. */
static nereid_error_t *compute_batch_input(nereid_batch_t *batch, const Inference__BatchInput *bi,
                                           const char *name, batch_tensor_t **out)
{
    const char *source = bi->source_input[0]; /* exactly one: validated at load */
    size_t n = batch->n_reqs;
    int64_t max_count = 0, items = 0, flat = 0;
    size_t item_rank = 0;
    for (size_t r = 0; r < n; r++) {
        const req_input_t *in = request_find_input(batch->reqs[r], source);
        if (!in)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "batch input '%s' needs input '%s', missing from request %zu "
                                    "of the batch",
                                    name, source, r);
        int64_t count = elements(in->shape, in->rank);
        if (count > max_count) max_count = count;
        if (in->rank > 0) {
            items += in->shape[0];
            flat += in->shape[0] * (int64_t)(in->rank - 1);
            item_rank = in->rank - 1;
        }
    }
    batch_tensor_t *t = push_tensor(&batch->inputs, &batch->n_inputs, name);
    t->datatype =
        bi->data_type == INFERENCE__DATA_TYPE__TYPE_FP32 ? NEREID_TYPE_FP32 : NEREID_TYPE_INT32;
    t->rank = 1;
    switch (bi->kind) {
    case INFERENCE__BATCH_INPUT__KIND__BATCH_ELEMENT_COUNT:
    case INFERENCE__BATCH_INPUT__KIND__BATCH_ACCUMULATED_ELEMENT_COUNT:
        t->shape[0] = (int64_t)n;
        break;
    case INFERENCE__BATCH_INPUT__KIND__BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO:
        t->shape[0] = (int64_t)n + 1;
        break;
    case INFERENCE__BATCH_INPUT__KIND__BATCH_MAX_ELEMENT_COUNT_AS_SHAPE:
        t->shape[0] = max_count;
        break;
    case INFERENCE__BATCH_INPUT__KIND__BATCH_ITEM_SHAPE:
        t->rank = 2;
        t->shape[0] = items;
        t->shape[1] = (int64_t)item_rank;
        break;
    default: /* BATCH_ITEM_SHAPE_FLATTEN */
        t->shape[0] = flat;
        break;
    }
    t->byte_size = (size_t)elements(t->shape, t->rank) * 4;
    t->data = xcalloc(1, t->byte_size ? t->byte_size : 1);
    t->owned = true;
    size_t at = 0;
    int64_t acc = 0;
    if (bi->kind == INFERENCE__BATCH_INPUT__KIND__BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO)
        put_number(t, at++, 0);
    for (size_t r = 0; r < n; r++) {
        const req_input_t *in = request_find_input(batch->reqs[r], source);
        int64_t count = elements(in->shape, in->rank);
        acc += count;
        switch (bi->kind) {
        case INFERENCE__BATCH_INPUT__KIND__BATCH_ELEMENT_COUNT:
            put_number(t, at++, count);
            break;
        case INFERENCE__BATCH_INPUT__KIND__BATCH_ACCUMULATED_ELEMENT_COUNT:
        case INFERENCE__BATCH_INPUT__KIND__BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO:
            put_number(t, at++, acc);
            break;
        case INFERENCE__BATCH_INPUT__KIND__BATCH_ITEM_SHAPE:
        case INFERENCE__BATCH_INPUT__KIND__BATCH_ITEM_SHAPE_FLATTEN:
            /* each batch item's shape without the batch dimension */
            for (int64_t item = 0; in->rank > 0 && item < in->shape[0]; item++)
                for (size_t d = 1; d < in->rank; d++)
                    put_number(t, at++, in->shape[d]);
            break;
        default: /* BATCH_MAX_ELEMENT_COUNT_AS_SHAPE: the shape is the value */
            break;
        }
    }
    *out = t;
    return NULL;
}

/* Fills the optional out-parameters of an input lookup from t. */
static nereid_error_t *tensor_out(const batch_tensor_t *t, nereid_datatype_t *datatype,
                                  const int64_t **shape, size_t *rank, const void **data,
                                  size_t *byte_size)
{
    if (datatype) *datatype = t->datatype;
    if (shape) *shape = t->shape;
    if (rank) *rank = t->rank;
    if (data) *data = t->data;
    if (byte_size) *byte_size = t->byte_size;
    return NULL;
}

nereid_error_t *nereid_batch_input(nereid_batch_t *batch, const char *name,
                                   nereid_datatype_t *datatype, const int64_t **shape, size_t *rank,
                                   const void **data, size_t *byte_size)
{
    const Inference__BatchInput *bi =
        batch->n_reqs ? batch_input_for(batch->instance->model, name) : NULL;
    if (bi) {
        batch_tensor_t *t = find_tensor(batch->inputs, batch->n_inputs, name);
        if (!t) {
            nereid_error_t *err = compute_batch_input(batch, bi, name, &t);
            if (err) return err;
        }
        return tensor_out(t, datatype, shape, rank, data, byte_size);
    }
    bool ragged = batch->n_reqs && input_ragged(batch->instance->model, name);
    if (batch->n_reqs == 1 && !ragged)
        return nereid_batch_request_input(batch, 0, name, datatype, shape, rank, data, byte_size);
    batch_tensor_t *t = find_tensor(batch->inputs, batch->n_inputs, name);
    if (!t) {
        nereid_error_t *err = gather_input(batch, name, ragged, &t);
        if (err) return err;
    }
    return tensor_out(t, datatype, shape, rank, data, byte_size);
}

nereid_error_t *nereid_batch_request_input(nereid_batch_t *batch, size_t r, const char *name,
                                           nereid_datatype_t *datatype, const int64_t **shape,
                                           size_t *rank, const void **data, size_t *byte_size)
{
    if (r >= batch->n_reqs)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "request index %zu out of range", r);
    req_input_t *in = request_find_input(batch->reqs[r], name);
    if (!in) return nereid_error_new(NEREID_ERROR_NOT_FOUND, "input '%s' not found", name);
    if (datatype) *datatype = in->datatype;
    if (shape) *shape = in->shape;
    if (rank) *rank = in->rank;
    if (data) *data = in->data;
    if (byte_size) *byte_size = in->byte_size;
    return NULL;
}

const char *nereid_batch_request_id(const nereid_batch_t *batch, size_t r)
{
    return r < batch->n_reqs && batch->reqs[r]->id ? batch->reqs[r]->id : "";
}

static const req_param_t *find_param(const nereid_batch_t *batch, size_t r, const char *key)
{
    if (r >= batch->n_reqs) return NULL;
    const nereid_request_t *req = batch->reqs[r];
    for (size_t i = 0; i < req->n_params; i++)
        if (strcmp(req->params[i].key, key) == 0) return &req->params[i];
    return NULL;
}

bool nereid_batch_request_parameter_int(const nereid_batch_t *batch, size_t r, const char *key,
                                        int64_t *value)
{
    const req_param_t *p = find_param(batch, r, key);
    if (!p || p->type != PARAM_INT) return false;
    *value = p->i;
    return true;
}

const char *nereid_batch_request_parameter_string(const nereid_batch_t *batch, size_t r,
                                                  const char *key)
{
    const req_param_t *p = find_param(batch, r, key);
    return p && p->type == PARAM_STRING ? p->s : NULL;
}

void nereid_batch_set_request_error(nereid_batch_t *batch, size_t r, nereid_error_t *err)
{
    if (r >= batch->n_reqs) {
        nereid_error_free(err);
        return;
    }
    request_set_error(batch->reqs[r], err);
}

bool nereid_batch_request_is_cancelled(const nereid_batch_t *batch, size_t r)
{
    return r < batch->n_reqs && request_cancelled(batch->reqs[r]);
}

void nereid_batch_request_sequence(const nereid_batch_t *batch, size_t r, uint64_t *corr_id,
                                   const char **corr_id_str, uint32_t *flags, uint64_t *timeout_us)
{
    const nereid_request_t *req = r < batch->n_reqs ? batch->reqs[r] : NULL;
    if (corr_id) *corr_id = req && !req->corr_id_str ? req->corr_id : 0;
    if (corr_id_str) *corr_id_str = req ? req->corr_id_str : NULL;
    if (flags)
        *flags = req ? (req->seq_start ? NEREID_REQUEST_FLAG_SEQUENCE_START : 0) |
                           (req->seq_end ? NEREID_REQUEST_FLAG_SEQUENCE_END : 0)
                     : 0;
    if (timeout_us) *timeout_us = req ? req->timeout_us : 0;
}

nereid_trace_t *nereid_batch_request_trace(const nereid_batch_t *batch, size_t r)
{
    return r < batch->n_reqs ? batch->reqs[r]->trace : NULL;
}

nereid_error_t *nereid_batch_request_reschedule(nereid_batch_t *batch, size_t r)
{
    if (r >= batch->n_reqs)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "request index %zu out of range", r);
    nereid_request_t *req = batch->reqs[r];
    scheduler_t *s = req->model ? req->model->sched : NULL;
    if (!s || !s->ops->reschedule || !req->sched_data)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, "
                                "while the model is not configured to handle such a flag.");
    if (req->reschedule) return NULL;
    return s->ops->reschedule(s, req);
}

void nereid_batch_report_compute(nereid_batch_t *batch, uint64_t input_end_ns,
                                 uint64_t infer_end_ns)
{
    batch->t_input_end_ns = input_end_ns;
    batch->t_infer_end_ns = infer_end_ns;
    batch->timing_reported = true;
}

/* ---- Outputs ---- */

bool nereid_batch_output_requested(const nereid_batch_t *batch, const char *name)
{
    for (size_t r = 0; r < batch->n_reqs; r++)
        if (request_find_output(batch->reqs[r], name)) return true;
    return false;
}

bool nereid_batch_request_output_requested(const nereid_batch_t *batch, size_t r, const char *name)
{
    return r < batch->n_reqs && name && request_find_output(batch->reqs[r], name);
}

/* The shape the client sees: backends produce the reshape dims of an output
 * that has `reshape`; clients get the config dims (batch dimension kept, a
 * -1 dimension takes the remaining element count). */
static void output_client_shape(const model_t *m, const model_io_t *io, const int64_t *shape,
                                size_t rank, int64_t *out, size_t *out_rank)
{
    if (!io || !io->has_reshape) {
        memcpy(out, shape, rank * sizeof *shape);
        *out_rank = rank;
        return;
    }
    bool batching = m->max_batch_size > 0 && rank > 0;
    int64_t count = 1, known = 1;
    for (size_t d = batching ? 1 : 0; d < rank; d++)
        count *= shape[d];
    size_t r = 0;
    if (batching) out[r++] = shape[0];
    for (size_t d = 0; d < io->rank; d++)
        if (io->dims[d] != -1) known *= io->dims[d];
    for (size_t d = 0; d < io->rank && r < NEREID_MAX_RANK; d++)
        out[r++] = io->dims[d] == -1 ? (known ? count / known : 0) : io->dims[d];
    *out_rank = r;
}

/* Allocates a backend-produced output in resp (a response of req), shaped
 * as the client sees it (response_alloc_output applies the allocation
 * rules). */
static nereid_error_t *alloc_output_in(nereid_request_t *req, nereid_response_t *resp,
                                       resp_output_t *o, nereid_datatype_t dt, const int64_t *shape,
                                       size_t rank, size_t byte_size)
{
    if (request_output_filled(o))
        return nereid_error_new(NEREID_ERROR_INTERNAL, "output '%s' produced twice", o->name);
    int64_t client[NEREID_MAX_RANK];
    size_t client_rank;
    output_client_shape(req->model, o->io, shape, rank, client, &client_rank);
    nereid_error_t *err = response_alloc_output(req, resp, o, dt, client, client_rank, byte_size);
    if (!err) request_output_set_filled(o);
    return err;
}

static nereid_error_t *alloc_output(nereid_request_t *req, resp_output_t *o, nereid_datatype_t dt,
                                    const int64_t *shape, size_t rank, size_t byte_size)
{
    return alloc_output_in(req, req->response, o, dt, shape, rank, byte_size);
}

/* Whether an output's rank and byte size fit its shape; NULL when they do. */
static nereid_error_t *output_size_error(const char *name, nereid_datatype_t datatype,
                                         const int64_t *shape, size_t rank, size_t byte_size)
{
    if (rank > NEREID_MAX_RANK)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "output '%s' rank too large", name);
    size_t esize = nereid_datatype_byte_size(datatype);
    if (esize) {
        uint64_t count = 1;
        for (size_t i = 0; i < rank; i++)
            count *= (uint64_t)(shape[i] < 0 ? 0 : shape[i]);
        if (count * esize != byte_size)
            return nereid_error_new(NEREID_ERROR_INTERNAL,
                                    "output '%s' byte size %zu does not match its shape", name,
                                    byte_size);
    }
    return NULL;
}

static resp_output_t *response_find_output(nereid_response_t *resp, const char *name)
{
    for (size_t i = 0; i < resp->n_outputs; i++)
        if (strcmp(resp->outputs[i].name, name) == 0) return &resp->outputs[i];
    return NULL;
}

nereid_error_t *batch_alloc_response_output(nereid_request_t *req, nereid_response_t *resp,
                                            const char *name, nereid_datatype_t datatype,
                                            const int64_t *shape, size_t rank, size_t byte_size,
                                            void **buffer, bool *requested)
{
    *buffer = NULL;
    *requested = false;
    nereid_error_t *bad = output_size_error(name, datatype, shape, rank, byte_size);
    if (bad) return bad;
    resp_output_t *o = response_find_output(resp, name);
    if (!o) return NULL;
    *requested = true;
    nereid_error_t *err = alloc_output_in(req, resp, o, datatype, shape, rank, byte_size);
    if (!err) *buffer = o->data;
    return err;
}

nereid_error_t *nereid_batch_request_output(nereid_batch_t *batch, size_t r, const char *name,
                                            nereid_datatype_t datatype, const int64_t *shape,
                                            size_t rank, size_t byte_size, void **buffer)
{
    *buffer = NULL;
    if (r >= batch->n_reqs)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "request index %zu out of range", r);
    nereid_request_t *req = batch->reqs[r];
    bool requested;
    nereid_error_t *err = batch_alloc_response_output(req, req->response, name, datatype, shape,
                                                      rank, byte_size, buffer, &requested);
    if (err || requested) return err;
    /* Nobody asked for it: give scratch memory the batch frees. */
    batch_tensor_t *t = push_tensor(&batch->outputs, &batch->n_outputs, name);
    t->data = xmalloc(byte_size);
    t->owned = true;
    *buffer = t->data;
    return NULL;
}

nereid_error_t *nereid_batch_request_output_view(nereid_batch_t *batch, size_t r, const char *name,
                                                 nereid_datatype_t datatype, const int64_t *shape,
                                                 size_t rank, const void *data, size_t byte_size,
                                                 nereid_output_release_fn release,
                                                 void *release_userp)
{
    if (r >= batch->n_reqs)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "request index %zu out of range", r);
    if (!name || !release || (!data && byte_size))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "an output view needs a name, data and a release function");
    if (nereid_datatype_byte_size(datatype) == 0)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "output '%s': only fixed-size datatypes can be views", name);
    nereid_error_t *bad = output_size_error(name, datatype, shape, rank, byte_size);
    if (bad) return bad;
    nereid_request_t *req = batch->reqs[r];
    resp_output_t *o = response_find_output(req->response, name);
    if (!o) { /* nobody asked for it */
        release(release_userp);
        return NULL;
    }
    if (request_output_filled(o))
        return nereid_error_new(NEREID_ERROR_INTERNAL, "output '%s' produced twice", o->name);
    int64_t client[NEREID_MAX_RANK];
    size_t client_rank;
    output_client_shape(req->model, o->io, shape, rank, client, &client_rank);
    bad = response_output_view(req, req->response, o, datatype, client, client_rank, data,
                               byte_size, release, release_userp);
    if (!bad) request_output_set_filled(o);
    return bad;
}

nereid_error_t *nereid_batch_output(nereid_batch_t *batch, const char *name,
                                    nereid_datatype_t datatype, const int64_t *shape, size_t rank,
                                    size_t byte_size, void **buffer)
{
    *buffer = NULL;
    bool flat = scatter_source(batch->instance->model, name) != NULL;
    if (batch->n_reqs == 1 && !flat)
        return nereid_batch_request_output(batch, 0, name, datatype, shape, rank, byte_size,
                                           buffer);
    if (rank == 0 || rank > NEREID_MAX_RANK || (!flat && shape[0] != batch->total_batch))
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "batched output '%s' must have the batch size %lld as its first "
                                "dimension",
                                name, (long long)batch->total_batch);
    if (find_tensor(batch->outputs, batch->n_outputs, name))
        return nereid_error_new(NEREID_ERROR_INTERNAL, "output '%s' produced twice", name);
    batch_tensor_t *t = push_tensor(&batch->outputs, &batch->n_outputs, name);
    t->datatype = datatype;
    t->rank = rank;
    memcpy(t->shape, shape, rank * sizeof *shape);
    t->byte_size = byte_size;
    t->data = xmalloc(byte_size);
    t->owned = true;
    *buffer = t->data;
    return NULL;
}

/* Byte offset of element index `elem` in a serialized BYTES buffer. */
static size_t bytes_offset(const uint8_t *p, size_t size, size_t from_off, size_t n_elems)
{
    size_t off = from_off;
    for (size_t i = 0; i < n_elems && off + 4 <= size; i++) {
        uint32_t len;
        memcpy(&len, p + off, 4);
        off += 4 + len;
    }
    return off > size ? size : off;
}

/* Splits batched outputs back into each request's response. */
static void scatter_outputs(batch_t *batch)
{
    for (size_t t = 0; t < batch->n_outputs; t++) {
        batch_tensor_t *bt = batch->outputs[t];
        if (bt->rank == 0) continue; /* scratch for an unrequested single-request output */
        const char *source = scatter_source(batch->instance->model, bt->name);
        size_t esize = nereid_datatype_byte_size(bt->datatype);
        int64_t per_item_elems = 1;
        for (size_t d = 1; d < bt->rank; d++)
            per_item_elems *= bt->shape[d];
        size_t off = 0;
        for (size_t r = 0; r < batch->n_reqs; r++) {
            nereid_request_t *req = batch->reqs[r];
            const req_input_t *src = source ? request_find_input(req, source) : NULL;
            size_t n_elems = src ? (size_t)elements(src->shape, src->rank)
                                 : (size_t)(req->batch_size * per_item_elems);
            size_t len =
                esize ? n_elems * esize : bytes_offset(bt->data, bt->byte_size, off, n_elems) - off;
            if (off + len > bt->byte_size) len = off < bt->byte_size ? bt->byte_size - off : 0;
            resp_output_t *o = request_find_output(req, bt->name);
            if (o && !request_failed(req)) {
                int64_t shape[NEREID_MAX_RANK];
                size_t rank = src ? src->rank : bt->rank;
                memcpy(shape, src ? src->shape : bt->shape, rank * sizeof *shape);
                if (!src) shape[0] = req->batch_size;
                nereid_error_t *err = alloc_output(req, o, bt->datatype, shape, rank, len);
                if (err)
                    request_set_error(req, err);
                else if (len)
                    memcpy(o->data, (char *)bt->data + off, len);
            }
            off += len;
        }
    }
}

void batch_execute(model_instance_t *inst, batch_t *batch)
{
    model_t *m = inst->model;
    batch->instance = inst;
    /* --rate-limit: wait for the instance's turn (queue time, as in Triton),
     * unless the scheduler took it before forming the batch. */
    if (inst->rate_limit && !inst->turn_held) rate_limiter_acquire(inst->rate_limit);
    inst->turn_held = false;
    batch->t_start_ns = util_now_ns();
    for (size_t r = 0; r < batch->n_reqs; r++)
        batch->reqs[r]->t_compute_start_ns = batch->t_start_ns;
    atomic_store_explicit(&inst->exec_start_ns, batch->t_start_ns, memory_order_relaxed);
    nereid_error_t *err = m->backend->execute((nereid_instance_t *)inst, batch);
    uint64_t exec_end = util_now_ns();
    atomic_store_explicit(&inst->exec_start_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&m->progress_ns, exec_end, memory_order_relaxed);
    if (atomic_load_explicit(&m->wedged, memory_order_relaxed)) watchdog_progressed(m);
    /* Races between instances lose a sample at worst. */
    uint64_t took = exec_end - batch->t_start_ns;
    uint64_t avg = atomic_load_explicit(&m->exec_avg_ns, memory_order_relaxed);
    avg = avg == UINT64_MAX ? took : avg - avg / 8 + took / 8;
    atomic_store_explicit(&m->exec_avg_ns, avg, memory_order_relaxed);
    if (err) {
        for (size_t r = 0; r < batch->n_reqs; r++)
            if (!request_failed(batch->reqs[r]))
                request_set_error(batch->reqs[r], nereid_error_new(nereid_error_code(err), "%s",
                                                                   nereid_error_message(err)));
        nereid_error_free(err);
    } else if (batch->n_reqs > 1 || batch->n_outputs) {
        scatter_outputs(batch); /* one request: only flat batch outputs to shape */
    }
    batch->t_end_ns = util_now_ns();
    if (inst->rate_limit)
        rate_limiter_release(inst->rate_limit,
                             atomic_load_explicit(&m->stats.pending, memory_order_relaxed) > 0,
                             batch->n_reqs && batch->reqs[0]->warmup);
    if (!batch->timing_reported) {
        batch->t_input_end_ns = batch->t_start_ns;
        batch->t_infer_end_ns = exec_end;
    }
}

void batch_acquire_turn(model_instance_t *inst)
{
    if (!inst->rate_limit || inst->turn_held) return;
    rate_limiter_acquire(inst->rate_limit);
    inst->turn_held = true;
}

void batch_release_turn(model_instance_t *inst)
{
    if (!inst->turn_held) return;
    inst->turn_held = false;
    rate_limiter_release(inst->rate_limit, false, false);
}

static void batch_record(batch_t *batch)
{
    model_t *m = batch->instance->model;
    model_stats_t *s = &m->stats;
    uint64_t in_ns = batch->t_input_end_ns - batch->t_start_ns;
    uint64_t infer_ns = batch->t_infer_end_ns - batch->t_input_end_ns;
    uint64_t out_ns = batch->t_end_ns - batch->t_infer_end_ns;
    atomic_fetch_add(&s->execution_count, 1);
    atomic_fetch_add(&s->inference_count, (uint64_t)batch->total_batch);
    atomic_store(&s->last_inference_ms, util_wall_ms());
    int64_t rows = batch->total_batch + batch->filler_rows;
    if (rows > 0 && (size_t)rows < s->n_batch) {
        batch_stat_t *b = &s->batch[rows];
        stats_add(&b->compute_input, in_ns);
        stats_add(&b->compute_infer, infer_ns);
        stats_add(&b->compute_output, out_ns);
    }
    /* The response is produced when execution ends: compute_infer runs to
     * the start of output handling, compute_output to the end. */
    uint64_t resp_infer_ns = batch->t_infer_end_ns - batch->t_start_ns;
    response_stat_t *rs = &s->response0;
    for (size_t r = 0; r < batch->n_reqs; r++) {
        nereid_request_t *req = batch->reqs[r];
        bool failed = request_failed(req);
        /* else the sender counts each response, or the backend reports */
        if (!decoupled_has_sender(req) && !atomic_load(&m->backend_response_stats)) {
            stats_add(&rs->compute_infer, resp_infer_ns);
            stats_add(&rs->compute_output, out_ns);
            /* A backend that stopped a cancelled request answers CANCELLED:
             * Triton counts that response as cancelled, not failed. */
            bool cancelled = failed && request_failed_cancelled(req);
            stats_add(cancelled ? &rs->cancel
                      : failed  ? &rs->fail
                                : &rs->success,
                      resp_infer_ns + out_ns);
        }
        if (req->trace)
            trace_compute(req->trace, batch->t_start_ns, batch->t_input_end_ns,
                          batch->t_infer_end_ns, batch->t_end_ns);
        if (!failed) {
            stats_add(&s->compute_input, in_ns);
            stats_add(&s->compute_infer, infer_ns);
            stats_add(&s->compute_output, out_ns);
            if (req->parent_stats) {
                stats_add(&req->parent_stats->compute_input, in_ns);
                stats_add(&req->parent_stats->compute_infer, infer_ns);
                stats_add(&req->parent_stats->compute_output, out_ns);
            }
        }
    }
}

void batch_complete(batch_t *batch, bool finish)
{
    batch_record(batch);
    if (!finish) return;
    for (size_t r = 0; r < batch->n_reqs; r++)
        request_finish(batch->reqs[r], NULL, FAILURE_BACKEND);
    batch_reset(batch);
}

size_t nereid_batch_request_parameter_count(const nereid_batch_t *batch, size_t r)
{
    return r < batch->n_reqs ? batch->reqs[r]->n_params : 0;
}

nereid_error_t *nereid_batch_request_parameter(const nereid_batch_t *batch, size_t r, size_t index,
                                               const char **name, nereid_parameter_type_t *type,
                                               const void **value)
{
    *name = NULL;
    *type = NEREID_PARAMETER_STRING;
    *value = NULL;
    if (r >= batch->n_reqs || index >= batch->reqs[r]->n_params)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "request %zu has no parameter %zu (batch of %zu requests)", r,
                                index, batch->n_reqs);
    const req_param_t *p = &batch->reqs[r]->params[index];
    *name = p->key;
    switch (p->type) {
    case PARAM_STRING:
        *type = NEREID_PARAMETER_STRING;
        *value = p->s;
        break;
    case PARAM_INT:
        *type = NEREID_PARAMETER_INT;
        *value = &p->i;
        break;
    case PARAM_BOOL:
        *type = NEREID_PARAMETER_BOOL;
        *value = &p->b;
        break;
    case PARAM_DOUBLE:
        *type = NEREID_PARAMETER_DOUBLE;
        *value = &p->d;
        break;
    }
    return NULL;
}

nereid_error_t *nereid_batch_request_set_response_parameter(nereid_batch_t *batch, size_t r,
                                                            const char *key,
                                                            nereid_parameter_type_t type,
                                                            const void *value)
{
    if (r >= batch->n_reqs || !batch->reqs[r]->response || !key || !value ||
        (unsigned)type > NEREID_PARAMETER_DOUBLE)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "invalid response parameter for request index %zu", r);
    response_set_parameter(batch->reqs[r]->response, key, (int)type, value);
    return NULL;
}
