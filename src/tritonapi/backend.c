/*
 * This file contains the Triton backend side of libtritonserver.so: a
 * Triton backend library (libtriton_<name>.so) driven through Nereid's
 * backend ABI. The loader hands each such library to tritonapi_open; the
 * Nereid entry points below call Triton's TRITONBACKEND_* entry points with
 * Triton's order and threads, and the TRITONBACKEND_* functions a backend
 * calls are answered from Nereid's batch, model and instance.
 *
 * Here: loading the library, Triton's lifecycle (backend, model and
 * instance init/fini, execute) and TRITONBACKEND_Backend, _Model and
 * _ModelInstance. Requests and inputs are backend_request.c, responses
 * backend_response.c, implicit state backend_state.c; backend_objects.h
 * holds the objects they share.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tritonapi/adapter.h"
#include "tritonapi/backend_objects.h"
#include "tritonapi/tritonapi.h"

/* ---- Loading a Triton backend library ---- */

static TRITONBACKEND_Backend *backend_of(const nereid_backend_t *nb)
{
    return nereid_backend_state(nb);
}

static nereid_error_t *from_triton(TRITONSERVER_Error *err)
{
    return (nereid_error_t *)err; /* the same object: codes and layout are Nereid's */
}

static nereid_error_t *tritonapi_open(nereid_backend_t *nb, const char *path)
{
    TRITONBACKEND_Backend *b = calloc(1, sizeof *b);
    if (!b) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    b->nb = nb;
    b->path = strdup(path);
    b->dir = strdup(path);
    char *slash = strrchr(b->dir, '/');
    if (slash) *slash = '\0';
    const char *config = nereid_backend_config_json(nb);
    tritonapi_message_set(&b->config, config ? config : "{}");
    b->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    nereid_error_t *err = NULL;
    if (!b->handle) {
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG, "unable to load backend '%s': %s",
                               nereid_backend_name(nb), dlerror());
        goto fail;
    }
#define SYM(field, type, name) b->field = (type)dlsym(b->handle, name)
    SYM(initialize, tb_backend_fn, "TRITONBACKEND_Initialize");
    SYM(finalize, tb_backend_fn, "TRITONBACKEND_Finalize");
    SYM(model_initialize, tb_model_fn, "TRITONBACKEND_ModelInitialize");
    SYM(model_finalize, tb_model_fn, "TRITONBACKEND_ModelFinalize");
    SYM(instance_initialize, tb_instance_fn, "TRITONBACKEND_ModelInstanceInitialize");
    SYM(instance_finalize, tb_instance_fn, "TRITONBACKEND_ModelInstanceFinalize");
    SYM(execute, tb_execute_fn, "TRITONBACKEND_ModelInstanceExecute");
#undef SYM
    if (!b->execute) {
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "backend '%s' (%s) does not export "
                               "TRITONBACKEND_ModelInstanceExecute",
                               nereid_backend_name(nb), path);
        goto fail;
    }
    nereid_backend_set_state(nb, b);
    if (b->initialize) {
        err = from_triton(b->initialize(b));
        if (err) {
            nereid_error_t *wrapped =
                nereid_error_new(nereid_error_code(err), "backend '%s' failed to initialize: %s",
                                 nereid_backend_name(nb), nereid_error_message(err));
            nereid_error_free(err);
            err = wrapped;
            goto fail;
        }
    }
    tb_attr_fn attr = (tb_attr_fn)dlsym(b->handle, "TRITONBACKEND_GetBackendAttribute");
    if (attr) {
        /* Instance groups come from the config here; the attributes only
         * tune loading, so a failure is ignored as in Triton. */
        TRITONSERVER_Error *e = attr(b, (TRITONBACKEND_BackendAttribute *)b);
        TRITONSERVER_ErrorDelete(e);
    }
    return NULL;
