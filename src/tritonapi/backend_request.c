/*
 * This file contains TRITONBACKEND_Request and TRITONBACKEND_Input: a
 * backend reads a request of the batch being executed through them.
 *
 * Requests: one TRITONBACKEND_Request per request of the Nereid batch. The
 * backend must release each one (TRITONBACKEND_RequestRelease) and, unless
 * the model streams decoupled responses through a sender, send its final
 * response before TRITONBACKEND_ModelInstanceExecute returns; otherwise the
 * request fails with the reason (a request never released stays allocated
 * until the instance is finalized, so late calls on it are harmless).
 */
#include <stdlib.h>
#include <string.h>

#include "tritonapi/backend_objects.h"

/* ---- TRITONBACKEND_Request ---- */

static int input_cmp(const void *a, const void *b)
{
    return strcmp(((const struct TRITONBACKEND_Input *)a)->in.name,
                  ((const struct TRITONBACKEND_Input *)b)->in.name);
}

static TRITONSERVER_Error *load_inputs(TRITONBACKEND_Request *req)
{
    if (req->inputs_ready) return NULL;
    size_t n = nereid_batch_input_count(req->batch);
    if (n > req->cap_inputs) {
        struct TRITONBACKEND_Input *p = realloc(req->inputs, n * sizeof *p);
        if (!p) return terr(TRITONSERVER_ERROR_INTERNAL, "out of memory");
        req->inputs = p;
        req->cap_inputs = (uint32_t)n;
    }
    uint32_t k = 0;
    for (size_t i = 0; i < n; i++) {
        tb_input_t *t = &req->inputs[k].in;
        t->name = nereid_batch_input_name(req->batch, i);
        nereid_error_t *err =
            nereid_batch_request_input(req->batch, req->r, t->name, &t->datatype, &t->shape,
                                       &t->rank, &t->data, &t->byte_size);
        if (!err)
            k++;
        else
            nereid_error_free(err); /* an optional input this request lacks */
    }
    qsort(req->inputs, k, sizeof *req->inputs, input_cmp);
    req->n_inputs = k;
    req->inputs_ready = true;
    return NULL;
}

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static TRITONSERVER_Error *load_outputs(TRITONBACKEND_Request *req)
{
    if (req->outputs_ready) return NULL;
    nereid_model_t *nm = req->inst->model->nm;
    size_t n = nereid_model_output_count(nm);
    if (n > req->cap_outputs) {
        const char **p = realloc(req->outputs, n * sizeof *p);
        if (!p) return terr(TRITONSERVER_ERROR_INTERNAL, "out of memory");
        req->outputs = p;
        req->cap_outputs = (uint32_t)n;
    }
    uint32_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const char *name;
        nereid_datatype_t dt;
        const int64_t *dims;
        size_t rank;
        nereid_model_output(nm, i, &name, &dt, &dims, &rank);
        if (nereid_batch_output_requested(req->batch, name)) req->outputs[k++] = name;
    }
    qsort(req->outputs, k, sizeof *req->outputs, str_cmp);
    req->n_outputs = k;
    req->outputs_ready = true;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_RequestId(TRITONBACKEND_Request *request, const char **id)
{
    TRITONSERVER_Error *err = live(request);
    if (err) return err;
    if (!id) return null_arg("id");
    *id = nereid_batch_request_id(request->batch, request->r);
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_RequestCorrelationId(TRITONBACKEND_Request *request, uint64_t *id)
{
    TRITONSERVER_Error *err = live(request);
    if (err) return err;
    if (!id) return null_arg("id");
    const char *s = NULL;
    nereid_batch_request_sequence(request->batch, request->r, id, &s, NULL, NULL);
    if (s)
        return terr(TRITONSERVER_ERROR_INVALID_ARG,
                    "correlation id of the request is a string, use "
                    "TRITONBACKEND_RequestCorrelationIdString");
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_RequestCorrelationIdString(TRITONBACKEND_Request *request,
                                                             const char **id)
{
    TRITONSERVER_Error *err = live(request);
    if (err) return err;
    if (!id) return null_arg("id");
    const char *s = NULL;
    nereid_batch_request_sequence(request->batch, request->r, NULL, &s, NULL, NULL);
    *id = s ? s : "";
    if (!s)
        return terr(TRITONSERVER_ERROR_INVALID_ARG,
                    "correlation id of the request is not a string, use "
                    "TRITONBACKEND_RequestCorrelationId");
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_RequestFlags(TRITONBACKEND_Request *request, uint32_t *flags)
{
    TRITONSERVER_Error *err = live(request);
    if (err) return err;
    if (!flags) return null_arg("flags");
    nereid_batch_request_sequence(request->batch, request->r, NULL, NULL, flags, NULL);
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_RequestIsCancelled(TRITONBACKEND_Request *request,
                                                     bool *is_cancelled)
{
    TRITONSERVER_Error *err = live(request);
    if (err) return err;
    if (!is_cancelled) return null_arg("is_cancelled");
    *is_cancelled = nereid_batch_request_is_cancelled(request->batch, request->r);
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_RequestParameterCount(TRITONBACKEND_Request *request,
                                                        uint32_t *count)
{
    TRITONSERVER_Error *err = live(request);
    if (err) return err;
    if (!count) return null_arg("count");
    *count = (uint32_t)nereid_batch_request_parameter_count(request->batch, request->r);
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_RequestParameter(TRITONBACKEND_Request *request,
                                                   const uint32_t index, const char **key,
                                                   TRITONSERVER_ParameterType *type,
                                                   const void **vvalue)
{
    TRITONSERVER_Error *err = live(request);
    if (err) return err;
    if (!key || !type || !vvalue) return null_arg("key, type and vvalue");
    nereid_parameter_type_t t = NEREID_PARAMETER_STRING;
    nereid_error_t *e =
        nereid_batch_request_parameter(request->batch, request->r, index, key, &t, vvalue);
    *type = (TRITONSERVER_ParameterType)t; /* STRING..DOUBLE have Triton's numbers */
    return (TRITONSERVER_Error *)e;
}

TRITONSERVER_Error *TRITONBACKEND_RequestInputCount(TRITONBACKEND_Request *request, uint32_t *count)
{
    TRITONSERVER_Error *err = live(request);
    if (!err) err = load_inputs(request);
    if (err) return err;
    if (!count) return null_arg("count");
    *count = request->n_inputs;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_RequestInputName(TRITONBACKEND_Request *request,
                                                   const uint32_t index, const char **input_name)
{
    TRITONSERVER_Error *err = live(request);
    if (!err) err = load_inputs(request);
    if (err) return err;
    if (!input_name) return null_arg("input_name");
    *input_name = NULL;
    if (index >= request->n_inputs)
        return terr(TRITONSERVER_ERROR_INVALID_ARG, "out of bounds index %u: request has %u inputs",
                    index, request->n_inputs);
    *input_name = request->inputs[index].in.name;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_RequestInput(TRITONBACKEND_Request *request, const char *name,
                                               TRITONBACKEND_Input **input)
{
    TRITONSERVER_Error *err = live(request);
    if (!err) err = load_inputs(request);
    if (err) return err;
    if (!input || !name) return null_arg("name and input");
    *input = NULL;
    for (uint32_t i = 0; i < request->n_inputs; i++)
        if (strcmp(request->inputs[i].in.name, name) == 0) {
            *input = &request->inputs[i];
            return NULL;
        }
    return terr(TRITONSERVER_ERROR_INVALID_ARG, "unknown request input name %s", name);
}

TRITONSERVER_Error *TRITONBACKEND_RequestInputByIndex(TRITONBACKEND_Request *request,
                                                      const uint32_t index,
                                                      TRITONBACKEND_Input **input)
{
    TRITONSERVER_Error *err = live(request);
    if (!err) err = load_inputs(request);
    if (err) return err;
    if (!input) return null_arg("input");
    *input = NULL;
    if (index >= request->n_inputs)
        return terr(TRITONSERVER_ERROR_INVALID_ARG, "out of bounds index %u: request has %u inputs",
                    index, request->n_inputs);
    *input = &request->inputs[index];
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_RequestOutputCount(TRITONBACKEND_Request *request,
                                                     uint32_t *count)
{
    TRITONSERVER_Error *err = live(request);
    if (!err) err = load_outputs(request);
    if (err) return err;
    if (!count) return null_arg("count");
    *count = request->n_outputs;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_RequestOutputName(TRITONBACKEND_Request *request,
                                                    const uint32_t index, const char **output_name)
{
    TRITONSERVER_Error *err = live(request);
    if (!err) err = load_outputs(request);
    if (err) return err;
    if (!output_name) return null_arg("output_name");
    *output_name = NULL;
    if (index >= request->n_outputs)
        return terr(TRITONSERVER_ERROR_INVALID_ARG,
                    "out of bounds index %u: request has %u requested outputs", index,
                    request->n_outputs);
    *output_name = request->outputs[index];
    return NULL;
}

TRITONSERVER_Error *
TRITONBACKEND_RequestOutputBufferProperties(TRITONBACKEND_Request *request, const char *name,
                                            size_t *byte_size, TRITONSERVER_MemoryType *memory_type,
                                            int64_t *memory_type_id)
{
    (void)name;
    TRITONSERVER_Error *err = live(request);
    if (err) return err;
    if (byte_size) *byte_size = 0;
    if (memory_type) *memory_type = TRITONSERVER_MEMORY_CPU;
    if (memory_type_id) *memory_type_id = 0;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_RequestRelease(TRITONBACKEND_Request *request,
                                                 uint32_t release_flags)
{
    if (!request) return null_arg("request");
    if (request->status != REQ_LIVE)
        return terr(TRITONSERVER_ERROR_INVALID_ARG, "request was already released");
    if (release_flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) {
        /* Back to the model's scheduler when Execute returns (the sequence
         * batcher with iterative_sequence takes it; others refuse, and the
         * request stays the backend's, as in Triton). */
        if (!request->batch)
            return terr(TRITONSERVER_ERROR_INVALID_ARG,
                        "a request can be released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE "
                        "only during TRITONBACKEND_ModelInstanceExecute");
        nereid_error_t *e = nereid_batch_request_reschedule(request->batch, request->r);
        if (e) return (TRITONSERVER_Error *)e;
        request->rescheduled = true;
        if (request->chan) {
            pthread_mutex_lock(&request->chan->mu);
            request->chan->rescheduled = true;
            pthread_mutex_unlock(&request->chan->mu);
        }
        request->status = REQ_RELEASED;
        return NULL;
    }
    if (release_flags != TRITONSERVER_REQUEST_RELEASE_ALL)
        return terr(TRITONSERVER_ERROR_UNSUPPORTED,
                    "request release flags %u are not supported: only "
                    "TRITONSERVER_REQUEST_RELEASE_ALL and TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
                    release_flags);
    request->status = REQ_RELEASED;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_RequestTrace(TRITONBACKEND_Request *request,
                                               TRITONSERVER_InferenceTrace **trace)
{
    TRITONSERVER_Error *err = live(request);
    if (err) return err;
    if (!trace) return null_arg("trace");
    /* the request's own trace when it is sampled (server_api.c reads it) */
    *trace = (TRITONSERVER_InferenceTrace *)nereid_batch_request_trace(request->batch, request->r);
    return NULL;
}

/* ---- TRITONBACKEND_Input ---- */

TRITONSERVER_Error *
TRITONBACKEND_InputPropertiesForHostPolicy(TRITONBACKEND_Input *input, const char *host_policy_name,
                                           const char **name, TRITONSERVER_DataType *datatype,
                                           const int64_t **shape, uint32_t *dims_count,
                                           uint64_t *byte_size, uint32_t *buffer_count)
{
    (void)host_policy_name;
    if (!input) return null_arg("input");
    if (name) *name = input->in.name;
    if (datatype) *datatype = (TRITONSERVER_DataType)input->in.datatype; /* same numbers */
    if (shape) *shape = input->in.shape;
    if (dims_count) *dims_count = (uint32_t)input->in.rank;
    if (byte_size) *byte_size = input->in.byte_size;
    if (buffer_count) *buffer_count = 1;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_InputProperties(TRITONBACKEND_Input *input, const char **name,
                                                  TRITONSERVER_DataType *datatype,
                                                  const int64_t **shape, uint32_t *dims_count,
                                                  uint64_t *byte_size, uint32_t *buffer_count)
{
    return TRITONBACKEND_InputPropertiesForHostPolicy(input, NULL, name, datatype, shape,
                                                      dims_count, byte_size, buffer_count);
}

TRITONSERVER_Error *TRITONBACKEND_InputBufferForHostPolicy(
    TRITONBACKEND_Input *input, const char *host_policy_name, const uint32_t index,
    const void **buffer, uint64_t *buffer_byte_size, TRITONSERVER_MemoryType *memory_type,
    int64_t *memory_type_id)
{
    (void)host_policy_name;
    if (!input || !buffer || !buffer_byte_size || !memory_type || !memory_type_id)
        return null_arg("input and out-parameters");
    if (index != 0) {
        *buffer = NULL;
        *buffer_byte_size = 0;
        return terr(TRITONSERVER_ERROR_INVALID_ARG,
                    "buffer index %u out of range: input '%s' has 1 buffer", index, input->in.name);
    }
    *buffer = input->in.data;
    *buffer_byte_size = input->in.byte_size;
    *memory_type = TRITONSERVER_MEMORY_CPU;
    *memory_type_id = 0;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_InputBuffer(TRITONBACKEND_Input *input, const uint32_t index,
                                              const void **buffer, uint64_t *buffer_byte_size,
                                              TRITONSERVER_MemoryType *memory_type,
                                              int64_t *memory_type_id)
{
    return TRITONBACKEND_InputBufferForHostPolicy(input, NULL, index, buffer, buffer_byte_size,
                                                  memory_type, memory_type_id);
}
