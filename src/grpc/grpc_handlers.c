/*
 * This file contains the gRPC handlers for every RPC except inference:
 * health, metadata, model config, statistics, repository and the RPCs Nereid
 * does not support (shared memory, trace and log settings). Documents the
 * core returns as JSON are parsed with jansson into the protobuf replies.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "grpc/grpc_internal.h"
#include "grpc/infer_codec.h"
#include "nereid/common.h"
#include "grpc_service.pb-c.h"
#include "health.pb-c.h"

/* Allocations of one reply, freed together after it is packed. */
typedef struct arena {
    void **ptrs;
    size_t n;
    bool failed;
} arena_t;

static void *arena_calloc(arena_t *a, size_t n, size_t size)
{
    void *p = calloc(n > 0 ? n : 1, size);
    void **ptrs = p != NULL ? realloc(a->ptrs, (a->n + 1) * sizeof(*ptrs)) : NULL;
    if (ptrs == NULL) {
        free(p);
        a->failed = true;
        return NULL;
    }
    a->ptrs = ptrs;
    a->ptrs[a->n++] = p;
    return p;
}

static void arena_free(arena_t *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->ptrs[i]);
    free(a->ptrs);
}

static void finish_malformed(gfe_unary_call_t *c, const char *what)
{
    char msg[160];
    snprintf(msg, sizeof(msg), "failed to parse the %s message", what);
    gfe_unary_finish_status(c, GRPC_STATUS_INVALID_ARGUMENT, msg, NULL);
}

static void finish_bad_json(gfe_unary_call_t *c)
{
    gfe_unary_finish_status(c, GRPC_STATUS_INTERNAL, "failed to parse the server's JSON reply",
                            NULL);
}

/* Finishes the call with err, or parses the core's JSON reply text (freed
 * either way); NULL when the call has been finished. */
static json_t *reply_json(gfe_unary_call_t *c, nereid_error_t *err, char *text)
{
    if (err != NULL) {
        free(text);
        gfe_unary_finish_error(c, err);
        return NULL;
    }
    json_t *doc = json_loads(text, 0, NULL);
    free(text);
    if (doc == NULL) finish_bad_json(c);
    return doc;
}

static const char *jstr(const json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));
    return s != NULL ? s : "";
}

static uint64_t juint(const json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    if (json_is_integer(v)) return (uint64_t)json_integer_value(v);
    if (json_is_string(v)) return strtoull(json_string_value(v), NULL, 10);
    if (json_is_real(v)) return (uint64_t)json_real_value(v);
    return 0;
}

/* ---- Health ------------------------------------------------------------- */

void gfe_server_live(gfe_unary_call_t *c, const uint8_t *data, size_t len)
{
    (void)data;
    (void)len;
    Inference__ServerLiveResponse r = INFERENCE__SERVER_LIVE_RESPONSE__INIT;
    r.live = nereid_server_is_live(c->fe->server);
    gfe_unary_finish_msg(c, &r.base);
}

void gfe_server_ready(gfe_unary_call_t *c, const uint8_t *data, size_t len)
{
    (void)data;
    (void)len;
    Inference__ServerReadyResponse r = INFERENCE__SERVER_READY_RESPONSE__INIT;
    r.ready = nereid_server_is_ready(c->fe->server);
    gfe_unary_finish_msg(c, &r.base);
}

void gfe_health_check(gfe_unary_call_t *c, const uint8_t *data, size_t len)
{
    Grpc__Health__V1__HealthCheckRequest *req =
        grpc__health__v1__health_check_request__unpack(NULL, len, data);
    if (req == NULL) {
        finish_malformed(c, "HealthCheckRequest");
        return;
    }
    grpc__health__v1__health_check_request__free_unpacked(req, NULL);
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = nereid_server_is_ready(c->fe->server)
                   ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                   : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    gfe_unary_finish_msg(c, &r.base);
}

void gfe_model_ready(gfe_unary_call_t *c, const uint8_t *data, size_t len)
{
    Inference__ModelReadyRequest *req = inference__model_ready_request__unpack(NULL, len, data);
    if (req == NULL) {
        finish_malformed(c, "ModelReadyRequest");
        return;
    }
    Inference__ModelReadyResponse r = INFERENCE__MODEL_READY_RESPONSE__INIT;
    int64_t version;
    bool ready = false;
    nereid_error_t *err = infer_codec_version(req->version, &version);
    if (err == NULL) err = nereid_server_model_is_ready(c->fe->server, req->name, version, &ready);
    /* Triton's QA (L0_lifecycle, L0_server_status, the model-control
     * examples) expects an unknown, unloaded or missing version to be
     * "not ready" with no error, as over HTTP: its ModelIsReady ignored the
     * lookup's failure until core #502. */
    if (err != NULL && (nereid_error_code(err) == NEREID_ERROR_NOT_FOUND ||
                        nereid_error_code(err) == NEREID_ERROR_UNAVAILABLE)) {
        nereid_error_free(err);
        err = NULL;
        ready = false;
    }
    inference__model_ready_request__free_unpacked(req, NULL);
    r.ready = err == NULL && ready;
    if (err != NULL) { /* Triton sends ready:false together with the lookup error */
        gfe_unary_finish_status(c, gfe_status_from_error(err), nereid_error_message(err),
                                gfe_buffer_from_msg(&r.base));
        nereid_error_free(err);
        return;
    }
    gfe_unary_finish_msg(c, &r.base);
}

