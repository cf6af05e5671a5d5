/*
 * This file contains the server: options, the model repository (scanning,
 * configs, version policies, parallel loading), model lookup for requests,
 * inference submission, and the JSON documents of server.h (metadata,
 * config, statistics, repository index) and the metrics text.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/loader.h"
#include "core/cache.h"
#include "core/custom_metrics.h"
#include "core/core.h"
#include "core/model_table.h"
#include "core/on_demand.h"
#include "core/rate_limiter.h"
#include "core/trace.h"
#include "core/repository.h"
#include "core/server_internal.h"
#include "core/stats.h"
#include "core/util.h"
#include "core/watchdog.h"
#include "sched/scheduler.h"
#include "storage/storage.h"

#define NEREID_VERSION "0.1.0"

void nereid_server_options_init(nereid_server_options_t *o)
{
    memset(o, 0, sizeof *o);
    o->model_control_mode = NEREID_MODEL_CONTROL_NONE;
    o->repository_poll_secs = 15;
    o->exit_on_error = true;
    o->strict_readiness = true;
    o->server_id = "triton";
    o->model_load_thread_count = 4;
    o->metrics_counter_latencies = true;
    o->log_info = o->log_warning = o->log_error = true;
    o->pinned_memory_pool_byte_size = 268435456;
}

/* A repository path as Triton keeps it: an absolute path as given (a
 * symbolic link in it is not resolved, so a model's "model_repository" and
 * file paths read the way the user wrote them), less trailing slashes; a
 * relative one made absolute with realpath, as the server never changes
 * directory but its model workers may. Caller frees. */
static char *repository_path_as_given(const char *path)
{
    if (storage_is_remote(path)) return xstrdup(path); /* s3://, as://: src/storage/ */
    if (path[0] != '/') {
        char *real = realpath(path, NULL);
        return real ? real : xstrdup(path);
    }
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--;
    char *out = xstrdup(path);
    out[len] = 0;
    return out;
}

/* ---- Server lifecycle ---- */

nereid_error_t *nereid_server_new(const nereid_server_options_t *opts, nereid_server_t **out)
{
    *out = NULL;
    if (!opts || opts->n_model_repositories == 0)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "--model-repository must be specified");
    if (opts->model_load_on_demand && opts->model_control_mode == NEREID_MODEL_CONTROL_NONE)
        return nereid_error_new(
            NEREID_ERROR_INVALID_ARG,
            "--model-load-on-demand=true requires --model-control-mode=explicit or poll");
    if (opts->model_memory_budget_bytes > 0 && !opts->model_load_on_demand)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "--model-memory-budget requires --model-load-on-demand=true");
    nereid_server_t *s = xcalloc(1, sizeof *s);
    s->opts = *opts;
    /* Triton keeps the repository paths in a set: one given twice is one
     * repository (its models are not "in two or more repositories"). */
    s->repos =
        xcalloc(opts->n_model_repositories ? opts->n_model_repositories : 1, sizeof *s->repos);
    s->n_repos = 0;
    for (size_t i = 0; i < opts->n_model_repositories; i++) {
        char *path = repository_path_as_given(opts->model_repositories[i]);
        bool seen = false;
        for (size_t j = 0; j < s->n_repos && !seen; j++)
            seen = strcmp(s->repos[j], path) == 0;
        if (seen)
            free(path);
        else
            s->repos[s->n_repos++] = path;
    }
    s->backend_dir =
        xstrdup(opts->backend_directory && opts->backend_directory[0] ? opts->backend_directory
                                                                      : NEREID_DEFAULT_BACKEND_DIR);
    s->server_id = xstrdup(opts->server_id ? opts->server_id : "triton");
    if (opts->model_config_name && opts->model_config_name[0])
        s->model_config_name = xstrdup(opts->model_config_name);
    s->opts.model_config_name = NULL;
    s->opts.load_models = NULL;
    s->opts.model_repositories = NULL;
    s->opts.rate_limit_resources = NULL;
    s->opts.backend_settings = NULL;
    /* Triton adds three global settings of its own after the command line's. */
    size_t n_user = opts->n_backend_settings;
    s->backend_settings = xcalloc(n_user + 3, sizeof *s->backend_settings);
    for (size_t i = 0; i < n_user; i++) {
        const nereid_backend_setting_t *o = &opts->backend_settings[i];
        s->backend_settings[i] = (nereid_backend_setting_t){xstrdup(o->backend ? o->backend : ""),
                                                            xstrdup(o->setting), xstrdup(o->value)};
    }
    const char *own[3][2] = {
        {"auto-complete-config", opts->strict_model_config ? "false" : "true"},
        {"min-compute-capability", "6.000000"},
        {"backend-directory", s->backend_dir},
    };
    for (size_t i = 0; i < 3; i++)
        s->backend_settings[n_user + i] =
            (nereid_backend_setting_t){xstrdup(""), xstrdup(own[i][0]), xstrdup(own[i][1])};
    s->n_backend_settings = n_user + 3;
    if (opts->rate_limit == NEREID_RATE_LIMIT_EXECUTION_COUNT)
        s->rate_limiter =
            rate_limiter_new(opts->rate_limit_resources, opts->n_rate_limit_resources);
    log_verbose_level = opts->log_verbose;
    log_info_enabled = opts->log_info;
    log_warning_enabled = opts->log_warning;
    log_error_enabled = opts->log_error;
    log_format_iso8601 = opts->log_format == NEREID_LOG_FORMAT_ISO8601;
    /* Nobody takes the read lock twice (submission holds it only for the
     * lookup), so any POSIX rwlock will do. */
    pthread_rwlock_init(&s->lock, NULL);
    nereid_error_t *err = NULL;
    if (opts->cache_name) {
        err = cache_create(opts->cache_name,
                           opts->cache_config_json ? opts->cache_config_json : "{}", &s->cache);
        s->opts.cache_name = s->opts.cache_config_json = NULL; /* borrowed */
        if (err) {
            nereid_server_free(s);
            return err;
        }
    }
    s->opts.load_models = opts->load_models;
    err = repository_start(s);
    s->opts.load_models = NULL;
    if (err && !opts->exit_on_error) {
        /* Triton: the repository manager could not be created; the server
         * stays up answering health (not live, not ready) and metadata. */
        LOG_ERROR("%s", nereid_error_message(err));
        nereid_error_free(err);
        err = NULL;
        s->init_failed = true;
    }
    if (err) {
        nereid_server_free(s);
        return err;
    }
    if (!s->init_failed) model_table_log(s); /* Triton's PrintBackendAndModelSummary */
    if (opts->exit_on_error) {
        for (size_t i = 0; i < s->n_models; i++) {
            model_entry_t *e = s->models[i];
            const char *reason = e->reason;
            for (size_t v = 0; !reason && v < e->n_versions; v++)
                if (e->versions[v].state == MODEL_UNAVAILABLE) reason = e->versions[v].reason;
            if (reason && e->state != MODEL_UNKNOWN_STATE) {
                err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                       "failed to load all models: '%s': %s", e->name, reason);
                nereid_server_free(s);
                return err;
            }
        }
    }
    s->watchdog = watchdog_start(s, opts->model_progress_timeout_secs);
    *out = s;
    return NULL;
}

