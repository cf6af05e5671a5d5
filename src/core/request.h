/*
 * This file contains requests, responses and batches, and the request API
 * that the core and the schedulers use on them (request.c owns response
 * internals: which outputs are allocated, filled, internal or in the arena;
 * every other file goes through these functions).
 */
#ifndef NEREID_REQUEST_H
#define NEREID_REQUEST_H

#include <stdatomic.h>

#include "core/model.h"
#include "core/util.h"

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

/* nereid_cancel_token_t (server.h). */
struct nereid_cancel_token {
    _Atomic int refs;
    _Atomic bool cancelled;
};

typedef enum param_type { PARAM_STRING, PARAM_INT, PARAM_BOOL, PARAM_DOUBLE } param_type_t;

typedef struct req_param {
    char *key;
    param_type_t type;
    char *s;
    int64_t i;
    bool b;
    double d;
} req_param_t;

/* Response parameters (one allocation, grown by doubling); keys and
 * strings in the response's arena while it has room. */
typedef struct resp_params {
    size_t n, cap;
    req_param_t p[];
} resp_params_t;

typedef struct resp_output {
    char *name;
    nereid_datatype_t datatype;
    uint32_t class_count;
    int64_t shape[NEREID_MAX_RANK];
    size_t rank;
    void *data;
    size_t byte_size;
    union {
        void *buffer_userp; /* the allocator's, for its release_fn */
        void *view_userp;   /* view_release's argument */
    };
    /* Non-NULL: data is a backend's own memory (nereid_batch_request_output_view),
     * released with view_release(view_userp) when the response is freed. */
    nereid_output_release_fn view_release;
    bool allocated; /* data came from the allocator (release it) */
    bool filled;    /* the backend produced it */
    bool internal;  /* captured for the core/scheduler, not returned to the client */
    bool in_arena;  /* data lives in the response's arena (never freed alone) */
    bool owns_name; /* name malloc'ed; otherwise it is the config output's name */
    bool own_mem;   /* declined by its allocator (NEREID_ALLOC_DECLINED): the core's memory */
    bool foreign;   /* from a foreign allocator (server.h): the response is not cached */
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
#define REQ_ARENA_BYTES 160
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
    model_t *model;             /* reference held for labels; NULL on early errors */
    struct resp_params *params; /* set by the backend (Triton's response parameters), or NULL */
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
    /* The client's timeout as a monotonic time (0: none): set once, when
     * the request is first submitted (request_start_deadline); an ensemble
     * step inherits its ensemble request's. */
    uint64_t deadline_ns;
    uint64_t corr_id;
    char *corr_id_str; /* string correlation id, or NULL */
    bool seq_start, seq_end;
    bool reschedule;     /* the backend asked to run it again (scheduler.h reschedule) */
    bool warmup;         /* model warmup sample: schedulers' test hooks must not hold it */
    bool stats_recorded; /* request_record_stats ran: request_finish skips the queue time */
    bool output_views;   /* the client accepts outputs that are backend views (server.h) */
    uint8_t foreign;     /* NEREID_FOREIGN_*: what another process may write (server.h) */
    atomic_bool first_response_seen; /* first_response_histogram observed (in the padding) */

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
    struct nereid_trace *trace;    /* sampled for tracing (trace.h), or NULL */
    nereid_cancel_token_t *cancel; /* reference held, or NULL */

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

/* ---- Request API (request.c) ---- */

/* Finishes a request: records statistics, builds and delivers the response
 * through its completion callback, frees the request. err (owned) non-NULL
 * fails it; reason classifies the failure for metrics. Thread: any. */
void request_finish(nereid_request_t *req, nereid_error_t *err, failure_reason_t reason);
/* Counts one failure of req's model under reason (statistics and the
 * failure metric) without finishing req: Triton counts a failed ensemble
 * request twice (see ensemble.c). */
void request_count_failure(nereid_request_t *req, failure_reason_t reason);
/* Frees a request that was never submitted, or a filler. */
void request_free(nereid_request_t *req);
/* Completes a request the core accepted but never submitted to a model (an
 * on-demand load failed): an error response without outputs or model goes
 * to done_fn; err (owned) is its error; the request is freed. */
void request_fail_unsubmitted(nereid_request_t *req, nereid_complete_fn done_fn, void *done_userp,
                              nereid_error_t *err);
/* Copies s into the request's arena (or the heap when it is full); the copy
 * lives as long as req and is released by request_strfree. */
char *request_strdup(nereid_request_t *req, const char *s);
void request_strfree(nereid_request_t *req, char *s);
/* An ensemble step's request gets a child of parent's trace (parent->trace
 * set; trace.c): its own trace id, parent_id the ensemble's. */
void request_inherit_trace(nereid_request_t *step, const nereid_request_t *parent);
/* Adds a core-owned input (takes ownership of data, malloc'ed). */
void request_add_owned_input(nereid_request_t *req, const char *name, nereid_datatype_t dt,
                             const int64_t *shape, size_t rank, void *data, size_t byte_size);
/* Adds a core input that borrows data (the caller keeps it alive and
 * unchanged by others until the request is finished); replaces one of the
 * same name. The sequence batcher's single-buffer states use it. */
void request_add_borrowed_input(nereid_request_t *req, const char *name, nereid_datatype_t dt,
                                const int64_t *shape, size_t rank, void *data, size_t byte_size);
/* Finds an input by name, or NULL. */
req_input_t *request_find_input(nereid_request_t *req, const char *name);
/* Marks output name as captured for the core (not returned unless the client
 * asked for it); returns its response slot. */
/* Sets (or replaces) response parameter key of resp; value as
 * nereid_parameter_type_t says (copied). */
void response_set_parameter(nereid_response_t *resp, const char *key, int type, const void *value);
resp_output_t *request_capture_output(nereid_request_t *req, const char *name);
/* The response slot of output name, or NULL when nobody asked for it. */
resp_output_t *request_find_output(nereid_request_t *req, const char *name);
/* The response's output slots, in order. */
size_t request_output_count(const nereid_request_t *req);
resp_output_t *request_output_at(nereid_request_t *req, size_t i);
/* Removes output slot i, never allocated, from the response (a requested
 * ensemble output no step produced: Triton leaves it out). */
void request_drop_output(nereid_request_t *req, size_t i);
/* The one place output memory is chosen: the client's allocator for a
 * client output, else the response's arena while it has room (never for an
 * internal output: its buffer may be taken), else the heap. Sets the slot's
 * datatype, shape (as the client sees it) and size; the slot counts as
 * allocated, not yet filled. Triton's texts for allocator failures. */
nereid_error_t *request_alloc_output(nereid_request_t *req, resp_output_t *o, nereid_datatype_t dt,
                                     const int64_t *shape, size_t rank, size_t byte_size);
/* request_alloc_output for an output slot of resp, a response of req that
 * is not (or not yet) req->response: a decoupled model's further
 * responses. */
nereid_error_t *response_alloc_output(nereid_request_t *req, nereid_response_t *resp,
                                      resp_output_t *o, nereid_datatype_t dt, const int64_t *shape,
                                      size_t rank, size_t byte_size);
/* Output slot o of resp as a view of a backend's memory (data, byte_size):
 * kept as the slot's data when req accepts views and o is a client output,
 * else copied into a buffer as response_alloc_output makes it and released
 * at once. On success release(release_userp) runs exactly once (now or when
 * resp is freed); on error never. */
nereid_error_t *response_output_view(nereid_request_t *req, nereid_response_t *resp,
                                     resp_output_t *o, nereid_datatype_t dt, const int64_t *shape,
                                     size_t rank, const void *data, size_t byte_size,
                                     nereid_output_release_fn release, void *release_userp);
/* A new response for req as request_prepare_response makes it, not attached
 * (a decoupled model's further responses). */
nereid_response_t *request_new_response(nereid_request_t *req);
/* Drops internal and unfilled output slots (all of them for an error
 * response) so the client sees only its outputs. */
void response_compact(nereid_response_t *resp);
/* Marks an allocated output as produced. */
void request_output_set_filled(resp_output_t *o);
bool request_output_filled(const resp_output_t *o);
bool request_output_allocated(const resp_output_t *o);
/* Replaces the client-visible shape of an output. */
void request_output_set_shape(resp_output_t *o, const int64_t *shape, size_t rank);
/* Takes a filled internal output's heap buffer (the caller frees it), or
 * NULL when the output is not internal (then copy o->data). */
void *request_output_take(resp_output_t *o);
/* Whether the request's client cancelled it (nereid_request_cancel). */
static inline bool request_cancelled(const nereid_request_t *req)
{
    return req->cancel && atomic_load_explicit(&req->cancel->cancelled, memory_order_acquire);
}
/* Completes a cancelled request without running it: Triton's CANCELLED
 * status (empty message), failure reason CANCELED. */
void request_finish_cancelled(nereid_request_t *req);
/* ---- Deadlines: one rule for every queue (docs/requests.md, Timeouts) ----
 * A request whose client gave a timeout (timeout_us) must leave any queue
 * by its deadline: the client's timeout measured from its first submission.
 * Every scheduler removes a queued request whose deadline passed and
 * finishes it with request_finish_expired. */

/* Sets req->deadline_ns from its timeout at now, unless it has one
 * already (an ensemble step's, inherited). */
void request_start_deadline(nereid_request_t *req, uint64_t now);
/* Whether req's deadline has passed at now. */
static inline bool request_expired(const nereid_request_t *req, uint64_t now)
{
    return req->deadline_ns && now >= req->deadline_ns;
}
/* Finishes a request whose deadline passed in a queue: Triton's timed-out
 * request, UNAVAILABLE with text (NULL: "Request timeout expired", the
 * dynamic batcher's), failure reason REJECTED. */
void request_finish_expired(nereid_request_t *req, const char *text);

/* Gives dst the cancel token of src (an ensemble step: its request's). */
void request_share_cancel(nereid_request_t *dst, const nereid_request_t *src);
/* Streamed requests (nereid_server_infer_stream; decoupled.c) for a
 * scheduler that answers them itself (a decoupled ensemble): whether req
 * was submitted that way; delivers resp (owned) as one non-final response
 * (false, resp freed, when req is not streamed); makes req's final, at its
 * request_finish, carry the final flag alone. Calls for one request must
 * not overlap. */
bool request_is_streamed(const nereid_request_t *req);
bool request_send_response(nereid_request_t *req, nereid_response_t *resp);
void request_final_flags_only(nereid_request_t *req);
/* Makes req (not submitted yet) a streamed request whose responses go to
 * fn: a decoupled model's warmup request (warmup.c). */
void request_set_streamed(nereid_request_t *req, nereid_response_fn fn, void *userp);
/* Fails the request's response with err (owned) unless it failed already. */
void request_set_error(nereid_request_t *req, nereid_error_t *err);
/* Whether the request's response has failed; with CANCELLED. */
bool request_failed(const nereid_request_t *req);
bool request_failed_cancelled(const nereid_request_t *req);
/* A filler row: a request standing for no client (the sequence batcher's
 * empty slots), batch size 1, with an empty response; the caller adds its
 * inputs (request_add_owned_input) and frees it with request_free. */
nereid_request_t *request_new_filler(nereid_server_t *server);
/* Records req as one execution of its model whose parts' durations were
 * summed in parts (an ensemble: its steps' queue and compute durations;
 * see parent_stats), before a successful request_finish. The queue time is
 * then parts' (not the request's own timestamps). */
void request_record_stats(nereid_request_t *req, const model_stats_t *parts);

/* ---- Batches (batch.c): the container schedulers fill ---- */

/* Inline: a scheduler fills a batch without calling into batch.c (the
 * core's batch execution, which calls the scheduler back). */
static inline void batch_add(batch_t *batch, nereid_request_t *req)
{
    if (batch->n_reqs == batch->cap_reqs) {
        batch->cap_reqs = batch->cap_reqs ? 2 * batch->cap_reqs : 8;
        batch->reqs = xrealloc(batch->reqs, batch->cap_reqs * sizeof *batch->reqs);
    }
    batch->reqs[batch->n_reqs++] = req;
    batch->total_batch += req->batch_size;
}
/* Resets a batch for reuse (frees gathered buffers; keeps the reqs array). */
void batch_reset(batch_t *batch);
void batch_destroy(batch_t *batch);

#endif
