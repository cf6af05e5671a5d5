/*
 * This file contains loads on demand (--model-load-on-demand): a request
 * for a model that is not loaded loads it, and the least recently used
 * models are unloaded while the loaded ones exceed --model-memory-budget,
 * each charged the resident memory it holds. Triton has no counterpart;
 * core/on_demand.c is the queue of the requests that wait for these loads.
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/loader.h"
#include "core/core.h"
#include "core/repository.h"
#include "core/repository_internal.h"
#include "core/util.h"

/* ---- Load on demand ---- */

/* The process's resident bytes (/proc/self/statm), 0 when unknown. */
long long repo_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long long pages = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%lld %lld", &pages, &resident) != 2) resident = 0;
        fclose(f);
    }
    return resident * (long long)sysconf(_SC_PAGESIZE);
}

/* Whether a request or an ensemble still uses one of e's models (beyond the
 * loader's reference). Caller holds s->lock. */
static bool entry_in_use(const model_entry_t *e)
{
    for (size_t v = 0; v < e->n_versions; v++) {
        model_t *m = e->versions[v].model;
        if (m && (atomic_load(&m->refcount) > 1 || atomic_load(&m->holds) > 0)) return true;
    }
    return false;
}

/* The backend e's loaded version runs on; NULL for an ensemble (or none
 * loaded). Caller holds s->lock. */
static const struct backend_lib *entry_backend(const model_entry_t *e)
{
    for (size_t v = 0; v < e->n_versions; v++)
        if (e->versions[v].model) return e->versions[v].model->backend;
    return NULL;
}

/* Whether other can hold memory that the victim's load brought in: a model
 * on the same backend (a shared session, the backend's library and
 * environment) or, for an ensemble (backend NULL), one of its steps. Caller
 * holds s->lock. */
static bool shares_memory(const struct backend_lib *backend, char *const *steps, size_t n_steps,
                          const model_entry_t *other)
{
    if (!repo_entry_has_ready(other)) return false;
    if (backend) return entry_backend(other) == backend;
    for (size_t k = 0; k < n_steps; k++)
        if (strcmp(steps[k], other->name) == 0) return true;
    return false;
}

/* After victim's unload freed `freed` of its `charged` bytes: what stayed
 * resident is held by a model it shares memory with (a session several
 * identical models use, the runtime its first load brought in), so it is
 * charged to the most recently used such model; what was freed beyond the
 * charge was charged to those models (victim released the last hold on a
 * shared session), so it comes off their charges. Bytes no loaded model can
 * hold (the last model of a backend went) leave the accounting. The total
 * thereby follows the process's RSS: --model-memory-budget bounds what the
 * loaded models really keep resident, not only what each load added. */
static void move_charge(nereid_server_t *s, const char *victim_name,
                        const struct backend_lib *backend, char *const *steps, size_t n_steps,
                        long long charged, long long freed)
{
    pthread_rwlock_wrlock(&s->lock);
    long long delta = freed - charged; /* < 0: stayed resident; > 0: freed for others */
    while (delta != 0) {
        model_entry_t *to = NULL;
        for (size_t i = 0; i < s->n_models; i++) {
            model_entry_t *e = s->models[i];
            if (e->memory_bytes <= 0 || strcmp(e->name, victim_name) == 0 ||
                !shares_memory(backend, steps, n_steps, e))
                continue;
            if (delta > 0 && e->memory_bytes <= 1) continue; /* nothing to take off */
            if (!to || atomic_load(&e->last_used_ns) > atomic_load(&to->last_used_ns)) to = e;
        }
        if (!to) break;
        if (delta < 0) {
            to->memory_bytes -= delta;
            LOG_INFO("'%s' still holds %lld bytes that '%s' shared after its unload", to->name,
                     -delta, victim_name);
            delta = 0;
        } else {
            long long take = to->memory_bytes - 1 < delta ? to->memory_bytes - 1 : delta;
            to->memory_bytes -= take;
            delta -= take;
        }
    }
    pthread_rwlock_unlock(&s->lock);
}

/* Unloads least recently used models until the loaded ones fit the budget;
 * keep (just loaded) stays. Each unload's freed memory is measured (RSS
 * before and after, free heap pages returned first) and what stayed
 * resident is charged on (move_charge). Caller holds s->control. */
