/*
 * This file contains the model index: model keys (--model-namespacing),
 * the sorted entries of s->models and their lookups, where a model or an
 * ensemble's step is found in the repositories, the claims that let one
 * operation at a time work on a model, and the small state queries the
 * other repository files share. It corresponds to the model infos and
 * dependency nodes of Triton's model_repository_manager.cc.
 *
 * Loads, unloads, polls and on-demand loads take turns under s->control,
 * but let go of it while a backend runs the model's own code (its init and
 * its finalize): that code may load or unload other models itself (a Python
 * model's pb_utils.load_model in initialize), and unrelated models load
 * meanwhile, as Triton loads them in parallel. The models an operation is
 * working on stay claimed until it is done; another operation on one of
 * them waits for it, as Triton waits on a conflicting load.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/repository.h"
#include "core/repository_internal.h"
#include "core/util.h"

/* A model name is one directory name inside its repository: no '/', not
 * "." or "..". A '\\' is an ordinary character on POSIX file systems, and
 * Triton lets it through (its backends decide: the Python backend refuses
 * it in a stub name). */
bool repo_valid_model_name(const char *name)
{
    return name && *name && !strchr(name, '/') && !strchr(name, NS_SEP) && strcmp(name, ".") != 0 &&
           strcmp(name, "..") != 0;
}

/* ---- Model keys (--model-namespacing) ---- */

bool repo_ns_on(const nereid_server_t *s)
{
    return s->opts.model_namespacing;
}

/* The key of model name in repository repo (NULL: none). */
char *repo_make_key(const nereid_server_t *s, const char *name, const char *repo)
{
    return repo_ns_on(s) && repo ? xasprintf("%s%c%s", name, NS_SEP, repo) : xstrdup(name);
}

/* The name part of key (a new string); *ns points at its namespace in key,
 * or is NULL. */
char *repo_key_split(const char *key, const char **ns)
{
    const char *sep = strchr(key, NS_SEP);
    *ns = sep ? sep + 1 : NULL;
    if (!sep) return xstrdup(key);
    size_t n = (size_t)(sep - key);
    char *name = xmalloc(n + 1);
    memcpy(name, key, n);
    name[n] = '\0';
    return name;
}

/* Whether key is model name's key (in any namespace). */
bool repo_key_is_name(const char *key, const char *name)
{
    size_t n = strlen(name);
    return strncmp(key, name, n) == 0 && (key[n] == '\0' || key[n] == NS_SEP);
}

/* The key an ensemble step's model has once the ensemble is loaded (its
 * model_namespace, as Triton sets it, says which copy). */
char *repo_step_key(const nereid_server_t *s, const Inference__ModelEnsembling__Step *st)
{
    const char *ns = st->model_namespace && *st->model_namespace ? st->model_namespace : NULL;
    return repo_make_key(s, st->model_name, ns);
}

/* ---- Entries ---- */

/* Index of the first entry whose key is not less than name (s->models is
 * sorted by key): a binary search, so a lookup stays cheap with thousands
 * of models. */
static size_t entry_lower_bound(const nereid_server_t *s, const char *name)
{
    size_t lo = 0, hi = s->n_models;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(s->models[mid]->key, name) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

model_entry_t *repository_find(nereid_server_t *s, const char *key)
{
    size_t i = entry_lower_bound(s, key);
    return i < s->n_models && strcmp(s->models[i]->key, key) == 0 ? s->models[i] : NULL;
}

model_entry_t *repository_resolve(nereid_server_t *s, const char *ns, const char *name,
                                  nereid_error_t **err)
{
    *err = NULL;
    if (!name || strchr(name, NS_SEP)) return NULL;
    if (!repo_ns_on(s)) return repository_find(s, name);
    if (ns) {
        char *key = repo_make_key(s, name, ns);
        model_entry_t *e = repository_find(s, key);
        free(key);
        return e;
    }
    model_entry_t *first = NULL, *known = NULL;
    size_t n_known = 0;
    for (size_t i = entry_lower_bound(s, name);
         i < s->n_models && strncmp(s->models[i]->key, name, strlen(name)) == 0; i++) {
        model_entry_t *e = s->models[i];
        if (!repo_key_is_name(e->key, name)) continue;
        if (!first) first = e;
        if (e->state != MODEL_UNKNOWN_STATE) {
            n_known++;
            known = e;
        }
    }
    if (n_known > 1) {
        *err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "There are %zu identifiers of model '%s' in global map, model "
                                "namespace must be provided to resolve ambiguity.",
                                n_known, name);
        return NULL;
    }
    return known ? known : first;
}

