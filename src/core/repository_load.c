/*
 * This file contains loading one model: its config and versions read, an
 * ensemble's composing models made ready first, each chosen version loaded
 * (or kept, or updated in place), then swapped into the index and the
 * replaced versions drained. It corresponds to Triton's model_lifecycle.cc
 * (AsyncLoad, OnLoadComplete, OnLoadFinal) and to the dependency checks of
 * model_repository_manager.cc.
 *
 * A (re)load prepares the new versions without any server lock, then swaps
 * them into the entry under the write lock, then drains the replaced
 * versions: requests already queued on them finish there, new requests find
 * the new versions. A version that fails to reload keeps its old model
 * serving, with the failure as its reason.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "core/repository.h"
#include "core/repository_internal.h"
#include "core/util.h"

/* Triton's ConfigChangeRequiresReload compares configs without their
 * instance_group and version_policy: the JSON of cfg without them. */
static char *reload_key(const model_config_t *cfg)
{
    model_config_t c = *cfg;
    c.n_instance_group = 0;
    c.instance_group = NULL;
    c.version_policy = NULL;
    return config_to_json(&c);
}

static char *error_reason(const nereid_error_t *err)
{
    return xasprintf("%s: %s", nereid_error_code_name(nereid_error_code(err)),
                     nereid_error_message(err));
}

/* ---- Loading ---- */

/* Triton's circular dependency check: walks the composing models of
 * current (upstream, depth first) looking for start. */
static nereid_error_t *find_cycle(nereid_server_t *s, const char *start, const char *current,
                                  char **steps, size_t n_steps, int depth)
{
    nereid_error_t *err = NULL;
    for (size_t i = 0; i < n_steps && !err; i++) {
        size_t count;
        char *dir = repo_locate(s, steps[i], &count);
        free(dir);
        if (count == 0) continue;
        if (strcmp(steps[i], start) == 0) {
            const char *ns;
            char *start_name = repo_key_split(start, &ns), *cur_name = repo_key_split(current, &ns);
            err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                   "circular dependency between ensembles: %s -> ... -> %s -> %s",
                                   start_name, cur_name, start_name);
            free(start_name);
            free(cur_name);
        } else if (depth < MAX_ENSEMBLE_DEPTH) {
            size_t n;
            char **up = repo_ensemble_steps(s, steps[i], &n);
            err = find_cycle(s, start, steps[i], up, n, depth + 1);
            repo_free_names(up, n);
        }
    }
    return err;
}

/* Adds key to the sorted set keys[*n] unless it is there; whether added. */
static bool key_set_add(char ***keys, size_t *n, const char *key)
{
    size_t at = 0;
    while (at < *n && strcmp((*keys)[at], key) < 0)
        at++;
    if (at < *n && strcmp((*keys)[at], key) == 0) return false;
    *keys = xrealloc(*keys, (*n + 1) * sizeof **keys);
    memmove(&(*keys)[at + 1], &(*keys)[at], (*n - at) * sizeof **keys);
    (*keys)[at] = xstrdup(key);
    (*n)++;
    return true;
}

/* The composing models of ensemble key (config cfg) and, through nested
 * ensembles, theirs (as their configs on disk say): sorted, unique, without
 * key; NULL when none. Triton's load locks this dependency set. */
static char **composing_models(nereid_server_t *s, const char *key, const model_config_t *cfg,
                               size_t *n)
{
    const char *ns;
    free(repo_key_split(key, &ns));
    char **keys = NULL, **todo = NULL;
    size_t n_todo = 0;
    *n = 0;
    const Inference__ModelEnsembling *es = cfg->ensemble_scheduling;
    size_t n_top = es ? es->n_step : 0;
    char **top = xcalloc(n_top ? n_top : 1, sizeof *top);
    for (size_t i = 0; i < n_top; i++)
        top[i] = repo_resolve_step(s, ns, es->step[i]->model_name);
    for (char **sub = top, **next = NULL; sub; sub = next, next = NULL) {
        for (size_t i = 0; i < n_top; i++) {
            if (!sub[i] || strcmp(sub[i], key) == 0 || !key_set_add(&keys, n, sub[i])) continue;
            todo = xrealloc(todo, (n_todo + 1) * sizeof *todo);
            todo[n_todo++] = xstrdup(sub[i]);
        }
        repo_free_names(sub, n_top);
        n_top = 0;
        while (n_todo && !next) { /* a nested ensemble's steps come next */
            char *k = todo[--n_todo];
            next = repo_ensemble_steps(s, k, &n_top);
            free(k);
        }
    }
    free(todo);
    return keys;
}

/* Makes every composing model of an ensemble ready (loading it when
 * ctx->load_deps, or when it is an ensemble not tried yet). Triton's checks
 * and texts, in its order: composing models that do not exist, circular
 * dependencies, then each composing model's state. */