static void evict_over_budget(nereid_server_t *s, const char *keep)
{
    long long budget = s->opts.model_memory_budget_bytes;
    while (budget > 0) {
        pthread_rwlock_rdlock(&s->lock);
        long long total = 0;
        model_entry_t *victim = NULL;
        for (size_t i = 0; i < s->n_models; i++) {
            model_entry_t *e = s->models[i];
            if (!repo_entry_has_ready(e)) continue;
            total += e->memory_bytes;
            if (e->pinned || strcmp(e->key, keep) == 0 || entry_in_use(e) ||
                repo_claimed(s, e->key) || repo_used_by_other_locked(s, e->key, e->key))
                continue;
            if (!victim || atomic_load(&e->last_used_ns) < atomic_load(&victim->last_used_ns))
                victim = e;
        }
        char *name = victim && total > budget ? xstrdup(victim->key) : NULL;
        long long bytes = victim ? victim->memory_bytes : 0;
        const struct backend_lib *backend = victim ? entry_backend(victim) : NULL;
        char **steps = NULL; /* an ensemble's: they hold what its load brought in */
        size_t n_steps = 0;
        const Inference__ModelEnsembling *es =
            name && victim->config && repo_is_ensemble(victim->config)
                ? victim->config->ensemble_scheduling
                : NULL;
        if (es) {
            steps = xcalloc(es->n_step ? es->n_step : 1, sizeof *steps);
            for (size_t k = 0; k < es->n_step; k++)
                steps[n_steps++] = xstrdup(es->step[k]->model_name);
        }
        pthread_rwlock_unlock(&s->lock);
        if (!name) {
            if (total > budget)
                LOG_WARN("loaded models use %lld bytes, over the memory budget of %lld bytes, "
                         "and none can be unloaded (pinned, in use or just loaded)",
                         total, budget);
            return;
        }
        LOG_INFO("unloading '%s' (%lld bytes, least recently used): loaded models use %lld bytes, "
                 "over the memory budget of %lld bytes",
                 name, bytes, total, budget);
        malloc_trim(0);
        long long rss0 = repo_rss_bytes();
        repo_unload_model(s, name, false, 0);
        malloc_trim(0);
        long long freed = rss0 - repo_rss_bytes();
        if (freed < 0) freed = 0;
        move_charge(s, name, backend, steps, n_steps, bytes, freed);
        for (size_t k = 0; k < n_steps; k++)
            free(steps[k]);
        free(steps);
        pthread_rwlock_wrlock(&s->lock);
        model_entry_t *e = repository_find(s, name);
        if (e) e->memory_bytes = 0;
        pthread_rwlock_unlock(&s->lock);
        atomic_fetch_add(&s->on_demand_evictions, 1);
        free(name);
    }
}

/* Set on the thread running an on-demand load: a request that the load
 * itself makes (a backend's model init) must not wait for s->control. */
static _Thread_local bool loading_on_demand;

bool repository_loading_on_demand(void)
{
    return loading_on_demand;
}

/* --model-namespacing: the key of the one repository's copy of name an
 * on-demand load means (name itself when no repository has it); NULL and
 * Triton's ambiguity error when several have it. */
static const char *on_demand_key(nereid_server_t *s, const char *name, nereid_error_t **err)
{
    size_t n;
    char **keys = repo_name_keys(s, name, &n);
    const char *key = name;
    if (n == 1) {
        key = keys[0];
        keys[0] = NULL;
    } else if (n > 1) {
        key = NULL;
        *err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "There are %zu identifiers of model '%s' in global map, model "
                                "namespace must be provided to resolve ambiguity.",
                                n, name);
    }
    repo_free_names(keys, n);
    return key;
}

/* ---- Explicit loads under the budget ---- */

/* Which models e serves (their addresses): a load that kept them all
 * loaded nothing. Caller holds s->lock. */
static uint64_t served_models(const model_entry_t *e)
{
    uint64_t sig = 1469598103934665603ULL;
    for (size_t v = 0; v < e->n_versions; v++)
        if (e->versions[v].model && e->versions[v].state == MODEL_READY)
            sig = (sig ^ (uint64_t)(uintptr_t)e->versions[v].model) * 1099511628211ULL;
    return sig;
}

void repo_budget_mark(nereid_server_t *s, const char *key, budget_mark_t *m)
{
    memset(m, 0, sizeof *m);
    malloc_trim(0);
    pthread_rwlock_rdlock(&s->lock);
    model_entry_t *e = repository_find(s, key);
    m->was_ready = e && repo_entry_has_ready(e);
    if (m->was_ready) {
        m->bytes = e->memory_bytes;
        m->served = served_models(e);
    }
    pthread_rwlock_unlock(&s->lock);
    m->rss0 = repo_rss_bytes();
}

/* The bytes the pinned (explicitly loaded) models are charged. Caller
 * holds s->lock. */
long long repository_pinned_bytes(const nereid_server_t *s)
{
    long long total = 0;
    for (size_t i = 0; i < s->n_models; i++)
        if (s->models[i]->pinned && repo_entry_has_ready(s->models[i]))
            total += s->models[i]->memory_bytes;
    return total;
}

