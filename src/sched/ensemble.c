/*
 * This file contains the ensemble scheduler: a scheduler with no instances.
 * Each ensemble request walks the steps of ensemble_scheduling. A step is
 * submitted (nereid_server_infer_async on its composing model) as soon as
 * every ensemble tensor it reads exists, so independent branches run in
 * parallel; its completion callback publishes the tensors it wrote and
 * submits the steps that became ready.
 *
 * Tensors are not copied: a step reads the ensemble's input memory or the
 * output buffers of earlier steps' responses (kept until the ensemble request
 * finishes), and a step output that is an ensemble output the client asked
 * for is allocated straight in the client's response with its allocator.
 *
 * The first failing step fails the request with its message (steps already
 * running finish first, because they read the request's memory).
 *
 * A decoupled step (Triton's ValidateEnsembleConfig lets its responses flow
 * only into steps and outputs of its own) may answer 0..N times: each
 * response forks the request's data flow into a new lane, a copy of the
 * lane the step ran in, where the response's tensors are published and the
 * rest of the ensemble runs for that response alone (Triton's iteration
 * counts). An ensemble with a decoupled step is decoupled itself: each lane
 * whose requested outputs are all there becomes one response to the
 * client; the one completed by the last step in flight carries the final
 * flag, else the final flag comes alone once no step is in flight.
 *
 * ensemble_scheduling.max_inflight_requests = N bounds, per step, the step
 * requests in flight across all of the ensemble's requests (Triton's
 * StepInflightRequestLimiter). Triton blocks the submitting thread; here a
 * step over the limit waits in the step's FIFO and is submitted when a
 * request of that step completes (no thread ever waits).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "sched/scheduler.h"

typedef struct ens_tensor {
    char *name;
    /* Validation (Triton's tensor node): the datatype and dims the first
     * model that mentions the tensor gives it, and that model's name. */
    bool known;
    nereid_datatype_t datatype;
    int64_t dims[NEREID_MAX_RANK]; /* without the batch dimension */
    size_t rank;
    bool batching; /* full shape = -1 first, then dims */
    const char *origin;
    size_t *consumers; /* steps reading it */
    size_t n_consumers;
} ens_tensor_t;

typedef struct ens_map {
    char *model_name;              /* the composing model's input or output */
    size_t tensor;                 /* ensemble tensor index */
    int64_t dims[NEREID_MAX_RANK]; /* inputs: the model's config dims */
    size_t rank;
} ens_map_t;

typedef struct ens_step {
    char *model;
    char *ns; /* --model-namespacing: the model's namespace, else NULL */
    int64_t version;
    bool batching;  /* the composing model has max_batch_size > 0 */
    bool decoupled; /* the composing model's transaction policy */
    ens_map_t *in;
    size_t n_in;
    ens_map_t *out;
    size_t n_out;
} ens_step_t;

/* A step submission waiting for room under max_inflight_requests. */
typedef struct ens_pending {
    struct ens_ctx *ctx;
    struct ens_lane *lane;
    size_t step;
    struct ens_pending *next;
} ens_pending_t;

typedef struct ens_limit {
    pthread_mutex_t lock;
    uint32_t inflight; /* step requests submitted and not completed, <= max */
    ens_pending_t *head, *tail;
} ens_limit_t;

typedef struct ensemble_scheduler {
    scheduler_t base;
    uint32_t max_inflight; /* max_inflight_requests; 0 = no limit */
    ens_limit_t *limits;   /* per step when max_inflight > 0, else NULL */
    ens_tensor_t *tensors;
    size_t n_tensors;
    ens_step_t *steps;
    size_t n_steps;
    bool decoupled; /* some step is decoupled: the ensemble streams its responses */
    _Atomic bool stopped;
} ensemble_t;

/* ---- Per-request state ---- */

typedef struct ens_value {
    bool ready;
    bool absent;        /* an optional ensemble input the request lacks, or an output
                           a step did not produce: its readers run without it */
    int64_t batch_size; /* of the request that produced it; 0: not batching */
    nereid_datatype_t datatype;
    int64_t shape[NEREID_MAX_RANK];
    size_t rank;
    const void *data;
    size_t byte_size;
} ens_value_t;

typedef struct ens_ctx ens_ctx_t;

/* One data flow of a request: the first, and one more per response of a
 * decoupled step (a copy of the lane that step ran in). Values and counts
 * change under the ctx lock only. */
typedef struct ens_lane {
    ens_value_t *values; /* per tensor */
    size_t *waiting;     /* per step: inputs not yet available */
    bool sent;           /* decoupled: this lane's response went out */
    struct ens_lane *next;
} ens_lane_t;

/* One submitted step request; freed after its final response. */
typedef struct ens_call {
    ens_ctx_t *ctx;
    ens_lane_t *lane; /* the lane it read its inputs from */
    size_t step;
    int64_t batch_size; /* of the step's request; 0 for a non-batching model */
} ens_call_t;

struct ens_ctx {
    ensemble_t *e;
    const sched_core_t *core; /* e's: ctx_free uses it after e may be gone */
    nereid_request_t *req;
    pthread_mutex_t lock;
    pthread_mutex_t send_lock; /* decoupled: one response delivered at a time */
    ens_lane_t *root;          /* the request's own lane; all lanes are on its list */
    bool *needed;              /* per step: writes a tensor the response needs (else never run) */
    bool filled;               /* decoupled, not streamed: a lane filled req's response */
    ens_lane_t *final_lane;    /* decoupled: the lane completed by the last step in flight; its
                                  response carries the final flag (Triton's FinishEnsemble) */
    size_t inflight;           /* steps submitted and not completed, plus launch guards */
    nereid_error_t *error;
    model_t **held; /* per step: its composing model, held (model_hold) until ctx_free */
    size_t n_held;
    nereid_response_t **responses; /* step responses owning intermediate tensors */
    size_t n_responses;
    model_stats_t agg; /* steps' queue and compute durations */
};

static char routed_marker;

static size_t find_tensor(ensemble_t *e, const char *name)
{
    for (size_t i = 0; i < e->n_tensors; i++)
        if (strcmp(e->tensors[i].name, name) == 0) return i;
    return (size_t)-1;
}

