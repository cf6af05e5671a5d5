/*
 * This file contains the gRPC inference RPCs. ModelInfer is finished by the
 * backend thread that completes the request. ModelStreamInfer is a small
 * state machine per stream: one read at a time, many requests in flight,
 * responses through a write queue (one SEND_MESSAGE in flight), errors as
 * stream messages, and a reference count over outstanding gRPC operations
 * and inferences so a cancelled stream is freed only when everything that
 * points at it has finished.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "grpc/grpc_hooks.h"
#include "grpc/grpc_internal.h"
#include "grpc/infer_codec.h"

/* ---- ModelInfer --------------------------------------------------------- */

typedef struct unary_infer {
    gfe_unary_call_t *call;
    Inference__ModelInferRequest *msg;
    infer_scratch_t scratch;
} unary_infer_t;

static void unary_infer_free(unary_infer_t *u)
{
    if (u->msg != NULL) inference__model_infer_request__free_unpacked(u->msg, NULL);
    infer_scratch_free(&u->scratch);
    free(u);
}

static void unary_infer_done(nereid_response_t *resp, void *userp)
{
    unary_infer_t *u = userp;
    gfe_unary_call_t *c = u->call;
    gfe_hooks_infer_complete(c);
    unary_infer_free(u); /* input memory is no longer used */
    mem_trim_note(c->fe->mem_trim);
    const nereid_error_t *rerr = nereid_response_error(resp);
    if (c->trace && rerr == NULL) c->response_ns = nereid_trace_now_ns();
    if (rerr != NULL) {
        gfe_unary_finish_status(c, gfe_status_from_error(rerr), nereid_error_message(rerr), NULL);
        nereid_response_free(resp);
        return;
    }
    nereid_error_t *err;
    grpc_byte_buffer *bb = infer_codec_response(resp, false, &err);
    if (bb == NULL)
        gfe_unary_finish_error(c, err);
    else
        gfe_unary_finish(c, bb);
}

/* Nereid extension: the sequence id and flags from the call's metadata
 * (docs/deploy.md); the id is echoed in the initial metadata. */
static nereid_error_t *seq_metadata(gfe_unary_call_t *c, nereid_request_t *req)
{
    static const char *const names[3] = {"nereid-sequence-id", "nereid-sequence-start",
                                         "nereid-sequence-end"};
    char *v[3] = {NULL, NULL, NULL};
    const grpc_metadata_array *md = &c->request_md;
    for (size_t i = 0; i < md->count; i++)
        for (int k = 0; k < 3; k++)
            if (v[k] == NULL && grpc_slice_str_cmp(md->metadata[i].key, names[k]) == 0)
                v[k] = grpc_slice_to_c_string(md->metadata[i].value);
    char echo[132];
    nereid_error_t *err =
        nereid_request_sequence_headers(req, names, v[0], v[1], v[2], echo, sizeof echo);
    for (int k = 0; k < 3; k++)
        gpr_free(v[k]);
    if (err == NULL && echo[0] && c->n_reply_md == 0) {
        c->reply_md[0].key = grpc_slice_from_static_string(names[0]);
        c->reply_md[0].value = grpc_slice_from_copied_string(echo);
        c->n_reply_md = 1;
    }
    return err;
}

/* Samples a trace (W3C traceparent/tracestate from the call's metadata). */
static void start_trace(gfe_unary_call_t *c, const char *model, nereid_request_t *req)
{
    char *v[2] = {NULL, NULL};
    static const char *const keys[2] = {"traceparent", "tracestate"};
    const grpc_metadata_array *md = &c->request_md;
    for (size_t i = 0; i < md->count; i++)
        for (int k = 0; k < 2; k++)
            if (v[k] == NULL && grpc_slice_str_cmp(md->metadata[i].key, keys[k]) == 0)
                v[k] = grpc_slice_to_c_string(md->metadata[i].value);
    c->trace = nereid_server_trace_start(c->fe->server, model, v[0], v[1]);
    for (int k = 0; k < 2; k++)
        gpr_free(v[k]);
    if (c->trace) nereid_request_set_trace(req, c->trace);
}

/* The call's deadline (the client's grpc-timeout) becomes the request's
 * timeout, as the "timeout" parameter does (the earlier of the two wins):
 * the request leaves any queue by it and fails with the timed-out error,
 * counted with reason REJECTED, even while every instance is busy. A
 * deadline already past leaves 1 µs. Nereid extension: Triton leaves such a
 * request queued (#7532). */