/* ---- Metadata ----------------------------------------------------------- */

void gfe_server_metadata(gfe_unary_call_t *c, const uint8_t *data, size_t len)
{
    (void)data;
    (void)len;
    char *text = NULL;
    nereid_error_t *err = nereid_server_metadata(c->fe->server, &text);
    json_t *doc = reply_json(c, err, text);
    if (doc == NULL) return;
    arena_t a = {0};
    Inference__ServerMetadataResponse r = INFERENCE__SERVER_METADATA_RESPONSE__INIT;
    r.name = (char *)jstr(doc, "name");
    r.version = (char *)jstr(doc, "version");
    json_t *ext = json_object_get(doc, "extensions");
    r.extensions = arena_calloc(&a, json_array_size(ext), sizeof(char *));
    for (size_t i = 0; r.extensions != NULL && i < json_array_size(ext); i++) {
        const char *s = json_string_value(json_array_get(ext, i));
        r.extensions[r.n_extensions++] = (char *)(s != NULL ? s : "");
    }
    if (a.failed)
        gfe_unary_finish_status(c, GRPC_STATUS_INTERNAL, "out of memory", NULL);
    else
        gfe_unary_finish_msg(c, &r.base);
    arena_free(&a);
    json_decref(doc);
}

static Inference__ModelMetadataResponse__TensorMetadata **tensors(arena_t *a, json_t *arr,
                                                                  size_t *n_out)
{
    size_t n = json_array_size(arr);
    *n_out = 0;
    Inference__ModelMetadataResponse__TensorMetadata **list = arena_calloc(a, n, sizeof(*list));
    Inference__ModelMetadataResponse__TensorMetadata *items = arena_calloc(a, n, sizeof(*items));
    if (list == NULL || items == NULL) return NULL;
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(arr, i);
        Inference__ModelMetadataResponse__TensorMetadata init =
            INFERENCE__MODEL_METADATA_RESPONSE__TENSOR_METADATA__INIT;
        items[i] = init;
        items[i].name = (char *)jstr(t, "name");
        items[i].datatype = (char *)jstr(t, "datatype");
        json_t *shape = json_object_get(t, "shape");
        items[i].shape = arena_calloc(a, json_array_size(shape), sizeof(int64_t));
        for (size_t d = 0; items[i].shape != NULL && d < json_array_size(shape); d++)
            items[i].shape[items[i].n_shape++] = json_integer_value(json_array_get(shape, d));
        list[i] = &items[i];
    }
    *n_out = n;
    return list;
}

void gfe_model_metadata(gfe_unary_call_t *c, const uint8_t *data, size_t len)
{
    Inference__ModelMetadataRequest *req =
        inference__model_metadata_request__unpack(NULL, len, data);
    if (req == NULL) {
        finish_malformed(c, "ModelMetadataRequest");
        return;
    }
    int64_t version;
    char *text = NULL;
    nereid_error_t *err = infer_codec_version(req->version, &version);
    if (err == NULL) err = nereid_server_model_metadata(c->fe->server, req->name, version, &text);
    inference__model_metadata_request__free_unpacked(req, NULL);
    json_t *doc = reply_json(c, err, text);
    if (doc == NULL) return;
    arena_t a = {0};
    Inference__ModelMetadataResponse r = INFERENCE__MODEL_METADATA_RESPONSE__INIT;
    r.name = (char *)jstr(doc, "name");
    r.platform = (char *)jstr(doc, "platform");
    json_t *versions = json_object_get(doc, "versions");
    r.versions = arena_calloc(&a, json_array_size(versions), sizeof(char *));
    for (size_t i = 0; r.versions != NULL && i < json_array_size(versions); i++) {
        const char *s = json_string_value(json_array_get(versions, i));
        r.versions[r.n_versions++] = (char *)(s != NULL ? s : "");
    }
    r.inputs = tensors(&a, json_object_get(doc, "inputs"), &r.n_inputs);
    r.outputs = tensors(&a, json_object_get(doc, "outputs"), &r.n_outputs);
    if (a.failed)
        gfe_unary_finish_status(c, GRPC_STATUS_INTERNAL, "out of memory", NULL);
    else
        gfe_unary_finish_msg(c, &r.base);
    arena_free(&a);
    json_decref(doc);
}