static size_t tensor_index(ensemble_t *e, const char *name)
{
    size_t i = find_tensor(e, name);
    if (i != (size_t)-1) return i;
    e->tensors = xrealloc(e->tensors, (e->n_tensors + 1) * sizeof *e->tensors);
    ens_tensor_t *t = &e->tensors[e->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = xstrdup(name);
    return e->n_tensors++;
}

/* Triton's ReshapeTensorDims: a tensor passed between a batching and a
 * non-batching side gains a batch dimension of 1 (when its shape already
 * matches the config dims) or loses one of size 1 (when it does not). */
static void convert_dims(const int64_t *cfg, size_t cfg_rank, bool cfg_batching,
                         int64_t tensor_batch, const int64_t *shape, size_t rank, int64_t *out,
                         size_t *out_rank)
{
    if (cfg_batching != (tensor_batch != 0)) {
        bool agree = rank == cfg_rank;
        for (size_t i = 0; agree && i < rank; i++)
            agree = cfg[i] == -1 || shape[i] == -1 || cfg[i] == shape[i];
        if (cfg_batching && agree && rank < NEREID_MAX_RANK) {
            out[0] = 1;
            memcpy(out + 1, shape, rank * sizeof *shape);
            *out_rank = rank + 1;
            return;
        }
        if (!cfg_batching && !agree && tensor_batch == 1 && rank > 0) {
            memcpy(out, shape + 1, (rank - 1) * sizeof *shape);
            *out_rank = rank - 1;
            return;
        }
    }
    memcpy(out, shape, rank * sizeof *shape);
    *out_rank = rank;
}

/* The shape of ensemble output io for the client: converted against its
 * config shape, then from its reshape to its dims (Triton's
 * Output::Reshape: -1 dims take the reshape's -1 values in order). */
static void output_shape(const model_t *m, const model_io_t *io, const ens_value_t *v, int64_t *out,
                         size_t *out_rank)
{
    bool batching = m->max_batch_size > 0;
    int64_t shape[NEREID_MAX_RANK];
    size_t rank;
    convert_dims(io->has_reshape ? io->reshape : io->dims,
                 io->has_reshape ? io->reshape_rank : io->rank, batching, v->batch_size, v->shape,
                 v->rank, shape, &rank);
    if (!io->has_reshape) {
        memcpy(out, shape, rank * sizeof *shape);
        *out_rank = rank;
        return;
    }
    size_t off = batching ? 1 : 0, r = 0, nvar = 0, used = 0;
    int64_t var[NEREID_MAX_RANK];
    for (size_t d = 0; d < io->reshape_rank; d++)
        if (io->reshape[d] == -1 && d + off < rank) var[nvar++] = shape[d + off];
    if (batching && rank > 0) out[r++] = shape[0];
    for (size_t d = 0; d < io->rank && r < NEREID_MAX_RANK; d++)
        out[r++] = io->dims[d] == -1 ? (used < nvar ? var[used++] : 0) : io->dims[d];
    *out_rank = r;
}

static ens_lane_t *lane_new(ensemble_t *e, const ens_lane_t *from)
{
    ens_lane_t *l = xcalloc(1, sizeof *l);
    l->values = xcalloc(e->n_tensors ? e->n_tensors : 1, sizeof *l->values);
    l->waiting = xcalloc(e->n_steps ? e->n_steps : 1, sizeof *l->waiting);
    if (from) {
        memcpy(l->values, from->values, e->n_tensors * sizeof *l->values);
        memcpy(l->waiting, from->waiting, e->n_steps * sizeof *l->waiting);
    } else {
        for (size_t i = 0; i < e->n_steps; i++)
            l->waiting[i] = e->steps[i].n_in;
    }
    return l;
}

/* A new lane copied from `from`, on c's list (ctx lock held). */
static ens_lane_t *lane_fork(ens_ctx_t *c, const ens_lane_t *from)
{
    ens_lane_t *l = lane_new(c->e, from);
    l->next = c->root->next;
    c->root->next = l;
    return l;
}

static void ctx_free(ens_ctx_t *c)
{
    for (size_t i = 0; i < c->n_responses; i++)
        nereid_response_free(c->responses[i]);
    free(c->responses);
    for (size_t i = 0; i < c->n_held; i++)
        if (c->held[i]) c->core->release_model(c->held[i]);
    free(c->held);
    for (ens_lane_t *l = c->root, *next; l; l = next) {
        next = l->next;
        free(l->values);
        free(l->waiting);
        free(l);
    }
    free(c->needed);
    nereid_error_free(c->error);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->send_lock);
    free(c);
}

/* Copies a ready value into an unfilled client slot (ensemble outputs that
 * no step wrote into the client's memory, e.g. an input passed through). */
static nereid_error_t *fill_slot_copy(nereid_request_t *req, resp_output_t *o, const ens_value_t *v)
{
    nereid_error_t *err =
        request_alloc_output(req, o, v->datatype, v->shape, v->rank, v->byte_size);
    if (err) return err;
    if (v->byte_size) memcpy(o->data, v->data, v->byte_size);
    request_output_set_filled(o);
    return NULL;
}

static void fail_locked(ens_ctx_t *c, nereid_error_t *err)
{
    if (!c->error)
        c->error = err;
    else
        nereid_error_free(err);
}

/* Whether tensor t is written by a step (not an ensemble input passed
 * through). */
static bool written_by_step(const ensemble_t *e, size_t t)
{
    for (size_t s = 0; s < e->n_steps; s++)
        for (size_t i = 0; i < e->steps[s].n_out; i++)
            if (e->steps[s].out[i].tensor == t) return true;
    return false;
}

/* Triton's ensemble responses carry the request's sequence id and flags
 * (parameters sequence_id, sequence_start, sequence_end) when one of their
 * outputs was written by a step. */
static void set_sequence_params(const ens_ctx_t *c, nereid_response_t *resp)
{
    const nereid_request_t *req = c->req;
    bool from_step = false;
    for (size_t i = 0; i < resp->n_outputs && !from_step; i++) {
        size_t t = find_tensor(c->e, resp->outputs[i].name);
        from_step = t != (size_t)-1 && resp->outputs[i].filled && written_by_step(c->e, t);
    }
    if (!from_step) return;
    if (req->corr_id_str) {
        response_set_parameter(resp, "sequence_id", NEREID_PARAMETER_STRING, req->corr_id_str);
    } else {
        int64_t id = (int64_t)req->corr_id;
        response_set_parameter(resp, "sequence_id", NEREID_PARAMETER_INT, &id);
    }
    bool start = req->seq_start, end = req->seq_end;
    response_set_parameter(resp, "sequence_start", NEREID_PARAMETER_BOOL, &start);
    response_set_parameter(resp, "sequence_end", NEREID_PARAMETER_BOOL, &end);
}

/* Fills the unfilled output slots of req's response from lane l and gives
 * every output its client shape (ctx lock not held; values of a finished
 * lane no longer change). */
static nereid_error_t *fill_response(ens_ctx_t *c, const ens_lane_t *l)
{
    nereid_request_t *req = c->req;
    model_t *m = req->model;
    nereid_error_t *err = NULL;
    for (size_t i = 0; i < request_output_count(req) && !err;) {
        resp_output_t *o = request_output_at(req, i);
        if (request_output_filled(o)) {
            i++;
            continue;
        }
        size_t t = find_tensor(c->e, o->name);
        if (t != (size_t)-1 && l->values[t].ready) {
            err = fill_slot_copy(req, o, &l->values[t]);
            i++;
        } else if (t != (size_t)-1 && l->values[t].absent && !request_output_allocated(o)) {
            LOG_VERBOSE("Composing models did not output tensor %s", o->name);
            request_drop_output(req, i);
        } else {
            err = nereid_error_new(NEREID_ERROR_INTERNAL, "output '%s' was not produced", o->name);
        }
    }
    size_t n = request_output_count(req);
    for (size_t i = 0; i < n && !err; i++) {
        resp_output_t *o = request_output_at(req, i);
        size_t t = find_tensor(c->e, o->name);
        const model_io_t *io = NULL;
        for (size_t k = 0; k < m->n_outputs && !io; k++)
            if (strcmp(m->outputs[k].name, o->name) == 0) io = &m->outputs[k];
        if (io && t != (size_t)-1) {
            int64_t shape[NEREID_MAX_RANK];
            size_t rank;
            output_shape(m, io, &l->values[t], shape, &rank);
            request_output_set_shape(o, shape, rank);
        }
    }
    if (!err) set_sequence_params(c, req->response);
    return err;
}

