/*
 * This file contains the repository's start-up: every model directory is
 * listed, the models the control mode asks for are loaded, plain ones in
 * parallel on --model-load-thread-count threads (their backends started
 * ahead while the configs are read), then ensembles, and poll mode's thread
 * is started. It corresponds to Triton's ModelRepositoryManager::Create and
 * its first PollAndUpdate, with model_lifecycle.cc's load thread pool.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/loader.h"
#include "core/core.h"
#include "core/repository.h"
#include "core/repository_internal.h"
#include "core/util.h"

/* ---- Start-up ---- */

typedef struct load_pool {
    nereid_server_t *server;
    char **names;
    size_t n;
    bool *is_ensemble;        /* [n], set by the workers */
    bool measure;             /* one worker; each load's RSS growth is its charge */
    model_config_t **configs; /* [n], read in the first pass, taken by the loads */
    pthread_mutex_t lock;
    pthread_cond_t all_read;
    size_t next_read, n_read, next; /* lock */
    struct prefetch *prefetches;    /* lock: one per backend named */
} load_pool_t;

/* A backend loaded ahead of the start-up loads (backend_prefetch), on a
 * thread of its own while the workers read the other configs. */
typedef struct prefetch {
    struct prefetch *next;
    char *backend, *model_dir, *runtime; /* the first model's search that named it */
    const nereid_server_t *server;
    backend_lib_t *lib; /* the reference it holds until the loads end */
    pthread_t thread;
    bool started;
} prefetch_t;

static void *prefetch_main(void *arg)
{
    prefetch_t *f = arg;
    backend_search_t search = {
        f->server->backend_dir,       f->model_dir, 0, f->runtime, f->server->backend_settings,
        f->server->n_backend_settings};
    f->lib = backend_prefetch(&search, f->backend);
    return NULL;
}

/* Starts loading cfg's backend ahead of the loads, the first time a config
 * names it. */
static void prefetch_backend(load_pool_t *p, const model_config_t *cfg, const char *dir)
{
    const char *backend = model_backend_for(cfg);
    if (!backend) return;
    pthread_mutex_lock(&p->lock);
    prefetch_t *f = p->prefetches;
    while (f && strcmp(f->backend, backend) != 0)
        f = f->next;
    if (!f) {
        f = xcalloc(1, sizeof *f);
        f->backend = xstrdup(backend);
        f->model_dir = xstrdup(dir);
        f->runtime = xstrdup(cfg->runtime ? cfg->runtime : "");
        f->server = p->server;
        f->next = p->prefetches;
        p->prefetches = f;
        f->started = pthread_create(&f->thread, NULL, prefetch_main, f) == 0;
    }
    pthread_mutex_unlock(&p->lock);
}

/* After the loads: the prefetched backends' references go (a backend no
 * model loaded on is then finished and closed, as without the prefetch). */
static void prefetch_end(load_pool_t *p)
{
    while (p->prefetches) {
        prefetch_t *f = p->prefetches;
        p->prefetches = f->next;
        if (f->started) pthread_join(f->thread, NULL);
        backend_release(f->lib);
        free(f->backend);
        free(f->model_dir);
        free(f->runtime);
        free(f);
    }
}

/* Charges key's loaded model the RSS its load added (at least 1 byte) and
 * logs it: what --model-memory-budget counts for a model loaded at
 * start-up (--load-model: pinned), as for one loaded on demand. */
static void charge_pinned_load(nereid_server_t *s, const char *key, long long grown)
{
    if (!repo_model_ready(s, key)) return;
    if (grown < 1) grown = 1;
    pthread_rwlock_wrlock(&s->lock);
    model_entry_t *e = repository_find(s, key);
    if (e) {
        e->memory_bytes = grown;
        atomic_store(&e->last_used_ns, util_now_ns());
    }
    pthread_rwlock_unlock(&s->lock);
    LOG_INFO("loaded pinned '%s' (%lld bytes)", key, grown);
}

/* Loads the plain models among p->names; an ensemble (it needs its steps)
 * is only marked in p->is_ensemble for the caller. Each config is read once,
 * in a first pass, and handed to load_model in the second. The first pass
 * starts loading each backend the configs name (prefetch_backend), so the
 * backend's start overlaps the reads instead of every load waiting for it
 * in turn. */
