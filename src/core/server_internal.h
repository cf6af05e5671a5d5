/*
 * This file contains the server's state, struct nereid_server, for the core
 * files that reach its fields: the repository's files, server.c, and the
 * services the server owns (trace, cache, rate limiter, on-demand queue,
 * decoupled responses, model table). Nothing outside src/core includes it;
 * frontends and backends see only the opaque nereid_server_t. Which lock
 * guards which field is written beside the field and in core/repository.h.
 */
#ifndef NEREID_SERVER_INTERNAL_H
#define NEREID_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

struct model_entry;

struct nereid_server {
    char **repos; /* local paths; a remote one's local mirror once started */
    size_t n_repos;
    struct storage_remote **remotes; /* per repos[i]: its object storage, else NULL */
    char *backend_dir;
    char *server_id;
    char *model_config_name; /* --model-config-name, or NULL */
    nereid_server_options_t opts;
    pthread_rwlock_t lock;       /* guards models and every entry's versions */
    struct model_entry **models; /* sorted by key (core/repository.h) */
    size_t n_models;
    /* Loads, unloads, polls and evictions run one at a time under control,
     * except while one lets go of it around a backend's model code (init,
     * finalize); the models each works on stay claimed meanwhile
     * (repository_index.c). */
    pthread_mutex_t control;
    pthread_cond_t claim_ended; /* with control */
    struct repository_claim *claims;
    size_t n_claims;
    size_t n_async_unloads;         /* nereid_server_unload_model_async still finishing */
    pthread_mutex_t on_demand_load; /* on-demand loads one at a time (RSS charge) */
    pthread_t poll_thread;
    bool poll_started;
    pthread_mutex_t poll_lock;
    pthread_cond_t poll_cond;
    bool poll_stop;
    _Atomic bool stopping;
    _Atomic bool stopped;
    _Atomic bool exiting; /* nereid_server_begin_exit: not ready, still live */
    bool init_failed;     /* --exit-on-error=false and a repository failed: up, not live */
    struct rate_limiter *rate_limiter; /* --rate-limit=execution_count; NULL: off */
    struct nereid_tracer *tracer;      /* nereid_server_set_tracer, or NULL */
    struct response_cache *cache;      /* --cache-config, or NULL (core/cache.h) */
    /* --backend-config settings (owned copies) and the server's own global
     * ones Triton adds: auto-complete-config, min-compute-capability,
     * backend-directory */
    nereid_backend_setting_t *backend_settings;
    size_t n_backend_settings;
    /* Load on demand: totals for the metrics. */
    _Atomic uint64_t on_demand_loads, on_demand_load_failures, on_demand_evictions;
    _Atomic uint64_t on_demand_load_ns;
    /* Loads running and started (repo_load_model): a load measures its
     * model's memory only when no other load overlapped it. */
    _Atomic int loads_running;
    _Atomic uint64_t load_starts;
    struct on_demand_queue *on_demand; /* on_demand.c; NULL until first used */
    struct watchdog *watchdog;         /* --model-progress-timeout-secs, or NULL */
};

/* Triton's ModelIsReady, RepositoryIndex, LoadModel and UnloadModel:
 * UNAVAILABLE "Server not ready" once the server is not ready because it
 * exits (a graceful exit began: nereid_server_begin_exit, or it stops);
 * NULL otherwise. */
nereid_error_t *server_exit_refusal(nereid_server_t *s);

#endif