void repo_free_versions(version_entry_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i].reason);
    free(v);
}

void repo_entry_free(model_entry_t *e)
{
    repo_free_versions(e->versions, e->n_versions);
    if (e->config) config_free(e->config);
    free(e->config_key);
    free(e->load_dir);
    free(e->name);
    free(e->key);
    free(e->ns);
    free(e->dir);
    free(e->reason);
    for (size_t i = 0; i < e->n_tmp_dirs; i++) {
        repo_remove_tree(e->tmp_dirs[i]);
        free(e->tmp_dirs[i]);
    }
    free(e->tmp_dirs);
    free(e);
}

/* Adds an entry (caller holds the write lock); keeps models sorted by key. */
model_entry_t *repo_entry_add(nereid_server_t *s, const char *key, const char *dir)
{
    model_entry_t *e = xcalloc(1, sizeof *e);
    const char *ns;
    e->name = repo_key_split(key, &ns);
    e->key = xstrdup(key);
    e->ns = ns ? xstrdup(ns) : NULL;
    e->dir = xstrdup(dir);
    e->state = MODEL_UNKNOWN_STATE;
    size_t at = entry_lower_bound(s, key);
    s->models = xrealloc(s->models, (s->n_models + 1) * sizeof *s->models);
    memmove(&s->models[at + 1], &s->models[at], (s->n_models - at) * sizeof *s->models);
    s->models[at] = e;
    s->n_models++;
    return e;
}

bool repo_entry_has_ready(const model_entry_t *e)
{
    for (size_t v = 0; v < e->n_versions; v++)
        if (e->versions[v].state == MODEL_READY) return true;
    return false;
}

/* Directories of model key in the repositories (its own only, when key
 * has a namespace): the first one, and how many. */
char *repo_locate(nereid_server_t *s, const char *key, size_t *count)
{
    char *found = NULL;
    *count = 0;
    const char *ns;
    char *name = repo_key_split(key, &ns);
    for (size_t r = 0; r < s->n_repos; r++) {
        if (ns && strcmp(s->repos[r], ns) != 0) continue;
        char *dir = xasprintf("%s/%s", s->repos[r], name);
        if (repo_is_dir(dir)) {
            (*count)++;
            if (!found) {
                found = dir;
                continue;
            }
        }
        free(dir);
    }
    free(name);
    return found;
}

/* Triton's ConnectDependencyGraph with --model-namespacing: a step names the
 * model in its ensemble's own repository first, else the one repository
 * that has it. The step's key, or NULL when no repository or several have
 * it. Without namespacing the step's name. */
char *repo_resolve_step(nereid_server_t *s, const char *ens_ns, const char *step)
{
    if (!repo_ns_on(s)) return xstrdup(step);
    if (!repo_valid_model_name(step)) return NULL;
    size_t count;
    if (ens_ns) {
        char *key = repo_make_key(s, step, ens_ns);
        free(repo_locate(s, key, &count));
        if (count) return key;
        free(key);
    }
    char *found = NULL;
    size_t n = 0;
    for (size_t r = 0; r < s->n_repos; r++) {
        char *dir = xasprintf("%s/%s", s->repos[r], step);
        if (repo_is_dir(dir)) {
            n++;
            free(found);
            found = repo_make_key(s, step, s->repos[r]);
        }
        free(dir);
    }
    if (n == 1) return found;
    free(found);
    return NULL;
}

/* ---- Control ---- */

