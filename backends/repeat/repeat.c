/*
 * This file contains the repeat backend, Nereid's counterpart of Triton's
 * repeat backend (the `repeat_int32` QA model): an example of a decoupled
 * model that answers one request with zero, one or many responses.
 *
 * The model has max_batch_size 0, inputs IN (INT32 [-1]), DELAY (UINT32,
 * IN's shape) and WAIT (UINT32 [1]), and outputs OUT (INT32 [1]) and IDX
 * (UINT32 [1]), in that order. For a request whose IN has n elements it
 * sends n responses: the i'th carries OUT = IN[i] and IDX = i and is sent
 * DELAY[i] milliseconds after the previous one; then the final flag alone.
 * IN of shape [0] gives no response, only the final flag. execute returns
 * after WAIT milliseconds while the responses go on from a thread of their
 * own, so one instance can serve several requests at once and their
 * responses interleave.
 *
 * Unlike Triton's repeat backend it stops when the client cancels: the
 * request then ends with a CANCELLED final response (ABI 1.4).
 *
 * Nereid extension for tests: the request parameter repeat_fail_at (int64)
 * k makes response k an error ("repeat: response k failed as the request
 * asked", INTERNAL), sent as the request's final response.
 *
 * A request that can take one response only (a model that is not decoupled,
 * or a client such as an ensemble step that accepts one response) is
 * answered the ABI 1.0 way when IN has exactly one element; a model that is
 * not decoupled answers a longer IN with its first response only (Triton's
 * frontends keep the first response of such a model); otherwise an error.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nereid/backend.h"

NEREID_EXPORT uint32_t nereid_backend_abi_version(void)
{
    return NEREID_BACKEND_ABI_VERSION;
}

/* One request's responses, sent from a thread of its own. */
typedef struct job {
    struct job *next;
    pthread_t thread;
    atomic_bool done;
    nereid_response_sender_t *sender;
    size_t n;
    int64_t fail_at; /* -1: none */
    int32_t *in;
    uint32_t *delay;
} job_t;

/* The instance's sending threads (only its execute and fini touch the
 * list): execute joins the finished ones, fini joins them all, so no
 * thread outlives the instance (or the library). */
typedef struct instance_state {
    job_t *jobs;
} instance_state_t;

static void job_free(job_t *job)
{
    free(job->in);
    free(job->delay);
    free(job);
}

/* Joins the finished threads (all with wait_all). */
static void reap(instance_state_t *st, bool wait_all)
{
    for (job_t **p = &st->jobs; *p;) {
        job_t *job = *p;
        if (!wait_all && !atomic_load(&job->done)) {
            p = &job->next;
            continue;
        }
        pthread_join(job->thread, NULL);
        *p = job->next;
        job_free(job);
    }
}

static void sleep_ms(uint32_t ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static void shape_text(char *buf, size_t cap, const int64_t *shape, size_t rank)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (size_t i = 0; i < rank && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* ---- Model: Triton's config checks, with its texts ---- */

static nereid_error_t *check_io(const char *what, const char *got, const char *want)
{
    if (strcmp(got, want) == 0) return NULL;
    return nereid_error_new(NEREID_ERROR_INVALID_ARG, "expected %s tensor name to be %s, got %s",
                            what, want, got);
}

static nereid_error_t *check_type(const char *name, nereid_datatype_t got, nereid_datatype_t want)
{
    if (got == want) return NULL;
    return nereid_error_new(NEREID_ERROR_INVALID_ARG, "expected %s datatype to be %s, got TYPE_%s",
                            name, nereid_datatype_name(want),
                            got == NEREID_TYPE_BYTES ? "STRING" : nereid_datatype_name(got));
}

static nereid_error_t *check_one(const char *name, const int64_t *dims, size_t rank)
{
    if (rank == 1 && dims[0] == 1) return NULL;
    char s[128];
    shape_text(s, sizeof s, dims, rank);
    return nereid_error_new(NEREID_ERROR_INVALID_ARG, "expected %s shape to be [1], got %s", name,
                            s);
}

NEREID_EXPORT nereid_error_t *nereid_backend_model_init(nereid_model_t *model)
{
    if (nereid_model_max_batch_size(model) != 0)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "repeat backend only supports models with max_batch_size == 0");
    size_t n_in = nereid_model_input_count(model), n_out = nereid_model_output_count(model);
    if (n_in != 3)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "expected 3 inputs, got %zu", n_in);
    if (n_out != 2)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "expected 2 outputs, got %zu", n_out);
    const char *name[5];
    nereid_datatype_t dt[5];
    const int64_t *dims[5];
    size_t rank[5];
    for (size_t i = 0; i < 3; i++)
        nereid_model_input(model, i, &name[i], &dt[i], &dims[i], &rank[i]);
    for (size_t i = 0; i < 2; i++)
        nereid_model_output(model, i, &name[3 + i], &dt[3 + i], &dims[3 + i], &rank[3 + i]);
    nereid_error_t *err;
    if ((err = check_io("first input", name[0], "IN")) ||
        (err = check_io("second input", name[1], "DELAY")) ||
        (err = check_io("third input", name[2], "WAIT")) ||
        (err = check_io("first output", name[3], "OUT")) ||
        (err = check_io("second output", name[4], "IDX")))
        return err;
    char a[128], b[128];
    shape_text(a, sizeof a, dims[0], rank[0]);
    if (rank[0] != 1)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "expected IN shape to have one dimension, got %s", a);
    if (rank[1] != 1 || dims[1][0] != dims[0][0]) {
        shape_text(b, sizeof b, dims[1], rank[1]);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "expected IN and DELAY shape to match, got %s and %s", a, b);
    }
    if ((err = check_one("WAIT", dims[2], rank[2])) || (err = check_one("OUT", dims[3], rank[3])) ||
        (err = check_one("IDX", dims[4], rank[4])))
        return err;
    if ((err = check_type("IN", dt[0], NEREID_TYPE_INT32)) ||
        (err = check_type("DELAY", dt[1], NEREID_TYPE_UINT32)) ||
        (err = check_type("WAIT", dt[2], NEREID_TYPE_UINT32)) ||
        (err = check_type("OUT", dt[3], NEREID_TYPE_INT32)) ||
        (err = check_type("IDX", dt[4], NEREID_TYPE_UINT32)))
        return err;
    return NULL;
}

