/*
 * This file contains the KServe v2 HTTP/REST frontend on libmicrohttpd: the
 * route table, the per-connection state machine (headers, body, dispatch),
 * the handlers of every endpoint and the asynchronous inference path.
 *
 * Inference: the body is accumulated in our own buffer (capped by
 * --http-max-input-size, checked first from the headers), parsed into a
 * nereid_request_t that borrows it, and submitted with
 * nereid_server_infer_async while the connection is suspended. The response
 * allocator gives every output its own malloc'ed buffer; the completion
 * callback only stores the response and resumes the connection, and the MHD
 * thread then replies with an iovec response (JSON header + output buffers,
 * no copy of tensor data) whose free callback releases everything.
 *
 * MHD rules kept here: no response is queued on the first handler call
 * except the early body-size refusal (which should close the connection);
 * suspended connections are all resumed before MHD_stop_daemon.
 */
#include "http/http_server.h"

#include <errno.h>
#include <gnutls/gnutls.h>
#include <inttypes.h>
#include <jansson.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http/close_watch.h"
#include "frontend/header_forward.h"
#include "http/compress.h"
#include "http/http_common.h"
#include "http/infer_parse.h"
#include "http/generate.h"
#include "http/infer_reply.h"
#include "http/json_reader.h"
#include "http/load_request.h"
#include "http/mem_trim.h"
#include "http/par.h"

#define HEADER_IHCL "Inference-Header-Content-Length"
/* No request ended for this long: freed heap pages go back to the system. */
#define HTTP_TRIM_QUIET_NS 1000000000u

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
    bool shut; /* shut down by us (evicted or refused); MHD closes it */
} conn_slot_t;

struct http_server {
    nereid_server_t *core;
    struct MHD_Daemon *daemon;
    const restricted_apis_t *restricted; /* --http-restricted-api; NULL = none */
    tls_pem_t pem;                       /* HTTPS key material, kept while the daemon runs */
    bool tls_mutual;                     /* require and verify a client certificate */
    header_forward_t *header_forward;    /* --http-header-forward-pattern; NULL = off */
    size_t max_input_size;
    pthread_mutex_t lock;
    pthread_cond_t idle;
    size_t n_inflight;  /* submitted inferences whose completion has not run */
    size_t n_suspended; /* connections suspended whose handler has not run again */
    bool stopping;
    atomic_bool draining; /* http_server_drain: listener closed, replies close */
    pthread_mutex_t conns_lock;
    conn_slot_t idle_conns;     /* sentinel of the idle list, longest idle first */
    conn_slot_t all_conns;      /* sentinel of the list of every slot */
    size_t n_open;              /* open connections, not counting those we shut */
    size_t max_connections;     /* --http-max-connections after the fd limit */
    nereid_shm_registry_t *shm; /* borrowed; NULL = client shared memory off */
    close_watch_t *close_watch; /* cancels inferences whose client closed; may be NULL */
    mem_trim_t *mem_trim;       /* returns freed heap pages when idle; may be NULL */
};

/* One output buffer from the response allocator; data follows the header. */
typedef struct out_buf {
    struct out_buf *next;
    size_t byte_size;
} out_buf_t;

typedef struct http_conn {
    http_server_t *srv;
    struct MHD_Connection *mhd;
    http_route_t route;
    http_route_t path_route; /* first route whose path matches, whatever the method */
    bool forbidden;          /* its API group is restricted and the header is wrong */
    char *path;              /* copy of the URL (path_buf or malloc'ed); captures point into it */
    char path_buf[160];
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
    bool chunked;          /* Transfer-Encoding: chunked */
    bool close;            /* reply to error with Connection: close */
    /* inference */
    bool submitted;
    nereid_error_t *submit_error; /* infer_async refused after the suspend */
    char *inflated;
    size_t inflated_len;
    infer_parsed_t parsed;
    char *raw_input_name;
    _Atomic(out_buf_t *) outs;
    _Atomic(nereid_response_t *) response; /* set by the completion */
    _Atomic int phase;                     /* infer_phase_t */
    bool suspended;                        /* we suspended it; MHD thread only */
    char seq_echo[132];                    /* sequence id for the reply header, or "" */
    /* tracing (only while some trace setting is on) */
    uint64_t recv_start_ns, recv_end_ns;
    nereid_trace_t *trace;
    nereid_shm_use_t *shm;         /* regions the inference uses, or NULL */
    nereid_cancel_token_t *cancel; /* the inference's, while submitted */
    uint64_t watch_id;             /* close watch while suspended, or 0 */
    struct gen_call *gen;          /* a generate request, once submitted */
    struct control_job *job;       /* a load or unload, once started */
} http_conn_t;

/* An inference and its connection: the completion resumes the connection
 * only if the handler suspended it, and exactly once, so no resume ever
 * reaches a connection that is not suspended (or a freed one). */
typedef enum infer_phase {
    PHASE_RUNNING,   /* submitted, handler not suspended yet */
    PHASE_SUSPENDED, /* handler suspended the connection */
    PHASE_DONE,      /* completion stored the response */
} infer_phase_t;

/* Everything an infer reply keeps alive until MHD has sent it. */
typedef struct reply_hold {
    nereid_response_t *response;
    infer_reply_t reply;
    out_buf_t *outs;
} reply_hold_t;

/* ---- Routing -------------------------------------------------------------- */

static const struct {
    const char *method, *path;
} routes[N_ROUTES] = {
#define X(id, method, path, fn) {method, path},
    HTTP_ROUTE_MAP(X)
#undef X
};

static bool all_digits(const char *s, size_t n)
{
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}

/* Matches path against pattern; on a match fills captures (pointers into
 * path, whose '/' separators the caller later replaces by NULs). */
static bool route_match(const char *pattern, const char *path, const char **cap_m,
                        const char **cap_v, const char **cap_r)
{
    const char *p = pattern, *s = path;
    while (*p && *s) {
        if (*p != '/' || *s != '/') return false;
        p++, s++;
        const char *pe = strchr(p, '/'), *se = strchr(s, '/');
        size_t pn = pe ? (size_t)(pe - p) : strlen(p), sn = se ? (size_t)(se - s) : strlen(s);
        if (pn == 3 && p[0] == '{') {
            if (sn == 0 || (p[1] == 'v' && !all_digits(s, sn))) return false;
            *(p[1] == 'm' ? cap_m : p[1] == 'v' ? cap_v : cap_r) = s;
        } else if (pn != sn || memcmp(p, s, pn)) {
            return false;
        }
        p += pn, s += sn;
    }
    return !*p && !*s;
}

static void route_resolve(http_conn_t *c, const char *url, const char *method)
{
    c->route = c->path_route = ROUTE_NOT_FOUND;
    size_t n = strlen(url);
    c->path = n < sizeof c->path_buf ? c->path_buf : malloc(n + 1);
    if (!c->path) return;
    memcpy(c->path, url, n + 1);
    const char *m = NULL, *v = NULL, *r = NULL;
    for (int i = 0; i < N_ROUTES; i++) {
        if (!route_match(routes[i].path, c->path, &m, &v, &r)) {
            m = v = r = NULL;
            continue;
        }
        if (c->path_route < 0) c->path_route = (http_route_t)i;
        /* A path may be listed once per method: keep looking on a mismatch. */
        if (strcmp(method, routes[i].method)) {
            c->route = ROUTE_BAD_METHOD;
            continue;
        }
        c->route = (http_route_t)i;
        break;
    }
    /* Cut the captured segments out of the owned path copy. */
    for (char *q = c->path; *q; q++)
        if (*q == '/') *q = '\0';
    c->model = m;
    c->version_str = v;
    c->name = r;
    c->version = 0;
    if (v) {
        errno = 0;
        long long x = strtoll(v, NULL, 10);
        c->version = errno ? -2 : (int64_t)x;
    }
}

/* Triton's restricted API group of each route (http_server.cc handlers). */
static restricted_group_t route_group(http_route_t r)
{
    switch (r) {
    case ROUTE_HEALTH_LIVE:
    case ROUTE_HEALTH_READY:
    case ROUTE_MODEL_READY:
    case ROUTE_MODEL_READY_V:
        return RESTRICTED_HEALTH;
    case ROUTE_SERVER_METADATA:
    case ROUTE_MODEL_METADATA:
    case ROUTE_MODEL_METADATA_V:
        return RESTRICTED_METADATA;
    case ROUTE_MODEL_INFER:
    case ROUTE_MODEL_INFER_V:
    case ROUTE_MODEL_GENERATE:
    case ROUTE_MODEL_GENERATE_V:
    case ROUTE_MODEL_GENERATE_STREAM:
    case ROUTE_MODEL_GENERATE_STREAM_V:
        return RESTRICTED_INFERENCE;
    case ROUTE_MODEL_CONFIG:
    case ROUTE_MODEL_CONFIG_V:
        return RESTRICTED_MODEL_CONFIG;
    case ROUTE_MODELS_STATS:
    case ROUTE_MODEL_STATS:
    case ROUTE_MODEL_STATS_V:
        return RESTRICTED_STATISTICS;
    case ROUTE_REPO_INDEX:
    case ROUTE_REPO_LOAD:
    case ROUTE_REPO_UNLOAD:
    case ROUTE_REPO_INDEX_NAMED:
    case ROUTE_REPO_LOAD_NAMED:
    case ROUTE_REPO_UNLOAD_NAMED:
        return RESTRICTED_MODEL_REPOSITORY;
    case ROUTE_SYS_SHM_STATUS:
    case ROUTE_SYS_SHM_REGION_STATUS:
    case ROUTE_SYS_SHM_REGISTER:
    case ROUTE_SYS_SHM_UNREGISTER:
    case ROUTE_SYS_SHM_REGION_UNREGISTER:
    case ROUTE_CUDA_SHM_STATUS:
    case ROUTE_CUDA_SHM_REGION_STATUS:
    case ROUTE_CUDA_SHM_REGISTER:
    case ROUTE_CUDA_SHM_UNREGISTER:
    case ROUTE_CUDA_SHM_REGION_UNREGISTER:
        return RESTRICTED_SHARED_MEMORY;
    case ROUTE_LOGGING_GET:
    case ROUTE_LOGGING_POST:
        return RESTRICTED_LOGGING;
    case ROUTE_TRACE_GET:
    case ROUTE_TRACE_POST:
    case ROUTE_MODEL_TRACE_GET:
    case ROUTE_MODEL_TRACE_POST:
        return RESTRICTED_TRACE;
    default:
        return RESTRICTED_NONE;
    }
}