static nereid_error_t *load_dependencies(nereid_server_t *s, const char *key, const char *name,
                                         model_config_t *cfg, load_ctx_t *ctx)
{
    const Inference__ModelEnsembling *es = cfg->ensemble_scheduling;
    size_t n_steps = es ? es->n_step : 0;
    const char *ens_ns;
    free(repo_key_split(key, &ens_ns));
    char **steps = xcalloc(n_steps ? n_steps : 1, sizeof *steps);
    /* missing ones: sorted, unique, comma separated (Triton keeps a set) */
    char **missing = xcalloc(n_steps ? n_steps : 1, sizeof *missing);
    size_t n_missing = 0;
    for (size_t i = 0; i < n_steps; i++) {
        const char *step = es->step[i]->model_name;
        steps[i] = repo_resolve_step(s, ens_ns, step);
        size_t count = 0, at = 0;
        if (steps[i]) free(repo_locate(s, steps[i], &count));
        if (count != 0) {
            if (repo_ns_on(s)) { /* Triton sets the namespace it found in the step */
                const char *step_ns;
                free(repo_key_split(steps[i], &step_ns));
                repo_set_pb_string(&es->step[i]->model_namespace, step_ns ? step_ns : "");
            }
            continue;
        }
        if (!steps[i]) steps[i] = xstrdup(step);
        while (at < n_missing && strcmp(missing[at], step) < 0)
            at++;
        if (at < n_missing && strcmp(missing[at], step) == 0) continue;
        memmove(&missing[at + 1], &missing[at], (n_missing - at) * sizeof *missing);
        missing[at] = es->step[i]->model_name;
        n_missing++;
    }
    char *list = xstrdup("");
    for (size_t k = 0; k < n_missing; k++) {
        char *m = xasprintf("%s%s%s", list, k ? ", " : "", missing[k]);
        free(list);
        list = m;
    }
    free(missing);
    nereid_error_t *err = NULL;
    if (n_missing) /* Triton names the ensemble <namespace>::<name> */
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "ensemble %s%s%s contains models that are not available or "
                               "ambiguous: %s",
                               ens_ns ? ens_ns : "", ens_ns ? "::" : "", name, list);
    free(list);
    if (!err) err = find_cycle(s, key, name, steps, n_steps, 0);
    for (size_t i = 0; !err && i < n_steps; i++) {
        const char *dep_key = steps[i];
        const char *dep = es->step[i]->model_name;
        int64_t version = es->step[i]->model_version;
        if (!repo_model_ready(s, dep_key)) {
            char *reason = NULL;
            model_state_t st = repo_entry_state(s, dep_key, &reason);
            size_t n_sub = 0;
            char **sub_steps = NULL;
            bool nested = ctx->load_deps;
            if (!nested && st == MODEL_UNKNOWN_STATE) {
                sub_steps = repo_ensemble_steps(s, dep_key, &n_sub);
                nested = sub_steps != NULL;
                repo_free_names(sub_steps, n_sub);
            }
            if (!nested) {
                if (reason)
                    err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                           "ensemble '%s' depends on '%s' which has no loaded "
                                           "version. Model '%s' loading failed with error: %s",
                                           name, dep, dep, reason);
                else
                    err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                           "ensemble '%s' depends on '%s' which has no loaded "
                                           "version.",
                                           name, dep);
                free(reason);
                break;
            }
            free(reason);
            if (ctx->depth + 1 >= MAX_ENSEMBLE_DEPTH) {
                err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                       "ensemble '%s' nests deeper than %d levels", name,
                                       MAX_ENSEMBLE_DEPTH);
                break;
            }
            load_ctx_t sub = *ctx;
            sub.depth = ctx->depth + 1;
            sub.chain[sub.depth] = dep_key;
            sub.force = false;
            nereid_error_t *lerr = repo_load_model(s, dep_key, NULL, NULL, NULL, NULL, 0, &sub);
            if (lerr && !repo_model_ready(s, dep_key)) {
                err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                       "ensemble '%s' depends on '%s' which has no loaded "
                                       "version. Model '%s' loading failed with error: %s",
                                       name, dep, dep, nereid_error_message(lerr));
                nereid_error_free(lerr);
                break;
            }
            nereid_error_free(lerr);
        }
        if (version > 0 && !repo_version_ready(s, dep_key, version))
            err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                   "ensemble '%s' depends on '%s' whose required version %lld is "
                                   "not loaded.",
                                   name, dep, (long long)version);
    }
    repo_free_names(steps, n_steps);
    return err;
}

