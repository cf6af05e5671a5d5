/*
 * This file contains the gRPC frontend's engine: server start-up and
 * shutdown, one completion-queue thread per queue, the pre-posted calls for
 * every registered method, the generic call that answers unknown methods
 * UNIMPLEMENTED, and the plumbing that finishes a unary call from any thread.
 */
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "grpc/grpc_hooks.h"
#include "grpc/grpc_internal.h"

static const struct {
    const char *path;
    gfe_unary_fn fn;
    gfe_kind_t kind;
    int n_posted;
} gfe_methods[GFE_N_METHODS] = {
#define X(e, p, f, k, n) [GFE_M_##e] = {p, f, k, n},
    GFE_METHOD_MAP(X)
#undef X
};

/* A call to a method that is not registered: answered UNIMPLEMENTED. */
typedef struct gfe_generic_call {
    gfe_tag_t arrive_tag;
    gfe_tag_t done_tag;
    grpc_frontend_t *fe;
    int queue;
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array request_md;
    int cancelled;
    grpc_slice status_details;
} gfe_generic_call_t;

#define GFE_TRIM_QUIET_NS 1000000000ull /* the HTTP frontend's quiet period */

static void post_unary(grpc_frontend_t *fe, int queue, gfe_method_t method, bool announce);
static void post_generic(grpc_frontend_t *fe, int queue);

/* ---- Helpers ------------------------------------------------------------ */

void gfe_live_add(grpc_frontend_t *fe)
{
    pthread_mutex_lock(&fe->mu);
    fe->n_live++;
    pthread_mutex_unlock(&fe->mu);
}

void gfe_live_release(grpc_frontend_t *fe)
{
    pthread_mutex_lock(&fe->mu);
    if (--fe->n_live == 0) pthread_cond_broadcast(&fe->cv);
    pthread_mutex_unlock(&fe->mu);
}

void gfe_calls_add(grpc_frontend_t *fe, int delta)
{
    pthread_mutex_lock(&fe->mu);
    fe->n_calls += delta;
    pthread_mutex_unlock(&fe->mu);
}

grpc_status_code gfe_status_from_error(const nereid_error_t *err)
{
    switch (nereid_error_code(err)) {
    case NEREID_ERROR_INTERNAL:
        return GRPC_STATUS_INTERNAL;
    case NEREID_ERROR_NOT_FOUND:
        return GRPC_STATUS_NOT_FOUND;
    case NEREID_ERROR_INVALID_ARG:
        return GRPC_STATUS_INVALID_ARGUMENT;
    case NEREID_ERROR_UNAVAILABLE:
        return GRPC_STATUS_UNAVAILABLE;
    case NEREID_ERROR_UNSUPPORTED:
        return GRPC_STATUS_UNIMPLEMENTED;
    case NEREID_ERROR_ALREADY_EXISTS:
        return GRPC_STATUS_ALREADY_EXISTS;
    case NEREID_ERROR_CANCELLED:
        return GRPC_STATUS_CANCELLED;
    default:
        return GRPC_STATUS_UNKNOWN;
    }
}

grpc_byte_buffer *gfe_buffer_from_bytes(const void *data, size_t n)
{
    grpc_slice s = grpc_slice_from_copied_buffer(data, n);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

grpc_byte_buffer *gfe_buffer_from_msg(const ProtobufCMessage *msg)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

grpc_slice gfe_buffer_read(grpc_byte_buffer *bb)
{
    if (bb == NULL) return grpc_empty_slice();
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, bb)) return grpc_empty_slice();
    grpc_slice s = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    return s;
}

#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define TSAN_ACQUIRE(p) __tsan_acquire(p)
#define TSAN_RELEASE(p) __tsan_release(p)
#else
#define TSAN_ACQUIRE(p) ((void)(p))
#define TSAN_RELEASE(p) ((void)(p))
#endif

grpc_call_error gfe_start_batch(grpc_call *call, const grpc_op *ops, size_t n, void *tag)
{
    TSAN_RELEASE(tag);
    return grpc_call_start_batch(call, ops, n, tag, NULL);
}