void gfe_model_config(gfe_unary_call_t *c, const uint8_t *data, size_t len)
{
    Inference__ModelConfigRequest *req = inference__model_config_request__unpack(NULL, len, data);
    if (req == NULL) {
        finish_malformed(c, "ModelConfigRequest");
        return;
    }
    int64_t version;
    void *bytes = NULL;
    size_t n_bytes = 0;
    nereid_error_t *err = infer_codec_version(req->version, &version);
    if (err == NULL)
        err = nereid_server_model_config_proto(c->fe->server, req->name, version, &bytes, &n_bytes);
    inference__model_config_request__free_unpacked(req, NULL);
    if (err != NULL) {
        gfe_unary_finish_error(c, err);
        return;
    }
    /* ModelConfigResponse { ModelConfig config = 1; } around the core's bytes. */
    grpc_slice s = grpc_slice_malloc(n_bytes + 11);
    uint8_t *p = GRPC_SLICE_START_PTR(s);
    size_t pos = 0;
    p[pos++] = 0x0a;
    uint64_t v = n_bytes;
    while (v >= 0x80) {
        p[pos++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[pos++] = (uint8_t)v;
    if (n_bytes > 0) memcpy(p + pos, bytes, n_bytes);
    pos += n_bytes;
    free(bytes);
    grpc_slice body = grpc_slice_sub(s, 0, pos);
    grpc_slice_unref(s);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&body, 1);
    grpc_slice_unref(body);
    gfe_unary_finish(c, bb);
}

/* ---- Statistics --------------------------------------------------------- */

static Inference__StatisticDuration *duration(arena_t *a, const json_t *obj, const char *key)
{
    Inference__StatisticDuration *d = arena_calloc(a, 1, sizeof(*d));
    if (d == NULL) return NULL;
    Inference__StatisticDuration init = INFERENCE__STATISTIC_DURATION__INIT;
    *d = init;
    json_t *v = json_object_get(obj, key);
    d->count = juint(v, "count");
    d->ns = juint(v, "ns");
    return d;
}

static void fill_model_stats(arena_t *a, Inference__ModelStatistics *m, json_t *j)
{
    Inference__ModelStatistics init = INFERENCE__MODEL_STATISTICS__INIT;
    *m = init;
    m->name = (char *)jstr(j, "name");
    m->version = (char *)jstr(j, "version");
    m->last_inference = juint(j, "last_inference");
    m->inference_count = juint(j, "inference_count");
    m->execution_count = juint(j, "execution_count");

    json_t *is = json_object_get(j, "inference_stats");
    Inference__InferStatistics *st = arena_calloc(a, 1, sizeof(*st));
    if (st != NULL) {
        Inference__InferStatistics sinit = INFERENCE__INFER_STATISTICS__INIT;
        *st = sinit;
        st->success = duration(a, is, "success");
        st->fail = duration(a, is, "fail");
        st->queue = duration(a, is, "queue");
        st->compute_input = duration(a, is, "compute_input");
        st->compute_infer = duration(a, is, "compute_infer");
        st->compute_output = duration(a, is, "compute_output");
        st->cache_hit = duration(a, is, "cache_hit");
        st->cache_miss = duration(a, is, "cache_miss");
        m->inference_stats = st;
    }

    json_t *bs = json_object_get(j, "batch_stats");
    size_t nb = json_array_size(bs);
    m->batch_stats = arena_calloc(a, nb, sizeof(*m->batch_stats));
    Inference__InferBatchStatistics *bitems = arena_calloc(a, nb, sizeof(*bitems));
    for (size_t i = 0; m->batch_stats != NULL && bitems != NULL && i < nb; i++) {
        json_t *b = json_array_get(bs, i);
        Inference__InferBatchStatistics binit = INFERENCE__INFER_BATCH_STATISTICS__INIT;
        bitems[i] = binit;
        bitems[i].batch_size = juint(b, "batch_size");
        bitems[i].compute_input = duration(a, b, "compute_input");
        bitems[i].compute_infer = duration(a, b, "compute_infer");
        bitems[i].compute_output = duration(a, b, "compute_output");
        m->batch_stats[m->n_batch_stats++] = &bitems[i];
    }

    json_t *mu = json_object_get(j, "memory_usage");
    size_t nm = json_array_size(mu);
    m->memory_usage = arena_calloc(a, nm, sizeof(*m->memory_usage));
    Inference__MemoryUsage *mitems = arena_calloc(a, nm, sizeof(*mitems));
    for (size_t i = 0; m->memory_usage != NULL && mitems != NULL && i < nm; i++) {
        json_t *u = json_array_get(mu, i);
        Inference__MemoryUsage minit = INFERENCE__MEMORY_USAGE__INIT;
        mitems[i] = minit;
        mitems[i].type = (char *)jstr(u, "type");
        mitems[i].id = (int64_t)juint(u, "id");
        mitems[i].byte_size = juint(u, "byte_size");
        m->memory_usage[m->n_memory_usage++] = &mitems[i];
    }

    json_t *rs = json_object_get(j, "response_stats");
    size_t nr = json_object_size(rs);
    m->response_stats = arena_calloc(a, nr, sizeof(*m->response_stats));
    Inference__ModelStatistics__ResponseStatsEntry *entries = arena_calloc(a, nr, sizeof(*entries));
    Inference__InferResponseStatistics *ritems = arena_calloc(a, nr, sizeof(*ritems));
    const char *key;
    json_t *val;
    if (m->response_stats == NULL || entries == NULL || ritems == NULL) return;
    json_object_foreach(rs, key, val)
    {
        size_t i = m->n_response_stats;
        Inference__ModelStatistics__ResponseStatsEntry einit =
            INFERENCE__MODEL_STATISTICS__RESPONSE_STATS_ENTRY__INIT;
        Inference__InferResponseStatistics rinit = INFERENCE__INFER_RESPONSE_STATISTICS__INIT;
        entries[i] = einit;
        ritems[i] = rinit;
        ritems[i].compute_infer = duration(a, val, "compute_infer");
        ritems[i].compute_output = duration(a, val, "compute_output");
        ritems[i].success = duration(a, val, "success");
        ritems[i].fail = duration(a, val, "fail");
        ritems[i].empty_response = duration(a, val, "empty_response");
        ritems[i].cancel = duration(a, val, "cancel");
        entries[i].key = (char *)key;
        entries[i].value = &ritems[i];
        m->response_stats[m->n_response_stats++] = &entries[i];
    }
}

void gfe_model_statistics(gfe_unary_call_t *c, const uint8_t *data, size_t len)
{
    Inference__ModelStatisticsRequest *req =
        inference__model_statistics_request__unpack(NULL, len, data);
    if (req == NULL) {
        finish_malformed(c, "ModelStatisticsRequest");
        return;
    }
    int64_t version;
    char *text = NULL;
    nereid_error_t *err = infer_codec_version(req->version, &version);
    if (err == NULL) err = nereid_server_model_statistics(c->fe->server, req->name, version, &text);
    inference__model_statistics_request__free_unpacked(req, NULL);
    json_t *doc = reply_json(c, err, text);
    if (doc == NULL) return;
    arena_t a = {0};
    Inference__ModelStatisticsResponse r = INFERENCE__MODEL_STATISTICS_RESPONSE__INIT;
    json_t *list = json_object_get(doc, "model_stats");
    size_t n = json_array_size(list);
    r.model_stats = arena_calloc(&a, n, sizeof(*r.model_stats));
    Inference__ModelStatistics *items = arena_calloc(&a, n, sizeof(*items));
    for (size_t i = 0; r.model_stats != NULL && items != NULL && i < n; i++) {
        fill_model_stats(&a, &items[i], json_array_get(list, i));
        r.model_stats[r.n_model_stats++] = &items[i];
    }
    if (a.failed)
        gfe_unary_finish_status(c, GRPC_STATUS_INTERNAL, "out of memory", NULL);
    else
        gfe_unary_finish_msg(c, &r.base);
    arena_free(&a);
    json_decref(doc);
}

/* ---- Repository --------------------------------------------------------- */

void gfe_repository_index(gfe_unary_call_t *c, const uint8_t *data, size_t len)
{
    Inference__RepositoryIndexRequest *req =
        inference__repository_index_request__unpack(NULL, len, data);
    if (req == NULL) {
        finish_malformed(c, "RepositoryIndexRequest");
        return;
    }
    char *text = NULL;
    nereid_error_t *err = nereid_server_repository_index(c->fe->server, req->ready, &text);
    inference__repository_index_request__free_unpacked(req, NULL);
    json_t *doc = reply_json(c, err, text);
    if (doc == NULL) return;
    arena_t a = {0};
    Inference__RepositoryIndexResponse r = INFERENCE__REPOSITORY_INDEX_RESPONSE__INIT;
    size_t n = json_array_size(doc);
    r.models = arena_calloc(&a, n, sizeof(*r.models));
    Inference__RepositoryIndexResponse__ModelIndex *items = arena_calloc(&a, n, sizeof(*items));
    for (size_t i = 0; r.models != NULL && items != NULL && i < n; i++) {
        json_t *m = json_array_get(doc, i);
        Inference__RepositoryIndexResponse__ModelIndex init =
            INFERENCE__REPOSITORY_INDEX_RESPONSE__MODEL_INDEX__INIT;
        items[i] = init;
        items[i].name = (char *)jstr(m, "name");
        items[i].version = (char *)jstr(m, "version");
        items[i].state = (char *)jstr(m, "state");
        items[i].reason = (char *)jstr(m, "reason");
        r.models[r.n_models++] = &items[i];
    }
    if (a.failed)
        gfe_unary_finish_status(c, GRPC_STATUS_INTERNAL, "out of memory", NULL);
    else
        gfe_unary_finish_msg(c, &r.base);
    arena_free(&a);
    json_decref(doc);
}

/* Model load/unload can take seconds: they run on their own thread so the
 * completion-queue threads keep serving. */
typedef struct offload {
    gfe_unary_call_t *call;
    void *req;
    void (*fn)(gfe_unary_call_t *c, void *req);
} offload_t;

static void *offload_main(void *arg)
{
    offload_t *o = arg;
    o->fn(o->call, o->req);
    free(o);
    return NULL;
}

static void offload(gfe_unary_call_t *c, void *req, void (*fn)(gfe_unary_call_t *, void *))
{
    offload_t *o = malloc(sizeof(*o));
    if (o != NULL) {
        o->call = c;
        o->req = req;
        o->fn = fn;
        if (nereid_start_detached(offload_main, o)) return;
        free(o);
    }
    fn(c, req);
}

static void repository_load_work(gfe_unary_call_t *c, void *arg)
{
    Inference__RepositoryModelLoadRequest *req = arg;
    const char *config = NULL;
    size_t n = req->n_parameters, n_files = 0;
    const char **paths = calloc(n + 1, sizeof(*paths));
    const void **contents = calloc(n + 1, sizeof(*contents));
    size_t *sizes = calloc(n + 1, sizeof(*sizes));
    nereid_error_t *err = NULL;
    if (paths == NULL || contents == NULL || sizes == NULL)
        err = nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    for (size_t i = 0; err == NULL && i < n; i++) {
        const char *key = req->parameters[i]->key;
        const Inference__ModelRepositoryParameter *v = req->parameters[i]->value;
        Inference__ModelRepositoryParameter__ParameterChoiceCase pc =
            v != NULL ? v->parameter_choice_case
                      : INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE__NOT_SET;
        if (strcmp(key, "config") == 0) {
            if (pc != INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_STRING_PARAM)
                err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                       "invalid value type for load parameter '%s', expected "
                                       "string_param.",
                                       key);
            else
                config = v->string_param;
        } else if (strncmp(key, "file:", 5) == 0) {
            if (pc != INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_BYTES_PARAM) {
                err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                       "invalid value type for load parameter '%s', expected "
                                       "bytes_param.",
                                       key);
            } else {
                paths[n_files] = key + 5;
                contents[n_files] = v->bytes_param.data;
                sizes[n_files] = v->bytes_param.len;
                n_files++;
            }
        }
    }
    if (err == NULL)
        err = nereid_server_load_model(c->fe->server, req->model_name, config, paths, contents,
                                       sizes, n_files);
    free(paths);
    free(contents);
    free(sizes);
    inference__repository_model_load_request__free_unpacked(req, NULL);
    if (err != NULL) {
        gfe_unary_finish_error(c, err);
        return;
    }
    Inference__RepositoryModelLoadResponse r = INFERENCE__REPOSITORY_MODEL_LOAD_RESPONSE__INIT;
    gfe_unary_finish_msg(c, &r.base);
}

