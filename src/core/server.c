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

#include "core/core.h"
#include "core/model.h"
#include "core/stats.h"
#include "core/util.h"
#include "sched/scheduler.h"

#define NEREID_VERSION "0.1.0"

typedef struct version_entry {
    int64_t version;
    model_state_t state;
    char *reason;
    model_t *model; /* READY: the loaded model (one reference) */
} version_entry_t;

typedef struct model_entry {
    char *name;
    char *dir;
    model_config_t *config; /* normalized, NULL if the config failed */
    model_state_t state;    /* model-level: UNAVAILABLE when config/versions failed */
    char *reason;
    version_entry_t *versions;
    size_t n_versions;
} model_entry_t;

struct nereid_server {
    char **repos;
    size_t n_repos;
    char *backend_dir;
    char *server_id;
    nereid_server_options_t opts;
    pthread_rwlock_t lock; /* guards models and every entry's versions */
    model_entry_t *models;
    size_t n_models;
    _Atomic bool stopping;
    _Atomic bool stopped;
};

void nereid_server_options_init(nereid_server_options_t *o)
{
    memset(o, 0, sizeof *o);
    o->model_control_mode = NEREID_MODEL_CONTROL_NONE;
    o->repository_poll_secs = 15;
    o->exit_on_error = true;
    o->strict_readiness = true;
    o->server_id = "triton";
    o->model_load_thread_count = 4;
}

/* ---- Repository scanning ---- */

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Numeric subdirectories of dir, ascending. */
static size_t list_versions(const char *dir, int64_t **out)
{
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d) return 0;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *s = e->d_name;
        if (!*s) continue;
        bool numeric = true;
        for (const char *p = s; *p; p++)
            numeric &= isdigit((unsigned char)*p) != 0;
        if (!numeric || strlen(s) > 18) continue;
        char *path = xasprintf("%s/%s", dir, s);
        bool ok = is_dir(path);
        free(path);
        if (!ok) continue;
        *out = xrealloc(*out, (n + 1) * sizeof **out);
        (*out)[n++] = strtoll(s, NULL, 10);
    }
    closedir(d);
    if (n) qsort(*out, n, sizeof **out, cmp_i64);
    return n;
}

/* Replaces a protobuf-c string field (which may hold the static empty string). */
static void set_pb_string(char **field, const char *value)
{
    if (*field && *field != protobuf_c_empty_string) free(*field);
    *field = xstrdup(value);
}

/* Infers platform/backend from the files of the first version directory. */
static void infer_platform(model_config_t *cfg, const char *dir)
{
    if (cfg->platform[0] || cfg->backend[0]) return;
    int64_t *versions;
    size_t n = list_versions(dir, &versions);
    static const struct {
        const char *file, *platform, *backend;
    } known[] = {{"model.onnx", "onnxruntime_onnx", "onnxruntime"},
                 {"model.pt", "pytorch_libtorch", "pytorch"}};
    for (size_t v = n; v-- > 0;) {
        for (size_t k = 0; k < ARRAY_LEN(known); k++) {
            char *path = xasprintf("%s/%" PRId64 "/%s", dir, versions[v], known[k].file);
            bool found = is_file(path) || is_dir(path);
            free(path);
            if (found) {
                set_pb_string(&cfg->platform, known[k].platform);
                set_pb_string(&cfg->backend, known[k].backend);
                free(versions);
                return;
            }
        }
    }
    free(versions);
}

static char *entry_error(model_entry_t *e, char *errors)
{
    char *msg = xstrdup(errors ? errors : "unknown error");
    size_t len = strlen(msg);
    while (len && msg[len - 1] == '\n')
        msg[--len] = 0;
    free(errors);
    (void)e;
    return msg;
}