static void apply_deadline(const gfe_unary_call_t *c, const Inference__ModelInferRequest *msg,
                           nereid_request_t *req)
{
    gpr_timespec dl = gpr_convert_clock_type(c->deadline, GPR_CLOCK_MONOTONIC);
    if (gpr_time_cmp(dl, gpr_inf_future(GPR_CLOCK_MONOTONIC)) >= 0) return; /* none */
    gpr_timespec left = gpr_time_sub(dl, gpr_now(GPR_CLOCK_MONOTONIC));
    if (left.tv_sec > 100LL * 365 * 86400) return; /* as good as none */
    int64_t us = left.tv_sec < 0 ? 0 : (int64_t)left.tv_sec * 1000000 + left.tv_nsec / 1000;
    if (us < 1) us = 1;
    for (size_t i = 0; i < msg->n_parameters; i++) {
        const Inference__InferParameter *p = msg->parameters[i]->value;
        if (strcmp(msg->parameters[i]->key, "timeout") == 0 && p != NULL &&
            p->parameter_choice_case == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM &&
            p->int64_param > 0 && p->int64_param <= us)
            return; /* the parameter's is earlier */
    }
    nereid_request_set_timeout_us(req, (uint64_t)us);
}

/* Triton checks the model's transaction policy first (after the version):
 * unary ModelInfer cannot carry a decoupled model's responses. */
static nereid_error_t *refuse_decoupled(nereid_server_t *server,
                                        const Inference__ModelInferRequest *msg)
{
    int64_t version;
    bool decoupled;
    nereid_error_t *err = infer_codec_version(msg->model_version, &version);
    if (err == NULL)
        err = nereid_server_model_decoupled(server, msg->model_name, version, &decoupled);
    if (err == NULL && decoupled)
        err = nereid_error_new(NEREID_ERROR_UNSUPPORTED,
                               "ModelInfer RPC doesn't support models with decoupled "
                               "transaction policy");
    return err;
}

void gfe_model_infer(gfe_unary_call_t *c, const uint8_t *data, size_t len)
{
    unary_infer_t *u = calloc(1, sizeof(*u));
    if (u == NULL) {
        gfe_unary_finish_status(c, GRPC_STATUS_INTERNAL, "out of memory", NULL);
        return;
    }
    u->call = c;
    nereid_error_t *err;
    nereid_request_t *req = NULL;
    u->msg = infer_codec_parse(data, len, &err);
    u->scratch.shm = c->fe->shm;
    if (u->msg != NULL) err = refuse_decoupled(c->fe->server, u->msg);
    if (err == NULL) err = infer_codec_request(c->fe->server, u->msg, &u->scratch, &req);
    if (err == NULL &&
        ((err = seq_metadata(c, req)) != NULL ||
         (err = gfe_forward_headers(c->fe, c->request_md.metadata, c->request_md.count, req))))
        nereid_request_free(req);
    if (err == NULL && nereid_server_tracing(c->fe->server)) {
        /* A call posted while tracing was off has no wait start: its
         * arrival stands for both. */
        if (c->waitread_start_ns == 0)
            c->waitread_start_ns = c->waitread_end_ns = nereid_trace_now_ns();
        start_trace(c, u->msg->model_name, req);
    }
    if (err == NULL) {
        apply_deadline(c, u->msg, req);
        /* Triton cancels the inference when the client cancels the call. */
        nereid_cancel_token_t *token = nereid_cancel_token_new();
        nereid_request_set_cancel_token(req, token);
        gfe_unary_watch_close(c, token);
        nereid_response_allocator_t alloc;
        /* The reply's slices hold the response until sent: outputs may be
         * views of a backend's memory, unless they go to shared memory. */
        nereid_request_set_output_views(req, u->scratch.shm_use == NULL);
        err = nereid_server_infer_async(
            c->fe->server, req, infer_codec_allocator(&u->scratch, &alloc), unary_infer_done, u);
        if (err == NULL) return; /* unary_infer_done finishes the call */
        nereid_request_free(req);
    }
    unary_infer_free(u);
    gfe_unary_finish_error(c, err);
}

/* ---- ModelStreamInfer --------------------------------------------------- */

typedef struct stream_write {
    struct stream_write *next;
    grpc_byte_buffer *bb;
} stream_write_t;

/* The place of one non-decoupled request's reply in the stream: Triton
 * answers those in the order it read them (decoupled models' responses go
 * out as they come). */
typedef struct stream_slot {
    struct stream_slot *next;
    bool ready;           /* the reply is known */
    grpc_byte_buffer *bb; /* the reply, or NULL when there is none to send */
} stream_slot_t;

