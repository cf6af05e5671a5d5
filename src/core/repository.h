/*
 * This file contains the model repository's interface to the rest of the
 * core: the model entries of the index (server.c's lookups and documents,
 * model_table.c) and the repository's functions (start, poll, stop, loads
 * on demand). The server's own state is core/server_internal.h; the
 * repository's files share core/repository_internal.h.
 *
 * Locking: s->lock (rwlock) guards s->models and every entry's fields that
 * lookups read; it is never held while a model loads or drains. s->control
 * serializes every change of what is served, but is let go while a
 * backend runs a model's init or finalize; each model being changed is
 * claimed (s->claims) until its change is done, start-up loads included.
 */
#ifndef NEREID_REPOSITORY_H
#define NEREID_REPOSITORY_H

#include <stdatomic.h>

#include "core/core.h"

typedef struct version_entry {
    int64_t version;
    model_state_t state;
    char *reason;
    model_t *model;     /* READY: the loaded model (the loader's reference) */
    uint64_t files_sig; /* its files when loaded (repo_version_files_sig) */
} version_entry_t;

typedef struct model_entry {
    char *name;             /* the model's name */
    char *key;              /* name, or with --model-namespacing name NS_SEP repository */
    char *ns;               /* --model-namespacing: its repository (namespace), else NULL */
    char *dir;              /* <repository>/<name> */
    model_config_t *config; /* config of the served versions, NULL if none */
    char *config_key;       /* its JSON, to detect config changes */
    char *load_dir;         /* where the served versions were loaded from */
    model_state_t state;    /* UNKNOWN: never loaded; UNAVAILABLE: config/versions failed */
    char *reason;
    version_entry_t *versions;
    size_t n_versions;
    uint64_t tree_sig;   /* poll: signature of the model directory when last loaded */
    int64_t override_ns; /* wall-clock ns of its last load with a config override (and no
                          * files), 0 if none: Triton's ModelTimestamp then counts the
                          * config as modified "now" */
    bool poll_failed;    /* its last load failed reading or validating its config and it
                          * serves nothing: Triton's poll leaves such a model out of its
                          * model table (unknown to requests, not counted by strict
                          * readiness) */
    bool removed;        /* poll: its directory left the repository; kept, unloaded, as
                          * Triton's lifecycle keeps it (requests: "has no available
                          * versions"), but no longer in the repository index */
    char **tmp_dirs;     /* override copies made for this model, removed with it */
    size_t n_tmp_dirs;
    /* Load on demand (nereid_server_options_t.model_load_on_demand): */
    bool pinned;                   /* loaded explicitly (--load-model, load API): never evicted */
    long long memory_bytes;        /* RSS growth across its last load, >= 1 when loaded */
    _Atomic uint64_t last_used_ns; /* last lookup (util_now_ns) */
} model_entry_t;

/* With --model-namespacing an entry's key is its name, this separator and
 * its repository (a model name cannot contain it); without, its name. */
#define NS_SEP '\x1f'

/* Finds an entry by key; caller holds s->lock. */
model_entry_t *repository_find(nereid_server_t *s, const char *key);
/* Finds the entry a request names (caller holds s->lock): ns given, the
 * model name in that namespace; else by name, and with --model-namespacing
 * the one known copy (Triton's global map: not the never-loaded ones of
 * explicit mode). Two or more known copies: NULL and *err is Triton's
 * ambiguity error. No entry: NULL, *err NULL. */
model_entry_t *repository_resolve(nereid_server_t *s, const char *ns, const char *name,
                                  nereid_error_t **err);

/* Scans the repositories and loads what the mode asks for (in parallel);
 * starts the poll thread in poll mode. Errors only for unreadable
 * repositories. */
nereid_error_t *repository_start(nereid_server_t *s);
/* Stops polling, unloads every model (drains their queues), frees entries. */
void repository_stop(nereid_server_t *s);
/* One poll pass now (poll mode's thread calls it periodically). */
void repository_poll(nereid_server_t *s);
/* Load on demand: loads model name if it is in a repository and not ready
 * (waiting for a load already under way), then unloads least recently used
 * models past the memory budget. NULL when the model is ready afterwards,
 * NOT_FOUND (Triton's text) when no repository has it, else the load's
 * error. Any thread; blocks for the load. */
nereid_error_t *repository_load_on_demand(nereid_server_t *s, const char *name);
/* Whether a repository has a model directory called name (a valid name). */
bool repository_has_model(nereid_server_t *s, const char *name);
/* Whether model name's config on disk says decoupled (false when it cannot
 * be read: its load reports why): what a frontend checks before a request
 * for a model that is not loaded yet. */
bool repository_decoupled_on_disk(nereid_server_t *s, const char *name);
/* Whether this thread is running an on-demand load (a request the load
 * makes, from a backend's model init, must not wait for it). */
bool repository_loading_on_demand(void);
/* Under --model-memory-budget: the bytes the pinned (explicitly loaded)
 * models are charged, which the budget cannot evict. Caller holds s->lock. */
long long repository_pinned_bytes(const nereid_server_t *s);

/* Object storage (remote_repo.c): opens every s3:// / as:// repository,
 * puts its local mirror in s->repos and reads it (an error that stops the
 * start only with --exit-on-error); NULL or the error. */
nereid_error_t *remote_repo_open_all(nereid_server_t *s);
/* Brings the mirrors in step (model's prefix only, or all when NULL); the
 * first error (the others logged). Any thread. */
nereid_error_t *remote_repo_sync(nereid_server_t *s, const char *model);
/* remote_repo_sync of the model an explicit load names; its error is
 * Triton's poll failure ("failed to load '<model>', failed to poll from
 * model repository: <cause>"). Caller holds s->control. */
nereid_error_t *remote_repo_sync_for_load(nereid_server_t *s, const char *model);
/* Ends downloads under way and to come (a stopping server does not wait
 * for them). Any thread. */
void remote_repo_cancel_all(nereid_server_t *s);
/* Removes the mirrors (after every model was unloaded). */
void remote_repo_close_all(nereid_server_t *s);

#endif