/* Triton answers a restricted route before anything else it checks (even
 * the method): 403 unless the group's header carries the exact value. */
static bool route_forbidden(http_conn_t *c)
{
    restricted_group_t g = route_group(c->path_route);
    const char *header = restricted_header(c->srv->restricted, g);
    if (!header) return false;
    const char *value = MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND, header);
    return !restricted_allows(c->srv->restricted, g, value);
}

static enum MHD_Result reply_forbidden(http_conn_t *c)
{
    const char *header = restricted_header(c->srv->restricted, route_group(c->path_route));
    char msg[600];
    snprintf(msg, sizeof msg, "This API is restricted, expecting header '%s'", header);
    return http_queue_error(c->mhd, 403, msg);
}

/* ---- Small handlers ------------------------------------------------------- */

static enum MHD_Result reply_json_or_error(struct MHD_Connection *mc, nereid_error_t *err,
                                           char *json)
{
    if (err) {
        free(json);
        return http_queue_nereid_error(mc, err);
    }
    return http_queue_json_owned(mc, 200, json);
}

static enum MHD_Result version_error(http_conn_t *c)
{
    return http_queue_error(c->mhd, 400,
                            "failed to get model version from specified version "
                            "string (details: out of range), version should be an "
                            "integral value > 0");
}

static enum MHD_Result handle_server_metadata(http_conn_t *c)
{
    char *json = NULL;
    nereid_error_t *err = nereid_server_metadata(c->srv->core, &json);
    return reply_json_or_error(c->mhd, err, json);
}

static enum MHD_Result handle_health(http_conn_t *c)
{
    bool ok = c->route == ROUTE_HEALTH_LIVE ? nereid_server_is_live(c->srv->core)
                                            : nereid_server_is_ready(c->srv->core);
    return http_queue_text(c->mhd, ok ? 200 : 400, NULL, NULL, 0);
}

static enum MHD_Result handle_model_metadata(http_conn_t *c)
{
    if (c->version < -1) return version_error(c);
    char *json = NULL;
    nereid_error_t *err = nereid_server_model_metadata(c->srv->core, c->model, c->version, &json);
    return reply_json_or_error(c->mhd, err, json);
}

/* Triton's generate extension is not served: the model is looked up and the
 * body size checked (before this) as Triton does, then 501. */
static enum MHD_Result handle_generate(http_conn_t *c);

static enum MHD_Result handle_model_config(http_conn_t *c)
{
    if (c->version < -1) return version_error(c);
    char *json = NULL;
    nereid_error_t *err = nereid_server_model_config(c->srv->core, c->model, c->version, &json);
    return reply_json_or_error(c->mhd, err, json);
}

static enum MHD_Result handle_model_ready(http_conn_t *c)
{
    bool ready = false;
    nereid_error_t *err =
        c->version < -1 ? NULL
                        : nereid_server_model_is_ready(c->srv->core, c->model, c->version, &ready);
    /* Triton answers an unknown model or version as "not ready". */
    if (err) {
        nereid_error_code_t code = nereid_error_code(err);
        if (code != NEREID_ERROR_NOT_FOUND && code != NEREID_ERROR_UNAVAILABLE)
            return http_queue_nereid_error(c->mhd, err);
        nereid_error_free(err);
    }
    if (!ready) return http_queue_error(c->mhd, 400, "Model version not ready");
    return http_queue_text(c->mhd, 200, NULL, NULL, 0);
}

static enum MHD_Result handle_stats(http_conn_t *c)
{
    if (c->version < -1) return version_error(c);
    char *json = NULL;
    nereid_error_t *err = nereid_server_model_statistics(c->srv->core, c->model, c->version, &json);
    return reply_json_or_error(c->mhd, err, json);
}

/* Parses the body with jansson; *too_deep (may be NULL) tells that it failed
 * on jansson's nesting limit (2048), which Triton's iterative rapidjson
 * does not have. */
/* Levels of a JSON body that handlers read: deeper containers are read as
 * empty ones (no handler looks that deep; a member expected to be a scalar
 * is then an array or object, refused by its type check). */
#define JSON_TREE_DEPTH 64

/* Every JSON body but the inference request's goes through here: checked at
 * any depth without recursion, as Triton's iterative parse (its texts), so
 * one body is refused or read the same way on every endpoint whatever its
 * nesting; jansson then builds the tree of its first JSON_TREE_DEPTH levels
 * (and refuses a NUL in a string). */
static json_t *parse_body_json(http_conn_t *c, nereid_error_t **err)
{
    *err = NULL;
    if (c->body.len == 0) return NULL;
    char *flat;
    size_t flat_len;
    if ((*err = json_reader_check(c->body.data, c->body.len, JSON_TREE_DEPTH, &flat, &flat_len)))
        return NULL;
    json_error_t jerr;
    json_t *root = flat ? json_loadb(flat, flat_len, 0, &jerr)
                        : json_loadb(c->body.data, c->body.len, 0, &jerr);
    free(flat);
    if (root) return root;
    /* jansson refuses \u0000 in strings: a NUL in a name or key is the
     * client's error (400), as in the inference JSON reader. */
    enum json_error_code code = json_error_code(&jerr);
    bool nul = code == json_error_null_character || code == json_error_null_byte_in_key;
    *err = nereid_error_new(nul ? NEREID_ERROR_INVALID_ARG : NEREID_ERROR_INTERNAL,
                            "failed to parse the request JSON buffer: %s at %d", jerr.text,
                            jerr.position);
    return NULL;
}

static enum MHD_Result handle_repository_index(http_conn_t *c)
{
    nereid_error_t *err;
    json_t *root = parse_body_json(c, &err);
    if (err) return http_queue_nereid_error(c->mhd, err);
    bool ready_only = false;
    if (root) {
        json_t *ready = json_is_object(root) ? json_object_get(root, "ready") : NULL;
        if (ready && !json_is_boolean(ready)) {
            json_decref(root);
            return http_queue_error(c->mhd, 400, "Invalid value for 'ready': expected a boolean");
        }
        ready_only = ready && json_is_true(ready);
        json_decref(root);
    }
    char *json = NULL;
    err = nereid_server_repository_index(c->srv->core, ready_only, &json);
    return reply_json_or_error(c->mhd, err, json);
}

/* ---- Model control ----
 *
 * A load or unload can take as long as a model's init or drain (minutes for
 * some): it runs on a thread of its own while its connection is suspended,
 * so the event thread goes on serving its other connections, and several
 * loads run at once as the repository allows (repository.c, "Control"). */

typedef struct control_job {
    http_conn_t *c;
    bool unload, dependents;
    json_t *root; /* the load's body: req borrows from it */
    load_request_t req;
    nereid_error_t *err; /* the outcome */
} control_job_t;

static bool infer_wait(http_conn_t *c);
static void conn_suspend(http_conn_t *c);
static void conn_resumed(http_conn_t *c);

static void control_job_free(control_job_t *j)
{
    if (!j) return;
    if (!j->unload) load_request_free(&j->req);
    if (j->root) json_decref(j->root);
    if (j->err) nereid_error_free(j->err);
    free(j);
}

/* Runs the operation, then hands the connection back as an inference's
 * completion does (infer_done): it never touches c after that. */
static void *control_job_main(void *arg)
{
    control_job_t *j = arg;
    http_conn_t *c = j->c;
    http_server_t *srv = c->srv;
    if (j->unload)
        j->err = nereid_server_unload_model(srv->core, c->model, j->dependents);
    else
        j->err = nereid_server_load_model(srv->core, c->model, j->req.config, j->req.paths,
                                          (const void *const *)j->req.contents, j->req.sizes,
                                          j->req.n_files);
    int phase = PHASE_RUNNING;
    if (!atomic_compare_exchange_strong(&c->phase, &phase, PHASE_DONE)) {
        atomic_store(&c->phase, PHASE_DONE);
        MHD_resume_connection(c->mhd);
    }
    pthread_mutex_lock(&srv->lock);
    if (--srv->n_inflight == 0) pthread_cond_broadcast(&srv->idle);
    pthread_mutex_unlock(&srv->lock);
    return NULL;
}

static enum MHD_Result control_reply(http_conn_t *c)
{
    conn_resumed(c);
    control_job_t *j = c->job;
    c->job = NULL;
    nereid_error_t *err = j->err;
    j->err = NULL;
    control_job_free(j);
    if (err) return http_queue_nereid_error(c->mhd, err);
    return http_queue_text(c->mhd, 200, NULL, NULL, 0);
}

static enum MHD_Result control_start(http_conn_t *c, control_job_t *j)
{
    j->c = c;
    c->job = j;
    pthread_mutex_lock(&c->srv->lock);
    c->srv->n_inflight++;
    pthread_mutex_unlock(&c->srv->lock);
    pthread_attr_t attr;
    pthread_t t;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, control_job_main, j) != 0) control_job_main(j);
    pthread_attr_destroy(&attr);
    if (infer_wait(c)) return control_reply(c);
    return MHD_YES;
}

/* Called again once the job resumed the connection. */
static bool control_resumed(http_conn_t *c, enum MHD_Result *ret)
{
    if (!c->job) return false;
    if (atomic_load(&c->phase) == PHASE_DONE) {
        *ret = control_reply(c);
    } else { /* not seen: wait again, as handle_infer does */
        conn_resumed(c);
        conn_suspend(c);
        if (atomic_load(&c->phase) == PHASE_DONE) MHD_resume_connection(c->mhd);
        *ret = MHD_YES;
    }
    return true;
}

static enum MHD_Result handle_load(http_conn_t *c)
{
    enum MHD_Result ret;
    if (control_resumed(c, &ret)) return ret;
    nereid_error_t *err;
    json_t *root = parse_body_json(c, &err);
    if (err) return http_queue_nereid_error(c->mhd, err);
    control_job_t *j = calloc(1, sizeof *j);
    if (!j) {
        if (root) json_decref(root);
        return http_queue_error(c->mhd, 500, "out of memory");
    }
    j->root = root;
    err = load_request_read(root, &j->req);
    if (err) {
        control_job_free(j);
        return http_queue_nereid_error(c->mhd, err);
    }
    return control_start(c, j);
}

