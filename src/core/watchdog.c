/*
 * This file contains the progress watchdog. Every instance records when its
 * current execution started (batch_execute) and every model when one of its
 * executions last ended; a thread looks at both every second and marks a
 * model wedged when an execution has not returned for the timeout while no
 * instance of the model completed one. A wedged model answers not ready,
 * refuses new requests fast with UNAVAILABLE, and counts the event
 * (nereid_model_progress_timeouts_total). A backend with
 * nereid_backend_instance_abort is asked to end the stuck execution (the
 * Python backend kills the worker, which is restarted); a C backend's
 * thread cannot be killed, so its model stays wedged until the execution
 * returns. The first execution that returns clears the mark.
 */
#include "core/watchdog.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "backend/loader.h"
#include "core/repository.h"
#include "core/server_internal.h"
#include "core/util.h"

struct watchdog {
    nereid_server_t *server;
    uint64_t timeout_ns;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool stop;
};

nereid_error_t *watchdog_refusal(const model_t *m)
{
    return nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                            "Model '%s' version %" PRId64
                            " is not making progress: an execution has not returned for more "
                            "than %d s (--model-progress-timeout-secs)",
                            m->name, m->version, m->server->opts.model_progress_timeout_secs);
}

void watchdog_progressed(model_t *m)
{
    if (atomic_exchange(&m->wedged, false))
        LOG_INFO("Model '%s' version %" PRId64 " is making progress again", m->name, m->version);
}

/* Whether inst's current execution started more than the timeout ago. */
static bool stuck(const watchdog_t *w, model_instance_t *inst, uint64_t now)
{
    uint64_t start = atomic_load(&inst->exec_start_ns);
    return start && now - start > w->timeout_ns && !atomic_load(&inst->retired);
}

/* Marks m wedged when it is, and asks the backend to end its stuck
 * executions. The caller holds a reference on m. */
static void check_model(watchdog_t *w, model_t *m, uint64_t now)
{
    uint64_t progress = atomic_load(&m->progress_ns);
    if (now - progress <= w->timeout_ns) return;
    size_t n = atomic_load(&m->n_instances);
    model_instance_t **insts = atomic_load(&m->instances);
    bool any = false;
    for (size_t i = 0; i < n && !any; i++)
        any = stuck(w, insts[i], now);
    if (!any) return;
    if (!atomic_exchange(&m->wedged, true)) {
        atomic_fetch_add(&m->stats.progress_timeouts, 1);
        LOG_ERROR("Model '%s' version %" PRId64
                  " is not making progress: an execution has run for more than %d s and no "
                  "instance completed one since; %s",
                  m->name, m->version, m->server->opts.model_progress_timeout_secs,
                  m->backend && m->backend->instance_abort
                      ? "ending its stuck instances"
                      : "refusing new requests until it returns (its backend cannot be "
                        "interrupted)");
        if (!m->backend || !m->backend->instance_abort) return;
        for (size_t i = 0; i < n; i++) {
            if (!stuck(w, insts[i], now)) continue;
            nereid_error_t *err = m->backend->instance_abort((nereid_instance_t *)insts[i]);
            if (err) {
                LOG_ERROR("Model '%s' instance '%s' could not be ended: %s", m->name,
                          insts[i]->name, nereid_error_message(err));
                nereid_error_free(err);
            }
        }
    }
}

/* One look at every loaded model version. */
static void sweep(watchdog_t *w)
{
    nereid_server_t *s = w->server;
    model_t **models = NULL;
    size_t n = 0, cap = 0;
    pthread_rwlock_rdlock(&s->lock);
    for (size_t i = 0; i < s->n_models; i++) {
        model_entry_t *e = s->models[i];
        for (size_t v = 0; v < e->n_versions; v++) {
            model_t *m = e->versions[v].model;
            if (!m || !m->backend || e->versions[v].state != MODEL_READY) continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 16;
                models = xrealloc(models, cap * sizeof *models);
            }
            model_ref(m);
            models[n++] = m;
        }
    }
    pthread_rwlock_unlock(&s->lock);
    uint64_t now = util_now_ns();
    for (size_t i = 0; i < n; i++) {
        check_model(w, models[i], now);
        model_unref(models[i]);
    }
    free(models);
}

static void *watchdog_main(void *arg)
{
    watchdog_t *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_sec += 1;
        pthread_cond_timedwait(&w->cond, &w->mu, &dl);
        if (w->stop) break;
        pthread_mutex_unlock(&w->mu);
        sweep(w);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

watchdog_t *watchdog_start(nereid_server_t *s, int timeout_secs)
{
    if (timeout_secs <= 0) return NULL;
    watchdog_t *w = xcalloc(1, sizeof *w);
    w->server = s;
    w->timeout_ns = (uint64_t)timeout_secs * 1000000000ull;
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cond, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&w->thread, NULL, watchdog_main, w) != 0) {
        LOG_ERROR("--model-progress-timeout-secs: unable to start the watchdog thread");
        pthread_cond_destroy(&w->cond);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return NULL;
    }
    return w;
}

void watchdog_stop(watchdog_t *w)
{
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
