/*
 * This file contains the HTTP frontend's endpoints other than inference and
 * generate: server and model metadata, health and readiness, model config
 * and statistics, the repository index, model load and unload (run on a
 * thread of their own while the connection is suspended), the logging and
 * trace settings, and the system and CUDA shared memory extensions.
 */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/http_internal.h"
#include "http/json_reader.h"
#include "http/load_request.h"
#include "nereid/common.h"

/* ---- Small handlers ------------------------------------------------------- */

static enum MHD_Result reply_json_or_error(struct MHD_Connection *mc, nereid_error_t *err,
                                           char *json)
{
    if (err) {
        free(json);
        return http_queue_nereid_error(mc, err);
    }
    return http_queue_json_owned(mc, 200, json);
}

enum MHD_Result version_error(http_conn_t *c)
{
    return http_queue_error(c->mhd, 400,
                            "failed to get model version from specified version "
                            "string (details: out of range), version should be an "
                            "integral value > 0");
}

enum MHD_Result handle_server_metadata(http_conn_t *c)
{
    char *json = NULL;
    nereid_error_t *err = nereid_server_metadata(c->srv->core, &json);
    return reply_json_or_error(c->mhd, err, json);
}

enum MHD_Result handle_health(http_conn_t *c)
{
    bool ok = c->route == ROUTE_HEALTH_LIVE ? nereid_server_is_live(c->srv->core)
                                            : nereid_server_is_ready(c->srv->core);
    /* A drain starts after the server stopped being ready (begin_exit,
     * then http_server_drain), and a reply on a draining server is the
     * connection's last (Connection: close): such a reply says not ready,
     * even when the readiness was computed just before the signal. */
    if (c->route != ROUTE_HEALTH_LIVE && atomic_load(&c->srv->draining)) ok = false;
    return http_queue_text(c->mhd, ok ? 200 : 400, NULL, NULL, 0);
}

enum MHD_Result handle_model_metadata(http_conn_t *c)
{
    if (c->version < -1) return version_error(c);
    char *json = NULL;
    nereid_error_t *err = nereid_server_model_metadata(c->srv->core, c->model, c->version, &json);
    return reply_json_or_error(c->mhd, err, json);
}

enum MHD_Result handle_model_config(http_conn_t *c)
{
    if (c->version < -1) return version_error(c);
    char *json = NULL;
    nereid_error_t *err = nereid_server_model_config(c->srv->core, c->model, c->version, &json);
    return reply_json_or_error(c->mhd, err, json);
}

enum MHD_Result handle_model_ready(http_conn_t *c)
{
    bool ready = false;
    nereid_error_t *err =
        c->version < -1 ? NULL
                        : nereid_server_model_is_ready(c->srv->core, c->model, c->version, &ready);
    /* Triton answers an unknown model or version as "not ready". */
    if (err) {
        nereid_error_code_t code = nereid_error_code(err);
        if (code != NEREID_ERROR_NOT_FOUND && code != NEREID_ERROR_UNAVAILABLE)
            return http_queue_nereid_error(c->mhd, err);
        nereid_error_free(err);
    }
    if (!ready) return http_queue_error(c->mhd, 400, "Model version not ready");
    return http_queue_text(c->mhd, 200, NULL, NULL, 0);
}

enum MHD_Result handle_stats(http_conn_t *c)
{
    if (c->version < -1) return version_error(c);
    char *json = NULL;
    nereid_error_t *err = nereid_server_model_statistics(c->srv->core, c->model, c->version, &json);
    return reply_json_or_error(c->mhd, err, json);
}

/* Parses the body with jansson; *too_deep (may be NULL) tells that it failed
 * on jansson's nesting limit (2048), which Triton's iterative rapidjson
 * does not have. */
/* Levels of a JSON body that handlers read: deeper containers are read as
 * empty ones (no handler looks that deep; a member expected to be a scalar
 * is then an array or object, refused by its type check). */
#define JSON_TREE_DEPTH 64