static enum MHD_Result handle_unload(http_conn_t *c)
{
    enum MHD_Result ret;
    if (control_resumed(c, &ret)) return ret;
    nereid_error_t *err;
    json_t *root = parse_body_json(c, &err);
    if (err) return http_queue_nereid_error(c->mhd, err);
    bool dependents = false;
    json_t *params = root && json_is_object(root) ? json_object_get(root, "parameters") : NULL;
    json_t *v =
        params && json_is_object(params) ? json_object_get(params, "unload_dependents") : NULL;
    if (v && !json_is_boolean(v))
        err = nereid_error_new(NEREID_ERROR_INTERNAL,
                               "Unable to parse 'unload_dependents': attempt to access JSON "
                               "non-boolean as boolean");
    dependents = v && json_is_true(v);
    if (root) json_decref(root);
    if (err) return http_queue_nereid_error(c->mhd, err);
    control_job_t *j = calloc(1, sizeof *j);
    if (!j) return http_queue_error(c->mhd, 500, "out of memory");
    j->unload = true;
    j->dependents = dependents;
    return control_start(c, j);
}

/* ---- Logging and trace settings -------------------------------------------- */

static enum MHD_Result reply_log_settings(http_conn_t *c)
{
    nereid_log_settings_t ls;
    nereid_server_log_settings(c->srv->core, &ls);
    json_t *doc = json_pack("{s:s,s:b,s:b,s:b,s:I,s:s}", "log_file", ls.log_file, "log_info",
                            ls.log_info, "log_warning", ls.log_warning, "log_error", ls.log_error,
                            "log_verbose_level", (json_int_t)ls.log_verbose_level, "log_format",
                            nereid_log_format_name(ls.log_format));
    char *json = doc ? json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(doc);
    if (!json) return http_queue_error(c->mhd, 500, "unable to serialize JSON");
    return http_queue_json_owned(c->mhd, 200, json);
}

/* Reads optional bool key; null/absent = no change (*set stays NULL). */
static nereid_error_t *log_bool(json_t *root, const char *key, bool *slot, const bool **set)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return NULL;
    if (!json_is_boolean(v))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "expect boolean for '%s'", key);
    *slot = json_is_true(v);
    *set = slot;
    return NULL;
}

static enum MHD_Result handle_logging(http_conn_t *c)
{
    if (c->route == ROUTE_LOGGING_GET) return reply_log_settings(c);
    nereid_error_t *err;
    json_t *root = parse_body_json(c, &err);
    if (!err && !json_is_object(root))
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "expect a JSON object with the log settings to update");
    bool info, warning, error;
    const bool *p_info = NULL, *p_warning = NULL, *p_error = NULL;
    uint32_t verbose;
    const uint32_t *p_verbose = NULL;
    const char *format = NULL;
    if (!err) {
        json_t *f = json_object_get(root, "log_file");
        if (f && !json_is_null(f))
            err = nereid_error_new(NEREID_ERROR_UNSUPPORTED,
                                   "log file location can not be updated through network "
                                   "protocol");
    }
    if (!err) err = log_bool(root, "log_info", &info, &p_info);
    if (!err) err = log_bool(root, "log_warning", &warning, &p_warning);
    if (!err) err = log_bool(root, "log_error", &error, &p_error);
    if (!err) {
        json_t *v = json_object_get(root, "log_verbose_level");
        if (v && !json_is_null(v)) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) > INT32_MAX)
                err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                       "expect non-negative integer for 'log_verbose_level'");
            else {
                verbose = (uint32_t)json_integer_value(v);
                p_verbose = &verbose;
            }
        }
    }
    if (!err) {
        json_t *v = json_object_get(root, "log_format");
        if (v && !json_is_null(v)) {
            if (!json_is_string(v))
                err = nereid_error_new(NEREID_ERROR_INVALID_ARG, "expect string for 'log_format'");
            else
                format = json_string_value(v);
        }
    }
    if (!err)
        err = nereid_server_update_log_settings(c->srv->core, p_info, p_warning, p_error, p_verbose,
                                                format);
    if (root) json_decref(root);
    if (err) return http_queue_nereid_error(c->mhd, err);
    return reply_log_settings(c);
}

static enum MHD_Result handle_trace(http_conn_t *c)
{
    char *json = NULL;
    if (c->route == ROUTE_TRACE_GET || c->route == ROUTE_MODEL_TRACE_GET) {
        nereid_error_t *err = nereid_server_trace_settings(c->srv->core, c->model, &json);
        return reply_json_or_error(c->mhd, err, json);
    }
    /* Triton reads each known key with TritonJson: trace_level must be an
     * array of strings, the others strings; null clears; an empty body
     * changes nothing. */
    static const char *const keys[] = {"trace_file", "trace_level", "trace_rate", "trace_count",
                                       "log_frequency"};
    enum { N_KEYS = sizeof keys / sizeof keys[0] };
    static const char *const no_values[1] = {NULL};
    nereid_error_t *err;
    json_t *root = parse_body_json(c, &err);
    if (!err && root && !json_is_object(root))
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "expect a JSON object with the trace settings to update");
    nereid_trace_setting_t settings[N_KEYS];
    const char **vals[N_KEYS] = {NULL};
    size_t n = 0;
    for (size_t k = 0; !err && root && k < N_KEYS; k++) {
        json_t *v = json_object_get(root, keys[k]);
        if (!v) continue;
        nereid_trace_setting_t *t = &settings[n++];
        *t = (nereid_trace_setting_t){.key = keys[k]};
        if (json_is_null(v)) continue;
        bool level = k == 1;
        if (level && !json_is_array(v)) {
            t->type_error = "attempt to access JSON non-array as array";
            continue;
        }
        size_t nv = level ? json_array_size(v) : 1;
        vals[k] = calloc(nv ? nv : 1, sizeof *vals[k]);
        if (!vals[k]) {
            err = nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
            break;
        }
        for (size_t i = 0; i < nv; i++) {
            json_t *e = level ? json_array_get(v, i) : v;
            if (!json_is_string(e)) {
                t->type_error = "attempt to access JSON non-string as string";
                break;
            }
            vals[k][i] = json_string_value(e);
        }
        t->values = nv ? vals[k] : no_values;
        t->n_values = nv;
    }
    if (!err)
        err =
            nereid_server_update_trace_settings(c->srv->core, c->model, settings, n, false, &json);
    for (size_t k = 0; k < N_KEYS; k++)
        free(vals[k]);
    if (root) json_decref(root);
    return reply_json_or_error(c->mhd, err, json);
}

static enum MHD_Result handle_named_repository(http_conn_t *c)
{
    return http_queue_error(c->mhd, 501, "'repository_name' specification is not supported");
}

/* Triton's register body: {"key", "offset" (optional), "byte_size"}. */
static nereid_error_t *shm_register(http_conn_t *c)
{
    nereid_error_t *err;
    json_t *root = parse_body_json(c, &err);
    if (err) return err;
    json_t *key = json_is_object(root) ? json_object_get(root, "key") : NULL;
    json_t *offset = key ? json_object_get(root, "offset") : NULL;
    json_t *size = key ? json_object_get(root, "byte_size") : NULL;
    if (!key)
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "Shared memory register request has no 'key' field");
    else if (!json_is_string(key))
        err =
            nereid_error_new(NEREID_ERROR_INTERNAL, "attempt to access JSON non-string as string");
    else if ((offset && (!json_is_integer(offset) || json_integer_value(offset) < 0)) ||
             (size && (!json_is_integer(size) || json_integer_value(size) < 0)))
        err = nereid_error_new(NEREID_ERROR_INTERNAL,
                               "attempt to access JSON non-unsigned-integer as unsigned-integer");
    else if (!size)
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "Shared memory register request has no 'byte_size' field");
    else
        err = nereid_shm_register(c->srv->shm, c->name, json_string_value(key),
                                  offset ? (uint64_t)json_integer_value(offset) : 0,
                                  (uint64_t)json_integer_value(size));
    if (root) json_decref(root);
    return err;
}

/* Triton built without GPU support: CUDA regions can never be registered. */
static nereid_error_t *cuda_shm(http_conn_t *c, char **json)
{
    nereid_shm_registry_t *reg = c->srv->shm;
    if (c->route == ROUTE_CUDA_SHM_STATUS) {
        *json = strdup("[]");
        return *json ? NULL : nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    }
    if (c->route == ROUTE_CUDA_SHM_REGION_STATUS) {
        char *sys = NULL;
        nereid_error_t *err = nereid_shm_status(reg, c->name, &sys);
        free(sys);
        if (err) {
            nereid_error_free(err);
            return nereid_error_new(NEREID_ERROR_NOT_FOUND,
                                    "Unable to find cuda shared memory region: '%s'", c->name);
        }
        return nereid_error_new(NEREID_ERROR_NOT_FOUND,
                                "The region named '%s' is registered as system shared memory, "
                                "not CUDA shared memory",
                                c->name);
    }
    if (!nereid_shm_allowed(reg))
        return nereid_error_new(NEREID_ERROR_UNSUPPORTED, NEREID_SHM_DISABLED_TEXT);
    if (c->route == ROUTE_CUDA_SHM_REGISTER)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "failed to register CUDA shared memory region: '%s', GPUs not "
                                "supported",
                                c->name);
    return NULL; /* unregister: no CUDA region is ever registered */
}

/* The system (and CUDA) shared memory extension, as Triton's
 * HandleSystemSharedMemory / HandleCudaSharedMemory. */
static enum MHD_Result handle_shm(http_conn_t *c)
{
    char *json = NULL;
    nereid_error_t *err = NULL;
    switch (c->route) {
    case ROUTE_SYS_SHM_STATUS:
    case ROUTE_SYS_SHM_REGION_STATUS:
        err = nereid_shm_status(c->srv->shm, c->name, &json);
        break;
    case ROUTE_SYS_SHM_REGISTER:
        err = nereid_shm_allowed(c->srv->shm)
                  ? shm_register(c)
                  : nereid_error_new(NEREID_ERROR_UNSUPPORTED, NEREID_SHM_DISABLED_TEXT);
        break;
    case ROUTE_SYS_SHM_UNREGISTER:
    case ROUTE_SYS_SHM_REGION_UNREGISTER:
        err = nereid_shm_unregister(c->srv->shm, c->name);
        break;
    default:
        err = cuda_shm(c, &json);
    }
    if (err || json) return reply_json_or_error(c->mhd, err, json);
    return http_queue_text(c->mhd, 200, "application/json", NULL, 0);
}

