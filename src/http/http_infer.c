/*
 * This file contains the HTTP frontend's inference path (/infer) and
 * Triton's generate extension (/generate, /generate_stream), and the
 * suspend and resume of a connection while its request runs.
 *
 * Inference: the body is accumulated in our own buffer (capped by
 * --http-max-input-size, checked first from the headers), parsed into a
 * nereid_request_t that borrows it, and submitted with
 * nereid_server_infer_async while the connection is suspended. Outputs are
 * the core's memory (small ones in the response itself) or a backend's
 * views, except those the request sends to shared memory (the only use of
 * a response allocator here); the completion callback only stores the
 * response and resumes the connection, and the MHD thread then replies
 * with an iovec response (JSON header + output buffers, no copy of tensor
 * data) that holds the response until sent.
 */
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "http/compress.h"
#include "http/http_internal.h"
#include "http/infer_reply.h"
#include "http/numfmt.h"

/* Everything an infer reply keeps alive until MHD has sent it: the
 * response holds the outputs (the core's memory, or a backend's views). */
typedef struct reply_hold {
    nereid_response_t *response;
    infer_reply_t reply;
} reply_hold_t;

/* ---- Inference ------------------------------------------------------------ */

/* Used only when the request names shared memory: outputs with a region go
 * there, the others take the core's own memory. */
static nereid_error_t *alloc_output(void *userp, const char *name, nereid_datatype_t dt,
                                    const int64_t *shape, size_t rank, size_t byte_size,
                                    void **buffer, void **buffer_userp)
{
    (void)shape, (void)rank;
    http_conn_t *c = userp;
    nereid_error_t *err;
    if (nereid_shm_use_alloc(c->shm, name, dt, byte_size, buffer, &err)) {
        *buffer_userp = NULL;
        return err;
    }
    *buffer = NULL;
    *buffer_userp = NEREID_ALLOC_DECLINED;
    return NULL;
}

/* Shared memory is the client's: nothing to release. */
static void release_output(void *userp, void *buffer, void *buffer_userp, size_t byte_size)
{
    (void)userp, (void)buffer, (void)buffer_userp, (void)byte_size;
}

/* An inference starts: counted for http_server_stop, or refused (false)
 * once the server stops. No lock: the count and the flag are atomics, each
 * side writes its own before it reads the other's, so a stop sees the
 * count or the inference sees the flag. */
bool inflight_begin(http_server_t *srv)
{
    atomic_fetch_add(&srv->n_inflight, 1);
    if (!atomic_load(&srv->stopping)) return true;
    inflight_end(srv);
    return false;
}

/* An inference's completion has run: the last one wakes a stop. */
void inflight_end(http_server_t *srv)
{
    if (atomic_fetch_sub(&srv->n_inflight, 1) == 1 && atomic_load(&srv->stopping)) {
        pthread_mutex_lock(&srv->lock);
        pthread_cond_broadcast(&srv->idle);
        pthread_mutex_unlock(&srv->lock);
    }
}

/* Suspends c from its handler, counted for http_server_stop. */
void conn_suspend(http_conn_t *c)
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
void conn_resumed(http_conn_t *c)
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
    inflight_end(srv);
}

static void reply_hold_free(void *cls)
{
    reply_hold_t *h = cls;
    infer_reply_free(&h->reply);
    if (h->response) nereid_response_free(h->response);
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
bool infer_wait(http_conn_t *c)
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
static const char *const seq_header_names[3] = {HEADER_SEQ_ID, HEADER_SEQ_START, HEADER_SEQ_END};

static nereid_error_t *seq_headers(http_conn_t *c, nereid_request_t *req)
{
    const char *const *v = c->hdr.seq;
    return nereid_request_sequence_headers(req, seq_header_names, v[0], v[1], v[2], c->seq_echo,
                                           sizeof c->seq_echo);
}

/* The connection's slot (on_connection), or NULL. */
conn_slot_t *conn_slot(struct MHD_Connection *mc)
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
    const char *id = c->hdr.seq[0], *end = c->hdr.seq[2];
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
    conn_slot_t *slot = c->slot;
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

    if (!inflight_begin(srv)) {
        nereid_request_free(req);
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready");
    }

    atomic_store(&c->phase, PHASE_RUNNING);
    if (!c->cancel) c->cancel = nereid_cancel_token_new();
    nereid_request_set_cancel_token(req, c->cancel);
    nereid_response_allocator_t alloc = {
        .alloc_fn = alloc_output, .release_fn = release_output, .userp = c};
    /* The reply holds the response until sent (reply_hold_t): outputs may be
     * views of a backend's memory, unless they go to shared memory. */
    nereid_request_set_output_views(req, c->shm == NULL);
    err = nereid_server_infer_async(srv->core, req, c->shm ? &alloc : NULL, infer_done, c);
    if (err) {
        nereid_request_free(req);
        inflight_end(srv);
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
    reply_hold_t *h = malloc(sizeof *h); /* glibc's calloc skips the per-thread cache */
    if (!h) {
        nereid_response_free(resp);
        return http_queue_error(c->mhd, 500, "out of memory");
    }
    h->response = resp;
    nereid_error_t *err = infer_reply_build(resp, &c->parsed, &h->reply);
    if (err) {
        reply_hold_free(h);
        return http_queue_nereid_error(c->mhd, err);
    }

    struct MHD_Response *r = NULL;
    const char *ce = NULL;
    http_encoding_t accept = http_accept_encoding(c->hdr.accept_encoding);
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
    *numfmt_u64(ihcl, h->reply.json_len) = '\0';
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

enum MHD_Result handle_infer(http_conn_t *c)
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

void gen_unref(gen_call_t *g)
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
    inflight_end(g->srv);
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
enum MHD_Result handle_generate(http_conn_t *c)
{
    http_server_t *srv = c->srv;
    if (c->gen) {
        conn_resumed(c);
        return gen_reply(c);
    }
    if (c->version < -1) return version_error(c);
    const char *ce = c->hdr.content_encoding;
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
        if (!inflight_begin(srv)) {
            err = nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready");
            nereid_request_free(req);
        }
    }
    if (!err) {
        if (!c->cancel) c->cancel = nereid_cancel_token_new();
        nereid_request_set_cancel_token(req, c->cancel);
        c->gen = g;
        err = nereid_server_infer_stream(srv->core, req, NULL, gen_response, g);
        if (err) {
            nereid_request_free(req);
            c->gen = NULL;
            inflight_end(srv);
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
