/*
 * This file contains the identity backend: output i is a copy of input i
 * (by config position), for every datatype and any shape, request by
 * request (so ragged inputs work without a batch_output). Like Triton's
 * identity backend it obeys the model parameters
 *   creation_delay_sec               sleep this long in the model's
 *                                    initialization (a slow load)
 *   execute_delay_ms                 sleep this long in every execute
 *   instance_wise_delay_multiplier   with execute_delay_ms: instance k
 *                                    (creation order) sleeps
 *                                    execute_delay_ms * max(k * multiplier, 1)
 * which Triton's QA suites use to hold batches. Every response carries
 * the four example parameters Triton's identity backend attaches
 * (param0..param3: a string, an integer, a bool and a double), which
 * Triton's L0_backend_identity checks, and counts the byte size of every
 * request's inputs in the custom counter input_byte_size_counter (Triton's
 * identity backend's example metric).
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../common/copy_io.h"
#include "nereid/backend.h"

NEREID_EXPORT uint32_t nereid_backend_abi_version(void)
{
    return NEREID_BACKEND_ABI_VERSION;
}

typedef struct model_state {
    long delay_ms;
    long multiplier;
    atomic_size_t instances;        /* creation counter: the next instance's id */
    nereid_metric_family_t *family; /* input_byte_size_counter, or NULL */
    nereid_metric_t *input_bytes;   /* its series {model, version}, or NULL */
} model_state_t;

static long param_long(const nereid_model_t *model, const char *key)
{
    const char *v = nereid_model_parameter(model, key);
    return v ? strtol(v, NULL, 10) : 0;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

NEREID_EXPORT nereid_error_t *nereid_backend_model_init(nereid_model_t *model)
{
    /* Triton's identity backend (ModelState::Create): a slow load, which
     * L0_lifecycle uses to test availability during reloads. */
    long creation_delay = param_long(model, "creation_delay_sec");
    if (creation_delay > 0) sleep_ms(creation_delay * 1000);
    model_state_t *st = calloc(1, sizeof *st);
    if (!st) return nereid_error_new(NEREID_ERROR_INTERNAL, "identity backend: out of memory");
    st->delay_ms = param_long(model, "execute_delay_ms");
    if (st->delay_ms > 0) st->multiplier = param_long(model, "instance_wise_delay_multiplier");
    /* The counter is an example, as in Triton: a failure to make it only
     * leaves it out. */
    nereid_error_t *err = nereid_metric_family_new(
        NEREID_METRIC_COUNTER, "input_byte_size_counter",
        "Cumulative input byte size of all requests received by the model", &st->family);
    if (!err) {
        char version[24];
        snprintf(version, sizeof version, "%" PRId64, nereid_model_version(model));
        const char *names[] = {"model", "version"};
        const char *values[] = {nereid_model_name(model), version};
        err = nereid_metric_new(st->family, names, values, 2, NULL, 0, &st->input_bytes);
    }
    nereid_error_free(err);
    nereid_model_set_state(model, st);
    return NULL;
}

NEREID_EXPORT nereid_error_t *nereid_backend_model_fini(nereid_model_t *model)
{
    model_state_t *st = nereid_model_state(model);
    if (st) {
        if (st->input_bytes) nereid_error_free(nereid_metric_delete(st->input_bytes));
        if (st->family) nereid_error_free(nereid_metric_family_delete(st->family));
    }
    free(st);
    return NULL;
}

/* The instance state is its id, stored as id + 1 so that it is never NULL. */
NEREID_EXPORT nereid_error_t *nereid_backend_instance_init(nereid_instance_t *instance)
{
    model_state_t *st = nereid_model_state(nereid_instance_model(instance));
    size_t id = st ? atomic_fetch_add(&st->instances, 1) : 0;
    nereid_instance_set_state(instance, (void *)(id + 1));
    return NULL;
}

NEREID_EXPORT nereid_error_t *nereid_backend_execute(nereid_instance_t *instance,
                                                     nereid_batch_t *batch)
{
    const nereid_model_t *model = nereid_instance_model(instance);
    const model_state_t *st = nereid_model_state(model);
    if (st && st->delay_ms > 0) {
        long factor = 1;
        if (st->multiplier > 0) {
            long id = (long)((size_t)nereid_instance_state(instance) - 1);
            factor = st->multiplier * id;
            if (factor < 1) factor = 1;
        }
        sleep_ms(st->delay_ms * factor);
    }
    nereid_error_t *err = copy_inputs_to_outputs(model, batch, true);
    if (err) return err;
    double input_bytes = 0;
    for (size_t i = 0; i < nereid_batch_input_count(batch); i++) {
        for (size_t r = 0; r < nereid_batch_request_count(batch); r++) {
            nereid_datatype_t dt;
            const int64_t *shape;
            size_t rank, byte_size;
            const void *data;
            nereid_error_t *ierr = nereid_batch_request_input(
                batch, r, nereid_batch_input_name(batch, i), &dt, &shape, &rank, &data, &byte_size);
            if (ierr)
                nereid_error_free(ierr);
            else
                input_bytes += (double)byte_size;
        }
    }
    if (st && st->input_bytes)
        nereid_error_free(nereid_metric_increment(st->input_bytes, input_bytes));
    const int64_t param1 = 42;
    const bool param2 = false;
    const double param3 = 123.123;
    for (size_t r = 0; r < nereid_batch_request_count(batch); r++) {
        nereid_error_free(nereid_batch_request_set_response_parameter(
            batch, r, "param0", NEREID_PARAMETER_STRING, "an example string parameter"));
        nereid_error_free(nereid_batch_request_set_response_parameter(
            batch, r, "param1", NEREID_PARAMETER_INT, &param1));
        nereid_error_free(nereid_batch_request_set_response_parameter(
            batch, r, "param2", NEREID_PARAMETER_BOOL, &param2));
        nereid_error_free(nereid_batch_request_set_response_parameter(
            batch, r, "param3", NEREID_PARAMETER_DOUBLE, &param3));
    }
    return NULL;
}
