/*
 * This file contains inference requests and responses: the arena inside
 * them, building a request through server.h (inputs, outputs, parameters,
 * sequence headers), cancel tokens, the response's outputs and their
 * allocation, and finishing a request (statistics, response delivery,
 * cleanup). Validation against the model config is request_validate.c;
 * what a frontend reads from a response is response_read.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/core.h"
#include "core/trace.h"
#include "core/decoupled.h"
#include "core/util.h"
#include "core/request_internal.h"

#define MAX_STRING_CORRID 128

/* Allocations up to 1032 bytes come from glibc's per-thread cache. */
_Static_assert(sizeof(struct nereid_request) <= 1024, "request outgrew the malloc fast path");
_Static_assert(sizeof(struct nereid_response) <= 1024, "response outgrew the malloc fast path");

/* ---- Arenas: bump allocation inside the request or response ---- */

static void *arena_take(void *arena, size_t cap, size_t *used, size_t n, size_t align)
{
    size_t off = (*used + align - 1) & ~(align - 1);
    if (off > cap || cap - off < n) return NULL;
    *used = off + n;
    return (char *)arena + off;
}

static bool in_arena(const void *arena, size_t cap, const void *p)
{
    uintptr_t a = (uintptr_t)arena, q = (uintptr_t)p;
    return q >= a && q < a + cap;
}

char *request_strdup(nereid_request_t *req, const char *str)
{
    size_t n = strlen(str) + 1;
    char *p = arena_take(req->arena, sizeof req->arena, &req->arena_used, n, 1);
    if (!p) return xstrdup(str);
    memcpy(p, str, n);
    return p;
}

void request_strfree(nereid_request_t *req, char *str)
{
    if (!in_arena(req->arena, sizeof req->arena, str)) free(str);
}

/* The same for a response's arena. */
static char *resp_strdup(nereid_response_t *resp, const char *str)
{
    size_t n = strlen(str) + 1;
    char *p = arena_take(resp->arena, sizeof resp->arena, &resp->arena_used, n, 1);
    if (!p) return xstrdup(str);
    memcpy(p, str, n);
    return p;
}

static void resp_strfree(nereid_response_t *resp, char *str)
{
    if (!in_arena(resp->arena, sizeof resp->arena, str)) free(str);
}

nereid_error_t *nereid_request_new(nereid_server_t *server, const char *model, int64_t version,
                                   nereid_request_t **out)
{
    *out = NULL;
    if (!server || !model)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "server and model name are required");
    /* The arena needs no zeroing. */
    nereid_request_t *req = xmalloc(sizeof *req);
    memset(req, 0, offsetof(nereid_request_t, arena));
    req->server = server;
    req->model_name = request_strdup(req, model);
    req->version_req = version;
    *out = req;
    return NULL;
}

void request_fail_unsubmitted(nereid_request_t *req, nereid_complete_fn done_fn, void *done_userp,
                              nereid_error_t *err)
{
    nereid_response_t *resp = xmalloc(sizeof *resp);
    memset(resp, 0, offsetof(nereid_response_t, arena));
    resp->model_name = "";
    if (req->id) resp->id = xstrdup(req->id);
    resp->error = err;
    request_free(req);
    done_fn(resp, done_userp);
}

void request_free(nereid_request_t *req)
{
    if (!req) return;
    if (req->trace) trace_request_end(req);
    for (size_t i = 0; i < req->n_inputs; i++) {
        request_strfree(req, req->inputs[i].name);
        if (req->inputs[i].owned) free((void *)req->inputs[i].data);
    }
    if (req->inputs != req->inputs_inline) free(req->inputs);
    for (size_t i = 0; i < req->n_out_names; i++)
        request_strfree(req, req->out_names[i]);
    if (req->out_names != req->out_names_inline) {
        free(req->out_names);
        free(req->out_class_counts);
    }
    for (size_t i = 0; i < req->n_params; i++) {
        free(req->params[i].key);
        free(req->params[i].s);
    }
    free(req->params);
    request_strfree(req, req->model_name);
    if (req->id) request_strfree(req, req->id);
    free(req->corr_id_str);
    nereid_cancel_token_free(req->cancel);
    if (req->response) nereid_response_free(req->response);
    if (req->model) model_unref(req->model);
    free(req);
}

