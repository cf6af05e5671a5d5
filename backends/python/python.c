/*
 * This file contains the python backend's entry points: Triton's Python
 * backend for `backend: "python"` models (a model.py with class
 * TritonPythonModel) and Python-based backends. It keeps the backend's
 * settings (--backend-config=python,...), its log, and the life of models
 * and instances: model init (EXECUTION_ENV_PATH, auto_complete_config in a
 * first worker), instance init and fini (INIT, FINALIZE). The rest lives
 * in one file per job, all sharing python_internal.h:
 *   python_wire.{h,c}   the wire format both sides agree on, and its codec
 *   python_worker.c     starting and ending a worker process; the zygote
 *   python_reader.c     reading the worker's socket; the reader thread
 *   python_spin.c       spin-wait for the worker's answer
 *   python_execute.c    execute: EXECUTE out, DONE and responses back
 *   python_body.c       request bodies in shared memory
 *   python_bls.c        BLS: a worker's request into any model
 *   python_services.c   pb_utils logging, cancellation, model control,
 *                       metrics (python_api.c) and is_ready()
 *   python_env.c        EXECUTION_ENV_PATH archives
 *
 * Every model instance runs its model.py in a worker process of its own
 * (Debian's python3 running nereid_python_stub.py, which ships next to this
 * library with the nereid_stub package), so instances run in parallel and a
 * crash, os._exit or leak in model code stays in the worker. A worker that
 * dies fails the requests it held; the next execute starts a new one.
 *
 * Threads: each worker has a reader thread that receives its messages
 * between executes; during one, execute's thread reads the socket itself
 * (python_reader.c). Replies the instance thread waits for (ready, execute
 * done, finalized) reach it through a one-slot mailbox; decoupled
 * responses, BLS calls, log lines and cancellation checks are served on
 * the reading thread itself. BLS completions arrive on Nereid's threads
 * and write to the socket under the channel's send lock.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nereid/backend.h"
#include "python_env.h"
#include "python_internal.h"

NEREID_EXPORT uint32_t nereid_backend_abi_version(void)
{
    return NEREID_BACKEND_ABI_VERSION;
}

/* ---- Backend settings ---- */

backend_state_t *g_backend; /* one python backend per process */

/* --backend-config=python,<key>=<value> (or a global --backend-config). */
static const char *backend_config(nereid_backend_t *b, const char *key)
{
    return nereid_backend_config(b, key);
}

