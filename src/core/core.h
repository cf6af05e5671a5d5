/*
 * This file contains the core's internal types shared by src/core, src/sched
 * and src/backend: loaded models and their instances, requests and responses,
 * batches, and statistics. Frontends never include it (they use server.h).
 */
#ifndef NEREID_CORE_H
#define NEREID_CORE_H

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
    _Atomic int64_t pending; /* requests queued, not yet executing */
    response_stat_t response0;
    batch_stat_t *batch; /* index = batch size, 1..n_batch-1 */
    size_t n_batch;
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
    void *sched_state; /* for the scheduler's per-instance data */
    /* Default scheduler (its lock): the thread is blocked waiting for work,
     * and a frontend thread has claimed the instance to run a request
     * itself (scheduler_run_inline). */
    bool sched_waiting;
    bool claimed;
} model_instance_t;

/* A loaded model version. nereid_model_t (backend.h) is this struct. */
typedef struct model {
    nereid_server_t *server;
    char *name;
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
    model_instance_t **instances;
    size_t n_instances;
    struct scheduler *sched;
    model_stats_t stats;
    /* Moving average of one execution's duration (ns); UINT64_MAX until the
     * first one. Decides whether a request may run on the caller's thread. */
    _Atomic uint64_t exec_avg_ns;
    _Atomic int refcount;
    /* Ensemble requests in flight that will still submit steps here
     * (model_hold); model_unload waits for them before it stops the model. */
    _Atomic int holds;
    _Atomic bool unloading;
    bool in_model_init; /* nereid_model_set_config allowed */
    bool autocomplete_allowed;
    bool config_replaced;
    bool model_initialized; /* backend model_init succeeded: model_fini owed */
    pthread_mutex_t lock;   /* guards instance init handshake */
    pthread_cond_t cond;
} model_t;

/* ---- Requests and responses ---- */

typedef struct req_input {
    char *name;
    nereid_datatype_t datatype;
    int64_t shape[NEREID_MAX_RANK]; /* as the backend sees it (after reshape) */
    size_t rank;
    const void *data;
    size_t byte_size;
    bool owned; /* data malloc'ed by the core (controls, state), freed with the request */
} req_input_t;

typedef enum param_type { PARAM_STRING, PARAM_INT, PARAM_BOOL, PARAM_DOUBLE } param_type_t;

typedef struct req_param {
    char *key;
    param_type_t type;
    char *s;
    int64_t i;
    bool b;
    double d;
} req_param_t;

typedef struct resp_output {
    char *name;
    nereid_datatype_t datatype;
    int64_t shape[NEREID_MAX_RANK];
    size_t rank;
    void *data;
    size_t byte_size;
    void *buffer_userp;
    bool allocated; /* data came from the allocator (release it) */
    bool filled;    /* the backend produced it */
    bool internal;  /* captured for the core/scheduler, not returned to the client */
    bool in_arena;  /* data lives in the response's arena (never freed alone) */
    bool owns_name; /* name malloc'ed; otherwise it is the config output's name */
    uint32_t class_count;
    model_io_t *io; /* config output, for labels */
} resp_output_t;

/* Per-request storage is inline so that a typical request costs two
 * allocations (request and response): up to REQ_INLINE_INPUTS inputs and
 * REQ_INLINE_OUTPUTS requested outputs live in the request, their names and
 * ids in its arena; up to RESP_INLINE_OUTPUTS output slots live in the
 * response, and outputs without a response allocator take memory from its
 * arena while it has room. Larger requests fall back to the heap. Both
 * structs stay within 1 KiB, the largest size glibc's per-thread cache
 * serves (request.c asserts it). */
#define REQ_INLINE_INPUTS 3
#define REQ_INLINE_OUTPUTS 4
#define REQ_ARENA_BYTES 176
#define RESP_INLINE_OUTPUTS 3
#define RESP_ARENA_BYTES 320

struct nereid_response {
    nereid_error_t *error;
    char *id;               /* in the arena or malloc'ed */
    const char *model_name; /* the model's name (model reference held) */
    int64_t model_version;
    resp_output_t *outputs; /* outputs_inline or malloc'ed */
    size_t n_outputs, cap_outputs;
    nereid_response_allocator_t alloc;
    model_t *model; /* reference held for labels; NULL on early errors */
    resp_output_t outputs_inline[RESP_INLINE_OUTPUTS];
    size_t arena_used;
    _Alignas(64) unsigned char arena[RESP_ARENA_BYTES]; /* not zeroed */
};

struct nereid_request {
    nereid_server_t *server;
    char *model_name;
    int64_t version_req;
    char *id;
    req_input_t *inputs; /* inputs_inline or malloc'ed */
    size_t n_inputs, cap_inputs;
    char **out_names; /* out_names_inline or malloc'ed; names via request_strdup */
    uint32_t *out_class_counts;
    size_t n_out_names, cap_out_names;
    req_param_t *params;
    size_t n_params;
    uint64_t priority;
    uint64_t timeout_us;
    uint64_t corr_id;
    char *corr_id_str; /* string correlation id, or NULL */
    bool seq_start, seq_end;
    bool warmup; /* model warmup sample: schedulers' test hooks must not hold it */

    /* Set at submission. */
    model_t *model;     /* reference held until the request is finished */
    int64_t batch_size; /* first dimension for batching models, else 1 */
    uint64_t t_request_ns, t_queue_start_ns, t_compute_start_ns;
    nereid_response_allocator_t alloc;
    nereid_complete_fn done_fn;
    void *done_userp;
    nereid_response_t *response;
    struct nereid_request *next; /* queue link, owned by whichever queue holds it */
    void *sched_data;            /* scheduler-private */
    /* An ensemble step's request: its queue and compute durations are also
     * added here (the ensemble sums its steps' as Triton does). */
    struct model_stats *parent_stats;
    struct nereid_trace *trace; /* sampled for tracing (trace.h), or NULL */

