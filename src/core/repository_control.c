/*
 * This file contains the repository's control: unloading a model (with its
 * dependents and the ensembles that use it), the public load and unload API
 * (config and file overrides, async unloads finished on their own thread),
 * poll mode's rescans and the shutdown that unloads everything. It
 * corresponds to Triton's model_repository_manager.cc (LoadUnloadModels,
 * PollAndUpdate, UnloadAllModels) and model_lifecycle.cc's AsyncUnload.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "core/repository.h"
#include "core/repository_internal.h"
#include "nereid/common.h"
#include "core/util.h"

/* Triton's ValidateModelName for explicit loads: the name, trimmed of
 * whitespace, must not be empty, ".." or contain a '/' (nor, here, be ".":
 * the repository itself). */
static nereid_error_t *check_load_name(const char *name)
{
    const char *ws = " \t\n\v\f\r";
    if (!name) name = "";
    size_t start = strspn(name, ws), len = strlen(name + start);
    while (len && strchr(ws, name[start + len - 1]))
        len--;
    if (len == 0)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "Model name cannot be empty. Please enter a valid name to deploy.");
    const char *t = name + start;
    bool dots = (len == 2 && memcmp(t, "..", 2) == 0) || (len == 1 && t[0] == '.');
    if (dots || memchr(t, '/', len) || !repo_valid_model_name(name))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "invalid model name '%s', model name must not contain path "
                                "traversal characters",
                                name);
    return NULL;
}

/* ---- Unloading ---- */

/* An unload in two steps: unload_detach takes model key's versions out of
 * service (UNLOADING: no new request finds them), unload_finish drains and
 * finalizes them and marks the model UNAVAILABLE. */
typedef struct unloading {
    char *key;
    char *name;       /* NULL: no such model */
    model_t **drain;  /* the versions' models */
    int64_t *drain_v; /* ... and their version numbers */
    size_t n_drain;
    char **deps; /* an ensemble's composing models */
    size_t n_deps;
} unloading_t;

/* Caller holds s->control and claimed key. */
static void unload_detach(nereid_server_t *s, const char *key, unloading_t *u)
{
    memset(u, 0, sizeof *u);
    u->key = xstrdup(key);
    pthread_rwlock_wrlock(&s->lock);
    model_entry_t *e = repository_find(s, key);
    if (!e) {
        pthread_rwlock_unlock(&s->lock);
        return;
    }
    LOG_VERBOSE2("AsyncUnload() '%s'", e->name); /* Triton's trace line */
    u->drain = xcalloc(e->n_versions ? e->n_versions : 1, sizeof *u->drain);
    u->drain_v = xcalloc(e->n_versions ? e->n_versions : 1, sizeof *u->drain_v);
    for (size_t v = 0; v < e->n_versions; v++) {
        version_entry_t *ve = &e->versions[v];
        if (ve->model) {
            u->drain_v[u->n_drain] = ve->version;
            u->drain[u->n_drain++] = ve->model;
        }
        ve->model = NULL;
        ve->state = MODEL_UNLOADING;
        free(ve->reason);
        ve->reason = NULL;
    }
    if (e->n_versions) e->state = MODEL_UNLOADING;
    /* Dependents: the composing models of an ensemble (Triton unloads them
     * unless another loaded ensemble still uses them). */
    const Inference__ModelEnsembling *es =
        repo_is_ensemble(e->config) ? e->config->ensemble_scheduling : NULL;
    for (size_t k = 0; es && k < es->n_step; k++) {
        char *sk = repo_step_key(s, es->step[k]);
        bool have = false;
        for (size_t j = 0; j < u->n_deps; j++)
            have |= strcmp(u->deps[j], sk) == 0;
        if (have) {
            free(sk);
            continue;
        }
        u->deps = xrealloc(u->deps, (u->n_deps + 1) * sizeof *u->deps);
        u->deps[u->n_deps++] = sk;
    }
    u->name = xstrdup(e->name);
    pthread_rwlock_unlock(&s->lock);
}