NEREID_EXPORT nereid_error_t *nereid_backend_init(nereid_backend_t *backend)
{
    backend_state_t *st = calloc(1, sizeof *st);
    if (!st) return nereid_error_new(NEREID_ERROR_INTERNAL, "python backend: out of memory");
    Dl_info info;
    char dir[PATH_MAX] = ".";
    if (dladdr((void *)nereid_backend_init, &info) && info.dli_fname) {
        snprintf(dir, sizeof dir, "%s", info.dli_fname);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
    }
    const char *cands[2] = {"%s/nereid_python_stub.py", "%s/python/nereid_python_stub.py"};
    for (int i = 0; i < 2 && !st->stub; i++) {
        char path[PATH_MAX + 64];
        snprintf(path, sizeof path, cands[i], dir);
        if (access(path, R_OK) == 0) st->stub = strdup(path);
    }
    if (!st->stub) {
        free(st);
        return nereid_error_new(NEREID_ERROR_NOT_FOUND,
                                "python backend: nereid_python_stub.py not found next to %s", dir);
    }
    const char *py = backend_config(backend, "python-executable");
    if (!py) py = getenv("NEREID_PYTHON");
    st->python = strdup(py && *py ? py : "/usr/bin/python3");
    st->finalize_wait_s = FINALIZE_WAIT_S;
    /* Off unless asked for: a spin costs CPU per request (docs/python_backend.md). */
    st->spin_max_ns = SPIN_WAIT_US_DEFAULT * 1000ull;
    nereid_error_t *err = NULL;
    const char *sw = backend_config(backend, "spin-wait-us");
    if (sw) {
        char *end;
        errno = 0;
        long v = strtol(sw, &end, 10);
        if (!*sw || *end || errno || v < 0 || v > SPIN_WAIT_US_MAX)
            err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                   "python backend: spin-wait-us must be an integer from 0 to "
                                   "%d, got '%s'",
                                   SPIN_WAIT_US_MAX, sw);
        st->spin_max_ns = (uint64_t)v * 1000;
    }
    const char *rw = backend_config(backend, "restart-worker");
    st->restart = !rw || strcmp(rw, "eager") == 0 ? RESTART_EAGER
                  : strcmp(rw, "on-request") == 0 ? RESTART_ON_REQUEST
                  : strcmp(rw, "never") == 0      ? RESTART_NEVER
                                                  : -1;
    if (!err && st->restart < 0)
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "python backend: restart-worker must be 'on-request', 'never' "
                               "or 'eager', got '%s'",
                               rw);
    const char *zy = backend_config(backend, "zygote");
    if (!err && zy && strcmp(zy, "true") != 0 && strcmp(zy, "false") != 0)
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "python backend: zygote must be 'true' or 'false', got '%s'", zy);
    st->zy_off = zy && strcmp(zy, "false") == 0;
    const char *t = backend_config(backend, "stub-timeout-seconds");
    if (!err && t) {
        char *end;
        long v = strtol(t, &end, 10);
        if (*end || v <= 0)
            err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                   "stub-timeout-seconds must be a positive integer, got '%s'", t);
        st->finalize_wait_s = v;
    }
    if (err) {
        free(st->python);
        free(st->stub);
        free(st);
        return err;
    }
    pthread_mutex_init(&st->zy_mu, NULL);
    st->zy_fd = -1;
    static const char *const ignored[] = {"shm-default-byte-size",  "shm-growth-byte-size",
                                          "shm_message_queue_size", "shm-message-queue-size",
                                          "thread-pool-size",       "shm-region-prefix-name"};
    for (size_t i = 0; i < sizeof ignored / sizeof *ignored; i++)
        if (backend_config(backend, ignored[i]))
            plog('W',
                 "python backend: --backend-config=python,%s is accepted and ignored: tensors "
                 "travel in per-message memfd regions, not in a /dev/shm pool",
                 ignored[i]);
    g_backend = st;
    nereid_backend_set_state(backend, st);
    return NULL;
}

NEREID_EXPORT nereid_error_t *nereid_backend_fini(nereid_backend_t *backend)
{
    backend_state_t *st = nereid_backend_state(backend);
    if (st) {
        zygote_end(st);
        python_env_cleanup();
        pthread_mutex_destroy(&st->zy_mu);
        free(st->python);
        free(st->stub);
        free(st);
    }
    g_backend = NULL;
    return NULL;
}

/* ---- Logging (the server's format and filters) ---- */

/* Lines go through the server's log (its format, filters and --log-file):
 * the backend's own with this file's name and line, a worker's Logger
 * calls with the model file's. */
static void plog_v(nereid_log_level_t level, const char *file, int line, const char *fmt,
                   va_list ap)
{
    char text[8192];
    vsnprintf(text, sizeof text, fmt, ap);
    nereid_log_message(level, file, line, text);
}

void plog_line(char level, const char *file, int line, const char *fmt, ...)
{
    const char *base = strrchr(file, '/');
    nereid_log_level_t lv = level == 'W'   ? NEREID_LOG_WARN
                            : level == 'E' ? NEREID_LOG_ERROR
                            : level == 'V' ? NEREID_LOG_VERBOSE
                                           : NEREID_LOG_INFO;
    va_list ap;
    va_start(ap, fmt);
    plog_v(lv, base ? base + 1 : file, line, fmt, ap);
    va_end(ap);
}

/* ---- Model ---- */

static void instance_free(instance_t *in)
{
    spin_page_drop(in);
    body_forget(in);
    for (int s = 0; s < BODY_SLOTS; s++)
        region_unref(in->body.exec[s]);
    region_unref(in->exec_rx);
    region_unref(in->tx);
    rx_regions_clear(&in->rx);
    for (int i = 0; i < TX_SPARES; i++)
        region_unref(in->tx_spare[i]);
    free(in->rbuf);
    free(in->init_json);
    free(in->name);
    free(in->death);
    free(in->rq_error);
    python_api_free(in->api);
    pthread_mutex_destroy(&in->life_mu);
    pthread_mutex_destroy(&in->mu);
    pthread_cond_destroy(&in->cv);
    free(in);
}