void nereid_request_free(nereid_request_t *req)
{
    request_free(req);
}

/* ---- Cancellation ---- */

nereid_cancel_token_t *nereid_cancel_token_new(void)
{
    /* malloc, not calloc: glibc's calloc skips the per-thread cache. */
    nereid_cancel_token_t *t = xmalloc(sizeof *t);
    atomic_init(&t->cancelled, false);
    atomic_store(&t->refs, 1);
    return t;
}

void nereid_cancel_token_free(nereid_cancel_token_t *token)
{
    if (token && atomic_fetch_sub(&token->refs, 1) == 1) free(token);
}

void nereid_request_set_cancel_token(nereid_request_t *req, nereid_cancel_token_t *token)
{
    if (token) atomic_fetch_add(&token->refs, 1);
    nereid_cancel_token_free(req->cancel);
    req->cancel = token;
}

void nereid_request_cancel(nereid_cancel_token_t *token)
{
    if (token) atomic_store_explicit(&token->cancelled, true, memory_order_release);
}

bool nereid_cancel_token_cancelled(const nereid_cancel_token_t *token)
{
    return token && atomic_load_explicit(&token->cancelled, memory_order_acquire);
}

void request_share_cancel(nereid_request_t *dst, const nereid_request_t *src)
{
    nereid_request_set_cancel_token(dst, src->cancel);
}

void request_finish_cancelled(nereid_request_t *req)
{
    request_finish(req, nereid_error_new(NEREID_ERROR_CANCELLED, "%s", ""), FAILURE_CANCELED);
}

/* Microseconds to nanoseconds, capped (~146 years) so that sums with
 * monotonic timestamps cannot overflow. */
static uint64_t us_to_ns(uint64_t us)
{
    const uint64_t cap_ns = UINT64_MAX / 4;
    return us > cap_ns / 1000 ? cap_ns : us * 1000;
}

void request_start_deadline(nereid_request_t *req, uint64_t now)
{
    if (!req->deadline_ns && req->timeout_us) req->deadline_ns = now + us_to_ns(req->timeout_us);
}

void request_finish_expired(nereid_request_t *req, const char *text)
{
    request_finish(
        req,
        nereid_error_new(NEREID_ERROR_UNAVAILABLE, "%s", text ? text : "Request timeout expired"),
        FAILURE_REJECTED);
}

nereid_error_t *nereid_request_set_id(nereid_request_t *req, const char *id)
{
    if (req->id) request_strfree(req, req->id);
    req->id = id && *id ? request_strdup(req, id) : NULL;
    return NULL;
}

/* An all-zero request or response (as schedulers calloc them) is valid: the
 * inline arrays are taken on first use. */
static req_input_t *push_input(nereid_request_t *req)
{
    if (!req->inputs) {
        req->inputs = req->inputs_inline;
        req->cap_inputs = REQ_INLINE_INPUTS;
    }
    if (req->n_inputs == req->cap_inputs) {
        req->cap_inputs *= 2;
        if (req->inputs == req->inputs_inline) {
            req->inputs = xmalloc(req->cap_inputs * sizeof *req->inputs);
            memcpy(req->inputs, req->inputs_inline, sizeof req->inputs_inline);
        } else {
            req->inputs = xrealloc(req->inputs, req->cap_inputs * sizeof *req->inputs);
        }
    }
    req_input_t *in = &req->inputs[req->n_inputs++];
    memset(in, 0, sizeof *in);
    return in;
}

req_input_t *request_find_input(nereid_request_t *req, const char *name)
{
    for (size_t i = 0; i < req->n_inputs; i++)
        if (strcmp(req->inputs[i].name, name) == 0) return &req->inputs[i];
    return NULL;
}