fail:
    nereid_backend_set_state(nb, NULL);
    if (b->handle) dlclose(b->handle);
    free(b->config.json);
    free(b->path);
    free(b->dir);
    free(b);
    return err;
}

static nereid_error_t *tritonapi_fini(nereid_backend_t *nb)
{
    TRITONBACKEND_Backend *b = backend_of(nb);
    if (!b) return NULL;
    nereid_error_t *err = b->finalize ? from_triton(b->finalize(b)) : NULL;
    if (!getenv("NEREID_NO_DLCLOSE")) dlclose(b->handle);
    free(b->config.json);
    free(b->path);
    free(b->dir);
    free(b);
    nereid_backend_set_state(nb, NULL);
    return err;
}

/* The model's sequence_batching states, from its (normalized) config JSON. */
static void read_state_configs(TRITONBACKEND_Model *m)
{
    json_t *root = json_loads(nereid_model_config_json(m->nm), 0, NULL);
    json_t *list = json_object_get(json_object_get(root, "sequence_batching"), "state");
    size_t n = json_array_size(list);
    m->states = n ? calloc(n, sizeof *m->states) : NULL;
    for (size_t i = 0; m->states && i < n; i++) {
        json_t *st = json_array_get(list, i);
        const char *in = json_string_value(json_object_get(st, "input_name"));
        const char *out = json_string_value(json_object_get(st, "output_name"));
        tb_state_cfg_t *c = &m->states[m->n_states];
        c->input_name = strdup(in ? in : "");
        c->output_name = strdup(out ? out : "");
        c->single_buffer = json_is_true(json_object_get(st, "use_same_buffer_for_input_output"));
        m->n_states++;
        if (!c->input_name || !c->output_name) {
            free(c->input_name);
            free(c->output_name);
            m->n_states--;
        }
    }
    json_decref(root);
}

static void free_state_configs(TRITONBACKEND_Model *m)
{
    for (size_t i = 0; i < m->n_states; i++) {
        free(m->states[i].input_name);
        free(m->states[i].output_name);
    }
    free(m->states);
    m->states = NULL;
    m->n_states = 0;
}

static nereid_error_t *tritonapi_model_init(nereid_model_t *nm)
{
    TRITONBACKEND_Model *m = calloc(1, sizeof *m);
    if (!m) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    m->nm = nm;
    m->backend = backend_of(nereid_model_backend(nm));
    m->decoupled = nereid_model_decoupled(nm);
    m->max_batch_size = nereid_model_max_batch_size(nm);
    nereid_model_set_backend_response_stats(nm);
    nereid_model_set_state(nm, m);
    if (m->backend->model_initialize) {
        nereid_error_t *err = from_triton(m->backend->model_initialize(m));
        if (err) {
            nereid_model_set_state(nm, NULL);
            free(m);
            return err;
        }
        /* ModelSetConfig may have changed these. */
        m->decoupled = nereid_model_decoupled(nm);
        m->max_batch_size = nereid_model_max_batch_size(nm);
    }
    read_state_configs(m);
    return NULL;
}

static nereid_error_t *tritonapi_model_fini(nereid_model_t *nm)
{
    TRITONBACKEND_Model *m = nereid_model_state(nm);
    if (!m) return NULL;
    nereid_error_t *err =
        m->backend->model_finalize ? from_triton(m->backend->model_finalize(m)) : NULL;
    nereid_model_set_state(nm, NULL);
    free_state_configs(m);
    free(m);
    return err;
}

static nereid_error_t *tritonapi_instance_init(nereid_instance_t *ni)
{
    TRITONBACKEND_ModelInstance *in = calloc(1, sizeof *in);
    if (!in) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    in->ni = ni;
    in->model = nereid_model_state(nereid_instance_model(ni));
    tritonapi_message_set(&in->host_policy, nereid_instance_kind(ni) == NEREID_INSTANCE_KIND_MODEL
                                                ? "{\"model\":{}}"
                                                : "{\"cpu\":{}}");
    nereid_instance_set_state(ni, in);
    TRITONBACKEND_Backend *b = in->model->backend;
    if (b->instance_initialize) {
        nereid_error_t *err = from_triton(b->instance_initialize(in));
        if (err) {
            nereid_instance_set_state(ni, NULL);
            free(in->host_policy.json);
            free(in);
            return err;
        }
    }
    return NULL;
}