/* Every JSON body but the inference request's goes through here: checked at
 * any depth without recursion, as Triton's iterative parse (its texts), so
 * one body is refused or read the same way on every endpoint whatever its
 * nesting; jansson then builds the tree of its first JSON_TREE_DEPTH levels
 * (and refuses a NUL in a string). */
static json_t *parse_body_json(http_conn_t *c, nereid_error_t **err)
{
    *err = NULL;
    if (c->body.len == 0) return NULL;
    char *flat;
    size_t flat_len;
    if ((*err = json_reader_check(c->body.data, c->body.len, JSON_TREE_DEPTH, &flat, &flat_len)))
        return NULL;
    json_error_t jerr;
    json_t *root = flat ? json_loadb(flat, flat_len, 0, &jerr)
                        : json_loadb(c->body.data, c->body.len, 0, &jerr);
    free(flat);
    if (root) return root;
    /* jansson refuses \u0000 in strings: a NUL in a name or key is the
     * client's error (400), as in the inference JSON reader. */
    enum json_error_code code = json_error_code(&jerr);
    bool nul = code == json_error_null_character || code == json_error_null_byte_in_key;
    *err = nereid_error_new(nul ? NEREID_ERROR_INVALID_ARG : NEREID_ERROR_INTERNAL,
                            "failed to parse the request JSON buffer: %s at %d", jerr.text,
                            jerr.position);
    return NULL;
}

enum MHD_Result handle_repository_index(http_conn_t *c)
{
    nereid_error_t *err;
    json_t *root = parse_body_json(c, &err);
    if (err) return http_queue_nereid_error(c->mhd, err);
    bool ready_only = false;
    if (root) {
        json_t *ready = json_is_object(root) ? json_object_get(root, "ready") : NULL;
        if (ready && !json_is_boolean(ready)) {
            json_decref(root);
            return http_queue_error(c->mhd, 400, "Invalid value for 'ready': expected a boolean");
        }
        ready_only = ready && json_is_true(ready);
        json_decref(root);
    }
    char *json = NULL;
    err = nereid_server_repository_index(c->srv->core, ready_only, &json);
    return reply_json_or_error(c->mhd, err, json);
}

/* ---- Model control ----
 *
 * A load or unload can take as long as a model's init or drain (minutes for
 * some): it runs on a thread of its own while its connection is suspended,
 * so the event thread goes on serving its other connections, and several
 * loads run at once as the repository allows (repository.c, "Control"). */

typedef struct control_job {
    http_conn_t *c;
    bool unload, dependents;
    json_t *root; /* the load's body: req borrows from it */
    load_request_t req;
    nereid_error_t *err; /* the outcome */
} control_job_t;

void control_job_free(control_job_t *j)
{
    if (!j) return;
    if (!j->unload) load_request_free(&j->req);
    if (j->root) json_decref(j->root);
    if (j->err) nereid_error_free(j->err);
    free(j);
}

/* Runs the operation, then hands the connection back as an inference's
 * completion does (infer_done): it never touches c after that. */
static void *control_job_main(void *arg)
{
    control_job_t *j = arg;
    http_conn_t *c = j->c;
    http_server_t *srv = c->srv;
    if (j->unload)
        j->err = nereid_server_unload_model(srv->core, c->model, j->dependents);
    else
        j->err = nereid_server_load_model(srv->core, c->model, j->req.config, j->req.paths,
                                          (const void *const *)j->req.contents, j->req.sizes,
                                          j->req.n_files);
    int phase = PHASE_RUNNING;
    if (!atomic_compare_exchange_strong(&c->phase, &phase, PHASE_DONE)) {
        atomic_store(&c->phase, PHASE_DONE);
        MHD_resume_connection(c->mhd);
    }
    inflight_end(srv);
    return NULL;
}

static enum MHD_Result control_reply(http_conn_t *c)
{
    conn_resumed(c);
    control_job_t *j = c->job;
    c->job = NULL;
    nereid_error_t *err = j->err;
    j->err = NULL;
    control_job_free(j);
    if (err) return http_queue_nereid_error(c->mhd, err);
    return http_queue_text(c->mhd, 200, NULL, NULL, 0);
}

