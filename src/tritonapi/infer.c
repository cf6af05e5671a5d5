/*
 * This file contains Triton's in-process inference API for backends (BLS:
 * TRITONSERVER_InferenceRequest*, ResponseAllocator*, ServerInferAsync) on
 * top of server.h: a TRITONSERVER_Server is the nereid_server_t of
 * TRITONBACKEND_ModelServer, a request wraps a nereid_request_t, and each
 * submission carries a context that delivers the one response (FINAL) and
 * then the request's release callback, as Triton does.
 */
#include <stdlib.h>
#include <string.h>

#include "tritonapi/tritonapi.h"

struct TRITONSERVER_ResponseAllocator {
    TRITONSERVER_ResponseAllocatorAllocFn_t alloc_fn;
    TRITONSERVER_ResponseAllocatorReleaseFn_t release_fn;
    TRITONSERVER_ResponseAllocatorStartFn_t start_fn;
    TRITONSERVER_ResponseAllocatorQueryFn_t query_fn;
};

typedef struct bls_input {
    char *name;
    nereid_datatype_t datatype;
    int64_t *shape;
    size_t rank;
    const void *data; /* borrowed, or owned when several chunks were joined */
    size_t byte_size;
    bool owned;
} bls_input_t;

/* One submission: the allocator and callbacks its response needs after
 * the request may already be deleted. Freed with the response. */
typedef struct bls_ctx {
    TRITONSERVER_InferenceRequest *request;
    TRITONSERVER_ResponseAllocator *allocator;
    void *alloc_userp;
    bool started;
    TRITONSERVER_InferenceResponseCompleteFn_t response_fn;
    void *response_userp;
    TRITONSERVER_InferenceRequestReleaseFn_t release_fn;
    void *release_userp;
} bls_ctx_t;

struct TRITONSERVER_InferenceRequest {
    nereid_server_t *server;
    nereid_request_t *req; /* NULL once the server took it */
    bls_input_t *inputs;
    size_t n_inputs;
    TRITONSERVER_ResponseAllocator *allocator;
    void *alloc_userp;
    TRITONSERVER_InferenceResponseCompleteFn_t response_fn;
    void *response_userp;
    TRITONSERVER_InferenceRequestReleaseFn_t release_fn;
    void *release_userp;
};

struct TRITONSERVER_InferenceResponse {
    nereid_response_t *resp;
    bls_ctx_t *ctx;
};

static TRITONSERVER_Error *invalid(const char *msg)
{
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, msg);
}

/* ---- Allocator ---- */

TRITONSERVER_Error *
TRITONSERVER_ResponseAllocatorNew(TRITONSERVER_ResponseAllocator **allocator,
                                  TRITONSERVER_ResponseAllocatorAllocFn_t alloc_fn,
                                  TRITONSERVER_ResponseAllocatorReleaseFn_t release_fn,
                                  TRITONSERVER_ResponseAllocatorStartFn_t start_fn)
{
    if (!allocator || !alloc_fn) return invalid("allocator and alloc_fn must not be NULL");
    TRITONSERVER_ResponseAllocator *a = calloc(1, sizeof *a);
    if (!a) return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    a->alloc_fn = alloc_fn;
    a->release_fn = release_fn;
    a->start_fn = start_fn;
    *allocator = a;
    return NULL;
}

TRITONSERVER_Error *
TRITONSERVER_ResponseAllocatorSetQueryFunction(TRITONSERVER_ResponseAllocator *allocator,
                                               TRITONSERVER_ResponseAllocatorQueryFn_t query_fn)
{
    if (!allocator) return invalid("allocator must not be NULL");
    allocator->query_fn = query_fn;
    return NULL;
}

TRITONSERVER_Error *TRITONSERVER_ResponseAllocatorDelete(TRITONSERVER_ResponseAllocator *allocator)
{
    free(allocator);
    return NULL;
}

/* ---- Requests ---- */