/* ---- Inference ------------------------------------------------------------ */

static void out_bufs_free(out_buf_t *b)
{
    while (b) {
        out_buf_t *next = b->next;
        free(b);
        b = next;
    }
}

static nereid_error_t *alloc_output(void *userp, const char *name, nereid_datatype_t dt,
                                    const int64_t *shape, size_t rank, size_t byte_size,
                                    void **buffer, void **buffer_userp)
{
    (void)shape, (void)rank;
    http_conn_t *c = userp;
    nereid_error_t *err;
    if (c->shm && nereid_shm_use_alloc(c->shm, name, dt, byte_size, buffer, &err)) {
        *buffer_userp = NULL;
        return err;
    }
    out_buf_t *b = malloc(sizeof *b + (byte_size ? byte_size : 1));
    if (!b) {
        *buffer = NULL;
        return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory for output '%s'", name);
    }
    b->byte_size = byte_size;
    b->next = atomic_load(&c->outs);
    while (!atomic_compare_exchange_weak(&c->outs, &b->next, b))
        ;
    *buffer = b + 1;
    *buffer_userp = b;
    return NULL;
}

/* Buffers are released with the reply (or the connection), not here: the
 * reply outlives the nereid_response. */
static void release_output(void *userp, void *buffer, void *buffer_userp, size_t byte_size)
{
    (void)userp, (void)buffer, (void)buffer_userp, (void)byte_size;
}

/* Suspends c from its handler, counted for http_server_stop. */
static void conn_suspend(http_conn_t *c)
{
    pthread_mutex_lock(&c->srv->lock);
    c->srv->n_suspended++;
    pthread_mutex_unlock(&c->srv->lock);
    c->suspended = true;
    if (c->cancel && !c->watch_id) {
        /* MHD does not poll a suspended connection: the watcher cancels the
         * inference when the client closes it meanwhile. */
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c->mhd, MHD_CONNECTION_INFO_CONNECTION_FD);
        c->watch_id = close_watch_add(c->srv->close_watch, ci ? ci->connect_fd : -1, c->cancel);
    }
    MHD_suspend_connection(c->mhd);
}

/* The handler (or completion notice) of a connection we suspended runs. */
static void conn_resumed(http_conn_t *c)
{
    if (!c->suspended) return;
    c->suspended = false;
    close_watch_remove(c->srv->close_watch, c->watch_id);
    c->watch_id = 0;
    pthread_mutex_lock(&c->srv->lock);
    if (--c->srv->n_suspended == 0) pthread_cond_broadcast(&c->srv->idle);
    pthread_mutex_unlock(&c->srv->lock);
}

static void infer_done(nereid_response_t *response, void *userp)
{
    http_conn_t *c = userp;
    http_server_t *srv = c->srv;
    struct MHD_Connection *mc = c->mhd;
    if (c->trace)
        nereid_trace_timestamp(c->trace, "INFER_RESPONSE_COMPLETE", nereid_trace_now_ns());
    nereid_shm_use_finish(c->shm); /* the reply does not read shared memory */
    atomic_store(&c->response, response);
    int phase = PHASE_RUNNING;
    /* Still running in the handler: it sees DONE and replies itself. */
    if (!atomic_compare_exchange_strong(&c->phase, &phase, PHASE_DONE)) {
        atomic_store(&c->phase, PHASE_DONE);
        MHD_resume_connection(mc);
    }
    pthread_mutex_lock(&srv->lock);
    if (--srv->n_inflight == 0) pthread_cond_broadcast(&srv->idle);
    pthread_mutex_unlock(&srv->lock);
}

static void reply_hold_free(void *cls)
{
    reply_hold_t *h = cls;
    infer_reply_free(&h->reply);
    if (h->response) nereid_response_free(h->response);
    out_bufs_free(h->outs);
    free(h);
}

/* Reads max_batch_size and the first input of the model config for a raw
 * request. */
static nereid_error_t *raw_model_info(http_conn_t *c, infer_raw_model_t *info, int64_t *dims,
                                      size_t max_dims)
{
    char *json = NULL;
    nereid_error_t *err = nereid_server_model_config(c->srv->core, c->model, c->version, &json);
    if (err) return err;
    json_t *root = json_loads(json, 0, NULL);
    free(json);
    json_t *inputs = root ? json_object_get(root, "input") : NULL;
    memset(info, 0, sizeof *info);
    info->model = c->model;
    info->n_inputs = json_array_size(inputs);
    json_t *mbs = root ? json_object_get(root, "max_batch_size") : NULL;
    info->batching = mbs && json_number_value(mbs) > 0;
    json_t *in = json_array_get(inputs, 0);
    if (in) {
        json_t *name = json_object_get(in, "name");
        free(c->raw_input_name);
        c->raw_input_name = strdup(json_is_string(name) ? json_string_value(name) : "");
        info->input_name = c->raw_input_name ? c->raw_input_name : "";
        json_t *dt = json_object_get(in, "data_type");
        info->datatype =
            nereid_datatype_from_config_name(json_is_string(dt) ? json_string_value(dt) : "");
        json_t *jd = json_object_get(in, "dims");
        for (size_t i = 0; i < json_array_size(jd) && i < max_dims; i++) {
            json_t *d = json_array_get(jd, i);
            dims[i] = json_is_string(d) ? strtoll(json_string_value(d), NULL, 10)
                                        : (int64_t)json_number_value(d);
            info->n_dims++;
        }
        info->dims = dims;
    }
    if (root) json_decref(root);
    return NULL;
}

/* Suspends c until the completion of its inference; returns true instead
 * when the completion already ran (the caller replies now, no suspend).
 * Suspend first, then publish SUSPENDED; if the completion came in between
 * it did not resume, so resume here (MHD allows it from the handler). */
static bool infer_wait(http_conn_t *c)
{
    if (atomic_load(&c->phase) == PHASE_DONE) return true;
    conn_suspend(c);
    int phase = PHASE_RUNNING;
    if (!atomic_compare_exchange_strong(&c->phase, &phase, PHASE_SUSPENDED))
        MHD_resume_connection(c->mhd);
    return false;
}

/* Nereid extension: the sequence id and flags from the request headers
 * (docs/deploy.md); the id is echoed in the reply. */
static const char *const seq_header_names[3] = {"Nereid-Sequence-Id", "Nereid-Sequence-Start",
                                                "Nereid-Sequence-End"};

static nereid_error_t *seq_headers(http_conn_t *c, nereid_request_t *req)
{
    const char *v[3];
    for (int i = 0; i < 3; i++)
        v[i] = MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND, seq_header_names[i]);
    return nereid_request_sequence_headers(req, seq_header_names, v[0], v[1], v[2], c->seq_echo,
                                           sizeof c->seq_echo);
}

/* The connection's slot (on_connection), or NULL. */
static conn_slot_t *conn_slot(struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Whether the inference on c belongs to a sequence that goes on after it
 * (an id in its body or Nereid's headers, and no end flag). */
static bool continues_sequence(http_conn_t *c)
{
    const infer_parsed_t *p = &c->parsed;
    const char *id = MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND, seq_header_names[0]);
    const char *end = MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND, seq_header_names[2]);
    bool has_id = (p->has_sequence_id && (p->sequence_id != 0 || p->sequence_id_string)) ||
                  (id && *id && strcmp(id, "0") != 0);
    bool ends = p->sequence_end || (end && (!strcasecmp(end, "true") || !strcmp(end, "1")));
    return has_id && !ends;
}

/* Parses and submits the request; on success the connection is suspended,
 * or *done tells that the response is already there. */
typedef struct forward_ctx {
    const header_forward_t *hf;
    nereid_request_t *req;
    nereid_error_t *err;
} forward_ctx_t;

static enum MHD_Result forward_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value)
{
    (void)kind;
    forward_ctx_t *f = cls;
    size_t n = strlen(key);
    if (!header_forward_match(f->hf, key, n)) return MHD_YES;
    f->err = header_forward_apply(f->req, key, n, value ? value : "", value ? strlen(value) : 0);
    return f->err ? MHD_NO : MHD_YES;
}

/* --http-header-forward-pattern: matching headers become string parameters
 * (after the body's, as in Triton). */
static nereid_error_t *forward_headers(http_conn_t *c, nereid_request_t *req)
{
    forward_ctx_t f = {c->srv->header_forward, req, NULL};
    MHD_get_connection_values(c->mhd, MHD_HEADER_KIND, forward_header, &f);
    return f.err;
}

