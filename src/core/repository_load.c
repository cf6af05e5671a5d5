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
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/loader.h"
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
                              uint64_t sig)
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

/* load_model of key, whose name and namespace (or NULL) are given. */
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

static nereid_error_t *load_model_as(nereid_server_t *s, const char *key, const char *name,
                                     const char *ns, const char *override_json,
                                     const char *const *paths, const void *const *contents,
                                     const size_t *sizes, size_t n_files, load_ctx_t *ctx)
{
    if (!repo_valid_model_name(name))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "invalid model name '%s'",
                                name ? name : "");
    size_t count;
    char *dir = repo_locate(s, key, &count);
    char *tmp = NULL;
    if (!dir && override_json && n_files) {
        /* Triton: a model given whole (config and files) needs no
         * directory in a repository; its files' directory stands in. */
        nereid_error_t *err = repo_make_override_dir(name, paths, contents, sizes, n_files, &tmp);
        if (err) return err;
        dir = xstrdup(tmp);
    }
    if (!dir)
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "failed to load '%s', failed to poll from model repository", name);
    /* Only the poll compares signatures: other modes skip the tree walk. */
    uint64_t sig = s->opts.model_control_mode == NEREID_MODEL_CONTROL_POLL
                       ? repo_tree_sig(dir, 14695981039346656037ULL, 0)
                       : 0;
    pthread_rwlock_wrlock(&s->lock);
    model_entry_t *e = repository_find(s, key);
    if (!e) e = repo_entry_add(s, key, dir);
    e->removed = false;
    /* Triton: after a load with a config override, a load without one
     * finds the model unmodified (no reload, the override stays) unless
     * something in its directory changed after the override. */
    if (!override_json && !n_files && !tmp && e->override_ns && repo_entry_has_ready(e) &&
        repo_dir_contents_mtime_ns(dir) <= e->override_ns) {
        pthread_rwlock_unlock(&s->lock);
        free(dir);
        return NULL;
    }
    if (!repo_entry_has_ready(e)) e->state = MODEL_LOADING;
    pthread_rwlock_unlock(&s->lock);
    if (count > 1) {
        nereid_error_t *err =
            nereid_error_new(NEREID_ERROR_INVALID_ARG, "model appears in two or more repositories");
        pthread_rwlock_wrlock(&s->lock);
        e->tree_sig = sig;
        e->state = MODEL_UNAVAILABLE;
        free(e->reason);
        e->reason = xstrdup("model appears in two or more repositories");
        pthread_rwlock_unlock(&s->lock);
        free(dir);
        return err;
    }

    nereid_error_t *err = NULL;
    if (n_files && !tmp) {
        err = repo_make_override_dir(name, paths, contents, sizes, n_files, &tmp);
        if (err) {
            free(dir);
            if (!repo_entry_has_ready(e)) set_entry_failure(s, e, err, sig);
            return err;
        }
    }
    const char *load_dir = tmp ? tmp : dir;
    model_config_t *cfg = NULL;
    if (ctx->config && !override_json && !tmp) {
        cfg = ctx->config; /* read by the start-up pass: not twice */
        ctx->config = NULL;
    } else {
        err = repo_read_config(s, name, load_dir, override_json, &cfg);
    }
    if (!err && repo_is_ensemble(cfg)) err = load_dependencies(s, key, name, cfg, ctx);
    int64_t *avail = NULL, *chosen = NULL;
    size_t k = 0;
    if (!err) {
        size_t n = repo_list_versions(load_dir, &avail, true);
        chosen = xcalloc(n ? n : 1, sizeof *chosen);
        k = repo_select_versions(cfg, avail, n, chosen);
        free(avail);
        if (k == 0)
            err = nereid_error_new(NEREID_ERROR_INTERNAL,
                                   "failed to load '%s', no version is available", name);
    }
    if (err) {
        LOG_ERROR("failed to load '%s': %s", name, nereid_error_message(err));
        if (k == 0 && cfg && nereid_error_code(err) == NEREID_ERROR_INTERNAL) {
            /* Every version directory is gone: nothing is served any more. */
            pthread_rwlock_wrlock(&s->lock);
            version_entry_t *old = e->versions;
            size_t n_old = e->n_versions;
            e->versions = NULL;
            e->n_versions = 0;
            e->state = MODEL_UNAVAILABLE;
            free(e->reason);
            e->reason = error_reason(err);
            e->tree_sig = sig;
            pthread_rwlock_unlock(&s->lock);
            repo_control_lend(s, ctx->held);
            for (size_t v = 0; v < n_old; v++)
                if (old[v].model) repo_unload_version(name, old[v].version, old[v].model);
            repo_control_take_back(s, ctx->held);
            repo_free_versions(old, n_old);
        } else {
            set_entry_failure(s, e, err, sig);
        }
        if (cfg) config_free(cfg);
        free(chosen);
        if (tmp) {
            repo_remove_tree(tmp);
            free(tmp);
        }
        free(dir);
        return err;
    }

    /* Prepare every chosen version (reusing unchanged ones) without locks. */
    char *cfg_key = config_to_json(cfg);
    pthread_rwlock_rdlock(&s->lock);
    bool same_dir = e->load_dir && strcmp(e->load_dir, load_dir) == 0;
    bool same_config = e->config_key && strcmp(e->config_key, cfg_key) == 0 && same_dir;
    /* Triton updates a served version in place when only its instance
     * groups (or version policy) changed and its files did not. */
    char *old_rkey =
        same_dir && !tmp && e->config && !repo_is_ensemble(e->config) && !repo_is_ensemble(cfg)
            ? reload_key(e->config)
            : NULL;
    pthread_rwlock_unlock(&s->lock);
    char *new_rkey = old_rkey ? reload_key(cfg) : NULL;
    bool may_update = old_rkey && strcmp(old_rkey, new_rkey) == 0;
    free(old_rkey);
    free(new_rkey);
    bool any_updated = false;
    version_entry_t *nv = xcalloc(k, sizeof *nv);
    model_t **fresh = xcalloc(k, sizeof *fresh); /* per version: loaded now, or NULL */
    bool any_new = false, any_failed = false;
    for (size_t i = 0; i < k; i++) {
        nv[i].version = chosen[i];
        model_t *old = NULL;
        uint64_t old_sig = 0;
        pthread_rwlock_rdlock(&s->lock);
        for (size_t v = 0; v < e->n_versions; v++)
            if (e->versions[v].version == chosen[i] && e->versions[v].state == MODEL_READY) {
                old = e->versions[v].model;
                old_sig = e->versions[v].files_sig;
            }
        pthread_rwlock_unlock(&s->lock);
        /* Triton's IsModelVersionModified: a version whose files changed
         * is loaded again even when its config did not. */
        bool same_files = old && (same_config || may_update) &&
                          repo_version_files_sig(load_dir, chosen[i]) == old_sig;
        if (same_files && same_config && !ctx->force) {
            nv[i].model = old; /* unchanged: the same model keeps serving */
            nv[i].state = MODEL_READY;
            nv[i].files_sig = old_sig;
            continue;
        }
        if (same_files && may_update && model_can_update_instances(old)) {
            repo_control_lend(s, ctx->held);
            nereid_error_t *uerr = model_update_instances(old, cfg);
            repo_control_take_back(s, ctx->held);
            if (uerr && nereid_error_code(uerr) == NEREID_ERROR_UNAVAILABLE) {
                /* an instance cannot leave in place: a full reload */
                LOG_VERBOSE("'%s' version %" PRId64 " reloads: %s", name, chosen[i],
                            nereid_error_message(uerr));
                nereid_error_free(uerr);
                goto reload;
            }
            nv[i].model = old; /* the same model serves, with the new instances */
            nv[i].state = MODEL_READY;
            nv[i].files_sig = old_sig;
            if (uerr) {
                any_failed = true;
                nv[i].reason = error_reason(uerr);
                LOG_ERROR("failed to update '%s' version %" PRId64 ": %s", name, chosen[i],
                          nv[i].reason);
                nereid_error_free(uerr);
            } else {
                any_updated = true;
            }
            continue;
        }
    reload:;
        model_load_args_t args = {
            .name = name,
            .model_namespace = ns,
            .dir = load_dir,
            .version = chosen[i],
            .config = cfg,
            .backend_dir = s->backend_dir,
            .backend_settings = s->backend_settings,
            .n_backend_settings = s->n_backend_settings,
            .autocomplete_allowed = repo_autofill_allowed(s),
        };
        model_t *m = NULL;
        LOG_INFO("loading: %s:%" PRId64, name, chosen[i]);
        repo_control_lend(s, ctx->held);
        nereid_error_t *lerr = model_load(s, &args, &m);
        /* Triton's --model-load-retry-count: each version's load is tried
         * up to that many more times before it counts as failed. */
        for (int retry = 0; lerr && retry < s->opts.model_load_retry_count; retry++) {
            LOG_INFO("retrying load of '%s' version %" PRId64 " (%d of %d): %s", name, chosen[i],
                     retry + 1, s->opts.model_load_retry_count, nereid_error_message(lerr));
            nereid_error_free(lerr);
            m = NULL;
            lerr = model_load(s, &args, &m);
        }
        repo_control_take_back(s, ctx->held);
        if (lerr) {
            any_failed = true;
            nv[i].state = MODEL_UNAVAILABLE;
            nv[i].reason = error_reason(lerr);
            LOG_ERROR("failed to load '%s' version %" PRId64 ": %s", name, chosen[i], nv[i].reason);
            nereid_error_free(lerr);
            if (old) {
                /* Keep the old model of this version serving. */
                nv[i].model = old;
                nv[i].state = MODEL_READY;
            }
        } else {
            nv[i].model = fresh[i] = m;
            nv[i].state = MODEL_READY;
            nv[i].files_sig = repo_version_files_sig(load_dir, chosen[i]);
            any_new = true;
        }
    }
    free(chosen);
    char *err_text = NULL;
    for (size_t i = 0; i < k; i++) {
        if (!nv[i].reason) continue;
        char *prev = err_text;
        err_text = xasprintf("%sversion %" PRId64 " is at UNAVAILABLE state: %s;\n",
                             prev ? prev : "", nv[i].version, nv[i].reason);
        free(prev);
    }
    /* Triton (ModelLifeCycle::OnLoadFinal): when any version fails, every
     * version loaded by this load is unloaded again; what served before
     * keeps serving, the config included. */
    model_t **discard = NULL;
    int64_t *discard_v = NULL;
    size_t n_discard = 0;
    if (any_failed) {
        discard = xcalloc(k, sizeof *discard);
        discard_v = xcalloc(k, sizeof *discard_v);
        pthread_rwlock_rdlock(&s->lock);
        for (size_t i = 0; i < k; i++) {
            if (!fresh[i]) continue;
            discard_v[n_discard] = nv[i].version;
            discard[n_discard++] = fresh[i];
            nv[i].model = NULL;
            nv[i].state = MODEL_UNAVAILABLE;
            nv[i].reason = xstrdup("unloaded");
            for (size_t v = 0; v < e->n_versions; v++)
                if (e->versions[v].version == nv[i].version &&
                    e->versions[v].state == MODEL_READY) {
                    nv[i].model = e->versions[v].model;
                    nv[i].state = MODEL_READY;
                    nv[i].files_sig = e->versions[v].files_sig;
                    free(nv[i].reason);
                    nv[i].reason = NULL;
                }
        }
        /* Serving versions the new policy would not choose stay too. */
        for (size_t v = 0; v < e->n_versions; v++) {
            bool listed = false;
            for (size_t i = 0; i < k; i++)
                listed |= nv[i].version == e->versions[v].version;
            if (listed || e->versions[v].state != MODEL_READY) continue;
            nv = xrealloc(nv, (k + 1) * sizeof *nv);
            memset(&nv[k], 0, sizeof nv[k]);
            nv[k].version = e->versions[v].version;
            nv[k].model = e->versions[v].model;
            nv[k].state = MODEL_READY;
            nv[k].files_sig = e->versions[v].files_sig;
            k++;
        }
        pthread_rwlock_unlock(&s->lock);
        any_new = false;
    }
    /* An ensemble whose step was unloaded while the ensemble loaded (that
     * unload waited for the step's load, not for the ensemble's): Triton's
     * dependency graph unloads the ensemble once its load completes. */
    bool step_gone = false;
    size_t k_fresh = k; /* (k grows only when a version failed) */
    if (!any_failed && repo_is_ensemble(cfg) && cfg->ensemble_scheduling &&
        !s->opts.model_load_on_demand) {
        pthread_rwlock_rdlock(&s->lock);
        const Inference__ModelEnsembling *es = cfg->ensemble_scheduling;
        for (size_t st = 0; st < es->n_step && !step_gone; st++) {
            char *sk = repo_step_key(s, es->step[st]);
            model_entry_t *se = repository_find(s, sk);
            step_gone = !se || !repo_entry_has_ready(se);
            if (step_gone) LOG_INFO("unloading '%s': its step '%s' is unloaded", name, sk);
            free(sk);
        }
        pthread_rwlock_unlock(&s->lock);
    }
    if (step_gone) {
        discard = xcalloc(k, sizeof *discard);
        discard_v = xcalloc(k, sizeof *discard_v);
        for (size_t i = 0; i < k; i++) {
            /* loaded now: discarded here; served before: drained below */
            if (i < k_fresh && fresh[i]) {
                discard_v[n_discard] = nv[i].version;
                discard[n_discard++] = fresh[i];
            }
            nv[i].model = NULL;
            nv[i].state = MODEL_UNAVAILABLE;
            free(nv[i].reason);
            nv[i].reason = xstrdup("unloaded");
        }
    }
    free(fresh);
    /* Triton's OnLoadFinal: one line for the whole load (and its trace line) */
    LOG_VERBOSE2("OnLoadFinal() '%s' for all version(s)", name);
    if (any_failed)
        LOG_INFO("failed to load '%s'", name);
    else if (any_new || any_updated || !same_config)
        LOG_INFO("successfully loaded '%s'", name);

    /* Swap under the write lock; collect what is replaced. */
    model_t **drain = NULL;
    int64_t *drain_v = NULL;
    size_t n_drain = 0;
    pthread_rwlock_wrlock(&s->lock);
    for (size_t v = 0; v < e->n_versions; v++) {
        model_t *m = e->versions[v].model;
        bool kept = false;
        for (size_t i = 0; i < k && m; i++)
            kept |= nv[i].model == m;
        if (m && !kept) {
            drain = xrealloc(drain, (n_drain + 1) * sizeof *drain);
            drain_v = xrealloc(drain_v, (n_drain + 1) * sizeof *drain_v);
            drain_v[n_drain] = e->versions[v].version;
            drain[n_drain++] = m;
        }
    }
    /* Triton keeps every version it had in the model's lifecycle: one the
     * new load no longer chooses (its directory gone, or the policy
     * changed) is UNAVAILABLE "unloaded" ("version N is not at ready
     * state"), not unknown. */
    size_t k_chosen = k;
    for (size_t v = 0; v < e->n_versions; v++) {
        bool listed = false;
        for (size_t i = 0; i < k_chosen; i++)
            listed |= nv[i].version == e->versions[v].version;
        if (listed) continue;
        nv = xrealloc(nv, (k + 1) * sizeof *nv);
        memset(&nv[k], 0, sizeof nv[k]);
        nv[k].version = e->versions[v].version;
        nv[k].state = MODEL_UNAVAILABLE;
        nv[k].reason = xstrdup("unloaded");
        k++;
    }
    if (k > k_chosen) qsort(nv, k, sizeof *nv, cmp_version_entry);
    bool any_ready = false;
    for (size_t i = 0; i < k; i++)
        if (nv[i].state == MODEL_READY) any_ready = true;
    repo_free_versions(e->versions, e->n_versions);
    e->versions = nv;
    e->n_versions = k;
    e->state = any_ready ? MODEL_READY : MODEL_UNAVAILABLE;
    free(e->reason);
    e->reason = step_gone ? xstrdup("unloaded") : NULL;
    e->tree_sig = sig;
    if (any_new || any_updated || !e->config) {
        if (e->config) config_free(e->config);
        e->config = cfg;
        cfg = NULL;
        free(e->config_key);
        e->config_key = cfg_key;
        cfg_key = NULL;
        free(e->load_dir);
        e->load_dir = xstrdup(load_dir);
    }
    if (tmp) add_tmp_dir(e, tmp);
    if (!any_failed) e->override_ns = override_json && !n_files ? wall_ns() : 0;
    pthread_rwlock_unlock(&s->lock);

    repo_control_lend(s, ctx->held);
    for (size_t i = 0; i < n_drain; i++)
        repo_unload_version(name, drain_v[i], drain[i]);
    for (size_t i = 0; i < n_discard; i++)
        repo_unload_version(name, discard_v[i], discard[i]);
    repo_control_take_back(s, ctx->held);
    free(drain);
    free(drain_v);
    free(discard);
    free(discard_v);
    repo_drop_unused_tmp_dirs(s, e);
    if (cfg) config_free(cfg);
    free(cfg_key);
    free(dir);
    if (err_text) {
        size_t len = strlen(err_text);
        if (len && err_text[len - 1] == '\n') err_text[len - 1] = 0;
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG, "load failed for model '%s': %s", name,
                               err_text);
        free(err_text);
        return err;
    }
    return NULL;
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
    err = load_model_as(s, key, name, ns, override_json, paths, contents, sizes, n_files, ctx);
    free(name);
    repo_unclaim(s, key, ctx->held);
    return err;
}
