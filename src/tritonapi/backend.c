/*
 * This file contains the Triton backend side of libtritonserver.so: a
 * Triton backend library (libtriton_<name>.so) driven through Nereid's
 * backend ABI. The loader hands each such library to tritonapi_open; the
 * Nereid entry points below call Triton's TRITONBACKEND_* entry points with
 * Triton's order and threads, and the TRITONBACKEND_* functions a backend
 * calls are answered from Nereid's batch, model and instance.
 *
 * Requests: one TRITONBACKEND_Request per request of the Nereid batch. The
 * backend must release each one (TRITONBACKEND_RequestRelease) and, unless
 * the model streams decoupled responses through a sender, send its final
 * response before TRITONBACKEND_ModelInstanceExecute returns; otherwise the
 * request fails with the reason (a request never released stays allocated
 * until the instance is finalized, so late calls on it are harmless).
 *
 * Responses go through a channel shared by the request, its response
 * factories and its unsent responses (reference counted): during execute it
 * writes into the batch; for a decoupled model streamed by its client it
 * owns Nereid's response sender, usable from any thread after execute
 * returned. When the last reference goes without the final flag, the
 * request ends with an error saying so.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tritonapi/adapter.h"
#include "tritonapi/tritonapi.h"

/* ---- Channels ---- */

typedef struct tb_channel {
    atomic_int refs;
    pthread_mutex_t mu;
    TRITONBACKEND_Model *model;
    nereid_batch_t *batch; /* while executing, else NULL */
    size_t r;
    nereid_response_sender_t *sender; /* streamed decoupled request, until FINAL */
    bool final_sent;
    bool rescheduled; /* the request runs again: a later execution sends the final */
    uint32_t n_sent;
    uint64_t stats_index; /* the next reported response's index (response_stats) */
    uint32_t n_factories; /* live response factories */
    pthread_cond_t done;  /* broadcast at the final flag and when no factory is left */
} tb_channel_t;

struct TRITONBACKEND_ResponseFactory {
    tb_channel_t *chan;
};

struct TRITONBACKEND_Output {
    struct TRITONBACKEND_Output *next;
    TRITONBACKEND_Response *resp;
    TRITONSERVER_BufferAttributes attrs;
    void *discard; /* the buffer of a response that will be dropped */
    nereid_datatype_t datatype;
    uint32_t rank;
    bool allocated;
    int64_t *shape;
    char name[]; /* shape follows the name */
};

typedef struct tb_param {
    struct tb_param *next;
    nereid_parameter_type_t type;
    union {
        int64_t i;
        bool b;
        double d;
    } v;
    char *s;
    char key[];
} tb_param_t;

struct TRITONBACKEND_Response {
    tb_channel_t *chan;
    struct TRITONBACKEND_Output *outputs;
    tb_param_t *params, **params_tail; /* in the order set */
};

typedef struct tb_input {
    const char *name;
    nereid_datatype_t datatype;
    const int64_t *shape;
    size_t rank;
    const void *data;
    size_t byte_size;
} tb_input_t;

struct TRITONBACKEND_Input {
    tb_input_t in;
};

struct TRITONBACKEND_State {
    struct TRITONBACKEND_State *next;
    TRITONBACKEND_Request *request;
    const tb_state_cfg_t *cfg;
    TRITONSERVER_BufferAttributes attrs;
    void *buffer;    /* own, or the request's input state (single buffer) */
    void *own;       /* malloc'ed here; committed by StateUpdate, freed with the state */
    void *committed; /* the request's output the last StateUpdate copied into */
    size_t committed_bytes;
    nereid_datatype_t datatype;
    uint32_t rank;
    bool allocated;
    int64_t *shape;
    char name[];
};

enum { REQ_FREE, REQ_LIVE, REQ_RELEASED };

struct TRITONBACKEND_Request {
    struct TRITONBACKEND_Request *next;
    TRITONBACKEND_ModelInstance *inst;
    nereid_batch_t *batch;
    size_t r;
    int status;
    tb_channel_t *chan;
    struct TRITONBACKEND_Input *inputs; /* sorted by name, built on first use */
    uint32_t n_inputs, cap_inputs;
    bool inputs_ready;
    struct TRITONBACKEND_State *states; /* freed when execute returns */
    const char **outputs;               /* requested outputs, sorted */
    uint32_t n_outputs, cap_outputs;
    bool outputs_ready;
    bool rescheduled; /* released with RELEASE_RESCHEDULE: back to its scheduler */
};