static nereid_error_t *infer_submit(http_conn_t *c, bool *done)
{
    http_server_t *srv = c->srv;
    const char *body = c->body.data ? c->body.data + c->body_pad : "";
    size_t len = c->body.data ? c->body.len - c->body_pad : 0;
    nereid_error_t *err;
    if (c->encoding != HTTP_ENCODING_IDENTITY) {
        err = http_decompress(c->encoding, body, len, srv->max_input_size, &c->inflated,
                              &c->inflated_len);
        if (err) return err;
        body = c->inflated;
        len = c->inflated_len;
    }
    if (c->header_len == 0) {
        if (len > srv->max_input_size)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "Raw input has a byte_size (%zu bytes) that exceeds the "
                                    "maximum allowed value of %zu bytes. Use "
                                    "--http-max-input-size to increase the limit.",
                                    len, srv->max_input_size);
        infer_raw_model_t info;
        int64_t dims[64];
        if ((err = raw_model_info(c, &info, dims, 64))) return err;
        err = infer_parse_raw(body, len, &info, &c->parsed);
    } else {
        err = infer_parse(body, len, c->header_len, c->model, srv->max_input_size, &c->parsed);
    }
    if (err) return err;
    if (c->parsed.has_shm && (err = infer_parsed_shm(&c->parsed, srv->shm, &c->shm))) return err;
    nereid_request_t *req;
    if ((err = infer_parsed_to_request(srv->core, c->model, c->version, &c->parsed, &req)))
        return err;
    /* Should a drain begin, the reply closes its connection unless the
     * client may still need it for the rest of a sequence. */
    conn_slot_t *slot = conn_slot(c->mhd);
    if (slot) atomic_store(&slot->ctx.keep_open, continues_sequence(c));
    if ((err = seq_headers(c, req)) || (srv->header_forward && (err = forward_headers(c, req)))) {
        nereid_request_free(req);
        return err;
    }
    if (c->recv_start_ns) {
        c->trace = nereid_server_trace_start(
            srv->core, c->model,
            MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND, "traceparent"),
            MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND, "tracestate"));
        if (c->trace) {
            nereid_trace_timestamp(c->trace, "HTTP_RECV_START", c->recv_start_ns);
            nereid_trace_timestamp(c->trace, "HTTP_RECV_END", c->recv_end_ns);
            nereid_request_set_trace(req, c->trace);
        }
    }

    pthread_mutex_lock(&srv->lock);
    if (srv->stopping) {
        pthread_mutex_unlock(&srv->lock);
        nereid_request_free(req);
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready");
    }
    srv->n_inflight++;
    pthread_mutex_unlock(&srv->lock);

    atomic_store(&c->phase, PHASE_RUNNING);
    if (!c->cancel) c->cancel = nereid_cancel_token_new();
    nereid_request_set_cancel_token(req, c->cancel);
    nereid_response_allocator_t alloc = {
        .alloc_fn = alloc_output, .release_fn = release_output, .userp = c};
    /* The reply holds the response until sent (reply_hold_t): outputs may be
     * views of a backend's memory, unless they go to shared memory. */
    nereid_request_set_output_views(req, c->shm == NULL);
    err = nereid_server_infer_async(srv->core, req, &alloc, infer_done, c);
    if (err) {
        nereid_request_free(req);
        pthread_mutex_lock(&srv->lock);
        if (--srv->n_inflight == 0) pthread_cond_broadcast(&srv->idle);
        pthread_mutex_unlock(&srv->lock);
        return err;
    }
    *done = infer_wait(c);
    return NULL;
}

/* Triton's verbose "[request id: <id>] Infer failed: <message>" record. */
static void log_infer_failed(http_conn_t *c, const char *message)
{
    const char *id = c->parsed.id && *c->parsed.id ? c->parsed.id : "<id_unknown>";
    char *msg = NULL;
    if (asprintf(&msg, "[request id: %s] Infer failed: %s", id, message) < 0) return;
    nereid_log_message(NEREID_LOG_VERBOSE, __FILE__, __LINE__, msg);
    free(msg);
}

static enum MHD_Result infer_reply(http_conn_t *c)
{
    nereid_response_t *resp = atomic_exchange(&c->response, NULL);
    if (!resp) return MHD_YES;
    if (c->trace) nereid_trace_timestamp(c->trace, "HTTP_SEND_START", nereid_trace_now_ns());
    const nereid_error_t *rerr = nereid_response_error(resp);
    if (rerr) {
        log_infer_failed(c, nereid_error_message(rerr));
        enum MHD_Result ret = http_queue_error(
            c->mhd, http_status_from_code(nereid_error_code(rerr)), nereid_error_message(rerr));
        nereid_response_free(resp);
        return ret;
    }
    reply_hold_t *h = calloc(1, sizeof *h);
    if (!h) {
        nereid_response_free(resp);
        return http_queue_error(c->mhd, 500, "out of memory");
    }
    h->response = resp;
    h->outs = atomic_exchange(&c->outs, NULL);
    nereid_error_t *err = infer_reply_build(resp, &c->parsed, &h->reply);
    if (err) {
        reply_hold_free(h);
        return http_queue_nereid_error(c->mhd, err);
    }