static enum MHD_Result control_start(http_conn_t *c, control_job_t *j)
{
    j->c = c;
    c->job = j;
    atomic_fetch_add(&c->srv->n_inflight, 1); /* counted even when stopping */
    nereid_run_detached(control_job_main, j);
    if (infer_wait(c)) return control_reply(c);
    return MHD_YES;
}

/* Called again once the job resumed the connection. */
static bool control_resumed(http_conn_t *c, enum MHD_Result *ret)
{
    if (!c->job) return false;
    if (atomic_load(&c->phase) == PHASE_DONE) {
        *ret = control_reply(c);
    } else { /* not seen: wait again, as handle_infer does */
        conn_resumed(c);
        conn_suspend(c);
        if (atomic_load(&c->phase) == PHASE_DONE) MHD_resume_connection(c->mhd);
        *ret = MHD_YES;
    }
    return true;
}

enum MHD_Result handle_load(http_conn_t *c)
{
    enum MHD_Result ret;
    if (control_resumed(c, &ret)) return ret;
    nereid_error_t *err;
    json_t *root = parse_body_json(c, &err);
    if (err) return http_queue_nereid_error(c->mhd, err);
    control_job_t *j = calloc(1, sizeof *j);
    if (!j) {
        if (root) json_decref(root);
        return http_queue_error(c->mhd, 500, "out of memory");
    }
    j->root = root;
    err = load_request_read(root, &j->req);
    if (err) {
        control_job_free(j);
        return http_queue_nereid_error(c->mhd, err);
    }
    return control_start(c, j);
}

enum MHD_Result handle_unload(http_conn_t *c)
{
    enum MHD_Result ret;
    if (control_resumed(c, &ret)) return ret;
    nereid_error_t *err;
    json_t *root = parse_body_json(c, &err);
    if (err) return http_queue_nereid_error(c->mhd, err);
    bool dependents = false;
    json_t *params = root && json_is_object(root) ? json_object_get(root, "parameters") : NULL;
    json_t *v =
        params && json_is_object(params) ? json_object_get(params, "unload_dependents") : NULL;
    if (v && !json_is_boolean(v))
        err = nereid_error_new(NEREID_ERROR_INTERNAL,
                               "Unable to parse 'unload_dependents': attempt to access JSON "
                               "non-boolean as boolean");
    dependents = v && json_is_true(v);
    if (root) json_decref(root);
    if (err) return http_queue_nereid_error(c->mhd, err);
    control_job_t *j = calloc(1, sizeof *j);
    if (!j) return http_queue_error(c->mhd, 500, "out of memory");
    j->unload = true;
    j->dependents = dependents;
    return control_start(c, j);
}

/* ---- Logging and trace settings -------------------------------------------- */

static enum MHD_Result reply_log_settings(http_conn_t *c)
{
    nereid_log_settings_t ls;
    nereid_server_log_settings(c->srv->core, &ls);
    json_t *doc = json_pack("{s:s,s:b,s:b,s:b,s:I,s:s}", "log_file", ls.log_file, "log_info",
                            ls.log_info, "log_warning", ls.log_warning, "log_error", ls.log_error,
                            "log_verbose_level", (json_int_t)ls.log_verbose_level, "log_format",
                            nereid_log_format_name(ls.log_format));
    char *json = doc ? json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(doc);
    if (!json) return http_queue_error(c->mhd, 500, "unable to serialize JSON");
    return http_queue_json_owned(c->mhd, 200, json);
}

/* Reads optional bool key; null/absent = no change (*set stays NULL). */
static nereid_error_t *log_bool(json_t *root, const char *key, bool *slot, const bool **set)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return NULL;
    if (!json_is_boolean(v))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "expect boolean for '%s'", key);
    *slot = json_is_true(v);
    *set = slot;
    return NULL;
}