static void set_entry_failure(nereid_server_t *s, model_entry_t *e, const nereid_error_t *err,
                              uint64_t sig, bool poll_failed)
{
    pthread_rwlock_wrlock(&s->lock);
    e->tree_sig = sig;
    free(e->reason);
    e->reason = error_reason(err);
    if (repo_entry_has_ready(e)) {
        /* A broken change: the served versions stay, and say why. */
        for (size_t v = 0; v < e->n_versions; v++) {
            free(e->versions[v].reason);
            e->versions[v].reason = xstrdup(e->reason);
        }
    } else {
        /* Rows of earlier (unloaded, failed) versions give way to the
         * model-level failure. */
        repo_free_versions(e->versions, e->n_versions);
        e->versions = NULL;
        e->n_versions = 0;
        e->state = MODEL_UNAVAILABLE;
        e->poll_failed = poll_failed;
    }
    pthread_rwlock_unlock(&s->lock);
}

static void add_tmp_dir(model_entry_t *e, char *dir)
{
    e->tmp_dirs = xrealloc(e->tmp_dirs, (e->n_tmp_dirs + 1) * sizeof *e->tmp_dirs);
    e->tmp_dirs[e->n_tmp_dirs++] = dir;
}

/* Removes override directories no served version was loaded from (their
 * models have been drained and read their files at load). */
void repo_drop_unused_tmp_dirs(nereid_server_t *s, model_entry_t *e)
{
    pthread_rwlock_wrlock(&s->lock);
    size_t w = 0;
    for (size_t i = 0; i < e->n_tmp_dirs; i++) {
        char *d = e->tmp_dirs[i];
        bool used = e->load_dir && strcmp(e->load_dir, d) == 0;
        for (size_t v = 0; v < e->n_versions && !used; v++)
            used = e->versions[v].model && strcmp(e->versions[v].model->dir, d) == 0;
        if (used) {
            e->tmp_dirs[w++] = d;
        } else {
            repo_remove_tree(d);
            free(d);
        }
    }
    e->n_tmp_dirs = w;
    pthread_rwlock_unlock(&s->lock);
}

static int cmp_version_entry(const void *a, const void *b)
{
    return repo_cmp_i64(&((const version_entry_t *)a)->version,
                        &((const version_entry_t *)b)->version);
}

static int64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Unloads one version's model, with Triton's line (ModelLifeCycle's
 * OnDestroy: one per version). */
void repo_unload_version(const char *name, int64_t version, model_t *m)
{
    model_unload(m);
    LOG_INFO("successfully unloaded '%s' version %" PRId64, name, version);
}

/* ---- One load, in phases ----
 *
 * A load of one model is a plan carried through these phases, in order:
 * plan_resolve (its directory and entry), plan_read (config, composing
 * models, versions), plan_prepare (each chosen version kept, updated or
 * loaded, without server locks), plan_finalize (Triton's OnLoadFinal: all
 * or nothing), plan_commit (the swap under the write lock) and plan_drain
 * (the replaced versions unloaded). s->control is lent around a backend's
 * model code only (model_load, model_update_instances, model_unload). */

typedef struct load_plan {
    /* The load asked for. */
    nereid_server_t *s;
    const char *key, *name, *ns; /* name and namespace (or NULL) of key */
    const char *override_json;
    const char *const *paths;
    const void *const *contents;
    const size_t *sizes;
    size_t n_files;
    load_ctx_t *ctx;
    /* plan_resolve */
    char *dir;    /* the model directory (or the override's) */
    size_t count; /* how many repositories have it */
    char *tmp;    /* override directory made by this load, or NULL */
    uint64_t sig; /* poll mode: the directory's tree signature, else 0 */
    model_entry_t *e;
    /* plan_read */
    const char *load_dir; /* tmp, or dir */
    model_config_t *cfg;  /* NULL once the entry took it */
    bool config_failed;   /* the config could not be read or validated (Triton: poll failed) */
    int64_t *chosen;      /* [k] versions the policy chooses */
    size_t k;
    /* plan_prepare */
    char *cfg_key;       /* cfg's JSON; NULL once the entry took it */
    bool same_config;    /* same config and directory as the served versions */
    bool may_update;     /* only instance groups / version policy changed */
    version_entry_t *nv; /* [k] the entry's new versions (k grows in finalize, commit) */
    model_t **fresh;     /* [k] per version: loaded by this load, or NULL */
    bool *update_failed; /* [k] per version: its in-place update failed, it serves as before */
    bool any_new, any_updated, any_failed;
    /* plan_finalize */
    char *err_text;    /* the failed versions' reasons, or NULL */
    model_t **discard; /* models this load loaded and gives up */
    int64_t *discard_v;
    size_t n_discard;
    bool step_gone; /* an ensemble whose step was unloaded meanwhile */
    char **steps;   /* an ensemble's composing models, held until the load ends */
    size_t n_steps;
    /* plan_commit */
    model_t **drain; /* the served models the swap replaced */
    int64_t *drain_v;
    size_t n_drain;
} load_plan_t;