typedef struct gfe_stream {
    grpc_frontend_t *fe;
    grpc_call *call;
    pthread_mutex_t mu;
    int refs; /* outstanding gRPC batches + inferences in flight */
    gfe_tag_t read_tag, write_tag, close_tag, status_tag;
    grpc_byte_buffer *recv;
    bool reading;     /* a RECV_MESSAGE is outstanding */
    bool read_closed; /* the client half-closed, or reading stopped */
    bool writing;     /* a SEND_MESSAGE is outstanding */
    grpc_byte_buffer *in_write;
    stream_write_t *head, *tail;
    size_t n_writes;                        /* replies queued or being written */
    pthread_cond_t room;                    /* n_writes went down, or nothing more is sent */
    stream_slot_t *order_head, *order_tail; /* non-decoupled replies, in request order */
    bool md_sent;                           /* initial metadata went with an earlier batch */
    bool status_started;                    /* the final status is on its way */
    bool dead;                              /* cancelled or broken: nothing more is sent */
    int cancelled;                          /* from RECV_CLOSE_ON_SERVER */
    nereid_cancel_token_t *cancel;          /* every request of the stream carries it */
    size_t n_inflight;
    bool error_closes; /* client metadata triton_grpc_error: true */
    bool failing;      /* an error closes the stream once writes drain */
    grpc_status_code fail_code;
    grpc_slice status_details;
    grpc_metadata *forward; /* the call's metadata that --grpc-header-forward-pattern matches */
    size_t n_forward;
    char *traceparent, *tracestate; /* W3C trace context of the call (gpr_malloc'ed), or NULL */
    struct gfe_stream *prev, *next; /* fe->streams, under fe->mu */
    bool draining;                  /* the server exits: end once nothing is open */
    uint64_t *open_seqs;            /* sequences started here and not ended (seq_key) */
    size_t n_open_seqs;
    uint64_t log_id; /* Triton's state id in the handler log lines (grpc_hooks.h) */
} gfe_stream_t;

/* Open sequences a stream remembers at most (more are not kept open by a
 * drain). */
#define STREAM_MAX_OPEN_SEQS 1024

typedef struct stream_infer {
    gfe_stream_t *s;
    Inference__ModelInferRequest *msg;
    infer_scratch_t scratch;
    stream_slot_t *slot;   /* non-decoupled: where the reply goes, else NULL */
    bool empty_final;      /* triton_enable_empty_final_response: true */
    nereid_trace_t *trace; /* sampled for tracing: the frontend's reference, or NULL */
} stream_infer_t;

static void stream_destroy(gfe_stream_t *s)
{
    grpc_frontend_t *fe = s->fe;
    /* Unlinked first: gfe_streams_drain_locked may still lock s->mu (it
     * sees refs == 0 and leaves s alone). */
    pthread_mutex_lock(&fe->mu);
    if (s->prev != NULL)
        s->prev->next = s->next;
    else
        fe->streams = s->next;
    if (s->next != NULL) s->next->prev = s->prev;
    fe->n_calls--;
    pthread_mutex_unlock(&fe->mu);
    for (stream_write_t *w = s->head, *next; w != NULL; w = next) {
        next = w->next;
        grpc_byte_buffer_destroy(w->bb);
        free(w);
    }
    for (stream_slot_t *o = s->order_head, *next; o != NULL; o = next) {
        next = o->next;
        if (o->bb != NULL) grpc_byte_buffer_destroy(o->bb);
        free(o);
    }
    if (s->recv != NULL) grpc_byte_buffer_destroy(s->recv);
    if (s->in_write != NULL) grpc_byte_buffer_destroy(s->in_write);
    grpc_slice_unref(s->status_details);
    nereid_cancel_token_free(s->cancel);
    for (size_t i = 0; i < s->n_forward; i++) {
        grpc_slice_unref(s->forward[i].key);
        grpc_slice_unref(s->forward[i].value);
    }
    free(s->forward);
    gpr_free(s->traceparent);
    gpr_free(s->tracestate);
    free(s->open_seqs);
    grpc_call_unref(s->call);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->room);
    free(s);
    gfe_live_release(fe);
}

/* Drops one reference; returns true when the caller must destroy s (after
 * unlocking). Called with s->mu held. */
static bool stream_unref_locked(gfe_stream_t *s)
{
    return --s->refs == 0;
}

static void stream_drop_queue_locked(gfe_stream_t *s)
{
    for (stream_write_t *w = s->head, *next; w != NULL; w = next) {
        next = w->next;
        grpc_byte_buffer_destroy(w->bb);
        free(w);
    }
    s->head = s->tail = NULL;
    s->n_writes = s->in_write != NULL;
    pthread_cond_broadcast(&s->room);
}