/* ---- Instance ---- */

NEREID_EXPORT nereid_error_t *nereid_backend_instance_init(nereid_instance_t *instance)
{
    instance_state_t *st = calloc(1, sizeof *st);
    if (!st) return nereid_error_new(NEREID_ERROR_INTERNAL, "repeat backend: out of memory");
    nereid_instance_set_state(instance, st);
    return NULL;
}

NEREID_EXPORT nereid_error_t *nereid_backend_instance_fini(nereid_instance_t *instance)
{
    instance_state_t *st = nereid_instance_state(instance);
    if (!st) return NULL;
    reap(st, true);
    free(st);
    return NULL;
}

/* ---- Responses ---- */

/* Fills OUT and IDX of one response: the sender's next one, or (sender
 * NULL) request 0 of the batch. */
static nereid_error_t *send_outputs(nereid_response_sender_t *sender, nereid_batch_t *batch,
                                    int32_t value, uint32_t idx)
{
    const int64_t one = 1;
    void *out, *ix;
    nereid_error_t *err;
    if (sender) {
        if ((err = nereid_sender_output(sender, "OUT", NEREID_TYPE_INT32, &one, 1, 4, &out)) ||
            (err = nereid_sender_output(sender, "IDX", NEREID_TYPE_UINT32, &one, 1, 4, &ix)))
            return err;
    } else {
        if ((err = nereid_batch_request_output(batch, 0, "OUT", NEREID_TYPE_INT32, &one, 1, 4,
                                               &out)) ||
            (err =
                 nereid_batch_request_output(batch, 0, "IDX", NEREID_TYPE_UINT32, &one, 1, 4, &ix)))
            return err;
    }
    memcpy(out, &value, 4);
    memcpy(ix, &idx, 4);
    return NULL;
}

/* Sleeps ms in slices; false as soon as the client has cancelled. */
static bool wait_uncancelled(nereid_response_sender_t *sender, uint32_t ms)
{
    for (;;) {
        if (nereid_sender_is_cancelled(sender)) return false;
        if (ms == 0) return true;
        uint32_t slice = ms < 10 ? ms : 10;
        sleep_ms(slice);
        ms -= slice;
    }
}