static void plan_free(load_plan_t *p)
{
    if (p->cfg) config_free(p->cfg);
    free(p->chosen);
    free(p->cfg_key);
    free(p->fresh);
    free(p->update_failed);
    free(p->err_text);
    free(p->discard);
    free(p->discard_v);
    free(p->drain);
    free(p->drain_v);
    if (p->tmp) { /* a failed load's override directory */
        repo_remove_tree(p->tmp);
        free(p->tmp);
    }
    free(p->dir);
}

/* Finds the model's directory (or writes a whole-model override's) and its
 * entry, added when new and marked LOADING when nothing of it serves.
 * *unchanged: nothing to do (Triton: after a load with a config override,
 * a load without one finds the model unmodified unless something in its
 * directory changed after the override). */
static nereid_error_t *plan_resolve(load_plan_t *p, bool *unchanged)
{
    nereid_server_t *s = p->s;
    *unchanged = false;
    if (!repo_valid_model_name(p->name))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "invalid model name '%s'",
                                p->name ? p->name : "");
    p->dir = repo_locate(s, p->key, &p->count);
    if (!p->dir && p->override_json && p->n_files) {
        /* Triton: a model given whole (config and files) needs no
         * directory in a repository; its files' directory stands in. */
        nereid_error_t *err =
            repo_make_override_dir(p->name, p->paths, p->contents, p->sizes, p->n_files, &p->tmp);
        if (err) return err;
        p->dir = xstrdup(p->tmp);
    }
    if (!p->dir)
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "failed to load '%s', failed to poll from model repository",
                                p->name);
    /* Only the poll compares signatures: other modes skip the tree walk. */
    p->sig = s->opts.model_control_mode == NEREID_MODEL_CONTROL_POLL
                 ? repo_tree_sig(p->dir, 14695981039346656037ULL, 0)
                 : 0;
    pthread_rwlock_wrlock(&s->lock);
    model_entry_t *e = repository_find(s, p->key);
    if (!e) e = repo_entry_add(s, p->key, p->dir);
    p->e = e;
    e->removed = false;
    if (!p->override_json && !p->n_files && !p->tmp && e->override_ns && repo_entry_has_ready(e) &&
        repo_dir_contents_mtime_ns(p->dir) <= e->override_ns) {
        pthread_rwlock_unlock(&s->lock);
        *unchanged = true;
        return NULL;
    }
    if (!repo_entry_has_ready(e)) e->state = MODEL_LOADING;
    e->poll_failed = false;
    pthread_rwlock_unlock(&s->lock);
    if (p->count > 1) {
        nereid_error_t *err =
            nereid_error_new(NEREID_ERROR_INVALID_ARG, "model appears in two or more repositories");
        pthread_rwlock_wrlock(&s->lock);
        e->tree_sig = p->sig;
        e->state = MODEL_UNAVAILABLE;
        free(e->reason);
        e->reason = xstrdup("model appears in two or more repositories");
        pthread_rwlock_unlock(&s->lock);
        return err;
    }
    return NULL;
}

/* A load that failed before any version loaded: the entry says why. When
 * every version directory is gone, nothing is served any more. */
static nereid_error_t *plan_fail(load_plan_t *p, nereid_error_t *err)
{
    nereid_server_t *s = p->s;
    model_entry_t *e = p->e;
    LOG_ERROR("failed to load '%s': %s", p->name, nereid_error_message(err));
    if (p->k != 0 || !p->cfg || nereid_error_code(err) != NEREID_ERROR_INTERNAL) {
        set_entry_failure(s, e, err, p->sig, p->config_failed);
        return err;
    }
    pthread_rwlock_wrlock(&s->lock);
    version_entry_t *old = e->versions;
    size_t n_old = e->n_versions;
    e->versions = NULL;
    e->n_versions = 0;
    e->state = MODEL_UNAVAILABLE;
    free(e->reason);
    e->reason = error_reason(err);
    e->tree_sig = p->sig;
    pthread_rwlock_unlock(&s->lock);
    repo_control_lend(s, p->ctx->held);
    for (size_t v = 0; v < n_old; v++)
        if (old[v].model) repo_unload_version(p->name, old[v].version, old[v].model);
    repo_control_take_back(s, p->ctx->held);
    repo_free_versions(old, n_old);
    return err;
}

/* Writes the load's file overrides, reads its config (or takes the one
 * start-up or the poll read), makes an ensemble's composing models ready
 * and chooses the versions. */