/* Triton's --grpc-max-response-pool-size: a decoupled response waits while
 * the stream already has that many replies queued or being written (the
 * model is held back, as Triton's response queue holds back its callback),
 * until a write completes or nothing more can be sent. A completion-queue
 * thread never waits: it is the one that completes writes. Called with
 * s->mu held. */
static void stream_wait_room_locked(gfe_stream_t *s)
{
    if (gfe_on_queue_thread) return;
    while (s->n_writes >= s->fe->max_response_pool && !s->status_started && !s->dead)
        pthread_cond_wait(&s->room, &s->mu);
}

static void stream_start_read_locked(gfe_stream_t *s)
{
    if (s->reading || s->read_closed || s->status_started || s->dead) return;
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &s->recv;
    s->reading = true;
    s->refs++;
    if (gfe_start_batch(s->call, &op, 1, &s->read_tag) != GRPC_CALL_OK) {
        s->reading = false;
        s->read_closed = true;
        s->refs--;
    }
}

static void stream_pump_writes_locked(gfe_stream_t *s)
{
    if (s->writing || s->head == NULL || s->status_started || s->dead) return;
    stream_write_t *w = s->head;
    s->head = w->next;
    if (s->head == NULL) s->tail = NULL;
    s->in_write = w->bb;
    free(w);
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof(ops));
    if (!s->md_sent) {
        gfe_set_infer_compression(s->fe, true, &ops[n]);
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        s->md_sent = true;
    }
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = s->in_write;
    n++;
    s->writing = true;
    s->refs++;
    if (gfe_start_batch(s->call, ops, n, &s->write_tag) != GRPC_CALL_OK) {
        s->writing = false;
        s->refs--;
        s->dead = true;
        grpc_byte_buffer_destroy(s->in_write);
        s->in_write = NULL;
        stream_drop_queue_locked(s);
    }
}

/* Sends the final status once nothing more can be written: the client
 * half-closed and every request answered, or an error closes the stream. */
static void stream_maybe_finish_locked(gfe_stream_t *s)
{
    if (s->status_started || s->dead || s->writing || s->head != NULL) return;
    bool done = s->failing || (s->read_closed && !s->reading && s->n_inflight == 0) ||
                (s->draining && s->n_inflight == 0 && s->n_open_seqs == 0);
    if (!done) return;
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof(ops));
    if (!s->md_sent) {
        gfe_set_infer_compression(s->fe, true, &ops[n]);
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        s->md_sent = true;
    }
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = s->failing ? s->fail_code : GRPC_STATUS_OK;
    ops[n].data.send_status_from_server.status_details = s->failing ? &s->status_details : NULL;
    n++;
    s->status_started = true;
    pthread_cond_broadcast(&s->room);
    s->refs++;
    if (gfe_start_batch(s->call, ops, n, &s->status_tag) != GRPC_CALL_OK) s->refs--;
}

/* Queues a reply (takes bb); called with s->mu held. */
static void stream_enqueue_locked(gfe_stream_t *s, grpc_byte_buffer *bb)
{
    stream_write_t *w = s->status_started || s->dead ? NULL : malloc(sizeof(*w));
    if (w == NULL) {
        grpc_byte_buffer_destroy(bb);
        return;
    }
    w->bb = bb;
    w->next = NULL;
    if (s->tail != NULL)
        s->tail->next = w;
    else
        s->head = w;
    s->tail = w;
    s->n_writes++;
    stream_pump_writes_locked(s);
}

/* Appends a slot for the next non-decoupled request (NULL when out of
 * memory: its reply then goes out when it comes). Called with s->mu held. */
static stream_slot_t *stream_slot_add_locked(gfe_stream_t *s)
{
    stream_slot_t *o = calloc(1, sizeof(*o));
    if (o == NULL) return NULL;
    if (s->order_tail != NULL)
        s->order_tail->next = o;
    else
        s->order_head = o;
    s->order_tail = o;
    return o;
}

/* Queues a reply (takes bb, which may be NULL for none): into its slot when
 * it has one, then every ready reply at the head of the order goes out;
 * straight to the writes otherwise. Called with s->mu held. */
static void stream_reply_locked(gfe_stream_t *s, stream_slot_t *slot, grpc_byte_buffer *bb)
{
    if (slot == NULL) {
        if (bb != NULL) stream_enqueue_locked(s, bb);
        return;
    }
    slot->bb = bb;
    slot->ready = true;
    while (s->order_head != NULL && s->order_head->ready) {
        stream_slot_t *o = s->order_head;
        s->order_head = o->next;
        if (s->order_head == NULL) s->order_tail = NULL;
        if (o->bb != NULL) stream_enqueue_locked(s, o->bb);
        free(o);
    }
}