enum MHD_Result handle_logging(http_conn_t *c)
{
    if (c->route == ROUTE_LOGGING_GET) return reply_log_settings(c);
    nereid_error_t *err;
    json_t *root = parse_body_json(c, &err);
    if (!err && !json_is_object(root))
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "expect a JSON object with the log settings to update");
    bool info, warning, error;
    const bool *p_info = NULL, *p_warning = NULL, *p_error = NULL;
    uint32_t verbose;
    const uint32_t *p_verbose = NULL;
    const char *format = NULL;
    if (!err) {
        json_t *f = json_object_get(root, "log_file");
        if (f && !json_is_null(f))
            err = nereid_error_new(NEREID_ERROR_UNSUPPORTED,
                                   "log file location can not be updated through network "
                                   "protocol");
    }
    if (!err) err = log_bool(root, "log_info", &info, &p_info);
    if (!err) err = log_bool(root, "log_warning", &warning, &p_warning);
    if (!err) err = log_bool(root, "log_error", &error, &p_error);
    if (!err) {
        json_t *v = json_object_get(root, "log_verbose_level");
        if (v && !json_is_null(v)) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) > INT32_MAX)
                err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                       "expect non-negative integer for 'log_verbose_level'");
            else {
                verbose = (uint32_t)json_integer_value(v);
                p_verbose = &verbose;
            }
        }
    }
    if (!err) {
        json_t *v = json_object_get(root, "log_format");
        if (v && !json_is_null(v)) {
            if (!json_is_string(v))
                err = nereid_error_new(NEREID_ERROR_INVALID_ARG, "expect string for 'log_format'");
            else
                format = json_string_value(v);
        }
    }
    if (!err)
        err = nereid_server_update_log_settings(c->srv->core, p_info, p_warning, p_error, p_verbose,
                                                format);
    if (root) json_decref(root);
    if (err) return http_queue_nereid_error(c->mhd, err);
    return reply_log_settings(c);
}

enum MHD_Result handle_trace(http_conn_t *c)
{
    char *json = NULL;
    if (c->route == ROUTE_TRACE_GET || c->route == ROUTE_MODEL_TRACE_GET) {
        nereid_error_t *err = nereid_server_trace_settings(c->srv->core, c->model, &json);
        return reply_json_or_error(c->mhd, err, json);
    }
    /* Triton reads each known key with TritonJson: trace_level must be an
     * array of strings, the others strings; null clears; an empty body
     * changes nothing. */
    static const char *const keys[] = {"trace_file", "trace_level", "trace_rate", "trace_count",
                                       "log_frequency"};
    enum { N_KEYS = sizeof keys / sizeof keys[0] };
    static const char *const no_values[1] = {NULL};
    nereid_error_t *err;
    json_t *root = parse_body_json(c, &err);
    if (!err && root && !json_is_object(root))
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "expect a JSON object with the trace settings to update");
    nereid_trace_setting_t settings[N_KEYS];
    const char **vals[N_KEYS] = {NULL};
    size_t n = 0;
    for (size_t k = 0; !err && root && k < N_KEYS; k++) {
        json_t *v = json_object_get(root, keys[k]);
        if (!v) continue;
        nereid_trace_setting_t *t = &settings[n++];
        *t = (nereid_trace_setting_t){.key = keys[k]};
        if (json_is_null(v)) continue;
        bool level = k == 1;
        if (level && !json_is_array(v)) {
            t->type_error = "attempt to access JSON non-array as array";
            continue;
        }
        size_t nv = level ? json_array_size(v) : 1;
        vals[k] = calloc(nv ? nv : 1, sizeof *vals[k]);
        if (!vals[k]) {
            err = nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
            break;
        }
        for (size_t i = 0; i < nv; i++) {
            json_t *e = level ? json_array_get(v, i) : v;
            if (!json_is_string(e)) {
                t->type_error = "attempt to access JSON non-string as string";
                break;
            }
            vals[k][i] = json_string_value(e);
        }
        t->values = nv ? vals[k] : no_values;
        t->n_values = nv;
    }
    if (!err)
        err =
            nereid_server_update_trace_settings(c->srv->core, c->model, settings, n, false, &json);
    for (size_t k = 0; k < N_KEYS; k++)
        free(vals[k]);
    if (root) json_decref(root);
    return reply_json_or_error(c->mhd, err, json);
}