    struct MHD_Response *r = NULL;
    const char *ce = NULL;
    http_encoding_t accept = http_accept_encoding(
        MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT_ENCODING));
    if (accept != HTTP_ENCODING_IDENTITY) {
        char *z;
        size_t zlen;
        if (!http_compress(accept, h->reply.chunks, h->reply.n_chunks, &z, &zlen)) {
            r = MHD_create_response_from_buffer(zlen, z, MHD_RESPMEM_MUST_FREE);
            if (!r) free(z);
            ce = accept == HTTP_ENCODING_GZIP ? "gzip" : "deflate";
        }
    }
    char ihcl[24];
    snprintf(ihcl, sizeof ihcl, "%zu", h->reply.json_len);
    bool binary = h->reply.binary;
    if (r) {
        reply_hold_free(h);
    } else if (h->reply.n_chunks == 1) {
        r = MHD_create_response_from_buffer_with_free_callback_cls(
            h->reply.chunks[0].byte_size, (void *)h->reply.chunks[0].data, reply_hold_free, h);
        if (!r) {
            reply_hold_free(h);
            return MHD_NO;
        }
    } else {
        struct MHD_IoVec iov[h->reply.n_chunks];
        for (size_t i = 0; i < h->reply.n_chunks; i++)
            iov[i] = (struct MHD_IoVec){h->reply.chunks[i].data, h->reply.chunks[i].byte_size};
        r = MHD_create_response_from_iovec(iov, (unsigned)h->reply.n_chunks, reply_hold_free, h);
        if (!r) {
            reply_hold_free(h);
            return MHD_NO;
        }
    }
    if (binary) {
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
        MHD_add_response_header(r, HEADER_IHCL, ihcl);
    } else {
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    }
    if (ce) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_ENCODING, ce);
    if (c->seq_echo[0]) MHD_add_response_header(r, seq_header_names[0], c->seq_echo);
    enum MHD_Result ret = http_queue_response(c->mhd, 200, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result handle_infer(http_conn_t *c)
{
    if (c->submit_error) {
        nereid_error_t *err = c->submit_error;
        c->submit_error = NULL;
        return http_queue_nereid_error(c->mhd, err);
    }
    if (c->submitted) {
        conn_resumed(c);
        if (atomic_load(&c->phase) == PHASE_DONE) return infer_reply(c);
        /* Called again before the completion (not seen with this scheme,
         * kept safe): wait again. The phase stays SUSPENDED. */
        conn_suspend(c);
        if (atomic_load(&c->phase) == PHASE_DONE) MHD_resume_connection(c->mhd);
        return MHD_YES;
    }
    if (c->version < -1) return version_error(c);
    if (c->recv_start_ns) c->recv_end_ns = nereid_trace_now_ns();
    /* Triton checks the transaction policy before it reads the body. */
    bool decoupled = false, done = false;
    nereid_error_t *err =
        nereid_server_model_decoupled(c->srv->core, c->model, c->version, &decoupled);
    if (!err && decoupled)
        err = nereid_error_new(NEREID_ERROR_UNSUPPORTED,
                               "HTTP end point doesn't support models with decoupled transaction "
                               "policy");
    if (!err) err = infer_submit(c, &done);
    if (err) {
        log_infer_failed(c, nereid_error_message(err));
        return http_queue_nereid_error(c->mhd, err);
    }
    c->submitted = true;
    return done ? infer_reply(c) : MHD_YES;
}

/* ---- Generate extension ---------------------------------------------------- */

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

static void gen_unref(gen_call_t *g)
{
    pthread_mutex_lock(&g->mu);
    bool last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (!last) return;
    for (gen_chunk_t *k = g->head, *next; k; k = next) {
        next = k->next;
        free(k);
    }
    generate_buffers_free(&g->bufs);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

/* A response of the generate request (Triton's
 * GenerateRequestClass::InferResponseComplete): its JSON object or error
 * object is queued, the first one sets the HTTP status, and the connection
 * is woken when it waits for it (streaming: any chunk; else the final). */
static void gen_response(nereid_response_t *resp, uint32_t flags, void *userp)
{
    gen_call_t *g = userp;
    bool final = (flags & NEREID_RESPONSE_FINAL) != 0;
    unsigned status = 200;
    sbuf_t b = {0};
    bool oom = false;
    if (resp) {
        const nereid_error_t *rerr = nereid_response_error(resp);
        nereid_error_t *err = NULL;
        if (g->streaming) oom |= sbuf_append_str(&b, "data: ") != 0;
        if (rerr) {
            status = http_status_from_code(nereid_error_code(rerr));
            oom |= generate_error_json(nereid_error_message(rerr), &b) != 0;
        } else if ((err = generate_response_json(resp, &b))) {
            status = http_status_from_code(nereid_error_code(err));
            oom |= generate_error_json(nereid_error_message(err), &b) != 0;
            nereid_error_free(err);
        }
        if (g->streaming) oom |= sbuf_append_str(&b, "\n\n") != 0;
        nereid_response_free(resp);
    }
    gen_chunk_t *k = resp && !oom ? malloc(sizeof *k + b.len) : NULL;
    if (k) {
        k->next = NULL;
        k->len = b.len;
        k->off = 0;
        memcpy(k->data, b.data, b.len);
    }
    free(b.data);
    if (final) generate_buffers_free(&g->bufs); /* inputs are no longer read */
    pthread_mutex_lock(&g->mu);
    if (!g->started) {
        g->started = true;
        g->status = resp && oom ? 500 : status;
    }
    if (k) {
        if (g->tail)
            g->tail->next = k;
        else
            g->head = k;
        g->tail = k;
    }
    if (resp) g->n_chunks++;
    if (final) g->final = true;
    if (g->waiting && (g->streaming || g->final)) {
        g->waiting = false;
        MHD_resume_connection(g->mhd);
    }
    pthread_mutex_unlock(&g->mu);
    if (!final) return;
    pthread_mutex_lock(&g->srv->lock);
    if (--g->srv->n_inflight == 0) pthread_cond_broadcast(&g->srv->idle);
    pthread_mutex_unlock(&g->srv->lock);
    gen_unref(g);
}

/* The streaming body: queued events as they come; while none is queued the
 * connection is suspended until the next (or the final flag). */
static ssize_t gen_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    gen_call_t *g = cls;
    pthread_mutex_lock(&g->mu);
    http_conn_t *c = g->conn;
    if (c && c->suspended) conn_resumed(c);
    gen_chunk_t *k = g->head;
    if (k) {
        size_t n = k->len - k->off < max ? k->len - k->off : max;
        memcpy(buf, k->data + k->off, n);
        k->off += n;
        if (k->off == k->len) {
            g->head = k->next;
            if (!g->head) g->tail = NULL;
            free(k);
        }
        pthread_mutex_unlock(&g->mu);
        return (ssize_t)n;
    }
    if (g->final || !c) {
        pthread_mutex_unlock(&g->mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    conn_suspend(c);
    g->waiting = true;
    pthread_mutex_unlock(&g->mu);
    return 0;
}

static void gen_read_free(void *cls)
{
    gen_unref(cls);
}

/* The reply, once the first response (streaming) or the final flag came. */
static enum MHD_Result gen_reply(http_conn_t *c)
{
    gen_call_t *g = c->gen;
    struct MHD_Response *r;
    pthread_mutex_lock(&g->mu);
    unsigned status = g->status;
    if (g->streaming) {
        g->refs++; /* the MHD response's */
        pthread_mutex_unlock(&g->mu);
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, gen_read, g, gen_read_free);
        if (!r) {
            gen_unref(g);
            return MHD_NO;
        }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                                "text/event-stream; charset=utf-8");
    } else {
        /* Triton's /generate takes exactly one response. */
        const char *one = g->n_chunks == 1 && g->head ? g->head->data : NULL;
        size_t len = one ? g->head->len : 0;
        sbuf_t b = {0};
        if (!one) {
            generate_error_json("generate expects model to produce exactly 1 response, use "
                                "generate stream for model that generates various number of "
                                "responses",
                                &b);
            one = b.data;
            len = b.len;
        }
        r = one ? MHD_create_response_from_buffer(len, (void *)one, MHD_RESPMEM_MUST_COPY) : NULL;
        pthread_mutex_unlock(&g->mu);
        free(b.data);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    }
    enum MHD_Result ret = http_queue_response(c->mhd, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* POST /v2/models/<m>[/versions/<v>]/generate[_stream] (Triton's
 * HandleGenerate): errors before the inference starts are one JSON error
 * reply; then one JSON reply, or one server-sent event per response. */
static enum MHD_Result handle_generate(http_conn_t *c)
{
    http_server_t *srv = c->srv;
    if (c->gen) {
        conn_resumed(c);
        return gen_reply(c);
    }
    if (c->version < -1) return version_error(c);
    const char *ce =
        MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_ENCODING);
    if (ce && (!strcasecmp(ce, "gzip") || !strcasecmp(ce, "deflate")))
        return http_queue_error(c->mhd, 400,
                                "Unsupported content-encoding, only 'identity' is supported.");
    gen_call_t *g = calloc(1, sizeof *g);
    if (!g) return http_queue_error(c->mhd, 500, "out of memory");
    pthread_mutex_init(&g->mu, NULL);
    g->refs = 2; /* the connection's and the inference's */
    g->srv = srv;
    g->mhd = c->mhd;
    g->conn = c;
    g->streaming =
        c->route == ROUTE_MODEL_GENERATE_STREAM || c->route == ROUTE_MODEL_GENERATE_STREAM_V;
    const char *body = c->body.data ? c->body.data + c->body_pad : "";
    size_t len = c->body.data ? c->body.len - c->body_pad : 0;
    nereid_request_t *req;
    nereid_error_t *err = generate_request_build(srv->core, c->model, c->version, body, len,
                                                 srv->max_input_size, &req, &g->bufs);
    if (!err && srv->header_forward && (err = forward_headers(c, req))) nereid_request_free(req);
    if (!err) {
        pthread_mutex_lock(&srv->lock);
        if (srv->stopping) {
            err = nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready");
            nereid_request_free(req);
        } else {
            srv->n_inflight++;
        }
        pthread_mutex_unlock(&srv->lock);
    }
    if (!err) {
        if (!c->cancel) c->cancel = nereid_cancel_token_new();
        nereid_request_set_cancel_token(req, c->cancel);
        c->gen = g;
        err = nereid_server_infer_stream(srv->core, req, NULL, gen_response, g);
        if (err) {
            nereid_request_free(req);
            c->gen = NULL;
            pthread_mutex_lock(&srv->lock);
            if (--srv->n_inflight == 0) pthread_cond_broadcast(&srv->idle);
            pthread_mutex_unlock(&srv->lock);
        }
    }
    if (err) {
        g->refs = 1;
        gen_unref(g);
        return http_queue_nereid_error(c->mhd, err);
    }
    pthread_mutex_lock(&g->mu);
    bool ready = g->streaming ? g->started : g->final;
    if (!ready) {
        conn_suspend(c);
        g->waiting = true;
    }
    pthread_mutex_unlock(&g->mu);
    return ready ? gen_reply(c) : MHD_YES;
}

/* Reads the framing headers of an infer request and checks the declared
 * sizes before any body byte is read. */
static void infer_headers(http_conn_t *c)
{
    size_t max = c->srv->max_input_size;
    const char *ce =
        MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_ENCODING);
    c->encoding = http_encoding_parse(ce);
    if (c->encoding == HTTP_ENCODING_UNSUPPORTED) {
        c->unsupported_encoding = true;
        c->error = nereid_error_new(NEREID_ERROR_UNSUPPORTED, "Unsupported compression type");
        return;
    }
    c->header_len = INFER_HEADER_LENGTH_NONE;
    const char *ih = MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND, HEADER_IHCL);
    if (ih) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(ih, &end, 10);
        if (errno || end == ih || *end || ih[0] == '-') {
            c->error = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                        "Unable to parse Inference-Header-Content-Length '%s': "
                                        "expected a non-negative integer",
                                        ih);
            return;
        }
        c->header_len = (size_t)v;
        c->body_pad = (16 - c->header_len % 16) % 16;
        if (c->header_len > max) {
            c->error = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                        "request JSON size of %zu bytes exceeds the maximum "
                                        "allowed input size of %zu bytes. Use "
                                        "--http-max-input-size to increase the limit.",
                                        c->header_len, max);
            return;
        }
    }
    /* With Transfer-Encoding: chunked the Content-Length means nothing. */
    const char *cl = c->chunked ? NULL
                                : MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND,
                                                              MHD_HTTP_HEADER_CONTENT_LENGTH);
    unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0;
    c->content_length = declared <= max ? (size_t)declared : 0;
    if (cl && c->header_len != INFER_HEADER_LENGTH_NONE && c->header_len > declared &&
        c->encoding == HTTP_ENCODING_IDENTITY) {
        c->error = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "Inference-Header-Content-Length (%zu) exceeds the request "
                                    "Content-Length (%llu)",
                                    c->header_len, declared);
        return;
    }
    if (cl && declared > max)
        c->error = nereid_error_new(
            NEREID_ERROR_INVALID_ARG,
            c->header_len == 0 ? "Raw input has a byte_size (%llu bytes) that exceeds the maximum "
                                 "allowed value of %zu bytes. Use --http-max-input-size to "
                                 "increase the limit."
                               : "request JSON size of %llu bytes exceeds the maximum allowed "
                                 "input size of %zu bytes. Use --http-max-input-size to "
                                 "increase the limit.",
            declared, max);
}

/* ---- Connection limit ------------------------------------------------------ */

static void idle_unlink(conn_slot_t *s)
{
    if (!s->next) return;
    s->prev->next = s->next;
    s->next->prev = s->prev;
    s->prev = s->next = NULL;
}

static void idle_append(http_server_t *srv, conn_slot_t *s)
{
    s->prev = srv->idle_conns.prev;
    s->next = &srv->idle_conns;
    s->prev->next = s;
    srv->idle_conns.prev = s;
}

/* A request starts on the connection (busy) or has ended (idle again). */
static void conn_set_idle(http_server_t *srv, struct MHD_Connection *mc, bool idle)
{
    conn_slot_t *s = conn_slot(mc);
    if (!s) return;
    pthread_mutex_lock(&srv->conns_lock);
    if (!idle) atomic_store(&s->ctx.keep_open, false); /* a new request: decided by its kind */
    atomic_store(&s->receiving, !idle);
    idle_unlink(s);
    if (idle && !s->shut) {
        idle_append(srv, s);
    }
    pthread_mutex_unlock(&srv->conns_lock);
}

/* Counts connections. At the limit a new one shuts down the longest-idle
 * connection, or itself when none is idle: MHD then reads end-of-stream and
 * closes the socket on its own thread. An fd is shut only under conns_lock
 * and MHD closes it only after the CLOSED notice, which takes the lock, so a
 * shut never reaches a reused fd. */
static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    http_server_t *srv = cls;
    conn_slot_t *s = *socket_context;
    if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        if (!s) return;
        *socket_context = NULL;
        pthread_mutex_lock(&srv->conns_lock);
        idle_unlink(s);
        s->all_prev->all_next = s->all_next;
        s->all_next->all_prev = s->all_prev;
        if (!s->shut) srv->n_open--;
        pthread_mutex_unlock(&srv->conns_lock);
        free(s);
        return;
    }
    if (srv->tls_mutual) {
        /* MHD only requests a client certificate and never checks it: make
         * the handshake require one and verify it against the trust list. */
        const union MHD_ConnectionInfo *ti =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_GNUTLS_SESSION);
        if (ti && ti->tls_session) {
            gnutls_session_t session = (gnutls_session_t)ti->tls_session;
            gnutls_certificate_server_set_request(session, GNUTLS_CERT_REQUIRE);
            gnutls_session_set_verify_cert(session, NULL, 0);
        }
    }
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? ci->connect_fd : -1;
    s = calloc(1, sizeof *s);
    if (s) s->ctx.draining = &srv->draining;
    *socket_context = s;
    pthread_mutex_lock(&srv->conns_lock);
    if (s) {
        s->all_prev = srv->all_conns.all_prev;
        s->all_next = &srv->all_conns;
        s->all_prev->all_next = s;
        srv->all_conns.all_prev = s;
    }
    if (s && srv->n_open >= srv->max_connections) {
        conn_slot_t *old = srv->idle_conns.next;
        if (old != &srv->idle_conns) {
            idle_unlink(old);
            old->shut = true;
            shutdown(old->fd, SHUT_RDWR);
            srv->n_open--;
        }
    }
    if (!s || srv->n_open >= srv->max_connections) {
        if (s) s->shut = true;
        if (fd >= 0) shutdown(fd, SHUT_RDWR);
    } else {
        s->fd = fd;
        srv->n_open++;
        idle_append(srv, s);
    }
    pthread_mutex_unlock(&srv->conns_lock);
}