void nereid_server_stop(nereid_server_t *s)
{
    if (atomic_exchange(&s->stopping, true)) return;
    remote_repo_cancel_all(s); /* a poll's downloads end now */
    watchdog_stop(s->watchdog);
    s->watchdog = NULL;
    on_demand_stop(s);
    repository_stop(s);
    atomic_store(&s->stopped, true);
}

void nereid_server_free(nereid_server_t *s)
{
    if (!s) return;
    nereid_server_stop(s);
    on_demand_free(s);
    remote_repo_close_all(s);
    for (size_t i = 0; i < s->n_repos; i++)
        free(s->repos[i]);
    free(s->repos);
    free(s->backend_dir);
    free(s->server_id);
    free(s->model_config_name);
    rate_limiter_free(s->rate_limiter); /* every model was unloaded */
    cache_destroy(s->cache);
    for (size_t i = 0; i < s->n_backend_settings; i++) {
        free((char *)s->backend_settings[i].backend);
        free((char *)s->backend_settings[i].setting);
        free((char *)s->backend_settings[i].value);
    }
    free(s->backend_settings);
    pthread_rwlock_destroy(&s->lock);
    pthread_mutex_destroy(&s->control);
    pthread_cond_destroy(&s->claim_ended);
    pthread_mutex_destroy(&s->on_demand_load);
    pthread_mutex_destroy(&s->poll_lock);
    pthread_cond_destroy(&s->poll_cond);
    free(s);
}

void nereid_server_begin_exit(nereid_server_t *s)
{
    atomic_store(&s->exiting, true);
}

/* Triton's in-flight inferences of a loaded version: the requests waiting
 * in its scheduler, or what the scheduler counts itself (a sequence
 * batcher: its live sequences); 0 when it is not loaded. */
static int64_t version_pending(const version_entry_t *ve)
{
    if (ve->state != MODEL_READY || !ve->model) return 0;
    const model_t *m = ve->model;
    if (m->sched && m->sched->ops->inflight) return (int64_t)m->sched->ops->inflight(m->sched);
    return atomic_load(&m->stats.pending);
}

