/*
 * This file contains Nereid's backend ABI: what a backend shared library
 * (libnereid_<name>.so) exports, and the functions the core exports to it.
 *
 * A backend is loaded with dlopen(RTLD_NOW | RTLD_LOCAL). The core looks up
 * these entry points with dlsym; only nereid_backend_execute is required:
 *
 *   uint32_t        nereid_backend_abi_version(void);   NEREID_BACKEND_ABI_VERSION
 *   nereid_error_t *nereid_backend_init(nereid_backend_t *);
 *   nereid_error_t *nereid_backend_fini(nereid_backend_t *);
 *   nereid_error_t *nereid_backend_model_init(nereid_model_t *);
 *   nereid_error_t *nereid_backend_model_fini(nereid_model_t *);
 *   nereid_error_t *nereid_backend_instance_init(nereid_instance_t *);
 *   nereid_error_t *nereid_backend_instance_fini(nereid_instance_t *);
 *   nereid_error_t *nereid_backend_execute(nereid_instance_t *, nereid_batch_t *);
 *   nereid_error_t *nereid_backend_instance_ready(nereid_instance_t *);
 *   nereid_error_t *nereid_backend_instance_abort(nereid_instance_t *);
 *   void           *nereid_backend_model_body_alloc(nereid_model_t *, size_t, void **);
 *   void            nereid_backend_model_body_release(void *);
 *
 * nereid_backend_instance_ready (optional, Triton's
 * TRITONBACKEND_ModelInstanceReady) answers a model-ready check (HTTP
 * /v2/models/<m>/ready, gRPC ModelReady) for each instance of a READY model:
 * NULL when the instance is ready, else an error whose message says why
 * (the core logs it at verbose level 1 and answers "not ready"). It runs on
 * the frontend's thread, concurrently with execute: keep it short.
 *
 * nereid_backend_instance_abort (optional, ABI 1.11) is called by the
 * core's progress watchdog (--model-progress-timeout-secs) when the
 * instance's execute has not returned for that long: the backend should
 * make that execute return soon, its requests failed with an error that
 * says why (the Python backend kills the instance's worker process, which
 * is then restarted). It runs on the watchdog's thread, concurrently with
 * the stuck execute; return NULL once the stop is under way, else an error
 * (logged). Backends without it stay stuck until execute returns.
 *
 * nereid_backend_model_body_alloc and nereid_backend_model_body_release
 * (optional, ABI 1.10, both or neither) let a backend offer the memory a
 * frontend receives a model's request bodies into, so that the inputs
 * (which borrow the body) already lie where the backend reads them: the
 * python backend's shared memory, mapped read-only by its workers.
 * body_alloc(model, byte_size, &data) returns an opaque handle and in *data
 * byte_size writable bytes, or NULL (no memory offered now: the frontend
 * uses its own). body_release(handle) gives it back once the frontend is
 * done with the body (the request and its response freed, the reply
 * sent); the backend must not reuse it before, and decides itself when
 * after (e.g. not while a response output still views it). Both run on
 * frontend threads, concurrently with execute and with each other; the
 * core holds a reference on the model from alloc to release.
 *
 * Without nereid_backend_abi_version the library is taken as ABI 1.0. The
 * core accepts a backend whose major version equals its own and whose minor
 * version is not newer.
 *
 * Threads: backend init/fini run once per process; model init/fini on a
 * repository thread; instance init/fini on the instance's own execution
 * thread. execute runs on that thread too, or, for a model whose executions
 * are short, on the thread that submitted the request while the instance's
 * thread waits (the default scheduler's inline runs). execute is never
 * called concurrently for one instance, but different instances (and
 * models) run concurrently.
 *
 * Memory: never free across the boundary. Errors returned to the core are
 * made with nereid_error_new and owned by the core afterwards.
 *
 * ABI history (minor versions; a backend built for 1.0 runs unchanged):
 *   1.0  one response per request, produced inside execute
 *   1.1  decoupled responses: nereid_batch_request_sender and the
 *        nereid_sender_* functions, nereid_model_decoupled
 *   1.2  nereid_batch_request_is_cancelled
 *   1.3  request parameters by index
 *   1.4  nereid_sender_is_cancelled
 *   1.5  nereid_model_server (in-process requests from a backend: BLS),
 *        nereid_backend_config / nereid_backend_config_json (--backend-config)
 *   1.6  nereid_batch_request_sequence (correlation id, flags, timeout),
 *        response parameters (nereid_batch_request_set_response_parameter,
 *        nereid_sender_set_parameter)
 *   1.7  custom metrics: nereid_metric_family_* / nereid_metric_* (counters,
 *        gauges, histograms shown on /metrics);
 *        nereid_batch_request_output_requested; nereid_model_set_inline_max_us;
 *        nereid_batch_request_reschedule, nereid_batch_request_trace
 *   1.8  response statistics reported by the backend
 *        (nereid_model_set_backend_response_stats, nereid_model_report_response),
 *        nereid_instance_is_passive
 *   1.9  outputs handed over in the backend's own memory
 *        (nereid_batch_request_output_view)
 *   1.10 request bodies in the backend's memory (nereid_backend_model_body_alloc,
 *        nereid_backend_model_body_release; optional entry points)
 *   1.11 nereid_backend_instance_abort (optional entry point: the progress
 *        watchdog ends a stuck execution)
 *   1.12 nereid_model_act_for_load / nereid_model_act_end (model control from
 *        a model's init on a thread of the backend)
 */
