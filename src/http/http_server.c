/*
 * This file contains the KServe v2 HTTP/REST frontend on libmicrohttpd: the
 * route table and dispatch, the per-connection state machine (headers, body,
 * framing checks), the connection limit, and the server's start and stop.
 * The endpoints are in http_handlers.c and http_infer.c.
 *
 * MHD rules kept here: no response is queued on the first handler call
 * except the early body-size refusal (which should close the connection);
 * suspended connections are all resumed before MHD_stop_daemon. A request
 * refused while its body may still be coming ends in a lingering close
 * (linger.h), not a reset.
 */
#include "http/http_server.h"

#include <errno.h>
#include <fcntl.h>
#include <gnutls/gnutls.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http/http_internal.h"
#include "http/par.h"

/* No request ended for this long: freed heap pages go back to the system. */
#define HTTP_TRIM_QUIET_NS 1000000000u

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

/* The largest body of binary tensor data after a JSON header (when over
 * --http-max-input-size): Triton bounds only the JSON header by the flag
 * (EVBufferToJson) and reads binary data whatever its size, so a 1.9 GB
 * tensor reaches the model with the default flag (L0_large_payload, and
 * L0_backend_python's 1 GiB test_growth_error); Nereid bounds the whole body by the size of
 * Triton's largest gRPC message (INT32_MAX, common.h), which its
 * L0_large_payload's 3 GB HTTP request fails to fit too. */
#define HTTP_BINARY_BODY_MAX ((size_t)INT32_MAX)

/* Reads the framing headers of an infer request and checks the declared
 * sizes before any body byte is read. */
static void infer_headers(http_conn_t *c)
{
    size_t max = c->srv->max_input_size;
    c->encoding = http_encoding_parse(c->hdr.content_encoding);
    if (c->encoding == HTTP_ENCODING_UNSUPPORTED) {
        c->unsupported_encoding = true;
        c->error = nereid_error_new(NEREID_ERROR_UNSUPPORTED, "Unsupported compression type");
        return;
    }
    c->header_len = INFER_HEADER_LENGTH_NONE;
    const char *ih = c->hdr.ihcl;
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
    bool binary = c->header_len != INFER_HEADER_LENGTH_NONE && c->header_len > 0 &&
                  c->encoding == HTTP_ENCODING_IDENTITY;
    if (binary && max < HTTP_BINARY_BODY_MAX) c->limit = max = HTTP_BINARY_BODY_MAX;
    /* With Transfer-Encoding: chunked the Content-Length means nothing. */
    const char *cl = c->chunked ? NULL : c->hdr.content_length;
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
            binary ? "request size of %llu bytes exceeds the maximum allowed size of %zu bytes "
                     "for a request with binary data. Use --http-max-input-size to increase "
                     "the limit."
            : c->header_len == 0 ? "Raw input has a byte_size (%llu bytes) that exceeds the "
                                   "maximum allowed value of %zu bytes. Use "
                                   "--http-max-input-size to increase the limit."
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

/* A request starts on the connection of slot s (busy) or has ended (idle
 * again). */
static void conn_set_idle(http_server_t *srv, conn_slot_t *s, bool idle)
{
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
        bool linger = s->linger && !s->shut;
        pthread_mutex_unlock(&srv->conns_lock);
        /* MHD has written the reply and shut the write side, and closes
         * its fd after this call: a copy keeps the socket open while the
         * client's remaining bytes are discarded. */
        if (linger) linger_add(srv->linger, fcntl(s->fd, F_DUPFD_CLOEXEC, 0));
        free(s->spare);
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
    if (s) {
        s->ctx.draining = &srv->draining;
        s->fd = fd; /* even when shut below: refuse_mid_body writes to it */
    }
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
    req_headers_t *hdr;
    bool lengths_differ; /* Content-Length headers with different values */
    int n_te;
    const char *te; /* the last Transfer-Encoding value */
} framing_t;

/* Keeps the first value of a header of interest. */
static void keep_first(const char **slot, const char *value)
{
    if (!*slot) *slot = value;
}

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value)
{
    (void)kind;
    framing_t *f = cls;
    req_headers_t *h = f->hdr;
    /* By length first: most headers are none of these. */
    switch (strlen(key)) {
    case sizeof MHD_HTTP_HEADER_CONTENT_LENGTH - 1:
        if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) break;
        if (h->content_length && strcmp(h->content_length, value)) f->lengths_differ = true;
        keep_first(&h->content_length, value);
        break;
    case sizeof MHD_HTTP_HEADER_TRANSFER_ENCODING - 1:
        if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) break;
        keep_first(&h->transfer_encoding, value);
        f->n_te++;
        f->te = value;
        break;
    case sizeof MHD_HTTP_HEADER_CONTENT_ENCODING - 1:
        if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_ENCODING))
            keep_first(&h->content_encoding, value);
        break;
    case sizeof MHD_HTTP_HEADER_ACCEPT_ENCODING - 1:
        if (!strcasecmp(key, MHD_HTTP_HEADER_ACCEPT_ENCODING))
            keep_first(&h->accept_encoding, value);
        break;
    case sizeof HEADER_IHCL - 1:
        if (!strcasecmp(key, HEADER_IHCL)) keep_first(&h->ihcl, value);
        break;
    case sizeof HEADER_SEQ_ID - 1:
        if (!strcasecmp(key, HEADER_SEQ_ID)) keep_first(&h->seq[0], value);
        break;
    case sizeof HEADER_SEQ_START - 1:
        if (!strcasecmp(key, HEADER_SEQ_START)) keep_first(&h->seq[1], value);
        break;
    case sizeof HEADER_SEQ_END - 1:
        if (!strcasecmp(key, HEADER_SEQ_END)) keep_first(&h->seq[2], value);
        break;
    }
    return MHD_YES;
}