nereid_error_t *gfe_forward_headers(const grpc_frontend_t *fe, const grpc_metadata *md, size_t n,
                                    nereid_request_t *req)
{
    for (size_t i = 0; fe->header_forward && i < n; i++) {
        const char *key = (const char *)GRPC_SLICE_START_PTR(md[i].key);
        size_t key_len = GRPC_SLICE_LENGTH(md[i].key);
        if (!header_forward_match(fe->header_forward, key, key_len)) continue;
        nereid_error_t *err =
            header_forward_apply(req, key, key_len, (const char *)GRPC_SLICE_START_PTR(md[i].value),
                                 GRPC_SLICE_LENGTH(md[i].value));
        if (err) return err;
    }
    return NULL;
}

/* ---- Unary calls -------------------------------------------------------- */

static void unary_free(gfe_unary_call_t *c)
{
    grpc_frontend_t *fe = c->fe;
    if (c->arrived && c->method == GFE_M_MODEL_INFER)
        gfe_hooks_log(fe->server, 2, "StateRelease, %" PRIu64 " Step %s", c->log_id,
                      atomic_load(&c->client_cancelled) ? "CANCELLED" : "FINISH");
    if (c->trace) {
        nereid_trace_timestamp(c->trace, "GRPC_WAITREAD_START", c->waitread_start_ns);
        nereid_trace_timestamp(c->trace, "GRPC_WAITREAD_END", c->waitread_end_ns);
        if (c->response_ns)
            nereid_trace_timestamp(c->trace, "INFER_RESPONSE_COMPLETE", c->response_ns);
        nereid_trace_timestamp(c->trace, "GRPC_SEND_START", c->send_start_ns);
        nereid_trace_timestamp(c->trace, "GRPC_SEND_END", nereid_trace_now_ns());
        nereid_trace_release(c->trace);
    }
    if (c->call != NULL) grpc_call_unref(c->call);
    if (c->arrived) gfe_calls_add(fe, -1);
    grpc_metadata_array_destroy(&c->request_md);
    if (c->payload != NULL) grpc_byte_buffer_destroy(c->payload);
    if (c->reply != NULL) grpc_byte_buffer_destroy(c->reply);
    grpc_slice_unref(c->status_details);
    nereid_cancel_token_free(c->cancel);
    for (size_t i = 0; i < c->n_reply_md; i++) {
        grpc_slice_unref(c->reply_md[i].key);
        grpc_slice_unref(c->reply_md[i].value);
    }
    free(c);
    gfe_live_release(fe);
}

static void unary_done(gfe_tag_t *tag, bool ok)
{
    (void)ok;
    gfe_unary_call_t *c = GFE_CONTAINER_OF(tag, gfe_unary_call_t, done_tag);
    if (c->method == GFE_M_MODEL_INFER) { /* Triton's step COMPLETE */
        gfe_hook_delay(GFE_HOOK_PROCESS_ENTRY);
        gfe_hook_delay(GFE_HOOK_PROCESS);
    }
    if (!c->close_started || atomic_fetch_sub(&c->close_refs, 1) == 1) unary_free(c);
}

static void unary_close_done(gfe_tag_t *tag, bool ok)
{
    gfe_unary_call_t *c = GFE_CONTAINER_OF(tag, gfe_unary_call_t, close_tag);
    /* Triton's AsyncNotifyWhenDone: the context reads as cancelled at once,
     * the notification is handled after its test delays. */
    if (c->cancelled) atomic_store(&c->client_cancelled, true);
    gfe_hook_delay(GFE_HOOK_NOTIFICATION);
    gfe_hook_delay(GFE_HOOK_PROCESS);
    if (c->cancelled) {
        gfe_hooks_log(c->fe->server, 1,
                      "Cancellation notification received for ModelInferHandler, rpc_ok=%d, "
                      "context %" PRIu64 " step ISSUED, state %" PRIu64 " step ISSUED",
                      ok ? 1 : 0, c->log_id, c->log_id);
        nereid_request_cancel(c->cancel);
    }
    if (atomic_fetch_sub(&c->close_refs, 1) == 1) unary_free(c);
}

void gfe_unary_watch_close(gfe_unary_call_t *c, nereid_cancel_token_t *token)
{
    c->cancel = token;
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled;
    c->close_tag.fn = unary_close_done;
    atomic_store(&c->close_refs, 2); /* the close and the final batch */
    c->close_started = true;
    if (gfe_start_batch(c->call, &op, 1, &c->close_tag) != GRPC_CALL_OK) c->close_started = false;
}