#ifndef NEREID_BACKEND_H
#define NEREID_BACKEND_H

#include "nereid/server.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NEREID_BACKEND_ABI_MAJOR 1u
/* 1: decoupled responses; 2: nereid_batch_request_is_cancelled; 3: request
 * parameters by index; 4: nereid_sender_is_cancelled; 5: nereid_model_server,
 * nereid_backend_config; 6: nereid_batch_request_sequence, response parameters;
 * 7: nereid_model_set_inline_max_us, custom metrics,
 * nereid_batch_request_output_requested, nereid_batch_request_reschedule,
 * nereid_batch_request_trace; 8: nereid_model_report_response;
 * 9: nereid_batch_request_output_view; 10: nereid_backend_model_body_alloc;
 * 11: nereid_backend_instance_abort; 12: nereid_model_act_for_load */
#define NEREID_BACKEND_ABI_MINOR 12u
#define NEREID_BACKEND_ABI_VERSION ((NEREID_BACKEND_ABI_MAJOR << 16) | NEREID_BACKEND_ABI_MINOR)

typedef struct nereid_backend nereid_backend_t;   /* one per loaded library */
typedef struct nereid_model nereid_model_t;       /* one per loaded model version */
typedef struct nereid_instance nereid_instance_t; /* one per model instance */
typedef struct nereid_batch nereid_batch_t;       /* requests of one execute call */

typedef enum nereid_instance_kind {
    NEREID_INSTANCE_KIND_AUTO = 0,
    NEREID_INSTANCE_KIND_GPU = 1,
    NEREID_INSTANCE_KIND_CPU = 2,
    NEREID_INSTANCE_KIND_MODEL = 3,
} nereid_instance_kind_t;

/* ---- Backend ---- */
NEREID_EXPORT const char *nereid_backend_name(const nereid_backend_t *backend);
NEREID_EXPORT void nereid_backend_set_state(nereid_backend_t *backend, void *state);
NEREID_EXPORT void *nereid_backend_state(const nereid_backend_t *backend);
/* ABI 1.5: the backend's --backend-config settings, as Triton resolves them
 * when it loads a backend: the global settings (`--backend-config=<s>=<v>`,
 * plus the server's own auto-complete-config, min-compute-capability and
 * backend-directory) overridden by the backend's own
 * (`--backend-config=<backend>,<s>=<v>`), and default-max-batch-size "4"
 * when neither sets it. The value of `setting`, or NULL when unset; valid
 * while the backend is loaded (from nereid_backend_init on). */