/* Caller holds s->control and the claim of u->key; leaves u->deps. */
static void unload_finish(nereid_server_t *s, unloading_t *u)
{
    if (!u->name) return;
    repo_control_lend(s, true);
    for (size_t i = 0; i < u->n_drain; i++)
        repo_unload_version(u->name, u->drain_v[i], u->drain[i]);
    repo_control_take_back(s, true);
    free(u->drain);
    free(u->drain_v);
    u->drain = NULL;
    u->drain_v = NULL;
    free(u->name);
    u->name = NULL;

    pthread_rwlock_wrlock(&s->lock);
    model_entry_t *e = repository_find(s, u->key);
    if (e) {
        for (size_t v = 0; v < e->n_versions; v++) {
            e->versions[v].state = MODEL_UNAVAILABLE;
            free(e->versions[v].reason);
            e->versions[v].reason = xstrdup("unloaded");
        }
        e->state = MODEL_UNAVAILABLE;
        e->pinned = false; /* loaded again on demand, it may be evicted */
        free(e->reason);
        e->reason = xstrdup("unloaded");
        if (e->config) config_free(e->config);
        e->config = NULL;
        free(e->config_key);
        e->config_key = NULL;
        free(e->load_dir);
        e->load_dir = NULL;
    }
    pthread_rwlock_unlock(&s->lock);
    if (e) repo_drop_unused_tmp_dirs(s, e);
}

/* Unloads model key, which the caller claimed; *deps, *n_deps: what an
 * ensemble's dependents are (for the caller to unload). Caller holds
 * s->control. */
static void unload_claimed(nereid_server_t *s, const char *key, char ***deps_out,
                           size_t *n_deps_out)
{
    unloading_t u;
    unload_detach(s, key, &u);
    unload_finish(s, &u);
    free(u.key);
    *deps_out = u.deps;
    *n_deps_out = u.n_deps;
}

static void unload_deps(nereid_server_t *s, const char *key, char **deps, size_t n_deps,
                        bool dependents, int depth);

/* Triton's dependency graph: an ensemble with a step that is no longer
 * loaded is unloaded too. Unloads every ready ensemble that uses key.
 * Caller holds s->control. */
static void unload_users(nereid_server_t *s, const char *key, int depth)
{
    /* (load on demand evicts steps and loads them again on a request) */
    if (depth >= MAX_ENSEMBLE_DEPTH || s->opts.model_load_on_demand) return;
    char **users = NULL;
    size_t n_users = 0;
    pthread_rwlock_rdlock(&s->lock);
    for (size_t i = 0; i < s->n_models; i++) {
        model_entry_t *e = s->models[i];
        if (strcmp(e->key, key) == 0 || !repo_entry_has_ready(e) || !repo_is_ensemble(e->config))
            continue;
        const Inference__ModelEnsembling *es = e->config->ensemble_scheduling;
        bool uses = false;
        for (size_t k = 0; es && k < es->n_step && !uses; k++) {
            char *sk = repo_step_key(s, es->step[k]);
            uses = strcmp(sk, key) == 0;
            free(sk);
        }
        if (!uses) continue;
        users = xrealloc(users, (n_users + 1) * sizeof *users);
        users[n_users++] = xstrdup(e->key);
    }
    pthread_rwlock_unlock(&s->lock);
    for (size_t i = 0; i < n_users; i++) {
        LOG_INFO("unloading '%s': its step '%s' is unloaded", users[i], key);
        repo_unload_model(s, users[i], false, depth + 1);
        free(users[i]);
    }
    free(users);
}

/* Unloads model key (and, when dependents, the composing models no other
 * loaded ensemble uses), and the ensembles that use it. Caller holds
 * s->control. */