void gfe_unary_finish_status(gfe_unary_call_t *c, grpc_status_code code, const char *details,
                             grpc_byte_buffer *reply)
{
    if (c->trace) c->send_start_ns = nereid_trace_now_ns();
    grpc_op ops[4];
    size_t n = 0;
    memset(ops, 0, sizeof(ops));
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].data.send_initial_metadata.count = c->n_reply_md;
    ops[n].data.send_initial_metadata.metadata = c->reply_md;
    gfe_set_infer_compression(c->fe, c->method == GFE_M_MODEL_INFER, &ops[n]);
    n++;
    if (reply != NULL) {
        c->reply = reply;
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = reply;
        n++;
    }
    grpc_slice_unref(c->status_details);
    c->status_details = grpc_slice_from_copied_string(details != NULL ? details : "");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = code;
    ops[n].data.send_status_from_server.status_details =
        code == GRPC_STATUS_OK ? NULL : &c->status_details;
    n++;
    if (!c->close_started) {
        ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[n].data.recv_close_on_server.cancelled = &c->cancelled;
        n++;
    }
    c->done_tag.fn = unary_done;
    if (gfe_start_batch(c->call, ops, n, &c->done_tag) != GRPC_CALL_OK)
        unary_done(&c->done_tag, false);
}

void gfe_unary_finish(gfe_unary_call_t *c, grpc_byte_buffer *reply)
{
    if (reply == NULL) reply = gfe_buffer_from_bytes("", 0);
    gfe_unary_finish_status(c, GRPC_STATUS_OK, NULL, reply);
}

void gfe_unary_finish_msg(gfe_unary_call_t *c, const ProtobufCMessage *msg)
{
    gfe_unary_finish(c, gfe_buffer_from_msg(msg));
}

void gfe_unary_finish_error(gfe_unary_call_t *c, nereid_error_t *err)
{
    gfe_unary_finish_status(c, gfe_status_from_error(err), nereid_error_message(err), NULL);
    nereid_error_free(err);
}

/* Triton's restricted protocol group of each RPC (grpc_server.cc). */
static restricted_group_t method_group(gfe_method_t m)
{
    switch (m) {
    case GFE_M_SERVER_LIVE:
    case GFE_M_SERVER_READY:
    case GFE_M_MODEL_READY:
    case GFE_M_HEALTH_CHECK:
        return RESTRICTED_HEALTH;
    case GFE_M_SERVER_METADATA:
    case GFE_M_MODEL_METADATA:
        return RESTRICTED_METADATA;
    case GFE_M_MODEL_INFER:
    case GFE_M_MODEL_STREAM_INFER:
        return RESTRICTED_INFERENCE;
    case GFE_M_MODEL_CONFIG:
        return RESTRICTED_MODEL_CONFIG;
    case GFE_M_MODEL_STATISTICS:
        return RESTRICTED_STATISTICS;
    case GFE_M_REPOSITORY_INDEX:
    case GFE_M_REPOSITORY_MODEL_LOAD:
    case GFE_M_REPOSITORY_MODEL_UNLOAD:
        return RESTRICTED_MODEL_REPOSITORY;
    case GFE_M_SYSTEM_SHM_STATUS:
    case GFE_M_SYSTEM_SHM_REGISTER:
    case GFE_M_SYSTEM_SHM_UNREGISTER:
    case GFE_M_CUDA_SHM_STATUS:
    case GFE_M_CUDA_SHM_REGISTER:
    case GFE_M_CUDA_SHM_UNREGISTER:
        return RESTRICTED_SHARED_MEMORY;
    case GFE_M_TRACE_SETTING:
        return RESTRICTED_TRACE;
    case GFE_M_LOG_SETTINGS:
        return RESTRICTED_LOGGING;
    default:
        return RESTRICTED_NONE;
    }
}

/* Triton's ExecutePrecondition: the first metadata entry with the group's
 * key must carry exactly its value. On refusal the call (unary or stream)
 * is finished UNAVAILABLE with Triton's text and true is returned. */
static bool refuse_restricted(gfe_unary_call_t *c)
{
    restricted_group_t g = method_group(c->method);
    const char *header = restricted_header(c->fe->restricted, g);
    if (!header) return false;
    const grpc_metadata *found = NULL;
    for (size_t i = 0; i < c->request_md.count && !found; i++)
        if (grpc_slice_str_cmp(c->request_md.metadata[i].key, header) == 0)
            found = &c->request_md.metadata[i];
    if (found && grpc_slice_str_cmp(found->value, c->fe->restricted->value[g]) == 0) return false;
    char msg[600];
    snprintf(msg, sizeof msg, "This protocol is restricted, expecting header '%s'", header);
    gfe_unary_finish_status(c, GRPC_STATUS_UNAVAILABLE, msg, NULL);
    return true;
}