TRITONSERVER_Error *TRITONSERVER_InferenceRequestNew(TRITONSERVER_InferenceRequest **request,
                                                     TRITONSERVER_Server *server,
                                                     const char *model_name,
                                                     const int64_t model_version)
{
    if (!request || !server || !model_name)
        return invalid("request, server and model_name must not be NULL");
    *request = NULL;
    TRITONSERVER_InferenceRequest *r = calloc(1, sizeof *r);
    if (!r) return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    r->server = (nereid_server_t *)server;
    nereid_error_t *err = nereid_request_new(r->server, model_name, model_version, &r->req);
    if (err) {
        free(r);
        return (TRITONSERVER_Error *)err;
    }
    *request = r;
    return NULL;
}

static void free_inputs(TRITONSERVER_InferenceRequest *r)
{
    for (size_t i = 0; i < r->n_inputs; i++) {
        free(r->inputs[i].name);
        free(r->inputs[i].shape);
        if (r->inputs[i].owned) free((void *)r->inputs[i].data);
    }
    free(r->inputs);
    r->inputs = NULL;
    r->n_inputs = 0;
}

TRITONSERVER_Error *TRITONSERVER_InferenceRequestDelete(TRITONSERVER_InferenceRequest *request)
{
    if (!request) return NULL;
    nereid_request_free(request->req);
    free_inputs(request);
    free(request);
    return NULL;
}

static TRITONSERVER_Error *pending(TRITONSERVER_InferenceRequest *r)
{
    if (!r) return invalid("inference request must not be NULL");
    if (!r->req) return invalid("inference request was already submitted");
    return NULL;
}

TRITONSERVER_Error *TRITONSERVER_InferenceRequestSetId(TRITONSERVER_InferenceRequest *request,
                                                       const char *id)
{
    TRITONSERVER_Error *err = pending(request);
    return err ? err : (TRITONSERVER_Error *)nereid_request_set_id(request->req, id ? id : "");
}

TRITONSERVER_Error *TRITONSERVER_InferenceRequestSetFlags(TRITONSERVER_InferenceRequest *request,
                                                          uint32_t flags)
{
    TRITONSERVER_Error *err = pending(request);
    if (err) return err;
    nereid_request_set_sequence_flags(request->req,
                                      flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
                                      flags & TRITONSERVER_REQUEST_FLAG_SEQUENCE_END);
    return NULL;
}

TRITONSERVER_Error *
TRITONSERVER_InferenceRequestSetCorrelationId(TRITONSERVER_InferenceRequest *request,
                                              uint64_t correlation_id)
{
    TRITONSERVER_Error *err = pending(request);
    if (err) return err;
    nereid_request_set_correlation_id(request->req, correlation_id);
    return NULL;
}

TRITONSERVER_Error *
TRITONSERVER_InferenceRequestSetTimeoutMicroseconds(TRITONSERVER_InferenceRequest *request,
                                                    uint64_t timeout_us)
{
    TRITONSERVER_Error *err = pending(request);
    if (err) return err;
    nereid_request_set_timeout_us(request->req, timeout_us);
    return NULL;
}

TRITONSERVER_Error *
TRITONSERVER_InferenceRequestSetStringParameter(TRITONSERVER_InferenceRequest *request,
                                                const char *key, const char *value)
{
    TRITONSERVER_Error *err = pending(request);
    return err ? err
               : (TRITONSERVER_Error *)nereid_request_set_parameter_string(request->req, key,
                                                                           value);
}

TRITONSERVER_Error *
TRITONSERVER_InferenceRequestSetIntParameter(TRITONSERVER_InferenceRequest *request,
                                             const char *key, const int64_t value)
{
    TRITONSERVER_Error *err = pending(request);
    return err ? err
               : (TRITONSERVER_Error *)nereid_request_set_parameter_int(request->req, key, value);
}

TRITONSERVER_Error *
TRITONSERVER_InferenceRequestSetBoolParameter(TRITONSERVER_InferenceRequest *request,
                                              const char *key, const bool value)
{
    TRITONSERVER_Error *err = pending(request);
    return err ? err
               : (TRITONSERVER_Error *)nereid_request_set_parameter_bool(request->req, key, value);
}