struct repository_claim {
    char *key;
    bool busy;         /* an operation is changing the model (owner's) */
    uint64_t owner;    /* busy: the operation (load_op_self) */
    bool handed_off;   /* busy, handed to a thread that has not taken it over yet: no owner */
    unsigned reserves; /* ensemble loads that hold it as a composing model: reserver's, */
    uint64_t reserver; /* ... and those of the operations acting for it */
};

static struct repository_claim *claim_find(nereid_server_t *s, const char *key)
{
    for (size_t i = 0; i < s->n_claims; i++)
        if (strcmp(s->claims[i].key, key) == 0) return &s->claims[i];
    return NULL;
}

static struct repository_claim *claim_add(nereid_server_t *s, const char *key)
{
    s->claims = xrealloc(s->claims, (s->n_claims + 1) * sizeof *s->claims);
    struct repository_claim *c = &s->claims[s->n_claims++];
    *c = (struct repository_claim){.key = xstrdup(key)};
    return c;
}

/* Drops c once neither an operation nor an ensemble load holds it, and
 * wakes the operations waiting for a claim. */
static void claim_release(nereid_server_t *s, struct repository_claim *c)
{
    if (!c->busy && !c->reserves) {
        free(c->key);
        *c = s->claims[--s->n_claims];
        if (!s->n_claims) {
            free(s->claims);
            s->claims = NULL;
        }
    }
    pthread_cond_broadcast(&s->claim_ended);
}

/* Waits until a claim ends; "Server not ready" once the server stops.
 * Caller holds s->control. */
static nereid_error_t *claim_wait(nereid_server_t *s)
{
    pthread_cond_wait(&s->claim_ended, &s->control);
    return atomic_load(&s->stopping)
               ? nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready")
               : NULL;
}

/* Claims model key for the calling operation, waiting while another one has
 * it. held: the caller holds s->control (else, at start-up, it is taken
 * here). A claim that the calling operation, or one it acts for
 * (load_ops.c), already has is refused: a model's own init (on the thread
 * loading it, or the backend's thread running its control calls) cannot
 * load or unload that model, and waiting would never end. A composing
 * model that such an operation's ensemble load holds (repo_reserve) is
 * claimed at once: that load loads its steps. */
nereid_error_t *repo_claim(nereid_server_t *s, const char *key, bool held)
{
    if (!held) pthread_mutex_lock(&s->control);
    nereid_error_t *err = NULL;
    while (!err) {
        struct repository_claim *c = claim_find(s, key);
        if (!c) c = claim_add(s, key);
        bool mine = c->busy ? !c->handed_off && load_op_acts_for(c->owner)
                            : !c->reserves || load_op_acts_for(c->reserver);
        if (mine && !c->busy) {
            c->busy = true;
            c->owner = load_op_self();
            c->handed_off = false;
            break;
        }
        if (mine) {
            const char *ns;
            char *name = repo_key_split(key, &ns);
            err = nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                                   "model '%s' is being loaded or unloaded by the call that "
                                   "made this one",
                                   name);
            free(name);
            break;
        }
        err = claim_wait(s);
    }
    if (!held) pthread_mutex_unlock(&s->control);
    return err;
}

void repo_unclaim(nereid_server_t *s, const char *key, bool held)
{
    if (!held) pthread_mutex_lock(&s->control);
    struct repository_claim *c = claim_find(s, key);
    if (c) {
        c->busy = false;
        c->handed_off = false;
        claim_release(s, c);
    } else {
        pthread_cond_broadcast(&s->claim_ended);
    }
    if (!held) pthread_mutex_unlock(&s->control);
}

/* Whether the calling operation may reserve key: no other operation works
 * on it and no other operation's ensemble load holds it (the operations it
 * acts for are its own). */
static bool reservable(nereid_server_t *s, const char *key)
{
    struct repository_claim *c = claim_find(s, key);
    if (!c) return true;
    if (c->busy && (c->handed_off || !load_op_acts_for(c->owner))) return false;
    return !c->reserves || load_op_acts_for(c->reserver);
}

