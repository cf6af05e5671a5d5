/*
 * This file contains the core's model types as schedulers and backends see
 * them: a loaded model version, its instances and its statistics counters,
 * and model references. The model lifecycle (load, unload, warmup) is the
 * core's own (core/core.h).
 */
#ifndef NEREID_MODEL_H
#define NEREID_MODEL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "config/config.h"
#include "nereid/backend.h"
#include "nereid/server.h"

#define NEREID_MAX_RANK 16

struct scheduler;
struct backend_lib;

/* ---- Statistics (lock-free counters) ---- */

typedef struct stat_duration {
    _Atomic uint64_t count;
    _Atomic uint64_t ns;
    /* --metrics-config summary_latencies=true: this duration's Prometheus
     * summary (stats.c), or NULL. */
    struct latency_summary *summary;
    /* --metrics-config histogram_latencies=true: its Prometheus histogram
     * in microseconds (stats.c), or NULL. */
    struct latency_histogram *histogram;
} stat_duration_t;

typedef struct batch_stat {
    stat_duration_t compute_input, compute_infer, compute_output;
} batch_stat_t;

typedef enum failure_reason {
    FAILURE_REJECTED,
    FAILURE_CANCELED,
    FAILURE_BACKEND,
    FAILURE_OTHER,
    FAILURE_N
} failure_reason_t;

/* Statistics of the model's first (and, without decoupled models, only)
 * response to each request: response_stats "0" in the statistics JSON. */
typedef struct response_stat {
    stat_duration_t compute_infer, compute_output, success, fail, empty_response, cancel;
} response_stat_t;

typedef struct model_stats {
    _Atomic uint64_t last_inference_ms;
    _Atomic uint64_t inference_count; /* batch elements executed */
    _Atomic uint64_t execution_count; /* backend executions */
    stat_duration_t success, fail, queue, compute_input, compute_infer, compute_output;
    stat_duration_t cache_hit, cache_miss;
    _Atomic uint64_t failures[FAILURE_N];
    _Atomic int64_t pending;            /* requests queued, not yet executing */
    _Atomic uint64_t progress_timeouts; /* times the watchdog found it wedged */
    /* Time to first response in ms, with Triton's buckets or the config's
     * model_metrics (stats.c); always there. */
    struct latency_histogram *first_response;
    response_stat_t response0;
    /* Entries 1.. of a decoupled model's response_stats (stats_response). */
    pthread_mutex_t resp_mu;
    response_stat_t **resp_more;
    size_t n_resp_more;
    batch_stat_t *batch; /* index = batch size, 1..n_batch-1 */
    size_t n_batch;
    uint64_t load_ns; /* backend model's load time (0 for ensembles); set before publishing */
} model_stats_t;

/* ---- Model ---- */

typedef struct model_io {
    char *name;
    nereid_datatype_t datatype;
    int64_t dims[NEREID_MAX_RANK]; /* config dims, without batch dimension */
    size_t rank;
    bool has_reshape;
    int64_t reshape[NEREID_MAX_RANK];
    size_t reshape_rank;
    bool optional;
    char **labels; /* outputs: lines of label_filename (into label_text), or NULL */
    size_t n_labels;
    char *label_text; /* the label file, lines NUL-terminated in place */
} model_io_t;

typedef enum model_state {
    MODEL_UNKNOWN_STATE, /* on disk, never loaded (explicit mode) */
    MODEL_LOADING,
    MODEL_READY,
    MODEL_UNAVAILABLE,
    MODEL_UNLOADING,
} model_state_t;

typedef struct model_instance {
    struct model *model;
    char *name;
    nereid_instance_kind_t kind;
    int device_id;
    size_t index; /* 0..n_instances-1 within the model */
    pthread_t thread;
    bool thread_started;
    void *backend_state;
    nereid_error_t *init_error; /* set by the thread if instance init failed */
    bool init_done;
    bool init_ok;      /* its init succeeded (several instances, at load) */
    void *sched_state; /* for the scheduler's per-instance data */
    const Inference__ModelInstanceGroup *group; /* its instance_group (config); NULL: none */
    /* Registered with the rate limiter (rate_limiter.h): executions wait
     * for their turn. NULL when the limiter is off or the group needs no
     * resources. */
    struct rate_limiter_instance *rate_limit;
    /* The scheduler took the turn before forming the batch (sched_core_t
     * acquire_turn); the next execute uses it. Instance thread only. */
    bool turn_held;
    /* Removed by an in-place instance update (model_update_instances): the
     * scheduler gives it no more work and its thread leaves next_batch. Set
     * under the model's lock, read by schedulers under theirs. */
    _Atomic bool retired;
    bool fini_done; /* its backend instance_fini ran */
    /* Retired while it still served live sequences (scheduler retire): its
     * thread finishes them, finalizes the instance and clears this as it
     * exits; the thread is joined by the next update or the unload. */
    _Atomic bool lingering;
    /* When its current execution started (monotonic ns), 0 while idle: the
     * progress watchdog's view (watchdog.c). */
    _Atomic uint64_t exec_start_ns;
} model_instance_t;