nereid_error_t *nereid_request_add_input(nereid_request_t *req, const char *name,
                                         nereid_datatype_t datatype, const int64_t *shape,
                                         size_t rank, const void *data, size_t byte_size)
{
    if (!name) return nereid_error_new(NEREID_ERROR_INVALID_ARG, "input name is required");
    if (rank > NEREID_MAX_RANK)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "input '%s' has rank %zu, more than the supported %d", name, rank,
                                NEREID_MAX_RANK);
    if (request_find_input(req, name))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "[request id: %s] input '%s' already exists in request",
                                req_id(req), name);
    req_input_t *in = push_input(req);
    in->name = request_strdup(req, name);
    in->datatype = datatype;
    in->rank = rank;
    if (rank) memcpy(in->shape, shape, rank * sizeof *shape);
    in->data = data;
    in->byte_size = byte_size;
    return NULL;
}

void request_add_owned_input(nereid_request_t *req, const char *name, nereid_datatype_t dt,
                             const int64_t *shape, size_t rank, void *data, size_t byte_size)
{
    req_input_t *in = request_find_input(req, name);
    if (in) {
        if (in->owned) free((void *)in->data);
    } else {
        in = push_input(req);
        in->name = request_strdup(req, name);
    }
    in->datatype = dt;
    in->rank = rank;
    memcpy(in->shape, shape, rank * sizeof *shape);
    in->data = data;
    in->byte_size = byte_size;
    in->owned = true;
}

void request_add_borrowed_input(nereid_request_t *req, const char *name, nereid_datatype_t dt,
                                const int64_t *shape, size_t rank, void *data, size_t byte_size)
{
    request_add_owned_input(req, name, dt, shape, rank, data, byte_size);
    request_find_input(req, name)->owned = false;
}

nereid_error_t *nereid_request_add_requested_output(nereid_request_t *req, const char *name,
                                                    uint32_t class_count)
{
    if (!name) return nereid_error_new(NEREID_ERROR_INVALID_ARG, "output name is required");
    for (size_t i = 0; i < req->n_out_names; i++)
        if (strcmp(req->out_names[i], name) == 0)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "[request id: %s] output '%s' already exists in request",
                                    req_id(req), name);
    if (!req->out_names) {
        req->out_names = req->out_names_inline;
        req->out_class_counts = req->out_class_counts_inline;
        req->cap_out_names = REQ_INLINE_OUTPUTS;
    }
    if (req->n_out_names == req->cap_out_names) {
        size_t cap = 2 * req->cap_out_names;
        if (req->out_names == req->out_names_inline) {
            req->out_names = xmalloc(cap * sizeof *req->out_names);
            req->out_class_counts = xmalloc(cap * sizeof *req->out_class_counts);
            memcpy(req->out_names, req->out_names_inline, sizeof req->out_names_inline);
            memcpy(req->out_class_counts, req->out_class_counts_inline,
                   sizeof req->out_class_counts_inline);
        } else {
            req->out_names = xrealloc(req->out_names, cap * sizeof *req->out_names);
            req->out_class_counts =
                xrealloc(req->out_class_counts, cap * sizeof *req->out_class_counts);
        }
        req->cap_out_names = cap;
    }
    req->out_names[req->n_out_names] = request_strdup(req, name);
    req->out_class_counts[req->n_out_names] = class_count;
    req->n_out_names++;
    return NULL;
}

void nereid_request_set_priority(nereid_request_t *req, uint64_t priority)
{
    req->priority = priority;
}

void nereid_request_set_timeout_us(nereid_request_t *req, uint64_t timeout_us)
{
    req->timeout_us = timeout_us;
}

void nereid_request_set_correlation_id(nereid_request_t *req, uint64_t id)
{
    free(req->corr_id_str);
    req->corr_id_str = NULL;
    req->corr_id = id;
}

nereid_error_t *nereid_request_set_correlation_id_string(nereid_request_t *req, const char *id)
{
    if (strlen(id) > MAX_STRING_CORRID)
        return nereid_error_new(NEREID_ERROR_UNSUPPORTED,
                                "string correlation ID cannot be longer than 128 characters");
    free(req->corr_id_str);
    req->corr_id_str = xstrdup(id);
    req->corr_id = 0;
    return NULL;
}