/* Descriptors kept free for everything but HTTP connections (models, gRPC,
 * metrics, logs). */
#define FD_RESERVE 256

/* Makes room for max connections (MHD's own cap is twice ours: a connection
 * we shut stays open until its thread closes it, and MHD splits its cap
 * between the worker threads). Returns MHD's cap and lowers *max if the fd
 * limit cannot be raised enough. */
static unsigned fd_budget(size_t *max)
{
    size_t want = 2 * *max + 64 + FD_RESERVE;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl)) return (unsigned)(2 * *max + 64);
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        struct rlimit up = rl;
        up.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
        if (!setrlimit(RLIMIT_NOFILE, &up)) rl = up;
    }
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= want) return (unsigned)(2 * *max + 64);
    size_t avail = rl.rlim_cur > 2 * FD_RESERVE ? rl.rlim_cur - FD_RESERVE : rl.rlim_cur / 2;
    size_t fit = avail > 64 ? (avail - 64) / 2 : 1;
    if (fit < *max) {
        fprintf(stderr,
                "W nereid: --http-max-connections=%zu lowered to %zu: the open-file limit is "
                "%llu\n",
                *max, fit ? fit : 1, (unsigned long long)rl.rlim_cur);
        *max = fit ? fit : 1;
    }
    return (unsigned)avail;
}

/* ---- Framing checks (RFC 9112) --------------------------------------------- */

typedef struct framing {
    const char *content_length; /* the first Content-Length value */
    bool lengths_differ;
    int n_te;
    const char *te; /* the last Transfer-Encoding value */
} framing_t;

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value)
{
    (void)kind;
    framing_t *f = cls;
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
        if (!f->content_length)
            f->content_length = value;
        else if (strcmp(f->content_length, value))
            f->lengths_differ = true;
    } else if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
        f->n_te++;
        f->te = value;
    }
    return MHD_YES;
}

/* What MHD lets through but RFC 9112 forbids or we cannot read: returns the
 * refusal text and *status, or NULL. MHD would take the first of two
 * Content-Lengths, and read a body of unknown encoding until the peer
 * closes. */
static const char *framing_error(struct MHD_Connection *mc, unsigned *status, char *buf,
                                 size_t size)
{
    framing_t f = {0};
    MHD_get_connection_values(mc, MHD_HEADER_KIND, framing_header, &f);
    *status = 400;
    if (f.lengths_differ) return "request has Content-Length headers with different values";
    if (f.n_te == 0) return NULL;
    if (f.n_te > 1 || strcasecmp(f.te, "chunked")) {
        *status = 501;
        snprintf(buf, size, "Transfer-Encoding '%.200s' is not supported: only 'chunked' is",
                 f.n_te > 1 ? "(several headers)" : f.te);
        return buf;
    }
    /* Both headers: chunked wins (RFC 9112 6.3), as in Triton, whose own QA
     * sends such requests (L0_http test_content_encoding_chunked_manually). */
    return NULL;
}

/* The con_cls on_uri gives a request whose URL decodes to a NUL byte (MHD
 * would hand on_request the URL cut at it). */
static char nul_in_url;

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *mc)
{
    (void)cls, (void)mc;
    return strstr(uri, "%00") ? &nul_in_url : NULL;
}

/* ---- MHD callbacks -------------------------------------------------------- */

/* Triton's text for a JSON body over --http-max-input-size. */
static void json_size_text(char *buf, size_t size, unsigned long long len, size_t max)
{
    snprintf(buf, size,
             "request JSON size of %llu bytes exceeds the maximum allowed input size of %zu "
             "bytes. Use --http-max-input-size to increase the limit.",
             len, max);
}

/* Triton refuses a chunked body of more than 65536 non-empty chunks. MHD
 * hands the body over one chunk at a time, a chunk in several pieces only
 * when it spans reads; such pieces are large (a read fills the buffer), so
 * pieces under CHUNK_PIECE_SMALL bytes are counted as chunks. A body of
 * 64 MiB (the default input limit) cannot reach the cap with large chunks. */
#define MAX_CHUNKS 65536
#define CHUNK_PIECE_SMALL 1024

typedef enum MHD_Result (*route_fn)(http_conn_t *);

static const route_fn route_handlers[N_ROUTES] = {
#define X(id, method, path, fn) fn,
    HTTP_ROUTE_MAP(X)
#undef X
};

/* Drops the body bytes read so far (a backend's memory or our own). */
static void body_drop(http_conn_t *c)
{
    if (c->body_mem)
        nereid_body_free(c->body_mem);
    else
        free(c->body.data);
    c->body_mem = NULL;
    c->body = (sbuf_t){0};
}

/* Memory for an inference body of want bytes (and a NUL after them): the
 * model's backend's when it offers some (the inputs then lie where it reads
 * them: no copy on the way to a Python model's worker), else ours. The
 * backend's only for a body whose size is known and that is used as it
 * arrives (Content-Length, no Content-Encoding); a chunked or compressed
 * one keeps today's buffer, and so does one under BODY_OFFER_MIN (not
 * worth the model lookup). Nonzero: out of memory. */
#define BODY_OFFER_MIN 4096
static int body_reserve(http_conn_t *c, size_t want)
{
    bool infer = c->route == ROUTE_MODEL_INFER || c->route == ROUTE_MODEL_INFER_V;
    if (infer && c->model && c->version >= -1 && want >= BODY_OFFER_MIN && !c->chunked &&
        c->encoding == HTTP_ENCODING_IDENTITY && c->body_pad + c->content_length == want) {
        char *data;
        c->body_mem = nereid_server_body_alloc(c->srv->core, c->model, c->version, want + 1, &data);
        if (c->body_mem) {
            c->body = (sbuf_t){data, 0, want + 1};
            data[0] = '\0';
            return 0;
        }
    }
    return sbuf_reserve(&c->body, want);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)version;
    http_server_t *srv = cls;
    http_conn_t *c = *con_cls;
    bool nul_url = c == (void *)&nul_in_url;
    if (!c || nul_url) {
        conn_set_idle(srv, mc, false);
        *con_cls = c = calloc(1, sizeof *c);
        if (!c) return MHD_NO;
        c->srv = srv;
        c->mhd = mc;
        c->limit = srv->max_input_size;
        /* Refused before the body: the connection closes after the reply. */
        char buf[300];
        unsigned status;
        const char *bad = framing_error(mc, &status, buf, sizeof buf);
        if (!bad && nul_url) status = 400, bad = "invalid URL: it contains a NUL byte (%00)";
        if (bad) {
            c->refused = true;
            return http_queue_error_close(mc, status, bad);
        }
        c->chunked = MHD_lookup_connection_value(mc, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_TRANSFER_ENCODING) != NULL;
        route_resolve(c, url, method);
        if (srv->restricted && route_forbidden(c)) {
            c->forbidden = true; /* the body is read and dropped; 403 at the end */
        } else if (c->route == ROUTE_MODEL_INFER || c->route == ROUTE_MODEL_INFER_V) {
            if (nereid_server_tracing(srv->core)) c->recv_start_ns = nereid_trace_now_ns();
            infer_headers(c);
            /* A declared body over the limit is refused now, unread: MHD then
             * closes the connection after the reply. */
            if (c->error && !c->unsupported_encoding) {
                nereid_error_t *err = c->error;
                c->error = NULL;
                c->refused = true;
                return http_queue_nereid_error(mc, err);
            }
        } else if (c->route >= 0) {
            /* Other bodies are JSON documents: Triton's EVBufferToJson check,
             * made on the declared size before reading. */
            const char *cl = c->chunked ? NULL
                                        : MHD_lookup_connection_value(
                                              mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
            unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0;
            if (declared > srv->max_input_size) {
                char msg[200];
                json_size_text(msg, sizeof msg, declared, srv->max_input_size);
                c->refused = true;
                return http_queue_error_close(mc, 400, msg);
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (c->route < 0 || c->error || c->refused || c->forbidden) return MHD_YES; /* discard */
        if (c->chunked && n < CHUNK_PIECE_SMALL && ++c->n_pieces > MAX_CHUNKS) {
            /* Read (and drop) the rest: MHD 0.9.75 cannot reply mid-body. */
            body_drop(c);
            c->close = true;
            c->error = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                        "Chunked request body exceeds maximum of %d non-empty "
                                        "chunks. Send fewer or larger HTTP chunks.",
                                        MAX_CHUNKS);
            return MHD_YES;
        }
        size_t used = c->body.data ? c->body.len - c->body_pad : 0;
        if (used + n > c->limit) {
            size_t max = srv->max_input_size;
            char msg[200];
            json_size_text(msg, sizeof msg, used + n, max);
            c->error = c->route == ROUTE_MODEL_INFER || c->route == ROUTE_MODEL_INFER_V
                           ? nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                              "request size exceeds the maximum allowed input "
                                              "size of %zu bytes. Use --http-max-input-size to "
                                              "increase the limit.",
                                              max)
                           : nereid_error_new(NEREID_ERROR_INVALID_ARG, "%s", msg);
            body_drop(c);
            c->body_pad = 0;
            return MHD_YES;
        }
        if (!c->body.data &&
            (body_reserve(c, c->body_pad + (c->content_length > n ? c->content_length : n)) ||
             (c->body.len = c->body_pad, false))) {
            c->error = nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
            return MHD_YES;
        }
        if (c->body_mem && c->body.len + n + 1 > c->body.cap) {
            /* More than Content-Length said (MHD does not let it happen):
             * a backend's memory never grows. */
            body_drop(c);
            c->error = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                        "request body exceeds its Content-Length");
            return MHD_YES;
        }
        if (sbuf_append(&c->body, upload_data, n)) {
            c->error = nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
            return MHD_YES;
        }
        return MHD_YES;
    }
    if (!c->received) { /* the whole request is there */
        c->received = true;
        conn_slot_t *slot = conn_slot(mc);
        if (slot) atomic_store(&slot->receiving, false);
    }
    if (c->refused) return MHD_YES;
    if (c->forbidden) return reply_forbidden(c);
    if (c->route == ROUTE_NOT_FOUND) return http_queue_error(mc, 404, "Not Found");
    if (c->route == ROUTE_BAD_METHOD) return http_queue_error(mc, 405, "Method Not Allowed");
    if (c->error) {
        nereid_error_t *err = c->error;
        c->error = NULL;
        if (c->unsupported_encoding) {
            struct MHD_Response *r;
            const char *body = "{\"error\":\"Unsupported compression type\"}";
            nereid_error_free(err);
            r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_PERSISTENT);
            MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
            MHD_add_response_header(r, MHD_HTTP_HEADER_ACCEPT_ENCODING, "gzip, deflate");
            enum MHD_Result ret = http_queue_response(mc, 501, r);
            MHD_destroy_response(r);
            return ret;
        }
        if (c->close) {
            enum MHD_Result ret = http_queue_error_close(mc, 400, nereid_error_message(err));
            nereid_error_free(err);
            return ret;
        }
        return http_queue_nereid_error(mc, err);
    }
    return route_handlers[c->route](c);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)toe;
    conn_set_idle(cls, mc, true);
    http_conn_t *c = *con_cls;
    if (!c || c == (void *)&nul_in_url) return;
    *con_cls = NULL;
    conn_resumed(c);
    if (c->gen) {
        /* A client gone mid-stream: Triton cancels the request. */
        nereid_request_cancel(c->cancel);
        pthread_mutex_lock(&c->gen->mu);
        c->gen->conn = NULL;
        pthread_mutex_unlock(&c->gen->mu);
        gen_unref(c->gen);
    }
    nereid_cancel_token_free(c->cancel);
    control_job_free(c->job);
    if (c->trace) {
        nereid_trace_timestamp(c->trace, "HTTP_SEND_END", nereid_trace_now_ns());
        nereid_trace_release(c->trace);
    }
    nereid_response_t *resp = atomic_load(&c->response);
    if (resp) nereid_response_free(resp);
    out_bufs_free(atomic_load(&c->outs));
    if (c->error) nereid_error_free(c->error);
    if (c->submit_error) nereid_error_free(c->submit_error);
    infer_parsed_free(&c->parsed);
    nereid_shm_use_free(c->shm);
    free(c->inflated);
    free(c->raw_input_name);
    body_drop(c);
    if (c->path != c->path_buf) free(c->path);
    free(c);
    mem_trim_note(((http_server_t *)cls)->mem_trim);
}