static void unary_arrived(gfe_tag_t *tag, bool ok)
{
    gfe_unary_call_t *c = GFE_CONTAINER_OF(tag, gfe_unary_call_t, arrive_tag);
    grpc_frontend_t *fe = c->fe;
    if (!ok) { /* the server is shutting down: no call came */
        unary_free(c);
        return;
    }
    if (c->waitread_start_ns) c->waitread_end_ns = nereid_trace_now_ns();
    c->arrived = true;
    gfe_calls_add(fe, 1);
    if (c->method == GFE_M_MODEL_INFER) { /* Triton's step START */
        gfe_hook_delay(GFE_HOOK_PROCESS_ENTRY);
        gfe_hook_delay(GFE_HOOK_PROCESS);
    }
    if (!atomic_load(&fe->stopping)) post_unary(fe, c->queue, c->method, true);
    if (fe->restricted && refuse_restricted(c)) return;
    if (gfe_methods[c->method].kind == GFE_STREAM) {
        grpc_call *call = c->call;
        c->call = NULL;
        gfe_stream_start(fe, call, &c->request_md);
        unary_free(c);
        return;
    }
    grpc_slice body = gfe_buffer_read(c->payload);
    gfe_methods[c->method].fn(c, GRPC_SLICE_START_PTR(body), GRPC_SLICE_LENGTH(body));
    grpc_slice_unref(body);
}

/* announce: Triton's "New request handler" record for a ModelInfer call
 * posted (one per queue at start, then one per arrival). */
static void post_unary(grpc_frontend_t *fe, int queue, gfe_method_t method, bool announce)
{
    gfe_unary_call_t *c = calloc(1, sizeof(*c));
    if (c == NULL) return;
    c->fe = fe;
    c->queue = queue;
    c->method = method;
    c->arrive_tag.fn = unary_arrived;
    c->status_details = grpc_empty_slice();
    if (method == GFE_M_MODEL_INFER && nereid_server_tracing(fe->server))
        c->waitread_start_ns = nereid_trace_now_ns();
    grpc_metadata_array_init(&c->request_md);
    if (method == GFE_M_MODEL_INFER) {
        c->log_id = gfe_hooks_next_id();
        if (announce)
            gfe_hooks_log(fe->server, 1, "New request handler for ModelInferHandler, %" PRIu64,
                          c->log_id);
    }
    gfe_live_add(fe);
    grpc_completion_queue *cq = fe->queues[queue];
    TSAN_RELEASE(&c->arrive_tag);
    grpc_call_error rc = grpc_server_request_registered_call(
        fe->grpc, fe->method_handles[method], &c->call, &c->deadline, &c->request_md,
        gfe_methods[method].kind == GFE_UNARY ? &c->payload : NULL, cq, cq, &c->arrive_tag);
    if (rc != GRPC_CALL_OK) unary_free(c);
}

/* ---- Unknown methods ---------------------------------------------------- */

static void generic_free(gfe_generic_call_t *g)
{
    grpc_frontend_t *fe = g->fe;
    if (g->call != NULL) grpc_call_unref(g->call);
    grpc_call_details_destroy(&g->details);
    grpc_metadata_array_destroy(&g->request_md);
    grpc_slice_unref(g->status_details);
    free(g);
    gfe_live_release(fe);
}

static void generic_done(gfe_tag_t *tag, bool ok)
{
    (void)ok;
    generic_free(GFE_CONTAINER_OF(tag, gfe_generic_call_t, done_tag));
}

static void generic_arrived(gfe_tag_t *tag, bool ok)
{
    gfe_generic_call_t *g = GFE_CONTAINER_OF(tag, gfe_generic_call_t, arrive_tag);
    if (!ok) {
        generic_free(g);
        return;
    }
    if (!atomic_load(&g->fe->stopping)) post_generic(g->fe, g->queue);
    grpc_slice_unref(g->status_details);
    g->status_details = grpc_slice_from_static_string("");
    grpc_op ops[3];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[1].data.send_status_from_server.status = GRPC_STATUS_UNIMPLEMENTED;
    ops[1].data.send_status_from_server.status_details = &g->status_details;
    ops[2].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[2].data.recv_close_on_server.cancelled = &g->cancelled;
    g->done_tag.fn = generic_done;
    if (gfe_start_batch(g->call, ops, 3, &g->done_tag) != GRPC_CALL_OK) generic_free(g);
}