NEREID_EXPORT const char *nereid_backend_config(const nereid_backend_t *backend,
                                                const char *setting);
/* The same settings as Triton's TRITONBACKEND_BackendConfig JSON:
 * {"cmdline":{"<setting>":"<value>",...}}. */
NEREID_EXPORT const char *nereid_backend_config_json(const nereid_backend_t *backend);

/* ---- Model (borrowed strings live as long as the model) ---- */
NEREID_EXPORT nereid_backend_t *nereid_model_backend(const nereid_model_t *model);
NEREID_EXPORT const char *nereid_model_name(const nereid_model_t *model);
NEREID_EXPORT int64_t nereid_model_version(const nereid_model_t *model);
/* The model's directory (<repository>/<model>). */
NEREID_EXPORT const char *nereid_model_directory(const nereid_model_t *model);
/* The version's model file: <dir>/<version>/<default_model_filename or the
 * backend's default, e.g. "model.onnx">; the backend's default filename is
 * passed because only the backend knows it. Caller frees with free(). */
NEREID_EXPORT char *nereid_model_file_path(const nereid_model_t *model,
                                           const char *backend_default_filename);
/* Normalized config as JSON (Triton's form). */
NEREID_EXPORT const char *nereid_model_config_json(const nereid_model_t *model);
/* config.parameters[key].string_value, or NULL. */
NEREID_EXPORT const char *nereid_model_parameter(const nereid_model_t *model, const char *key);
NEREID_EXPORT int64_t nereid_model_max_batch_size(const nereid_model_t *model);
NEREID_EXPORT size_t nereid_model_input_count(const nereid_model_t *model);
NEREID_EXPORT size_t nereid_model_output_count(const nereid_model_t *model);
/* Config input/output i: name, datatype, dims (without the batch dimension;
 * -1 = variable). When the config has `reshape` for it, the reshape dims are
 * returned: those are the shapes the backend receives and must produce (the
 * core converts outputs back to the config dims for the client). */
NEREID_EXPORT void nereid_model_input(const nereid_model_t *model, size_t i, const char **name,
                                      nereid_datatype_t *datatype, const int64_t **dims,
                                      size_t *rank);
NEREID_EXPORT void nereid_model_output(const nereid_model_t *model, size_t i, const char **name,
                                       nereid_datatype_t *datatype, const int64_t **dims,
                                       size_t *rank);
/* Autofill (only inside nereid_backend_model_init, and only when the server
 * allows auto-complete): replaces the model config with config_json (Triton
 * JSON form); the core validates and normalizes it again. */
NEREID_EXPORT nereid_error_t *nereid_model_set_config(nereid_model_t *model,
                                                      const char *config_json);
/* True when the config may be autofilled (not strict, not disabled). */
NEREID_EXPORT bool nereid_model_autocomplete_allowed(const nereid_model_t *model);
/* (ABI 1.7) Lets the default scheduler run this model's executions on the
 * submitting thread (no hand-off to an instance thread) when an instance is
 * idle and their average duration is at most max_us, instead of the server's
 * NEREID_INLINE_US bound (which still disables inline runs when 0): for a
 * backend whose execute mostly waits on another process. Any thread. */
NEREID_EXPORT void nereid_model_set_inline_max_us(nereid_model_t *model, uint64_t max_us);
/* (ABI 1.8) The model's response_stats come from the backend's reports
 * (nereid_model_report_response) only, as Triton's do from
 * TRITONBACKEND_ModelInstanceReportResponseStatistics; the core no longer
 * counts the model's responses itself. Call during model init. */
NEREID_EXPORT void nereid_model_set_backend_response_stats(nereid_model_t *model);
/* (ABI 1.8) Counts one response of a request under its index (0 for the
 * request's first): success (err NULL, output_start_ns > 0), empty (err
 * NULL, output_start_ns 0), cancelled (err CANCELLED) or failed (any other
 * err; output_start_ns 0 when no output was made). Times are
 * CLOCK_MONOTONIC ns. INVALID_ARG (Triton's texts) for times out of order.
 * Any thread. */
