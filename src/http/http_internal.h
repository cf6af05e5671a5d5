/*
 * This file contains the HTTP frontend's private declarations, shared by
 * http_server.c (routing, connection plumbing, start and stop),
 * http_handlers.c (the non-inference endpoints) and http_infer.c (the
 * inference and generate endpoints): the route table, the server and
 * per-connection state, and the functions one of them calls in another.
 * Not for use outside src/http.
 */
#ifndef NEREID_HTTP_INTERNAL_H
#define NEREID_HTTP_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "frontend/header_forward.h"
#include "http/close_watch.h"
#include "http/compress.h"
#include "http/generate.h"
#include "http/http_common.h"
#include "http/http_server.h"
#include "http/infer_parse.h"
#include "http/linger.h"
#include "http/mem_trim.h"

#define HEADER_IHCL "Inference-Header-Content-Length"
/* Nereid's sequence headers (docs/deploy.md) */
#define HEADER_SEQ_ID "Nereid-Sequence-Id"
#define HEADER_SEQ_START "Nereid-Sequence-Start"
#define HEADER_SEQ_END "Nereid-Sequence-End"

/* X(id, method, path pattern, handler). Patterns match whole paths segment by
 * segment; {m} is a non-empty segment (model), {v} digits (version), {r} a
 * non-empty segment (repository or region). The first pattern that matches
 * the path decides; a method mismatch there is 405. Inference comes first: it
 * is the hot path, and no other pattern matches its paths. */
#define HTTP_ROUTE_MAP(X)                                                                          \
    X(MODEL_INFER, "POST", "/v2/models/{m}/infer", handle_infer)                                   \
    X(MODEL_INFER_V, "POST", "/v2/models/{m}/versions/{v}/infer", handle_infer)                    \
    X(MODEL_GENERATE, "POST", "/v2/models/{m}/generate", handle_generate)                          \
    X(MODEL_GENERATE_V, "POST", "/v2/models/{m}/versions/{v}/generate", handle_generate)           \
    X(MODEL_GENERATE_STREAM, "POST", "/v2/models/{m}/generate_stream", handle_generate)            \
    X(MODEL_GENERATE_STREAM_V, "POST", "/v2/models/{m}/versions/{v}/generate_stream",              \
      handle_generate)                                                                             \
    X(SERVER_METADATA, "GET", "/v2", handle_server_metadata)                                       \
    X(HEALTH_LIVE, "GET", "/v2/health/live", handle_health)                                        \
    X(HEALTH_READY, "GET", "/v2/health/ready", handle_health)                                      \
    X(MODELS_STATS, "GET", "/v2/models/stats", handle_stats)                                       \
    X(MODEL_METADATA, "GET", "/v2/models/{m}", handle_model_metadata)                              \
    X(MODEL_METADATA_V, "GET", "/v2/models/{m}/versions/{v}", handle_model_metadata)               \
    X(MODEL_READY, "GET", "/v2/models/{m}/ready", handle_model_ready)                              \
    X(MODEL_READY_V, "GET", "/v2/models/{m}/versions/{v}/ready", handle_model_ready)               \
    X(MODEL_CONFIG, "GET", "/v2/models/{m}/config", handle_model_config)                           \
    X(MODEL_CONFIG_V, "GET", "/v2/models/{m}/versions/{v}/config", handle_model_config)            \
    X(MODEL_STATS, "GET", "/v2/models/{m}/stats", handle_stats)                                    \
    X(MODEL_STATS_V, "GET", "/v2/models/{m}/versions/{v}/stats", handle_stats)                     \
    X(REPO_INDEX, "POST", "/v2/repository/index", handle_repository_index)                         \
    X(REPO_LOAD, "POST", "/v2/repository/models/{m}/load", handle_load)                            \
    X(REPO_UNLOAD, "POST", "/v2/repository/models/{m}/unload", handle_unload)                      \
    X(REPO_INDEX_NAMED, "POST", "/v2/repository/{r}/index", handle_repository_index)               \
    X(REPO_LOAD_NAMED, "POST", "/v2/repository/{r}/models/{m}/load", handle_named_repository)      \
    X(REPO_UNLOAD_NAMED, "POST", "/v2/repository/{r}/models/{m}/unload", handle_named_repository)  \
    X(SYS_SHM_STATUS, "GET", "/v2/systemsharedmemory/status", handle_shm)                          \
    X(SYS_SHM_REGION_STATUS, "GET", "/v2/systemsharedmemory/region/{r}/status", handle_shm)        \
    X(SYS_SHM_REGISTER, "POST", "/v2/systemsharedmemory/region/{r}/register", handle_shm)          \
    X(SYS_SHM_UNREGISTER, "POST", "/v2/systemsharedmemory/unregister", handle_shm)                 \
    X(SYS_SHM_REGION_UNREGISTER, "POST", "/v2/systemsharedmemory/region/{r}/unregister",           \
      handle_shm)                                                                                  \
    X(CUDA_SHM_STATUS, "GET", "/v2/cudasharedmemory/status", handle_shm)                           \
    X(CUDA_SHM_REGION_STATUS, "GET", "/v2/cudasharedmemory/region/{r}/status", handle_shm)         \
    X(CUDA_SHM_REGISTER, "POST", "/v2/cudasharedmemory/region/{r}/register", handle_shm)           \
    X(CUDA_SHM_UNREGISTER, "POST", "/v2/cudasharedmemory/unregister", handle_shm)                  \
    X(CUDA_SHM_REGION_UNREGISTER, "POST", "/v2/cudasharedmemory/region/{r}/unregister",            \
      handle_shm)                                                                                  \
    X(LOGGING_GET, "GET", "/v2/logging", handle_logging)                                           \
    X(LOGGING_POST, "POST", "/v2/logging", handle_logging)                                         \
    X(TRACE_GET, "GET", "/v2/trace/setting", handle_trace)                                         \
    X(TRACE_POST, "POST", "/v2/trace/setting", handle_trace)                                       \
    X(MODEL_TRACE_GET, "GET", "/v2/models/{m}/trace/setting", handle_trace)                        \
    X(MODEL_TRACE_POST, "POST", "/v2/models/{m}/trace/setting", handle_trace)