/* Collects the headers of interest into *hdr and checks what MHD lets
 * through but RFC 9112 forbids or we cannot read: returns the refusal text
 * and *status, or NULL. MHD would take the first of two Content-Lengths,
 * and read a body of unknown encoding until the peer closes. */
static const char *framing_error(struct MHD_Connection *mc, req_headers_t *hdr, unsigned *status,
                                 char *buf, size_t size)
{
    framing_t f = {.hdr = hdr};
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

/* The state of a request starting on the connection of slot (may be
 * NULL): the connection's spare, zeroed up to path_buf, or a new one. */
static http_conn_t *conn_state_take(conn_slot_t *slot)
{
    http_conn_t *c = slot ? slot->spare : NULL;
    if (c) {
        slot->spare = NULL;
        memset(c, 0, HTTP_CONN_RESET_BYTES);
    } else if (!(c = calloc(1, sizeof *c))) {
        return NULL;
    }
    c->slot = slot;
    c->seq_echo[0] = '\0';
    return c;
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

/* A reply queued before the body is read: MHD closes the connection after
 * it, and the client, maybe still sending, gets a lingering close. */
static void refuse_early(http_conn_t *c)
{
    c->refused = true;
    conn_slot_t *s = c->slot;
    if (s) s->linger = true;
}

/* Set just before on_request returns MHD_NO on purpose (refuse_mid_body):
 * MHD then logs "Application reported internal error" on this thread, which
 * mhd_log leaves out. */
static _Thread_local bool quiet_abort;

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[512];
    va_list copy;
    va_copy(copy, ap);
    vsnprintf(line, sizeof line, fmt, copy);
    va_end(copy);
    bool expected = quiet_abort && strstr(line, "Application reported internal error");
    quiet_abort = false;
    if (!expected) vfprintf(stderr, fmt, ap);
}

static bool send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w, n -= (size_t)w;
    }
    return true;
}