static nereid_error_t *plan_read(load_plan_t *p)
{
    nereid_server_t *s = p->s;
    nereid_error_t *err = NULL;
    if (p->n_files && !p->tmp) {
        err = repo_make_override_dir(p->name, p->paths, p->contents, p->sizes, p->n_files, &p->tmp);
        if (err) {
            if (!repo_entry_has_ready(p->e)) set_entry_failure(s, p->e, err, p->sig, false);
            return err;
        }
    }
    p->load_dir = p->tmp ? p->tmp : p->dir;
    if (p->ctx->config && !p->override_json && !p->tmp) {
        p->cfg = p->ctx->config; /* read by the start-up pass: not twice */
        p->ctx->config = NULL;
    } else {
        err = repo_read_config(s, p->name, p->load_dir, p->override_json, &p->cfg);
        p->config_failed = err != NULL;
    }
    if (!err && repo_is_ensemble(p->cfg)) {
        /* held until the whole load ends (load_model_as), so no step is
         * unloaded or reloaded by another operation meanwhile */
        p->steps = composing_models(s, p->key, p->cfg, &p->n_steps);
        err = repo_reserve(s, p->steps, p->n_steps, p->ctx->held);
        if (err) {
            repo_free_names(p->steps, p->n_steps);
            p->steps = NULL;
            p->n_steps = 0;
        }
    }
    if (!err && repo_is_ensemble(p->cfg))
        err = load_dependencies(s, p->key, p->name, p->cfg, p->ctx);
    if (!err) {
        int64_t *avail = NULL;
        size_t n = repo_list_versions(p->load_dir, &avail, true);
        p->chosen = xcalloc(n ? n : 1, sizeof *p->chosen);
        p->k = repo_select_versions(p->cfg, avail, n, p->chosen);
        free(avail);
        if (p->k == 0)
            err = nereid_error_new(NEREID_ERROR_INTERNAL,
                                   "failed to load '%s', no version is available", p->name);
    }
    return err ? plan_fail(p, err) : NULL;
}

/* Updates served version i's instances in place (Triton does when only its
 * instance groups or version policy changed and its files did not). An
 * update that fails leaves the version serving as before (Triton's
 * UpdateModelConfig: the load fails, "version N is at READY state"). */
static void update_version(load_plan_t *p, size_t i, model_t *old, uint64_t old_sig)
{
    version_entry_t *v = &p->nv[i];
    repo_control_lend(p->s, p->ctx->held);
    nereid_error_t *uerr = model_update_instances(old, p->cfg);
    repo_control_take_back(p->s, p->ctx->held);
    v->model = old; /* the same model serves, with the new instances */
    v->state = MODEL_READY;
    v->files_sig = old_sig;
    if (uerr) {
        p->any_failed = true;
        p->update_failed[i] = true;
        v->reason = error_reason(uerr);
        LOG_ERROR("failed to update '%s' version %" PRId64 ": %s", p->name, v->version, v->reason);
        nereid_error_free(uerr);
    } else {
        p->any_updated = true;
    }
}

/* Loads version i (retried --model-load-retry-count times); on failure the
 * old model of this version, if any, keeps serving. */
static void load_version(load_plan_t *p, size_t i, model_t *old)
{
    nereid_server_t *s = p->s;
    version_entry_t *v = &p->nv[i];
    model_load_args_t args = {
        .name = p->name,
        .model_namespace = p->ns,
        .dir = p->load_dir,
        .version = v->version,
        .config = p->cfg,
        .backend_dir = s->backend_dir,
        .backend_settings = s->backend_settings,
        .n_backend_settings = s->n_backend_settings,
        .autocomplete_allowed = repo_autofill_allowed(s),
    };
    model_t *m = NULL;
    LOG_INFO("loading: %s:%" PRId64, p->name, v->version);
    repo_control_lend(s, p->ctx->held);
    nereid_error_t *lerr = model_load(s, &args, &m);
    /* Triton's --model-load-retry-count: each version's load is tried
     * up to that many more times before it counts as failed. */
    for (int retry = 0; lerr && retry < s->opts.model_load_retry_count; retry++) {
        LOG_INFO("retrying load of '%s' version %" PRId64 " (%d of %d): %s", p->name, v->version,
                 retry + 1, s->opts.model_load_retry_count, nereid_error_message(lerr));
        nereid_error_free(lerr);
        m = NULL;
        lerr = model_load(s, &args, &m);
    }
    repo_control_take_back(s, p->ctx->held);
    if (lerr) {
        p->any_failed = true;
        v->state = MODEL_UNAVAILABLE;
        v->reason = error_reason(lerr);
        LOG_ERROR("failed to load '%s' version %" PRId64 ": %s", p->name, v->version, v->reason);
        nereid_error_free(lerr);
        if (old) {
            /* Keep the old model of this version serving. */
            v->model = old;
            v->state = MODEL_READY;
        }
    } else {
        v->model = p->fresh[i] = m;
        v->state = MODEL_READY;
        v->files_sig = repo_version_files_sig(p->load_dir, v->version);
        p->any_new = true;
    }
}

/* Chosen version i: kept when nothing changed, updated in place when only
 * its instances did, else loaded. */