size_t nereid_server_log_inflight(nereid_server_t *s, int secs_left)
{
    size_t n = 0;
    pthread_rwlock_rdlock(&s->lock);
    for (size_t i = 0; i < s->n_models; i++)
        for (size_t v = 0; v < s->models[i]->n_versions; v++)
            n += version_pending(&s->models[i]->versions[v]) > 0;
    LOG_INFO("Timeout %d: Found %zu model versions that have in-flight inferences", secs_left, n);
    for (size_t i = 0; i < s->n_models; i++)
        for (size_t v = 0; v < s->models[i]->n_versions; v++) {
            const version_entry_t *ve = &s->models[i]->versions[v];
            int64_t k = version_pending(ve);
            if (k > 0)
                LOG_INFO("Model '%s' (version %" PRId64 ") has %" PRId64 " in-flight inferences",
                         s->models[i]->name, ve->version, k);
        }
    pthread_rwlock_unlock(&s->lock);
    return n;
}

void nereid_server_log_live_models(nereid_server_t *s, int secs_left)
{
    size_t n = 0;
    pthread_rwlock_rdlock(&s->lock);
    for (size_t i = 0; i < s->n_models; i++)
        for (size_t v = 0; v < s->models[i]->n_versions; v++)
            n += s->models[i]->versions[v].state == MODEL_READY;
    pthread_rwlock_unlock(&s->lock);
    LOG_INFO("Timeout %d: Found %zu live models and 0 in-flight non-inference requests", secs_left,
             n);
}

bool server_is_stopping(nereid_server_t *s)
{
    return atomic_load(&s->stopping);
}

bool nereid_server_is_live(nereid_server_t *s)
{
    return s && !s->init_failed && !atomic_load(&s->stopping);
}

static bool model_instances_ready(model_t *m);

bool nereid_server_is_ready(nereid_server_t *s)
{
    if (!s || s->init_failed || atomic_load(&s->stopping) || atomic_load(&s->exiting)) return false;
    if (!s->opts.strict_readiness) return true;
    bool ready = true;
    model_t **serving = NULL; /* the READY versions (a reference each) */
    size_t n_serving = 0;
    pthread_rwlock_rdlock(&s->lock);
    for (size_t i = 0; i < s->n_models && ready; i++) {
        const model_entry_t *e = s->models[i];
        if (e->state == MODEL_UNKNOWN_STATE) continue;
        /* Triton's poll never added a model whose config it could not read */
        if (e->poll_failed && e->n_versions == 0) continue;
        if (e->state == MODEL_UNAVAILABLE && e->reason && strcmp(e->reason, "unloaded") == 0)
            continue;
        /* Triton: a version that is not ready because it was unloaded is fine */
        for (size_t v = 0; v < e->n_versions; v++) {
            const version_entry_t *ve = &e->versions[v];
            ready &=
                ve->state == MODEL_READY || (ve->reason && strcmp(ve->reason, "unloaded") == 0);
            if (ready && ve->state == MODEL_READY && ve->model) {
                serving = xrealloc(serving, (n_serving + 1) * sizeof *serving);
                model_ref(ve->model);
                serving[n_serving++] = ve->model;
            }
        }
        ready &= e->state == MODEL_READY;
    }
    pthread_rwlock_unlock(&s->lock);
    /* Triton (core #473): a READY version must also pass the model's
     * readiness check (model_instances_ready: not wedged, every instance
     * ready, e.g. its Python worker alive), asked outside the lock. */
    for (size_t i = 0; i < n_serving; i++) {
        ready = ready && model_instances_ready(serving[i]);
        model_unref(serving[i]);
    }
    free(serving);
    return ready;
}

/* ---- Lookup ---- */

/* Resolves model/version (<= 0: latest ready; ns: the namespace, or NULL)
 * and takes a reference; *entry_out (when given) is the model's entry.
 * Caller holds the read lock. */