/* A loaded model version. nereid_model_t (backend.h) is this struct. */
/* The operations a thread works for (load_ops.c): its own first, then the
 * ones it acts for. */
#define LOAD_OP_CHAIN_MAX 16
typedef struct load_op_chain {
    uint64_t ids[LOAD_OP_CHAIN_MAX];
    size_t n;
} load_op_chain_t;

typedef struct model {
    nereid_server_t *server;
    char *name;
    char *ns; /* --model-namespacing: its repository (metrics' namespace label), else NULL */
    int64_t version;
    char *dir; /* <repository>/<name> */
    model_config_t *config;
    char *config_json;
    char *backend_name; /* NULL for ensembles */
    struct backend_lib *backend;
    void *backend_state;
    model_io_t *inputs;
    size_t n_inputs;
    model_io_t *outputs;
    size_t n_outputs;
    int64_t max_batch_size;
    /* Every instance, retired ones (model_instance_t.retired) included: an
     * in-place update only appends, publishing a longer copy of the array
     * before its count, so a reader that loads the count and then the
     * array may index it without a lock. Replaced arrays, configs and
     * config texts are kept until the model is freed (old_mem). */
    model_instance_t **_Atomic instances;
    _Atomic size_t n_instances;
    void **old_mem;
    size_t n_old_mem;
    model_config_t **old_configs;
    size_t n_old_configs;
    struct scheduler *sched;
    model_stats_t stats;
    /* Moving average of one execution's duration (ns); UINT64_MAX until the
     * first one. Decides whether a request may run on the caller's thread. */
    _Atomic uint64_t exec_avg_ns;
    /* The backend's bound on exec_avg_ns for runs on the caller's thread
     * (nereid_model_set_inline_max_us); 0: the scheduler's default. */
    _Atomic uint64_t inline_max_ns;
    /* nereid_model_set_backend_response_stats: response_stats only from the
     * backend's reports. */
    _Atomic bool backend_response_stats;
    _Atomic int refcount;
    /* Ensemble requests in flight that will still submit steps here
     * (model_hold); model_unload waits for them before it stops the model. */
    _Atomic int holds;
    _Atomic bool unloading;
    /* --model-progress-timeout-secs (watchdog.c): when an execution last
     * ended (monotonic ns), and whether the model is wedged now. */
    _Atomic uint64_t progress_ns;
    _Atomic bool wedged;
    bool in_model_init; /* nereid_model_set_config allowed */
    bool autocomplete_allowed;
    bool config_replaced;
    bool model_initialized; /* backend model_init succeeded: model_fini owed */
    bool rate_limited;      /* an instance has rate_limit: never run on a caller's thread */
    pthread_mutex_t lock;   /* guards instance init handshake */
    load_op_chain_t loader; /* while a load initializes it (n > 0): its operations; under lock */
    pthread_cond_t cond;
    /* A model's execution threads start with its first request
     * (model_start_instances), not at load: a thousand loaded, idle models
     * cost no thread each. Its instances were initialized at load. */
    bool lazy_thread;            /* the thread is started on demand */
    _Atomic bool thread_running; /* started (or stopping: no more starts); under lock */
    bool passive_stop;           /* passive instances' threads may finish; under lock */
} model_t;

/* Starts the lazily started instance thread of m if it is not running yet.
 * Any thread, before it hands a request to m's scheduler; cheap once
 * started. Fails only when the thread cannot be created. */
nereid_error_t *model_start_instances(model_t *m);

/* Model references: requests hold one while in flight (model.c, Ownership). */
void model_ref(model_t *m);
void model_unref(model_t *m);
/* Holds: an ensemble request holds each composing model it will submit
 * steps to, from its start to its end, so that their unload waits for it
 * (see model.c). model_release ends the hold and drops its reference. */
void model_release(model_t *m);
/* Marks m decoupled as Triton marks an ensemble with a decoupled step:
 * model_transaction_policy { decoupled: true } in its config (and the
 * config JSON). Thread: the loading one, before m serves requests. */
void model_set_decoupled(model_t *m);

#endif