void repo_unload_model(nereid_server_t *s, const char *key, bool dependents, int depth)
{
    nereid_error_t *err = repo_claim(s, key, true);
    if (err) {
        LOG_ERROR("failed to unload '%s': %s", key, nereid_error_message(err));
        nereid_error_free(err);
        return;
    }
    char **deps;
    size_t n_deps;
    unload_claimed(s, key, &deps, &n_deps);
    repo_unclaim(s, key, true);
    unload_users(s, key, depth);
    unload_deps(s, key, deps, n_deps, dependents, depth);
}

/* Unloads (when dependents) the composing models deps of ensemble key that
 * no other loaded ensemble uses; frees deps. Caller holds s->control. */
static void unload_deps(nereid_server_t *s, const char *key, char **deps, size_t n_deps,
                        bool dependents, int depth)
{
    for (size_t i = 0; i < n_deps; i++) {
        if (dependents && depth < MAX_ENSEMBLE_DEPTH && !repo_used_by_other(s, deps[i], key))
            repo_unload_model(s, deps[i], true, depth + 1);
        free(deps[i]);
    }
    free(deps);
}

/* ---- Public control API ---- */

/* Triton's LoadModel/UnloadModel: refused with "Server not ready" once the
 * server is not ready (a graceful exit began: SIGTERM during
 * --exit-timeout-secs, or it stops), before the control mode is looked at. */
static nereid_error_t *check_explicit(nereid_server_t *s)
{
    nereid_error_t *refused = server_exit_refusal(s);
    if (refused) return refused;
    if (s->opts.model_control_mode != NEREID_MODEL_CONTROL_EXPLICIT)
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                                "explicit model load / unload is not allowed if polling is "
                                "enabled");
    return NULL;
}

nereid_error_t *nereid_server_load_model(nereid_server_t *s, const char *model,
                                         const char *config_json, const char *const *file_paths,
                                         const void *const *file_contents, const size_t *file_sizes,
                                         size_t n_files)
{
    nereid_error_t *err = check_explicit(s);
    if (err) return err;
    err = check_load_name(model);
    if (err) return err;
    if (n_files && (!file_paths || !file_contents || !file_sizes))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "file overrides are incomplete");
    /* Triton: file overrides come with a config override or the poll fails
     * (LocalizeRepoAgent: the override files are the whole model, not a patch
     * of its repository directory); the model stays as it was. */
    if (n_files && !config_json) {
        LOG_ERROR("Poll failed for model directory '%s': Load parameter 'config' must be "
                  "specified for model file override",
                  model);
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "failed to load '%s', failed to poll from model repository", model);
    }
    /* under a budget: measured, pinned and counted */
    bool measured = s->opts.model_memory_budget_bytes > 0;
    pthread_mutex_lock(&s->control);
    err = n_files ? NULL : remote_repo_sync_for_load(s, model); /* object storage */
    if (err) {
        pthread_mutex_unlock(&s->control);
        return err;
    }
    /* With --model-namespacing every repository's copy loads (Triton polls
     * the name in each repository). */
    size_t n_keys = 0;
    char **keys = repo_ns_on(s) ? repo_name_keys(s, model, &n_keys) : NULL;
    for (size_t i = 0; i < (n_keys ? n_keys : 1); i++) {
        const char *key = n_keys ? keys[i] : model;
        load_ctx_t ctx = {
            .depth = 0, .load_deps = true, .force = config_json || n_files, .held = true};
        ctx.chain[0] = key;
        budget_mark_t mark;
        if (measured) repo_budget_mark(s, key, &mark);
        nereid_error_t *lerr = repo_load_model(s, key, config_json, file_paths, file_contents,
                                               file_sizes, n_files, &ctx);
        if (measured) repo_budget_charge_pinned(s, key, &mark);
        if (err)
            nereid_error_free(lerr);
        else
            err = lerr;
    }
    repo_free_names(keys, n_keys);
    pthread_mutex_unlock(&s->control);
    return err;
}