static void *respond(void *arg)
{
    job_t *job = arg;
    for (size_t e = 0; e < job->n; e++) {
        if (!wait_uncancelled(job->sender, job->delay[e])) {
            /* The client is gone: end with CANCELLED (Triton's empty text). */
            nereid_error_free(
                nereid_sender_send(job->sender, NEREID_RESPONSE_FLAG_FINAL,
                                   nereid_error_new(NEREID_ERROR_CANCELLED, "%s", "")));
            goto out;
        }
        nereid_error_t *err =
            (int64_t)e == job->fail_at
                ? nereid_error_new(NEREID_ERROR_INTERNAL,
                                   "repeat: response %zu failed as the request asked", e)
                : send_outputs(job->sender, NULL, job->in[e], (uint32_t)e);
        /* An allocation error ends the request with it, as Triton's
         * RESPOND_FACTORY_AND_RETURN_IF_ERROR does. */
        if (err) {
            nereid_error_free(nereid_sender_send(job->sender, NEREID_RESPONSE_FLAG_FINAL, err));
            goto out;
        }
        nereid_error_free(nereid_sender_send(job->sender, 0, NULL));
    }
    nereid_error_free(nereid_sender_send_flags(job->sender, NEREID_RESPONSE_FLAG_FINAL));
out:
    atomic_store(&job->done, true);
    return NULL;
}

/* Starts the responses of request r; returns how long execute waits. */
static nereid_error_t *process(nereid_instance_t *instance, nereid_batch_t *batch, size_t r,
                               uint32_t *wait_ms)
{
    *wait_ms = 0;
    nereid_error_t *err;
    const void *data;
    size_t size;
    const int64_t *in_shape, *delay_shape;
    size_t in_rank, delay_rank;
    const void *in_data, *delay_data;
    size_t in_size, delay_size;
    if ((err = nereid_batch_request_input(batch, r, "WAIT", NULL, NULL, NULL, &data, &size)))
        return err;
    if (size != sizeof(uint32_t))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "unexpected size for WAIT input");
    memcpy(wait_ms, data, 4);
    if ((err = nereid_batch_request_input(batch, r, "IN", NULL, &in_shape, &in_rank, &in_data,
                                          &in_size)) ||
        (err = nereid_batch_request_input(batch, r, "DELAY", NULL, &delay_shape, &delay_rank,
                                          &delay_data, &delay_size)))
        return err;
    if (in_rank != delay_rank || memcmp(in_shape, delay_shape, in_rank * sizeof *in_shape) != 0) {
        char a[128], b[128];
        shape_text(a, sizeof a, in_shape, in_rank);
        shape_text(b, sizeof b, delay_shape, delay_rank);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "expected IN and DELAY shape to match, got %s and %s", a, b);
    }
    size_t n = in_size / sizeof(int32_t);
    nereid_response_sender_t *sender;
    err = nereid_batch_request_sender(batch, r, &sender);
    if (err) {
        /* One response only: possible for exactly one element. A model that
         * is not decoupled answers with its first response, as Triton's
         * frontends keep only that one (L0_grpc_state_cleanup). */
        bool first_only = !nereid_model_decoupled(nereid_instance_model(instance)) && n > 1;
        if (n != 1 && !first_only) return err;
        nereid_error_free(err);
        uint32_t delay;
        int32_t value;
        memcpy(&delay, delay_data, 4);
        memcpy(&value, in_data, 4);
        sleep_ms(delay);
        return send_outputs(NULL, batch, value, 0);
    }
    /* The inputs die with execute: the sending thread gets copies. */
    job_t *job = calloc(1, sizeof *job);
    if (job) {
        job->in = malloc(n ? n * 4 : 1);
        job->delay = malloc(n ? n * 4 : 1);
    }
    if (!job || !job->in || !job->delay) {
        if (job) {
            free(job->in);
            free(job->delay);
        }
        free(job);
        return nereid_sender_send(sender, NEREID_RESPONSE_FLAG_FINAL,
                                  nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory"));
    }
    if (n) { /* an empty tensor may have no data pointer */
        memcpy(job->in, in_data, n * 4);
        memcpy(job->delay, delay_data, n * 4);
    }
    job->n = n;
    job->sender = sender;
    if (!nereid_batch_request_parameter_int(batch, r, "repeat_fail_at", &job->fail_at))
        job->fail_at = -1;
    if (pthread_create(&job->thread, NULL, respond, job) != 0) {
        respond(job); /* no thread: send from here */
        job_free(job);
        return NULL;
    }
    instance_state_t *st = nereid_instance_state(instance);
    job->next = st->jobs;
    st->jobs = job;
    return NULL;
}

NEREID_EXPORT nereid_error_t *nereid_backend_execute(nereid_instance_t *instance,
                                                     nereid_batch_t *batch)
{
    size_t n = nereid_batch_request_count(batch);
    if (n > 1)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "repeat backend does not support batched request execution");
    reap(nereid_instance_state(instance), false);
    uint32_t wait_ms = 0;
    for (size_t r = 0; r < n; r++) {
        nereid_error_t *err = process(instance, batch, r, &wait_ms);
        if (err) nereid_batch_set_request_error(batch, r, err);
    }
    sleep_ms(wait_ms);
    return NULL;
}
