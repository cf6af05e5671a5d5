/*
 * This file contains what the repository's files share (and no one else
 * includes): the scan of the model directories (repository_scan.c), the
 * model index, its keys and the claims (repository_index.c), loading
 * (repository_load.c), control, unloading, polling and shutdown
 * (repository_control.c), start-up (repository_start.c) and loads on
 * demand (repository_on_demand.c). The server struct and the entries are
 * in core/repository.h; its locking rules are written there.
 */
#ifndef NEREID_REPOSITORY_INTERNAL_H
#define NEREID_REPOSITORY_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "core/repository.h"
#include "core/server_internal.h"

#define MAX_ENSEMBLE_DEPTH 16

/* ---- Files and configs (repository_scan.c) ---- */

bool repo_is_dir(const char *path);
int repo_cmp_i64(const void *a, const void *b);
int repo_cmp_str(const void *a, const void *b);
/* The numeric subdirectories of dir (symlinks to directories count),
 * sorted; with warn, each directory ignored is logged as Triton does. */
size_t repo_list_versions(const char *dir, int64_t **out, bool warn);
/* Signature of a directory tree: names, sizes, modification times. */
uint64_t repo_tree_sig(const char *path, uint64_t h, int depth);
/* Triton's ModelTimestamp::IsModelVersionModified of one version. */
uint64_t repo_version_files_sig(const char *dir, int64_t version);
void repo_remove_tree(const char *path);
/* Writes the override files into a new temporary model directory. */
nereid_error_t *repo_make_override_dir(const char *name, const char *const *paths,
                                       const void *const *contents, const size_t *sizes, size_t n,
                                       char **out);
/* Replaces a protobuf-c string field (which may hold the static empty string). */
void repo_set_pb_string(char **field, const char *value);
bool repo_autofill_allowed(const nereid_server_t *s);
/* Reads (or takes the override of) a model's config and normalizes it. */
nereid_error_t *repo_read_config(nereid_server_t *s, const char *name, const char *dir,
                                 const char *override_json, model_config_t **out);
bool repo_is_ensemble(const model_config_t *cfg);
/* Which versions the policy selects from those on disk. */
size_t repo_select_versions(const model_config_t *cfg, const int64_t *avail, size_t n,
                            int64_t *out);
/* Newest modification time (wall-clock ns) of dir's entries; 0 if unreadable. */
int64_t repo_dir_contents_mtime_ns(const char *dir);
/* Model directory names across the repositories (sorted, unique); with
 * --model-namespacing each repository's model keys. */
size_t repo_scan_names(nereid_server_t *s, char ***out, nereid_error_t **err);

/* ---- Keys, entries and claims (repository_index.c) ---- */

bool repo_valid_model_name(const char *name);
bool repo_ns_on(const nereid_server_t *s);
/* The key of model name in repository repo (NULL: none). */
char *repo_make_key(const nereid_server_t *s, const char *name, const char *repo);
/* The name part of key (a new string); *ns points at its namespace in key,
 * or is NULL. */
char *repo_key_split(const char *key, const char **ns);
/* Whether key is model name's key (in any namespace). */
bool repo_key_is_name(const char *key, const char *name);
/* The key an ensemble step's model has once the ensemble is loaded. */
char *repo_step_key(const nereid_server_t *s, const Inference__ModelEnsembling__Step *st);
void repo_free_versions(version_entry_t *v, size_t n);
void repo_entry_free(model_entry_t *e);
/* Adds an entry (caller holds the write lock); keeps models sorted by key. */
model_entry_t *repo_entry_add(nereid_server_t *s, const char *key, const char *dir);
bool repo_entry_has_ready(const model_entry_t *e);
/* Directories of model key in the repositories: the first one, and how many. */
char *repo_locate(nereid_server_t *s, const char *key, size_t *count);
/* An ensemble step's key (--model-namespacing), or NULL when no repository
 * or several have it. */
char *repo_resolve_step(nereid_server_t *s, const char *ens_ns, const char *step);
/* Claims model key for the calling operation, waiting while another one has
 * it; held: the caller holds s->control. */
nereid_error_t *repo_claim(nereid_server_t *s, const char *key, bool held);
/* An ensemble load holds its composing models' keys (sorted, unique) until
 * repo_unreserve: taken all at once, waiting while another operation or
 * another operation's ensemble load has any; the calling operation's own
 * loads and unloads of them go on, and those of operations acting for it
 * (load_ops.c). held: as for repo_claim. */
