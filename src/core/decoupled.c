/*
 * This file contains decoupled responses (Triton's decoupled transaction
 * policy): nereid_server_infer_stream, which lets a client take 0..N
 * responses per request, and the backend's response sender (backend.h ABI
 * 1.1), which sends them from any thread, also after execute returned.
 *
 * A streamed request's completion callback is stream_final below: the
 * request's one regular completion becomes its FINAL response, so requests
 * that no sender touches (every model that is not decoupled, and decoupled
 * backends that answer the 1.0 way) take the usual path unchanged. A sender
 * builds its responses apart from req->response (the scheduler may still read
 * that one while a backend thread sends), delivers each non-final one itself,
 * and finishes the request through request_finish at its final flag, or at
 * the scheduler's release after execute if that comes later.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "core/decoupled.h"
#include "core/repository.h"
#include "core/server_internal.h"
#include "core/stats.h"
#include "core/trace.h"
#include "core/util.h"

typedef struct stream_ctx {
    nereid_response_fn fn;
    void *userp;
    nereid_response_sender_t *sender; /* taken during execute, or NULL */
    bool flags_only;                  /* the final carries no response */
} stream_ctx_t;

struct nereid_response_sender {
    pthread_mutex_t mu; /* executing, final_sent */
    nereid_request_t *req;
    stream_ctx_t *ctx;
    bool executing;             /* the scheduler has not released the request yet */
    bool final_sent;            /* FINAL sent; finish when released */
    nereid_response_t *pending; /* the next response, once an output is allocated */
    nereid_response_t *final_resp;
    uint64_t index;       /* response_stats key of the next response */
    uint64_t t_start_ns;  /* previous send, or the execution start */
    uint64_t t_output_ns; /* first output of the pending response, 0 = none */
    void **scratch;       /* buffers for outputs nobody asked for */
    size_t n_scratch;
};

bool model_is_decoupled(const model_t *m)
{
    const model_config_t *c = m->config;
    return c->model_transaction_policy && c->model_transaction_policy->decoupled;
}

bool nereid_model_decoupled(const nereid_model_t *model)
{
    return model_is_decoupled((const model_t *)model);
}

/* ---- The client side ---- */

static void stream_final(nereid_response_t *resp, void *userp)
{
    stream_ctx_t *ctx = userp;
    nereid_response_fn fn = ctx->fn;
    void *fn_userp = ctx->userp;
    bool flags_only = ctx->flags_only;
    free(ctx);
    if (flags_only) {
        nereid_response_free(resp);
        resp = NULL;
    }
    fn(resp, NEREID_RESPONSE_FINAL, fn_userp);
}

/* Submits req with stream_final as its completion: to the held model m
 * (an ensemble step), or else through the server's model lookup. */
static nereid_error_t *submit_streamed(nereid_server_t *server, model_t *m, nereid_request_t *req,
                                       const nereid_response_allocator_t *allocator,
                                       nereid_response_fn fn, void *userp)
{
    if (!fn) return nereid_error_new(NEREID_ERROR_INVALID_ARG, "request and callback are required");
    stream_ctx_t *ctx = xcalloc(1, sizeof *ctx);
    ctx->fn = fn;
    ctx->userp = userp;
    nereid_error_t *err = m ? server_infer_held(m, req, allocator, stream_final, ctx)
                            : nereid_server_infer_async(server, req, allocator, stream_final, ctx);
    if (err) free(ctx);
    return err;
}

nereid_error_t *nereid_server_infer_stream(nereid_server_t *server, nereid_request_t *req,
                                           const nereid_response_allocator_t *allocator,
                                           nereid_response_fn fn, void *userp)
{
    return submit_streamed(server, NULL, req, allocator, fn, userp);
}

nereid_error_t *server_infer_held_stream(model_t *m, nereid_request_t *req,
                                         const nereid_response_allocator_t *allocator,
                                         nereid_response_fn fn, void *userp)
{
    return submit_streamed(m->server, m, req, allocator, fn, userp);
}

bool request_is_streamed(const nereid_request_t *req)
{
    return req->done_fn == stream_final;
}

bool request_send_response(nereid_request_t *req, nereid_response_t *resp)
{
    if (!request_is_streamed(req)) {
        nereid_response_free(resp);
        return false;
    }
    stream_ctx_t *ctx = req->done_userp;
    response_compact(resp);
    if (req->trace) trace_response_outputs(req->trace, resp);
    model_ref(req->model);
    resp->model = req->model;
    request_first_response(req);
    ctx->fn(resp, 0, ctx->userp);
    return true;
}