/* Refuses a body in its middle (a chunked body over the limit, or with too
 * many chunks), as Triton does: the reply now, then the connection closes.
 * MHD 0.9.75 queues no reply once a body has started (only in the headers
 * or whole-request states), so the reply is written to the socket here (MHD
 * has nothing of its own to send while it reads a body, and a reply this
 * small fits the empty send buffer) and MHD_NO has MHD close the
 * connection: a lingering close. Over TLS no byte can bypass MHD: the rest
 * of the body is read and dropped (up to LINGER_MAX_BYTES) and the reply
 * comes after it, with Connection: close. Takes err. */
static enum MHD_Result refuse_mid_body(http_conn_t *c, nereid_error_t *err)
{
    body_drop(c);
    c->body_pad = 0;
    conn_slot_t *s = c->slot;
    if (c->srv->tls || !s || s->fd < 0) {
        c->error = err;
        c->close = true;
        return MHD_YES;
    }
    unsigned status = http_status_from_code(nereid_error_code(err));
    const char *msg = nereid_error_message(err);
    sbuf_t json = {0}, reply = {0};
    char head[200];
    bool ok = !sbuf_append_str(&json, "{\"error\":") &&
              !sbuf_append_json_string(&json, msg, strlen(msg)) && !sbuf_append_str(&json, "}");
    if (ok) {
        const char *reason = MHD_get_reason_phrase_for(status);
        snprintf(head, sizeof head,
                 "HTTP/1.1 %u %s\r\nContent-Type: application/json\r\nConnection: close\r\n"
                 "Content-Length: %zu\r\n\r\n",
                 status, reason ? reason : "", json.len);
        ok = !sbuf_append_str(&reply, head) && !sbuf_append(&reply, json.data, json.len) &&
             send_all(s->fd, reply.data, reply.len);
    }
    free(json.data);
    free(reply.data);
    nereid_error_free(err);
    /* A reply cut short (or a socket we shut meanwhile, where the send
     * fails) cannot be taken back: closed at once. */
    s->linger = ok;
    quiet_abort = true;
    return MHD_NO;
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
        conn_slot_t *slot = conn_slot(mc);
        conn_set_idle(srv, slot, false);
        *con_cls = c = conn_state_take(slot);
        if (!c) return MHD_NO;
        c->srv = srv;
        c->mhd = mc;
        c->limit = srv->max_input_size;
        /* Refused before the body: the connection closes after the reply. */
        char buf[300];
        unsigned status;
        const char *bad = framing_error(mc, &c->hdr, &status, buf, sizeof buf);
        if (!bad && nul_url) status = 400, bad = "invalid URL: it contains a NUL byte (%00)";
        if (bad) {
            refuse_early(c);
            return http_queue_error_close(mc, status, bad);
        }
        c->chunked = c->hdr.transfer_encoding != NULL;
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
                refuse_early(c);
                return http_queue_nereid_error(mc, err);
            }
        } else if (c->route >= 0) {
            /* Other bodies are JSON documents: Triton's EVBufferToJson check,
             * made on the declared size before reading. */
            const char *cl = c->chunked ? NULL : c->hdr.content_length;
            unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0;
            if (declared > srv->max_input_size) {
                char msg[200];
                json_size_text(msg, sizeof msg, declared, srv->max_input_size);
                refuse_early(c);
                return http_queue_error_close(mc, 400, msg);
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (c->route < 0 || c->error || c->refused || c->forbidden) {
            /* discarded, up to a bound */
            c->dropped += n;
            if (c->dropped <= LINGER_MAX_BYTES) return MHD_YES;
            quiet_abort = true;
            return MHD_NO;
        }
        if (c->chunked && n < CHUNK_PIECE_SMALL && ++c->n_pieces > MAX_CHUNKS)
            return refuse_mid_body(c, nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                                       "Chunked request body exceeds maximum of "
                                                       "%d non-empty chunks. Send fewer or larger "
                                                       "HTTP chunks.",
                                                       MAX_CHUNKS));
        size_t used = c->body.data ? c->body.len - c->body_pad : 0;
        if (used + n > c->limit) {
            size_t max = c->limit;
            char msg[200];
            json_size_text(msg, sizeof msg, used + n, max);
            return refuse_mid_body(
                c, c->route == ROUTE_MODEL_INFER || c->route == ROUTE_MODEL_INFER_V
                       ? nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                          "request size exceeds the maximum allowed input "
                                          "size of %zu bytes. Use --http-max-input-size to "
                                          "increase the limit.",
                                          max)
                       : nereid_error_new(NEREID_ERROR_INVALID_ARG, "%s", msg));
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
        if (c->slot) atomic_store(&c->slot->receiving, false);
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
    conn_slot_t *slot = conn_slot(mc);
    conn_set_idle(cls, slot, true);
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
    if (c->error) nereid_error_free(c->error);
    if (c->submit_error) nereid_error_free(c->submit_error);
    infer_parsed_free(&c->parsed);
    nereid_shm_use_free(c->shm);
    free(c->inflated);
    free(c->raw_input_name);
    body_drop(c);
    if (c->path != c->path_buf) free(c->path);
    /* Kept for the connection's next request (MHD calls this before it
     * reports the connection closed, which frees the spare). */
    if (slot && !slot->spare)
        slot->spare = c;
    else
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
    srv->quiesced_fd = -1;
    if (opts->tls.use_ssl) {
        nereid_error_t *err = tls_pem_read(&opts->tls, "--http", &srv->pem);
        if (err) {
            free(srv);
            return err;
        }
        srv->tls_mutual = opts->tls.mutual;
        srv->tls = true;
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
    srv->linger = linger_start();
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
        flags, (uint16_t)opts->port, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER,
        mhd_log, NULL, MHD_OPTION_ARRAY, opts->tls.use_ssl ? tls_opts : tls_opts + 3,
        MHD_OPTION_ARRAY, reuse_opts, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        srv, MHD_OPTION_URI_LOG_CALLBACK, on_uri, srv, MHD_OPTION_CONNECTION_LIMIT, mhd_limit,
        MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)(opts->idle_timeout_secs > 0 ? opts->idle_timeout_secs : 0),
        MHD_OPTION_THREAD_POOL_SIZE, threads, MHD_OPTION_END);
    if (!srv->daemon) {
        close_watch_stop(srv->close_watch);
        linger_stop(srv->linger);
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
    if (fd == MHD_INVALID_SOCKET) return;
    shutdown(fd, SHUT_RDWR); /* a listening socket stops listening: connects are refused */
    srv->quiesced_fd = fd;
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
        size_t n_running = atomic_load(&srv->n_inflight);
        *n_inflight = n_running > srv->n_suspended ? n_running : srv->n_suspended;
        pthread_mutex_unlock(&srv->lock);
    }
    return n;
}

void http_server_stop(http_server_t *srv)
{
    if (!srv) return;
    pthread_mutex_lock(&srv->lock);
    atomic_store(&srv->stopping, true);
    while (atomic_load(&srv->n_inflight) || srv->n_suspended)
        pthread_cond_wait(&srv->idle, &srv->lock);
    pthread_mutex_unlock(&srv->lock);
    MHD_stop_daemon(srv->daemon);
    if (srv->quiesced_fd >= 0) close(srv->quiesced_fd);
    par_stop();
    close_watch_stop(srv->close_watch);
    linger_stop(srv->linger);
    mem_trim_release(srv->mem_trim);
    pthread_mutex_destroy(&srv->conns_lock);
    pthread_mutex_destroy(&srv->lock);
    pthread_cond_destroy(&srv->idle);
    tls_pem_free(&srv->pem);
    header_forward_free(srv->header_forward);
    free(srv);
}