/* An error for one request: a message on the stream (in its slot, if any),
 * or (with triton_grpc_error) the stream's final status. Called with s->mu
 * held. */
static void stream_error_locked(gfe_stream_t *s, stream_slot_t *slot, grpc_status_code code,
                                const char *message, const char *id, const char *model,
                                const char *version, int final)
{
    if (s->error_closes) {
        if (!s->failing) {
            s->failing = true;
            s->fail_code = code;
            grpc_slice_unref(s->status_details);
            s->status_details = grpc_slice_from_copied_string(message);
        }
        stream_reply_locked(s, slot, NULL);
        return;
    }
    stream_reply_locked(s, slot, infer_codec_stream_error(message, id, model, version, final));
}

static void stream_infer_free(stream_infer_t *si)
{
    if (si->trace) {
        uint64_t now = nereid_trace_now_ns();
        nereid_trace_timestamp(si->trace, "GRPC_SEND_START", now);
        nereid_trace_timestamp(si->trace, "GRPC_SEND_END", now);
        nereid_trace_release(si->trace);
    }
    if (si->msg != NULL) inference__model_infer_request__free_unpacked(si->msg, NULL);
    infer_scratch_free(&si->scratch);
    free(si);
}

/* One response of a streamed request (a decoupled model may send several,
 * and a final flag without a response). The request's memory (si) lives
 * until the final one. */
static void stream_infer_response(nereid_response_t *resp, uint32_t flags, void *userp)
{
    stream_infer_t *si = userp;
    gfe_stream_t *s = si->s;
    stream_slot_t *slot = si->slot;
    bool final = (flags & NEREID_RESPONSE_FINAL) != 0;
    if (final) mem_trim_note(s->fe->mem_trim);
    pthread_mutex_lock(&s->mu);
    if (slot == NULL && resp != NULL) stream_wait_room_locked(s);
    bool drop = s->status_started || s->dead;
    pthread_mutex_unlock(&s->mu);

    grpc_byte_buffer *bb = NULL;
    grpc_status_code code = GRPC_STATUS_OK;
    char *message = NULL, *id = NULL, *model = NULL, *version = NULL;
    const nereid_error_t *rerr = resp != NULL ? nereid_response_error(resp) : NULL;
    if (drop) {
        nereid_response_free(resp);
    } else if (resp == NULL) {
        /* Only the final flag: Triton sends an empty response (the request's
         * id, model name and version) only to a client that asked for it. */
        if (si->empty_final)
            bb = infer_codec_stream_error("", si->msg->id, si->msg->model_name,
                                          si->msg->model_version, 1);
    } else if (rerr != NULL) {
        /* Triton names a failed response after the request: its id, model
         * name and model version as the client wrote them. */
        code = gfe_status_from_error(rerr);
        message = strdup(nereid_error_message(rerr));
        id = strdup(si->msg->id);
        model = strdup(si->msg->model_name);
        version = strdup(si->msg->model_version);
        nereid_response_free(resp);
    } else {
        nereid_error_t *err;
        bb = infer_codec_stream_response(resp, final, &err);
        if (bb == NULL) {
            code = gfe_status_from_error(err);
            message = strdup(nereid_error_message(err));
            nereid_error_free(err);
        }
    }
    if (final) stream_infer_free(si); /* input memory is no longer used */

    pthread_mutex_lock(&s->mu);
    if (code != GRPC_STATUS_OK)
        stream_error_locked(s, slot, code, message != NULL ? message : "out of memory", id, model,
                            version, final);
    else if (bb != NULL || final)
        stream_reply_locked(s, final ? slot : NULL, bb);
    bool destroy = false;
    if (final) s->n_inflight--;
    /* An error closes a triton_grpc_error stream now, final flag or not:
     * a decoupled model may send its final flag much later, or never. */
    stream_maybe_finish_locked(s);
    if (final) destroy = stream_unref_locked(s);
    pthread_mutex_unlock(&s->mu);
    free(message);
    free(id);
    free(model);
    free(version);
    if (destroy) stream_destroy(s);
}

/* The request parameter triton_enable_empty_final_response (the codec has
 * checked that it is a bool). */