static nereid_error_t *lookup_locked(nereid_server_t *s, const char *ns, const char *name,
                                     int64_t version, model_t **out, model_entry_t **entry_out)
{
    *out = NULL;
    nereid_error_t *ambiguous = NULL;
    model_entry_t *e = repository_resolve(s, ns, name, &ambiguous);
    if (entry_out) *entry_out = e;
    if (ambiguous) return ambiguous;
    /* Triton's FindModelIdentifier: INVALID_ARG; a model whose config its
     * poll could not read is not in its table either */
    if (!e || e->state == MODEL_UNKNOWN_STATE || (e->poll_failed && e->n_versions == 0))
        return nereid_error_new(s->opts.model_namespacing && !s->opts.model_load_on_demand
                                    ? NEREID_ERROR_INVALID_ARG
                                    : NEREID_ERROR_NOT_FOUND,
                                "Request for unknown model: '%s' is not found", name);
    if (version <= 0) {
        for (size_t v = e->n_versions; v-- > 0;)
            if (e->versions[v].state == MODEL_READY) {
                *out = e->versions[v].model;
                break;
            }
        if (!*out)
            return nereid_error_new(NEREID_ERROR_NOT_FOUND,
                                    "Request for unknown model: '%s' has no available versions",
                                    name);
    } else {
        version_entry_t *ve = NULL;
        for (size_t v = 0; v < e->n_versions; v++)
            if (e->versions[v].version == version) ve = &e->versions[v];
        if (!ve)
            return nereid_error_new(
                NEREID_ERROR_NOT_FOUND,
                "Request for unknown model: '%s' version %" PRId64 " is not found", name, version);
        if (ve->state != MODEL_READY)
            return nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                                    "Request for unknown model: '%s' version %" PRId64
                                    " is not at ready state",
                                    name, version);
        *out = ve->model;
    }
    model_ref(*out); /* the caller's (a request's until its response is freed) */
    if (s->opts.model_load_on_demand) atomic_store(&e->last_used_ns, util_now_ns());
    return NULL;
}

nereid_error_t *server_lookup_model(nereid_server_t *s, const char *name, int64_t version,
                                    model_t **out)
{
    return server_lookup_model_ns(s, NULL, name, version, out);
}

nereid_error_t *server_lookup_model_ns(nereid_server_t *s, const char *ns, const char *name,
                                       int64_t version, model_t **out)
{
    if (atomic_load(&s->stopping)) {
        *out = NULL;
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready");
    }
    pthread_rwlock_rdlock(&s->lock);
    nereid_error_t *err = lookup_locked(s, ns, name, version, out, NULL);
    pthread_rwlock_unlock(&s->lock);
    return err;
}

/* ---- Inference ---- */

nereid_error_t *server_hold_model(nereid_server_t *s, const char *ns, const char *name,
                                  int64_t version, model_t **out)
{
    nereid_error_t *err = server_lookup_model_ns(s, ns, name, version, out);
    if (!err) model_hold(*out);
    return err;
}

/* Validates req against m and hands it to m's scheduler (which may run it
 * on this thread); req->model takes over the caller's reference to m. No
 * lock is held. On failure req->model is cleared and the reference
 * dropped; *stopped tells whether m's scheduler had stopped (the model is
 * being unloaded: a newer version may serve the request). */
static nereid_error_t *submit(model_t *m, nereid_request_t *req,
                              const nereid_response_allocator_t *allocator,
                              nereid_complete_fn done_fn, void *done_userp, bool *stopped)
{
    *stopped = false;
    req->model = m;
    nereid_error_t *err = request_validate(req, m);
    if (err) goto fail;
    uint64_t now = util_now_ns();
    req->t_request_ns = now;
    req->t_queue_start_ns = now;
    req->t_compute_start_ns = 0;
    request_start_deadline(req, now);
    if (req->trace) trace_request_start(req);
    /* Triton's dynamic-batch and ensemble schedulers trace the inputs they
     * take (its sequence batcher does not). */
    if (req->trace && m->config->scheduling_choice_case !=
                          INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_SEQUENCE_BATCHING)
        trace_queue_inputs(req);
    if (allocator)
        req->alloc = *allocator;
    else
        memset(&req->alloc, 0, sizeof req->alloc);
    req->done_fn = done_fn;
    req->done_userp = done_userp;
    request_prepare_response(req);
    if (request_expired(req, now)) {
        /* An ensemble step whose request's deadline passed before it
         * reached this step: it would only queue to expire. */
        request_finish_expired(req, NULL);
        return NULL;
    }
    if (cache_lookup(req)) { /* a hit: the response is filled */
        request_finish(req, NULL, FAILURE_OTHER);
        return NULL;
    }
    err = atomic_load_explicit(&m->wedged, memory_order_relaxed) ? watchdog_refusal(m)
                                                                 : model_start_instances(m);
    if (!err) err = m->sched->ops->enqueue(m->sched, req);
    if (err) {
        *stopped = atomic_load(&m->unloading);
        if (!*stopped) atomic_fetch_add(&m->stats.failures[FAILURE_REJECTED], 1);
        cache_forget(req);
        nereid_response_free(req->response);
        req->response = NULL;
        goto fail;
    }
    return NULL;
fail:
    req->model = NULL;
    model_unref(m);
    return err;
}