/* Finishes the ensemble request (ctx lock not held, no step in flight). */
static void ctx_finish(ens_ctx_t *c)
{
    nereid_request_t *req = c->req;
    model_t *m = req->model;
    nereid_error_t *err = c->error;
    c->error = NULL;
    bool streamed = c->e->decoupled && request_is_streamed(req);
    /* A decoupled ensemble's responses went out lane by lane; its final
     * carries the flag alone (Triton's SendFlags). A caller that takes
     * one response got the first lane's in req's response. */
    if (!err && !streamed && !c->filled) err = fill_response(c, c->root);
    if (!err && streamed && c->final_lane) err = fill_response(c, c->final_lane);
    if (!err && streamed && !c->final_lane) request_final_flags_only(req);
    if (err) {
        /* Triton names the ensemble in front of any failure inside it. */
        nereid_error_t *wrapped = nereid_error_new(nereid_error_code(err), "in ensemble '%s', %s",
                                                   m->name, nereid_error_message(err));
        nereid_error_free(err);
        err = wrapped;
    }
    /* One execution with the steps' summed queue and compute durations. */
    if (!err) request_record_stats(req, &c->agg);
    /* Triton counts every failed ensemble request under reason OTHER, and
     * twice: its error response (RespondIfError) and again when its request
     * tracker ends (ReportStatisticsWithDuration). L0_model_queue's
     * test_policy_reject wants 2 per ensemble request a step's queue
     * rejected. A cancelled request counts once, as CANCELED. */
    if (err && nereid_error_code(err) != NEREID_ERROR_CANCELLED)
        request_count_failure(req, FAILURE_OTHER);
    request_finish(req, err, FAILURE_OTHER);
    /* The response took the ensemble's reference and may be freed already:
     * from here on only c itself (no c->e, no m) is touched. */
    ctx_free(c);
}

/* Whether every output the client asked for is there in lane l, ready or
 * left out by its step (ctx lock held). */
static bool lane_complete(ens_ctx_t *c, const ens_lane_t *l)
{
    size_t n = request_output_count(c->req);
    for (size_t i = 0; i < n; i++) {
        size_t t = find_tensor(c->e, request_output_at(c->req, i)->name);
        if (t == (size_t)-1 || !(l->values[t].ready || l->values[t].absent)) return false;
    }
    return true;
}

/* Sends lane l's outputs as one response of a decoupled ensemble (or, for
 * a caller that takes one response, fills req's response with the first
 * lane's). Ctx lock not held. */
static void send_lane(ens_ctx_t *c, const ens_lane_t *l)
{
    nereid_request_t *req = c->req;
    model_t *m = req->model;
    nereid_error_t *err = NULL;
    pthread_mutex_lock(&c->send_lock);
    if (!request_is_streamed(req)) {
        if (c->filled)
            err = nereid_error_new(NEREID_ERROR_UNSUPPORTED,
                                   "this request to decoupled model '%s' accepts one response only",
                                   m->name);
        else
            err = fill_response(c, l);
        c->filled = true;
        pthread_mutex_unlock(&c->send_lock);
        if (err) {
            pthread_mutex_lock(&c->lock);
            fail_locked(c, err);
            pthread_mutex_unlock(&c->lock);
        }
        return;
    }
    nereid_response_t *resp = request_new_response(req);
    for (size_t i = 0; i < resp->n_outputs && !err; i++) {
        resp_output_t *o = &resp->outputs[i];
        size_t t = find_tensor(c->e, o->name);
        const model_io_t *io = NULL;
        for (size_t k = 0; k < m->n_outputs && !io; k++)
            if (strcmp(m->outputs[k].name, o->name) == 0) io = &m->outputs[k];
        if (t == (size_t)-1 || !io || !l->values[t].ready) continue; /* left out */
        const ens_value_t *v = &l->values[t];
        int64_t shape[NEREID_MAX_RANK];
        size_t rank;
        output_shape(m, io, v, shape, &rank);
        err = response_alloc_output(req, resp, o, v->datatype, shape, rank, v->byte_size);
        if (err) break;
        if (v->byte_size) memcpy(o->data, v->data, v->byte_size);
        request_output_set_filled(o);
    }
    if (!err) {
        set_sequence_params(c, resp);
        request_send_response(req, resp);
    } else {
        nereid_response_free(resp);
    }
    pthread_mutex_unlock(&c->send_lock);
    if (err) {
        pthread_mutex_lock(&c->lock);
        fail_locked(c, err);
        pthread_mutex_unlock(&c->lock);
    }
}

static void launch(ens_ctx_t *c, ens_lane_t *lane, size_t step);
static void step_slot_free(ensemble_t *e, size_t step);

/* Drops one in-flight count; launches lane's steps that became ready. */
static void ctx_release(ens_ctx_t *c, ens_lane_t *lane, size_t *ready, size_t n_ready)
{
    for (size_t i = 0; i < n_ready; i++)
        launch(c, lane, ready[i]);
    pthread_mutex_lock(&c->lock);
    bool done = --c->inflight == 0;
    pthread_mutex_unlock(&c->lock);
    if (done) ctx_finish(c);
}

/* Marks tensor t ready in lane (ctx lock held); appends steps now runnable. */
static void publish(ens_ctx_t *c, ens_lane_t *lane, size_t t, size_t *ready, size_t *n_ready)
{
    ens_tensor_t *tensor = &c->e->tensors[t];
    for (size_t k = 0; k < tensor->n_consumers; k++) {
        size_t s = tensor->consumers[k];
        if (--lane->waiting[s] == 0 && !c->error && c->needed[s]) {
            ready[(*n_ready)++] = s;
            c->inflight++;
        }
    }
}

/* A step's output allocator: ensemble outputs the client asked for go
 * straight into the client's response. */