TRITONSERVER_Error *TRITONSERVER_InferenceRequestAddInput(TRITONSERVER_InferenceRequest *request,
                                                          const char *name,
                                                          const TRITONSERVER_DataType datatype,
                                                          const int64_t *shape, uint64_t dim_count)
{
    TRITONSERVER_Error *err = pending(request);
    if (err) return err;
    if (!name || (!shape && dim_count)) return invalid("name and shape must not be NULL");
    for (size_t i = 0; i < request->n_inputs; i++)
        if (strcmp(request->inputs[i].name, name) == 0)
            return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                         "input already exists in request");
    bls_input_t *p = realloc(request->inputs, (request->n_inputs + 1) * sizeof *p);
    if (!p) return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    request->inputs = p;
    bls_input_t *in = &p[request->n_inputs];
    memset(in, 0, sizeof *in);
    in->name = strdup(name);
    in->shape = malloc((dim_count ? dim_count : 1) * sizeof(int64_t));
    if (!in->name || !in->shape) {
        free(in->name);
        free(in->shape);
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    }
    if (dim_count) memcpy(in->shape, shape, dim_count * sizeof(int64_t));
    in->rank = dim_count;
    in->datatype = (nereid_datatype_t)datatype;
    request->n_inputs++;
    return NULL;
}

TRITONSERVER_Error *TRITONSERVER_InferenceRequestAppendInputData(
    TRITONSERVER_InferenceRequest *request, const char *name, const void *base, size_t byte_size,
    TRITONSERVER_MemoryType memory_type, int64_t memory_type_id)
{
    (void)memory_type_id;
    TRITONSERVER_Error *err = pending(request);
    if (err) return err;
    if (memory_type == TRITONSERVER_MEMORY_GPU)
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED,
                                     "GPU input memory is not supported by Nereid");
    bls_input_t *in = NULL;
    for (size_t i = 0; name && i < request->n_inputs && !in; i++)
        if (strcmp(request->inputs[i].name, name) == 0) in = &request->inputs[i];
    if (!in) return invalid("input not found in request");
    if (!in->data && !in->byte_size) {
        in->data = base;
        in->byte_size = byte_size;
        return NULL;
    }
    char *joined = malloc(in->byte_size + byte_size + 1);
    if (!joined) return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    memcpy(joined, in->data, in->byte_size);
    if (byte_size) memcpy(joined + in->byte_size, base, byte_size);
    if (in->owned) free((void *)in->data);
    in->data = joined;
    in->byte_size += byte_size;
    in->owned = true;
    return NULL;
}

TRITONSERVER_Error *
TRITONSERVER_InferenceRequestAddRequestedOutput(TRITONSERVER_InferenceRequest *request,
                                                const char *name)
{
    TRITONSERVER_Error *err = pending(request);
    return err ? err
               : (TRITONSERVER_Error *)nereid_request_add_requested_output(request->req, name, 0);
}

TRITONSERVER_Error *
TRITONSERVER_InferenceRequestSetReleaseCallback(TRITONSERVER_InferenceRequest *request,
                                                TRITONSERVER_InferenceRequestReleaseFn_t release_fn,
                                                void *release_userp)
{
    if (!request) return invalid("inference request must not be NULL");
    request->release_fn = release_fn;
    request->release_userp = release_userp;
    return NULL;
}

TRITONSERVER_Error *TRITONSERVER_InferenceRequestSetResponseCallback(
    TRITONSERVER_InferenceRequest *request, TRITONSERVER_ResponseAllocator *allocator,
    void *alloc_userp, TRITONSERVER_InferenceResponseCompleteFn_t response_fn, void *response_userp)
{
    if (!request) return invalid("inference request must not be NULL");
    request->allocator = allocator;
    request->alloc_userp = alloc_userp;
    request->response_fn = response_fn;
    request->response_userp = response_userp;
    return NULL;
}

/* ---- Submission ---- */