void gfe_repository_load(gfe_unary_call_t *c, const uint8_t *data, size_t len)
{
    Inference__RepositoryModelLoadRequest *req =
        inference__repository_model_load_request__unpack(NULL, len, data);
    if (req == NULL)
        finish_malformed(c, "RepositoryModelLoadRequest");
    else
        offload(c, req, repository_load_work);
}

static void repository_unload_work(gfe_unary_call_t *c, void *arg)
{
    Inference__RepositoryModelUnloadRequest *req = arg;
    bool dependents = false;
    nereid_error_t *err = NULL;
    for (size_t i = 0; err == NULL && i < req->n_parameters; i++) {
        const Inference__ModelRepositoryParameter *v = req->parameters[i]->value;
        if (strcmp(req->parameters[i]->key, "unload_dependents") != 0) continue;
        if (v == NULL || v->parameter_choice_case !=
                             INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM)
            err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                   "invalid value type for 'unload_dependents' parameter, "
                                   "expected bool_param.");
        else
            dependents = v->bool_param != 0;
    }
    if (err == NULL) err = nereid_server_unload_model(c->fe->server, req->model_name, dependents);
    inference__repository_model_unload_request__free_unpacked(req, NULL);
    if (err != NULL) {
        gfe_unary_finish_error(c, err);
        return;
    }
    Inference__RepositoryModelUnloadResponse r = INFERENCE__REPOSITORY_MODEL_UNLOAD_RESPONSE__INIT;
    gfe_unary_finish_msg(c, &r.base);
}