static nereid_error_t *step_alloc(void *userp, const char *output_name, nereid_datatype_t dt,
                                  const int64_t *shape, size_t rank, size_t byte_size,
                                  void **buffer, void **buffer_userp)
{
    ens_call_t *call = userp;
    ens_ctx_t *c = call->ctx;
    ens_step_t *st = &c->e->steps[call->step];
    const char *tensor = NULL;
    for (size_t i = 0; i < st->n_out; i++)
        if (strcmp(st->out[i].model_name, output_name) == 0)
            tensor = c->e->tensors[st->out[i].tensor].name;
    nereid_request_t *req = c->req;
    pthread_mutex_lock(&c->lock);
    /* A decoupled ensemble copies each lane's outputs into a response of
     * their own: no step writes into the client's. */
    resp_output_t *o = tensor && !c->e->decoupled ? request_find_output(req, tensor) : NULL;
    if (o && !request_output_allocated(o)) {
        nereid_error_t *err = request_alloc_output(req, o, dt, shape, rank, byte_size);
        pthread_mutex_unlock(&c->lock);
        if (err) return err;
        *buffer = o->data;
        *buffer_userp = &routed_marker;
        return NULL;
    }
    pthread_mutex_unlock(&c->lock);
    *buffer = xmalloc(byte_size ? byte_size : 1);
    *buffer_userp = NULL;
    return NULL;
}

static void step_release(void *userp, void *buffer, void *buffer_userp, size_t byte_size)
{
    (void)userp, (void)byte_size;
    if (buffer_userp != &routed_marker) free(buffer);
}

/* One response of a step request (final: its last call). A decoupled
 * step's response forks a new lane from the one the step ran in. */
static void step_response(ens_call_t *call, nereid_response_t *resp, bool final)
{
    ens_ctx_t *c = call->ctx;
    ens_step_t *st = &c->e->steps[call->step];
    ens_lane_t *lane = call->lane;
    size_t *ready = xcalloc(c->e->n_steps ? c->e->n_steps : 1, sizeof *ready);
    size_t n_ready = 0;
    bool send = false;
    pthread_mutex_lock(&c->lock);
    const nereid_error_t *rerr = resp ? nereid_response_error(resp) : NULL;
    if (!resp) {
        /* a decoupled step's final flag alone */
    } else if (rerr) {
        fail_locked(c, nereid_error_new(nereid_error_code(rerr), "%s", nereid_error_message(rerr)));
        nereid_response_free(resp);
    } else if (c->error) {
        nereid_response_free(resp); /* the request failed: nothing more runs */
    } else {
        if (st->decoupled) lane = lane_fork(c, call->lane);
        c->responses = xrealloc(c->responses, (c->n_responses + 1) * sizeof *c->responses);
        c->responses[c->n_responses++] = resp;
        bool output_written = false;
        for (size_t i = 0; i < st->n_out; i++) {
            size_t t = st->out[i].tensor;
            ens_value_t *v = &lane->values[t];
            bool found = false;
            for (size_t k = 0; k < nereid_response_output_count(resp) && !found; k++) {
                const char *name;
                const int64_t *shape;
                nereid_response_output(resp, k, &name, &v->datatype, &shape, &v->rank, &v->data,
                                       &v->byte_size, NULL);
                if (strcmp(name, st->out[i].model_name) != 0) continue;
                found = true;
                v->batch_size = call->batch_size;
                if (v->rank > NEREID_MAX_RANK) v->rank = NEREID_MAX_RANK;
                memcpy(v->shape, shape, v->rank * sizeof *shape);
            }
            resp_output_t *o = request_find_output(c->req, c->e->tensors[t].name);
            output_written |= o != NULL;
            if (!found) {
                /* Triton: a placeholder that lets readers with an optional
                 * input run; a requested ensemble output is left out. */
                v->absent = true;
                publish(c, lane, t, ready, &n_ready);
                continue;
            }
            /* A routed ensemble output is now filled in the client response. */
            if (o && request_output_allocated(o) && o->data == v->data)
                request_output_set_filled(o);
            v->ready = true;
            publish(c, lane, t, ready, &n_ready);
        }
        if (c->e->decoupled && output_written && !lane->sent && lane_complete(c, lane)) {
            lane->sent = true;
            /* The last step in flight: this response is the final one. */
            if (final && c->inflight == 1 && n_ready == 0 && request_is_streamed(c->req))
                c->final_lane = lane;
            else
                send = true;
        }
    }
    pthread_mutex_unlock(&c->lock);
    if (send) send_lane(c, lane);
    if (!final) {
        for (size_t i = 0; i < n_ready; i++)
            launch(c, lane, ready[i]);
        free(ready);
        return;
    }
    size_t step = call->step;
    free(call);
    /* c->e stays valid: the ensemble request (and so its model) lives until
     * ctx_release below drops the last in-flight count. */
    step_slot_free(c->e, step);
    ctx_release(c, lane, ready, n_ready);
    free(ready);
}

static void step_done(nereid_response_t *resp, void *userp)
{
    step_response(userp, resp, true);
}

static void step_stream(nereid_response_t *resp, uint32_t flags, void *userp)
{
    step_response(userp, resp, (flags & NEREID_RESPONSE_FINAL) != 0);
}

static void copy_params(nereid_request_t *dst, const nereid_request_t *src)
{
    for (size_t i = 0; i < src->n_params; i++) {
        const req_param_t *p = &src->params[i];
        nereid_error_t *err = NULL;
        switch (p->type) {
        case PARAM_STRING:
            err = nereid_request_set_parameter_string(dst, p->key, p->s);
            break;
        case PARAM_INT:
            err = nereid_request_set_parameter_int(dst, p->key, p->i);
            break;
        case PARAM_BOOL:
            err = nereid_request_set_parameter_bool(dst, p->key, p->b);
            break;
        case PARAM_DOUBLE:
            err = nereid_request_set_parameter_double(dst, p->key, p->d);
            break;
        }
        nereid_error_free(err);
    }
}

static void submit_step(ens_ctx_t *c, ens_lane_t *lane, size_t step);

/* Launches queued step submissions on this thread one after another, so a
 * completion that runs inline inside a submission (and frees a slot that a
 * pending step takes) does not nest another submission in its stack. */
static _Thread_local struct {
    ens_pending_t *head, *tail;
    bool active;
} trampoline;

static void launch_pending(ens_pending_t *p)
{
    p->next = NULL;
    if (trampoline.tail)
        trampoline.tail->next = p;
    else
        trampoline.head = p;
    trampoline.tail = p;
    if (trampoline.active) return;
    trampoline.active = true;
    ens_pending_t *n;
    while ((n = trampoline.head)) {
        trampoline.head = n->next;
        if (!trampoline.head) trampoline.tail = NULL;
        ens_ctx_t *c = n->ctx;
        ens_lane_t *lane = n->lane;
        size_t step = n->step;
        free(n);
        submit_step(c, lane, step);
    }
    trampoline.active = false;
}

/* Submits one step now or, at the step's max_inflight_requests, queues it
 * (its in-flight count was taken by the caller either way). */
static void launch(ens_ctx_t *c, ens_lane_t *lane, size_t step)
{
    ensemble_t *e = c->e;
    if (e->limits) {
        ens_limit_t *l = &e->limits[step];
        pthread_mutex_lock(&l->lock);
        if (l->inflight >= e->max_inflight) {
            ens_pending_t *p = xcalloc(1, sizeof *p);
            p->ctx = c;
            p->lane = lane;
            p->step = step;
            if (l->tail)
                l->tail->next = p;
            else
                l->head = p;
            l->tail = p;
            pthread_mutex_unlock(&l->lock);
            return;
        }
        l->inflight++;
        pthread_mutex_unlock(&l->lock);
    }
    submit_step(c, lane, step);
}