static void post_generic(grpc_frontend_t *fe, int queue)
{
    gfe_generic_call_t *g = calloc(1, sizeof(*g));
    if (g == NULL) return;
    g->fe = fe;
    g->queue = queue;
    g->arrive_tag.fn = generic_arrived;
    g->status_details = grpc_empty_slice();
    grpc_call_details_init(&g->details);
    grpc_metadata_array_init(&g->request_md);
    gfe_live_add(fe);
    grpc_completion_queue *cq = fe->queues[queue];
    TSAN_RELEASE(&g->arrive_tag);
    if (grpc_server_request_call(fe->grpc, &g->call, &g->details, &g->request_md, cq, cq,
                                 &g->arrive_tag) != GRPC_CALL_OK)
        generic_free(g);
}

/* ---- Lifecycle ---------------------------------------------------------- */

_Thread_local bool gfe_on_queue_thread;

static void *queue_thread(void *arg)
{
    grpc_completion_queue *cq = arg;
    gfe_on_queue_thread = true;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        if (ev.type != GRPC_OP_COMPLETE) continue;
        TSAN_ACQUIRE(ev.tag);
        ((gfe_tag_t *)ev.tag)->fn(ev.tag, ev.success != 0);
    }
    return NULL;
}

static void shutdown_done(gfe_tag_t *tag, bool ok)
{
    (void)ok;
    grpc_frontend_t *fe = GFE_CONTAINER_OF(tag, grpc_frontend_t, shutdown_tag);
    pthread_mutex_lock(&fe->mu);
    fe->shutdown_done = true;
    pthread_cond_broadcast(&fe->cv);
    pthread_mutex_unlock(&fe->mu);
}

void grpc_options_init(grpc_options_t *opts)
{
    opts->address = "0.0.0.0";
    opts->port = 8001;
    opts->infer_thread_count = 2;
    opts->max_response_pool_size = INT_MAX;
    opts->restricted = NULL;
    opts->tls = (tls_options_t){0};
    opts->header_forward_pattern = NULL;
    opts->shm = NULL;
    opts->reuse_port = false;
    opts->keepalive_time_ms = 7200000;
    opts->keepalive_timeout_ms = 20000;
    opts->keepalive_permit_without_calls = false;
    opts->http2_max_pings_without_data = 2;
    opts->http2_min_recv_ping_interval_without_data_ms = 300000;
    opts->http2_max_ping_strikes = 2;
    opts->infer_compression_level = GRPC_COMPRESS_LEVEL_NONE;
}

int grpc_frontend_port(const grpc_frontend_t *fe)
{
    return fe->port;
}

/* Frees queues and the frontend after the server is gone (or never ran). */
static void destroy_queues(grpc_frontend_t *fe, int n_threads)
{
    for (int i = 0; i < fe->n_queues; i++)
        grpc_completion_queue_shutdown(fe->queues[i]);
    for (int i = 0; i < n_threads; i++)
        pthread_join(fe->threads[i], NULL);
    for (int i = 0; i < fe->n_queues; i++) {
        if (n_threads == 0) { /* drain what a never-started server left */
            grpc_event ev;
            do {
                ev = grpc_completion_queue_next(fe->queues[i], gpr_inf_future(GPR_CLOCK_REALTIME),
                                                NULL);
            } while (ev.type != GRPC_QUEUE_SHUTDOWN);
        }
        grpc_completion_queue_destroy(fe->queues[i]);
    }
    header_forward_free(fe->header_forward);
    free(fe->queues);
    free(fe->threads);
    pthread_mutex_destroy(&fe->mu);
    pthread_cond_destroy(&fe->cv);
    free(fe);
    grpc_shutdown();
}

static pthread_t prestart_thread;
static bool prestarted;

static void *prestart_main(void *arg)
{
    (void)arg;
    grpc_init();
    return NULL;
}

void grpc_frontend_prestart(void)
{
    if (!prestarted) prestarted = pthread_create(&prestart_thread, NULL, prestart_main, NULL) == 0;
}