void gfe_repository_unload(gfe_unary_call_t *c, const uint8_t *data, size_t len)
{
    Inference__RepositoryModelUnloadRequest *req =
        inference__repository_model_unload_request__unpack(NULL, len, data);
    if (req == NULL)
        finish_malformed(c, "RepositoryModelUnloadRequest");
    else
        offload(c, req, repository_unload_work);
}

/* ---- Shared memory ------------------------------------------------------ */

void gfe_system_shm_status(gfe_unary_call_t *c, const uint8_t *data, size_t len)
{
    Inference__SystemSharedMemoryStatusRequest *req =
        inference__system_shared_memory_status_request__unpack(NULL, len, data);
    if (req == NULL) {
        finish_malformed(c, "SystemSharedMemoryStatusRequest");
        return;
    }
    char *text = NULL;
    nereid_error_t *err = nereid_shm_status(c->fe->shm, req->name, &text);
    inference__system_shared_memory_status_request__free_unpacked(req, NULL);
    json_t *doc = reply_json(c, err, text);
    if (doc == NULL) return;
    arena_t a = {0};
    size_t n = json_array_size(doc);
    Inference__SystemSharedMemoryStatusResponse r =
        INFERENCE__SYSTEM_SHARED_MEMORY_STATUS_RESPONSE__INIT;
    r.regions = arena_calloc(&a, n, sizeof(*r.regions));
    Inference__SystemSharedMemoryStatusResponse__RegionsEntry *entries =
        arena_calloc(&a, n, sizeof(*entries));
    Inference__SystemSharedMemoryStatusResponse__RegionStatus *st =
        arena_calloc(&a, n, sizeof(*st));
    for (size_t i = 0; !a.failed && i < n; i++) {
        json_t *j = json_array_get(doc, i);
        st[i] = (Inference__SystemSharedMemoryStatusResponse__RegionStatus)
            INFERENCE__SYSTEM_SHARED_MEMORY_STATUS_RESPONSE__REGION_STATUS__INIT;
        st[i].name = (char *)jstr(j, "name");
        st[i].key = (char *)jstr(j, "key");
        st[i].offset = juint(j, "offset");
        st[i].byte_size = juint(j, "byte_size");
        entries[i] = (Inference__SystemSharedMemoryStatusResponse__RegionsEntry)
            INFERENCE__SYSTEM_SHARED_MEMORY_STATUS_RESPONSE__REGIONS_ENTRY__INIT;
        entries[i].key = st[i].name;
        entries[i].value = &st[i];
        r.regions[r.n_regions++] = &entries[i];
    }
    if (a.failed)
        gfe_unary_finish_status(c, GRPC_STATUS_INTERNAL, "out of memory", NULL);
    else
        gfe_unary_finish_msg(c, &r.base);
    arena_free(&a);
    json_decref(doc);
}