static void prepare_version(load_plan_t *p, size_t i)
{
    nereid_server_t *s = p->s;
    model_entry_t *e = p->e;
    version_entry_t *v = &p->nv[i];
    v->version = p->chosen[i];
    model_t *old = NULL;
    uint64_t old_sig = 0;
    pthread_rwlock_rdlock(&s->lock);
    for (size_t j = 0; j < e->n_versions; j++)
        if (e->versions[j].version == v->version && e->versions[j].state == MODEL_READY) {
            old = e->versions[j].model;
            old_sig = e->versions[j].files_sig;
        }
    pthread_rwlock_unlock(&s->lock);
    /* Triton's IsModelVersionModified: a version whose files changed
     * is loaded again even when its config did not. */
    bool same_files = old && (p->same_config || p->may_update) &&
                      repo_version_files_sig(p->load_dir, v->version) == old_sig;
    if (same_files && p->same_config && !p->ctx->force) {
        v->model = old; /* unchanged: the same model keeps serving */
        v->state = MODEL_READY;
        v->files_sig = old_sig;
        return;
    }
    if (same_files && p->may_update && model_can_update_instances(old))
        update_version(p, i, old, old_sig);
    else
        load_version(p, i, old);
}

/* Prepares every chosen version (reusing unchanged ones) without locks. */
static void plan_prepare(load_plan_t *p)
{
    nereid_server_t *s = p->s;
    model_entry_t *e = p->e;
    p->cfg_key = config_to_json(p->cfg);
    pthread_rwlock_rdlock(&s->lock);
    bool same_dir = e->load_dir && strcmp(e->load_dir, p->load_dir) == 0;
    p->same_config = e->config_key && strcmp(e->config_key, p->cfg_key) == 0 && same_dir;
    /* Triton updates a served version in place when only its instance
     * groups (or version policy) changed and its files did not. */
    char *old_rkey = same_dir && !p->tmp && e->config && !repo_is_ensemble(e->config) &&
                             !repo_is_ensemble(p->cfg)
                         ? reload_key(e->config)
                         : NULL;
    pthread_rwlock_unlock(&s->lock);
    char *new_rkey = old_rkey ? reload_key(p->cfg) : NULL;
    p->may_update = old_rkey && strcmp(old_rkey, new_rkey) == 0;
    free(old_rkey);
    free(new_rkey);
    p->nv = xcalloc(p->k, sizeof *p->nv);
    p->fresh = xcalloc(p->k, sizeof *p->fresh);
    p->update_failed = xcalloc(p->k, sizeof *p->update_failed);
    for (size_t i = 0; i < p->k; i++)
        prepare_version(p, i);
}

/* Appends a row to the new versions (p->k grows). */
static version_entry_t *plan_add_row(load_plan_t *p, int64_t version)
{
    p->nv = xrealloc(p->nv, (p->k + 1) * sizeof *p->nv);
    version_entry_t *v = &p->nv[p->k++];
    memset(v, 0, sizeof *v);
    v->version = version;
    return v;
}

/* Triton (ModelLifeCycle::OnLoadFinal): when any version fails, every
 * version loaded by this load is unloaded again; what served before keeps
 * serving, the config included. */
static void keep_served_on_failure(load_plan_t *p)
{
    nereid_server_t *s = p->s;
    model_entry_t *e = p->e;
    p->discard = xcalloc(p->k, sizeof *p->discard);
    p->discard_v = xcalloc(p->k, sizeof *p->discard_v);
    pthread_rwlock_rdlock(&s->lock);
    for (size_t i = 0; i < p->k; i++) {
        version_entry_t *v = &p->nv[i];
        if (!p->fresh[i]) continue;
        p->discard_v[p->n_discard] = v->version;
        p->discard[p->n_discard++] = p->fresh[i];
        v->model = NULL;
        v->state = MODEL_UNAVAILABLE;
        v->reason = xstrdup("unloaded");
        for (size_t j = 0; j < e->n_versions; j++)
            if (e->versions[j].version == v->version && e->versions[j].state == MODEL_READY) {
                v->model = e->versions[j].model;
                v->state = MODEL_READY;
                v->files_sig = e->versions[j].files_sig;
                free(v->reason);
                v->reason = NULL;
            }
    }
    /* Serving versions the new policy would not choose stay too. */
    for (size_t j = 0; j < e->n_versions; j++) {
        bool listed = false;
        for (size_t i = 0; i < p->k; i++)
            listed |= p->nv[i].version == e->versions[j].version;
        if (listed || e->versions[j].state != MODEL_READY) continue;
        version_entry_t *v = plan_add_row(p, e->versions[j].version);
        v->model = e->versions[j].model;
        v->state = MODEL_READY;
        v->files_sig = e->versions[j].files_sig;
    }
    pthread_rwlock_unlock(&s->lock);
    p->any_new = false;
}

/* An ensemble whose step was unloaded while the ensemble loaded (that
 * unload waited for the step's load, not for the ensemble's): Triton's
 * dependency graph unloads the ensemble once its load completes. */
