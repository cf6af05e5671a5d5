/*
 * This file contains the gRPC frontend's private shapes: completion-queue
 * tags, the frontend object, the unary call object and the helpers the
 * handler files share. Only src/grpc/ includes it.
 */
#ifndef NEREID_GRPC_INTERNAL_H
#define NEREID_GRPC_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>

#include "frontend/header_forward.h"
#include "grpc/grpc_server.h"
#include "http/mem_trim.h"
#include "nereid/server.h"

#define GFE_CONTAINER_OF(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

/* Every pointer handed to grpc as a tag is a gfe_tag_t; the completion-queue
 * thread calls fn with the event's success bit. */
typedef struct gfe_tag {
    void (*fn)(struct gfe_tag *tag, bool ok);
} gfe_tag_t;

typedef enum gfe_kind { GFE_UNARY, GFE_STREAM } gfe_kind_t;

struct gfe_unary_call;
typedef void (*gfe_unary_fn)(struct gfe_unary_call *c, const uint8_t *data, size_t len);

/* X(enum, method path, handler, kind, calls pre-posted per queue) */
#define GFE_METHOD_MAP(X)                                                                          \
    X(SERVER_LIVE, "/inference.GRPCInferenceService/ServerLive", gfe_server_live, GFE_UNARY, 8)    \
    X(SERVER_READY, "/inference.GRPCInferenceService/ServerReady", gfe_server_ready, GFE_UNARY, 2) \
    X(MODEL_READY, "/inference.GRPCInferenceService/ModelReady", gfe_model_ready, GFE_UNARY, 2)    \
    X(SERVER_METADATA, "/inference.GRPCInferenceService/ServerMetadata", gfe_server_metadata,      \
      GFE_UNARY, 2)                                                                                \
    X(MODEL_METADATA, "/inference.GRPCInferenceService/ModelMetadata", gfe_model_metadata,         \
      GFE_UNARY, 2)                                                                                \
    X(MODEL_INFER, "/inference.GRPCInferenceService/ModelInfer", gfe_model_infer, GFE_UNARY, 16)   \
    X(MODEL_STREAM_INFER, "/inference.GRPCInferenceService/ModelStreamInfer", NULL, GFE_STREAM, 4) \
    X(MODEL_CONFIG, "/inference.GRPCInferenceService/ModelConfig", gfe_model_config, GFE_UNARY, 2) \
    X(MODEL_STATISTICS, "/inference.GRPCInferenceService/ModelStatistics", gfe_model_statistics,   \
      GFE_UNARY, 2)                                                                                \
    X(REPOSITORY_INDEX, "/inference.GRPCInferenceService/RepositoryIndex", gfe_repository_index,   \
      GFE_UNARY, 2)                                                                                \
    X(REPOSITORY_MODEL_LOAD, "/inference.GRPCInferenceService/RepositoryModelLoad",                \
      gfe_repository_load, GFE_UNARY, 2)                                                           \
    X(REPOSITORY_MODEL_UNLOAD, "/inference.GRPCInferenceService/RepositoryModelUnload",            \
      gfe_repository_unload, GFE_UNARY, 2)                                                         \
    X(SYSTEM_SHM_STATUS, "/inference.GRPCInferenceService/SystemSharedMemoryStatus",               \
      gfe_system_shm_status, GFE_UNARY, 1)                                                         \
    X(SYSTEM_SHM_REGISTER, "/inference.GRPCInferenceService/SystemSharedMemoryRegister",           \
      gfe_system_shm_update, GFE_UNARY, 1)                                                         \
    X(SYSTEM_SHM_UNREGISTER, "/inference.GRPCInferenceService/SystemSharedMemoryUnregister",       \
      gfe_system_shm_update, GFE_UNARY, 1)                                                         \
    X(CUDA_SHM_STATUS, "/inference.GRPCInferenceService/CudaSharedMemoryStatus", gfe_cuda_shm,     \
      GFE_UNARY, 1)                                                                                \
    X(CUDA_SHM_REGISTER, "/inference.GRPCInferenceService/CudaSharedMemoryRegister", gfe_cuda_shm, \
      GFE_UNARY, 1)                                                                                \
    X(CUDA_SHM_UNREGISTER, "/inference.GRPCInferenceService/CudaSharedMemoryUnregister",           \
      gfe_cuda_shm, GFE_UNARY, 1)                                                                  \
    X(TRACE_SETTING, "/inference.GRPCInferenceService/TraceSetting", gfe_trace_setting, GFE_UNARY, \
      1)                                                                                           \
    X(LOG_SETTINGS, "/inference.GRPCInferenceService/LogSettings", gfe_log_settings, GFE_UNARY, 1) \
    X(HEALTH_CHECK, "/grpc.health.v1.Health/Check", gfe_health_check, GFE_UNARY, 2)