static void free_request(TRITONBACKEND_Request *req)
{
    free(req->inputs);
    free(req->outputs);
    free(req);
}

static nereid_error_t *tritonapi_instance_fini(nereid_instance_t *ni)
{
    TRITONBACKEND_ModelInstance *in = nereid_instance_state(ni);
    if (!in) return NULL;
    TRITONBACKEND_Backend *b = in->model->backend;
    nereid_error_t *err = b->instance_finalize ? from_triton(b->instance_finalize(in)) : NULL;
    for (TRITONBACKEND_Request **list[2] = {&in->pool, &in->kept}, ***l = list; l < list + 2; l++)
        while (**l) {
            TRITONBACKEND_Request *next = (**l)->next;
            free_request(**l);
            **l = next;
        }
    free(in->ptrs);
    free(in->host_policy.json);
    nereid_instance_set_state(ni, NULL);
    free(in);
    return err;
}

/* ---- Execute ---- */

static TRITONBACKEND_Request *request_get(TRITONBACKEND_ModelInstance *in)
{
    TRITONBACKEND_Request *req = in->pool;
    if (req) {
        in->pool = req->next;
        return req;
    }
    return calloc(1, sizeof *req);
}

static void free_states(TRITONBACKEND_Request *req)
{
    while (req->states) {
        struct TRITONBACKEND_State *next = req->states->next;
        free(req->states->own);
        free(req->states);
        req->states = next;
    }
}

/* Ends request r after execute returned successfully: the reason it failed
 * if the backend broke the contract, and the channel stops writing into the
 * batch. Returns true when the request object can be reused. */
static bool request_finish(TRITONBACKEND_ModelInstance *in, TRITONBACKEND_Request *req)
{
    const char *b = backend_name(in->model->backend), *m = model_name(in->model);
    tb_channel_t *c = req->chan;
    bool final = false;
    if (c) {
        pthread_mutex_lock(&c->mu);
        /* Triton completes a request at its final flag, not when Execute
         * returns: a model that is not decoupled may answer from a thread of
         * its own through a response factory (Triton's repeat backend). The
         * instance waits for that while a factory lives. */
        while (!c->model->decoupled && !c->sender && !c->final_sent && c->n_factories > 0 &&
               req->status == REQ_RELEASED)
            pthread_cond_wait(&c->done, &c->mu);
        final = c->final_sent || c->sender;
        c->batch = NULL;
        pthread_mutex_unlock(&c->mu);
    }
    if (req->status != REQ_RELEASED)
        nereid_batch_set_request_error(
            req->batch, req->r,
            nereid_error_new(NEREID_ERROR_INTERNAL,
                             "backend '%s' did not release a request to model '%s' "
                             "(TRITONBACKEND_RequestRelease) before "
                             "TRITONBACKEND_ModelInstanceExecute returned",
                             b, m));
    else if (!final && !req->rescheduled)
        nereid_batch_set_request_error(
            req->batch, req->r,
            nereid_error_new(NEREID_ERROR_INTERNAL,
                             "backend '%s' did not send a final response "
                             "(TRITONSERVER_RESPONSE_COMPLETE_FINAL) for a request to model '%s' "
                             "before TRITONBACKEND_ModelInstanceExecute returned",
                             b, m));
    req->chan = NULL;
    req->rescheduled = false;
    channel_unref(c);
    free_states(req);
    req->batch = NULL;
    req->inputs_ready = req->outputs_ready = false;
    return req->status == REQ_RELEASED;
}

