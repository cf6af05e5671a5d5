/*
 * This file contains the pb_utils calls a worker makes besides
 * inference: its log lines (pb_utils.Logger), cancellation checks
 * (request.is_cancelled()), model control and custom metrics (the work is
 * python_api.c's; a model control call that may wait runs on a thread of
 * its own), and the model's is_ready() (Triton's user-defined model
 * readiness, nereid_backend_instance_ready).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nereid/common.h"
#include "python_internal.h"

void on_log(instance_t *in, msg_t *m)
{
    json_t *jl = json_object_get(m->json, "level");
    const char *text = json_string_value(json_object_get(m->json, "message"));
    const char *file = json_string_value(json_object_get(m->json, "file"));
    json_t *jline = json_object_get(m->json, "line");
    if (!text) return;
    json_int_t lv = json_is_integer(jl) ? json_integer_value(jl) : 0;
    nereid_log_level_t level = lv == 1   ? NEREID_LOG_WARN
                               : lv == 2 ? NEREID_LOG_ERROR
                               : lv == 3 ? NEREID_LOG_VERBOSE
                                         : NEREID_LOG_INFO;
    const char *base = file ? strrchr(file, '/') : NULL;
    json_int_t line = json_is_integer(jline) ? json_integer_value(jline) : 0;
    nereid_log_message(level,
                       base   ? base + 1
                       : file ? file
                              : in->name,
                       line < 0 || line > INT32_MAX ? 0 : (int)line, text);
}

void on_cancel_query(instance_t *in, msg_t *m)
{
    json_t *id = json_object_get(m->json, "id"), *tok = json_object_get(m->json, "token");
    bool cancelled = false;
    json_t *jr = json_object_get(tok, "request"), *js = json_object_get(tok, "sender");
    if (json_is_integer(js)) {
        pthread_mutex_lock(&in->mu);
        for (sender_slot_t *p = in->senders; p; p = p->next)
            if (p->id == (uint64_t)json_integer_value(js))
                cancelled = nereid_sender_is_cancelled(p->sender);
        pthread_mutex_unlock(&in->mu);
    } else if (json_is_integer(jr)) {
        pthread_mutex_lock(&in->mu);
        json_int_t r = json_integer_value(jr);
        if (in->batch && r >= 0 && (size_t)r < nereid_batch_request_count(in->batch))
            cancelled = nereid_batch_request_is_cancelled(in->batch, (size_t)r);
        pthread_mutex_unlock(&in->mu);
    }
    send_json(in->chan, M_CANCEL_ANSWER,
              json_pack("{s:O, s:b}", "id", id ? id : json_null(), "cancelled", cancelled));
}

/* ---- pb_utils calls besides inference (python_api.c) ---- */

typedef struct api_job {
    instance_t *in;
    chan_t *chan;
    msg_t *msg;
} api_job_t;

static void api_answer(chan_t *c, json_t *call, json_t *answer)
{
    if (json_is_true(json_object_get(call, "noreply"))) { /* a metric update */
        json_decref(answer);
        return;
    }
    json_t *id = json_object_get(call, "id");
    json_object_set(answer, "id", json_is_integer(id) ? id : json_null());
    send_json(c, M_API_ANSWER, answer);
}

/* Model control may wait for loads and unloads: it runs on a thread of its
 * own, counted with the BLS calls so the instance outlives it. While the
 * model is being loaded (a call from its initialize) the thread acts for
 * that load (ABI 1.12): the load waits for initialize, which waits for
 * this call, so the call takes the models that load holds as its own (an
 * ensemble's steps) and is refused at once the model the load is loading,
 * instead of waiting for the load. */
static void *api_job_main(void *arg)
{
    api_job_t *job = arg;
    nereid_model_act_for_load(job->in->model);
    api_answer(job->chan, job->msg->json,
               python_api_model_control(job->in->server, job->msg->json, job->msg->blob,
                                        job->msg->blob_len));
    nereid_model_act_end();
    instance_t *in = job->in;
    msg_free(job->msg);
    chan_unref(job->chan);
    free(job);
    pthread_mutex_lock(&in->mu);
    in->bls_inflight--;
    pthread_cond_broadcast(&in->cv);
    pthread_mutex_unlock(&in->mu);
    return NULL;
}

/* is_model_ready is answered where it arrives (no thread): the lookup is
 * quick, and a Python model's is_ready() runs in that model's worker. When
 * the model asks about itself and defines is_ready(), the answer comes on
 * the socket this thread reads: the check reads it itself (ready_pump).
 * Such a check takes a thread when one already reads (nested), and when
 * the model has other instances: their answers come on sockets that their
 * own reading threads may be blocking in the same check. */
static bool ready_check_inline(instance_t *in, json_t *call)
{
    const char *op = json_string_value(json_object_get(call, "op"));
    const char *model = json_string_value(json_object_get(call, "model"));
    if (!op || !model || strcmp(op, "is_model_ready") != 0) return false;
    if (strcmp(model, nereid_model_name(in->model)) != 0) return true;
    pthread_mutex_lock(&in->mu);
    bool asks_worker = in->has_is_ready;
    pthread_mutex_unlock(&in->mu);
    return !asks_worker ||
           (tls_pump_depth == 0 && (!in->model_instances || atomic_load(in->model_instances) <= 1));
}