void request_set_streamed(nereid_request_t *req, nereid_response_fn fn, void *userp)
{
    stream_ctx_t *ctx = xcalloc(1, sizeof *ctx);
    ctx->fn = fn;
    ctx->userp = userp;
    req->done_fn = stream_final;
    req->done_userp = ctx;
}

void request_final_flags_only(nereid_request_t *req)
{
    if (request_is_streamed(req)) ((stream_ctx_t *)req->done_userp)->flags_only = true;
}

void model_set_decoupled(model_t *m)
{
    if (!m->config->model_transaction_policy) {
        m->config->model_transaction_policy = xcalloc(1, sizeof(Inference__ModelTransactionPolicy));
        inference__model_transaction_policy__init(m->config->model_transaction_policy);
    }
    m->config->model_transaction_policy->decoupled = true;
    free(m->config_json);
    m->config_json = config_to_json(m->config);
}

nereid_error_t *nereid_server_model_decoupled(nereid_server_t *server, const char *model,
                                              int64_t version, bool *decoupled_out)
{
    *decoupled_out = false;
    model_t *m;
    nereid_error_t *err = server_lookup_model(server, model, version, &m);
    if (err && server->opts.model_load_on_demand && !repository_loading_on_demand() &&
        (nereid_error_code(err) == NEREID_ERROR_NOT_FOUND ||
         nereid_error_code(err) == NEREID_ERROR_UNAVAILABLE) &&
        repository_has_model(server, model)) {
        /* Not loaded yet: its request loads it (off this frontend thread);
         * the policy comes from its config. */
        nereid_error_free(err);
        *decoupled_out = repository_decoupled_on_disk(server, model);
        return NULL;
    }
    if (err) return err;
    *decoupled_out = model_is_decoupled(m);
    model_unref(m);
    return NULL;
}

/* ---- The backend side ---- */

static stream_ctx_t *stream_of(const nereid_request_t *req)
{
    return req->done_fn == stream_final ? req->done_userp : NULL;
}

bool decoupled_flags_only(const nereid_request_t *req)
{
    const stream_ctx_t *ctx = stream_of(req);
    return ctx && ctx->flags_only;
}

void request_first_response(nereid_request_t *req)
{
    if (req->warmup || atomic_exchange(&req->first_response_seen, true)) return;
    uint64_t now = util_now_ns();
    stats_first_response(&req->model->stats,
                         now > req->t_request_ns ? (now - req->t_request_ns) / 1000000 : 0);
}

bool decoupled_has_sender(const nereid_request_t *req)
{
    const stream_ctx_t *ctx = stream_of(req);
    return ctx && ctx->sender;
}

nereid_error_t *nereid_batch_request_sender(nereid_batch_t *batch, size_t r,
                                            nereid_response_sender_t **out)
{
    *out = NULL;
    if (r >= batch->n_reqs)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "request index %zu out of range", r);
    nereid_request_t *req = batch->reqs[r];
    if (!model_is_decoupled(req->model))
        return nereid_error_new(NEREID_ERROR_UNSUPPORTED,
                                "model '%s' is not decoupled: it sends one response per request",
                                req->model->name);
    stream_ctx_t *ctx = stream_of(req);
    if (!ctx)
        return nereid_error_new(NEREID_ERROR_UNSUPPORTED,
                                "this request to decoupled model '%s' accepts one response only",
                                req->model->name);
    if (!ctx->sender) {
        nereid_response_sender_t *s = xcalloc(1, sizeof *s);
        pthread_mutex_init(&s->mu, NULL);
        s->req = req;
        s->ctx = ctx;
        s->executing = true;
        s->t_start_ns = req->t_compute_start_ns ? req->t_compute_start_ns : util_now_ns();
        ctx->sender = s;
    }
    *out = ctx->sender;
    return NULL;
}

static void free_scratch(nereid_response_sender_t *s)
{
    for (size_t i = 0; i < s->n_scratch; i++)
        free(s->scratch[i]);
    free(s->scratch);
    s->scratch = NULL;
    s->n_scratch = 0;
}

nereid_error_t *nereid_sender_output(nereid_response_sender_t *s, const char *name,
                                     nereid_datatype_t datatype, const int64_t *shape, size_t rank,
                                     size_t byte_size, void **buffer)
{
    *buffer = NULL;
    if (s->final_sent)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "the final response was already sent");
    if (!s->pending) s->pending = request_new_response(s->req);
    bool requested = false;
    nereid_error_t *err = batch_alloc_response_output(s->req, s->pending, name, datatype, shape,
                                                      rank, byte_size, buffer, &requested);
    if (err) return err;
    if (!s->t_output_ns) s->t_output_ns = util_now_ns();
    if (!requested) {
        s->scratch = xrealloc(s->scratch, (s->n_scratch + 1) * sizeof *s->scratch);
        *buffer = s->scratch[s->n_scratch++] = xmalloc(byte_size ? byte_size : 1);
    }
    return NULL;
}