static bool empty_final_asked(const Inference__ModelInferRequest *msg)
{
    for (size_t i = 0; i < msg->n_parameters; i++)
        if (strcmp(msg->parameters[i]->key, "triton_enable_empty_final_response") == 0)
            return msg->parameters[i]->value != NULL && msg->parameters[i]->value->bool_param;
    return false;
}

/* The sequence of a streamed request: 0 for none, else a key for its id
 * (an int64 id as is, a string id hashed with the top bit set); *start and
 * *end its flags. */
static uint64_t seq_key(const Inference__ModelInferRequest *msg, bool *start, bool *end)
{
    uint64_t key = 0;
    *start = *end = false;
    for (size_t i = 0; i < msg->n_parameters; i++) {
        const char *k = msg->parameters[i]->key;
        const Inference__InferParameter *v = msg->parameters[i]->value;
        if (v == NULL) continue;
        if (strcmp(k, "sequence_start") == 0) {
            *start = v->bool_param != 0;
        } else if (strcmp(k, "sequence_end") == 0) {
            *end = v->bool_param != 0;
        } else if (strcmp(k, "sequence_id") == 0) {
            if (v->parameter_choice_case ==
                INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM)
                key = (uint64_t)v->int64_param & ~(1ull << 63);
            else if (v->parameter_choice_case ==
                         INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM &&
                     v->string_param != NULL && v->string_param[0] != '\0') {
                uint64_t h = 1469598103934665603ull; /* FNV-1a */
                for (const char *c = v->string_param; *c; c++)
                    h = (h ^ (unsigned char)*c) * 1099511628211ull;
                key = h | (1ull << 63);
            }
        }
    }
    return key;
}

static bool seq_open_locked(const gfe_stream_t *s, uint64_t key)
{
    for (size_t i = 0; i < s->n_open_seqs; i++)
        if (s->open_seqs[i] == key) return true;
    return false;
}

/* Records that the request keyed key starts and/or ends its sequence. */
static void seq_track_locked(gfe_stream_t *s, uint64_t key, bool start, bool end)
{
    if (key == 0) return;
    for (size_t i = 0; i < s->n_open_seqs; i++)
        if (s->open_seqs[i] == key) {
            if (end) s->open_seqs[i] = s->open_seqs[--s->n_open_seqs];
            return;
        }
    if (!start || end || s->n_open_seqs >= STREAM_MAX_OPEN_SEQS) return;
    if ((s->n_open_seqs & (s->n_open_seqs - 1)) == 0) { /* 0, 1, 2, 4...: grow */
        uint64_t *grown =
            realloc(s->open_seqs, (s->n_open_seqs ? 2 * s->n_open_seqs : 1) * sizeof *grown);
        if (grown == NULL) return;
        s->open_seqs = grown;
    }
    s->open_seqs[s->n_open_seqs++] = key;
}

void gfe_streams_drain_locked(grpc_frontend_t *fe)
{
    for (gfe_stream_t *s = fe->streams; s != NULL; s = s->next) {
        pthread_mutex_lock(&s->mu);
        s->draining = true;
        if (s->refs > 0) stream_maybe_finish_locked(s);
        pthread_mutex_unlock(&s->mu);
    }
}