/* A step request of this step completed (or was never submitted): its slot
 * goes to the oldest waiting submission, if any. */
static void step_slot_free(ensemble_t *e, size_t step)
{
    if (!e->limits) return;
    ens_limit_t *l = &e->limits[step];
    pthread_mutex_lock(&l->lock);
    ens_pending_t *p = l->head;
    if (p) {
        l->head = p->next;
        if (!l->head) l->tail = NULL;
    } else {
        l->inflight--;
    }
    pthread_mutex_unlock(&l->lock);
    if (p) launch_pending(p);
}

/* Submits one step of lane (its in-flight count and limit slot were
 * taken). */
static void submit_step(ens_ctx_t *c, ens_lane_t *lane, size_t step)
{
    ens_step_t *st = &c->e->steps[step];
    nereid_request_t *src = c->req;
    nereid_request_t *r = NULL;
    nereid_error_t *err = NULL;
    ens_call_t *call = xcalloc(1, sizeof *call);
    call->ctx = c;
    call->lane = lane;
    call->step = step;
    /* A cancelled ensemble submits no further step (Triton's); its queued
     * steps carry its cancel token and are cancelled by their schedulers. */
    if (request_cancelled(src))
        err = nereid_error_new(NEREID_ERROR_CANCELLED, "%s", "");
    else
        err = nereid_request_new(src->server, st->model, st->version, &r);
    if (!err && src->id) err = nereid_request_set_id(r, src->id);
    for (size_t i = 0; !err && i < st->n_in; i++) {
        const ens_value_t *v = &lane->values[st->in[i].tensor];
        if (v->absent) continue; /* the step's model decides whether it may be missing */
        int64_t shape[NEREID_MAX_RANK];
        size_t rank;
        convert_dims(st->in[i].dims, st->in[i].rank, st->batching, v->batch_size, v->shape, v->rank,
                     shape, &rank);
        if (st->batching && rank > 0 && call->batch_size == 0) call->batch_size = shape[0];
        err = nereid_request_add_input(r, st->in[i].model_name, v->datatype, shape, rank, v->data,
                                       v->byte_size);
    }
    for (size_t i = 0; !err && i < st->n_out; i++)
        err = nereid_request_add_requested_output(r, st->out[i].model_name, 0);
    if (!err) {
        nereid_request_set_priority(r, src->priority);
        nereid_request_set_timeout_us(r, src->timeout_us);
        r->deadline_ns = src->deadline_ns; /* measured from the ensemble request's arrival */
        if (src->corr_id_str)
            err = nereid_request_set_correlation_id_string(r, src->corr_id_str);
        else if (src->corr_id)
            nereid_request_set_correlation_id(r, src->corr_id);
        nereid_request_set_sequence_flags(r, src->seq_start, src->seq_end);
        copy_params(r, src);
    }
    if (!err) {
        r->parent_stats = &c->agg;
        r->foreign = src->foreign; /* its inputs, and its final outputs (step_alloc) */
        if (src->trace) request_inherit_trace(r, src);
        request_share_cancel(r, src);
        nereid_response_allocator_t alloc = {
            .alloc_fn = step_alloc, .release_fn = step_release, .userp = call};
        if (st->decoupled)
            err = c->e->base.core->submit_stream(c->held[step], r, &alloc, step_stream, call);
        else
            err = c->e->base.core->submit(c->held[step], r, &alloc, step_done, call);
    }
    if (err) {
        free(call);
        if (r) nereid_request_free(r);
        pthread_mutex_lock(&c->lock);
        fail_locked(c, err);
        pthread_mutex_unlock(&c->lock);
        step_slot_free(c->e, step);
        ctx_release(c, lane, NULL, 0);
    }
}

/* Marks the steps the response needs (Triton prunes the others): those
 * writing a requested ensemble output, then, transitively, those writing a
 * tensor a needed step reads. */
static void mark_needed(ens_ctx_t *c)
{
    ensemble_t *e = c->e;
    bool *tensor_needed = xcalloc(e->n_tensors ? e->n_tensors : 1, sizeof *tensor_needed);
    size_t n = request_output_count(c->req);
    for (size_t i = 0; i < n; i++) {
        size_t t = find_tensor(e, request_output_at(c->req, i)->name);
        if (t != (size_t)-1) tensor_needed[t] = true;
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t s = 0; s < e->n_steps; s++) {
            if (c->needed[s]) continue;
            const ens_step_t *st = &e->steps[s];
            for (size_t k = 0; k < st->n_out && !c->needed[s]; k++)
                c->needed[s] = tensor_needed[st->out[k].tensor];
            if (!c->needed[s]) continue;
            changed = true;
            for (size_t k = 0; k < st->n_in; k++)
                tensor_needed[st->in[k].tensor] = true;
        }
    }
    free(tensor_needed);
}

/* ---- Scheduler ops ---- */

static nereid_error_t *ensemble_enqueue(scheduler_t *s, nereid_request_t *req)
{
    ensemble_t *e = (ensemble_t *)s;
    if (atomic_load(&e->stopped))
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready");
    ens_ctx_t *c = xcalloc(1, sizeof *c);
    c->e = e;
    c->core = s->core;
    c->req = req;
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->send_lock, NULL);
    c->root = lane_new(e, NULL);
    ens_lane_t *root = c->root;
    c->needed = xcalloc(e->n_steps ? e->n_steps : 1, sizeof *c->needed);
    mark_needed(c);
    /* Hold every composing model for the request's whole life (Triton's
     * per-request model handles): unloading one, e.g. with the ensemble's
     * unload_dependents, waits for this request instead of failing its
     * later steps. A model that is not served fails the request. */
    c->held = xcalloc(e->n_steps ? e->n_steps : 1, sizeof *c->held);
    c->n_held = e->n_steps;
    for (size_t i = 0; i < e->n_steps && !c->error; i++) {
        nereid_error_t *err = s->core->hold_model(req->server, e->steps[i].ns, e->steps[i].model,
                                                  e->steps[i].version, &c->held[i]);
        if (err) c->error = err;
    }
    req->t_compute_start_ns = util_now_ns();
    size_t *ready = xcalloc(e->n_steps ? e->n_steps : 1, sizeof *ready);
    size_t n_ready = 0;
    pthread_mutex_lock(&c->lock);
    c->inflight = 1; /* guard: released once the first steps are submitted */
    for (size_t i = 0; i < req->n_inputs; i++) {
        size_t t = find_tensor(e, req->inputs[i].name);
        if (t == (size_t)-1) continue;
        ens_value_t *v = &root->values[t];
        v->batch_size = e->base.model->max_batch_size > 0 ? req->batch_size : 0;
        v->datatype = req->inputs[i].datatype;
        v->rank = req->inputs[i].rank;
        memcpy(v->shape, req->inputs[i].shape, v->rank * sizeof *v->shape);
        v->data = req->inputs[i].data;
        v->byte_size = req->inputs[i].byte_size;
        v->ready = true;
        publish(c, root, t, ready, &n_ready);
    }
    /* Optional ensemble inputs the request lacks: their readers run
     * without them (Triton's L0_optional_input). */
    const model_t *em = e->base.model;
    for (size_t i = 0; i < em->config->n_input; i++) {
        const char *name = em->config->input[i]->name;
        if (request_find_input(req, name)) continue;
        size_t t = find_tensor(e, name);
        if (t == (size_t)-1 || root->values[t].ready || root->values[t].absent) continue;
        root->values[t].absent = true;
        publish(c, root, t, ready, &n_ready);
    }
    /* Steps without inputs (none in a valid config) would never start. */
    pthread_mutex_unlock(&c->lock);
    ctx_release(c, root, ready, n_ready);
    free(ready);
    return NULL;
}