    req_input_t inputs_inline[REQ_INLINE_INPUTS];
    char *out_names_inline[REQ_INLINE_OUTPUTS];
    uint32_t out_class_counts_inline[REQ_INLINE_OUTPUTS];
    size_t arena_used;
    char arena[REQ_ARENA_BYTES]; /* request_strdup's strings; not zeroed */
};

/* ---- Batches: nereid_batch_t (backend.h) is this struct ---- */

typedef struct batch_tensor {
    char *name;
    nereid_datatype_t datatype;
    int64_t shape[NEREID_MAX_RANK];
    size_t rank;
    void *data;
    size_t byte_size;
    bool owned;  /* data malloc'ed here */
    bool direct; /* output buffer is the single request's response memory */
} batch_tensor_t;

struct nereid_batch {
    model_instance_t *instance;
    nereid_request_t **reqs;
    size_t n_reqs, cap_reqs;
    int64_t total_batch;
    /* Rows that stand for no request (the sequence batcher's empty slots,
     * removed from reqs before the batch is finished): part of the
     * execution's batch size in statistics, not of inference_count. */
    int64_t filler_rows;
    batch_tensor_t **inputs; /* gathered inputs (n_reqs > 1); stable addresses */
    size_t n_inputs;
    batch_tensor_t **outputs;
    size_t n_outputs;
    uint64_t t_start_ns, t_input_end_ns, t_infer_end_ns, t_end_ns;
    bool timing_reported;
};
typedef struct nereid_batch batch_t;

/* ---- Functions shared inside the core ---- */

/* Model references: requests hold one while in flight (model.c, Ownership). */
void model_ref(model_t *m);
void model_unref(model_t *m);
/* Holds: an ensemble request holds each composing model it will submit
 * steps to, from its start to its end, so that their unload waits for it
 * (see model.c). model_hold turns a reference the caller owns (from a lookup)
 * into a hold; model_release ends the hold and drops that reference. */
void model_hold(model_t *m);
void model_release(model_t *m);

/* Finishes a request: records statistics, builds and delivers the response
 * through its completion callback, frees the request. err (owned) non-NULL
 * fails it; reason classifies the failure for metrics. Thread: any. */
void request_finish(nereid_request_t *req, nereid_error_t *err, failure_reason_t reason);
/* Creates req->response with one slot per output the client gets. */
void request_prepare_response(nereid_request_t *req);
/* Copies s into the request's arena (or the heap when it is full); the copy
 * lives as long as req and is released by request_strfree. */
char *request_strdup(nereid_request_t *req, const char *s);
void request_strfree(nereid_request_t *req, char *s);
/* Memory for an output from the response's arena (64-byte aligned), or NULL
 * when it has no room; freed with the response. */
void *response_arena_alloc(nereid_response_t *resp, size_t byte_size);
/* Frees a request that was never submitted or whose submission failed. */
void request_free(nereid_request_t *req);
/* Adds a core-owned input (takes ownership of data, malloc'ed). */
void request_add_owned_input(nereid_request_t *req, const char *name, nereid_datatype_t dt,
                             const int64_t *shape, size_t rank, void *data, size_t byte_size);
/* Finds an input by name, or NULL. */
req_input_t *request_find_input(nereid_request_t *req, const char *name);
/* Marks output name as captured for the core (not returned unless the client
 * asked for it); returns its response slot. */
resp_output_t *request_capture_output(nereid_request_t *req, const char *name);
resp_output_t *request_find_output(nereid_request_t *req, const char *name);

/* Runs one batch on an instance: backend execute, output scatter, timing.
 * Does not finish the requests. Thread: the instance's thread. */
void batch_execute(model_instance_t *inst, batch_t *batch);
/* Records batch-level statistics (one execution) and finishes every request. */
void batch_finish(batch_t *batch);
/* Records batch_finish's statistics only; the caller finishes the requests
 * (schedulers that hold completions, e.g. to preserve ordering). */
void batch_record(batch_t *batch);
/* Resets a batch for reuse (frees gathered buffers; keeps the reqs array). */
void batch_reset(batch_t *batch);
void batch_add(batch_t *batch, nereid_request_t *req);
void batch_destroy(batch_t *batch);

/* Runs the config's ModelWarmup samples through the model (before it is
 * served); an error fails the load. */
nereid_error_t *model_warmup(model_t *m);

/* Statistics hooks. */
void stats_init(model_stats_t *s, int64_t max_batch_size);
void stats_destroy(model_stats_t *s);
void stats_add(stat_duration_t *d, uint64_t ns);

/* Resolves model/version (<= 0: latest ready) and takes a reference;
 * Triton's lookup error texts. */
nereid_error_t *server_lookup_model(nereid_server_t *s, const char *name, int64_t version,
                                    model_t **out);
/* nereid_server_infer_async on model m, which the caller holds (model_hold)
 * instead of a lookup by name: an ensemble's steps. */
nereid_error_t *server_infer_held(nereid_server_t *s, model_t *m, nereid_request_t *req,
                                  const nereid_response_allocator_t *allocator,
                                  nereid_complete_fn done_fn, void *done_userp);

/* Validates req against model m and fills req->batch_size; shapes are
 * rewritten to reshape dims. Triton's error texts. */
nereid_error_t *request_validate(nereid_request_t *req, model_t *m);

#endif