static nereid_error_t *tritonapi_execute(nereid_instance_t *ni, nereid_batch_t *batch)
{
    TRITONBACKEND_ModelInstance *in = nereid_instance_state(ni);
    size_t n = nereid_batch_request_count(batch);
    if (n > in->n_ptrs) {
        TRITONBACKEND_Request **p = realloc(in->ptrs, n * sizeof *p);
        if (!p) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
        in->ptrs = p;
        in->n_ptrs = n;
    }
    for (size_t r = 0; r < n; r++) {
        TRITONBACKEND_Request *req = request_get(in);
        if (!req) {
            while (r-- > 0) {
                in->ptrs[r]->next = in->pool;
                in->pool = in->ptrs[r];
            }
            return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
        }
        req->inst = in;
        req->batch = batch;
        req->r = r;
        req->status = REQ_LIVE;
        req->chan = NULL;
        req->rescheduled = false;
        in->ptrs[r] = req;
    }
    in->batch = batch;
    TRITONSERVER_Error *terr_ = in->model->backend->execute(in, in->ptrs, (uint32_t)n);
    in->batch = NULL;
    for (size_t r = 0; r < n; r++) {
        TRITONBACKEND_Request *req = in->ptrs[r];
        if (terr_) {
            /* The server keeps the requests: each fails with the error. */
            if (req->chan) {
                pthread_mutex_lock(&req->chan->mu);
                req->chan->batch = NULL;
                pthread_mutex_unlock(&req->chan->mu);
                channel_unref(req->chan);
                req->chan = NULL;
            }
            nereid_batch_set_request_error(batch, r, tritonapi_error_copy(terr_));
            free_states(req);
            req->status = REQ_RELEASED;
            req->batch = NULL;
            req->inputs_ready = req->outputs_ready = false;
        }
        bool reuse = terr_ ? true : request_finish(in, req);
        req->status = reuse ? REQ_FREE : REQ_LIVE;
        if (reuse) {
            req->next = in->pool;
            in->pool = req;
        } else {
            req->status = REQ_RELEASED; /* late calls find it released */
            req->next = in->kept;
            in->kept = req;
        }
    }
    TRITONSERVER_ErrorDelete(terr_);
    return NULL;
}

static const tritonapi_entry_t entry = {
    .open = tritonapi_open,
    .fini = tritonapi_fini,
    .model_init = tritonapi_model_init,
    .model_fini = tritonapi_model_fini,
    .instance_init = tritonapi_instance_init,
    .instance_fini = tritonapi_instance_fini,
    .execute = tritonapi_execute,
};

__attribute__((visibility("default"))) const tritonapi_entry_t *nereid_tritonapi_entry(void)
{
    return &entry;
}

/* ---- TRITONBACKEND_Backend ---- */