/* Whether err, from a lookup, asks for an on-demand load. */
static bool wants_load(nereid_server_t *s, const nereid_error_t *err)
{
    return err && s->opts.model_load_on_demand && !atomic_load(&s->stopping) &&
           (nereid_error_code(err) == NEREID_ERROR_NOT_FOUND ||
            nereid_error_code(err) == NEREID_ERROR_UNAVAILABLE);
}

/* Looks the model up (loading it on demand on this thread when defer is
 * false, else handing the request to the on-demand loaders) and submits. */
static nereid_error_t *infer_lookup_submit(nereid_server_t *s, nereid_request_t *req,
                                           const nereid_response_allocator_t *allocator,
                                           nereid_complete_fn done_fn, void *done_userp, bool defer)
{
    /* The lock covers the lookup only: the request holds a reference to
     * the model it found. A reload or unload may stop that version before
     * the request reaches its scheduler; the request then looks the model
     * up once more (the newer version, or Triton's lookup error). */
    nereid_error_t *err = NULL;
    for (int attempt = 0; attempt < 2; attempt++) {
        nereid_error_free(err);
        model_t *m;
        err = server_lookup_model(s, req->model_name, req->version_req, &m);
        if (wants_load(s, err)) {
            /* Not loaded: the loaders load it while this (frontend) thread
             * serves others, or this thread loads it and waits. */
            if (defer && on_demand_defer(s, req, allocator, done_fn, done_userp)) {
                nereid_error_free(err);
                return NULL;
            }
            nereid_error_free(err);
            err = repository_load_on_demand(s, req->model_name);
            if (!err) err = server_lookup_model(s, req->model_name, req->version_req, &m);
        }
        if (err) return err;
        bool stopped;
        err = submit(m, req, allocator, done_fn, done_userp, &stopped);
        if (!err || !stopped) return err;
    }
    return err;
}

nereid_error_t *nereid_server_infer_async(nereid_server_t *s, nereid_request_t *req,
                                          const nereid_response_allocator_t *allocator,
                                          nereid_complete_fn done_fn, void *done_userp)
{
    if (!req || !done_fn)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "request and callback are required");
    if (req->model)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "request was already submitted");
    return infer_lookup_submit(s, req, allocator, done_fn, done_userp, true);
}

nereid_error_t *server_infer_loaded(nereid_server_t *s, nereid_request_t *req,
                                    const nereid_response_allocator_t *allocator,
                                    nereid_complete_fn done_fn, void *done_userp)
{
    return infer_lookup_submit(s, req, allocator, done_fn, done_userp, false);
}

nereid_error_t *server_infer_held(model_t *m, nereid_request_t *req,
                                  const nereid_response_allocator_t *allocator,
                                  nereid_complete_fn done_fn, void *done_userp)
{
    /* The hold keeps m's scheduler running (model_unload waits for it; at
     * shutdown the stopped scheduler refuses the request). */
    model_ref(m); /* the request's */
    bool stopped;
    nereid_error_t *err = submit(m, req, allocator, done_fn, done_userp, &stopped);
    if (err && stopped) atomic_fetch_add(&m->stats.failures[FAILURE_REJECTED], 1);
    return err;
}

/* ---- JSON documents ---- */

static nereid_error_t *dump(json_t *doc, char **out)
{
    *out = json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(doc);
    if (!*out) return nereid_error_new(NEREID_ERROR_INTERNAL, "unable to serialize JSON");
    return NULL;
}

nereid_error_t *nereid_server_metadata(nereid_server_t *s, char **json_out)
{
    static const char *extensions[] = {"classification",
                                       "sequence",
                                       "model_repository",
                                       "model_repository(unload_dependents)",
                                       "schedule_policy",
                                       "model_configuration",
                                       "system_shared_memory",
                                       "cuda_shared_memory",
                                       "binary_tensor_data",
                                       "parameters",
                                       "statistics",
                                       "trace",
                                       "logging"};
    json_t *ext = json_array();
    for (size_t i = 0; i < ARRAY_LEN(extensions); i++)
        json_array_append_new(ext, json_string(extensions[i]));
    return dump(json_pack("{s:s,s:s,s:o}", "name", s->server_id, "version", NEREID_VERSION,
                          "extensions", ext),
                json_out);
}

static json_t *io_json(const model_io_t *ios, size_t n, bool batching)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *shape = json_array();
        if (batching) json_array_append_new(shape, json_integer(-1));
        for (size_t d = 0; d < ios[i].rank; d++)
            json_array_append_new(shape, json_integer(ios[i].dims[d]));
        json_array_append_new(arr,
                              json_pack("{s:s,s:s,s:o}", "name", ios[i].name, "datatype",
                                        nereid_datatype_name(ios[i].datatype), "shape", shape));
    }
    return arr;
}