static instance_t *instance_new(const char *name, nereid_model_t *model)
{
    instance_t *in = calloc(1, sizeof *in);
    if (!in) abort();
    in->name = strdup(name);
    in->model = model;
    in->server = nereid_model_server(model);
    in->decoupled = nereid_model_decoupled(model);
    in->pidfd = -1;
    in->epfd = -1;
    in->kickfd = -1;
    in->rbuf = malloc(RECV_MAX);
    if (!in->rbuf) abort();
    pthread_mutex_init(&in->life_mu, NULL);
    pthread_mutex_init(&in->mu, NULL);
    pthread_cond_init(&in->cv, NULL);
    in->api = python_api_new();
    model_state_t *ms = nereid_model_state(model);
    in->python = ms ? ms->python : NULL;
    return in;
}

/* A model's EXECUTION_ENV_PATH: an unpacked environment directory (its
 * bin/python3 runs the workers; $$TRITON_MODEL_DIRECTORY is the model's
 * directory) or a conda-pack archive, extracted first (python_env.c).
 * *python NULL: not set. */
static nereid_error_t *execution_env(nereid_model_t *model, char **python)
{
    *python = NULL;
    const char *env = nereid_model_parameter(model, "EXECUTION_ENV_PATH");
    if (!env || !*env) return NULL;
    const char *var = "$$TRITON_MODEL_DIRECTORY";
    const char *at = strstr(env, var);
    char path[PATH_MAX];
    if (at)
        snprintf(path, sizeof path, "%.*s%s%s", (int)(at - env), env, nereid_model_directory(model),
                 at + strlen(var));
    else
        snprintf(path, sizeof path, "%s", env);
    char exe[PATH_MAX + 16];
    struct stat st;
    char *extracted = NULL;
    if (stat(path, &st) != 0)
        return nereid_error_new(NEREID_ERROR_INTERNAL, "Failed to get the canonical path for %s.",
                                path);
    if (S_ISREG(st.st_mode)) {
        /* a conda-pack archive, extracted as Triton extracts it */
        nereid_error_t *err = python_env_extract(path, &extracted);
        if (err) return err;
    }
    snprintf(exe, sizeof exe, "%s/bin/python3", extracted ? extracted : path);
    free(extracted);
    if (stat(exe, &st) == 0 && access(exe, X_OK) == 0) {
        *python = strdup(exe);
        return NULL;
    }
    return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                            "EXECUTION_ENV_PATH '%s': no executable bin/python3 in the "
                            "environment (a directory, or a conda-pack .tar.gz archive)",
                            path);
}

/* The name Triton gives the first instance: <first group's name>_0. */
static char *first_instance_name(nereid_model_t *model)
{
    json_error_t jerr;
    json_t *cfg = json_loads(nereid_model_config_json(model), 0, &jerr);
    const char *g = json_string_value(
        json_object_get(json_array_get(json_object_get(cfg, "instance_group"), 0), "name"));
    char *name = NULL;
    if (g && asprintf(&name, "%s_0", g) < 0) name = NULL;
    json_decref(cfg);
    return name;
}

static const char *kind_name(nereid_instance_kind_t k)
{
    return k == NEREID_INSTANCE_KIND_GPU     ? "GPU"
           : k == NEREID_INSTANCE_KIND_MODEL ? "MODEL"
                                             : "CPU";
}

static char *init_message(nereid_model_t *model, const char *file, const char *instance,
                          const char *kind, int device, bool auto_complete)
{
    char version[32], dev[32];
    snprintf(version, sizeof version, "%lld", (long long)nereid_model_version(model));
    snprintf(dev, sizeof dev, "%d", device);
    json_t *args = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "model_config",
                             nereid_model_config_json(model), "model_instance_kind", kind,
                             "model_instance_name", instance, "model_instance_device_id", dev,
                             "model_repository", nereid_model_directory(model), "model_version",
                             version, "model_name", nereid_model_name(model));
    json_error_t jerr;
    json_t *cfg = json_loads(nereid_model_config_json(model), 0, &jerr);
    json_t *o = json_pack("{s:s, s:s, s:b, s:b, s:o, s:o}", "model_file", file, "instance",
                          instance, "decoupled", nereid_model_decoupled(model), "auto_complete",
                          auto_complete, "args", args, "config", cfg ? cfg : json_object());
    /* pb_utils.get_model_dir(): the version directory, also for a
     * Python-based backend whose model.py lives elsewhere */
    char *vdir = nereid_model_file_path(model, "model.py");
    char *slash = vdir ? strrchr(vdir, '/') : NULL;
    if (slash) {
        *slash = '\0';
        json_object_set_new(o, "model_dir", json_string(vdir));
    }
    free(vdir);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* A Python-based backend (Triton's layout: `backend: "<name>"` with
 * <backend-directory>/<name>/model.py, which the core loads through this
 * backend): that model.py; NULL for a `backend: "python"` model. */