static void *load_worker(void *arg)
{
    load_pool_t *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        size_t i = p->next_read++;
        pthread_mutex_unlock(&p->lock);
        if (i >= p->n) break;
        size_t count;
        char *dir = repo_locate(p->server, p->names[i], &count);
        model_config_t *cfg = NULL;
        const char *ns;
        char *name = repo_key_split(p->names[i], &ns);
        if (dir && count == 1)
            nereid_error_free(repo_read_config(p->server, name, dir, NULL, &cfg));
        free(name);
        if (repo_is_ensemble(cfg)) {
            config_free(cfg);
            cfg = NULL;
            p->is_ensemble[i] = true;
        } else if (cfg && !p->measure) { /* measured: the backend's start is the load's */
            prefetch_backend(p, cfg, dir);
        }
        free(dir);
        pthread_mutex_lock(&p->lock);
        p->configs[i] = cfg;
        if (++p->n_read == p->n) pthread_cond_broadcast(&p->all_read);
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_lock(&p->lock);
    while (p->n_read < p->n)
        pthread_cond_wait(&p->all_read, &p->lock);
    pthread_mutex_unlock(&p->lock);
    for (;;) {
        pthread_mutex_lock(&p->lock);
        size_t i = p->next++;
        pthread_mutex_unlock(&p->lock);
        if (i >= p->n) return NULL;
        if (p->is_ensemble[i]) continue;
        load_ctx_t ctx = {.depth = 0, .load_deps = false, .config = p->configs[i]};
        p->configs[i] = NULL;
        ctx.chain[0] = p->names[i];
        long long rss0 = p->measure ? repo_rss_bytes() : 0;
        nereid_error_free(repo_load_model(p->server, p->names[i], NULL, NULL, NULL, NULL, 0, &ctx));
        if (p->measure) charge_pinned_load(p->server, p->names[i], repo_rss_bytes() - rss0);
        if (ctx.config) config_free(ctx.config);
    }
}

/* Loads names' plain models on --model-load-thread-count threads and sets
 * is_ensemble[i] for each ensemble among them (not loaded). measure: one
 * at a time, each charged what its load added to the RSS (loads in
 * parallel would blur each other's growth). */
static void load_parallel(nereid_server_t *s, char **names, size_t n, bool *is_ensemble,
                          bool measure)
{
    load_pool_t pool = {.server = s,
                        .names = names,
                        .n = n,
                        .is_ensemble = is_ensemble,
                        .measure = measure,
                        .configs = xcalloc(n ? n : 1, sizeof *pool.configs)};
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.all_read, NULL);
    size_t nt = s->opts.model_load_thread_count > 0 ? (size_t)s->opts.model_load_thread_count : 1;
    if (measure) nt = 1;
    if (nt > n) nt = n;
    pthread_t *threads = xcalloc(nt ? nt : 1, sizeof *threads);
    size_t started = 0;
    for (size_t i = 0; i < nt; i++)
        if (pthread_create(&threads[i], NULL, load_worker, &pool) == 0) started++;
    if (started == 0) load_worker(&pool);
    for (size_t i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    prefetch_end(&pool);
    free(threads);
    free(pool.configs);
    pthread_cond_destroy(&pool.all_read);
    pthread_mutex_destroy(&pool.lock);
}

static bool wanted_name_at_start(nereid_server_t *s, const char *name)
{
    /* Poll mode with on-demand loads: like explicit, only --load-model. */
    if (s->opts.model_control_mode != NEREID_MODEL_CONTROL_EXPLICIT &&
        !s->opts.model_load_on_demand)
        return true;
    for (size_t i = 0; i < s->opts.n_load_models; i++)
        if (strcmp(s->opts.load_models[i], "*") == 0 || strcmp(s->opts.load_models[i], name) == 0)
            return true;
    return false;
}

static bool wanted_at_start(nereid_server_t *s, const char *key)
{
    const char *ns;
    char *name = repo_key_split(key, &ns);
    bool wanted = wanted_name_at_start(s, name);
    free(name);
    return wanted;
}