nereid_error_t *nereid_server_model_metadata(nereid_server_t *s, const char *model, int64_t version,
                                             char **json_out)
{
    *json_out = NULL;
    pthread_rwlock_rdlock(&s->lock);
    model_t *m;
    model_entry_t *e;
    nereid_error_t *err = lookup_locked(s, NULL, model, version, &m, &e);
    if (err) {
        pthread_rwlock_unlock(&s->lock);
        return err;
    }
    json_t *versions = json_array();
    char buf[32];
    if (version > 0) {
        snprintf(buf, sizeof buf, "%" PRId64, version);
        json_array_append_new(versions, json_string(buf));
    } else {
        for (size_t v = 0; v < e->n_versions; v++)
            if (e->versions[v].state == MODEL_READY) {
                snprintf(buf, sizeof buf, "%" PRId64, e->versions[v].version);
                json_array_append_new(versions, json_string(buf));
            }
    }
    pthread_rwlock_unlock(&s->lock);
    const char *platform = m->config->platform[0] ? m->config->platform : m->config->backend;
    bool batching = m->max_batch_size > 0;
    json_t *doc =
        json_pack("{s:s,s:o,s:s,s:o,s:o}", "name", m->name, "versions", versions, "platform",
                  platform, "inputs", io_json(m->inputs, m->n_inputs, batching), "outputs",
                  io_json(m->outputs, m->n_outputs, batching));
    model_unref(m);
    return dump(doc, json_out);
}

nereid_error_t *nereid_server_model_config(nereid_server_t *s, const char *model, int64_t version,
                                           char **json_out)
{
    *json_out = NULL;
    model_t *m;
    nereid_error_t *err = server_lookup_model(s, model, version, &m);
    if (err) return err;
    *json_out = xstrdup(m->config_json);
    model_unref(m);
    return NULL;
}

nereid_error_t *nereid_server_model_config_proto(nereid_server_t *s, const char *model,
                                                 int64_t version, void **bytes_out,
                                                 size_t *byte_size_out)
{
    *bytes_out = NULL;
    *byte_size_out = 0;
    model_t *m;
    nereid_error_t *err = server_lookup_model(s, model, version, &m);
    if (err) return err;
    size_t n = inference__model_config__get_packed_size(m->config);
    uint8_t *buf = xmalloc(n);
    inference__model_config__pack(m->config, buf);
    *bytes_out = buf;
    *byte_size_out = n;
    model_unref(m);
    return NULL;
}

/* Triton's Model::IsReady: every instance answers the backend's
 * readiness check (nereid_backend_instance_ready, when it has one). */
static bool model_instances_ready(model_t *m)
{
    if (atomic_load(&m->wedged)) {
        LOG_VERBOSE("Model '%s' version %" PRId64 " is not ready: not making progress", m->name,
                    m->version);
        return false;
    }
    if (!m->backend || !m->backend->instance_ready) return true;
    /* A hold keeps the instances from being finalized meanwhile (an unload
     * that started first is seen through m->unloading: not ready). */
    model_ref(m);
    model_hold(m);
    bool ready = !atomic_load(&m->unloading);
    for (size_t i = 0; ready && i < m->n_instances; i++) {
        /* a READY model's instances are all initialized (retired ones are
         * finalized: not asked) */
        model_instance_t *inst = m->instances[i];
        if (atomic_load(&inst->retired)) continue;
        nereid_error_t *err = m->backend->instance_ready((nereid_instance_t *)inst);
        if (err) {
            LOG_VERBOSE("Model '%s' version %" PRId64 " is not ready: %s", m->name, m->version,
                        nereid_error_message(err));
            nereid_error_free(err);
            ready = false;
        }
    }
    model_release(m); /* the hold and its reference */
    return ready;
}

nereid_error_t *server_exit_refusal(nereid_server_t *s)
{
    if (atomic_load(&s->stopping) || atomic_load(&s->exiting))
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready");
    return NULL;
}

nereid_error_t *nereid_server_model_is_ready(nereid_server_t *s, const char *model, int64_t version,
                                             bool *ready_out)
{
    *ready_out = false;
    nereid_error_t *refused = server_exit_refusal(s);
    if (refused) return refused;
    model_t *m;
    nereid_error_t *err = server_lookup_model(s, model, version, &m);
    if (err) {
        if (nereid_error_code(err) == NEREID_ERROR_UNAVAILABLE) {
            nereid_error_free(err);
            return NULL;
        }
        return err;
    }
    *ready_out = model_instances_ready(m);
    model_unref(m);
    return NULL;
}