typedef enum http_route {
#define X(id, method, path, fn) ROUTE_##id,
    HTTP_ROUTE_MAP(X)
#undef X
        N_ROUTES,
    ROUTE_NOT_FOUND = -1,
    ROUTE_BAD_METHOD = -2,
} http_route_t;

/* One open TCP connection, in the idle list while no request is in progress
 * on it. The list and the count are under http_server.conns_lock. */
typedef struct conn_slot {
    http_conn_ctx_t ctx;                   /* first: http_queue_response reads it */
    struct conn_slot *prev, *next;         /* idle list links; NULL when not listed */
    struct conn_slot *all_prev, *all_next; /* http_server.all_conns links */
    atomic_bool receiving;                 /* a request started and its body is not all there yet */
    int fd;
    bool shut;               /* shut down by us (evicted or refused); MHD closes it */
    bool linger;             /* refused mid-upload: lingering close (linger.h) when MHD closes it */
    struct http_conn *spare; /* the last request's state, reused by the next (MHD thread) */
} conn_slot_t;

struct http_server {
    nereid_server_t *core;
    struct MHD_Daemon *daemon;
    const restricted_apis_t *restricted; /* --http-restricted-api; NULL = none */
    tls_pem_t pem;                       /* HTTPS key material, kept while the daemon runs */
    bool tls;                            /* HTTPS */
    bool tls_mutual;                     /* require and verify a client certificate */
    header_forward_t *header_forward;    /* --http-header-forward-pattern; NULL = off */
    size_t max_input_size;
    pthread_mutex_t lock;
    pthread_cond_t idle;
    atomic_size_t n_inflight; /* submitted inferences whose completion has not run */
    size_t n_suspended;       /* connections suspended whose handler has not run again (lock) */
    atomic_bool stopping;     /* written under lock */
    atomic_bool draining;     /* http_server_drain: listener closed, replies close */
    /* The listening socket MHD_quiesce_daemon handed back, shut down (new
     * connections refused) but closed only after MHD_stop_daemon: MHD's
     * pool threads take it out of their epoll sets after quiesce returns,
     * and a closed fd there is MHD's fatal "Failed to remove listen FD".
     * -1 until drained. */
    int quiesced_fd;
    pthread_mutex_t conns_lock;
    conn_slot_t idle_conns;     /* sentinel of the idle list, longest idle first */
    conn_slot_t all_conns;      /* sentinel of the list of every slot */
    size_t n_open;              /* open connections, not counting those we shut */
    size_t max_connections;     /* --http-max-connections after the fd limit */
    nereid_shm_registry_t *shm; /* borrowed; NULL = client shared memory off */
    close_watch_t *close_watch; /* cancels inferences whose client closed; may be NULL */
    mem_trim_t *mem_trim;       /* returns freed heap pages when idle; may be NULL */
    lingerer_t *linger;         /* lingering close of refused uploads; may be NULL */
};

/* The request headers the frontend reads, each the first of its name (as
 * MHD_lookup_connection_value finds it), or NULL: collected in the one pass
 * over the headers that checks the framing (http_server.c). */
typedef struct req_headers {
    const char *content_length, *transfer_encoding, *content_encoding, *accept_encoding;
    const char *ihcl;   /* Inference-Header-Content-Length */
    const char *seq[3]; /* Nereid-Sequence-Id, -Start, -End */
} req_headers_t;

/* One request's state. A connection keeps it for its next request
 * (conn_slot_t.spare): everything before path_buf is zeroed then, the rest
 * is left as the last request's cleanup left it (on_completed). */