static void ensemble_stop(scheduler_t *s)
{
    atomic_store(&((ensemble_t *)s)->stopped, true);
}

static void ensemble_destroy(scheduler_t *s)
{
    ensemble_t *e = (ensemble_t *)s;
    for (size_t i = 0; i < e->n_tensors; i++) {
        free(e->tensors[i].name);
        free(e->tensors[i].consumers);
    }
    free(e->tensors);
    for (size_t i = 0; i < e->n_steps; i++) {
        ens_step_t *st = &e->steps[i];
        free(st->model);
        free(st->ns);
        for (size_t k = 0; k < st->n_in; k++)
            free(st->in[k].model_name);
        for (size_t k = 0; k < st->n_out; k++)
            free(st->out[k].model_name);
        free(st->in);
        free(st->out);
    }
    free(e->steps);
    for (size_t i = 0; e->limits && i < e->n_steps; i++) /* no request left: queues empty */
        pthread_mutex_destroy(&e->limits[i].lock);
    free(e->limits);
    free(e);
}

static const scheduler_ops_t ensemble_ops = {
    .name = "ensemble",
    .enqueue = ensemble_enqueue,
    .next_batch = NULL,
    .stop = ensemble_stop,
    .destroy = ensemble_destroy,
};

/* ---- Load-time validation (Triton's ValidateEnsembleConfig) ---- */

static bool dims_agree(const int64_t *a, size_t ra, const int64_t *b, size_t rb)
{
    if (ra != rb) return false;
    for (size_t i = 0; i < ra; i++)
        if (a[i] != b[i] && a[i] != -1 && b[i] != -1) return false;
    return true;
}

/* The full shape as Triton prints it: -1 first when batching. */
static void format_full(char *buf, size_t cap, const int64_t *dims, size_t rank, bool batching)
{
    size_t n = (size_t)snprintf(buf, cap, "[%s", batching ? "-1" : "");
    for (size_t i = 0; i < rank && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i || batching ? "," : "",
                              (long long)dims[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* The config enum name of a datatype (TYPE_STRING for BYTES). */
static void config_type_name(char *buf, size_t cap, nereid_datatype_t dt)
{
    const char *n = nereid_datatype_name(dt);
    snprintf(buf, cap, "TYPE_%s", strcmp(n, "BYTES") == 0 ? "STRING" : n);
}

static const model_io_t *find_io(const model_io_t *ios, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(ios[i].name, name) == 0) return &ios[i];
    return NULL;
}

/* Gives tensor t what model `origin` says of it, or checks that it agrees
 * with what an earlier model said: dims compared without the batch
 * dimension, then as full shapes (a non-batching [-1,d..] meets a batching
 * [d..]); -1 matches anything. */
static nereid_error_t *meet_tensor(model_t *ens, ens_tensor_t *t, const char *origin, bool batching,
                                   nereid_datatype_t dt, const int64_t *dims, size_t rank)
{
    if (!t->known) {
        t->known = true;
        t->origin = origin;
        t->batching = batching;
        t->datatype = dt;
        t->rank = rank < NEREID_MAX_RANK ? rank : NEREID_MAX_RANK;
        memcpy(t->dims, dims, t->rank * sizeof *dims);
        return NULL;
    }
    if (t->datatype != dt) {
        char a[32], b[32];
        config_type_name(a, sizeof a, t->datatype);
        config_type_name(b, sizeof b, dt);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "in ensemble %s, ensemble tensor %s: inconsistent data type: %s is "
                                "inferred from model %s while %s is inferred from model %s",
                                ens->name, t->name, a, t->origin, b, origin);
    }
    int64_t fa[NEREID_MAX_RANK + 1], fb[NEREID_MAX_RANK + 1];
    size_t ra = 0, rb = 0;
    if (t->batching) fa[ra++] = -1;
    for (size_t i = 0; i < t->rank; i++)
        fa[ra++] = t->dims[i];
    if (batching) fb[rb++] = -1;
    for (size_t i = 0; i < rank && i < NEREID_MAX_RANK; i++)
        fb[rb++] = dims[i];
    if (!dims_agree(t->dims, t->rank, dims, rank) && !dims_agree(fa, ra, fb, rb)) {
        char a[256], b[256];
        format_full(a, sizeof a, t->dims, t->rank, t->batching);
        format_full(b, sizeof b, dims, rank, batching);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "in ensemble %s, ensemble tensor %s: inconsistent shape: %s is "
                                "inferred from model %s while %s is inferred from model %s",
                                ens->name, t->name, a, t->origin, b, origin);
    }
    return NULL;
}

/* Checks one step's mappings against its model's config (Triton's
 * ValidateTensorMapping, same order and texts). */
static nereid_error_t *check_step(ensemble_t *e, model_t *ens, ens_step_t *st, model_t *sm)
{
    bool batching = sm->max_batch_size > 0;
    st->batching = batching;
    for (size_t i = 0; i < st->n_in; i++)
        if (!find_io(sm->inputs, sm->n_inputs, st->in[i].model_name))
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "in ensemble %s, ensemble tensor %s is mapping to non-existing "
                                    "input %s in model %s",
                                    ens->name, e->tensors[st->in[i].tensor].name,
                                    st->in[i].model_name, st->model);
    for (size_t k = 0; k < sm->n_inputs; k++) {
        const model_io_t *io = &sm->inputs[k];
        size_t mapped = 0;
        for (size_t i = 0; i < st->n_in; i++) {
            if (strcmp(st->in[i].model_name, io->name) != 0) continue;
            st->in[i].rank = io->rank;
            memcpy(st->in[i].dims, io->dims, io->rank * sizeof *io->dims);
            nereid_error_t *err = meet_tensor(ens, &e->tensors[st->in[i].tensor], st->model,
                                              batching, io->datatype, io->dims, io->rank);
            if (err) return err;
            mapped++;
        }
        if (mapped == 0 && !io->optional)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "in ensemble %s, input %s in model %s is not mapped to any "
                                    "ensemble tensors",
                                    ens->name, io->name, st->model);
        if (mapped > 1)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "in ensemble %s, input %s in model %s is mapped to multiple "
                                    "ensemble tensors",
                                    ens->name, io->name, st->model);
    }
    for (size_t i = 0; i < st->n_out; i++)
        if (!find_io(sm->outputs, sm->n_outputs, st->out[i].model_name))
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "in ensemble %s, ensemble tensor %s is mapped from "
                                    "non-existing output %s in model %s",
                                    ens->name, e->tensors[st->out[i].tensor].name,
                                    st->out[i].model_name, st->model);
    for (size_t i = 0; i < st->n_out; i++) {
        const model_io_t *io = find_io(sm->outputs, sm->n_outputs, st->out[i].model_name);
        nereid_error_t *err = meet_tensor(ens, &e->tensors[st->out[i].tensor], st->model, batching,
                                          io->datatype, io->dims, io->rank);
        if (err) return err;
    }
    return NULL;
}