void nereid_request_set_sequence_flags(nereid_request_t *req, bool start, bool end)
{
    req->seq_start = start;
    req->seq_end = end;
}

/* "true"/"1" -> 1, "false"/"0" -> 0, anything else -> -1. */
static int header_flag(const char *v)
{
    if (!strcasecmp(v, "true") || !strcmp(v, "1")) return 1;
    if (!strcasecmp(v, "false") || !strcmp(v, "0")) return 0;
    return -1;
}

/* The request's sequence id as text ("" when it has none). */
static void corr_id_text(const nereid_request_t *req, char *buf, size_t size)
{
    if (req->corr_id_str)
        snprintf(buf, size, "%s", req->corr_id_str);
    else if (req->corr_id)
        snprintf(buf, size, "%" PRIu64, req->corr_id);
    else if (size)
        buf[0] = '\0';
}

nereid_error_t *nereid_request_sequence_headers(nereid_request_t *req, const char *const names[3],
                                                const char *id, const char *start, const char *end,
                                                char *echo, size_t echo_size)
{
    const char *flag_values[2] = {start, end};
    bool *flags[2] = {&req->seq_start, &req->seq_end};
    const char *params[2] = {"sequence_start", "sequence_end"};
    for (int i = 0; i < 2; i++) {
        if (!flag_values[i]) continue;
        int f = header_flag(flag_values[i]);
        if (f < 0)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "invalid value '%s' for header '%s', expected 'true' or "
                                    "'false'",
                                    flag_values[i], names[i + 1]);
        if (*flags[i] && !f)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "header '%s' (false) does not agree with the '%s' "
                                    "parameter (true)",
                                    names[i + 1], params[i]);
        if (f) *flags[i] = true;
    }
    if (id) {
        char body[MAX_STRING_CORRID + 2];
        corr_id_text(req, body, sizeof body);
        if (body[0]) {
            if (strcmp(body, id) != 0)
                return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                        "header '%s' ('%s') does not agree with the "
                                        "'sequence_id' parameter ('%s')",
                                        names[0], id, body);
        } else {
            if (id[0] == '\0')
                return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                        "header '%s' is empty, expected a sequence id", names[0]);
            char *e;
            errno = 0;
            unsigned long long v = strtoull(id, &e, 10);
            if (id[0] >= '0' && id[0] <= '9' && *e == '\0' && errno == 0) {
                nereid_request_set_correlation_id(req, (uint64_t)v);
            } else {
                nereid_error_t *err = nereid_request_set_correlation_id_string(req, id);
                if (err) return err;
            }
        }
    }
    if (echo) corr_id_text(req, echo, echo_size);
    return NULL;
}

static req_param_t *push_param(nereid_request_t *req, const char *key, param_type_t type)
{
    for (size_t i = 0; i < req->n_params; i++)
        if (strcmp(req->params[i].key, key) == 0) {
            free(req->params[i].s);
            req->params[i].s = NULL;
            req->params[i].type = type;
            return &req->params[i];
        }
    req->params = xrealloc(req->params, (req->n_params + 1) * sizeof *req->params);
    req_param_t *p = &req->params[req->n_params++];
    memset(p, 0, sizeof *p);
    p->key = xstrdup(key);
    p->type = type;
    return p;
}

nereid_error_t *nereid_request_set_parameter_string(nereid_request_t *req, const char *key,
                                                    const char *value)
{
    push_param(req, key, PARAM_STRING)->s = xstrdup(value);
    return NULL;
}

nereid_error_t *nereid_request_set_parameter_int(nereid_request_t *req, const char *key,
                                                 int64_t value)
{
    push_param(req, key, PARAM_INT)->i = value;
    return NULL;
}