/* Reads and normalizes the entry's config; sets state/reason on failure. */
static void entry_read_config(nereid_server_t *s, model_entry_t *e)
{
    char *path = xasprintf("%s/config.pbtxt", e->dir);
    char *errors = NULL;
    model_config_t *cfg = NULL;
    if (is_file(path)) {
        cfg = config_parse_file(path, &errors);
    } else if (s->opts.strict_model_config) {
        errors = xasprintf("%s: config.pbtxt not found and --strict-model-config is true", path);
    } else {
        cfg = config_from_json("{}", 2, &errors);
    }
    if (cfg) {
        if (!cfg->name[0]) set_pb_string(&cfg->name, e->name);
        infer_platform(cfg, e->dir);
        bool autofill = !s->opts.strict_model_config && !s->opts.disable_auto_complete_config;
        config_options_t opts = {.gpus_available = false, .allow_missing_io = autofill};
        if (config_normalize(cfg, e->name, path, &opts, &errors) != 0) {
            config_free(cfg);
            cfg = NULL;
        }
    }
    free(path);
    if (!cfg) {
        e->state = MODEL_UNAVAILABLE;
        char *msg = entry_error(e, errors);
        e->reason = xasprintf("Invalid argument: %s", msg);
        LOG_ERROR("repository", "failed to load '%s': %s", e->name, msg);
        free(msg);
        return;
    }
    e->config = cfg;
}

/* Which versions the policy selects from those on disk. */
static size_t select_versions(const model_config_t *cfg, const int64_t *avail, size_t n,
                              int64_t *out)
{
    const Inference__ModelVersionPolicy *p = cfg->version_policy;
    size_t k = 0;
    if (p && p->policy_choice_case == INFERENCE__MODEL_VERSION_POLICY__POLICY_CHOICE_ALL) {
        for (size_t i = 0; i < n; i++)
            out[k++] = avail[i];
    } else if (p &&
               p->policy_choice_case == INFERENCE__MODEL_VERSION_POLICY__POLICY_CHOICE_SPECIFIC) {
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < p->specific->n_versions; j++)
                if (p->specific->versions[j] == avail[i]) {
                    out[k++] = avail[i];
                    break;
                }
    } else {
        size_t want = 1;
        if (p && p->policy_choice_case == INFERENCE__MODEL_VERSION_POLICY__POLICY_CHOICE_LATEST &&
            p->latest->num_versions > 0)
            want = p->latest->num_versions;
        for (size_t i = n > want ? n - want : 0; i < n; i++)
            out[k++] = avail[i];
    }
    return k;
}

static void entry_load_versions(nereid_server_t *s, model_entry_t *e)
{
    if (!e->config) return;
    int64_t *avail;
    size_t n = list_versions(e->dir, &avail);
    int64_t *chosen = xcalloc(n ? n : 1, sizeof *chosen);
    size_t k = select_versions(e->config, avail, n, chosen);
    free(avail);
    if (k == 0) {
        e->state = MODEL_UNAVAILABLE;
        e->reason = xasprintf("Internal: failed to load '%s', no version is available", e->name);
        LOG_ERROR("repository", "failed to load '%s', no version is available", e->name);
        free(chosen);
        return;
    }
    e->versions = xcalloc(k, sizeof *e->versions);
    e->n_versions = k;
    bool any_ready = false;
    for (size_t i = 0; i < k; i++) {
        version_entry_t *v = &e->versions[i];
        v->version = chosen[i];
        v->state = MODEL_LOADING;
        model_load_args_t args = {
            .name = e->name,
            .dir = e->dir,
            .version = chosen[i],
            .config = e->config,
            .backend_dir = s->backend_dir,
            .autocomplete_allowed =
                !s->opts.strict_model_config && !s->opts.disable_auto_complete_config,
        };
        model_t *m = NULL;
        nereid_error_t *err = model_load(s, &args, &m);
        if (err) {
            v->state = MODEL_UNAVAILABLE;
            v->reason = xasprintf("%s: %s", nereid_error_code_name(nereid_error_code(err)),
                                  nereid_error_message(err));
            LOG_ERROR("repository", "failed to load '%s' version %" PRId64 ": %s", e->name,
                      chosen[i], v->reason);
            nereid_error_free(err);
        } else {
            v->model = m;
            v->state = MODEL_READY;
            any_ready = true;
            LOG_INFO("repository", "successfully loaded '%s' version %" PRId64, e->name, chosen[i]);
        }
    }
    free(chosen);
    e->state = any_ready ? MODEL_READY : MODEL_UNAVAILABLE;
}