nereid_error_t *nereid_server_model_statistics(nereid_server_t *s, const char *model,
                                               int64_t version, char **json_out)
{
    *json_out = NULL;
    json_t *arr = json_array();
    pthread_rwlock_rdlock(&s->lock);
    if (model && *model) {
        nereid_error_t *ambiguous = NULL;
        model_entry_t *e = repository_resolve(s, NULL, model, &ambiguous);
        if (ambiguous) {
            pthread_rwlock_unlock(&s->lock);
            json_decref(arr);
            return ambiguous;
        }
        model_t *m = NULL;
        nereid_error_t *err = e ? lookup_locked(s, NULL, model, version, &m, NULL) : NULL;
        if (!e || (err && version <= 0)) {
            nereid_error_free(err);
            pthread_rwlock_unlock(&s->lock);
            json_decref(arr);
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "requested model '%s' is not available", model);
        }
        if (err) {
            nereid_error_free(err);
            pthread_rwlock_unlock(&s->lock);
            json_decref(arr);
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "requested model version is not available for model '%s'",
                                    model);
        }
        if (version > 0) {
            json_array_append_new(arr, stats_model_json(m));
        } else {
            for (size_t v = 0; v < e->n_versions; v++)
                if (e->versions[v].state == MODEL_READY)
                    json_array_append_new(arr, stats_model_json(e->versions[v].model));
        }
        model_unref(m);
    } else {
        for (size_t i = 0; i < s->n_models; i++)
            for (size_t v = 0; v < s->models[i]->n_versions; v++)
                if (s->models[i]->versions[v].state == MODEL_READY)
                    json_array_append_new(arr, stats_model_json(s->models[i]->versions[v].model));
    }
    pthread_rwlock_unlock(&s->lock);
    return dump(json_pack("{s:o}", "model_stats", arr), json_out);
}

/* Triton's index order with --model-namespacing: by namespace, then name. */
static int cmp_ns_entry(const void *a, const void *b)
{
    const model_entry_t *x = *(model_entry_t *const *)a, *y = *(model_entry_t *const *)b;
    int c = strcmp(x->ns ? x->ns : "", y->ns ? y->ns : "");
    return c ? c : strcmp(x->name, y->name);
}

nereid_error_t *nereid_server_repository_index(nereid_server_t *s, bool ready_only, char **json_out)
{
    *json_out = NULL;
    nereid_error_t *refused = server_exit_refusal(s);
    if (refused) return refused;
    json_t *arr = json_array();
    pthread_rwlock_rdlock(&s->lock);
    model_entry_t **order = s->models;
    if (s->opts.model_namespacing && s->n_models) {
        order = xmalloc(s->n_models * sizeof *order);
        memcpy(order, s->models, s->n_models * sizeof *order);
        qsort(order, s->n_models, sizeof *order, cmp_ns_entry);
    }
    for (size_t i = 0; i < s->n_models; i++) {
        model_entry_t *e = order[i];
        if (e->removed) continue; /* Triton's index lists what is on disk */
        if (e->state == MODEL_UNKNOWN_STATE) {
            if (!ready_only) json_array_append_new(arr, json_pack("{s:s}", "name", e->name));
            continue;
        }
        if (e->n_versions == 0) {
            if (ready_only && e->state != MODEL_READY) continue;
            json_t *o =
                json_pack("{s:s,s:s}", "name", e->name, "state", model_state_text(e->state));
            if (e->reason) json_object_set_new(o, "reason", json_string(e->reason));
            json_array_append_new(arr, o);
            continue;
        }
        for (size_t v = 0; v < e->n_versions; v++) {
            version_entry_t *ve = &e->versions[v];
            if (ready_only && ve->state != MODEL_READY) continue;
            char buf[32];
            snprintf(buf, sizeof buf, "%" PRId64, ve->version);
            json_t *o = json_pack("{s:s,s:s,s:s}", "name", e->name, "version", buf, "state",
                                  model_state_text(ve->state));
            if (ve->reason) json_object_set_new(o, "reason", json_string(ve->reason));
            json_array_append_new(arr, o);
        }
    }
    if (order != s->models) free(order);
    pthread_rwlock_unlock(&s->lock);
    return dump(arr, json_out);
}

/* ---- Metrics ---- */

/* Each loaded model's measured bytes (an extension: a nereid_ name).
 * Caller holds s->lock. */
static void model_memory_text(FILE *out, nereid_server_t *s)
{
    fprintf(out, "# HELP nereid_model_memory_bytes Resident memory the model's last load added "
                 "to the process (a load no other load overlapped)\n# TYPE "
                 "nereid_model_memory_bytes gauge\n");
    for (size_t i = 0; i < s->n_models; i++)
        if (s->models[i]->memory_bytes > 0 && s->models[i]->state == MODEL_READY)
            fprintf(out, "nereid_model_memory_bytes{model=\"%s\"} %lld\n", s->models[i]->name,
                    s->models[i]->memory_bytes);
}