static nereid_error_t *bls_alloc(void *userp, const char *name, nereid_datatype_t datatype,
                                 const int64_t *shape, size_t rank, size_t byte_size, void **buffer,
                                 void **buffer_userp)
{
    (void)datatype, (void)shape, (void)rank;
    bls_ctx_t *ctx = userp;
    TRITONSERVER_ResponseAllocator *a = ctx->allocator;
    if (a->start_fn && !ctx->started) {
        ctx->started = true;
        TRITONSERVER_Error *err = a->start_fn(a, ctx->alloc_userp);
        if (err) return (nereid_error_t *)err;
    }
    TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
    int64_t type_id = 0;
    TRITONSERVER_Error *err = a->alloc_fn(a, name, byte_size, TRITONSERVER_MEMORY_CPU, 0,
                                          ctx->alloc_userp, buffer, buffer_userp, &type, &type_id);
    if (err) return (nereid_error_t *)err;
    if (type == TRITONSERVER_MEMORY_GPU || (!*buffer && byte_size))
        return nereid_error_new(NEREID_ERROR_UNSUPPORTED,
                                "the response allocator gave no CPU memory for output '%s'", name);
    return NULL;
}

static void bls_release(void *userp, void *buffer, void *buffer_userp, size_t byte_size)
{
    bls_ctx_t *ctx = userp;
    TRITONSERVER_ResponseAllocator *a = ctx->allocator;
    if (a->release_fn)
        TRITONSERVER_ErrorDelete(
            a->release_fn(a, buffer, buffer_userp, byte_size, TRITONSERVER_MEMORY_CPU, 0));
}

static void bls_done(nereid_response_t *resp, void *userp)
{
    bls_ctx_t *ctx = userp;
    TRITONSERVER_InferenceResponse *r = malloc(sizeof *r);
    if (ctx->release_fn)
        ctx->release_fn(ctx->request, TRITONSERVER_REQUEST_RELEASE_ALL, ctx->release_userp);
    if (!r) { /* nothing to hand over: the caller sees the final flag only */
        TRITONSERVER_InferenceResponseCompleteFn_t fn = ctx->response_fn;
        void *fn_userp = ctx->response_userp;
        nereid_response_free(resp);
        free(ctx);
        if (fn) fn(NULL, TRITONSERVER_RESPONSE_COMPLETE_FINAL, fn_userp);
        return;
    }
    r->resp = resp;
    r->ctx = ctx;
    if (ctx->response_fn)
        ctx->response_fn(r, TRITONSERVER_RESPONSE_COMPLETE_FINAL, ctx->response_userp);
    else
        TRITONSERVER_InferenceResponseDelete(r);
}

TRITONSERVER_Error *TRITONSERVER_ServerInferAsync(TRITONSERVER_Server *server,
                                                  TRITONSERVER_InferenceRequest *request,
                                                  TRITONSERVER_InferenceTrace *trace)
{
    (void)trace;
    TRITONSERVER_Error *err = pending(request);
    if (err) return err;
    if (!server) return invalid("server must not be NULL");
    if (!request->allocator || !request->response_fn)
        return invalid("the request has no response callback "
                       "(TRITONSERVER_InferenceRequestSetResponseCallback)");
    for (size_t i = 0; i < request->n_inputs; i++) {
        bls_input_t *in = &request->inputs[i];
        nereid_error_t *e = nereid_request_add_input(request->req, in->name, in->datatype,
                                                     in->shape, in->rank, in->data, in->byte_size);
        if (e) return (TRITONSERVER_Error *)e;
    }
    bls_ctx_t *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    ctx->request = request;
    ctx->allocator = request->allocator;
    ctx->alloc_userp = request->alloc_userp;
    ctx->response_fn = request->response_fn;
    ctx->response_userp = request->response_userp;
    ctx->release_fn = request->release_fn;
    ctx->release_userp = request->release_userp;
    nereid_response_allocator_t alloc = {
        .alloc_fn = bls_alloc, .release_fn = bls_release, .userp = ctx};
    nereid_request_t *req = request->req;
    request->req = NULL; /* the completion may run (and delete request) before return */
    nereid_error_t *e =
        nereid_server_infer_async((nereid_server_t *)server, req, &alloc, bls_done, ctx);
    if (e) {
        request->req = req;
        free(ctx);
    }
    return (TRITONSERVER_Error *)e;
}

/* ---- Responses ---- */