static void unload_if_step_gone(load_plan_t *p)
{
    nereid_server_t *s = p->s;
    const model_config_t *cfg = p->cfg;
    if (p->any_failed || !repo_is_ensemble(cfg) || !cfg->ensemble_scheduling ||
        s->opts.model_load_on_demand)
        return;
    pthread_rwlock_rdlock(&s->lock);
    const Inference__ModelEnsembling *es = cfg->ensemble_scheduling;
    for (size_t st = 0; st < es->n_step && !p->step_gone; st++) {
        char *sk = repo_step_key(s, es->step[st]);
        model_entry_t *se = repository_find(s, sk);
        p->step_gone = !se || !repo_entry_has_ready(se);
        if (p->step_gone) LOG_INFO("unloading '%s': its step '%s' is unloaded", p->name, sk);
        free(sk);
    }
    pthread_rwlock_unlock(&s->lock);
    if (!p->step_gone) return;
    p->discard = xcalloc(p->k, sizeof *p->discard);
    p->discard_v = xcalloc(p->k, sizeof *p->discard_v);
    for (size_t i = 0; i < p->k; i++) {
        version_entry_t *v = &p->nv[i];
        /* loaded now: discarded here; served before: drained by the commit */
        if (p->fresh[i]) {
            p->discard_v[p->n_discard] = v->version;
            p->discard[p->n_discard++] = p->fresh[i];
        }
        v->model = NULL;
        v->state = MODEL_UNAVAILABLE;
        free(v->reason);
        v->reason = xstrdup("unloaded");
    }
}

/* Triton's OnLoadFinal: the load succeeds or fails as a whole. */
static void plan_finalize(load_plan_t *p)
{
    for (size_t i = 0; i < p->k; i++) {
        if (!p->nv[i].reason) continue;
        char *prev = p->err_text;
        bool ready = p->update_failed && p->update_failed[i];
        p->err_text = xasprintf("%sversion %" PRId64 " is at %s state: %s;\n", prev ? prev : "",
                                p->nv[i].version, ready ? "READY" : "UNAVAILABLE", p->nv[i].reason);
        free(prev);
    }
    if (p->any_failed) keep_served_on_failure(p);
    unload_if_step_gone(p);
    free(p->fresh);
    p->fresh = NULL;
    /* Triton's OnLoadFinal: one line for the whole load (and its trace line) */
    LOG_VERBOSE2("OnLoadFinal() '%s' for all version(s)", p->name);
    if (p->any_failed)
        LOG_INFO("failed to load '%s'", p->name);
    else if (p->any_new || p->any_updated || !p->same_config)
        LOG_INFO("successfully loaded '%s'", p->name);
}

/* The served models the new versions replace. Caller holds the write lock. */
static void collect_replaced(load_plan_t *p)
{
    model_entry_t *e = p->e;
    for (size_t j = 0; j < e->n_versions; j++) {
        model_t *m = e->versions[j].model;
        bool kept = false;
        for (size_t i = 0; i < p->k && m; i++)
            kept |= p->nv[i].model == m;
        if (!m || kept) continue;
        p->drain = xrealloc(p->drain, (p->n_drain + 1) * sizeof *p->drain);
        p->drain_v = xrealloc(p->drain_v, (p->n_drain + 1) * sizeof *p->drain_v);
        p->drain_v[p->n_drain] = e->versions[j].version;
        p->drain[p->n_drain++] = m;
    }
}

/* Swaps the new versions (and, when anything was loaded or updated, the
 * config) into the entry under the write lock; collects what is replaced. */
static void plan_commit(load_plan_t *p)
{
    nereid_server_t *s = p->s;
    model_entry_t *e = p->e;
    pthread_rwlock_wrlock(&s->lock);
    collect_replaced(p);
    /* Triton keeps every version it had in the model's lifecycle: one the
     * new load no longer chooses (its directory gone, or the policy
     * changed) is UNAVAILABLE "unloaded" ("version N is not at ready
     * state"), not unknown. */
    size_t k_chosen = p->k;
    for (size_t j = 0; j < e->n_versions; j++) {
        bool listed = false;
        for (size_t i = 0; i < k_chosen; i++)
            listed |= p->nv[i].version == e->versions[j].version;
        if (listed) continue;
        version_entry_t *v = plan_add_row(p, e->versions[j].version);
        v->state = MODEL_UNAVAILABLE;
        v->reason = xstrdup("unloaded");
    }
    if (p->k > k_chosen) qsort(p->nv, p->k, sizeof *p->nv, cmp_version_entry);
    bool any_ready = false;
    for (size_t i = 0; i < p->k; i++)
        if (p->nv[i].state == MODEL_READY) any_ready = true;
    repo_free_versions(e->versions, e->n_versions);
    e->versions = p->nv;
    e->n_versions = p->k;
    p->nv = NULL;
    e->state = any_ready ? MODEL_READY : MODEL_UNAVAILABLE;
    free(e->reason);
    e->reason = p->step_gone ? xstrdup("unloaded") : NULL;
    e->tree_sig = p->sig;
    if (p->any_new || p->any_updated || !e->config) {
        if (e->config) config_free(e->config);
        e->config = p->cfg;
        p->cfg = NULL;
        free(e->config_key);
        e->config_key = p->cfg_key;
        p->cfg_key = NULL;
        free(e->load_dir);
        e->load_dir = xstrdup(p->load_dir);
    }
    if (p->tmp) add_tmp_dir(e, p->tmp);
    p->tmp = NULL;
    if (!p->any_failed) e->override_ns = p->override_json && !p->n_files ? wall_ns() : 0;
    pthread_rwlock_unlock(&s->lock);
}