nereid_error_t *nereid_request_set_parameter_bool(nereid_request_t *req, const char *key,
                                                  bool value)
{
    push_param(req, key, PARAM_BOOL)->b = value;
    return NULL;
}

nereid_error_t *nereid_request_set_parameter_double(nereid_request_t *req, const char *key,
                                                    double value)
{
    push_param(req, key, PARAM_DOUBLE)->d = value;
    return NULL;
}

/* ---- Responses ---- */

/* Adds an output slot named after the config output io, or after name (a
 * copy) when the model has no such output. Slot pointers change when the
 * array grows. */
static resp_output_t *push_output(nereid_response_t *resp, const model_io_t *io, const char *name)
{
    if (!resp->outputs) {
        resp->outputs = resp->outputs_inline;
        resp->cap_outputs = RESP_INLINE_OUTPUTS;
    }
    if (resp->n_outputs == resp->cap_outputs) {
        size_t cap = 2 * resp->cap_outputs;
        if (resp->outputs == resp->outputs_inline) {
            resp->outputs = xmalloc(cap * sizeof *resp->outputs);
            memcpy(resp->outputs, resp->outputs_inline, sizeof resp->outputs_inline);
        } else {
            resp->outputs = xrealloc(resp->outputs, cap * sizeof *resp->outputs);
        }
        resp->cap_outputs = cap;
    }
    resp_output_t *o = &resp->outputs[resp->n_outputs++];
    memset(o, 0, sizeof *o);
    o->io = (model_io_t *)io;
    if (io) {
        o->name = io->name;
    } else {
        o->name = xstrdup(name);
        o->owns_name = true;
    }
    return o;
}

nereid_response_t *request_new_response(nereid_request_t *req)
{
    model_t *m = req->model;
    /* The arena needs no zeroing. */
    nereid_response_t *resp = xmalloc(sizeof *resp);
    memset(resp, 0, offsetof(nereid_response_t, arena));
    resp->alloc = req->alloc;
    resp->model_name = m->name;
    resp->model_version = m->version;
    if (req->id) {
        size_t n = strlen(req->id) + 1;
        resp->id = arena_take(resp->arena, sizeof resp->arena, &resp->arena_used, n, 1);
        if (resp->id)
            memcpy(resp->id, req->id, n);
        else
            resp->id = xstrdup(req->id);
    }
    if (req->n_out_names) {
        for (size_t i = 0; i < req->n_out_names; i++) {
            const char *name = req->out_names[i];
            resp_output_t *o = push_output(resp, find_io(m->outputs, m->n_outputs, name), name);
            o->class_count = req->out_class_counts[i];
        }
    } else {
        for (size_t i = 0; i < m->n_outputs; i++)
            push_output(resp, &m->outputs[i], NULL);
    }
    return resp;
}

void request_prepare_response(nereid_request_t *req)
{
    req->response = request_new_response(req);
}

void *response_arena_alloc(nereid_response_t *resp, size_t byte_size)
{
    return arena_take(resp->arena, sizeof resp->arena, &resp->arena_used, byte_size, 64);
}

resp_output_t *request_find_output(nereid_request_t *req, const char *name)
{
    nereid_response_t *resp = req->response;
    for (size_t i = 0; resp && i < resp->n_outputs; i++)
        if (strcmp(resp->outputs[i].name, name) == 0) return &resp->outputs[i];
    return NULL;
}

resp_output_t *request_capture_output(nereid_request_t *req, const char *name)
{
    resp_output_t *o = request_find_output(req, name);
    if (o) return o;
    model_t *m = req->model;
    o = push_output(req->response, find_io(m->outputs, m->n_outputs, name), name);
    o->internal = true;
    return o;
}

size_t request_output_count(const nereid_request_t *req)
{
    return req->response ? req->response->n_outputs : 0;
}

resp_output_t *request_output_at(nereid_request_t *req, size_t i)
{
    return &req->response->outputs[i];
}

nereid_error_t *request_alloc_output(nereid_request_t *req, resp_output_t *o, nereid_datatype_t dt,
                                     const int64_t *shape, size_t rank, size_t byte_size)
{
    return response_alloc_output(req, req->response, o, dt, shape, rank, byte_size);
}