void grpc_frontend_prestart_end(void)
{
    if (!prestarted) return;
    pthread_join(prestart_thread, NULL);
    prestarted = false;
    grpc_shutdown(); /* the frontend's own grpc_init holds the library */
}

nereid_error_t *grpc_frontend_start(nereid_server_t *server, const grpc_options_t *opts,
                                    grpc_frontend_t **out)
{
    *out = NULL;
    grpc_options_t defaults;
    grpc_options_init(&defaults);
    if (opts == NULL) opts = &defaults;
    const char *address = opts->address != NULL ? opts->address : defaults.address;
    int n_queues = opts->infer_thread_count;
    if (n_queues <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        n_queues = cores > 0 ? (int)cores : 1;
    }
    if (opts->port < 0 || opts->port > 65535)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "invalid gRPC port %d", opts->port);
    tls_pem_t pem = {0};
    if (opts->tls.use_ssl) {
        nereid_error_t *err = tls_pem_read(&opts->tls, "--grpc", &pem);
        if (err) return err;
    }

    grpc_init();
    grpc_frontend_t *fe = calloc(1, sizeof(*fe));
    if (fe == NULL) {
        tls_pem_free(&pem);
        grpc_shutdown();
        return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    }
    fe->server = server;
    fe->shm = opts->shm;
    fe->restricted = opts->restricted;
    fe->max_response_pool =
        opts->max_response_pool_size > 0 ? (size_t)opts->max_response_pool_size : (size_t)INT_MAX;
    if (opts->header_forward_pattern) {
        char *why = NULL;
        fe->header_forward = header_forward_new(opts->header_forward_pattern, &why);
        if (!fe->header_forward) {
            nereid_error_t *err = nereid_error_new(
                NEREID_ERROR_INVALID_ARG, "invalid --grpc-header-forward-pattern '%s': %s",
                opts->header_forward_pattern, why ? why : "out of memory");
            free(why);
            tls_pem_free(&pem);
            free(fe);
            grpc_shutdown();
            return err;
        }
    }
    fe->n_queues = n_queues;
    pthread_mutex_init(&fe->mu, NULL);
    pthread_condattr_t cv_attr;
    pthread_condattr_init(&cv_attr);
    pthread_condattr_setclock(&cv_attr, CLOCK_MONOTONIC);
    pthread_cond_init(&fe->cv, &cv_attr);
    pthread_condattr_destroy(&cv_attr);
    fe->shutdown_tag.fn = shutdown_done;
    fe->queues = calloc((size_t)n_queues, sizeof(*fe->queues));
    fe->threads = calloc((size_t)n_queues, sizeof(*fe->threads));

    /* No 4 MiB limit; SO_REUSEPORT only with --reuse-grpc-port, so a taken
     * port fails start-up; Triton's keepalive settings. */
    const struct {
        const char *key;
        int value;
    } int_args[] = {
        {GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, -1},
        {GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, -1},
        {GRPC_ARG_ALLOW_REUSEPORT, opts->reuse_port},
        {GRPC_ARG_KEEPALIVE_TIME_MS, opts->keepalive_time_ms},
        {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, opts->keepalive_timeout_ms},
        {GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, opts->keepalive_permit_without_calls},
        {GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, opts->http2_max_pings_without_data},
        {GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
         opts->http2_min_recv_ping_interval_without_data_ms},
        {GRPC_ARG_HTTP2_MAX_PING_STRIKES, opts->http2_max_ping_strikes},
    };
    enum { N_ARGS = sizeof int_args / sizeof int_args[0] };
    grpc_arg args[N_ARGS];
    memset(args, 0, sizeof(args));
    size_t n_args = 0;
    for (size_t i = 0; i < N_ARGS; i++) {
        bool is_time = !strcmp(int_args[i].key, GRPC_ARG_KEEPALIVE_TIME_MS) ||
                       !strcmp(int_args[i].key, GRPC_ARG_KEEPALIVE_TIMEOUT_MS);
        if (is_time && int_args[i].value <= 0) continue;
        args[n_args].type = GRPC_ARG_INTEGER;
        args[n_args].key = (char *)int_args[i].key;
        args[n_args++].value.integer = int_args[i].value;
    }
    fe->infer_compression_level = opts->infer_compression_level;
    grpc_channel_args channel_args = {n_args, args};
    gfe_hooks_init();
    fe->grpc = grpc_server_create(&channel_args, NULL);
    for (int i = 0; i < n_queues; i++) {
        fe->queues[i] = grpc_completion_queue_create_for_next(NULL);
        grpc_server_register_completion_queue(fe->grpc, fe->queues[i], NULL);
    }
    for (int m = 0; m < GFE_N_METHODS; m++)
        fe->method_handles[m] = grpc_server_register_method(
            fe->grpc, gfe_methods[m].path, NULL,
            gfe_methods[m].kind == GFE_UNARY ? GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER
                                             : GRPC_SRM_PAYLOAD_NONE,
            0);

    char target[300];
    bool v6 = strchr(address, ':') != NULL && address[0] != '[';
    snprintf(target, sizeof(target), v6 ? "[%s]:%d" : "%s:%d", address, opts->port);
    grpc_server_credentials *creds;
    if (opts->tls.use_ssl) {
        /* Triton's SslServerCredentials: the root certificates verify client
         * certificates, which only mutual TLS requires. */
        grpc_ssl_pem_key_cert_pair pair = {pem.key, pem.cert};
        creds = grpc_ssl_server_credentials_create_ex(
            pem.root, &pair, 1,
            opts->tls.mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                             : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            NULL);
    } else {
        creds = grpc_insecure_server_credentials_create();
    }
    fe->port = creds ? grpc_server_add_http2_port(fe->grpc, target, creds) : 0;
    if (creds) grpc_server_credentials_release(creds);
    tls_pem_free(&pem);
    if (fe->port == 0) {
        grpc_server_destroy(fe->grpc);
        destroy_queues(fe, 0);
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                                "failed to start GRPC service: unable to bind address '%s'",
                                target);
    }
    /* Large tensors leave freed heap pages behind after a burst: the
     * trimmer the HTTP frontend uses returns them once calls stop ending,
     * with the HTTP frontend's heap settings (see http_server_start: fixed
     * thresholds bound what the other arenas' tops keep; glibc's dynamic
     * ones grow to 32 MiB per arena after one large tensor). */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 16 << 20);
    fe->mem_trim = mem_trim_acquire(GFE_TRIM_QUIET_NS);
    grpc_server_start(fe->grpc);
    for (int i = 0; i < n_queues; i++)
        pthread_create(&fe->threads[i], NULL, queue_thread, fe->queues[i]);
    for (int i = 0; i < n_queues; i++) {
        for (int m = 0; m < GFE_N_METHODS; m++)
            for (int k = 0; k < gfe_methods[m].n_posted; k++)
                post_unary(fe, i, (gfe_method_t)m, k == 0);
        post_generic(fe, i);
        post_generic(fe, i);
    }
    *out = fe;
    return NULL;
}