static void entry_free(model_entry_t *e)
{
    for (size_t i = 0; i < e->n_versions; i++) {
        if (e->versions[i].model) model_unload(e->versions[i].model);
        free(e->versions[i].reason);
    }
    free(e->versions);
    if (e->config) config_free(e->config);
    free(e->name);
    free(e->dir);
    free(e->reason);
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const model_entry_t *)a)->name, ((const model_entry_t *)b)->name);
}

static nereid_error_t *scan_repositories(nereid_server_t *s)
{
    for (size_t r = 0; r < s->n_repos; r++) {
        DIR *d = opendir(s->repos[r]);
        if (!d)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "failed to open model repository '%s': %s", s->repos[r],
                                    strerror(errno));
        struct dirent *de;
        while ((de = readdir(d))) {
            if (de->d_name[0] == '.') continue;
            char *dir = xasprintf("%s/%s", s->repos[r], de->d_name);
            if (!is_dir(dir)) {
                free(dir);
                continue;
            }
            model_entry_t *dup = NULL;
            for (size_t i = 0; i < s->n_models; i++)
                if (strcmp(s->models[i].name, de->d_name) == 0) dup = &s->models[i];
            if (dup) {
                dup->state = MODEL_UNAVAILABLE;
                free(dup->reason);
                dup->reason = xstrdup("model appears in two or more repositories");
                free(dir);
                continue;
            }
            s->models = xrealloc(s->models, (s->n_models + 1) * sizeof *s->models);
            model_entry_t *e = &s->models[s->n_models++];
            memset(e, 0, sizeof *e);
            e->name = xstrdup(de->d_name);
            e->dir = dir;
            e->state = MODEL_LOADING;
        }
        closedir(d);
    }
    if (s->n_models) qsort(s->models, s->n_models, sizeof *s->models, cmp_entry);
    return NULL;
}

/* Whether the entry is to be loaded at start-up. */
static bool should_load(nereid_server_t *s, const model_entry_t *e)
{
    if (e->state == MODEL_UNAVAILABLE) return false;
    if (s->opts.model_control_mode != NEREID_MODEL_CONTROL_EXPLICIT) return true;
    for (size_t i = 0; i < s->opts.n_load_models; i++)
        if (strcmp(s->opts.load_models[i], "*") == 0 ||
            strcmp(s->opts.load_models[i], e->name) == 0)
            return true;
    return false;
}

typedef struct load_pool {
    nereid_server_t *server;
    pthread_mutex_t lock;
    size_t next;
} load_pool_t;

static void *load_worker(void *arg)
{
    load_pool_t *p = arg;
    nereid_server_t *s = p->server;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        size_t i = p->next++;
        pthread_mutex_unlock(&p->lock);
        if (i >= s->n_models) return NULL;
        model_entry_t *e = &s->models[i];
        if (!should_load(s, e)) {
            if (e->state == MODEL_LOADING) e->state = MODEL_UNKNOWN_STATE;
            continue;
        }
        entry_read_config(s, e);
        entry_load_versions(s, e);
    }
}