TRITONSERVER_Error *TRITONSERVER_InferenceResponseDelete(TRITONSERVER_InferenceResponse *response)
{
    if (!response) return NULL;
    nereid_response_free(response->resp);
    free(response->ctx);
    free(response);
    return NULL;
}

TRITONSERVER_Error *TRITONSERVER_InferenceResponseError(TRITONSERVER_InferenceResponse *response)
{
    if (!response) return invalid("response must not be NULL");
    return (TRITONSERVER_Error *)nereid_response_error(response->resp);
}

TRITONSERVER_Error *
TRITONSERVER_InferenceResponseOutputCount(TRITONSERVER_InferenceResponse *response, uint32_t *count)
{
    if (!response || !count) return invalid("response and count must not be NULL");
    *count = (uint32_t)nereid_response_output_count(response->resp);
    return NULL;
}

TRITONSERVER_Error *TRITONSERVER_InferenceResponseOutput(
    TRITONSERVER_InferenceResponse *response, const uint32_t index, const char **name,
    TRITONSERVER_DataType *datatype, const int64_t **shape, uint64_t *dim_count, const void **base,
    size_t *byte_size, TRITONSERVER_MemoryType *memory_type, int64_t *memory_type_id, void **userp)
{
    if (!response || !name || !datatype || !shape || !dim_count || !base || !byte_size ||
        !memory_type || !memory_type_id || !userp)
        return invalid("response and out-parameters must not be NULL");
    if (index >= nereid_response_output_count(response->resp))
        return invalid("out of bounds index for response outputs");
    nereid_datatype_t dt;
    size_t rank;
    nereid_response_output(response->resp, index, name, &dt, shape, &rank, base, byte_size, userp);
    *datatype = (TRITONSERVER_DataType)dt;
    *dim_count = rank;
    *memory_type = TRITONSERVER_MEMORY_CPU;
    *memory_type_id = 0;
    return NULL;
}

/* ---- Server queries ---- */

TRITONSERVER_Error *TRITONSERVER_ServerModelIsReady(TRITONSERVER_Server *server,
                                                    const char *model_name,
                                                    const int64_t model_version, bool *ready)
{
    if (!server || !model_name || !ready)
        return invalid("server, model_name and ready must not be NULL");
    return (TRITONSERVER_Error *)nereid_server_model_is_ready((nereid_server_t *)server, model_name,
                                                              model_version, ready);
}

TRITONSERVER_Error *TRITONSERVER_ServerModelTransactionProperties(TRITONSERVER_Server *server,
                                                                  const char *model_name,
                                                                  const int64_t model_version,
                                                                  uint32_t *txn_flags, void **voidp)
{
    if (!server || !model_name || !txn_flags)
        return invalid("server, model_name and txn_flags must not be NULL");
    bool decoupled = false;
    nereid_error_t *err = nereid_server_model_decoupled((nereid_server_t *)server, model_name,
                                                        model_version, &decoupled);
    if (err) return (TRITONSERVER_Error *)err;
    *txn_flags = decoupled ? TRITONSERVER_TXN_DECOUPLED : TRITONSERVER_TXN_ONE_TO_ONE;
    if (voidp) *voidp = NULL;
    return NULL;
}

TRITONSERVER_Error *TRITONSERVER_ServerModelBatchProperties(TRITONSERVER_Server *server,
                                                            const char *model_name,
                                                            const int64_t model_version,
                                                            uint32_t *flags, void **voidp)
{
    if (!server || !model_name || !flags)
        return invalid("server, model_name and flags must not be NULL");
    char *json = NULL;
    nereid_error_t *err =
        nereid_server_model_config((nereid_server_t *)server, model_name, model_version, &json);
    if (err) return (TRITONSERVER_Error *)err;
    const char *p = strstr(json, "\"max_batch_size\":");
    long long mbs = p ? strtoll(p + strlen("\"max_batch_size\":"), NULL, 10) : 0;
    free(json);
    *flags = mbs > 0 ? TRITONSERVER_BATCH_FIRST_DIM : TRITONSERVER_BATCH_UNKNOWN;
    if (voidp) *voidp = NULL;
    return NULL;
}