NEREID_EXPORT nereid_error_t *
nereid_model_report_response(nereid_model_t *model, uint64_t index, uint64_t start_ns,
                             uint64_t output_start_ns, uint64_t end_ns, const nereid_error_t *err);
NEREID_EXPORT void nereid_model_set_state(nereid_model_t *model, void *state);
NEREID_EXPORT void *nereid_model_state(const nereid_model_t *model);

/* ---- Instance ---- */
NEREID_EXPORT nereid_model_t *nereid_instance_model(const nereid_instance_t *instance);
NEREID_EXPORT const char *nereid_instance_name(const nereid_instance_t *instance);
NEREID_EXPORT nereid_instance_kind_t nereid_instance_kind(const nereid_instance_t *instance);
NEREID_EXPORT int nereid_instance_device_id(const nereid_instance_t *instance);
/* (ABI 1.8) Whether the instance's group is passive (instance_group
 * passive: true): it is initialized but the scheduler never runs a batch on
 * it, as Triton's passive instances. */
NEREID_EXPORT bool nereid_instance_is_passive(const nereid_instance_t *instance);
NEREID_EXPORT void nereid_instance_set_state(nereid_instance_t *instance, void *state);
NEREID_EXPORT void *nereid_instance_state(const nereid_instance_t *instance);

/* ---- Batch: valid only during nereid_backend_execute ---- */
NEREID_EXPORT size_t nereid_batch_request_count(const nereid_batch_t *batch);
/* Total batch size: sum of the requests' first dimensions when the model
 * batches (max_batch_size > 0), else 1 per request. */
NEREID_EXPORT int64_t nereid_batch_size(const nereid_batch_t *batch);

/* The named input over the whole batch as one contiguous buffer: for batching
 * models the shape's first dimension is the batch total; for a batch of one
 * request the data is the request's own memory (no copy); otherwise the core
 * gathers into a buffer it frees after execute. Includes inputs the core
 * injects (sequence controls, implicit state). NOT_FOUND if absent.
 * The data has no alignment guarantee (a client's bytes sit anywhere in an
 * HTTP body or a protobuf message): read elements with memcpy. */
NEREID_EXPORT nereid_error_t *nereid_batch_input(nereid_batch_t *batch, const char *name,
                                                 nereid_datatype_t *datatype, const int64_t **shape,
                                                 size_t *rank, const void **data,
                                                 size_t *byte_size);
NEREID_EXPORT size_t nereid_batch_input_count(const nereid_batch_t *batch);
/* Name of input i of the first request (all requests share input names). */
NEREID_EXPORT const char *nereid_batch_input_name(const nereid_batch_t *batch, size_t i);

/* True if any request of the batch wants this output (or it is implicit state). */
NEREID_EXPORT bool nereid_batch_output_requested(const nereid_batch_t *batch, const char *name);
/* A buffer for the named output over the whole batch (shape's first dimension
 * is the batch total for batching models). For fixed-size types byte_size
 * must equal the element count times the element size; for BYTES it is the
 * serialized size (4-byte LE length prefix per element). The core splits it
 * back to the requests after execute returns; for a single request the buffer
 * is the response's own memory. Outputs nobody requested return a scratch
 * buffer. Owned by the core. */
NEREID_EXPORT nereid_error_t *nereid_batch_output(nereid_batch_t *batch, const char *name,
                                                  nereid_datatype_t datatype, const int64_t *shape,
                                                  size_t rank, size_t byte_size, void **buffer);

/* Per-request view, for backends that handle requests one by one. */
NEREID_EXPORT const char *nereid_batch_request_id(const nereid_batch_t *batch, size_t r);
NEREID_EXPORT nereid_error_t *nereid_batch_request_input(nereid_batch_t *batch, size_t r,
                                                         const char *name,
                                                         nereid_datatype_t *datatype,
                                                         const int64_t **shape, size_t *rank,
                                                         const void **data, size_t *byte_size);