/* Triton's check of the decoupled data flow (ValidateEnsembleConfig): a
 * tensor a decoupled step writes starts a new label (all outputs of one
 * step share theirs), any other tensor takes its inputs' label; a tensor
 * (or the ensemble's outputs together) whose inputs carry different labels
 * mixes responses of different decoupled models and is refused. The walk
 * goes breadth-first from the ensemble inputs, in Triton's edge order. */
static nereid_error_t *check_decoupled_flow(ensemble_t *e, model_t *ens, bool *decoupled_out)
{
    typedef struct node {
        size_t *prev, n_prev, *next, n_next;
        bool decoupled, visited;
        size_t label;
        size_t step; /* the step writing it (its sibling group), or SIZE_MAX */
    } node_t;
    size_t n = e->n_tensors + 1, sink = e->n_tensors;
    node_t *nodes = xcalloc(n, sizeof *nodes);
    bool *step_seen = xcalloc(e->n_steps ? e->n_steps : 1, sizeof *step_seen);
    size_t *step_label = xcalloc(e->n_steps ? e->n_steps : 1, sizeof *step_label);
    size_t *queue = xcalloc(n, sizeof *queue), head = 0, tail = 0;
    for (size_t i = 0; i < n; i++)
        nodes[i].step = SIZE_MAX;
#define EDGE(a, b)                                                                                 \
    do {                                                                                           \
        nodes[b].prev = xrealloc(nodes[b].prev, (nodes[b].n_prev + 1) * sizeof(size_t));           \
        nodes[b].prev[nodes[b].n_prev++] = (a);                                                    \
        nodes[a].next = xrealloc(nodes[a].next, (nodes[a].n_next + 1) * sizeof(size_t));           \
        nodes[a].next[nodes[a].n_next++] = (b);                                                    \
    } while (0)
    for (size_t i = 0; i < ens->n_outputs; i++) {
        size_t t = find_tensor(e, ens->outputs[i].name);
        if (t != (size_t)-1) EDGE(t, sink);
    }
    for (size_t s = 0; s < e->n_steps; s++)
        for (size_t o = 0; o < e->steps[s].n_out; o++) {
            size_t t = e->steps[s].out[o].tensor;
            nodes[t].decoupled = e->steps[s].decoupled;
            nodes[t].step = s;
            for (size_t i = 0; i < e->steps[s].n_in; i++)
                EDGE(e->steps[s].in[i].tensor, t);
        }
#undef EDGE
    for (size_t i = 0; i < ens->n_inputs; i++) {
        size_t t = find_tensor(e, ens->inputs[i].name);
        if (t == (size_t)-1 || nodes[t].visited) continue;
        nodes[t].visited = true;
        queue[tail++] = t;
    }
    size_t labels = 0;
    nereid_error_t *err = NULL;
    while (head < tail && !err) {
        node_t *cur = &nodes[queue[head++]];
        for (size_t k = 0; k < cur->n_next && !err; k++) {
            size_t nx = cur->next[k];
            node_t *x = &nodes[nx];
            bool ready = !x->visited;
            for (size_t p = 0; ready && p < x->n_prev; p++)
                ready = nodes[x->prev[p]].visited;
            if (!ready) continue;
            size_t label = x->n_prev ? nodes[x->prev[0]].label : 0;
            for (size_t p = 0; p < x->n_prev && !err; p++)
                if (nodes[x->prev[p]].label != label)
                    err = nereid_error_new(
                        NEREID_ERROR_INVALID_ARG,
                        "in ensemble %s, step of model '%s' receives inputs "
                        "originated from different decoupled models",
                        ens->name,
                        nx == sink || !e->tensors[nx].origin ? ens->name : e->tensors[nx].origin);
            if (err) break;
            if (x->step != SIZE_MAX && step_seen[x->step]) {
                x->label = step_label[x->step];
            } else {
                x->label = x->decoupled ? ++labels : label;
                if (x->step != SIZE_MAX) {
                    step_label[x->step] = x->label;
                    step_seen[x->step] = true;
                }
            }
            x->visited = true;
            queue[tail++] = nx;
        }
    }
    /* Triton: the ensemble is decoupled when any of its steps is. */
    *decoupled_out = !err && labels != 0;
    for (size_t i = 0; i < n; i++) {
        free(nodes[i].prev);
        free(nodes[i].next);
    }
    free(nodes);
    free(step_seen);
    free(step_label);
    free(queue);
    return err;
}

/* Whether every step can run: its inputs are ensemble inputs or written by
 * steps that can run (the config check reports cycles with Triton's texts;
 * this keeps a request from waiting forever if one slips through). */
static nereid_error_t *check_flow(ensemble_t *e, model_t *ens)
{
    bool *avail = xcalloc(e->n_tensors ? e->n_tensors : 1, sizeof *avail);
    bool *done = xcalloc(e->n_steps ? e->n_steps : 1, sizeof *done);
    for (size_t i = 0; i < ens->n_inputs; i++) {
        size_t t = find_tensor(e, ens->inputs[i].name);
        if (t != (size_t)-1) avail[t] = true;
    }
    for (bool progress = true; progress;) {
        progress = false;
        for (size_t s = 0; s < e->n_steps; s++) {
            bool ready = !done[s];
            for (size_t i = 0; ready && i < e->steps[s].n_in; i++)
                ready = avail[e->steps[s].in[i].tensor];
            if (!ready) continue;
            done[s] = progress = true;
            for (size_t i = 0; i < e->steps[s].n_out; i++)
                avail[e->steps[s].out[i].tensor] = true;
        }
    }
    nereid_error_t *err = NULL;
    for (size_t s = 0; s < e->n_steps && !err; s++)
        if (!done[s])
            err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                   "ensemble '%s' has a cycle or a step whose inputs are never "
                                   "produced: step %zu (model '%s')",
                                   ens->name, s, e->steps[s].model);
    for (size_t i = 0; i < ens->n_outputs && !err; i++) {
        size_t t = find_tensor(e, ens->outputs[i].name);
        if (t == (size_t)-1 || !avail[t])
            err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                   "output '%s' for ensemble '%s' is not written",
                                   ens->outputs[i].name, ens->name);
    }
    free(avail);
    free(done);
    return err;
}