/* Unloads the replaced and the discarded models (requests already queued
 * on them finish first) and the override directories no longer used; the
 * load's error names each failed version. */
static nereid_error_t *plan_drain(load_plan_t *p)
{
    nereid_server_t *s = p->s;
    repo_control_lend(s, p->ctx->held);
    for (size_t i = 0; i < p->n_drain; i++)
        repo_unload_version(p->name, p->drain_v[i], p->drain[i]);
    for (size_t i = 0; i < p->n_discard; i++)
        repo_unload_version(p->name, p->discard_v[i], p->discard[i]);
    repo_control_take_back(s, p->ctx->held);
    repo_drop_unused_tmp_dirs(s, p->e);
    if (!p->err_text) return NULL;
    size_t len = strlen(p->err_text);
    if (len && p->err_text[len - 1] == '\n') p->err_text[len - 1] = 0;
    return nereid_error_new(NEREID_ERROR_INVALID_ARG, "load failed for model '%s': %s", p->name,
                            p->err_text);
}

/* repo_load_model of key, whose name and namespace (or NULL) are given. */
static nereid_error_t *load_model_as(nereid_server_t *s, const char *key, const char *name,
                                     const char *ns, const char *override_json,
                                     const char *const *paths, const void *const *contents,
                                     const size_t *sizes, size_t n_files, load_ctx_t *ctx)
{
    load_plan_t p = {.s = s,
                     .key = key,
                     .name = name,
                     .ns = ns,
                     .override_json = override_json,
                     .paths = paths,
                     .contents = contents,
                     .sizes = sizes,
                     .n_files = n_files,
                     .ctx = ctx};
    bool unchanged;
    nereid_error_t *err = plan_resolve(&p, &unchanged);
    if (!err && !unchanged) err = plan_read(&p);
    if (!err && !unchanged) {
        plan_prepare(&p);
        plan_finalize(&p);
        plan_commit(&p);
        err = plan_drain(&p);
    }
    if (p.n_steps) repo_unreserve(s, p.steps, p.n_steps, ctx->held);
    repo_free_names(p.steps, p.n_steps);
    plan_free(&p);
    return err;
}

/* The per-model memory gauge (nereid_model_memory_bytes) for a load that
 * ran alone: the RSS it added (at least 1 byte). RSS is the process's, so a
 * load that another load overlapped (parallel start-up loads, an ensemble's
 * steps, a model loading models from its init) cannot be told apart and
 * keeps what it had. Under --model-memory-budget the on-demand and pinned
 * loaders, which load one at a time, charge their own. */
static void note_load_memory(nereid_server_t *s, const char *key, long long grown)
{
    pthread_rwlock_wrlock(&s->lock);
    model_entry_t *e = repository_find(s, key);
    if (e && repo_entry_has_ready(e)) e->memory_bytes = grown < 1 ? 1 : grown;
    pthread_rwlock_unlock(&s->lock);
}

/* Loads or reloads model key, claimed meanwhile. */
nereid_error_t *repo_load_model(nereid_server_t *s, const char *key, const char *override_json,
                                const char *const *paths, const void *const *contents,
                                const size_t *sizes, size_t n_files, load_ctx_t *ctx)
{
    if (!key) return nereid_error_new(NEREID_ERROR_INVALID_ARG, "invalid model name '%s'", "");
    nereid_error_t *err = repo_claim(s, key, ctx->held);
    if (err) return err;
    const char *ns;
    char *name = repo_key_split(key, &ns);
    uint64_t start = atomic_fetch_add(&s->load_starts, 1) + 1;
    bool alone = atomic_fetch_add(&s->loads_running, 1) == 0;
    long long rss0 = repo_rss_bytes();
    err = load_model_as(s, key, name, ns, override_json, paths, contents, sizes, n_files, ctx);
    alone = alone && atomic_load(&s->load_starts) == start;
    atomic_fetch_sub(&s->loads_running, 1);
    if (!err && alone && s->opts.model_memory_budget_bytes <= 0)
        note_load_memory(s, key, repo_rss_bytes() - rss0);
    free(name);
    repo_unclaim(s, key, ctx->held);
    return err;
}