/* Load on demand's counters (an extension: nereid_ names). Caller holds
 * s->lock. */
static void on_demand_metrics_text(FILE *out, nereid_server_t *s)
{
    const struct {
        const char *name, *help;
        uint64_t value;
    } counters[] = {
        {"nereid_model_on_demand_loads_total",
         "Models loaded on a request (--model-load-on-demand)", atomic_load(&s->on_demand_loads)},
        {"nereid_model_on_demand_load_failures_total", "On-demand loads that failed",
         atomic_load(&s->on_demand_load_failures)},
        {"nereid_model_on_demand_evictions_total", "Models unloaded to fit --model-memory-budget",
         atomic_load(&s->on_demand_evictions)},
        {"nereid_model_on_demand_load_duration_us_total",
         "Cumulative time spent in on-demand loads, in microseconds",
         atomic_load(&s->on_demand_load_ns) / 1000},
    };
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++)
        fprintf(out, "# HELP %s %s\n# TYPE %s counter\n%s %" PRIu64 "\n", counters[i].name,
                counters[i].help, counters[i].name, counters[i].name, counters[i].value);
    if (s->opts.model_memory_budget_bytes <= 0) return;
    fprintf(out,
            "# HELP nereid_model_memory_budget_bytes --model-memory-budget\n# TYPE "
            "nereid_model_memory_budget_bytes gauge\nnereid_model_memory_budget_bytes %lld\n"
            "# HELP nereid_model_memory_pinned_bytes Measured memory of the models loaded "
            "explicitly (--load-model, load API), which are never evicted\n# TYPE "
            "nereid_model_memory_pinned_bytes gauge\nnereid_model_memory_pinned_bytes %lld\n",
            s->opts.model_memory_budget_bytes, repository_pinned_bytes(s));
}

nereid_error_t *nereid_server_metrics(nereid_server_t *s, char **text_out)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    if (!out) return nereid_error_new(NEREID_ERROR_INTERNAL, "unable to build metrics");
    pthread_rwlock_rdlock(&s->lock);
    size_t n = 0;
    for (size_t i = 0; i < s->n_models; i++)
        n += s->models[i]->n_versions;
    const model_t **models = xcalloc(n ? n : 1, sizeof *models);
    size_t k = 0;
    for (size_t i = 0; i < s->n_models; i++)
        for (size_t v = 0; v < s->models[i]->n_versions; v++)
            if (s->models[i]->versions[v].model) models[k++] = s->models[i]->versions[v].model;
    stats_metrics_text(out, models, k, s->opts.metrics_counter_latencies,
                       s->opts.metrics_histogram_latencies);
    if (s->opts.model_progress_timeout_secs > 0) stats_progress_text(out, models, k);
    /* Triton's pinned memory gauges (always present when metrics are on;
     * no CUDA here, so nothing is ever allocated from the pool). */
    fprintf(out,
            "# HELP nv_pinned_memory_pool_total_bytes Pinned memory pool total memory size, in "
            "bytes\n# TYPE nv_pinned_memory_pool_total_bytes gauge\n"
            "nv_pinned_memory_pool_total_bytes %llu\n"
            "# HELP nv_pinned_memory_pool_used_bytes Pinned memory pool used memory size, in "
            "bytes\n# TYPE nv_pinned_memory_pool_used_bytes gauge\n"
            "nv_pinned_memory_pool_used_bytes 0\n",
            (unsigned long long)s->opts.pinned_memory_pool_byte_size);
    cache_metrics_text(out, s->cache);
    if (s->opts.model_load_on_demand) on_demand_metrics_text(out, s);
    if (s->opts.model_load_on_demand || s->opts.metrics_model_memory) model_memory_text(out, s);
    custom_metrics_text(out);
    pthread_rwlock_unlock(&s->lock);
    free(models);
    fclose(out);
    *text_out = buf;
    return NULL;
}

void server_enable_latency_metrics(model_t *m)
{
    /* Triton's default quantiles (MetricReporterConfig::quantiles_). */
    static const double defaults[] = {0.5, 0.9, 0.95, 0.99, 0.999};
    const nereid_server_options_t *o = &m->server->opts;
    if (o->metrics_histogram_latencies) stats_enable_histograms(m);
    if (!o->metrics_summary_latencies) return;
    if (o->n_metrics_summary_quantiles)
        stats_enable_summaries(m, o->metrics_summary_quantiles, o->n_metrics_summary_quantiles);
    else
        stats_enable_summaries(m, defaults, ARRAY_LEN(defaults));
}
