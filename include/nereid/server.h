/*
 * This file contains Nereid's in-process server API: the only interface the
 * frontends (HTTP, gRPC, metrics) and embedding programs may call. It covers
 * errors, datatypes, server lifecycle, metadata, readiness, statistics and
 * asynchronous inference with a caller-supplied output allocator.
 *
 * Threads: unless a declaration says otherwise, every function may be called
 * from any thread. Callbacks run on Nereid's threads and must return quickly.
 */
#ifndef NEREID_SERVER_H
#define NEREID_SERVER_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NEREID_EXPORT __attribute__((visibility("default")))

/* ---- Errors ------------------------------------------------------------ */

/* X(enum, Triton's code name as printed in reasons) */
#define NEREID_ERROR_CODE_MAP(X)                                                                   \
    X(UNKNOWN, "Unknown")                                                                          \
    X(INTERNAL, "Internal")                                                                        \
    X(NOT_FOUND, "Not found")                                                                      \
    X(INVALID_ARG, "Invalid argument")                                                             \
    X(UNAVAILABLE, "Unavailable")                                                                  \
    X(UNSUPPORTED, "Unsupported")                                                                  \
    X(ALREADY_EXISTS, "Already exists")                                                            \
    X(CANCELLED, "Cancelled")

typedef enum nereid_error_code {
#define X(e, s) NEREID_ERROR_##e,
    NEREID_ERROR_CODE_MAP(X)
#undef X
} nereid_error_code_t;

typedef struct nereid_error nereid_error_t;

/* A new error with a printf-formatted message. Caller frees with
 * nereid_error_free. Never returns NULL (falls back to a static error). */