enum MHD_Result handle_named_repository(http_conn_t *c)
{
    return http_queue_error(c->mhd, 501, "'repository_name' specification is not supported");
}

/* Triton's register body: {"key", "offset" (optional), "byte_size"}. */
static nereid_error_t *shm_register(http_conn_t *c)
{
    nereid_error_t *err;
    json_t *root = parse_body_json(c, &err);
    if (err) return err;
    json_t *key = json_is_object(root) ? json_object_get(root, "key") : NULL;
    json_t *offset = key ? json_object_get(root, "offset") : NULL;
    json_t *size = key ? json_object_get(root, "byte_size") : NULL;
    if (!key)
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "Shared memory register request has no 'key' field");
    else if (!json_is_string(key))
        err =
            nereid_error_new(NEREID_ERROR_INTERNAL, "attempt to access JSON non-string as string");
    else if ((offset && (!json_is_integer(offset) || json_integer_value(offset) < 0)) ||
             (size && (!json_is_integer(size) || json_integer_value(size) < 0)))
        err = nereid_error_new(NEREID_ERROR_INTERNAL,
                               "attempt to access JSON non-unsigned-integer as unsigned-integer");
    else if (!size)
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "Shared memory register request has no 'byte_size' field");
    else
        err = nereid_shm_register(c->srv->shm, c->name, json_string_value(key),
                                  offset ? (uint64_t)json_integer_value(offset) : 0,
                                  (uint64_t)json_integer_value(size));
    if (root) json_decref(root);
    return err;
}

/* Triton built without GPU support: CUDA regions can never be registered. */
static nereid_error_t *cuda_shm(http_conn_t *c, char **json)
{
    nereid_shm_registry_t *reg = c->srv->shm;
    if (c->route == ROUTE_CUDA_SHM_STATUS) {
        *json = strdup("[]");
        return *json ? NULL : nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    }
    if (c->route == ROUTE_CUDA_SHM_REGION_STATUS) {
        char *sys = NULL;
        nereid_error_t *err = nereid_shm_status(reg, c->name, &sys);
        free(sys);
        if (err) {
            nereid_error_free(err);
            return nereid_error_new(NEREID_ERROR_NOT_FOUND,
                                    "Unable to find cuda shared memory region: '%s'", c->name);
        }
        return nereid_error_new(NEREID_ERROR_NOT_FOUND,
                                "The region named '%s' is registered as system shared memory, "
                                "not CUDA shared memory",
                                c->name);
    }
    if (!nereid_shm_allowed(reg))
        return nereid_error_new(NEREID_ERROR_UNSUPPORTED, NEREID_SHM_DISABLED_TEXT);
    if (c->route == ROUTE_CUDA_SHM_REGISTER)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "failed to register CUDA shared memory region: '%s', GPUs not "
                                "supported",
                                c->name);
    return NULL; /* unregister: no CUDA region is ever registered */
}

/* The system (and CUDA) shared memory extension, as Triton's
 * HandleSystemSharedMemory / HandleCudaSharedMemory. */
enum MHD_Result handle_shm(http_conn_t *c)
{
    char *json = NULL;
    nereid_error_t *err = NULL;
    switch (c->route) {
    case ROUTE_SYS_SHM_STATUS:
    case ROUTE_SYS_SHM_REGION_STATUS:
        err = nereid_shm_status(c->srv->shm, c->name, &json);
        break;
    case ROUTE_SYS_SHM_REGISTER:
        err = nereid_shm_allowed(c->srv->shm)
                  ? shm_register(c)
                  : nereid_error_new(NEREID_ERROR_UNSUPPORTED, NEREID_SHM_DISABLED_TEXT);
        break;
    case ROUTE_SYS_SHM_UNREGISTER:
    case ROUTE_SYS_SHM_REGION_UNREGISTER:
        err = nereid_shm_unregister(c->srv->shm, c->name);
        break;
    default:
        err = cuda_shm(c, &json);
    }
    if (err || json) return reply_json_or_error(c->mhd, err, json);
    return http_queue_text(c->mhd, 200, "application/json", NULL, 0);
}