nereid_error_t *repository_start(nereid_server_t *s)
{
    pthread_mutex_init(&s->control, NULL);
    pthread_cond_init(&s->claim_ended, NULL);
    pthread_mutex_init(&s->on_demand_load, NULL);
    pthread_mutex_init(&s->poll_lock, NULL);
    pthread_cond_init(&s->poll_cond, NULL);
    nereid_error_t *remote_err = remote_repo_open_all(s); /* object storage */
    if (remote_err) return remote_err;
    char **names;
    nereid_error_t *err;
    size_t n = repo_scan_names(s, &names, &err);
    if (err) {
        for (size_t i = 0; i < n; i++)
            free(names[i]);
        free(names);
        return err;
    }
    /* Every model on disk is listed, even those never loaded. */
    pthread_rwlock_wrlock(&s->lock);
    for (size_t i = 0; i < n; i++) {
        size_t count;
        char *dir = repo_locate(s, names[i], &count);
        if (dir && !repository_find(s, names[i])) repo_entry_add(s, names[i], dir);
        free(dir);
    }
    pthread_rwlock_unlock(&s->lock);
    if (s->opts.model_load_on_demand) { /* what --load-model names is never evicted */
        pthread_rwlock_wrlock(&s->lock);
        for (size_t i = 0; i < s->n_models; i++)
            s->models[i]->pinned = wanted_name_at_start(s, s->models[i]->name);
        pthread_rwlock_unlock(&s->lock);
    }
    /* Plain models in parallel, then ensembles (they need their steps). */
    char **wanted = xcalloc(n ? n : 1, sizeof *wanted);
    bool *ens = xcalloc(n ? n : 1, sizeof *ens);
    size_t n_wanted = 0;
    for (size_t i = 0; i < n; i++)
        if (wanted_at_start(s, names[i])) wanted[n_wanted++] = names[i];
    /* Under a memory budget the pinned models count too: each one's load
     * is measured, so they load one at a time. */
    bool measure = s->opts.model_load_on_demand && s->opts.model_memory_budget_bytes > 0;
    load_parallel(s, wanted, n_wanted, ens, measure);
    for (size_t i = 0; i < n_wanted; i++) {
        /* loaded (or tried) as another ensemble's step */
        if (!ens[i] || repo_model_ready(s, wanted[i]) ||
            repo_entry_state(s, wanted[i], NULL) != MODEL_UNKNOWN_STATE)
            continue;
        load_ctx_t ctx = {.depth = 0,
                          .load_deps = s->opts.model_control_mode == NEREID_MODEL_CONTROL_EXPLICIT};
        ctx.chain[0] = wanted[i];
        long long rss0 = measure ? repo_rss_bytes() : 0;
        nereid_error_free(repo_load_model(s, wanted[i], NULL, NULL, NULL, NULL, 0, &ctx));
        if (measure) charge_pinned_load(s, wanted[i], repo_rss_bytes() - rss0);
    }
    if (measure) repo_warn_pinned_over_budget(s);
    free(wanted);
    free(ens);
    /* Triton (PollModels): a --load-model name no repository has is logged,
     * and with --exit-on-error the server does not start. */
    nereid_error_t *missing = NULL;
    for (size_t i = 0;
         s->opts.model_control_mode == NEREID_MODEL_CONTROL_EXPLICIT && i < s->opts.n_load_models;
         i++) {
        const char *want = s->opts.load_models[i];
        bool found = strcmp(want, "*") == 0;
        for (size_t j = 0; j < n && !found; j++) {
            const char *ns;
            char *name = repo_key_split(names[j], &ns);
            found = strcmp(name, want) == 0;
            free(name);
        }
        if (found) continue;
        LOG_ERROR("failed to poll model '%s': model not found in any model repository.", want);
        if (!missing && s->opts.exit_on_error)
            missing =
                nereid_error_new(NEREID_ERROR_INTERNAL,
                                 "failed to load '%s', failed to poll from model repository", want);
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    if (missing) return missing;
    if (s->opts.model_control_mode == NEREID_MODEL_CONTROL_POLL &&
        pthread_create(&s->poll_thread, NULL, repo_poll_main, s) == 0)
        s->poll_started = true;
    return NULL;
}