typedef enum gfe_method {
#define X(e, path, fn, kind, n) GFE_M_##e,
    GFE_METHOD_MAP(X)
#undef X
        GFE_N_METHODS
} gfe_method_t;

struct grpc_frontend {
    nereid_server_t *server;
    nereid_shm_registry_t *shm; /* borrowed; NULL = client shared memory off */
    grpc_server *grpc;
    int port;
    int n_queues;
    grpc_completion_queue **queues;
    pthread_t *threads;
    void *method_handles[GFE_N_METHODS];
    const restricted_apis_t *restricted; /* borrowed from the options; NULL = none */
    header_forward_t *header_forward;    /* --grpc-header-forward-pattern; NULL = off */
    int infer_compression_level;         /* a grpc_compression_level for inference replies */
    mem_trim_t *mem_trim;                /* the shared trimmer (http/mem_trim.h); may be NULL */
    size_t max_response_pool;            /* --grpc-max-response-pool-size */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_bool stopping;
    bool shutdown_done;         /* the server's shutdown tag completed */
    long n_live;                /* call objects alive (posted, running or finishing) */
    long n_calls;               /* calls that arrived and are not over (streams included) */
    bool draining;              /* grpc_frontend_drain ran; under mu */
    struct gfe_stream *streams; /* the streams alive (grpc_infer.c), under mu */
    gfe_tag_t shutdown_tag;
};

/* A unary call from request to final status. */
typedef struct gfe_unary_call {
    gfe_tag_t arrive_tag; /* the requested call arrived (or failed at shutdown) */
    gfe_tag_t done_tag;   /* the final batch completed */
    grpc_frontend_t *fe;
    int queue;
    gfe_method_t method;
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array request_md;
    grpc_byte_buffer *payload;
    int cancelled;
    grpc_slice status_details;
    grpc_byte_buffer *reply;
    void *userp;               /* handler state (ModelInfer: its request context) */
    bool arrived;              /* counted in fe->n_calls */
    grpc_metadata reply_md[1]; /* initial metadata to send (nereid-sequence-id echo) */
    size_t n_reply_md;
    /* ModelInfer watches the call from its start (gfe_unary_watch_close):
     * a client cancellation cancels the inference. The call is freed when
     * both the close and the final batch have completed. */
    gfe_tag_t close_tag;
    bool close_started;
    _Atomic int close_refs;
    nereid_cancel_token_t *cancel;
    /* ModelInfer: Triton's state id in the handler log lines, and the
     * client's cancellation as seen before the notification is handled
     * (grpc_hooks.h) */
    uint64_t log_id;
    atomic_bool client_cancelled;
    /* tracing (only while some trace setting is on): Triton's GRPC_*
     * timestamps, recorded into the trace when the call is freed */
    uint64_t waitread_start_ns, waitread_end_ns, response_ns, send_start_ns;
    nereid_trace_t *trace;
} gfe_unary_call_t;

/* Starts watching c for the client's cancellation (RECV_CLOSE_ON_SERVER
 * now instead of with the final status); when the client cancels, token
 * (owned by c from here on) is cancelled. */
void gfe_unary_watch_close(gfe_unary_call_t *c, nereid_cancel_token_t *token);

/* Handlers (one per RPC); each must finish the call exactly once, now or
 * later from any thread. */