void repo_warn_pinned_over_budget(nereid_server_t *s)
{
    pthread_rwlock_rdlock(&s->lock);
    long long total = repository_pinned_bytes(s), budget = s->opts.model_memory_budget_bytes;
    pthread_rwlock_unlock(&s->lock);
    if (budget > 0 && total > budget)
        LOG_WARN("pinned models (--load-model, load API) use %lld bytes, over the memory budget "
                 "of %lld bytes: only the model loaded last on demand stays beside them",
                 total, budget);
}

/* After the explicit load of key that repo_budget_mark began: the model is
 * pinned (never evicted) and charged what the RSS grew across its load (a
 * reload: its old charge plus the change; a load that changed nothing keeps
 * the charge and evicts nothing), on-demand models are unloaded to fit
 * beside it, and a warning says when the pinned models alone exceed the
 * budget. The load is not serialized with others (it may not wait for an
 * on-demand load: a Python model's initialize loads models, and makes
 * requests, from threads of its own): what overlapping loads add is
 * counted in each, so the budget errs towards unloading more. Caller holds
 * s->control. */
void repo_budget_charge_pinned(nereid_server_t *s, const char *key, const budget_mark_t *m)
{
    long long grown = repo_rss_bytes() - m->rss0;
    pthread_rwlock_wrlock(&s->lock);
    model_entry_t *e = repository_find(s, key);
    bool ready = e && repo_entry_has_ready(e);
    bool same = ready && m->was_ready && served_models(e) == m->served && m->bytes > 0;
    long long bytes = same ? m->bytes : (m->was_ready ? m->bytes : 0) + grown;
    if (bytes < 1) bytes = 1;
    if (ready) {
        e->pinned = true;
        e->memory_bytes = bytes;
        atomic_store(&e->last_used_ns, util_now_ns());
    }
    pthread_rwlock_unlock(&s->lock);
    if (!ready || same) return;
    LOG_INFO("loaded pinned '%s' (%lld bytes)", key, bytes);
    evict_over_budget(s, key);
    repo_warn_pinned_over_budget(s);
}

nereid_error_t *repository_load_on_demand(nereid_server_t *s, const char *name)
{
    const char *plain = name;
    if (!repo_valid_model_name(name) || loading_on_demand)
        return nereid_error_new(NEREID_ERROR_NOT_FOUND,
                                "Request for unknown model: '%s' is not found", name ? name : "");
    /* One on-demand load at a time, each charged its own RSS growth; other
     * operations may still run while its model initializes. */
    pthread_mutex_lock(&s->on_demand_load);
    pthread_mutex_lock(&s->control);
    loading_on_demand = true;
    nereid_error_t *err = NULL;
    if (atomic_load(&s->stopping)) {
        err = nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready");
    } else if (repo_ns_on(s) && !(name = on_demand_key(s, name, &err))) {
        /* err: Triton's ambiguity error */
    } else if (!repo_model_ready(s, name)) { /* else another request loaded it meanwhile */
        size_t count;
        char *dir = repo_locate(s, name, &count);
        bool found = dir != NULL;
        free(dir);
        if (!found) {
            err = nereid_error_new(NEREID_ERROR_NOT_FOUND,
                                   "Request for unknown model: '%s' is not found", name);
        } else {
            LOG_INFO("loading '%s' on demand", name);
            long long rss0 = repo_rss_bytes();
            uint64_t t0 = util_now_ns();
            load_ctx_t ctx = {.depth = 0, .load_deps = true, .held = true};
            ctx.chain[0] = name;
            err = repo_load_model(s, name, NULL, NULL, NULL, NULL, 0, &ctx);
            atomic_fetch_add(&s->on_demand_load_ns, util_now_ns() - t0);
            long long grown = repo_rss_bytes() - rss0;
            if (err || !repo_model_ready(s, name)) {
                atomic_fetch_add(&s->on_demand_load_failures, 1);
                if (!err)
                    err = nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                                           "Request for unknown model: '%s' has no available "
                                           "versions",
                                           name);
            } else {
                atomic_fetch_add(&s->on_demand_loads, 1);
                pthread_rwlock_wrlock(&s->lock);
                model_entry_t *e = repository_find(s, name);
                if (e) {
                    e->memory_bytes = grown > 0 ? grown : 1;
                    atomic_store(&e->last_used_ns, util_now_ns());
                }
                pthread_rwlock_unlock(&s->lock);
                LOG_INFO("loaded '%s' on demand (%lld bytes)", name, grown > 0 ? grown : 1);
                evict_over_budget(s, name);
            }
        }
    }
    loading_on_demand = false;
    if (repo_ns_on(s) && name != plain) free((char *)name);
    pthread_mutex_unlock(&s->control);
    pthread_mutex_unlock(&s->on_demand_load);
    return err;
}