/* An ensemble output without labels takes those of the composing model's
 * output that writes it (as Triton completes the ensemble's labels). */
static void take_labels(model_io_t *out, const model_io_t *from)
{
    if ((out->n_labels && out->labels[0][0]) || !from || !from->n_labels) return;
    /* The io table's layout (model.c): labels point into one label_text. */
    size_t len = 0;
    for (size_t l = 0; l < from->n_labels; l++)
        len += strlen(from->labels[l]) + 1;
    char *text = xmalloc(len), *p = text;
    char **labels = xcalloc(from->n_labels, sizeof *labels);
    for (size_t l = 0; l < from->n_labels; l++) {
        size_t n = strlen(from->labels[l]) + 1;
        memcpy(p, from->labels[l], n);
        labels[l] = p;
        p += n;
    }
    free(out->labels);
    free(out->label_text);
    out->labels = labels;
    out->label_text = text;
    out->n_labels = from->n_labels;
}

static nereid_error_t *validate(ensemble_t *e, model_t *ens)
{
    bool batching = ens->max_batch_size > 0;
    const model_io_t *lists[2] = {ens->inputs, ens->outputs};
    size_t counts[2] = {ens->n_inputs, ens->n_outputs};
    for (int l = 0; l < 2; l++)
        for (size_t i = 0; i < counts[l]; i++) {
            const model_io_t *io = &lists[l][i];
            size_t t = find_tensor(e, io->name);
            if (t == (size_t)-1 || e->tensors[t].known) continue;
            meet_tensor(ens, &e->tensors[t], ens->name, batching, io->datatype,
                        io->has_reshape ? io->reshape : io->dims,
                        io->has_reshape ? io->reshape_rank : io->rank);
        }
    nereid_error_t *err = NULL;
    for (size_t s = 0; s < e->n_steps && !err; s++) {
        ens_step_t *st = &e->steps[s];
        model_t *sm = NULL;
        err = e->base.core->hold_model(ens->server, st->ns, st->model, st->version, &sm);
        if (err) {
            nereid_error_t *wrapped = nereid_error_new(
                NEREID_ERROR_INVALID_ARG,
                "ensemble '%s' depends on '%s' which has no loaded version", ens->name, st->model);
            nereid_error_free(err);
            err = wrapped;
            break;
        }
        if (sm->max_batch_size != 0 && sm->max_batch_size < ens->max_batch_size)
            err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                   "ensemble %s allows maximum batch size %lld, but it contains "
                                   "model %s which only allows maximum batch size to be %lld",
                                   ens->name, (long long)ens->max_batch_size, st->model,
                                   (long long)sm->max_batch_size);
        if (!err) err = check_step(e, ens, st, sm);
        st->decoupled =
            sm->config->model_transaction_policy && sm->config->model_transaction_policy->decoupled;
        for (size_t i = 0; !err && i < st->n_out; i++) {
            model_io_t *out = NULL;
            for (size_t k = 0; k < ens->n_outputs; k++)
                if (strcmp(ens->outputs[k].name, e->tensors[st->out[i].tensor].name) == 0)
                    out = &ens->outputs[k];
            if (out) take_labels(out, find_io(sm->outputs, sm->n_outputs, st->out[i].model_name));
        }
        e->base.core->release_model(sm);
    }
    bool decoupled = false;
    if (!err) err = check_decoupled_flow(e, ens, &decoupled);
    /* Triton validates the ensemble again as decoupled: no response cache. */
    if (!err && decoupled && ens->config->response_cache && ens->config->response_cache->enable)
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "Response Cache does not currently support model %s with "
                               "'decoupled' transaction policy. Please disable the response cache.",
                               ens->name);
    if (!err) err = check_flow(e, ens);
    /* Returned to the core (scheduler_t.decoupled), which marks the
     * ensemble's config decoupled. */
    if (!err && decoupled) e->decoupled = e->base.decoupled = true;
    return err;
}

nereid_error_t *ensemble_scheduler_create(model_t *m, const sched_core_t *core, scheduler_t **out)
{
    *out = NULL;
    const Inference__ModelEnsembling *es = m->config->ensemble_scheduling;
    if (!es || es->n_step == 0)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "must specify 'step' for ensemble '%s'",
                                m->name);
    ensemble_t *e = xcalloc(1, sizeof *e);
    e->base.ops = &ensemble_ops;
    e->base.model = m;
    e->base.core = core;
    e->steps = xcalloc(es->n_step, sizeof *e->steps);
    e->n_steps = es->n_step;
    for (size_t s = 0; s < es->n_step; s++) {
        const Inference__ModelEnsembling__Step *src = es->step[s];
        ens_step_t *st = &e->steps[s];
        st->model = xstrdup(src->model_name);
        /* --model-namespacing: the copy the repository resolved it to */
        st->ns =
            src->model_namespace && *src->model_namespace ? xstrdup(src->model_namespace) : NULL;
        st->version = src->model_version > 0 ? src->model_version : -1;
        st->in = xcalloc(src->n_input_map ? src->n_input_map : 1, sizeof *st->in);
        st->n_in = src->n_input_map;
        for (size_t i = 0; i < src->n_input_map; i++) {
            st->in[i].model_name = xstrdup(src->input_map[i]->key);
            st->in[i].tensor = tensor_index(e, src->input_map[i]->value);
        }
        st->out = xcalloc(src->n_output_map ? src->n_output_map : 1, sizeof *st->out);
        st->n_out = src->n_output_map;
        for (size_t i = 0; i < src->n_output_map; i++) {
            st->out[i].model_name = xstrdup(src->output_map[i]->key);
            st->out[i].tensor = tensor_index(e, src->output_map[i]->value);
        }
    }
    /* Consumers: a step reading one tensor through two inputs waits once
     * per input, so it is listed once per input too. */
    for (size_t s = 0; s < e->n_steps; s++)
        for (size_t i = 0; i < e->steps[s].n_in; i++) {
            ens_tensor_t *t = &e->tensors[e->steps[s].in[i].tensor];
            t->consumers = xrealloc(t->consumers, (t->n_consumers + 1) * sizeof *t->consumers);
            t->consumers[t->n_consumers++] = s;
        }
    e->max_inflight = es->max_inflight_requests;
    if (e->max_inflight) {
        LOG_INFO("Ensemble model '%s' configured with max_inflight_requests: %u", m->name,
                 e->max_inflight);
        e->limits = xcalloc(e->n_steps, sizeof *e->limits);
        for (size_t i = 0; i < e->n_steps; i++)
            pthread_mutex_init(&e->limits[i].lock, NULL);
    }
    nereid_error_t *err = validate(e, m);
    if (err) {
        ensemble_destroy(&e->base);
        return err;
    }
    *out = &e->base;
    return NULL;
}