/* Counts a sent response under its index (Triton's response_stats rules). */
static void record_response(nereid_response_sender_t *s, const nereid_error_t *err)
{
    uint64_t end = util_now_ns();
    uint64_t start = s->t_start_ns <= end ? s->t_start_ns : end;
    uint64_t out = s->t_output_ns;
    if (out && (out < start || out > end)) out = start;
    model_t *m = s->req->model;
    uint64_t index = s->index++;
    if (!atomic_load(&m->backend_response_stats))
        stats_record_response(&m->stats, index, start, out, end, err);
    s->t_start_ns = end;
    s->t_output_ns = 0;
}

/* Finishes the request with the final response (or flags only) and frees
 * the sender. Called once, after both the final flag and the release. */
static void sender_finish(nereid_response_sender_t *s)
{
    nereid_request_t *req = s->req;
    stream_ctx_t *ctx = s->ctx;
    ctx->sender = NULL;
    nereid_response_t *resp = s->final_resp;
    ctx->flags_only = resp == NULL;
    if (!resp) resp = request_new_response(req);
    /* A final CANCELLED answer counts as a cancellation in the metrics. */
    nereid_error_t *err = NULL;
    if (resp->error && nereid_error_code(resp->error) == NEREID_ERROR_CANCELLED) {
        err = resp->error;
        resp->error = NULL;
    }
    nereid_response_free(req->response);
    req->response = resp;
    if (s->pending) nereid_response_free(s->pending);
    free_scratch(s);
    pthread_mutex_destroy(&s->mu);
    free(s);
    request_finish(req, err, err ? FAILURE_CANCELED : FAILURE_BACKEND);
}

bool nereid_sender_is_cancelled(const nereid_response_sender_t *s)
{
    return request_cancelled(s->req);
}

bool decoupled_release(nereid_request_t *req, nereid_error_t *err)
{
    stream_ctx_t *ctx = stream_of(req);
    nereid_response_sender_t *s = ctx ? ctx->sender : NULL;
    if (!s) return false;
    nereid_error_free(err); /* the sender answers this request */
    pthread_mutex_lock(&s->mu);
    s->executing = false;
    bool finish = s->final_sent;
    pthread_mutex_unlock(&s->mu);
    if (finish) sender_finish(s);
    return true;
}

/* Marks the final flag sent; finishes now unless the scheduler still holds
 * the request. */
static void sender_final(nereid_response_sender_t *s, nereid_response_t *resp)
{
    pthread_mutex_lock(&s->mu);
    s->final_sent = true;
    s->final_resp = resp;
    bool finish = !s->executing;
    pthread_mutex_unlock(&s->mu);
    if (finish) sender_finish(s);
}

nereid_error_t *nereid_sender_send(nereid_response_sender_t *s, uint32_t flags, nereid_error_t *err)
{
    if (s->final_sent) {
        nereid_error_free(err);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "the final response was already sent");
    }
    nereid_request_t *req = s->req;
    record_response(s, err);
    nereid_response_t *resp = s->pending ? s->pending : request_new_response(req);
    s->pending = NULL;
    free_scratch(s);
    if (err) {
        nereid_error_free(resp->error);
        resp->error = err;
    }
    if (flags & NEREID_RESPONSE_FLAG_FINAL) {
        sender_final(s, resp);
        return NULL;
    }
    response_compact(resp);
    if (req->trace) trace_response_outputs(req->trace, resp);
    model_ref(req->model);
    resp->model = req->model;
    request_first_response(req);
    s->ctx->fn(resp, 0, s->ctx->userp);
    return NULL;
}

nereid_error_t *nereid_sender_send_flags(nereid_response_sender_t *s, uint32_t flags)
{
    if (s->final_sent)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "the final response was already sent");
    if (s->pending) {
        nereid_response_free(s->pending);
        s->pending = NULL;
    }
    free_scratch(s);
    s->t_output_ns = 0;
    if (flags & NEREID_RESPONSE_FLAG_FINAL) sender_final(s, NULL);
    return NULL;
}

nereid_error_t *nereid_sender_set_parameter(nereid_response_sender_t *s, const char *key,
                                            nereid_parameter_type_t type, const void *value)
{
    if (!key || !value || (unsigned)type > NEREID_PARAMETER_DOUBLE)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "invalid response parameter");
    if (s->final_sent)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "the final response was already sent");
    if (!s->pending) s->pending = request_new_response(s->req);
    response_set_parameter(s->pending, key, (int)type, value);
    return NULL;
}