TRITONSERVER_Error *TRITONBACKEND_ApiVersion(uint32_t *major, uint32_t *minor)
{
    if (!major || !minor) return null_arg("major and minor");
    *major = TRITONBACKEND_API_VERSION_MAJOR;
    *minor = TRITONBACKEND_API_VERSION_MINOR;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_BackendName(TRITONBACKEND_Backend *backend, const char **name)
{
    if (!backend || !name) return null_arg("backend and name");
    *name = backend_name(backend);
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_BackendConfig(TRITONBACKEND_Backend *backend,
                                                TRITONSERVER_Message **backend_config)
{
    if (!backend || !backend_config) return null_arg("backend and backend_config");
    *backend_config = &backend->config;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_BackendExecutionPolicy(TRITONBACKEND_Backend *backend,
                                                         TRITONBACKEND_ExecutionPolicy *policy)
{
    if (!backend || !policy) return null_arg("backend and policy");
    *policy = backend->policy;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_BackendSetExecutionPolicy(TRITONBACKEND_Backend *backend,
                                                            TRITONBACKEND_ExecutionPolicy policy)
{
    if (!backend) return null_arg("backend");
    backend->policy = policy; /* every instance has its own thread in Nereid */
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_BackendArtifacts(TRITONBACKEND_Backend *backend,
                                                   TRITONBACKEND_ArtifactType *artifact_type,
                                                   const char **location)
{
    if (!backend || !artifact_type || !location) return null_arg("backend and out-parameters");
    *artifact_type = TRITONBACKEND_ARTIFACT_FILESYSTEM;
    *location = backend->dir;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_BackendState(TRITONBACKEND_Backend *backend, void **state)
{
    if (!backend || !state) return null_arg("backend and state");
    *state = backend->state;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_BackendSetState(TRITONBACKEND_Backend *backend, void *state)
{
    if (!backend) return null_arg("backend");
    backend->state = state;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_BackendAttributeAddPreferredInstanceGroup(
    TRITONBACKEND_BackendAttribute *attrs, const TRITONSERVER_InstanceGroupKind kind,
    const uint64_t count, const uint64_t *device_ids, const uint64_t id_count)
{
    (void)attrs, (void)kind, (void)count, (void)device_ids, (void)id_count;
    return NULL; /* Nereid's default instance group (one CPU instance) is kept */
}

TRITONSERVER_Error *
TRITONBACKEND_BackendAttributeSetParallelModelInstanceLoading(TRITONBACKEND_BackendAttribute *attrs,
                                                              bool enabled)
{
    (void)attrs, (void)enabled;
    return NULL; /* instances initialize on their own threads already */
}

/* ---- TRITONBACKEND_Model ---- */

TRITONSERVER_Error *TRITONBACKEND_ModelName(TRITONBACKEND_Model *model, const char **name)
{
    if (!model || !name) return null_arg("model and name");
    *name = model_name(model);
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ModelVersion(TRITONBACKEND_Model *model, uint64_t *version)
{
    if (!model || !version) return null_arg("model and version");
    *version = (uint64_t)nereid_model_version(model->nm);
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ModelRepository(TRITONBACKEND_Model *model,
                                                  TRITONBACKEND_ArtifactType *artifact_type,
                                                  const char **location)
{
    if (!model || !artifact_type || !location) return null_arg("model and out-parameters");
    *artifact_type = TRITONBACKEND_ARTIFACT_FILESYSTEM;
    *location = nereid_model_directory(model->nm);
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ModelConfig(TRITONBACKEND_Model *model,
                                              const uint32_t config_version,
                                              TRITONSERVER_Message **model_config)
{
    if (!model || !model_config) return null_arg("model and model_config");
    *model_config = NULL;
    if (config_version != 1)
        return terr(TRITONSERVER_ERROR_INVALID_ARG,
                    "model config version %u is not supported, supported versions are: 1",
                    config_version);
    const char *json = nereid_model_config_json(model->nm);
    return TRITONSERVER_MessageNewFromSerializedJson(model_config, json, strlen(json));
}

TRITONSERVER_Error *TRITONBACKEND_ModelAutoCompleteConfig(TRITONBACKEND_Model *model,
                                                          bool *auto_complete_config)
{
    if (!model || !auto_complete_config) return null_arg("model and auto_complete_config");
    *auto_complete_config = nereid_model_autocomplete_allowed(model->nm);
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ModelSetConfig(TRITONBACKEND_Model *model,
                                                 const uint32_t config_version,
                                                 TRITONSERVER_Message *model_config)
{
    if (!model || !model_config) return null_arg("model and model_config");
    if (config_version != 1)
        return terr(TRITONSERVER_ERROR_INVALID_ARG,
                    "model config version %u is not supported, supported versions are: 1",
                    config_version);
    return (TRITONSERVER_Error *)nereid_model_set_config(model->nm, model_config->json);
}

TRITONSERVER_Error *TRITONBACKEND_ModelServer(TRITONBACKEND_Model *model,
                                              TRITONSERVER_Server **server)
{
    if (!model || !server) return null_arg("model and server");
    *server = (TRITONSERVER_Server *)nereid_model_server(model->nm);
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ModelBackend(TRITONBACKEND_Model *model,
                                               TRITONBACKEND_Backend **backend)
{
    if (!model || !backend) return null_arg("model and backend");
    *backend = model->backend;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ModelState(TRITONBACKEND_Model *model, void **state)
{
    if (!model || !state) return null_arg("model and state");
    *state = model->state;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ModelSetState(TRITONBACKEND_Model *model, void *state)
{
    if (!model) return null_arg("model");
    model->state = state;
    return NULL;
}

/* ---- TRITONBACKEND_ModelInstance ---- */

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceName(TRITONBACKEND_ModelInstance *instance,
                                                    const char **name)
{
    if (!instance || !name) return null_arg("instance and name");
    *name = nereid_instance_name(instance->ni);
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceKind(TRITONBACKEND_ModelInstance *instance,
                                                    TRITONSERVER_InstanceGroupKind *kind)
{
    if (!instance || !kind) return null_arg("instance and kind");
    switch (nereid_instance_kind(instance->ni)) { /* the numbers differ: map */
    case NEREID_INSTANCE_KIND_GPU:
        *kind = TRITONSERVER_INSTANCEGROUPKIND_GPU;
        break;
    case NEREID_INSTANCE_KIND_MODEL:
        *kind = TRITONSERVER_INSTANCEGROUPKIND_MODEL;
        break;
    default:
        *kind = TRITONSERVER_INSTANCEGROUPKIND_CPU;
        break;
    }
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceDeviceId(TRITONBACKEND_ModelInstance *instance,
                                                        int32_t *device_id)
{
    if (!instance || !device_id) return null_arg("instance and device_id");
    *device_id = nereid_instance_kind(instance->ni) == NEREID_INSTANCE_KIND_GPU
                     ? nereid_instance_device_id(instance->ni)
                     : 0;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceHostPolicy(TRITONBACKEND_ModelInstance *instance,
                                                          TRITONSERVER_Message **host_policy)
{
    if (!instance || !host_policy) return null_arg("instance and host_policy");
    *host_policy = &instance->host_policy;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceIsPassive(TRITONBACKEND_ModelInstance *instance,
                                                         bool *is_passive)
{
    if (!instance || !is_passive) return null_arg("instance and is_passive");
    *is_passive = nereid_instance_is_passive(instance->ni);
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceModel(TRITONBACKEND_ModelInstance *instance,
                                                     TRITONBACKEND_Model **model)
{
    if (!instance || !model) return null_arg("instance and model");
    *model = instance->model;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceState(TRITONBACKEND_ModelInstance *instance,
                                                     void **state)
{
    if (!instance || !state) return null_arg("instance and state");
    *state = instance->state;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceSetState(TRITONBACKEND_ModelInstance *instance,
                                                        void *state)
{
    if (!instance) return null_arg("instance");
    instance->state = state;
    return NULL;
}

/* Nereid's core counts each request (success/fail, queue, compute) and
 * each execution itself, so the per-request report adds nothing (counting
 * it again would double the statistics); the batch report's timestamps
 * split the execution into compute_input / compute_infer / compute_output. */
TRITONSERVER_Error *TRITONBACKEND_ModelInstanceReportStatistics(
    TRITONBACKEND_ModelInstance *instance, TRITONBACKEND_Request *request, const bool success,
    const uint64_t exec_start_ns, const uint64_t compute_start_ns, const uint64_t compute_end_ns,
    const uint64_t exec_end_ns)
{
    (void)success, (void)exec_start_ns, (void)compute_start_ns, (void)compute_end_ns,
        (void)exec_end_ns;
    if (!instance || !request) return null_arg("instance and request");
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceReportBatchStatistics(
    TRITONBACKEND_ModelInstance *instance, const uint64_t batch_size, const uint64_t exec_start_ns,
    const uint64_t compute_start_ns, const uint64_t compute_end_ns, const uint64_t exec_end_ns)
{
    (void)batch_size, (void)exec_start_ns, (void)exec_end_ns;
    if (!instance) return null_arg("instance");
    if (instance->batch && compute_start_ns && compute_end_ns >= compute_start_ns)
        nereid_batch_report_compute(instance->batch, compute_start_ns, compute_end_ns);
    return NULL;
}

/* Response statistics come from the backend's reports only, as in Triton
 * (tritonapi_model_init sets nereid_model_set_backend_response_stats): each
 * report counts under its response factory's next index. */
struct TRITONBACKEND_ModelInstanceResponseStatistics {
    TRITONBACKEND_ModelInstance *instance;
    TRITONBACKEND_ResponseFactory *factory;
    uint64_t start_ns, output_start_ns, end_ns;
    TRITONSERVER_Error *error; /* the backend's; not owned */
};

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceResponseStatisticsNew(
    TRITONBACKEND_ModelInstanceResponseStatistics **response_statistics)
{
    if (!response_statistics) return null_arg("response_statistics");
    *response_statistics = calloc(1, sizeof **response_statistics);
    return *response_statistics ? NULL : terr(TRITONSERVER_ERROR_INTERNAL, "out of memory");
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceResponseStatisticsDelete(
    TRITONBACKEND_ModelInstanceResponseStatistics *response_statistics)
{
    free(response_statistics);
    return NULL;
}

#define STATS_SETTER(fn, type, field)                                                              \
    TRITONSERVER_Error *fn(TRITONBACKEND_ModelInstanceResponseStatistics *s, type v)               \
    {                                                                                              \
        if (!s) return null_arg("response_statistics");                                            \
        s->field = v;                                                                              \
        return NULL;                                                                               \
    }
STATS_SETTER(TRITONBACKEND_ModelInstanceResponseStatisticsSetModelInstance,
             TRITONBACKEND_ModelInstance *, instance)
STATS_SETTER(TRITONBACKEND_ModelInstanceResponseStatisticsSetResponseFactory,
             TRITONBACKEND_ResponseFactory *, factory)
STATS_SETTER(TRITONBACKEND_ModelInstanceResponseStatisticsSetResponseStart, uint64_t, start_ns)
STATS_SETTER(TRITONBACKEND_ModelInstanceResponseStatisticsSetComputeOutputStart, uint64_t,
             output_start_ns)
STATS_SETTER(TRITONBACKEND_ModelInstanceResponseStatisticsSetResponseEnd, uint64_t, end_ns)
STATS_SETTER(TRITONBACKEND_ModelInstanceResponseStatisticsSetError, TRITONSERVER_Error *, error)
#undef STATS_SETTER

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceReportResponseStatistics(
    TRITONBACKEND_ModelInstanceResponseStatistics *response_statistics)
{
    TRITONBACKEND_ModelInstanceResponseStatistics *rs = response_statistics;
    if (!rs) return null_arg("response_statistics");
    if (!rs->instance || !rs->factory || !rs->factory->chan)
        return null_arg("response statistics' model instance and response factory");
    tb_channel_t *c = rs->factory->chan;
    pthread_mutex_lock(&c->mu);
    uint64_t index = c->stats_index++;
    pthread_mutex_unlock(&c->mu);
    nereid_error_t *err = rs->error ? tritonapi_error_copy(rs->error) : NULL;
    nereid_error_t *rerr = nereid_model_report_response(
        rs->instance->model->nm, index, rs->start_ns, rs->output_start_ns, rs->end_ns, err);
    nereid_error_free(err);
    if (!rerr) return NULL;
    TRITONSERVER_Error *terror =
        terr(TRITONSERVER_ERROR_INVALID_ARG, "%s", nereid_error_message(rerr));
    nereid_error_free(rerr);
    return terror;
}