/* The keys an unload of model means: every namespace's copy with
 * --model-namespacing. Caller holds s->control. */
static char **unload_keys(nereid_server_t *s, const char *model, size_t *n)
{
    char **keys = NULL;
    *n = 0;
    if (!repo_ns_on(s)) {
        keys = xcalloc(1, sizeof *keys);
        keys[(*n)++] = xstrdup(model);
        return keys;
    }
    pthread_rwlock_rdlock(&s->lock);
    for (size_t i = 0; i < s->n_models; i++)
        if (repo_key_is_name(s->models[i]->key, model)) {
            keys = xrealloc(keys, (*n + 1) * sizeof *keys);
            keys[(*n)++] = xstrdup(s->models[i]->key);
        }
    pthread_rwlock_unlock(&s->lock);
    return keys;
}

/* An unload whose versions are out of service, finished on its own thread
 * (nereid_server_unload_model_async). */
typedef struct async_unload {
    nereid_server_t *s;
    unloading_t u;
    bool dependents;
} async_unload_t;

/* Caller holds s->control. */
static void async_unload_run(async_unload_t *a)
{
    nereid_server_t *s = a->s;
    repo_claim_transfer(s, a->u.key, false);
    unload_finish(s, &a->u);
    repo_unclaim(s, a->u.key, true);
    unload_users(s, a->u.key, 0);
    unload_deps(s, a->u.key, a->u.deps, a->u.n_deps, a->dependents, 0);
    free(a->u.key);
    free(a);
    s->n_async_unloads--;
    pthread_cond_broadcast(&s->claim_ended);
}

static void *async_unload_main(void *arg)
{
    async_unload_t *a = arg;
    nereid_server_t *s = a->s;
    pthread_mutex_lock(&s->control);
    async_unload_run(a);
    pthread_mutex_unlock(&s->control);
    return NULL;
}

static nereid_error_t *unload_request(nereid_server_t *s, const char *model, bool dependents,
                                      bool wait)
{
    nereid_error_t *err = check_explicit(s);
    if (err) return err;
    if (!repo_valid_model_name(model))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "invalid model name '%s'",
                                model ? model : "");
    pthread_mutex_lock(&s->control);
    size_t n;
    char **keys = unload_keys(s, model, &n);
    for (size_t i = 0; i < n; i++) {
        if (wait) {
            repo_unload_model(s, keys[i], dependents, 0);
            continue;
        }
        nereid_error_t *cerr = repo_claim(s, keys[i], true);
        if (cerr) { /* the caller is told (the first one) */
            LOG_ERROR("failed to unload '%s': %s", keys[i], nereid_error_message(cerr));
            if (err)
                nereid_error_free(cerr);
            else
                err = cerr;
            continue;
        }
        async_unload_t *a = xcalloc(1, sizeof *a);
        a->s = s;
        a->dependents = dependents;
        unload_detach(s, keys[i], &a->u);
        repo_claim_transfer(s, keys[i], true);
        s->n_async_unloads++;
        /* not nereid_run_detached: the fallback runs under control, held here */
        if (!nereid_start_detached(async_unload_main, a)) async_unload_run(a);
    }
    repo_free_names(keys, n);
    pthread_mutex_unlock(&s->control);
    return err;
}

nereid_error_t *nereid_server_unload_model(nereid_server_t *s, const char *model,
                                           bool unload_dependents)
{
    return unload_request(s, model, unload_dependents, true);
}

nereid_error_t *nereid_server_unload_model_async(nereid_server_t *s, const char *model,
                                                 bool unload_dependents)
{
    return unload_request(s, model, unload_dependents, false);
}

/* ---- Poll mode ---- */