/* Submits one request read from the stream. Called without s->mu. */
static void stream_handle(gfe_stream_t *s, grpc_byte_buffer *bb)
{
    grpc_slice body = gfe_buffer_read(bb);
    nereid_error_t *err;
    nereid_request_t *req = NULL;
    stream_infer_t *si = calloc(1, sizeof(*si));
    if (si == NULL) {
        grpc_slice_unref(body);
        pthread_mutex_lock(&s->mu);
        stream_error_locked(s, NULL, GRPC_STATUS_INTERNAL, "out of memory", NULL, NULL, NULL, -1);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    si->s = s;
    si->msg = infer_codec_parse(GRPC_SLICE_START_PTR(body), GRPC_SLICE_LENGTH(body), &err);
    grpc_slice_unref(body);
    /* Like Triton, a request whose model is not known to be decoupled (its
     * lookup failed too) is answered in its place in the order. */
    bool decoupled = false;
    int64_t version;
    nereid_error_t *lookup_err = NULL;
    if (si->msg != NULL &&
        (lookup_err = infer_codec_version(si->msg->model_version, &version)) == NULL)
        lookup_err =
            nereid_server_model_decoupled(s->fe->server, si->msg->model_name, version, &decoupled);
    nereid_error_free(lookup_err);
    if (!decoupled) {
        pthread_mutex_lock(&s->mu);
        si->slot = stream_slot_add_locked(s);
        pthread_mutex_unlock(&s->mu);
    }
    si->scratch.shm = s->fe->shm;
    if (si->msg != NULL) {
        bool start, end;
        uint64_t key = seq_key(si->msg, &start, &end);
        pthread_mutex_lock(&s->mu);
        /* Draining: only the rest of a sequence this stream started. */
        if (s->draining && (key == 0 || start || !seq_open_locked(s, key)))
            err = nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                                   "GRPC server is shutting down and has stopped accepting new "
                                   "requests.");
        else
            seq_track_locked(s, key, start, end);
        pthread_mutex_unlock(&s->mu);
    }
    if (si->msg != NULL && err == NULL)
        err = infer_codec_request(s->fe->server, si->msg, &si->scratch, &req);
    if (err == NULL && (err = gfe_forward_headers(s->fe, s->forward, s->n_forward, req)) != NULL)
        nereid_request_free(req);
    if (err == NULL) {
        si->empty_final = empty_final_asked(si->msg);
        nereid_request_set_cancel_token(req, s->cancel);
        /* Each request of a stream is sampled as Triton samples them. */
        si->trace = nereid_server_trace_start(s->fe->server, si->msg->model_name, s->traceparent,
                                              s->tracestate);
        if (si->trace) {
            uint64_t now = nereid_trace_now_ns();
            nereid_trace_timestamp(si->trace, "GRPC_WAITREAD_START", now);
            nereid_trace_timestamp(si->trace, "GRPC_WAITREAD_END", now);
            nereid_request_set_trace(req, si->trace);
        }
        pthread_mutex_lock(&s->mu);
        s->n_inflight++;
        s->refs++;
        pthread_mutex_unlock(&s->mu);
        nereid_response_allocator_t alloc;
        nereid_request_set_output_views(req, si->scratch.shm_use == NULL);
        err = nereid_server_infer_stream(s->fe->server, req,
                                         infer_codec_allocator(&si->scratch, &alloc),
                                         stream_infer_response, si);
        if (err == NULL) return;
        nereid_request_free(req);
        pthread_mutex_lock(&s->mu);
        s->n_inflight--;
        s->refs--; /* the read in progress still holds s */
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_lock(&s->mu);
    stream_error_locked(s, si->slot, gfe_status_from_error(err), nereid_error_message(err),
                        si->msg != NULL ? si->msg->id : NULL, NULL, NULL, -1);
    pthread_mutex_unlock(&s->mu);
    nereid_error_free(err);
    stream_infer_free(si);
}

static void stream_read_done(gfe_tag_t *tag, bool ok)
{
    gfe_stream_t *s = GFE_CONTAINER_OF(tag, gfe_stream_t, read_tag);
    pthread_mutex_lock(&s->mu);
    grpc_byte_buffer *bb = s->recv;
    s->recv = NULL;
    if (!ok || bb == NULL) { /* NULL message: the client half-closed */
        /* Triton releases the state that waited for the next request */
        if (!s->read_closed)
            gfe_hooks_log(s->fe->server, 2, "StateRelease, %" PRIu64 " Step %s", s->log_id,
                          ok ? "FINISH" : "CANCELLED");
        s->read_closed = true;
    }
    bool skip = s->status_started || s->dead;
    pthread_mutex_unlock(&s->mu);

    if (bb != NULL) {
        if (!skip) stream_handle(s, bb);
        grpc_byte_buffer_destroy(bb);
    }

    pthread_mutex_lock(&s->mu);
    s->reading = false;
    stream_start_read_locked(s);
    stream_maybe_finish_locked(s);
    bool destroy = stream_unref_locked(s);
    pthread_mutex_unlock(&s->mu);
    if (destroy) stream_destroy(s);
}

static void stream_write_done(gfe_tag_t *tag, bool ok)
{
    gfe_stream_t *s = GFE_CONTAINER_OF(tag, gfe_stream_t, write_tag);
    pthread_mutex_lock(&s->mu);
    s->writing = false;
    grpc_byte_buffer_destroy(s->in_write);
    s->in_write = NULL;
    s->n_writes--;
    pthread_cond_broadcast(&s->room);
    if (!ok) {
        s->dead = true;
        stream_drop_queue_locked(s);
    }
    stream_pump_writes_locked(s);
    stream_maybe_finish_locked(s);
    bool destroy = stream_unref_locked(s);
    pthread_mutex_unlock(&s->mu);
    if (destroy) stream_destroy(s);
}

static void stream_close_done(gfe_tag_t *tag, bool ok)
{
    gfe_stream_t *s = GFE_CONTAINER_OF(tag, gfe_stream_t, close_tag);
    gfe_hook_delay(GFE_HOOK_NOTIFICATION);
    if (s->cancelled)
        gfe_hooks_log(s->fe->server, 1,
                      "Cancellation notification received for ModelStreamInferHandler, "
                      "rpc_ok=%d, context %" PRIu64 " step ISSUED, state %" PRIu64 " step ISSUED",
                      ok ? 1 : 0, s->log_id, s->log_id);
    pthread_mutex_lock(&s->mu);
    if (s->cancelled || !s->status_started) {
        s->dead = true;
        stream_drop_queue_locked(s);
        /* The stream ended (cancelled or broken) with requests in flight:
         * Triton cancels them. */
        nereid_request_cancel(s->cancel);
    }
    bool destroy = stream_unref_locked(s);
    pthread_mutex_unlock(&s->mu);
    if (destroy) stream_destroy(s);
}

static void stream_status_done(gfe_tag_t *tag, bool ok)
{
    (void)ok;
    gfe_stream_t *s = GFE_CONTAINER_OF(tag, gfe_stream_t, status_tag);
    pthread_mutex_lock(&s->mu);
    bool destroy = stream_unref_locked(s);
    pthread_mutex_unlock(&s->mu);
    if (destroy) stream_destroy(s);
}

static bool metadata_true(const grpc_metadata_array *md, const char *key)
{
    for (size_t i = 0; i < md->count; i++) {
        const grpc_slice k = md->metadata[i].key, v = md->metadata[i].value;
        if (GRPC_SLICE_LENGTH(k) == strlen(key) &&
            memcmp(GRPC_SLICE_START_PTR(k), key, strlen(key)) == 0)
            return GRPC_SLICE_LENGTH(v) == 4 && memcmp(GRPC_SLICE_START_PTR(v), "true", 4) == 0;
    }
    return false;
}

void gfe_stream_start(grpc_frontend_t *fe, grpc_call *call, grpc_metadata_array *request_md)
{
    gfe_stream_t *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        grpc_call_cancel(call, NULL);
        grpc_call_unref(call);
        return;
    }
    s->fe = fe;
    s->call = call;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->room, NULL);
    s->read_tag.fn = stream_read_done;
    s->write_tag.fn = stream_write_done;
    s->close_tag.fn = stream_close_done;
    s->status_tag.fn = stream_status_done;
    s->status_details = grpc_empty_slice();
    s->error_closes = metadata_true(request_md, "triton_grpc_error");
    s->cancel = nereid_cancel_token_new();
    s->log_id = gfe_hooks_next_id();
    for (size_t i = 0; i < request_md->count; i++) {
        const grpc_metadata *md = &request_md->metadata[i];
        if (s->traceparent == NULL && grpc_slice_str_cmp(md->key, "traceparent") == 0)
            s->traceparent = grpc_slice_to_c_string(md->value);
        else if (s->tracestate == NULL && grpc_slice_str_cmp(md->key, "tracestate") == 0)
            s->tracestate = grpc_slice_to_c_string(md->value);
    }
    /* Keep what forwarding needs: the call's metadata array goes with the
     * call object that handed the stream over. */
    for (size_t i = 0; fe->header_forward && i < request_md->count; i++) {
        const grpc_metadata *md = &request_md->metadata[i];
        if (!header_forward_match(fe->header_forward, (const char *)GRPC_SLICE_START_PTR(md->key),
                                  GRPC_SLICE_LENGTH(md->key)))
            continue;
        grpc_metadata *grown = realloc(s->forward, (s->n_forward + 1) * sizeof *grown);
        if (grown == NULL) break;
        s->forward = grown;
        s->forward[s->n_forward++] =
            (grpc_metadata){.key = grpc_slice_ref(md->key), .value = grpc_slice_ref(md->value)};
    }
    gfe_live_add(fe);
    pthread_mutex_lock(&fe->mu);
    s->next = fe->streams;
    if (s->next != NULL) s->next->prev = s;
    fe->streams = s;
    fe->n_calls++;
    s->draining = fe->draining;
    pthread_mutex_unlock(&fe->mu);

    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &s->cancelled;
    pthread_mutex_lock(&s->mu);
    s->refs = 1; /* held until the end of this function */
    s->refs++;
    if (gfe_start_batch(call, &op, 1, &s->close_tag) != GRPC_CALL_OK) {
        s->refs--;
        s->dead = true;
    }
    stream_start_read_locked(s);
    if (atomic_load(&fe->stopping)) grpc_call_cancel(call, NULL);
    bool destroy = stream_unref_locked(s);
    pthread_mutex_unlock(&s->mu);
    if (destroy) stream_destroy(s);
}