void gfe_server_live(gfe_unary_call_t *c, const uint8_t *data, size_t len);
void gfe_server_ready(gfe_unary_call_t *c, const uint8_t *data, size_t len);
void gfe_model_ready(gfe_unary_call_t *c, const uint8_t *data, size_t len);
void gfe_server_metadata(gfe_unary_call_t *c, const uint8_t *data, size_t len);
void gfe_model_metadata(gfe_unary_call_t *c, const uint8_t *data, size_t len);
void gfe_model_infer(gfe_unary_call_t *c, const uint8_t *data, size_t len);
void gfe_model_config(gfe_unary_call_t *c, const uint8_t *data, size_t len);
void gfe_model_statistics(gfe_unary_call_t *c, const uint8_t *data, size_t len);
void gfe_repository_index(gfe_unary_call_t *c, const uint8_t *data, size_t len);
void gfe_repository_load(gfe_unary_call_t *c, const uint8_t *data, size_t len);
void gfe_repository_unload(gfe_unary_call_t *c, const uint8_t *data, size_t len);
void gfe_system_shm_status(gfe_unary_call_t *c, const uint8_t *data, size_t len);
void gfe_system_shm_update(gfe_unary_call_t *c, const uint8_t *data, size_t len);
void gfe_cuda_shm(gfe_unary_call_t *c, const uint8_t *data, size_t len);
void gfe_log_settings(gfe_unary_call_t *c, const uint8_t *data, size_t len);
void gfe_trace_setting(gfe_unary_call_t *c, const uint8_t *data, size_t len);
void gfe_health_check(gfe_unary_call_t *c, const uint8_t *data, size_t len);

/* Finishing a unary call; any thread, exactly once per call. */
/* OK with reply (takes ownership; NULL = empty message). */
void gfe_unary_finish(gfe_unary_call_t *c, grpc_byte_buffer *reply);

/* True on the frontend's completion-queue threads: they must never wait for
 * a write to complete (they are the ones that complete it). */
extern _Thread_local bool gfe_on_queue_thread;
/* OK with msg packed. */
void gfe_unary_finish_msg(gfe_unary_call_t *c, const ProtobufCMessage *msg);
/* A status; reply (may be NULL) is sent before it. */
void gfe_unary_finish_status(gfe_unary_call_t *c, grpc_status_code code, const char *details,
                             grpc_byte_buffer *reply);
/* err's mapped status and message; frees err. */
void gfe_unary_finish_error(gfe_unary_call_t *c, nereid_error_t *err);

/* Starts the stream state machine for a freshly arrived ModelStreamInfer
 * call (grpc_infer.c). Takes the call reference. */
void gfe_stream_start(grpc_frontend_t *fe, grpc_call *call, grpc_metadata_array *request_md);

/* --grpc-header-forward-pattern: the entries of md whose key matches become
 * string parameters of req (Triton's reserved names refused). No-op when
 * forwarding is off. */
nereid_error_t *gfe_forward_headers(const grpc_frontend_t *fe, const grpc_metadata *md, size_t n,
                                    nereid_request_t *req);

/* Graceful exit: every stream answers its open requests, then ends with
 * OK, unless a sequence it started goes on (grpc_infer.c). Called once,
 * with fe->mu held and fe->draining set. */
void gfe_streams_drain_locked(grpc_frontend_t *fe);
/* A call arrived (+1) or is over (-1): what a drain waits for. */
void gfe_calls_add(grpc_frontend_t *fe, int delta);

/* Object accounting so stop waits for every call object to be freed. */
void gfe_live_add(grpc_frontend_t *fe);
void gfe_live_release(grpc_frontend_t *fe);

/* Triton error code -> gRPC status (protocol-facts §7). */
grpc_status_code gfe_status_from_error(const nereid_error_t *err);
/* A byte buffer over a copy of n bytes. */
grpc_byte_buffer *gfe_buffer_from_bytes(const void *data, size_t n);
/* A byte buffer with msg packed into it. */
grpc_byte_buffer *gfe_buffer_from_msg(const ProtobufCMessage *msg);
/* bb's bytes as one contiguous slice (no copy when bb holds one slice);
 * caller unrefs with grpc_slice_unref. NULL bb gives an empty slice. */
grpc_slice gfe_buffer_read(grpc_byte_buffer *bb);

/* grpc_call_start_batch with the happens-before edge from here to the tag's
 * completion on a queue thread made visible to ThreadSanitizer (gRPC core's
 * own synchronisation is not instrumented). Every batch goes through it. */
grpc_call_error gfe_start_batch(grpc_call *call, const grpc_op *ops, size_t n, void *tag);

/* Triton's --grpc-infer-response-compression-level applies to inference
 * replies only: sets it on op (a SEND_INITIAL_METADATA) when infer. */
static inline void gfe_set_infer_compression(const grpc_frontend_t *fe, bool infer, grpc_op *op)
{
    if (!infer || fe->infer_compression_level == GRPC_COMPRESS_LEVEL_NONE) return;
    op->data.send_initial_metadata.maybe_compression_level.is_set = 1;
    op->data.send_initial_metadata.maybe_compression_level.level =
        (grpc_compression_level)fe->infer_compression_level;
}

#endif