/* SystemSharedMemoryRegister and SystemSharedMemoryUnregister: both reply
 * with an empty message. */
void gfe_system_shm_update(gfe_unary_call_t *c, const uint8_t *data, size_t len)
{
    nereid_error_t *err;
    if (c->method == GFE_M_SYSTEM_SHM_REGISTER) {
        Inference__SystemSharedMemoryRegisterRequest *req =
            inference__system_shared_memory_register_request__unpack(NULL, len, data);
        if (req == NULL) {
            finish_malformed(c, "SystemSharedMemoryRegisterRequest");
            return;
        }
        err = nereid_shm_register(c->fe->shm, req->name, req->key, req->offset, req->byte_size);
        inference__system_shared_memory_register_request__free_unpacked(req, NULL);
    } else {
        Inference__SystemSharedMemoryUnregisterRequest *req =
            inference__system_shared_memory_unregister_request__unpack(NULL, len, data);
        if (req == NULL) {
            finish_malformed(c, "SystemSharedMemoryUnregisterRequest");
            return;
        }
        err = nereid_shm_unregister(c->fe->shm, req->name);
        inference__system_shared_memory_unregister_request__free_unpacked(req, NULL);
    }
    if (err != NULL)
        gfe_unary_finish_error(c, err);
    else
        gfe_unary_finish(c, NULL);
}

/* As Triton built without GPU support: no CUDA region is ever registered. */
void gfe_cuda_shm(gfe_unary_call_t *c, const uint8_t *data, size_t len)
{
    /* The three requests all carry the region name as field 1. */
    Inference__CudaSharedMemoryStatusRequest *req =
        inference__cuda_shared_memory_status_request__unpack(NULL, len, data);
    if (req == NULL) {
        finish_malformed(c, "CudaSharedMemory request");
        return;
    }
    nereid_error_t *err = NULL;
    if (c->method == GFE_M_CUDA_SHM_REGISTER) {
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "failed to register CUDA shared memory region: '%s', GPUs not "
                               "supported",
                               req->name);
    } else if (c->method == GFE_M_CUDA_SHM_UNREGISTER) {
        if (!nereid_shm_allowed(c->fe->shm))
            err = nereid_error_new(NEREID_ERROR_UNSUPPORTED, NEREID_SHM_DISABLED_TEXT);
    } else if (req->name[0] != '\0') {
        char *text = NULL;
        nereid_error_t *sys = nereid_shm_status(c->fe->shm, req->name, &text);
        free(text);
        if (sys != NULL)
            err = nereid_error_new(NEREID_ERROR_NOT_FOUND,
                                   "Unable to find cuda shared memory region: '%s'", req->name);
        else
            err = nereid_error_new(NEREID_ERROR_NOT_FOUND,
                                   "The region named '%s' is registered as system shared memory, "
                                   "not CUDA shared memory",
                                   req->name);
        nereid_error_free(sys);
    }
    inference__cuda_shared_memory_status_request__free_unpacked(req, NULL);
    if (err != NULL) {
        gfe_unary_finish_error(c, err);
        return;
    }
    /* Every CUDA reply here is an empty message (the status map is empty). */
    gfe_unary_finish(c, NULL);
}