NEREID_EXPORT nereid_error_t *nereid_batch_request_output(nereid_batch_t *batch, size_t r,
                                                          const char *name,
                                                          nereid_datatype_t datatype,
                                                          const int64_t *shape, size_t rank,
                                                          size_t byte_size, void **buffer);
/* ABI 1.9: output `name` of request r as a view of memory the backend owns
 * (rules of nereid_batch_request_output for name, shape and byte_size), so
 * that a large output need not be copied into the response. On success the
 * core owns the view: release(release_userp) is called exactly once, on any
 * thread, when the core no longer reads data: after the frontend freed the
 * response (it sent the reply), or at once when the output is copied
 * instead (the client takes outputs in buffers of its own: client shared
 * memory, an ensemble step, an in-process request) or was not requested.
 * Until then data must stay mapped and unchanged; the backend must not
 * reuse it, also after its model or instance is unloaded. On error release
 * is never called and the backend keeps the memory. Only for fixed-size
 * datatypes (BYTES: INVALID_ARG). */
NEREID_EXPORT nereid_error_t *
nereid_batch_request_output_view(nereid_batch_t *batch, size_t r, const char *name,
                                 nereid_datatype_t datatype, const int64_t *shape, size_t rank,
                                 const void *data, size_t byte_size,
                                 nereid_output_release_fn release, void *release_userp);
/* Request parameter lookups; false when absent or of another type. */
NEREID_EXPORT bool nereid_batch_request_parameter_int(const nereid_batch_t *batch, size_t r,
                                                      const char *key, int64_t *value);
NEREID_EXPORT const char *nereid_batch_request_parameter_string(const nereid_batch_t *batch,
                                                                size_t r, const char *key);
/* Fails request r with err (takes ownership); other requests are unaffected. */
NEREID_EXPORT void nereid_batch_set_request_error(nereid_batch_t *batch, size_t r,
                                                  nereid_error_t *err);
/* Optional timing report (CLOCK_MONOTONIC ns) splitting execute into
 * compute_input / compute_infer / compute_output for statistics. */
NEREID_EXPORT void nereid_batch_report_compute(nereid_batch_t *batch, uint64_t input_end_ns,
                                               uint64_t infer_end_ns);
/* CLOCK_MONOTONIC in ns, the clock statistics use. */
NEREID_EXPORT uint64_t nereid_now_ns(void);

/* ---- Decoupled responses (ABI 1.1) ----
 *
 * A model with `model_transaction_policy { decoupled: true }` may answer a
 * request with any number of responses (0..N), then a final flag, as
 * Triton's TRITONBACKEND_ResponseFactory does. A backend that never takes a
 * sender keeps today's behaviour on any model: one response per request,
 * from the outputs it fills during execute, with the final flag.
 *
 * nereid_batch_request_sender takes over responding to request r: the core
 * then sends nothing for it when execute returns (outputs set through
 * nereid_batch_*output for it are dropped). Instead the backend sends
 * responses through the sender, from any thread and also after execute has
 * returned, and ends with the FINAL flag (nereid_sender_send with FINAL or
 * nereid_sender_send_flags), which frees the sender. Until then the request
 * and its model stay alive. The core does not wait for open senders: a
 * backend that sends from its own threads ends them (each with its final
 * flag) in instance fini, as the repeat backend does.
 * The batch and the request's inputs are valid only during execute: copy
 * what later responses need. Calls on one sender must not overlap.
 *
 * Statistics: each sent response is counted under its index in the model's
 * response_stats ("0", "1", ...): success (outputs), empty_response (no
 * outputs), fail (an error); compute_infer runs from the previous response
 * (or the execution start) to the first output allocated, compute_output
 * from there to the send. */

typedef struct nereid_response_sender nereid_response_sender_t;