static char *python_based_backend_file(nereid_model_t *model)
{
    json_t *cfg = json_loads(nereid_model_config_json(model), 0, NULL);
    const char *name = json_string_value(json_object_get(cfg, "backend"));
    const char *dir = nereid_backend_config(nereid_model_backend(model), "backend-directory");
    char *file = NULL;
    if (name && *name && strcmp(name, "python") != 0 && dir && !strchr(name, '/')) {
        size_t n = strlen(dir) + strlen(name) + sizeof "//model.py";
        file = malloc(n);
        if (!file) abort();
        snprintf(file, n, "%s/%s/model.py", dir, name);
    }
    json_decref(cfg);
    return file;
}

/* Triton's IsValidIdentifier: characters a stub name must not contain. */
static const char *const BAD_NAME_CHARS = ";|&$`<>()[]{}\\\"'*?~#!";

NEREID_EXPORT nereid_error_t *nereid_backend_model_init(nereid_model_t *model)
{
    /* Triton names its auto-complete stub after the model and checks that
     * name before anything of the model is read (StubLauncher::Launch). */
    if (nereid_model_autocomplete_allowed(model) &&
        strpbrk(nereid_model_name(model), BAD_NAME_CHARS))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "Invalid stub name: contains invalid characters");

    char *python = NULL;
    nereid_error_t *env_err = execution_env(model, &python);
    if (env_err) return env_err;
    char *file = python_based_backend_file(model);
    if (!file) file = nereid_model_file_path(model, "model.py");
    if (!file) return nereid_error_new(NEREID_ERROR_INTERNAL, "python backend: out of memory");
    size_t len = strlen(file);
    if (len < 3 || strcmp(file + len - 3, ".py") != 0) {
        const char *base = strrchr(file, '/');
        nereid_error_t *e = nereid_error_new(
            NEREID_ERROR_INVALID_ARG, "Model name must end with '.py'. Model name is \"%s\".",
            base ? base + 1 : file);
        free(file);
        free(python);
        return e;
    }
    if (access(file, R_OK) != 0) {
        nereid_error_t *e = nereid_error_new(NEREID_ERROR_INTERNAL,
                                             "Failed to preinitialize Python stub: Python model "
                                             "file not found in '%s'",
                                             file);
        free(file);
        free(python);
        return e;
    }
    model_state_t *st = calloc(1, sizeof *st);
    if (!st) abort();
    st->file = file;
    st->python = python;
    pthread_mutex_init(&st->mu, NULL);
    pthread_mutex_init(&st->body_mu, NULL);
    nereid_model_set_state(model, st);
    /* An execute is a message to the worker and a wait for its answer: run
     * on the request's own thread when an instance is idle, a hand-off to
     * the instance thread and back costs more than the wait. */
    nereid_model_set_inline_max_us(model, INLINE_MAX_US);
    if (!nereid_model_autocomplete_allowed(model)) return NULL;
    /* auto_complete_config runs in a worker before the config is final. */
    char *first = first_instance_name(model);
    instance_t *tmp = instance_new(first ? first : nereid_model_name(model), model);
    char *init = init_message(model, file, tmp->name, "CPU", 0, true);
    msg_t *ready;
    nereid_error_t *e = worker_start(tmp, init, &ready);
    free(init);
    if (!e) {
        json_t *cfg = json_object_get(ready->json, "config");
        if (json_is_object(cfg)) {
            char *s = json_dumps(cfg, JSON_COMPACT);
            e = nereid_model_set_config(model, s);
            free(s);
        }
        msg_free(ready);
    }
    char *now_first = e ? NULL : first_instance_name(model);
    if (!e && first && now_first && strcmp(first, now_first) == 0) {
        st->spare = tmp;
    } else {
        worker_stop(tmp);
        instance_free(tmp);
    }
    free(first);
    free(now_first);
    return e; /* on error the core calls model fini */
}