/* ---- Log and trace settings --------------------------------------------- */

void gfe_log_settings(gfe_unary_call_t *c, const uint8_t *data, size_t len)
{
    Inference__LogSettingsRequest *req = inference__log_settings_request__unpack(NULL, len, data);
    if (req == NULL) {
        finish_malformed(c, "LogSettingsRequest");
        return;
    }
    bool flags[3];
    const bool *set_flags[3] = {NULL, NULL, NULL};
    static const char *const flag_keys[3] = {"log_info", "log_warning", "log_error"};
    uint32_t verbose = 0;
    const uint32_t *set_verbose = NULL;
    const char *format = NULL;
    nereid_error_t *err = NULL;
    for (size_t i = 0; err == NULL && i < req->n_settings; i++) {
        const char *key = req->settings[i]->key;
        const Inference__LogSettingsRequest__SettingValue *v = req->settings[i]->value;
        int choice = v != NULL ? (int)v->parameter_choice_case : 0;
        if (choice == INFERENCE__LOG_SETTINGS_REQUEST__SETTING_VALUE__PARAMETER_CHOICE__NOT_SET)
            continue; /* no value: no change */
        int f = -1;
        for (int k = 0; k < 3; k++)
            if (strcmp(key, flag_keys[k]) == 0) f = k;
        if (f >= 0) {
            if (choice !=
                INFERENCE__LOG_SETTINGS_REQUEST__SETTING_VALUE__PARAMETER_CHOICE_BOOL_PARAM)
                err = nereid_error_new(NEREID_ERROR_INVALID_ARG, "expect bool_param for '%s'", key);
            else {
                flags[f] = v->bool_param != 0;
                set_flags[f] = &flags[f];
            }
        } else if (strcmp(key, "log_verbose_level") == 0) {
            if (choice !=
                INFERENCE__LOG_SETTINGS_REQUEST__SETTING_VALUE__PARAMETER_CHOICE_UINT32_PARAM)
                err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                       "expect uint32_param for 'log_verbose_level'");
            else {
                verbose = v->uint32_param;
                set_verbose = &verbose;
            }
        } else if (strcmp(key, "log_format") == 0 || strcmp(key, "log_file") == 0) {
            if (choice !=
                INFERENCE__LOG_SETTINGS_REQUEST__SETTING_VALUE__PARAMETER_CHOICE_STRING_PARAM)
                err =
                    nereid_error_new(NEREID_ERROR_INVALID_ARG, "expect string_param for '%s'", key);
            else if (strcmp(key, "log_file") == 0)
                err = nereid_error_new(NEREID_ERROR_UNSUPPORTED,
                                       "log file location can not be updated through network "
                                       "protocol");
            else
                format = v->string_param;
        }
    }
    if (err == NULL)
        err = nereid_server_update_log_settings(c->fe->server, set_flags[0], set_flags[1],
                                                set_flags[2], set_verbose, format);
    inference__log_settings_request__free_unpacked(req, NULL);
    if (err != NULL) {
        gfe_unary_finish_error(c, err);
        return;
    }
    nereid_log_settings_t ls;
    nereid_server_log_settings(c->fe->server, &ls);
    enum { N = 6 };
    Inference__LogSettingsResponse__SettingValue vals[N];
    Inference__LogSettingsResponse__SettingsEntry entries[N];
    Inference__LogSettingsResponse__SettingsEntry *ptrs[N];
    static const char *const keys[N] = {"log_file",  "log_info",          "log_warning",
                                        "log_error", "log_verbose_level", "log_format"};
    for (int i = 0; i < N; i++) {
        vals[i] = (Inference__LogSettingsResponse__SettingValue)
            INFERENCE__LOG_SETTINGS_RESPONSE__SETTING_VALUE__INIT;
        entries[i] = (Inference__LogSettingsResponse__SettingsEntry)
            INFERENCE__LOG_SETTINGS_RESPONSE__SETTINGS_ENTRY__INIT;
        entries[i].key = (char *)keys[i];
        entries[i].value = &vals[i];
        ptrs[i] = &entries[i];
    }
    vals[0].parameter_choice_case =
        INFERENCE__LOG_SETTINGS_RESPONSE__SETTING_VALUE__PARAMETER_CHOICE_STRING_PARAM;
    vals[0].string_param = (char *)ls.log_file;
    bool b[3] = {ls.log_info, ls.log_warning, ls.log_error};
    for (int i = 0; i < 3; i++) {
        vals[1 + i].parameter_choice_case =
            INFERENCE__LOG_SETTINGS_RESPONSE__SETTING_VALUE__PARAMETER_CHOICE_BOOL_PARAM;
        vals[1 + i].bool_param = b[i];
    }
    vals[4].parameter_choice_case =
        INFERENCE__LOG_SETTINGS_RESPONSE__SETTING_VALUE__PARAMETER_CHOICE_UINT32_PARAM;
    vals[4].uint32_param = ls.log_verbose_level;
    vals[5].parameter_choice_case =
        INFERENCE__LOG_SETTINGS_RESPONSE__SETTING_VALUE__PARAMETER_CHOICE_STRING_PARAM;
    vals[5].string_param = (char *)nereid_log_format_name(ls.log_format);
    Inference__LogSettingsResponse r = INFERENCE__LOG_SETTINGS_RESPONSE__INIT;
    r.n_settings = N;
    r.settings = ptrs;
    gfe_unary_finish_msg(c, &r.base);
}

