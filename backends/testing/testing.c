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
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

NEREID_EXPORT nereid_error_t *nereid_backend_instance_init(nereid_instance_t *instance)
{
    if (param_true(nereid_instance_model(instance), "fail_instance_init"))
        return nereid_error_new(NEREID_ERROR_INTERNAL, "testing backend: instance init failed");
    return NULL;
}

NEREID_EXPORT nereid_error_t *nereid_backend_execute(nereid_instance_t *instance,
                                                     nereid_batch_t *batch)
{
    const nereid_model_t *model = nereid_instance_model(instance);
    const char *delay = nereid_model_parameter(model, "execute_delay_ms");
    long ms = delay ? strtol(delay, NULL, 10) : 0;
    for (size_t r = 0; r < nereid_batch_request_count(batch); r++) {
        int64_t extra;
        if (nereid_batch_request_parameter_int(batch, r, "delay_ms", &extra) && extra > ms)
            ms = (long)extra;
    }
    if (ms > 0) sleep_ms(ms);
    if (param_true(model, "fail_execute"))
        return nereid_error_new(NEREID_ERROR_INTERNAL, "testing backend: execute failed");
    nereid_error_t *err = copy_inputs_to_outputs(model, batch);
    if (err) return err;
    for (size_t r = 0; r < nereid_batch_request_count(batch); r++) {
        const char *fail = nereid_batch_request_parameter_string(batch, r, "fail");
        if (fail && strcmp(fail, "true") == 0)
            nereid_batch_set_request_error(
                batch, r,
                nereid_error_new(NEREID_ERROR_INTERNAL, "testing backend: request failed"));
    }
    return NULL;
}