nereid_error_t *response_alloc_output(nereid_request_t *req, nereid_response_t *resp,
                                      resp_output_t *o, nereid_datatype_t dt, const int64_t *shape,
                                      size_t rank, size_t byte_size)
{
    if (rank > NEREID_MAX_RANK) rank = NEREID_MAX_RANK;
    o->datatype = dt;
    memcpy(o->shape, shape, rank * sizeof *shape);
    o->rank = rank;
    o->byte_size = byte_size;
    o->own_mem = false;
    if (!o->internal && req->alloc.alloc_fn) {
        nereid_error_t *err = req->alloc.alloc_fn(req->alloc.userp, o->name, dt, o->shape, o->rank,
                                                  byte_size, &o->data, &o->buffer_userp);
        if (err) return err;
        o->own_mem = !o->data && o->buffer_userp == NEREID_ALLOC_DECLINED;
        if (!o->data && byte_size && !o->own_mem)
            return nereid_error_new(NEREID_ERROR_INTERNAL,
                                    "response allocator returned no buffer for output '%s'",
                                    o->name);
        o->foreign = (req->foreign & NEREID_FOREIGN_OUTPUTS) && !o->own_mem;
    }
    if (o->internal || !req->alloc.alloc_fn || o->own_mem) {
        /* Small client outputs go in the response's arena; internal ones are
         * malloc'ed (schedulers may take their buffers). */
        o->data = o->internal ? NULL : response_arena_alloc(resp, byte_size);
        if (o->data)
            o->in_arena = true;
        else
            o->data = xmalloc(byte_size);
    }
    o->allocated = true;
    return NULL;
}

nereid_error_t *response_output_view(nereid_request_t *req, nereid_response_t *resp,
                                     resp_output_t *o, nereid_datatype_t dt, const int64_t *shape,
                                     size_t rank, const void *data, size_t byte_size,
                                     nereid_output_release_fn release, void *release_userp)
{
    if (!req->output_views || o->internal) {
        nereid_error_t *err = response_alloc_output(req, resp, o, dt, shape, rank, byte_size);
        if (err) return err;
        if (byte_size) memcpy(o->data, data, byte_size);
        release(release_userp);
        return NULL;
    }
    if (rank > NEREID_MAX_RANK) rank = NEREID_MAX_RANK;
    o->datatype = dt;
    memcpy(o->shape, shape, rank * sizeof *shape);
    o->rank = rank;
    o->byte_size = byte_size;
    o->data = (void *)data;
    o->view_release = release;
    o->view_userp = release_userp;
    o->allocated = true;
    return NULL;
}

void nereid_request_set_output_views(nereid_request_t *req, bool accept)
{
    req->output_views = accept;
}

void nereid_request_set_foreign_memory(nereid_request_t *req, unsigned what)
{
    req->foreign = (uint8_t)(what & (NEREID_FOREIGN_INPUTS | NEREID_FOREIGN_OUTPUTS));
}

void request_drop_output(nereid_request_t *req, size_t i)
{
    nereid_response_t *resp = req->response;
    if (!resp || i >= resp->n_outputs || resp->outputs[i].allocated) return;
    if (resp->outputs[i].owns_name) free(resp->outputs[i].name);
    memmove(&resp->outputs[i], &resp->outputs[i + 1],
            (resp->n_outputs - i - 1) * sizeof *resp->outputs);
    resp->n_outputs--;
}

void request_output_set_filled(resp_output_t *o)
{
    o->filled = true;
}

bool request_output_filled(const resp_output_t *o)
{
    return o->filled;
}

bool request_output_allocated(const resp_output_t *o)
{
    return o->allocated;
}

void request_output_set_shape(resp_output_t *o, const int64_t *shape, size_t rank)
{
    if (rank > NEREID_MAX_RANK) rank = NEREID_MAX_RANK;
    memmove(o->shape, shape, rank * sizeof *shape);
    o->rank = rank;
}