#define NEREID_RESPONSE_FLAG_FINAL 1u

/* True when the model's config has model_transaction_policy { decoupled: true }. */
NEREID_EXPORT bool nereid_model_decoupled(const nereid_model_t *model);
/* The sender of request r (the same one when asked twice). UNSUPPORTED when
 * the model is not decoupled, or when the request came from a client that
 * takes one response only (e.g. an ensemble step): then answer it the 1.0
 * way. Only during execute. */
NEREID_EXPORT nereid_error_t *nereid_batch_request_sender(nereid_batch_t *batch, size_t r,
                                                          nereid_response_sender_t **out);
/* A buffer for output `name` of the sender's next response (rules as
 * nereid_batch_request_output: byte_size must match the shape for
 * fixed-size types; an output the client did not ask for gets scratch
 * memory). Valid until that response is sent. */
NEREID_EXPORT nereid_error_t *nereid_sender_output(nereid_response_sender_t *sender,
                                                   const char *name, nereid_datatype_t datatype,
                                                   const int64_t *shape, size_t rank,
                                                   size_t byte_size, void **buffer);
/* Sends the next response: its outputs from nereid_sender_output, or, when
 * err is non-NULL (owned by the core), an error response. flags may carry
 * NEREID_RESPONSE_FLAG_FINAL: then it is the last response and the sender is
 * freed. Errors (a sender already finished) leave err freed. */
NEREID_EXPORT nereid_error_t *nereid_sender_send(nereid_response_sender_t *sender, uint32_t flags,
                                                 nereid_error_t *err);
/* Sends only flags, no response (NEREID_RESPONSE_FLAG_FINAL: no more
 * responses; the sender is freed). Outputs allocated since the last send
 * are dropped. */
NEREID_EXPORT nereid_error_t *nereid_sender_send_flags(nereid_response_sender_t *sender,
                                                       uint32_t flags);

/* ABI 1.2: whether request r's client has cancelled it (server.h,
 * cancellation). A backend may stop early and fail the request with
 * NEREID_ERROR_CANCELLED (counted as a cancelled response); it may also
 * ignore it (the response is then dropped by the frontend). */
NEREID_EXPORT bool nereid_batch_request_is_cancelled(const nereid_batch_t *batch, size_t r);

/* ---- ABI 1.3: request parameters by index ----
 * Triton's TRITONBACKEND_RequestParameterCount/RequestParameter: every
 * parameter of request r — the body's "parameters" and headers forwarded by
 * --http-header-forward-pattern / --grpc-header-forward-pattern — in the
 * order they were set (a name set twice keeps its first place and its last
 * value). */
typedef enum nereid_parameter_type {
    NEREID_PARAMETER_STRING = 0, /* value: const char * (NUL-terminated) */
    NEREID_PARAMETER_INT = 1,    /* value: const int64_t * */
    NEREID_PARAMETER_BOOL = 2,   /* value: const bool * */
    NEREID_PARAMETER_DOUBLE = 3, /* value: const double * */
} nereid_parameter_type_t;

/* Parameters of request r; 0 when r is out of range. */
NEREID_EXPORT size_t nereid_batch_request_parameter_count(const nereid_batch_t *batch, size_t r);
/* Parameter index of request r: its name, type and a pointer to its value
 * (see nereid_parameter_type_t), all borrowed until execute returns.
 * INVALID_ARG when r or index is out of range (out-parameters zeroed). */
NEREID_EXPORT nereid_error_t *nereid_batch_request_parameter(const nereid_batch_t *batch, size_t r,
                                                             size_t index, const char **name,
                                                             nereid_parameter_type_t *type,
                                                             const void **value);

/* ABI 1.4: whether the client of the sender's request has cancelled it
 * (nereid_batch_request_is_cancelled for the responses sent after execute).
 * A backend may stop early: send the final response with a
 * NEREID_ERROR_CANCELLED error (counted under "cancel" in response_stats);
 * responses it sends anyway are dropped by the frontend. */