static void remove_entry(nereid_server_t *s, const char *key)
{
    nereid_error_t *err = repo_claim(s, key, true);
    if (err) {
        nereid_error_free(err);
        return;
    }
    char **deps;
    size_t n_deps;
    unload_claimed(s, key, &deps, &n_deps);
    repo_free_names(deps, n_deps);
    const char *ns;
    char *name = repo_key_split(key, &ns);
    pthread_rwlock_wrlock(&s->lock);
    /* Triton (PollAndUpdate): a deleted model is unloaded, and its
     * lifecycle entry stays: a request for it is told "has no available
     * versions", not "is not found". (Namespacing and load on demand drop
     * the entry, as before.) */
    model_entry_t *kept =
        repo_ns_on(s) || s->opts.model_load_on_demand ? NULL : repository_find(s, key);
    if (kept) {
        kept->removed = true;
        kept->tree_sig = 0;
    }
    for (size_t i = 0; i < s->n_models && !kept; i++) {
        if (strcmp(s->models[i]->key, key) != 0) continue;
        repo_entry_free(s->models[i]);
        memmove(&s->models[i], &s->models[i + 1], (s->n_models - i - 1) * sizeof *s->models);
        s->n_models--;
        break;
    }
    pthread_rwlock_unlock(&s->lock);
    repo_unclaim(s, key, true);
    LOG_INFO("model '%s' was removed from the repository", name);
    free(name);
}

/* Whether ready ensemble e's steps resolve to other model keys than those
 * it was loaded with. Caller holds s->lock (read). */
static bool steps_moved(nereid_server_t *s, const model_entry_t *e)
{
    if (!e->config || !repo_entry_has_ready(e) || !repo_is_ensemble(e->config) ||
        !e->config->ensemble_scheduling)
        return false;
    const Inference__ModelEnsembling *es = e->config->ensemble_scheduling;
    bool moved = false;
    for (size_t i = 0; i < es->n_step && !moved; i++) {
        char *now = repo_resolve_step(s, e->ns, es->step[i]->model_name);
        char *was = repo_step_key(s, es->step[i]);
        moved = !now || strcmp(now, was) != 0;
        free(now);
        free(was);
    }
    return moved;
}

void repository_poll(nereid_server_t *s)
{
    pthread_mutex_lock(&s->control);
    nereid_error_t *err = server_exit_refusal(s); /* Triton polls only while ready */
    if (err) {
        nereid_error_free(err);
        pthread_mutex_unlock(&s->control);
        return;
    }
    err = remote_repo_sync(s, NULL); /* object storage */
    if (err) {
        LOG_ERROR("%s", nereid_error_message(err));
        nereid_error_free(err);
    }
    char **names;
    size_t n = repo_scan_names(s, &names, &err);
    if (err) {
        LOG_ERROR("%s", nereid_error_message(err));
        nereid_error_free(err);
    }
    /* Removed models. */
    char **gone = NULL;
    size_t n_gone = 0;
    pthread_rwlock_rdlock(&s->lock);
    for (size_t i = 0; i < s->n_models; i++) {
        const char *key = s->models[i]->key;
        if (s->models[i]->removed) continue; /* removed by an earlier poll */
        if (!n || !bsearch(&key, names, n, sizeof *names, repo_cmp_str)) {
            gone = xrealloc(gone, (n_gone + 1) * sizeof *gone);
            gone[n_gone++] = xstrdup(s->models[i]->key);
        }
    }
    pthread_rwlock_unlock(&s->lock);
    for (size_t i = 0; i < n_gone; i++) {
        remove_entry(s, gone[i]);
        free(gone[i]);
    }
    free(gone);
    /* New and changed models: plain ones first so ensembles find their steps. */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < n; i++) {
            size_t count;
            char *dir = repo_locate(s, names[i], &count);
            if (!dir) continue;
            uint64_t sig = repo_tree_sig(dir, 14695981039346656037ULL, 0);
            pthread_rwlock_rdlock(&s->lock);
            model_entry_t *e = repository_find(s, names[i]);
            bool changed = !e || e->tree_sig != sig;
            /* Namespacing: a loaded ensemble whose steps now resolve to
             * other copies (one removed or added) is loaded again, as
             * Triton reconnects its dependency graph. */
            if (!changed && pass == 1 && repo_ns_on(s)) changed = steps_moved(s, e);
            /* On demand: a model not loaded is loaded by its first request,
             * not by the poll; a new one is only listed. */
            bool listed_only = s->opts.model_load_on_demand && (!e || !repo_entry_has_ready(e));
            pthread_rwlock_unlock(&s->lock);
            if (changed && listed_only) {
                pthread_rwlock_wrlock(&s->lock);
                if (!repository_find(s, names[i])) repo_entry_add(s, names[i], dir);
                pthread_rwlock_unlock(&s->lock);
                free(dir);
                continue;
            }
            model_config_t *cfg = NULL;
            const char *ns;
            char *name = repo_key_split(names[i], &ns);
            if (changed) nereid_error_free(repo_read_config(s, name, dir, NULL, &cfg));
            if (changed && repo_is_ensemble(cfg) == (pass == 1)) {
                LOG_INFO("model '%s' changed on disk, (re)loading", name);
                load_ctx_t ctx = {.depth = 0, .load_deps = true, .config = cfg, .held = true};
                ctx.chain[0] = names[i];
                nereid_error_free(repo_load_model(s, names[i], NULL, NULL, NULL, NULL, 0, &ctx));
                cfg = ctx.config;
            }
            if (cfg) config_free(cfg);
            free(name);
            free(dir);
        }
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    pthread_mutex_unlock(&s->control);
}