static void load_all(nereid_server_t *s)
{
    load_pool_t pool = {.server = s, .next = 0};
    pthread_mutex_init(&pool.lock, NULL);
    size_t n = s->opts.model_load_thread_count > 0 ? (size_t)s->opts.model_load_thread_count : 1;
    if (n > s->n_models) n = s->n_models;
    pthread_t *threads = xcalloc(n ? n : 1, sizeof *threads);
    size_t started = 0;
    for (size_t i = 0; i < n; i++)
        if (pthread_create(&threads[i], NULL, load_worker, &pool) == 0) started++;
    if (started == 0) load_worker(&pool);
    for (size_t i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    free(threads);
    pthread_mutex_destroy(&pool.lock);
}

/* ---- Server lifecycle ---- */

nereid_error_t *nereid_server_new(const nereid_server_options_t *opts, nereid_server_t **out)
{
    *out = NULL;
    if (!opts || opts->n_model_repositories == 0)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "--model-repository must be specified");
    nereid_server_t *s = xcalloc(1, sizeof *s);
    s->opts = *opts;
    s->n_repos = opts->n_model_repositories;
    s->repos = xcalloc(s->n_repos, sizeof *s->repos);
    for (size_t i = 0; i < s->n_repos; i++) {
        char *real = realpath(opts->model_repositories[i], NULL);
        s->repos[i] = real ? real : xstrdup(opts->model_repositories[i]);
    }
    s->backend_dir =
        xstrdup(opts->backend_directory && opts->backend_directory[0] ? opts->backend_directory
                                                                      : NEREID_DEFAULT_BACKEND_DIR);
    s->server_id = xstrdup(opts->server_id ? opts->server_id : "triton");
    s->opts.load_models = NULL;
    s->opts.model_repositories = NULL;
    log_verbose_level = opts->log_verbose;
    pthread_rwlock_init(&s->lock, NULL);
    nereid_error_t *err = scan_repositories(s);
    if (err) {
        nereid_server_free(s);
        return err;
    }
    s->opts.load_models = opts->load_models;
    load_all(s);
    s->opts.load_models = NULL;
    if (opts->exit_on_error) {
        for (size_t i = 0; i < s->n_models; i++) {
            model_entry_t *e = &s->models[i];
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
    *out = s;
    return NULL;
}

void nereid_server_stop(nereid_server_t *s)
{
    if (atomic_exchange(&s->stopping, true)) return;
    pthread_rwlock_wrlock(&s->lock);
    for (size_t i = 0; i < s->n_models; i++)
        entry_free(&s->models[i]);
    free(s->models);
    s->models = NULL;
    s->n_models = 0;
    pthread_rwlock_unlock(&s->lock);
    atomic_store(&s->stopped, true);
}

void nereid_server_free(nereid_server_t *s)
{
    if (!s) return;
    nereid_server_stop(s);
    for (size_t i = 0; i < s->n_repos; i++)
        free(s->repos[i]);
    free(s->repos);
    free(s->backend_dir);
    free(s->server_id);
    pthread_rwlock_destroy(&s->lock);
    free(s);
}

bool nereid_server_is_live(nereid_server_t *s)
{
    return s && !atomic_load(&s->stopping);
}

bool nereid_server_is_ready(nereid_server_t *s)
{
    if (!s || atomic_load(&s->stopping)) return false;
    if (!s->opts.strict_readiness) return true;
    bool ready = true;
    pthread_rwlock_rdlock(&s->lock);
    for (size_t i = 0; i < s->n_models && ready; i++) {
        const model_entry_t *e = &s->models[i];
        if (e->state == MODEL_UNKNOWN_STATE) continue;
        for (size_t v = 0; v < e->n_versions; v++)
            ready &= e->versions[v].state == MODEL_READY;
        ready &= e->state == MODEL_READY;
    }
    pthread_rwlock_unlock(&s->lock);
    return ready;
}

/* ---- Lookup ---- */

static model_entry_t *find_entry(nereid_server_t *s, const char *name)
{
    for (size_t i = 0; i < s->n_models; i++)
        if (strcmp(s->models[i].name, name) == 0) return &s->models[i];
    return NULL;
}

/* Resolves model/version (<= 0: latest ready) and takes a reference.
 * Caller holds the read lock. */
static nereid_error_t *lookup_locked(nereid_server_t *s, const char *name, int64_t version,
                                     model_t **out)
{
    *out = NULL;
    model_entry_t *e = find_entry(s, name);
    if (!e || e->state == MODEL_UNKNOWN_STATE)
        return nereid_error_new(NEREID_ERROR_NOT_FOUND,
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
    model_ref(*out);
    return NULL;
}

nereid_error_t *server_lookup_model(nereid_server_t *s, const char *name, int64_t version,
                                    model_t **out)
{
    if (atomic_load(&s->stopping)) {
        *out = NULL;
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready");
    }
    pthread_rwlock_rdlock(&s->lock);
    nereid_error_t *err = lookup_locked(s, name, version, out);
    pthread_rwlock_unlock(&s->lock);
    return err;
}

/* ---- Inference ---- */

nereid_error_t *nereid_server_infer_async(nereid_server_t *s, nereid_request_t *req,
                                          const nereid_response_allocator_t *allocator,
                                          nereid_complete_fn done_fn, void *done_userp)
{
    if (!req || !done_fn)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "request and callback are required");
    if (req->model)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "request was already submitted");
    model_t *m;
    nereid_error_t *err = server_lookup_model(s, req->model_name, req->version_req, &m);
    if (err) return err;
    req->model = m;
    err = request_validate(req, m);
    if (err) goto fail;
    uint64_t now = util_now_ns();
    req->t_request_ns = now;
    req->t_queue_start_ns = now;
    req->t_compute_start_ns = 0;
    if (allocator)
        req->alloc = *allocator;
    else
        memset(&req->alloc, 0, sizeof req->alloc);
    req->done_fn = done_fn;
    req->done_userp = done_userp;
    request_prepare_response(req);
    err = m->sched->ops->enqueue(m->sched, req);
    if (err) {
        atomic_fetch_add(&m->stats.failures[FAILURE_REJECTED], 1);
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
    static const char *extensions[] = {"classification",     "sequence",
                                       "model_repository",   "model_repository(unload_dependents)",
                                       "schedule_policy",    "model_configuration",
                                       "binary_tensor_data", "parameters",
                                       "statistics"};
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
    nereid_error_t *err = lookup_locked(s, model, version, &m);
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
        model_entry_t *e = find_entry(s, model);
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

nereid_error_t *nereid_server_model_is_ready(nereid_server_t *s, const char *model, int64_t version,
                                             bool *ready_out)
{
    *ready_out = false;
    model_t *m;
    nereid_error_t *err = server_lookup_model(s, model, version, &m);
    if (err) {
        if (nereid_error_code(err) == NEREID_ERROR_UNAVAILABLE) {
            nereid_error_free(err);
            return NULL;
        }
        return err;
    }
    *ready_out = true;
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
        model_entry_t *e = find_entry(s, model);
        model_t *m = NULL;
        nereid_error_t *err = e ? lookup_locked(s, model, version, &m) : NULL;
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
            for (size_t v = 0; v < s->models[i].n_versions; v++)
                if (s->models[i].versions[v].state == MODEL_READY)
                    json_array_append_new(arr, stats_model_json(s->models[i].versions[v].model));
    }
    pthread_rwlock_unlock(&s->lock);
    return dump(json_pack("{s:o}", "model_stats", arr), json_out);
}

static const char *state_name(model_state_t st)
{
    switch (st) {
    case MODEL_READY:
        return "READY";
    case MODEL_UNAVAILABLE:
        return "UNAVAILABLE";
    case MODEL_LOADING:
        return "LOADING";
    case MODEL_UNLOADING:
        return "UNLOADING";
    default:
        return "UNKNOWN";
    }
}

nereid_error_t *nereid_server_repository_index(nereid_server_t *s, bool ready_only, char **json_out)
{
    json_t *arr = json_array();
    pthread_rwlock_rdlock(&s->lock);
    for (size_t i = 0; i < s->n_models; i++) {
        model_entry_t *e = &s->models[i];
        if (e->state == MODEL_UNKNOWN_STATE) {
            if (!ready_only) json_array_append_new(arr, json_pack("{s:s}", "name", e->name));
            continue;
        }
        if (e->n_versions == 0) {
            if (ready_only && e->state != MODEL_READY) continue;
            json_t *o = json_pack("{s:s,s:s}", "name", e->name, "state", state_name(e->state));
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
                                  state_name(ve->state));
            if (ve->reason) json_object_set_new(o, "reason", json_string(ve->reason));
            json_array_append_new(arr, o);
        }
    }
    pthread_rwlock_unlock(&s->lock);
    return dump(arr, json_out);
}

/* ---- Metrics ---- */

static void cpu_metrics(FILE *out)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static unsigned long long last_total, last_idle;
    unsigned long long v[10] = {0}, total = 0, idle;
    FILE *f = fopen("/proc/stat", "r");
    if (f) {
        if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                   &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9]) < 4)
            memset(v, 0, sizeof v);
        fclose(f);
    }
    for (int i = 0; i < 8; i++)
        total += v[i];
    idle = v[3] + v[4];
    pthread_mutex_lock(&lock);
    double util = 0;
    if (total > last_total && last_total)
        util = 1.0 - (double)(idle - last_idle) / (double)(total - last_total);
    last_total = total;
    last_idle = idle;
    pthread_mutex_unlock(&lock);
    unsigned long long mem_total = 0, mem_avail = 0;
    f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f)) {
            sscanf(line, "MemTotal: %llu kB", &mem_total);
            sscanf(line, "MemAvailable: %llu kB", &mem_avail);
        }
        fclose(f);
    }
    fprintf(out,
            "# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]\n"
            "# TYPE nv_cpu_utilization gauge\nnv_cpu_utilization %g\n"
            "# HELP nv_cpu_memory_total_bytes CPU total memory (RAM), in bytes\n"
            "# TYPE nv_cpu_memory_total_bytes gauge\nnv_cpu_memory_total_bytes %llu\n"
            "# HELP nv_cpu_memory_used_bytes CPU used memory (RAM), in bytes\n"
            "# TYPE nv_cpu_memory_used_bytes gauge\nnv_cpu_memory_used_bytes %llu\n",
            util < 0 ? 0 : util, mem_total * 1024, (mem_total - mem_avail) * 1024);
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
        n += s->models[i].n_versions;
    const model_t **models = xcalloc(n ? n : 1, sizeof *models);
    size_t k = 0;
    for (size_t i = 0; i < s->n_models; i++)
        for (size_t v = 0; v < s->models[i].n_versions; v++)
            if (s->models[i].versions[v].model) models[k++] = s->models[i].versions[v].model;
    stats_metrics_text(out, models, k);
    pthread_rwlock_unlock(&s->lock);
    free(models);
    cpu_metrics(out);
    fclose(out);
    *text_out = buf;
    return NULL;
}

/* ---- Model control (explicit mode lands with model management) ---- */

nereid_error_t *nereid_server_load_model(nereid_server_t *s, const char *model,
                                         const char *config_json, const char *const *file_paths,
                                         const void *const *file_contents, const size_t *file_sizes,
                                         size_t n_files)
{
    (void)model, (void)config_json, (void)file_paths, (void)file_contents, (void)file_sizes,
        (void)n_files;
    if (s->opts.model_control_mode != NEREID_MODEL_CONTROL_EXPLICIT)
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                                "explicit model load / unload is not allowed if polling is "
                                "enabled");
    return nereid_error_new(NEREID_ERROR_UNSUPPORTED, "model load is not supported yet");
}

nereid_error_t *nereid_server_unload_model(nereid_server_t *s, const char *model,
                                           bool unload_dependents)
{
    (void)model, (void)unload_dependents;
    if (s->opts.model_control_mode != NEREID_MODEL_CONTROL_EXPLICIT)
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                                "explicit model load / unload is not allowed if polling is "
                                "enabled");
    return nereid_error_new(NEREID_ERROR_UNSUPPORTED, "model unload is not supported yet");
}