NEREID_EXPORT bool nereid_sender_is_cancelled(const nereid_response_sender_t *sender);

/* ABI 1.5: the server that loaded the model, for in-process requests from
 * a backend (Triton's BLS): nereid_request_new / nereid_server_infer_async
 * (server.h) into any model the server serves, with its normal scheduling.
 * Valid while the model is loaded. A backend must not wait inside execute
 * for a request to a model whose instances are all busy waiting on it. */
NEREID_EXPORT nereid_server_t *nereid_model_server(const nereid_model_t *model);

/* ABI 1.12: model control from a model's init on another thread. A model's
 * init (model and instance init, warm-up) may load and unload models
 * through server.h; a backend that makes those calls on a thread of its
 * own (the Python backend's pb_utils.load_model in initialize) calls
 * nereid_model_act_for_load(model) on that thread first: until
 * nereid_model_act_end() the thread acts for the load that is initializing
 * model. Its loads and unloads then take the composing models an ensemble
 * load holds when that load is the one loading model (steps of the same
 * ensemble), and a load or unload of a model that load is still working on
 * (model itself) fails at once ("model '<m>' is being loaded or unloaded
 * by the call that made this one") instead of waiting for a load that
 * waits for it. Returns false, and the thread acts for itself, once
 * model's load is over (or when it is not being loaded). */
NEREID_EXPORT bool nereid_model_act_for_load(const nereid_model_t *model);
NEREID_EXPORT void nereid_model_act_end(void);

/* ABI 1.6: what request r carries besides tensors and parameters (Triton's
 * TRITONBACKEND_RequestCorrelationId/-String, RequestFlags, timeout):
 * *corr_id the numeric correlation id (0: none or a string id),
 * *corr_id_str the string id or NULL (borrowed until execute returns),
 * *flags NEREID_REQUEST_FLAG_SEQUENCE_START / _END bits, *timeout_us the
 * request's timeout (0: none). Any pointer may be NULL; all are zeroed when
 * r is out of range. */
#define NEREID_REQUEST_FLAG_SEQUENCE_START 1u
#define NEREID_REQUEST_FLAG_SEQUENCE_END 2u
NEREID_EXPORT void nereid_batch_request_sequence(const nereid_batch_t *batch, size_t r,
                                                 uint64_t *corr_id, const char **corr_id_str,
                                                 uint32_t *flags, uint64_t *timeout_us);

/* ABI 1.6: a parameter of request r's response (Triton's
 * TRITONBACKEND_ResponseSet*Parameter; clients see it in the response's
 * "parameters"). value points to a NUL-terminated string, int64_t, bool or
 * double as type says (copied); a key set again is replaced. Only during
 * execute. INVALID_ARG when r is out of range or the request has no
 * response (a sender took it). */
NEREID_EXPORT nereid_error_t *
nereid_batch_request_set_response_parameter(nereid_batch_t *batch, size_t r, const char *key,
                                            nereid_parameter_type_t type, const void *value);
/* The same for the sender's next response. */
NEREID_EXPORT nereid_error_t *nereid_sender_set_parameter(nereid_response_sender_t *sender,
                                                          const char *key,
                                                          nereid_parameter_type_t type,
                                                          const void *value);

/* ABI 1.7: whether request r wants output name (Triton's requested outputs:
 * every output when the client named none, plus implicit state). Call it
 * before a sender takes the request's response; false when r is out of
 * range. */
NEREID_EXPORT bool nereid_batch_request_output_requested(const nereid_batch_t *batch, size_t r,
                                                         const char *name);

/* ---- ABI 1.7: custom metrics (Triton's TRITONSERVER_MetricFamily and
 * TRITONSERVER_Metric) ----
 * A process-wide registry printed on /metrics after Nereid's own families,
 * in prometheus-cpp's text format. Families are merged by name as Triton's
 * registry does: a second family of the same name and kind shares the first
 * one's series; a series (one label set) is shared by every metric created
 * with the same labels and disappears with the last of them. A family with
 * no series prints nothing. Any thread may call these; each call takes one
 * mutex. Errors are Triton's codes and texts. */