/* ---- Lifecycle ------------------------------------------------------------ */

void http_options_init(http_options_t *opts)
{
    memset(opts, 0, sizeof *opts); /* every later field off */
    opts->address = "0.0.0.0";
    opts->port = 8000;
    opts->thread_count = 8;
    opts->max_input_size = 67108864;
    opts->max_connections = 4096;
    opts->idle_timeout_secs = 60;
    opts->shm = NULL;
}

nereid_error_t *http_server_start(nereid_server_t *core, const http_options_t *opts,
                                  http_server_t **out)
{
    *out = NULL;
    struct sockaddr_storage ss;
    bool ipv6 = false;
    if (http_resolve(opts->address, opts->port, &ss, &ipv6))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "invalid HTTP address '%s'",
                                opts->address);
    http_server_t *srv = calloc(1, sizeof *srv);
    if (!srv) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    if (opts->tls.use_ssl) {
        nereid_error_t *err = tls_pem_read(&opts->tls, "--http", &srv->pem);
        if (err) {
            free(srv);
            return err;
        }
        srv->tls_mutual = opts->tls.mutual;
    }
    if (opts->header_forward_pattern) {
        char *why = NULL;
        srv->header_forward = header_forward_new(opts->header_forward_pattern, &why);
        if (!srv->header_forward) {
            nereid_error_t *err = nereid_error_new(
                NEREID_ERROR_INVALID_ARG, "invalid --http-header-forward-pattern '%s': %s",
                opts->header_forward_pattern, why ? why : "out of memory");
            free(why);
            tls_pem_free(&srv->pem);
            free(srv);
            return err;
        }
    }
    srv->core = core;
    srv->restricted = opts->restricted;
    srv->max_input_size = opts->max_input_size;
    srv->shm = opts->shm;
    pthread_mutex_init(&srv->lock, NULL);
    pthread_cond_init(&srv->idle, NULL);
    pthread_mutex_init(&srv->conns_lock, NULL);
    srv->idle_conns.prev = srv->idle_conns.next = &srv->idle_conns;
    srv->all_conns.all_prev = srv->all_conns.all_next = &srv->all_conns;
    srv->max_connections = opts->max_connections > 0 ? (size_t)opts->max_connections : 1;
    unsigned mhd_limit = fd_budget(&srv->max_connections);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned threads = opts->thread_count > 0 ? (unsigned)opts->thread_count : 1;
    if (ncpu > 0 && threads > (unsigned)ncpu) threads = (unsigned)ncpu;
    /* A large tensor's body, JSON reply and tensors are MBs each: served by
     * fresh mmaps (glibc's default above 128 KiB) or trimmed from the heap
     * after each request, every page of them faults in again on the next
     * (~750 faults per 65,536-element JSON request). Kept in the heap: an
     * arena's free top is trimmed only past 16 MiB (a few such requests),
     * and the rest goes back to the system once requests stop for a while
     * (malloc_trim, mem_trim.h), so a burst does not leave the process at
     * its peak size. (malloc_trim releases free pages inside every arena but
     * the top of the main one only: the threshold bounds the other tops.) */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 16 << 20);
    srv->mem_trim = mem_trim_acquire(HTTP_TRIM_QUIET_NS);
    /* MHD_USE_ITC: MHD_quiesce_daemon (http_server_drain) needs it with a
     * thread pool. */
    unsigned flags =
        MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    if (ipv6) flags |= MHD_USE_IPv6;
    srv->close_watch = close_watch_start();
    if (opts->tls.use_ssl) flags |= MHD_USE_TLS;
    /* The TLS options come first; MHD_OPTION_END right after them when off. */
    struct MHD_OptionItem tls_opts[] = {
        {MHD_OPTION_HTTPS_MEM_CERT, 0, srv->pem.cert},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, srv->pem.key},
        {srv->tls_mutual ? MHD_OPTION_HTTPS_MEM_TRUST : MHD_OPTION_END, 0, srv->pem.root},
        {MHD_OPTION_END, 0, NULL},
    };
    struct MHD_OptionItem reuse_opts[] = {
        {opts->reuse_port ? MHD_OPTION_LISTENING_ADDRESS_REUSE : MHD_OPTION_END, 1, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    srv->daemon = MHD_start_daemon(
        flags, (uint16_t)opts->port, NULL, NULL, on_request, srv, MHD_OPTION_ARRAY,
        opts->tls.use_ssl ? tls_opts : tls_opts + 3, MHD_OPTION_ARRAY, reuse_opts,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_NOTIFY_COMPLETED, on_completed,
        srv, MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv, MHD_OPTION_URI_LOG_CALLBACK, on_uri,
        srv, MHD_OPTION_CONNECTION_LIMIT, mhd_limit, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)(opts->idle_timeout_secs > 0 ? opts->idle_timeout_secs : 0),
        MHD_OPTION_THREAD_POOL_SIZE, threads, MHD_OPTION_END);
    if (!srv->daemon) {
        close_watch_stop(srv->close_watch);
        mem_trim_release(srv->mem_trim);
        pthread_mutex_destroy(&srv->conns_lock);
        pthread_mutex_destroy(&srv->lock);
        pthread_cond_destroy(&srv->idle);
        tls_pem_free(&srv->pem);
        header_forward_free(srv->header_forward);
        free(srv);
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE, "failed to start HTTP service at %s:%d",
                                opts->address, opts->port);
    }
    /* Helpers for large JSON tensors (par.h); without them callers convert
     * alone. */
    par_start(-1);
    *out = srv;
    return NULL;
}

int http_server_port(const http_server_t *srv)
{
    return http_daemon_port(srv->daemon);
}

void http_server_drain(http_server_t *srv)
{
    if (!srv || atomic_exchange(&srv->draining, true)) return;
    MHD_socket fd = MHD_quiesce_daemon(srv->daemon);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

size_t http_server_close_idle(http_server_t *srv)
{
    size_t n = 0;
    if (!srv) return 0;
    pthread_mutex_lock(&srv->conns_lock);
    for (conn_slot_t *s = srv->all_conns.all_next; s != &srv->all_conns; s = s->all_next) {
        bool idle = s->next != NULL && !atomic_load(&s->ctx.keep_open);
        if (s->shut || !(idle || atomic_load(&s->receiving))) continue;
        idle_unlink(s); /* MHD closes it on its thread (see on_connection) */
        s->shut = true;
        shutdown(s->fd, SHUT_RDWR);
        srv->n_open--;
        n++;
    }
    pthread_mutex_unlock(&srv->conns_lock);
    return n;
}

size_t http_server_open_connections(http_server_t *srv, size_t *n_inflight)
{
    if (n_inflight) *n_inflight = 0;
    if (!srv) return 0;
    pthread_mutex_lock(&srv->conns_lock);
    size_t n = srv->n_open;
    pthread_mutex_unlock(&srv->conns_lock);
    if (n_inflight) {
        pthread_mutex_lock(&srv->lock);
        *n_inflight = srv->n_inflight > srv->n_suspended ? srv->n_inflight : srv->n_suspended;
        pthread_mutex_unlock(&srv->lock);
    }
    return n;
}

void http_server_stop(http_server_t *srv)
{
    if (!srv) return;
    pthread_mutex_lock(&srv->lock);
    srv->stopping = true;
    while (srv->n_inflight || srv->n_suspended)
        pthread_cond_wait(&srv->idle, &srv->lock);
    pthread_mutex_unlock(&srv->lock);
    MHD_stop_daemon(srv->daemon);
    par_stop();
    close_watch_stop(srv->close_watch);
    mem_trim_release(srv->mem_trim);
    pthread_mutex_destroy(&srv->conns_lock);
    pthread_mutex_destroy(&srv->lock);
    pthread_cond_destroy(&srv->idle);
    tls_pem_free(&srv->pem);
    header_forward_free(srv->header_forward);
    free(srv);
}