nereid_error_t *repo_reserve(nereid_server_t *s, char *const *keys, size_t n, bool held);
void repo_unreserve(nereid_server_t *s, char *const *keys, size_t n, bool held);
void repo_unclaim(nereid_server_t *s, const char *key, bool held);
/* Whether an operation works on model key. Caller holds s->control. */
bool repo_claimed(const nereid_server_t *s, const char *key);
/* Hands the claim of key over, or has the calling thread take it over.
 * Caller holds s->control. */
void repo_claim_transfer(nereid_server_t *s, const char *key, bool handing_off);
/* Around a backend's model code: s->control is let go when held. */
void repo_control_lend(nereid_server_t *s, bool held);
void repo_control_take_back(nereid_server_t *s, bool held);
bool repo_model_ready(nereid_server_t *s, const char *name);
/* The entry state of name and, when failed, a copy of its reason. */
model_state_t repo_entry_state(nereid_server_t *s, const char *name, char **reason);
bool repo_version_ready(nereid_server_t *s, const char *name, int64_t version);
/* The composing model keys of the ensemble in directory key, as a new array. */
char **repo_ensemble_steps(nereid_server_t *s, const char *key, size_t *n);
void repo_free_names(char **names, size_t n);
/* Whether a ready ensemble other than except uses model key (the _locked
 * one: caller holds s->lock). */
bool repo_used_by_other_locked(nereid_server_t *s, const char *key, const char *except);
bool repo_used_by_other(nereid_server_t *s, const char *name, const char *except);
/* --model-namespacing: the keys of model name in the repositories that
 * have it, as a new array (NULL when none). */
char **repo_name_keys(nereid_server_t *s, const char *name, size_t *n);

/* ---- Loading (repository_load.c) ---- */

typedef struct load_ctx {
    const char *chain[MAX_ENSEMBLE_DEPTH + 1]; /* ensembles being loaded, outermost first */
    size_t depth;
    bool load_deps;         /* load an ensemble's composing models that are not ready */
    bool force;             /* reload versions even when nothing changed */
    bool held;              /* the caller holds s->control (all but start-up) */
    model_config_t *config; /* the model's config already read from its directory, or
                               NULL; taken (and freed) by repo_load_model */
} load_ctx_t;

/* Loads or reloads model key, claimed meanwhile. */
nereid_error_t *repo_load_model(nereid_server_t *s, const char *key, const char *override_json,
                                const char *const *paths, const void *const *contents,
                                const size_t *sizes, size_t n_files, load_ctx_t *ctx);
/* Unloads one version's model, with Triton's line. */
void repo_unload_version(const char *name, int64_t version, model_t *m);
/* Removes override directories no served version was loaded from. */
void repo_drop_unused_tmp_dirs(nereid_server_t *s, model_entry_t *e);

/* ---- Control (repository_control.c) ---- */

/* Unloads model key (and, when dependents, the composing models no other
 * loaded ensemble uses), and the ensembles that use it. Caller holds
 * s->control. */
void repo_unload_model(nereid_server_t *s, const char *key, bool dependents, int depth);
/* Poll mode's thread. */
void *repo_poll_main(void *arg);

/* ---- Load on demand (repository_on_demand.c) ---- */

/* Under --model-memory-budget, what an explicit load of a model starts
 * from (repo_budget_mark, before) and its charge (after). */
typedef struct budget_mark {
    bool was_ready;
    long long bytes; /* its charge when it was ready */
    uint64_t served; /* which models it served */
    long long rss0;  /* the process's RSS */
} budget_mark_t;
void repo_budget_mark(nereid_server_t *s, const char *key, budget_mark_t *m);
/* Pins key, charges it what its load added, evicts on-demand models to fit
 * the budget and warns when the pinned ones alone exceed it. Caller holds
 * s->control. */
void repo_budget_charge_pinned(nereid_server_t *s, const char *key, const budget_mark_t *m);
/* The warning when the pinned models alone exceed the budget. */
void repo_warn_pinned_over_budget(nereid_server_t *s);

/* The process's resident bytes (/proc/self/statm), 0 when unknown. */
long long repo_rss_bytes(void);

#endif