typedef enum nereid_metric_kind {
    NEREID_METRIC_COUNTER = 0,
    NEREID_METRIC_GAUGE = 1,
    NEREID_METRIC_HISTOGRAM = 2,
} nereid_metric_kind_t;
typedef struct nereid_metric_family nereid_metric_family_t;
typedef struct nereid_metric nereid_metric_t;

/* A new family handle (caller frees with nereid_metric_family_delete).
 * name: [a-zA-Z_:][a-zA-Z0-9_:]*; INVALID_ARG for a bad name, an unknown
 * kind, or a name registered with another kind. *out NULL on failure. */
NEREID_EXPORT nereid_error_t *nereid_metric_family_new(nereid_metric_kind_t kind, const char *name,
                                                       const char *description,
                                                       nereid_metric_family_t **out);
/* INTERNAL (and nothing freed) while metrics made from this handle exist. */
NEREID_EXPORT nereid_error_t *nereid_metric_family_delete(nereid_metric_family_t *family);
NEREID_EXPORT nereid_metric_kind_t nereid_metric_family_kind(const nereid_metric_family_t *family);
/* A new metric of family with n_labels (name, value) pairs (copied; a name
 * given twice keeps the last value). Histograms need buckets (ascending
 * upper bounds, n_buckets may be 0 for only +Inf); counters and gauges
 * take buckets == NULL. Caller frees with nereid_metric_delete before the
 * family. */
NEREID_EXPORT nereid_error_t *nereid_metric_new(nereid_metric_family_t *family,
                                                const char *const *label_names,
                                                const char *const *label_values, size_t n_labels,
                                                const double *buckets, size_t n_buckets,
                                                nereid_metric_t **out);
NEREID_EXPORT nereid_error_t *nereid_metric_delete(nereid_metric_t *metric);
NEREID_EXPORT nereid_metric_kind_t nereid_metric_kind(const nereid_metric_t *metric);
/* Counter and gauge only (UNSUPPORTED for a histogram). */
NEREID_EXPORT nereid_error_t *nereid_metric_value(nereid_metric_t *metric, double *value);
/* Gauge: any value; counter: value >= 0 (INVALID_ARG otherwise). */
NEREID_EXPORT nereid_error_t *nereid_metric_increment(nereid_metric_t *metric, double value);
/* Gauge only. */
NEREID_EXPORT nereid_error_t *nereid_metric_set(nereid_metric_t *metric, double value);
/* Histogram only. */
NEREID_EXPORT nereid_error_t *nereid_metric_observe(nereid_metric_t *metric, double value);
/* ABI 1.7: request r goes back to its model's scheduler when execute
 * returns, instead of being completed (Triton's
 * TRITONBACKEND_RequestRelease(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)):
 * it runs again in a later batch with the same inputs, its SEQUENCE_START
 * and SEQUENCE_END flags cleared; its response sender (decoupled) stays the
 * same; outputs this execution allocated for it are dropped. Only the
 * sequence batcher with iterative_sequence takes requests back; any other
 * scheduler refuses with INVALID_ARG "Request is released with
 * TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not configured
 * to handle such a flag." (Triton's text), and a sequence that has ended
 * (idle) refuses with the sequence batcher's START error. On error the
 * request completes as usual. Only during execute. */
NEREID_EXPORT nereid_error_t *nereid_batch_request_reschedule(nereid_batch_t *batch, size_t r);

/* ABI 1.7: request r's trace when it is sampled for tracing, else NULL
 * (borrowed until execute returns; report with nereid_trace_activity, read
 * with nereid_trace_info, server.h). NULL when r is out of range. */
NEREID_EXPORT nereid_trace_t *nereid_batch_request_trace(const nereid_batch_t *batch, size_t r);

#ifdef __cplusplus
}
#endif
#endif