/* An ensemble load holds its composing models' keys (sorted, unique) until it
 * ends, so no other operation unloads or reloads one meanwhile (Triton
 * locks the load's whole dependency set). All are taken at once, once none
 * is held elsewhere: two ensemble loads that share steps never hold part
 * each, whatever their steps' order. The calling operation's own loads and
 * unloads of them go on, and those of operations acting for it (repo_claim).
 * held: as for repo_claim. */
nereid_error_t *repo_reserve(nereid_server_t *s, char *const *keys, size_t n, bool held)
{
    if (!held) pthread_mutex_lock(&s->control);
    nereid_error_t *err = NULL;
    for (bool all = false; !all && !err;) {
        all = true;
        for (size_t i = 0; i < n && all; i++)
            all = reservable(s, keys[i]);
        if (!all) err = claim_wait(s);
    }
    for (size_t i = 0; i < n && !err; i++) {
        struct repository_claim *c = claim_find(s, keys[i]);
        if (!c) c = claim_add(s, keys[i]);
        /* an operation acting for the reserver adds to its hold: the
         * reserver stays the outer one, which the inner one acts for */
        if (!c->reserves++) c->reserver = load_op_self();
    }
    if (!held) pthread_mutex_unlock(&s->control);
    return err;
}

/* Ends repo_reserve of keys. */
void repo_unreserve(nereid_server_t *s, char *const *keys, size_t n, bool held)
{
    if (!held) pthread_mutex_lock(&s->control);
    for (size_t i = 0; i < n; i++) {
        struct repository_claim *c = claim_find(s, keys[i]);
        if (!c || !c->reserves) continue;
        c->reserves--;
        claim_release(s, c);
    }
    if (!held) pthread_mutex_unlock(&s->control);
}

/* Whether an operation works on model key, or an ensemble load holds it.
 * Caller holds s->control. */
bool repo_claimed(const nereid_server_t *s, const char *key)
{
    for (size_t i = 0; i < s->n_claims; i++)
        if (strcmp(s->claims[i].key, key) == 0) return true;
    return false;
}

/* Around a backend's model code (init, finalize): s->control is let go when
 * the caller holds it, so that code may itself load or unload models, and
 * other operations run meanwhile. */
void repo_control_lend(nereid_server_t *s, bool held)
{
    if (held) pthread_mutex_unlock(&s->control);
}

void repo_control_take_back(nereid_server_t *s, bool held)
{
    if (held) pthread_mutex_lock(&s->control);
}

bool repo_model_ready(nereid_server_t *s, const char *name)
{
    pthread_rwlock_rdlock(&s->lock);
    model_entry_t *e = repository_find(s, name);
    bool ready = e && repo_entry_has_ready(e);
    pthread_rwlock_unlock(&s->lock);
    return ready;
}

/* The entry state of name (MODEL_UNKNOWN_STATE when never tried) and, when
 * failed, a copy of its reason. */
model_state_t repo_entry_state(nereid_server_t *s, const char *name, char **reason)
{
    if (reason) *reason = NULL;
    pthread_rwlock_rdlock(&s->lock);
    model_entry_t *e = repository_find(s, name);
    model_state_t st = e ? e->state : MODEL_UNKNOWN_STATE;
    if (reason && e && !repo_entry_has_ready(e)) {
        const char *r = e->reason;
        for (size_t v = 0; !r && v < e->n_versions; v++)
            r = e->versions[v].reason;
        if (r) *reason = xstrdup(r);
    }
    pthread_rwlock_unlock(&s->lock);
    return st;
}

bool repo_version_ready(nereid_server_t *s, const char *name, int64_t version)
{
    pthread_rwlock_rdlock(&s->lock);
    model_entry_t *e = repository_find(s, name);
    bool ready = false;
    for (size_t v = 0; e && v < e->n_versions && !ready; v++)
        ready = e->versions[v].version == version && e->versions[v].state == MODEL_READY;
    pthread_rwlock_unlock(&s->lock);
    return ready;
}