void *request_output_take(resp_output_t *o)
{
    if (!o->internal || !o->allocated || o->in_arena) return NULL;
    void *data = o->data;
    o->data = NULL;
    o->allocated = false;
    return data;
}

void request_set_error(nereid_request_t *req, nereid_error_t *err)
{
    nereid_response_t *resp = req->response;
    if (resp->error)
        nereid_error_free(err);
    else
        resp->error = err;
}

bool request_failed(const nereid_request_t *req)
{
    return req->response && req->response->error;
}

bool request_failed_cancelled(const nereid_request_t *req)
{
    return request_failed(req) && nereid_error_code(req->response->error) == NEREID_ERROR_CANCELLED;
}

nereid_request_t *request_new_filler(nereid_server_t *server)
{
    nereid_request_t *f = xcalloc(1, sizeof *f);
    f->server = server;
    f->batch_size = 1;
    f->response = xcalloc(1, sizeof *f->response);
    return f;
}

void request_record_stats(nereid_request_t *req, const model_stats_t *parts)
{
    model_stats_t *s = &req->model->stats;
    uint64_t in_ns = atomic_load(&parts->compute_input.ns);
    uint64_t infer_ns = atomic_load(&parts->compute_infer.ns);
    uint64_t out_ns = atomic_load(&parts->compute_output.ns);
    atomic_fetch_add(&s->inference_count, (uint64_t)req->batch_size);
    atomic_fetch_add(&s->execution_count, 1);
    atomic_store(&s->last_inference_ms, util_wall_ms());
    stats_add(&s->compute_input, in_ns);
    stats_add(&s->compute_infer, infer_ns);
    stats_add(&s->compute_output, out_ns);
    /* One execution of the request's batch size (1 when not batching). */
    size_t bs = req->batch_size > 0 ? (size_t)req->batch_size : 1;
    if (bs < s->n_batch) {
        batch_stat_t *b = &s->batch[bs];
        stats_add(&b->compute_input, in_ns);
        stats_add(&b->compute_infer, infer_ns);
        stats_add(&b->compute_output, out_ns);
    }
    stats_add(&s->queue, atomic_load(&parts->queue.ns));
    req->stats_recorded = true;
}

static void release_output(nereid_response_t *resp, resp_output_t *o)
{
    if (o->view_release) {
        nereid_output_release_fn release = o->view_release;
        o->view_release = NULL;
        release(o->view_userp);
    } else if (o->allocated && !o->in_arena) {
        if (resp->alloc.alloc_fn && !o->internal && !o->own_mem) {
            if (resp->alloc.release_fn)
                resp->alloc.release_fn(resp->alloc.userp, o->data, o->buffer_userp, o->byte_size);
        } else {
            free(o->data);
        }
    }
    o->allocated = false;
    o->in_arena = false;
    o->own_mem = false;
    o->foreign = false;
    o->data = NULL;
}

void nereid_response_free(nereid_response_t *resp)
{
    if (!resp) return;
    for (size_t i = 0; i < resp->n_outputs; i++) {
        release_output(resp, &resp->outputs[i]);
        if (resp->outputs[i].owns_name) free(resp->outputs[i].name);
    }
    if (resp->outputs != resp->outputs_inline) free(resp->outputs);
    if (!in_arena(resp->arena, sizeof resp->arena, resp->id)) free(resp->id);
    nereid_error_free(resp->error);
    for (size_t i = 0; resp->params && i < resp->params->n; i++) {
        resp_strfree(resp, resp->params->p[i].key);
        resp_strfree(resp, resp->params->p[i].s);
    }
    free(resp->params);
    if (resp->model) model_unref(resp->model);
    free(resp);
}