static TRITONSERVER_Error *terr(TRITONSERVER_Error_Code code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static TRITONSERVER_Error *terr(TRITONSERVER_Error_Code code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return TRITONSERVER_ErrorNew(code, msg);
}

static TRITONSERVER_Error *null_arg(const char *what)
{
    return terr(TRITONSERVER_ERROR_INVALID_ARG, "%s must not be NULL", what);
}

static const char *model_name(const TRITONBACKEND_Model *m)
{
    return nereid_model_name(m->nm);
}

static const char *backend_name(const TRITONBACKEND_Backend *b)
{
    return nereid_backend_name(b->nb);
}

static tb_channel_t *channel_new(TRITONBACKEND_Request *req)
{
    tb_channel_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    atomic_init(&c->refs, 1);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->done, NULL);
    c->model = req->inst->model;
    c->batch = req->batch;
    c->r = req->r;
    if (c->model->decoupled) {
        nereid_error_t *err = nereid_batch_request_sender(req->batch, req->r, &c->sender);
        nereid_error_free(err); /* a client taking one response: answer through the batch */
    }
    return c;
}

static void channel_unref(tb_channel_t *c)
{
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1) return;
    if (c->sender && !c->final_sent && !c->rescheduled) {
        nereid_error_t *err = nereid_error_new(
            NEREID_ERROR_INTERNAL,
            "backend '%s' did not send the final response (TRITONSERVER_RESPONSE_COMPLETE_FINAL) "
            "for a request to model '%s' before dropping its last response factory",
            backend_name(c->model->backend), model_name(c->model));
        nereid_error_free(nereid_sender_send(c->sender, NEREID_RESPONSE_FLAG_FINAL, err));
    }
    pthread_cond_destroy(&c->done);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static TRITONSERVER_Error *request_channel(TRITONBACKEND_Request *req, tb_channel_t **out)
{
    if (req->status != REQ_LIVE)
        return terr(TRITONSERVER_ERROR_INVALID_ARG, "request was already released");
    if (!req->chan && !(req->chan = channel_new(req)))
        return terr(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    *out = req->chan;
    return NULL;
}

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

/* ---- TRITONBACKEND_Request ---- */

static TRITONSERVER_Error *live(TRITONBACKEND_Request *req)
{
    if (!req) return null_arg("request");
    if (req->status != REQ_LIVE || !req->batch)
        return terr(TRITONSERVER_ERROR_INVALID_ARG, "request was already released");
    return NULL;
}

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

/* ---- Response factories and responses ---- */

TRITONSERVER_Error *TRITONBACKEND_ResponseFactoryNew(TRITONBACKEND_ResponseFactory **factory,
                                                     TRITONBACKEND_Request *request)
{
    if (!factory || !request) return null_arg("factory and request");
    *factory = NULL;
    tb_channel_t *c;
    TRITONSERVER_Error *err = request_channel(request, &c);
    if (err) return err;
    TRITONBACKEND_ResponseFactory *f = malloc(sizeof *f);
    if (!f) return terr(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    atomic_fetch_add(&c->refs, 1);
    pthread_mutex_lock(&c->mu);
    c->n_factories++;
    pthread_mutex_unlock(&c->mu);
    f->chan = c;
    *factory = f;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ResponseFactoryDelete(TRITONBACKEND_ResponseFactory *factory)
{
    if (!factory) return null_arg("factory");
    tb_channel_t *c = factory->chan;
    pthread_mutex_lock(&c->mu);
    if (--c->n_factories == 0) pthread_cond_broadcast(&c->done);
    pthread_mutex_unlock(&c->mu);
    channel_unref(c);
    free(factory);
    return NULL;
}

static TRITONSERVER_Error *response_new(TRITONBACKEND_Response **response, tb_channel_t *c)
{
    TRITONBACKEND_Response *r = calloc(1, sizeof *r);
    if (!r) return terr(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    atomic_fetch_add(&c->refs, 1);
    r->chan = c;
    *response = r;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ResponseNew(TRITONBACKEND_Response **response,
                                              TRITONBACKEND_Request *request)
{
    if (!response || !request) return null_arg("response and request");
    *response = NULL;
    tb_channel_t *c;
    TRITONSERVER_Error *err = request_channel(request, &c);
    return err ? err : response_new(response, c);
}

TRITONSERVER_Error *TRITONBACKEND_ResponseNewFromFactory(TRITONBACKEND_Response **response,
                                                         TRITONBACKEND_ResponseFactory *factory)
{
    if (!response || !factory) return null_arg("response and factory");
    *response = NULL;
    return response_new(response, factory->chan);
}

static void response_free(TRITONBACKEND_Response *r)
{
    while (r->params) {
        tb_param_t *next = r->params->next;
        free(r->params->s);
        free(r->params);
        r->params = next;
    }
    while (r->outputs) {
        struct TRITONBACKEND_Output *next = r->outputs->next;
        free(r->outputs->discard);
        free(r->outputs);
        r->outputs = next;
    }
    channel_unref(r->chan);
    free(r);
}

TRITONSERVER_Error *TRITONBACKEND_ResponseDelete(TRITONBACKEND_Response *response)
{
    if (!response) return null_arg("response");
    response_free(response);
    return NULL;
}

/* Response parameters: kept with the response, handed to Nereid's response
 * when it is sent (clients see them in "parameters"). */
static TRITONSERVER_Error *add_param(TRITONBACKEND_Response *response, const char *name,
                                     nereid_parameter_type_t type, const void *value)
{
    if (!response || !name || !value) return null_arg("response, name and value");
    size_t n = strlen(name) + 1;
    tb_param_t *p = calloc(1, sizeof *p + n);
    if (!p) return terr(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    memcpy(p->key, name, n);
    p->type = type;
    if (type == NEREID_PARAMETER_STRING && !(p->s = strdup(value))) {
        free(p);
        return terr(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    }
    if (type == NEREID_PARAMETER_INT) memcpy(&p->v.i, value, sizeof p->v.i);
    if (type == NEREID_PARAMETER_BOOL) memcpy(&p->v.b, value, sizeof p->v.b);
    if (type == NEREID_PARAMETER_DOUBLE) memcpy(&p->v.d, value, sizeof p->v.d);
    if (!response->params_tail) response->params_tail = &response->params;
    *response->params_tail = p;
    response->params_tail = &p->next;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ResponseSetStringParameter(TRITONBACKEND_Response *response,
                                                             const char *name, const char *value)
{
    return add_param(response, name, NEREID_PARAMETER_STRING, value);
}

TRITONSERVER_Error *TRITONBACKEND_ResponseSetIntParameter(TRITONBACKEND_Response *response,
                                                          const char *name, const int64_t value)
{
    return add_param(response, name, NEREID_PARAMETER_INT, &value);
}

TRITONSERVER_Error *TRITONBACKEND_ResponseSetBoolParameter(TRITONBACKEND_Response *response,
                                                           const char *name, const bool value)
{
    return add_param(response, name, NEREID_PARAMETER_BOOL, &value);
}

TRITONSERVER_Error *TRITONBACKEND_ResponseSetDoubleParameter(TRITONBACKEND_Response *response,
                                                             const char *name, const double value)
{
    return add_param(response, name, NEREID_PARAMETER_DOUBLE, &value);
}

/* Hands the response's parameters to the sender's next response or the
 * request's response (channel locked). */
static void send_params(tb_channel_t *c, const TRITONBACKEND_Response *resp)
{
    for (const tb_param_t *p = resp ? resp->params : NULL; p; p = p->next) {
        const void *value = p->type == NEREID_PARAMETER_STRING ? (const void *)p->s
                            : p->type == NEREID_PARAMETER_INT  ? (const void *)&p->v.i
                            : p->type == NEREID_PARAMETER_BOOL ? (const void *)&p->v.b
                                                               : (const void *)&p->v.d;
        nereid_error_t *err =
            c->sender ? nereid_sender_set_parameter(c->sender, p->key, p->type, value)
                      : nereid_batch_request_set_response_parameter(c->batch, c->r, p->key, p->type,
                                                                    value);
        nereid_error_free(err);
    }
}

TRITONSERVER_Error *TRITONBACKEND_ResponseOutput(TRITONBACKEND_Response *response,
                                                 TRITONBACKEND_Output **output, const char *name,
                                                 const TRITONSERVER_DataType datatype,
                                                 const int64_t *shape, const uint32_t dims_count)
{
    if (!response || !output || !name || (!shape && dims_count))
        return null_arg("response, output, name and shape");
    *output = NULL;
    nereid_model_t *nm = response->chan->model->nm;
    bool known = false;
    for (size_t i = 0, n = nereid_model_output_count(nm); i < n && !known; i++) {
        const char *oname;
        nereid_datatype_t dt;
        const int64_t *dims;
        size_t rank;
        nereid_model_output(nm, i, &oname, &dt, &dims, &rank);
        known = strcmp(oname, name) == 0;
    }
    if (!known)
        return terr(TRITONSERVER_ERROR_INVALID_ARG,
                    "unexpected inference output '%s' for model '%s'", name, nereid_model_name(nm));
    for (struct TRITONBACKEND_Output *o = response->outputs; o; o = o->next)
        if (strcmp(o->name, name) == 0)
            return terr(TRITONSERVER_ERROR_ALREADY_EXISTS, "output '%s' already exists in response",
                        name);
    size_t name_bytes = strlen(name) + 1;
    size_t shape_at = (sizeof(struct TRITONBACKEND_Output) + name_bytes + 7) & ~(size_t)7;
    struct TRITONBACKEND_Output *o = calloc(1, shape_at + dims_count * sizeof(int64_t) + 1);
    if (!o) return terr(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    memcpy(o->name, name, name_bytes);
    o->shape = (int64_t *)((char *)o + shape_at);
    if (dims_count) memcpy(o->shape, shape, dims_count * sizeof(int64_t));
    o->rank = dims_count;
    o->datatype = (nereid_datatype_t)datatype;
    o->resp = response;
    o->next = response->outputs;
    response->outputs = o;
    *output = o;
    return NULL;
}

/* Whether a response on c (locked) is one Triton's frontends drop: a model
 * that is not decoupled answered already, so only its first response goes
 * out (L0_grpc_state_cleanup test_non_decoupled_streaming_multi_response). */
static bool response_dropped(const tb_channel_t *c)
{
    return !c->model->decoupled && !c->sender && c->n_sent > 0;
}

TRITONSERVER_Error *TRITONBACKEND_OutputBuffer(TRITONBACKEND_Output *output, void **buffer,
                                               const uint64_t buffer_byte_size,
                                               TRITONSERVER_MemoryType *memory_type,
                                               int64_t *memory_type_id)
{
    if (!output || !buffer || !memory_type || !memory_type_id)
        return null_arg("output and out-parameters");
    *buffer = NULL;
    if (output->allocated)
        return terr(TRITONSERVER_ERROR_ALREADY_EXISTS, "buffer for output '%s' already allocated",
                    output->name);
    tb_channel_t *c = output->resp->chan;
    nereid_error_t *err;
    pthread_mutex_lock(&c->mu);
    if (c->final_sent)
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "the final response for the request was already sent");
    else if (c->sender)
        err = nereid_sender_output(c->sender, output->name, output->datatype, output->shape,
                                   output->rank, buffer_byte_size, buffer);
    else if (response_dropped(c)) {
        err = NULL;
        output->discard = calloc(1, buffer_byte_size ? buffer_byte_size : 1);
        *buffer = output->discard;
        if (!output->discard) err = nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    } else if (c->batch)
        err = nereid_batch_request_output(c->batch, c->r, output->name, output->datatype,
                                          output->shape, output->rank, buffer_byte_size, buffer);
    else
        err =
            nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                             "the request of this response has completed: a model that is not "
                             "decoupled answers before TRITONBACKEND_ModelInstanceExecute returns");
    pthread_mutex_unlock(&c->mu);
    if (err) return (TRITONSERVER_Error *)err;
    output->allocated = true;
    output->attrs.byte_size = buffer_byte_size;
    *memory_type = TRITONSERVER_MEMORY_CPU;
    *memory_type_id = 0;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_OutputBufferAttributes(TRITONBACKEND_Output *output,
                                                         TRITONSERVER_BufferAttributes **attrs)
{
    if (!output || !attrs) return null_arg("output and buffer_attributes");
    *attrs = &output->attrs;
    return NULL;
}

/* Sends flags and maybe a response's error through channel c (locked). */
static nereid_error_t *channel_send(tb_channel_t *c, const TRITONBACKEND_Response *resp,
                                    const uint32_t flags, TRITONSERVER_Error *error)
{
    bool has_response = resp != NULL;
    bool final = flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL;
    if (c->final_sent) {
        nereid_error_t *err =
            nereid_error_new(NEREID_ERROR_INVALID_ARG,
                             "a response was already sent with the final flag for this request");
        if (c->batch) /* still executing: the request fails with the reason */
            nereid_batch_set_request_error(c->batch, c->r,
                                           tritonapi_error_copy((TRITONSERVER_Error *)err));
        return err;
    }
    if (c->sender) {
        send_params(c, resp);
        nereid_error_t *err =
            has_response ? nereid_sender_send(c->sender, flags, tritonapi_error_copy(error))
                         : nereid_sender_send_flags(c->sender, flags);
        if (!err && final) {
            c->sender = NULL; /* freed by its final */
            c->final_sent = true;
        }
        return err;
    }
    if (response_dropped(c)) {
        if (final) c->final_sent = true;
        return NULL;
    }
    if (!c->batch)
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                                "the request of this response has completed: responses after "
                                "TRITONBACKEND_ModelInstanceExecute returned need a decoupled "
                                "model and a streaming client");
    if (has_response && c->n_sent > 0) {
        nereid_error_t *err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                               "this request to decoupled model '%s' accepts one "
                                               "response only (use gRPC streaming for more)",
                                               model_name(c->model));
        nereid_batch_set_request_error(
            c->batch, c->r,
            nereid_error_new(nereid_error_code(err), "%s", nereid_error_message(err)));
        return err;
    }
    if (has_response) c->n_sent++;
    send_params(c, resp);
    if (error) nereid_batch_set_request_error(c->batch, c->r, tritonapi_error_copy(error));
    if (final) c->final_sent = true;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ResponseSend(TRITONBACKEND_Response *response,
                                               const uint32_t send_flags, TRITONSERVER_Error *error)
{
    if (!response) return null_arg("response");
    tb_channel_t *c = response->chan;
    pthread_mutex_lock(&c->mu);
    nereid_error_t *err = channel_send(c, response, send_flags, error);
    if (c->final_sent) pthread_cond_broadcast(&c->done);
    pthread_mutex_unlock(&c->mu);
    response_free(response);
    return (TRITONSERVER_Error *)err;
}

TRITONSERVER_Error *TRITONBACKEND_ResponseFactorySendFlags(TRITONBACKEND_ResponseFactory *factory,
                                                           const uint32_t send_flags)
{
    if (!factory) return null_arg("factory");
    tb_channel_t *c = factory->chan;
    pthread_mutex_lock(&c->mu);
    nereid_error_t *err = channel_send(c, NULL, send_flags, NULL);
    if (c->final_sent) pthread_cond_broadcast(&c->done);
    pthread_mutex_unlock(&c->mu);
    return (TRITONSERVER_Error *)err;
}

TRITONSERVER_Error *TRITONBACKEND_ResponseFactoryIsCancelled(TRITONBACKEND_ResponseFactory *factory,
                                                             bool *is_cancelled)
{
    if (!factory || !is_cancelled) return null_arg("factory and is_cancelled");
    tb_channel_t *c = factory->chan;
    pthread_mutex_lock(&c->mu);
    *is_cancelled = c->sender  ? nereid_sender_is_cancelled(c->sender)
                    : c->batch ? nereid_batch_request_is_cancelled(c->batch, c->r)
                               : false;
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

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