/* The composing model keys of the ensemble in directory key (none when it
 * is not an ensemble or its config does not read), as a new array. */
char **repo_ensemble_steps(nereid_server_t *s, const char *key, size_t *n)
{
    *n = 0;
    size_t count;
    char *dir = repo_locate(s, key, &count);
    const char *ns;
    char *name = repo_key_split(key, &ns);
    model_config_t *cfg = NULL;
    if (dir) nereid_error_free(repo_read_config(s, name, dir, NULL, &cfg));
    free(dir);
    free(name);
    char **out = NULL;
    if (repo_is_ensemble(cfg) && cfg->ensemble_scheduling) {
        const Inference__ModelEnsembling *es = cfg->ensemble_scheduling;
        out = xcalloc(es->n_step ? es->n_step : 1, sizeof *out);
        for (size_t i = 0; i < es->n_step; i++) {
            char *step = repo_resolve_step(s, ns, es->step[i]->model_name);
            if (step) out[(*n)++] = step;
        }
    }
    if (cfg) config_free(cfg);
    return out;
}

void repo_free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* Whether a ready ensemble other than except uses model key. */
/* used_by_other with s->lock held. */
bool repo_used_by_other_locked(nereid_server_t *s, const char *key, const char *except)
{
    bool used = false;
    for (size_t i = 0; i < s->n_models && !used; i++) {
        model_entry_t *e = s->models[i];
        if (strcmp(e->key, except) == 0 || !repo_entry_has_ready(e) || !repo_is_ensemble(e->config))
            continue;
        const Inference__ModelEnsembling *es = e->config->ensemble_scheduling;
        for (size_t k = 0; es && k < es->n_step; k++) {
            char *sk = repo_step_key(s, es->step[k]);
            used |= strcmp(sk, key) == 0;
            free(sk);
        }
    }
    return used;
}

bool repo_used_by_other(nereid_server_t *s, const char *name, const char *except)
{
    pthread_rwlock_rdlock(&s->lock);
    bool used = repo_used_by_other_locked(s, name, except);
    pthread_rwlock_unlock(&s->lock);
    return used;
}

/* --model-namespacing: the keys of model name in the repositories that
 * have it, as a new array (NULL when none). */
char **repo_name_keys(nereid_server_t *s, const char *name, size_t *n)
{
    char **keys = NULL;
    *n = 0;
    for (size_t r = 0; r < s->n_repos && repo_valid_model_name(name); r++) {
        char *dir = xasprintf("%s/%s", s->repos[r], name);
        if (repo_is_dir(dir)) {
            keys = xrealloc(keys, (*n + 1) * sizeof *keys);
            keys[(*n)++] = repo_make_key(s, name, s->repos[r]);
        }
        free(dir);
    }
    return keys;
}

/* Hands the claim of key over (handing_off: to a thread still to start),
 * or has the calling thread take it over. Caller holds s->control. */
void repo_claim_transfer(nereid_server_t *s, const char *key, bool handing_off)
{
    for (size_t i = 0; i < s->n_claims; i++)
        if (strcmp(s->claims[i].key, key) == 0 && s->claims[i].busy) {
            s->claims[i].owner = load_op_self();
            s->claims[i].handed_off = handing_off;
        }
}

bool repository_has_model(nereid_server_t *s, const char *name)
{
    if (!repo_valid_model_name(name)) return false;
    size_t count;
    char *dir = repo_locate(s, name, &count);
    bool found = dir != NULL;
    free(dir);
    return found;
}

bool repository_decoupled_on_disk(nereid_server_t *s, const char *name)
{
    size_t count;
    char *dir = repo_locate(s, name, &count);
    model_config_t *cfg = NULL;
    if (dir) nereid_error_free(repo_read_config(s, name, dir, NULL, &cfg));
    bool decoupled =
        cfg && cfg->model_transaction_policy && cfg->model_transaction_policy->decoupled;
    if (cfg) config_free(cfg);
    free(dir);
    return decoupled;
}
