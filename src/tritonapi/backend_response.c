/*
 * This file contains the responses of a Triton backend: response channels,
 * TRITONBACKEND_ResponseFactory, TRITONBACKEND_Response and TRITONBACKEND_Output.
 *
 * Responses go through a channel shared by the request, its response
 * factories and its unsent responses (reference counted): during execute it
 * writes into the batch; for a decoupled model streamed by its client it
 * owns Nereid's response sender, usable from any thread after execute
 * returned. When the last reference goes without the final flag, the
 * request ends with an error saying so.
 */
#include <stdlib.h>
#include <string.h>

#include "tritonapi/backend_objects.h"

static tb_channel_t *channel_new(TRITONBACKEND_Request *req)
{
    tb_channel_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    atomic_init(&c->refs, 1);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->done, NULL);
    c->model = req->inst->model;
    c->batch = req->batch;
    c->r = req->r;
    if (c->model->decoupled) {
        nereid_error_t *err = nereid_batch_request_sender(req->batch, req->r, &c->sender);
        nereid_error_free(err); /* a client taking one response: answer through the batch */
    }
    return c;
}

void channel_unref(tb_channel_t *c)
{
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1) return;
    if (c->sender && !c->final_sent && !c->rescheduled) {
        nereid_error_t *err = nereid_error_new(
            NEREID_ERROR_INTERNAL,
            "backend '%s' did not send the final response (TRITONSERVER_RESPONSE_COMPLETE_FINAL) "
            "for a request to model '%s' before dropping its last response factory",
            backend_name(c->model->backend), model_name(c->model));
        nereid_error_free(nereid_sender_send(c->sender, NEREID_RESPONSE_FLAG_FINAL, err));
    }
    pthread_cond_destroy(&c->done);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static TRITONSERVER_Error *request_channel(TRITONBACKEND_Request *req, tb_channel_t **out)
{
    if (req->status != REQ_LIVE)
        return terr(TRITONSERVER_ERROR_INVALID_ARG, "request was already released");
    if (!req->chan && !(req->chan = channel_new(req)))
        return terr(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    *out = req->chan;
    return NULL;
}

/* ---- Response factories and responses ---- */

TRITONSERVER_Error *TRITONBACKEND_ResponseFactoryNew(TRITONBACKEND_ResponseFactory **factory,
                                                     TRITONBACKEND_Request *request)
{
    if (!factory || !request) return null_arg("factory and request");
    *factory = NULL;
    tb_channel_t *c;
    TRITONSERVER_Error *err = request_channel(request, &c);
    if (err) return err;
    TRITONBACKEND_ResponseFactory *f = malloc(sizeof *f);
    if (!f) return terr(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    atomic_fetch_add(&c->refs, 1);
    pthread_mutex_lock(&c->mu);
    c->n_factories++;
    pthread_mutex_unlock(&c->mu);
    f->chan = c;
    *factory = f;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ResponseFactoryDelete(TRITONBACKEND_ResponseFactory *factory)
{
    if (!factory) return null_arg("factory");
    tb_channel_t *c = factory->chan;
    pthread_mutex_lock(&c->mu);
    if (--c->n_factories == 0) pthread_cond_broadcast(&c->done);
    pthread_mutex_unlock(&c->mu);
    channel_unref(c);
    free(factory);
    return NULL;
}

static TRITONSERVER_Error *response_new(TRITONBACKEND_Response **response, tb_channel_t *c)
{
    TRITONBACKEND_Response *r = calloc(1, sizeof *r);
    if (!r) return terr(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    atomic_fetch_add(&c->refs, 1);
    r->chan = c;
    *response = r;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ResponseNew(TRITONBACKEND_Response **response,
                                              TRITONBACKEND_Request *request)
{
    if (!response || !request) return null_arg("response and request");
    *response = NULL;
    tb_channel_t *c;
    TRITONSERVER_Error *err = request_channel(request, &c);
    return err ? err : response_new(response, c);
}

TRITONSERVER_Error *TRITONBACKEND_ResponseNewFromFactory(TRITONBACKEND_Response **response,
                                                         TRITONBACKEND_ResponseFactory *factory)
{
    if (!response || !factory) return null_arg("response and factory");
    *response = NULL;
    return response_new(response, factory->chan);
}

static void response_free(TRITONBACKEND_Response *r)
{
    while (r->params) {
        tb_param_t *next = r->params->next;
        free(r->params->s);
        free(r->params);
        r->params = next;
    }
    while (r->outputs) {
        struct TRITONBACKEND_Output *next = r->outputs->next;
        free(r->outputs->discard);
        free(r->outputs);
        r->outputs = next;
    }
    channel_unref(r->chan);
    free(r);
}

TRITONSERVER_Error *TRITONBACKEND_ResponseDelete(TRITONBACKEND_Response *response)
{
    if (!response) return null_arg("response");
    response_free(response);
    return NULL;
}

/* Response parameters: kept with the response, handed to Nereid's response
 * when it is sent (clients see them in "parameters"). */
static TRITONSERVER_Error *add_param(TRITONBACKEND_Response *response, const char *name,
                                     nereid_parameter_type_t type, const void *value)
{
    if (!response || !name || !value) return null_arg("response, name and value");
    size_t n = strlen(name) + 1;
    tb_param_t *p = calloc(1, sizeof *p + n);
    if (!p) return terr(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    memcpy(p->key, name, n);
    p->type = type;
    if (type == NEREID_PARAMETER_STRING && !(p->s = strdup(value))) {
        free(p);
        return terr(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    }
    if (type == NEREID_PARAMETER_INT) memcpy(&p->v.i, value, sizeof p->v.i);
    if (type == NEREID_PARAMETER_BOOL) memcpy(&p->v.b, value, sizeof p->v.b);
    if (type == NEREID_PARAMETER_DOUBLE) memcpy(&p->v.d, value, sizeof p->v.d);
    if (!response->params_tail) response->params_tail = &response->params;
    *response->params_tail = p;
    response->params_tail = &p->next;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ResponseSetStringParameter(TRITONBACKEND_Response *response,
                                                             const char *name, const char *value)
{
    return add_param(response, name, NEREID_PARAMETER_STRING, value);
}

TRITONSERVER_Error *TRITONBACKEND_ResponseSetIntParameter(TRITONBACKEND_Response *response,
                                                          const char *name, const int64_t value)
{
    return add_param(response, name, NEREID_PARAMETER_INT, &value);
}

TRITONSERVER_Error *TRITONBACKEND_ResponseSetBoolParameter(TRITONBACKEND_Response *response,
                                                           const char *name, const bool value)
{
    return add_param(response, name, NEREID_PARAMETER_BOOL, &value);
}

TRITONSERVER_Error *TRITONBACKEND_ResponseSetDoubleParameter(TRITONBACKEND_Response *response,
                                                             const char *name, const double value)
{
    return add_param(response, name, NEREID_PARAMETER_DOUBLE, &value);
}

/* Hands the response's parameters to the sender's next response or the
 * request's response (channel locked). */
static void send_params(tb_channel_t *c, const TRITONBACKEND_Response *resp)
{
    for (const tb_param_t *p = resp ? resp->params : NULL; p; p = p->next) {
        const void *value = p->type == NEREID_PARAMETER_STRING ? (const void *)p->s
                            : p->type == NEREID_PARAMETER_INT  ? (const void *)&p->v.i
                            : p->type == NEREID_PARAMETER_BOOL ? (const void *)&p->v.b
                                                               : (const void *)&p->v.d;
        nereid_error_t *err =
            c->sender ? nereid_sender_set_parameter(c->sender, p->key, p->type, value)
                      : nereid_batch_request_set_response_parameter(c->batch, c->r, p->key, p->type,
                                                                    value);
        nereid_error_free(err);
    }
}

TRITONSERVER_Error *TRITONBACKEND_ResponseOutput(TRITONBACKEND_Response *response,
                                                 TRITONBACKEND_Output **output, const char *name,
                                                 const TRITONSERVER_DataType datatype,
                                                 const int64_t *shape, const uint32_t dims_count)
{
    if (!response || !output || !name || (!shape && dims_count))
        return null_arg("response, output, name and shape");
    *output = NULL;
    nereid_model_t *nm = response->chan->model->nm;
    bool known = false;
    for (size_t i = 0, n = nereid_model_output_count(nm); i < n && !known; i++) {
        const char *oname;
        nereid_datatype_t dt;
        const int64_t *dims;
        size_t rank;
        nereid_model_output(nm, i, &oname, &dt, &dims, &rank);
        known = strcmp(oname, name) == 0;
    }
    if (!known)
        return terr(TRITONSERVER_ERROR_INVALID_ARG,
                    "unexpected inference output '%s' for model '%s'", name, nereid_model_name(nm));
    for (struct TRITONBACKEND_Output *o = response->outputs; o; o = o->next)
        if (strcmp(o->name, name) == 0)
            return terr(TRITONSERVER_ERROR_ALREADY_EXISTS, "output '%s' already exists in response",
                        name);
    size_t name_bytes = strlen(name) + 1;
    size_t shape_at = (sizeof(struct TRITONBACKEND_Output) + name_bytes + 7) & ~(size_t)7;
    struct TRITONBACKEND_Output *o = calloc(1, shape_at + dims_count * sizeof(int64_t) + 1);
    if (!o) return terr(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    memcpy(o->name, name, name_bytes);
    o->shape = (int64_t *)((char *)o + shape_at);
    if (dims_count) memcpy(o->shape, shape, dims_count * sizeof(int64_t));
    o->rank = dims_count;
    o->datatype = (nereid_datatype_t)datatype;
    o->resp = response;
    o->next = response->outputs;
    response->outputs = o;
    *output = o;
    return NULL;
}

/* Whether a response on c (locked) is one Triton's frontends drop: a model
 * that is not decoupled answered already, so only its first response goes
 * out (L0_grpc_state_cleanup test_non_decoupled_streaming_multi_response). */
static bool response_dropped(const tb_channel_t *c)
{
    return !c->model->decoupled && !c->sender && c->n_sent > 0;
}

TRITONSERVER_Error *TRITONBACKEND_OutputBuffer(TRITONBACKEND_Output *output, void **buffer,
                                               const uint64_t buffer_byte_size,
                                               TRITONSERVER_MemoryType *memory_type,
                                               int64_t *memory_type_id)
{
    if (!output || !buffer || !memory_type || !memory_type_id)
        return null_arg("output and out-parameters");
    *buffer = NULL;
    if (output->allocated)
        return terr(TRITONSERVER_ERROR_ALREADY_EXISTS, "buffer for output '%s' already allocated",
                    output->name);
    tb_channel_t *c = output->resp->chan;
    nereid_error_t *err;
    pthread_mutex_lock(&c->mu);
    if (c->final_sent)
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "the final response for the request was already sent");
    else if (c->sender)
        err = nereid_sender_output(c->sender, output->name, output->datatype, output->shape,
                                   output->rank, buffer_byte_size, buffer);
    else if (response_dropped(c)) {
        err = NULL;
        output->discard = calloc(1, buffer_byte_size ? buffer_byte_size : 1);
        *buffer = output->discard;
        if (!output->discard) err = nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    } else if (c->batch)
        err = nereid_batch_request_output(c->batch, c->r, output->name, output->datatype,
                                          output->shape, output->rank, buffer_byte_size, buffer);
    else
        err =
            nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                             "the request of this response has completed: a model that is not "
                             "decoupled answers before TRITONBACKEND_ModelInstanceExecute returns");
    pthread_mutex_unlock(&c->mu);
    if (err) return (TRITONSERVER_Error *)err;
    output->allocated = true;
    output->attrs.byte_size = buffer_byte_size;
    *memory_type = TRITONSERVER_MEMORY_CPU;
    *memory_type_id = 0;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_OutputBufferAttributes(TRITONBACKEND_Output *output,
                                                         TRITONSERVER_BufferAttributes **attrs)
{
    if (!output || !attrs) return null_arg("output and buffer_attributes");
    *attrs = &output->attrs;
    return NULL;
}

/* Sends flags and maybe a response's error through channel c (locked). */
static nereid_error_t *channel_send(tb_channel_t *c, const TRITONBACKEND_Response *resp,
                                    const uint32_t flags, TRITONSERVER_Error *error)
{
    bool has_response = resp != NULL;
    bool final = flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL;
    if (c->final_sent) {
        nereid_error_t *err =
            nereid_error_new(NEREID_ERROR_INVALID_ARG,
                             "a response was already sent with the final flag for this request");
        if (c->batch) /* still executing: the request fails with the reason */
            nereid_batch_set_request_error(c->batch, c->r,
                                           tritonapi_error_copy((TRITONSERVER_Error *)err));
        return err;
    }
    if (c->sender) {
        send_params(c, resp);
        nereid_error_t *err =
            has_response ? nereid_sender_send(c->sender, flags, tritonapi_error_copy(error))
                         : nereid_sender_send_flags(c->sender, flags);
        if (!err && final) {
            c->sender = NULL; /* freed by its final */
            c->final_sent = true;
        }
        return err;
    }
    if (response_dropped(c)) {
        if (final) c->final_sent = true;
        return NULL;
    }
    if (!c->batch)
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                                "the request of this response has completed: responses after "
                                "TRITONBACKEND_ModelInstanceExecute returned need a decoupled "
                                "model and a streaming client");
    if (has_response && c->n_sent > 0) {
        nereid_error_t *err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                               "this request to decoupled model '%s' accepts one "
                                               "response only (use gRPC streaming for more)",
                                               model_name(c->model));
        nereid_batch_set_request_error(
            c->batch, c->r,
            nereid_error_new(nereid_error_code(err), "%s", nereid_error_message(err)));
        return err;
    }
    if (has_response) c->n_sent++;
    send_params(c, resp);
    if (error) nereid_batch_set_request_error(c->batch, c->r, tritonapi_error_copy(error));
    if (final) c->final_sent = true;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ResponseSend(TRITONBACKEND_Response *response,
                                               const uint32_t send_flags, TRITONSERVER_Error *error)
{
    if (!response) return null_arg("response");
    tb_channel_t *c = response->chan;
    pthread_mutex_lock(&c->mu);
    nereid_error_t *err = channel_send(c, response, send_flags, error);
    if (c->final_sent) pthread_cond_broadcast(&c->done);
    pthread_mutex_unlock(&c->mu);
    response_free(response);
    return (TRITONSERVER_Error *)err;
}

TRITONSERVER_Error *TRITONBACKEND_ResponseFactorySendFlags(TRITONBACKEND_ResponseFactory *factory,
                                                           const uint32_t send_flags)
{
    if (!factory) return null_arg("factory");
    tb_channel_t *c = factory->chan;
    pthread_mutex_lock(&c->mu);
    nereid_error_t *err = channel_send(c, NULL, send_flags, NULL);
    if (c->final_sent) pthread_cond_broadcast(&c->done);
    pthread_mutex_unlock(&c->mu);
    return (TRITONSERVER_Error *)err;
}

TRITONSERVER_Error *TRITONBACKEND_ResponseFactoryIsCancelled(TRITONBACKEND_ResponseFactory *factory,
                                                             bool *is_cancelled)
{
    if (!factory || !is_cancelled) return null_arg("factory and is_cancelled");
    tb_channel_t *c = factory->chan;
    pthread_mutex_lock(&c->mu);
    *is_cancelled = c->sender  ? nereid_sender_is_cancelled(c->sender)
                    : c->batch ? nereid_batch_request_is_cancelled(c->batch, c->r)
                               : false;
    pthread_mutex_unlock(&c->mu);
    return NULL;
}
