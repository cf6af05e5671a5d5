/*
 * This file contains the testing backend, for scheduler and fault tests.
 * It copies input i to output i like identity and obeys config parameters:
 *   execute_delay_ms     sleep this long in every execute
 *   fail_model_init      "true": model init fails
 *   fail_instance_init   "true": instance init fails
 *   fail_execute         "true": every execute fails
 * and per-request parameters:
 *   delay_ms (int)       extra sleep for a batch that contains this request
 *   fail (string "true") this request fails, the rest of the batch succeeds
 *   wait_for_file (string) execute waits until this path exists (10 s at
 *                          most), so a test decides when the batch ends
 *   started_file (string) execute creates this file when it starts
 *   stop_on_cancel (string "true") the wait above also ends when the request
 *                          is cancelled, which then fails with CANCELLED
 * Every execute also checks the core's promise that one instance never runs
 * two batches at once, and fails the batch if it does.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../common/copy_io.h"
#include "nereid/backend.h"

NEREID_EXPORT uint32_t nereid_backend_abi_version(void)
{
    return NEREID_BACKEND_ABI_VERSION;
}

static bool param_true(const nereid_model_t *model, const char *key)
{
    const char *v = nereid_model_parameter(model, key);
    return v && strcmp(v, "true") == 0;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

NEREID_EXPORT nereid_error_t *nereid_backend_model_init(nereid_model_t *model)
{
    if (param_true(model, "fail_model_init"))
        return nereid_error_new(NEREID_ERROR_INTERNAL, "testing backend: model init failed");
    return NULL;
}

/* Per instance: set while an execute runs. */
typedef struct instance_state {
    atomic_bool busy;
} instance_state_t;

NEREID_EXPORT nereid_error_t *nereid_backend_instance_init(nereid_instance_t *instance)
{
    if (param_true(nereid_instance_model(instance), "fail_instance_init"))
        return nereid_error_new(NEREID_ERROR_INTERNAL, "testing backend: instance init failed");
    instance_state_t *st = calloc(1, sizeof *st);
    if (!st) return nereid_error_new(NEREID_ERROR_INTERNAL, "testing backend: out of memory");
    nereid_instance_set_state(instance, st);
    return NULL;
}

NEREID_EXPORT nereid_error_t *nereid_backend_instance_fini(nereid_instance_t *instance)
{
    free(nereid_instance_state(instance));
    return NULL;
}

static nereid_error_t *execute(nereid_instance_t *instance, nereid_batch_t *batch);

NEREID_EXPORT nereid_error_t *nereid_backend_execute(nereid_instance_t *instance,
                                                     nereid_batch_t *batch)
{
    instance_state_t *st = nereid_instance_state(instance);
    if (atomic_exchange(&st->busy, true))
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "testing backend: instance '%s' entered twice at once",
                                nereid_instance_name(instance));
    nereid_error_t *err = execute(instance, batch);
    atomic_store(&st->busy, false);
    return err;
}

static nereid_error_t *execute(nereid_instance_t *instance, nereid_batch_t *batch)
{
    const nereid_model_t *model = nereid_instance_model(instance);
    for (size_t r = 0; r < nereid_batch_request_count(batch); r++) {
        const char *path = nereid_batch_request_parameter_string(batch, r, "started_file");
        FILE *f = path ? fopen(path, "w") : NULL;
        if (f) fclose(f);
    }
    const char *delay = nereid_model_parameter(model, "execute_delay_ms");
    long ms = delay ? strtol(delay, NULL, 10) : 0;
    for (size_t r = 0; r < nereid_batch_request_count(batch); r++) {
        int64_t extra;
        if (nereid_batch_request_parameter_int(batch, r, "delay_ms", &extra) && extra > ms)
            ms = (long)extra;
    }
    if (ms > 0) sleep_ms(ms);
    for (size_t r = 0; r < nereid_batch_request_count(batch); r++) {
        const char *path = nereid_batch_request_parameter_string(batch, r, "wait_for_file");
        const char *stop = nereid_batch_request_parameter_string(batch, r, "stop_on_cancel");
        bool may_stop = stop && strcmp(stop, "true") == 0;
        for (int i = 0; path && access(path, F_OK) != 0 && i < 10000; i++) {
            if (may_stop && nereid_batch_request_is_cancelled(batch, r)) break;
            sleep_ms(1);
        }
    }
    if (param_true(model, "fail_execute"))
        return nereid_error_new(NEREID_ERROR_INTERNAL, "testing backend: execute failed");
    nereid_error_t *err = copy_inputs_to_outputs(model, batch, false);
    if (err) return err;
    for (size_t r = 0; r < nereid_batch_request_count(batch); r++) {
        const char *stop = nereid_batch_request_parameter_string(batch, r, "stop_on_cancel");
        if (stop && strcmp(stop, "true") == 0 && nereid_batch_request_is_cancelled(batch, r)) {
            nereid_batch_set_request_error(
                batch, r, nereid_error_new(NEREID_ERROR_CANCELLED, "testing backend: cancelled"));
            continue;
        }
        const char *fail = nereid_batch_request_parameter_string(batch, r, "fail");
        if (fail && strcmp(fail, "true") == 0)
            nereid_batch_set_request_error(
                batch, r,
                nereid_error_new(NEREID_ERROR_INTERNAL, "testing backend: request failed"));
    }
    return NULL;
}