typedef struct http_conn {
    http_server_t *srv;
    struct MHD_Connection *mhd;
    conn_slot_t *slot; /* the connection's (on_connection), or NULL */
    http_route_t route;
    http_route_t path_route; /* first route whose path matches, whatever the method */
    bool forbidden;          /* its API group is restricted and the header is wrong */
    req_headers_t hdr;
    char *path; /* copy of the URL (path_buf or malloc'ed); captures point into it */
    const char *model, *version_str, *name;
    int64_t version;
    sbuf_t body;             /* body bytes start at body.data + body_pad */
    nereid_body_t *body_mem; /* body.data is this memory of the model's backend, or NULL:
                                malloc'ed (server.h, "Request bodies") */
    size_t body_pad;         /* aligns the binary tail to 16 bytes */
    size_t limit;            /* body cap */
    nereid_error_t *error;   /* decided before dispatch (size, encoding) */
    bool unsupported_encoding;
    bool refused;  /* replied before reading the body */
    bool received; /* the whole request has arrived */
    http_encoding_t encoding;
    size_t header_len;     /* Inference-Header-Content-Length or NONE */
    size_t content_length; /* declared body size (0 if none), to size the body once */
    size_t n_pieces;       /* small body pieces MHD handed us (see MAX_CHUNKS) */
    uint64_t dropped;      /* body bytes read and discarded (a refused body) */
    bool chunked;          /* Transfer-Encoding: chunked */
    bool close;            /* reply to error with Connection: close */
    /* inference */
    bool submitted;
    nereid_error_t *submit_error; /* infer_async refused after the suspend */
    char *inflated;
    size_t inflated_len;
    char *raw_input_name;
    _Atomic(nereid_response_t *) response; /* set by the completion */
    _Atomic int phase;                     /* infer_phase_t */
    bool suspended;                        /* we suspended it; MHD thread only */
    /* tracing (only while some trace setting is on) */
    uint64_t recv_start_ns, recv_end_ns;
    nereid_trace_t *trace;
    nereid_shm_use_t *shm;         /* regions the inference uses, or NULL */
    nereid_cancel_token_t *cancel; /* the inference's, while submitted */
    uint64_t watch_id;             /* close watch while suspended, or 0 */
    struct gen_call *gen;          /* a generate request, once submitted */
    struct control_job *job;       /* a load or unload, once started */
    /* Not zeroed for a reused state (see above). */
    char path_buf[160];
    char seq_echo[132];    /* sequence id for the reply header, or "" (set per request) */
    infer_parsed_t parsed; /* zeroed head and an empty arena between requests */
} http_conn_t;

#define HTTP_CONN_RESET_BYTES offsetof(http_conn_t, path_buf)

/* An inference and its connection: the completion resumes the connection
 * only if the handler suspended it, and exactly once, so no resume ever
 * reaches a connection that is not suspended (or a freed one). */
typedef enum infer_phase {
    PHASE_RUNNING,   /* submitted, handler not suspended yet */
    PHASE_SUSPENDED, /* handler suspended the connection */
    PHASE_DONE,      /* completion stored the response */
} infer_phase_t;

/* One piece of the reply: a response's JSON object (an SSE event when
 * streaming) or an error object. */
typedef struct gen_chunk {
    struct gen_chunk *next;
    size_t len, off; /* off: bytes already handed to MHD */
    char data[];
} gen_chunk_t;

/* A generate request and its reply. Shared by the connection, the
 * inference's response callbacks and (streaming) the MHD response: freed by
 * the last of them. Everything below mu is under it. */
typedef struct gen_call {
    pthread_mutex_t mu;
    int refs;
    http_server_t *srv;
    struct MHD_Connection *mhd;
    http_conn_t *conn; /* NULL once the connection's request ended */
    bool streaming;    /* /generate_stream: server-sent events */
    gen_chunk_t *head, *tail;
    size_t n_chunks; /* queued since the start (responses and errors) */
    unsigned status; /* HTTP status, from the first response */
    bool started;    /* the first response (or final flag) came */
    bool final;      /* the final flag came */
    bool waiting;    /* the connection is suspended until the next chunk */
    generate_buffers_t bufs;
} gen_call_t;

struct control_job;

/* http_handlers.c: the route handlers, and what the other files need */
#define X(id, method, path, fn) enum MHD_Result fn(http_conn_t *c);
HTTP_ROUTE_MAP(X)
#undef X
enum MHD_Result version_error(http_conn_t *c);
void control_job_free(struct control_job *j);

/* http_infer.c: suspending a connection */
bool inflight_begin(http_server_t *srv);
void inflight_end(http_server_t *srv);
void conn_suspend(http_conn_t *c);
void conn_resumed(http_conn_t *c);
bool infer_wait(http_conn_t *c);
conn_slot_t *conn_slot(struct MHD_Connection *mc);
void gen_unref(gen_call_t *g);

#endif