void grpc_frontend_drain(grpc_frontend_t *fe)
{
    if (fe == NULL) return;
    pthread_mutex_lock(&fe->mu);
    if (fe->draining) {
        pthread_mutex_unlock(&fe->mu);
        return;
    }
    fe->draining = true;
    atomic_store(&fe->stopping, true);
    /* The listener closes and clients are told (GOAWAY) to open no more
     * calls on their connections; the calls in flight go on. */
    grpc_server_shutdown_and_notify(fe->grpc, fe->queues[0], &fe->shutdown_tag);
    gfe_streams_drain_locked(fe);
    pthread_mutex_unlock(&fe->mu);
}

long grpc_frontend_calls(grpc_frontend_t *fe)
{
    if (fe == NULL) return 0;
    pthread_mutex_lock(&fe->mu);
    long n = fe->n_calls;
    pthread_mutex_unlock(&fe->mu);
    return n;
}

void grpc_frontend_stop(grpc_frontend_t *fe)
{
    if (fe == NULL) return;
    grpc_frontend_drain(fe);
    /* What is left (the caller's drain is over) is cancelled. */
    grpc_server_cancel_all_calls(fe->grpc);
    pthread_mutex_lock(&fe->mu);
    while (!fe->shutdown_done || fe->n_live > 0)
        pthread_cond_wait(&fe->cv, &fe->mu);
    pthread_mutex_unlock(&fe->mu);
    grpc_server_destroy(fe->grpc);
    mem_trim_release(fe->mem_trim);
    destroy_queues(fe, fe->n_queues);
}