NEREID_EXPORT nereid_error_t *nereid_error_new(nereid_error_code_t code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
NEREID_EXPORT nereid_error_code_t nereid_error_code(const nereid_error_t *err);
/* Borrowed until the error is freed. */
NEREID_EXPORT const char *nereid_error_message(const nereid_error_t *err);
/* Triton's name for the code ("Invalid argument", ...); static. */
NEREID_EXPORT const char *nereid_error_code_name(nereid_error_code_t code);
/* Frees err; NULL is fine. */
NEREID_EXPORT void nereid_error_free(nereid_error_t *err);

/* ---- Datatypes --------------------------------------------------------- */

/* X(enum, protocol name, element byte size (0 = variable), config name) */
#define NEREID_DATATYPE_MAP(X)                                                                     \
    X(BOOL, "BOOL", 1, "TYPE_BOOL")                                                                \
    X(UINT8, "UINT8", 1, "TYPE_UINT8")                                                             \
    X(UINT16, "UINT16", 2, "TYPE_UINT16")                                                          \
    X(UINT32, "UINT32", 4, "TYPE_UINT32")                                                          \
    X(UINT64, "UINT64", 8, "TYPE_UINT64")                                                          \
    X(INT8, "INT8", 1, "TYPE_INT8")                                                                \
    X(INT16, "INT16", 2, "TYPE_INT16")                                                             \
    X(INT32, "INT32", 4, "TYPE_INT32")                                                             \
    X(INT64, "INT64", 8, "TYPE_INT64")                                                             \
    X(FP16, "FP16", 2, "TYPE_FP16")                                                                \
    X(FP32, "FP32", 4, "TYPE_FP32")                                                                \
    X(FP64, "FP64", 8, "TYPE_FP64")                                                                \
    X(BYTES, "BYTES", 0, "TYPE_STRING")                                                            \
    X(BF16, "BF16", 2, "TYPE_BF16")

typedef enum nereid_datatype {
    NEREID_TYPE_INVALID = 0,
#define X(e, name, size, cfg) NEREID_TYPE_##e,
    NEREID_DATATYPE_MAP(X)
#undef X
} nereid_datatype_t;

/* "FP32" etc.; "INVALID" for an unknown value. Static. */
NEREID_EXPORT const char *nereid_datatype_name(nereid_datatype_t dt);
/* Parses a protocol name ("FP32"); NEREID_TYPE_INVALID when unknown. */
NEREID_EXPORT nereid_datatype_t nereid_datatype_from_name(const char *name);
/* Parses a config name ("TYPE_FP32"); NEREID_TYPE_INVALID when unknown. */
NEREID_EXPORT nereid_datatype_t nereid_datatype_from_config_name(const char *name);
/* Element size in bytes; 0 for BYTES (variable) and INVALID. */
NEREID_EXPORT size_t nereid_datatype_byte_size(nereid_datatype_t dt);

/* ---- Server ------------------------------------------------------------ */

typedef enum nereid_model_control_mode {
    NEREID_MODEL_CONTROL_NONE,
    NEREID_MODEL_CONTROL_POLL,
    NEREID_MODEL_CONTROL_EXPLICIT,
} nereid_model_control_mode_t;

typedef enum nereid_rate_limit_mode {
    NEREID_RATE_LIMIT_OFF,             /* rate_limiter configs are ignored */
    NEREID_RATE_LIMIT_EXECUTION_COUNT, /* Triton's "execution_count" */
} nereid_rate_limit_mode_t;

/* One --rate-limit-resource=<name>:<count>[:<device>]. */
typedef struct nereid_rate_limit_resource {
    const char *name;
    size_t count;
    int device; /* -1: every device */
} nereid_rate_limit_resource_t;

/* One --backend-config=[<backend>,]<setting>=<value>. */
typedef struct nereid_backend_setting {
    const char *backend; /* "" = every backend (a global setting) */
    const char *setting;
    const char *value;
} nereid_backend_setting_t;

/* The most quantiles --metrics-config summary_quantiles may list. */
#define NEREID_MAX_SUMMARY_QUANTILES 16

typedef struct nereid_server_options {
    const char *const *model_repositories; /* borrowed during nereid_server_new */
    size_t n_model_repositories;
    const char *backend_directory; /* NULL = the build's backends folder */
    nereid_model_control_mode_t model_control_mode;
    const char *const *load_models; /* explicit mode start-up models; "*" = all */
    size_t n_load_models;
    int repository_poll_secs;          /* poll mode period, default 15 */
    bool strict_model_config;          /* default false: autofill allowed */
    bool disable_auto_complete_config; /* default false */
    bool exit_on_error;                /* default true: a failed model load fails start-up */
    bool strict_readiness;             /* default true */
    int log_verbose;                   /* 0 = quiet */
    const char *server_id;             /* default "triton" */
    int model_load_thread_count;       /* default 4 */
    int model_load_retry_count; /* default 0: a failed model load is tried again this often */
    /* --model-namespacing (default false): the same model name may be in
     * several repositories, each copy in its repository's namespace. */
    bool model_namespacing;
    /* --metrics-config: the per-model latency counters (default true) and
     * the nv_inference_first_response_histogram_ms histogram (default
     * false), as Triton's counter_latencies / histogram_latencies. */
    bool metrics_counter_latencies;
    bool metrics_histogram_latencies;
    /* --metrics-config model_memory=true (Nereid's; on with load on demand):
     * nereid_model_memory_bytes, each loaded model's measured memory. */
    bool metrics_model_memory;
    /* summary_latencies=true (default false): Triton's per-model latency
     * summaries, with summary_quantiles (Triton's default 0.5, 0.9, 0.95,
     * 0.99, 0.999 when n_metrics_summary_quantiles is 0). */
    bool metrics_summary_latencies;
    double metrics_summary_quantiles[NEREID_MAX_SUMMARY_QUANTILES];
    size_t n_metrics_summary_quantiles;
    bool log_info, log_warning, log_error; /* default true: which log lines are printed */
    int log_format; /* a nereid_log_format_t; default NEREID_LOG_FORMAT_DEFAULT */
    nereid_rate_limit_mode_t rate_limit; /* default NEREID_RATE_LIMIT_OFF */
    const nereid_rate_limit_resource_t
        *rate_limit_resources; /* borrowed during nereid_server_new */
    size_t n_rate_limit_resources;
    /* Response cache (Triton's --cache-config): the implementation's name
     * (only "local") and its settings as a JSON object, e.g.
     * {"size":"1048576"}. NULL = no cache; models with response_cache
     * enabled are then served without it, as in Triton. */
    const char *cache_name;
    const char *cache_config_json;
    /* --backend-config settings in command-line order (borrowed during
     * nereid_server_new); each backend sees the global ones overridden by
     * its own (nereid_backend_config, backend.h). */
    const nereid_backend_setting_t *backend_settings;
    size_t n_backend_settings;
    /* Load on demand (an extension; explicit or poll model control): a
     * request for a model that is in a repository but not loaded loads it
     * first, on a loader thread, not the submitting one (concurrent
     * requests wait for one load). With a budget (> 0 bytes),
     * after each such load the least recently used models with nothing in
     * flight are unloaded until the loaded models' memory (each measured as
     * the process's RSS growth across its load) fits; models named by
     * load_models, the model just loaded and the composing models of a
     * loaded ensemble are never unloaded this way. Default off / 0. */
    bool model_load_on_demand;
    long long model_memory_budget_bytes;
    /* Triton's --model-config-name: a model whose directory has
     * configs/<name>.pbtxt is configured by that file instead of its
     * config.pbtxt. NULL or "" = config.pbtxt always; copied. */
    const char *model_config_name;
    /* Triton's --pinned-memory-pool-byte-size (default 268435456): reported
     * as nv_pinned_memory_pool_total_bytes, as Triton reports it on a
     * CPU-only build (the pool itself needs CUDA: used bytes stay 0). */
    uint64_t pinned_memory_pool_byte_size;
    /* --model-progress-timeout-secs (an extension; default 0 = off): a
     * model with an execution running longer than this while none of its
     * instances completed one is wedged: not ready, new requests refused
     * with UNAVAILABLE, its stuck instances ended where the backend can
     * (nereid_backend_instance_abort), counted in
     * nereid_model_progress_timeouts_total. */
    int model_progress_timeout_secs;
} nereid_server_options_t;

typedef struct nereid_server nereid_server_t;

/* Fills opts with Triton's defaults. */
NEREID_EXPORT void nereid_server_options_init(nereid_server_options_t *opts);

/* Creates a server, scans the repositories and loads models (in parallel).
 * On success *out is the server; caller frees with nereid_server_free.
 * On failure *out is NULL (e.g. exit_on_error and a model failed). */
NEREID_EXPORT nereid_error_t *nereid_server_new(const nereid_server_options_t *opts,
                                                nereid_server_t **out);
/* Graceful exit, first step (SIGTERM/SIGINT): the server is not ready from
 * now on (nereid_server_is_ready false) but stays live until it is stopped,
 * and still accepts inference: Triton lets the requests of connections and
 * sequences already open complete while it exits; refusing new clients is
 * the frontends' job. Idempotent; any thread. */
NEREID_EXPORT void nereid_server_begin_exit(nereid_server_t *server);
/* During a graceful exit: logs Triton's "Timeout <secs_left>: Found <n> model
 * versions that have in-flight inferences" and, for each, "Model '<m>'
 * (version <v>) has <k> in-flight inferences" (requests waiting in its
 * scheduler, as Triton counts them); returns n. */
NEREID_EXPORT size_t nereid_server_log_inflight(nereid_server_t *server, int secs_left);
/* During a graceful exit: logs Triton's "Timeout <secs_left>: Found <n> live
 * models and 0 in-flight non-inference requests" (n: loaded versions). */
NEREID_EXPORT void nereid_server_log_live_models(nereid_server_t *server, int secs_left);
/* Stops accepting requests; queued and running requests complete or fail
 * (UNAVAILABLE); every completion callback has been called when it returns. */
NEREID_EXPORT void nereid_server_stop(nereid_server_t *server);
/* Stops (if needed) and frees the server and every model. */
NEREID_EXPORT void nereid_server_free(nereid_server_t *server);

NEREID_EXPORT bool nereid_server_is_live(nereid_server_t *server);
/* True when started and every model that should be loaded is ready. */
NEREID_EXPORT bool nereid_server_is_ready(nereid_server_t *server);

/* JSON documents: *json_out is NUL-terminated, caller frees with free(). */

/* {"name","version","extensions":[...]} */
NEREID_EXPORT nereid_error_t *nereid_server_metadata(nereid_server_t *server, char **json_out);
/* version < 0 (or 0) means "latest ready" / all ready versions as Triton does.
 * {"name","versions":[..],"platform","inputs":[..],"outputs":[..]} */
NEREID_EXPORT nereid_error_t *nereid_server_model_metadata(nereid_server_t *server,
                                                           const char *model, int64_t version,
                                                           char **json_out);
/* The normalized model config as Triton's model config endpoint prints it. */
NEREID_EXPORT nereid_error_t *nereid_server_model_config(nereid_server_t *server, const char *model,
                                                         int64_t version, char **json_out);
/* The normalized model config as a serialized inference.ModelConfig protobuf;
 * *bytes_out is freed by the caller with free(). */
NEREID_EXPORT nereid_error_t *nereid_server_model_config_proto(nereid_server_t *server,
                                                               const char *model, int64_t version,
                                                               void **bytes_out,
                                                               size_t *byte_size_out);
/* *ready_out is false (and NULL returned) for a known but not-ready model;
 * errors (NOT_FOUND, ...) for an unknown model/version. */
NEREID_EXPORT nereid_error_t *nereid_server_model_is_ready(nereid_server_t *server,
                                                           const char *model, int64_t version,
                                                           bool *ready_out);
/* {"model_stats":[...]} (seed 003). model NULL or "" = all models. */
NEREID_EXPORT nereid_error_t *nereid_server_model_statistics(nereid_server_t *server,
                                                             const char *model, int64_t version,
                                                             char **json_out);
/* [{"name","version","state","reason"}...] for every model in the repositories. */
NEREID_EXPORT nereid_error_t *nereid_server_repository_index(nereid_server_t *server,
                                                             bool ready_only, char **json_out);
/* Prometheus text exposition of Triton's per-model metric families (the host
 * metrics, nv_cpu_*, are added by the metrics frontend). */
NEREID_EXPORT nereid_error_t *nereid_server_metrics(nereid_server_t *server, char **text_out);

/* Explicit model control. config_json may be NULL (use the repository's
 * config.pbtxt). files: n_files (relative path, content, size) overrides. */
NEREID_EXPORT nereid_error_t *nereid_server_load_model(nereid_server_t *server, const char *model,
                                                       const char *config_json,
                                                       const char *const *file_paths,
                                                       const void *const *file_contents,
                                                       const size_t *file_sizes, size_t n_files);
NEREID_EXPORT nereid_error_t *nereid_server_unload_model(nereid_server_t *server, const char *model,
                                                         bool unload_dependents);
/* As nereid_server_unload_model, but returns once the model's versions are
 * out of service (not ready, no new request reaches them), as Triton's
 * unload does: draining, finalizing and unloading dependents go on on a
 * thread of their own. For callers whose own requests the drain could be
 * waiting for: a model's code (pb_utils.unload_model). */
NEREID_EXPORT nereid_error_t *nereid_server_unload_model_async(nereid_server_t *server,
                                                               const char *model,
                                                               bool unload_dependents);

/* ---- Inference --------------------------------------------------------- */

typedef struct nereid_request nereid_request_t;
typedef struct nereid_response nereid_response_t;

/* A new request for model/version (version <= 0: latest). The model is
 * resolved when the request is submitted. Caller frees with
 * nereid_request_free unless nereid_server_infer_async took it. */
NEREID_EXPORT nereid_error_t *nereid_request_new(nereid_server_t *server, const char *model,
                                                 int64_t version, nereid_request_t **out);
NEREID_EXPORT void nereid_request_free(nereid_request_t *req);
/* Copies id. */
NEREID_EXPORT nereid_error_t *nereid_request_set_id(nereid_request_t *req, const char *id);
/* Adds an input. name and shape are copied; data is borrowed until the
 * completion callback has been called (or the request is freed). */
NEREID_EXPORT nereid_error_t *nereid_request_add_input(nereid_request_t *req, const char *name,
                                                       nereid_datatype_t datatype,
                                                       const int64_t *shape, size_t rank,
                                                       const void *data, size_t byte_size);
/* Asks for one output (none asked = all outputs). class_count > 0 asks for
 * classification (top-k) of that output; the frontend formats it with
 * nereid_response_classify. */
NEREID_EXPORT nereid_error_t *
nereid_request_add_requested_output(nereid_request_t *req, const char *name, uint32_t class_count);
NEREID_EXPORT void nereid_request_set_priority(nereid_request_t *req, uint64_t priority);
NEREID_EXPORT void nereid_request_set_timeout_us(nereid_request_t *req, uint64_t timeout_us);
NEREID_EXPORT void nereid_request_set_correlation_id(nereid_request_t *req, uint64_t id);
/* Copies id (at most 128 bytes; longer is UNSUPPORTED as in Triton). */
NEREID_EXPORT nereid_error_t *nereid_request_set_correlation_id_string(nereid_request_t *req,
                                                                       const char *id);
NEREID_EXPORT void nereid_request_set_sequence_flags(nereid_request_t *req, bool start, bool end);
/* Nereid extension (not in Triton): the sequence id and flags carried in
 * request headers (HTTP Nereid-Sequence-Id/-Start/-End, gRPC metadata
 * nereid-sequence-id/-start/-end) so a proxy can route on them. names are
 * the three header names (for error texts); id, start, end are the header
 * values, NULL when absent. An id of decimal digits is numeric, anything else
 * a string id; flags are true/false/1/0. Call after the body's parameters are
 * set: a non-zero body id must have the same text as the header, and a flag
 * the body sets to true must not be false in its header (INVALID_ARG
 * otherwise); a header fills what the body left unset. echo (echo_size bytes,
 * 130 is enough) receives the request's resulting sequence id as text, ""
 * when it has none. */
NEREID_EXPORT nereid_error_t *
nereid_request_sequence_headers(nereid_request_t *req, const char *const names[3], const char *id,
                                const char *start, const char *end, char *echo, size_t echo_size);
/* ---- Cancellation (Triton's request cancellation) ----
 * A cancel token stands for "the client is gone": a frontend makes one per
 * call (an HTTP connection's request, a gRPC call or stream), attaches it to
 * the requests it submits, and cancels it when the client closes the
 * connection or cancels the call. Cancelling is safe from any thread at any
 * time, before, during or after the requests run:
 *   - a request still queued is removed when its scheduler next looks at its
 *     queue and completed with NEREID_ERROR_CANCELLED (Triton's CANCELLED
 *     status, empty message), without executing;
 *   - a request already executing completes normally (the backend may ask
 *     nereid_batch_request_is_cancelled and stop early with CANCELLED);
 *   - an ensemble submits no further steps and its queued steps are
 *     cancelled like any request;
 *   - a cancelled sequence request ends its sequence (its slot is freed,
 *     later queued requests of the sequence are cancelled too).
 * Statistics: failures with reason CANCELED; a backend's CANCELLED answer
 * counts in response_stats "cancel". */
typedef struct nereid_cancel_token nereid_cancel_token_t;
/* A new token (not cancelled), with one reference for the caller. */
NEREID_EXPORT nereid_cancel_token_t *nereid_cancel_token_new(void);
/* Drops the caller's reference (requests keep their own). NULL is a no-op. */
NEREID_EXPORT void nereid_cancel_token_free(nereid_cancel_token_t *token);
/* Attaches token to req (the request takes its own reference; a second
 * call replaces the first token). Call before submission. */
NEREID_EXPORT void nereid_request_set_cancel_token(nereid_request_t *req,
                                                   nereid_cancel_token_t *token);
/* Cancels every request carrying token (idempotent). */
NEREID_EXPORT void nereid_request_cancel(nereid_cancel_token_t *token);
NEREID_EXPORT bool nereid_cancel_token_cancelled(const nereid_cancel_token_t *token);

/* Free-form parameters (copied); backends can read them. */
NEREID_EXPORT nereid_error_t *
nereid_request_set_parameter_string(nereid_request_t *req, const char *key, const char *value);
NEREID_EXPORT nereid_error_t *nereid_request_set_parameter_int(nereid_request_t *req,
                                                               const char *key, int64_t value);
NEREID_EXPORT nereid_error_t *nereid_request_set_parameter_bool(nereid_request_t *req,
                                                                const char *key, bool value);
NEREID_EXPORT nereid_error_t *nereid_request_set_parameter_double(nereid_request_t *req,
                                                                  const char *key, double value);

/* Output allocation: called on the executing thread (see nereid_complete_fn)
 * once per output with its final datatype, shape and byte size. Set *buffer to byte_size writable
 * bytes (byte_size may be 0) and *buffer_userp to anything release_fn needs. Returning an error
 * fails the request with it. */
typedef nereid_error_t *(*nereid_alloc_fn)(void *userp, const char *output_name,
                                           nereid_datatype_t datatype, const int64_t *shape,
                                           size_t rank, size_t byte_size, void **buffer,
                                           void **buffer_userp);
/* Releases a buffer from alloc_fn when the response is freed. */
typedef void (*nereid_release_fn)(void *userp, void *buffer, void *buffer_userp, size_t byte_size);

typedef struct nereid_response_allocator {
    nereid_alloc_fn alloc_fn;     /* NULL = Nereid allocates with malloc */
    nereid_release_fn release_fn; /* may be NULL when alloc_fn needs no release */
    void *userp;
} nereid_response_allocator_t;

/* alloc_fn's answer for an output it leaves to Nereid: *buffer NULL and
 * *buffer_userp NEREID_ALLOC_DECLINED. The output then takes Nereid's own
 * memory, as without an allocator, and release_fn is not called for it. */
#define NEREID_ALLOC_DECLINED ((void *)(uintptr_t)1)

/* Releases an output that a backend handed over in its own memory
 * (backend.h, nereid_batch_request_output_view); called exactly once, on
 * any thread, when nothing reads the bytes any more. */
typedef void (*nereid_output_release_fn)(void *release_userp);

/* Lets the core hand this request's outputs over as views of a backend's own
 * memory (a Python model's shared-memory region) instead of copying them into
 * buffers from the allocator: nereid_response_output's data then points into
 * that memory, which stays valid until nereid_response_free. Only for
 * callers that read output bytes through the response and free it after the
 * last read (HTTP and gRPC replies hold the response until sent); alloc_fn
 * is not called for such outputs, so a caller whose allocator places outputs
 * elsewhere (client shared memory) must not set it. Default false: every
 * output is in a buffer from the allocator (or malloc). Before submission. */
NEREID_EXPORT void nereid_request_set_output_views(nereid_request_t *req, bool accept);

/* Says what of this request another process can write while it runs (a
 * Python model's BLS call: the worker's shared memory): its input bytes
 * (NEREID_FOREIGN_INPUTS), or the memory its allocator gives outputs
 * (NEREID_FOREIGN_OUTPUTS). What the response cache would keep for it may
 * then not be what its inputs give or what the model wrote, and other
 * clients would be served it: with foreign inputs its response is never
 * stored, with a foreign allocator a response with an output from alloc_fn
 * is not (outputs it declines are Nereid's own); the same holds for the
 * ensemble steps it starts. A cached response is still served to it.
 * Before submission. */
#define NEREID_FOREIGN_INPUTS 1u
#define NEREID_FOREIGN_OUTPUTS 2u
NEREID_EXPORT void nereid_request_set_foreign_memory(nereid_request_t *req, unsigned what);

/* Called once per submitted request with the response (success or error);
 * the callee owns response and frees it with nereid_response_free. When it
 * is called the request's input memory is no longer used. It runs on a
 * Nereid thread, or on the submitting thread before
 * nereid_server_infer_async returns (a short request that found an idle
 * instance ran there), so do not hold a lock it takes while submitting. */
typedef void (*nereid_complete_fn)(nereid_response_t *response, void *userp);

/* Submits req. On success ownership of req moves to the server and done_fn
 * will be called exactly once. On failure (unknown model, bad input, queue
 * full, ...) the caller keeps req and done_fn is never called.
 * allocator is copied; NULL means malloc'ed outputs. */
NEREID_EXPORT nereid_error_t *
nereid_server_infer_async(nereid_server_t *server, nereid_request_t *req,
                          const nereid_response_allocator_t *allocator, nereid_complete_fn done_fn,
                          void *done_userp);

/* ---- Decoupled (streaming) inference ---- */

/* A request's last response (or flags-only final) carries this flag. */
#define NEREID_RESPONSE_FINAL 1u

/* Called for each response of a request submitted with
 * nereid_server_infer_stream: zero or more times with flags 0 and a
 * response, then exactly once with NEREID_RESPONSE_FINAL and either a last
 * response or NULL (a decoupled model sent only the final flag). The callee
 * owns each response (nereid_response_free). Calls for one request come in
 * order and never overlap; they run on Nereid's or a backend's threads, or
 * on the submitting thread before nereid_server_infer_stream returns. After
 * the final call the request's input memory is no longer used. A model that
 * is not decoupled gives exactly one call: its response with FINAL. */
typedef void (*nereid_response_fn)(nereid_response_t *response, uint32_t flags, void *userp);

/* nereid_server_infer_async for clients that accept several responses per
 * request (gRPC ModelStreamInfer): the only way to reach a decoupled
 * model's 0..N responses. Same ownership rules; fn replaces done_fn. */
NEREID_EXPORT nereid_error_t *
nereid_server_infer_stream(nereid_server_t *server, nereid_request_t *req,
                           const nereid_response_allocator_t *allocator, nereid_response_fn fn,
                           void *userp);

/* *decoupled_out: the model version (version <= 0: latest ready) has
 * model_transaction_policy { decoupled: true }. Errors as the model lookup
 * of an inference (unknown model or version, not ready). */
NEREID_EXPORT nereid_error_t *nereid_server_model_decoupled(nereid_server_t *server,
                                                            const char *model, int64_t version,
                                                            bool *decoupled_out);

/* ---- Request bodies in the backend's memory (backend ABI 1.10) ----
 * A frontend may receive an inference body into memory the model's backend
 * offers (nereid_backend_model_body_alloc): the inputs, which borrow the
 * body, then already lie where the backend reads them. */
typedef struct nereid_body nereid_body_t;

/* byte_size bytes for the body of an inference request to model/version
 * (version <= 0: latest ready) in memory the model's backend offers, or
 * NULL: the backend offers none (most do not; none now; the model is not
 * ready), and the frontend uses its own. *data: the bytes, writable until
 * nereid_body_free. Holds a reference on the model (its backend stays
 * loaded) until then. Any thread. */
NEREID_EXPORT nereid_body_t *nereid_server_body_alloc(nereid_server_t *server, const char *model,
                                                      int64_t version, size_t byte_size,
                                                      char **data);
/* Gives the body back to its backend once no request or response that
 * reads it is left (the frontend sent the reply and freed both). NULL is a
 * no-op. Any thread. */
NEREID_EXPORT void nereid_body_free(nereid_body_t *body);

/* Response accessors; everything returned is borrowed until
 * nereid_response_free. */
NEREID_EXPORT const nereid_error_t *nereid_response_error(const nereid_response_t *resp);
NEREID_EXPORT const char *nereid_response_id(const nereid_response_t *resp);
NEREID_EXPORT const char *nereid_response_model_name(const nereid_response_t *resp);
NEREID_EXPORT int64_t nereid_response_model_version(const nereid_response_t *resp);
NEREID_EXPORT size_t nereid_response_output_count(const nereid_response_t *resp);
/* Outputs are in the order they were requested (or config order when all). */
NEREID_EXPORT void nereid_response_output(const nereid_response_t *resp, size_t index,
                                          const char **name, nereid_datatype_t *datatype,
                                          const int64_t **shape, size_t *rank, const void **data,
                                          size_t *byte_size, void **buffer_userp);
/* class_count asked for output index (0 = not a classification output). */
NEREID_EXPORT uint32_t nereid_response_output_class_count(const nereid_response_t *resp,
                                                          size_t index);
/* Top-k of output index as Triton formats it ("value:index[:label]" per
 * batch item, descending), serialized as a BYTES tensor (4-byte LE length
 * prefixes). *bytes_out caller frees with free(); shape_out has room for 2. */
NEREID_EXPORT nereid_error_t *nereid_response_classify(const nereid_response_t *resp, size_t index,
                                                       uint32_t k, char **bytes_out,
                                                       size_t *byte_size_out, int64_t *shape_out,
                                                       size_t *rank_out);
NEREID_EXPORT void nereid_response_free(nereid_response_t *resp);
/* Response parameters a backend set (Triton's response parameters), in the
 * order first set. nereid_response_parameter's type is a
 * nereid_parameter_type_t (backend.h): 0 string (const char *), 1 int64_t,
 * 2 bool, 3 double; index must be below the count. Borrowed. */
NEREID_EXPORT size_t nereid_response_parameter_count(const nereid_response_t *resp);
NEREID_EXPORT void nereid_response_parameter(const nereid_response_t *resp, size_t index,
                                             const char **name, int *type, const void **value);

/* ---- Logging and trace settings ------------------------------------------ */

/* Log settings are process-wide (one log, on stderr or in the log file); the server argument names
 * the server the request came through. Reads and updates are safe from any
 * thread at any time: each field is an atomic, a log line in progress uses
 * the values it read when it started. */

typedef enum nereid_log_format {
    NEREID_LOG_FORMAT_DEFAULT, /* "I1122 hh:mm:ss.ssssss <pid> <file>:<line>] msg" (UTC) */
    NEREID_LOG_FORMAT_ISO8601, /* "2026-11-22T00:00:00Z I <pid> <file>:<line>] msg" (UTC) */
} nereid_log_format_t;

typedef struct nereid_log_settings {
    bool log_info, log_warning, log_error;
    uint32_t log_verbose_level;
    nereid_log_format_t log_format;
    const char *log_file; /* "" = stderr; valid until the next nereid_log_set_file */
} nereid_log_settings_t;

typedef enum nereid_log_level {
    NEREID_LOG_INFO,
    NEREID_LOG_WARN,
    NEREID_LOG_ERROR,
    NEREID_LOG_VERBOSE,
} nereid_log_level_t;

/* Sends every later log record to path, appended (Triton's --log-file).
 * Errors: INVALID_ARG "failed to open log file '<path>': <reason>" (the
 * previous destination stays). Call it before starting servers. */
NEREID_EXPORT nereid_error_t *nereid_log_set_file(const char *path);
/* Writes msg as one log record of the server's, with the caller's file and
 * line (TRITONSERVER_LogMessage); subject to the level settings; any thread. */
NEREID_EXPORT void nereid_log_message(nereid_log_level_t level, const char *file, int line,
                                      const char *msg);

/* "default" / "ISO8601"; static. */
NEREID_EXPORT const char *nereid_log_format_name(nereid_log_format_t format);
/* Parses "default" / "ISO8601" (exact spelling). Unknown: UNAVAILABLE
 * "invalid argument for --log_format, got: <s>" (Triton's text and code). */
NEREID_EXPORT nereid_error_t *nereid_log_format_parse(const char *s, nereid_log_format_t *out);
/* The current settings. */
NEREID_EXPORT void nereid_server_log_settings(nereid_server_t *server, nereid_log_settings_t *out);
/* Updates the settings; a NULL pointer leaves that setting unchanged.
 * log_format is validated first, so an error changes nothing. The log file
 * can not be changed (Triton: UNSUPPORTED "log file location can not be
 * updated through network protocol"); frontends check that themselves. */
NEREID_EXPORT nereid_error_t *
nereid_server_update_log_settings(nereid_server_t *server, const bool *log_info,
                                  const bool *log_warning, const bool *log_error,
                                  const uint32_t *log_verbose_level, const char *log_format);

/* ---- Tracing (Triton's trace extension, --trace-config) ------------------ */

/* A tracer holds the trace settings (global and per model), writes trace
 * files (triton mode) or exports spans (opentelemetry mode). */
typedef struct nereid_tracer nereid_tracer_t;
/* One sampled request's trace. Reference counted: the frontend that started
 * it and the request it is attached to each hold one. */
typedef struct nereid_trace nereid_trace_t;

/* Creates a tracer from Triton's tracing flags in command-line order:
 * names[i] is "trace-config" or one of the deprecated "trace-file",
 * "trace-level", "trace-rate", "trace-count", "trace-log-frequency";
 * values[i] its value (both borrowed during the call). Bad values give
 * INVALID_ARG with Triton's parse error text. Warnings for deprecated flags
 * go to stderr. Caller frees with nereid_tracer_free (after the server). */
NEREID_EXPORT nereid_error_t *nereid_tracer_new(const char *const *names, const char *const *values,
                                                size_t n, nereid_tracer_t **out);
/* Writes what trace files still hold, exports queued spans, frees. */
NEREID_EXPORT void nereid_tracer_free(nereid_tracer_t *tracer);
/* Attaches tracer (borrowed until nereid_server_free) to server. Without one
 * the settings API answers UNAVAILABLE "the server does not support tracing". */
NEREID_EXPORT void nereid_server_set_tracer(nereid_server_t *server, nereid_tracer_t *tracer);

/* Whether any trace setting has a level other than OFF: frontends test this
 * (one atomic load) before doing anything else for tracing. */
NEREID_EXPORT bool nereid_server_tracing(nereid_server_t *server);
/* Samples a trace for a request to model by the model's (or the global)
 * setting: Triton's rate and count. In opentelemetry mode a valid W3C
 * traceparent (tracestate may be NULL; both borrowed) forces sampling and
 * becomes the parent of the trace's spans. NULL: not traced. Caller owns one
 * reference (nereid_trace_release). Thread: any. */
NEREID_EXPORT nereid_trace_t *nereid_server_trace_start(nereid_server_t *server, const char *model,
                                                        const char *traceparent,
                                                        const char *tracestate);
/* The trace clock (CLOCK_MONOTONIC ns, Triton's steady clock). */
NEREID_EXPORT uint64_t nereid_trace_now_ns(void);
/* Records a frontend timestamp (HTTP_RECV_START, GRPC_SEND_END, ...). */
NEREID_EXPORT void nereid_trace_timestamp(nereid_trace_t *trace, const char *name, uint64_t ns);
/* The request records the core's timestamps into trace (it takes its own
 * reference, dropped when the request is released). Call before
 * nereid_server_infer_async. */
NEREID_EXPORT void nereid_request_set_trace(nereid_request_t *req, nereid_trace_t *trace);
/* Drops a reference; the last one writes or exports the trace. NULL is a no-op. */
NEREID_EXPORT void nereid_trace_release(nereid_trace_t *trace);
/* A named activity of this trace at ns (the trace clock), e.g. a backend's
 * (Triton's TRITONSERVER_InferenceTraceReportActivity): in triton mode an
 * entry {"id":<this trace's id>,"timestamps":[{"name":...,"ns":...}]}, in
 * opentelemetry mode an event of the innermost open span. Recorded only
 * at level TIMESTAMPS. NULL trace or name: nothing. Thread: any. */
NEREID_EXPORT void nereid_trace_activity(nereid_trace_t *trace, const char *name, uint64_t ns);
/* What identifies trace: its id, its parent's (0: none), the model and
 * version it traces and the request's id ("" when none; the model name is
 * NULL before the request started). Strings borrowed while the caller holds
 * a reference or the request; any out-pointer may be NULL. */
NEREID_EXPORT void nereid_trace_info(const nereid_trace_t *trace, uint64_t *id, uint64_t *parent_id,
                                     const char **model_name, int64_t *model_version,
                                     const char **request_id);

/* The trace settings as Triton reports them. model NULL or "" = the global
 * settings; otherwise a model that is not ready gives INVALID_ARG "Request
 * for unknown model : <m>". *json_out: {"trace_level":["TIMESTAMPS"],
 * "trace_rate":"1000","trace_count":"-1","log_frequency":"0",
 * "trace_file":"/tmp/t.json","trace_mode":"triton", <mode settings>...};
 * caller frees with free(). */
NEREID_EXPORT nereid_error_t *nereid_server_trace_settings(nereid_server_t *server,
                                                           const char *model, char **json_out);

/* One requested trace setting change. values NULL (and n_values 0) clears
 * the setting: a model's falls back to the global one, a global one to the
 * command line's. type_error, when set, is the frontend's text for a value
 * of the wrong JSON type, reported (INTERNAL) when this key's turn comes in
 * Triton's order. All borrowed during the call. */
typedef struct nereid_trace_setting {
    const char *key;
    const char *const *values;
    size_t n_values;
    const char *type_error;
} nereid_trace_setting_t;

/* Updates the settings as Triton does (trace_file refused, then
 * trace_level, trace_rate, trace_count, log_frequency; unknown keys
 * ignored), with Triton's error texts for the HTTP (grpc false) or gRPC
 * frontend. On success *json_out is as nereid_server_trace_settings. */
NEREID_EXPORT nereid_error_t *
nereid_server_update_trace_settings(nereid_server_t *server, const char *model,
                                    const nereid_trace_setting_t *settings, size_t n_settings,
                                    bool grpc, char **json_out);

#ifdef __cplusplus
}
#endif
#endif