void api_call(instance_t *in, msg_t **m)
{
    if (!python_api_blocks((*m)->json)) {
        api_answer(in->chan, (*m)->json, python_api_metrics(in->api, (*m)->json));
        return;
    }
    if (ready_check_inline(in, (*m)->json)) {
        api_answer(in->chan, (*m)->json,
                   python_api_model_control(in->server, (*m)->json, (*m)->blob, (*m)->blob_len));
        return;
    }
    msg_t *msg = *m;
    *m = NULL;
    msg_own_blob(msg);
    api_job_t *job = malloc(sizeof *job);
    if (!job) abort();
    *job = (api_job_t){in, in->chan, msg};
    atomic_fetch_add(&in->chan->refs, 1);
    pthread_mutex_lock(&in->mu);
    in->bls_inflight++;
    pthread_mutex_unlock(&in->mu);
    nereid_run_detached(api_job_main, job);
}

/* ---- The model's is_ready() (Triton's user-defined model readiness) ---- */

#define READY_WAIT_S 5 /* Triton's kUserModelReadinessTimeoutMs */
#define READY_ERROR_MAX 4096

bool on_ready_answer(instance_t *in, msg_t *m, char *why, size_t why_cap)
{
    json_t *jr = json_object_get(m->json, "ready");
    const char *err = json_string_value(json_object_get(m->json, "error"));
    if (!json_is_boolean(jr) && !err) {
        snprintf(why, why_cap, "malformed readiness answer");
        return false;
    }
    pthread_mutex_lock(&in->mu);
    if (in->rq_inflight) {
        in->rq_inflight = false;
        in->rq_answers++;
        in->rq_ready = json_is_true(jr) && !err;
        free(in->rq_error);
        in->rq_error = err ? strndup(err, READY_ERROR_MAX) : NULL;
        pthread_cond_broadcast(&in->cv);
    }
    pthread_mutex_unlock(&in->mu);
    return true;
}

/* The answer the last is_ready() gave (in->mu held). */
static nereid_error_t *ready_result_locked(instance_t *in)
{
    if (in->rq_error) return nereid_error_new(NEREID_ERROR_INTERNAL, "%s", in->rq_error);
    if (!in->rq_ready)
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                                "Model '%s' is not ready (user-defined check failed).", in->name);
    return NULL;
}

/* A model-ready check (Triton's TRITONBACKEND_ModelInstanceReady): the
 * worker must be alive; a model with is_ready() is asked (in the worker, on
 * a thread of its own, so executes go on), at most once at a time: a check
 * that finds one in flight waits for its answer. Each waits at most 5 s;
 * an is_ready() still running then keeps running and answers later. */
NEREID_EXPORT nereid_error_t *nereid_backend_instance_ready(nereid_instance_t *instance)
{
    instance_t *in = nereid_instance_state(instance);
    if (!in) return NULL;
    pthread_mutex_lock(&in->mu);
    if (in->dead || in->restarting || in->restart_failed) { /* until a restart succeeded */
        pthread_mutex_unlock(&in->mu);
        return nereid_error_new(NEREID_ERROR_INTERNAL, "Stub process '%s' is not healthy.",
                                in->name);
    }
    if (!in->has_is_ready) {
        pthread_mutex_unlock(&in->mu);
        return NULL;
    }
    bool joined = in->rq_inflight;
    uint64_t seen = in->rq_answers;
    if (!joined) {
        in->rq_inflight = true;
        if (!in->exec_reading) reader_arm_locked(in); /* the answer comes between executes */
        chan_t *c = in->chan;
        atomic_fetch_add(&c->refs, 1);
        pthread_mutex_unlock(&in->mu);
        send_json(c, M_READY_QUERY, json_object());
        chan_unref(c);
        pthread_mutex_lock(&in->mu);
    }
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += READY_WAIT_S;
    bool timed_out = false;
    if (tls_reading == in) { /* nobody else reads the answer: read it here */
        pthread_mutex_unlock(&in->mu);
        timed_out = !ready_pump(in, seen, &dl);
        pthread_mutex_lock(&in->mu);
    }
    while (in->rq_answers == seen && !in->dead && !timed_out && !in->pump_fail)
        timed_out = pthread_cond_timedwait(&in->cv, &in->mu, &dl) == ETIMEDOUT;
    nereid_error_t *e;
    if (in->rq_answers != seen)
        e = ready_result_locked(in);
    else if (in->dead || in->pump_fail)
        e = nereid_error_new(NEREID_ERROR_INTERNAL,
                             "Stub process is not healthy while waiting for user-defined "
                             "is_ready() response");
    else if (joined)
        e = nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                             "Timed out waiting for in-flight is_ready() response");
    else
        e = nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                             "Timed out waiting for user-defined is_ready() response");
    pthread_mutex_unlock(&in->mu);
    return e;
}