NEREID_EXPORT nereid_error_t *nereid_backend_model_fini(nereid_model_t *model)
{
    model_state_t *st = nereid_model_state(model);
    if (st) {
        if (st->spare) {
            worker_stop(st->spare);
            instance_free(st->spare);
        }
        pthread_mutex_destroy(&st->mu);
        plog('V',
             "python backend: '%s' request body regions: %llu made, %llu bodies received "
             "in them, %llu offered none",
             nereid_model_name(model), (unsigned long long)st->body_made,
             (unsigned long long)st->body_taken, (unsigned long long)st->body_missed);
        for (int i = 0; i < BODY_SLOTS; i++)
            region_unref(st->body[i]); /* one a reply still sends lives on */
        pthread_mutex_destroy(&st->body_mu);
        free(st->python);
        free(st->file);
        free(st);
    }
    return NULL;
}

NEREID_EXPORT nereid_error_t *nereid_backend_instance_init(nereid_instance_t *instance)
{
    nereid_model_t *model = nereid_instance_model(instance);
    model_state_t *ms = nereid_model_state(model);
    const char *name = nereid_instance_name(instance);
    if (strpbrk(name, BAD_NAME_CHARS))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "Invalid stub name: contains invalid characters");
    pthread_mutex_lock(&ms->mu);
    instance_t *in = ms->spare && strcmp(ms->spare->name, name) == 0 ? ms->spare : NULL;
    if (in) ms->spare = NULL;
    pthread_mutex_unlock(&ms->mu);
    if (!in) in = instance_new(name, model);
    in->init_json = init_message(model, ms->file, name, kind_name(nereid_instance_kind(instance)),
                                 nereid_instance_device_id(instance), false);
    msg_t *ready;
    nereid_error_t *e = in->reader_running ? worker_init(in, in->init_json, &ready)
                                           : worker_start(in, in->init_json, &ready);
    if (e) {
        instance_free(in);
        return e;
    }
    msg_free(ready);
    pthread_mutex_lock(&in->mu);
    in->restartable = true; /* from now on a dead worker is restarted at once */
    pthread_mutex_unlock(&in->mu);
    in->model_instances = &ms->instances;
    atomic_fetch_add(&ms->instances, 1);
    nereid_instance_set_state(instance, in);
    return NULL;
}

NEREID_EXPORT nereid_error_t *nereid_backend_instance_fini(nereid_instance_t *instance)
{
    instance_t *in = nereid_instance_state(instance);
    if (!in) return NULL;
    atomic_fetch_sub(in->model_instances, 1);
    worker_closing(in); /* a restart under way ends first */
    if (in->reader_running) {
        /* finalize() runs in the worker; a worker that does not answer in
         * time is killed. */
        expect_reply(in, M_FINALIZED);
        reader_arm(in);
        if (send_json(in->chan, M_FINALIZE, json_object()) == 0)
            msg_free(wait_reply(in, M_FINALIZED, g_backend->finalize_wait_s));
        worker_stop(in);
    }
    pthread_mutex_lock(&in->mu);
    while (in->bls_inflight)
        pthread_cond_wait(&in->cv, &in->mu);
    pthread_mutex_unlock(&in->mu);
    plog('V',
         "python backend: '%s' spin-wait: %llu executes spun, %llu answered while spinning, "
         "%llu let the worker spin after them",
         in->name, (unsigned long long)in->spin.n, (unsigned long long)in->spin.hits,
         (unsigned long long)in->spin.hints);
    plog('V', "python backend: '%s' EXECUTE regions: %llu made, %llu switches to another", in->name,
         (unsigned long long)in->tx_made, (unsigned long long)in->tx_switches);
    plog('V', "python backend: '%s' request body regions: %llu inputs referenced", in->name,
         (unsigned long long)in->body.inputs);
    if (atomic_load(&in->bls_placed_n) + atomic_load(&in->bls_copied_n))
        plog('V',
             "python backend: '%s' BLS result outputs: %llu written in place by the called model "
             "(%llu bytes), %llu copied (%llu bytes); %llu result regions made",
             in->name, (unsigned long long)atomic_load(&in->bls_placed_n),
             (unsigned long long)atomic_load(&in->bls_placed_bytes),
             (unsigned long long)atomic_load(&in->bls_copied_n),
             (unsigned long long)atomic_load(&in->bls_copied_bytes),
             (unsigned long long)atomic_load(&in->bls_regions_made));
    instance_free(in);
    return NULL;
}