void gfe_trace_setting(gfe_unary_call_t *c, const uint8_t *data, size_t len)
{
    Inference__TraceSettingRequest *req = inference__trace_setting_request__unpack(NULL, len, data);
    if (req == NULL) {
        finish_malformed(c, "TraceSettingRequest");
        return;
    }
    char *text = NULL;
    nereid_error_t *err;
    if (req->n_settings == 0) {
        err = nereid_server_trace_settings(c->fe->server, req->model_name, &text);
    } else {
        nereid_trace_setting_t *settings = calloc(req->n_settings, sizeof(*settings));
        if (settings == NULL) {
            err = nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
        } else {
            /* No value clears the setting (Triton: an empty SettingValue). */
            for (size_t i = 0; i < req->n_settings; i++) {
                const Inference__TraceSettingRequest__SettingValue *v = req->settings[i]->value;
                settings[i].key = req->settings[i]->key;
                bool has = v != NULL && v->n_value > 0;
                settings[i].values = has ? (const char *const *)v->value : NULL;
                settings[i].n_values = has ? v->n_value : 0;
            }
            err = nereid_server_update_trace_settings(c->fe->server, req->model_name, settings,
                                                      req->n_settings, true, &text);
            free(settings);
        }
    }
    inference__trace_setting_request__free_unpacked(req, NULL);
    json_t *doc = reply_json(c, err, text);
    if (doc == NULL) return;
    if (!json_is_object(doc)) {
        json_decref(doc);
        finish_bad_json(c);
        return;
    }
    arena_t a = {0};
    size_t n = json_object_size(doc);
    Inference__TraceSettingResponse r = INFERENCE__TRACE_SETTING_RESPONSE__INIT;
    r.settings = arena_calloc(&a, n, sizeof(*r.settings));
    Inference__TraceSettingResponse__SettingsEntry *entries = arena_calloc(&a, n, sizeof(*entries));
    Inference__TraceSettingResponse__SettingValue *vals = arena_calloc(&a, n, sizeof(*vals));
    const char *key;
    json_t *v;
    if (r.settings != NULL && entries != NULL && vals != NULL) {
        json_object_foreach(doc, key, v)
        {
            size_t i = r.n_settings;
            vals[i] = (Inference__TraceSettingResponse__SettingValue)
                INFERENCE__TRACE_SETTING_RESPONSE__SETTING_VALUE__INIT;
            entries[i] = (Inference__TraceSettingResponse__SettingsEntry)
                INFERENCE__TRACE_SETTING_RESPONSE__SETTINGS_ENTRY__INIT;
            size_t nv = json_is_array(v) ? json_array_size(v) : 1;
            vals[i].value = arena_calloc(&a, nv, sizeof(char *));
            if (vals[i].value == NULL) break;
            for (size_t k = 0; k < nv; k++) {
                const char *s = json_string_value(json_is_array(v) ? json_array_get(v, k) : v);
                vals[i].value[vals[i].n_value++] = (char *)(s != NULL ? s : "");
            }
            entries[i].key = (char *)key;
            entries[i].value = &vals[i];
            r.settings[r.n_settings++] = &entries[i];
        }
    }
    if (a.failed)
        gfe_unary_finish_status(c, GRPC_STATUS_INTERNAL, "out of memory", NULL);
    else
        gfe_unary_finish_msg(c, &r.base);
    arena_free(&a);
    json_decref(doc);
}