void response_set_parameter(nereid_response_t *resp, const char *key, int type, const void *value)
{
    req_param_t *p = NULL;
    size_t n = resp->params ? resp->params->n : 0;
    for (size_t i = 0; i < n && !p; i++)
        if (strcmp(resp->params->p[i].key, key) == 0) p = &resp->params->p[i];
    if (!p) {
        if (n == (resp->params ? resp->params->cap : 0)) {
            size_t cap = n ? 2 * n : 4;
            resp->params = xrealloc(resp->params, sizeof *resp->params + cap * sizeof(req_param_t));
            resp->params->cap = cap;
        }
        resp->params->n = n + 1;
        p = &resp->params->p[n];
        memset(p, 0, sizeof *p);
        p->key = resp_strdup(resp, key);
    }
    resp_strfree(resp, p->s);
    p->s = NULL;
    p->type = (param_type_t)type;
    switch (type) {
    case NEREID_PARAMETER_STRING:
        p->s = resp_strdup(resp, value);
        break;
    case NEREID_PARAMETER_INT:
        memcpy(&p->i, value, sizeof p->i);
        break;
    case NEREID_PARAMETER_BOOL:
        memcpy(&p->b, value, sizeof p->b);
        break;
    default:
        memcpy(&p->d, value, sizeof p->d);
        break;
    }
}

size_t nereid_response_parameter_count(const nereid_response_t *resp)
{
    return resp->params ? resp->params->n : 0;
}

void nereid_response_parameter(const nereid_response_t *resp, size_t index, const char **name,
                               int *type, const void **value)
{
    const req_param_t *p = &resp->params->p[index];
    *name = p->key;
    *type = (int)p->type;
    *value = p->type == PARAM_STRING ? (const void *)p->s
             : p->type == PARAM_INT  ? (const void *)&p->i
             : p->type == PARAM_BOOL ? (const void *)&p->b
                                     : (const void *)&p->d;
}

/* Drops internal and unfilled slots so the client sees only its outputs. */
static void compact_outputs(nereid_response_t *resp)
{
    size_t w = 0;
    for (size_t i = 0; i < resp->n_outputs; i++) {
        resp_output_t *o = &resp->outputs[i];
        if (o->internal || !o->filled || resp->error) {
            release_output(resp, o);
            if (o->owns_name) free(o->name);
            continue;
        }
        resp->outputs[w++] = *o;
    }
    resp->n_outputs = w;
}

void response_compact(nereid_response_t *resp)
{
    compact_outputs(resp);
}

void request_count_failure(nereid_request_t *req, failure_reason_t reason)
{
    model_stats_t *s = &req->model->stats;
    stats_add(&s->fail, util_now_ns() - req->t_request_ns);
    atomic_fetch_add(&s->failures[reason], 1);
}

void request_finish(nereid_request_t *req, nereid_error_t *err, failure_reason_t reason)
{
    if (decoupled_release(req, err)) return; /* a backend's response sender finishes it */
    model_t *m = req->model;
    nereid_response_t *resp = req->response;
    uint64_t now = util_now_ns();
    if (!err && resp->error) {
        err = resp->error;
        resp->error = NULL;
        reason = FAILURE_BACKEND;
    }
    model_stats_t *s = &m->stats;
    uint64_t start = req->t_request_ns;
    if (err && nereid_error_code(err) == NEREID_ERROR_CANCELLED) reason = FAILURE_CANCELED;
    if (err) {
        stats_add(&s->fail, now - start);
        atomic_fetch_add(&s->failures[reason], 1);
        nereid_error_free(resp->error);
        resp->error = err;
    } else {
        stats_add(&s->success, now - start);
        uint64_t cs = req->t_compute_start_ns ? req->t_compute_start_ns : now;
        if (!req->stats_recorded) stats_add(&s->queue, cs - req->t_queue_start_ns);
        if (req->parent_stats) stats_add(&req->parent_stats->queue, cs - req->t_queue_start_ns);
    }
    compact_outputs(resp);
    if (req->trace) trace_response_outputs(req->trace, resp);
    if (!decoupled_flags_only(req)) request_first_response(req);
    req->response = NULL;
    resp->model = req->model;
    req->model = NULL;
    nereid_complete_fn done = req->done_fn;
    void *userp = req->done_userp;
    request_free(req);
    done(resp, userp);
}