void *repo_poll_main(void *arg)
{
    nereid_server_t *s = arg;
    int secs = s->opts.repository_poll_secs > 0 ? s->opts.repository_poll_secs : 15;
    pthread_mutex_lock(&s->poll_lock);
    while (!s->poll_stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += secs;
        while (!s->poll_stop &&
               pthread_cond_timedwait(&s->poll_cond, &s->poll_lock, &until) != ETIMEDOUT) {
        }
        if (s->poll_stop) break;
        pthread_mutex_unlock(&s->poll_lock);
        repository_poll(s);
        pthread_mutex_lock(&s->poll_lock);
    }
    pthread_mutex_unlock(&s->poll_lock);
    return NULL;
}

/* ---- Shutdown ---- */

void repository_stop(nereid_server_t *s)
{
    if (s->poll_started) {
        pthread_mutex_lock(&s->poll_lock);
        s->poll_stop = true;
        pthread_cond_broadcast(&s->poll_cond);
        pthread_mutex_unlock(&s->poll_lock);
        pthread_join(s->poll_thread, NULL);
        s->poll_started = false;
    }
    pthread_mutex_lock(&s->control);
    while (s->n_claims || s->n_async_unloads) /* operations under way end (new ones see stopping) */
        pthread_cond_wait(&s->claim_ended, &s->control);
    pthread_rwlock_wrlock(&s->lock);
    model_entry_t **models = s->models;
    size_t n = s->n_models;
    s->models = NULL;
    s->n_models = 0;
    pthread_rwlock_unlock(&s->lock);
    /* Ensembles first: their in-flight steps then fail fast on lookup. */
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < n; i++) {
            model_entry_t *e = models[i];
            if (repo_is_ensemble(e->config) != (pass == 0)) continue;
            if (repo_entry_has_ready(e)) LOG_VERBOSE2("AsyncUnload() '%s'", e->name);
            for (size_t v = 0; v < e->n_versions; v++)
                if (e->versions[v].model) {
                    repo_unload_version(e->name, e->versions[v].version, e->versions[v].model);
                    e->versions[v].model = NULL;
                }
        }
    for (size_t i = 0; i < n; i++)
        repo_entry_free(models[i]);
    free(models);
    pthread_mutex_unlock(&s->control);
}
