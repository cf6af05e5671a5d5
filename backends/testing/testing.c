/*
 * This file contains the testing backend, for scheduler and fault tests.
 * It copies input i to output i like identity and obeys config parameters:
 *   execute_delay_ms     sleep this long in every execute
 *   model_init_delay_ms  sleep this long in model init (a known load time)
 *   model_init_wait_for_file  path: model init waits until it exists (30 s
 *                        at most), so a test decides when a load ends
 *   fail_model_init      "true": model init fails
 *   fail_model_init_attempts  N with init_attempts_file path: every model
 *                        init appends a line to the file, and the first N
 *                        (lines already there < N) fail
 *   inline_max_us        N: nereid_model_set_inline_max_us(model, N) (ABI 1.7)
 *   show_backend_config  "true": model init fails with the backend's
 *                        --backend-config JSON as its reason (ABI 1.5)
 *   model_init_resident_bytes  N: model init allocates N bytes and writes
 *                        them (resident until model fini), so a test knows
 *                        what a model's load adds to the process's RSS
 *   fail_instance_init   "true": instance init fails
 *   fail_execute         "true": every execute fails
 *   execution_log        path: every execute appends "start <model> <n>"
 *                        (n: executes running in the process with this
 *                        parameter, itself included) and "end <model>"
 *                        lines, so a test sees order and overlap
 * and per-request parameters:
 *   delay_ms (int)       extra sleep for a batch that contains this request
 *   fail (string "true") this request fails, the rest of the batch succeeds
 *   wait_for_file (string) execute waits until this path exists (10 s at
 *                          most), so a test decides when the batch ends
 *   wait_for_file_ms (int) that most, in ms, instead of 10 s
 *   started_file (string) execute creates this file when it starts
 *   stop_on_cancel (string "true") the wait above also ends when the request
 *                          is cancelled, which then fails with CANCELLED
 *   call_model           name: execute first sends each request's INPUT0 to
 *                        that model (in-process, as a BLS call does) and
 *                        waits for its answer; the request's response gets
 *                        the bool parameter "callee_on_caller_thread": the
 *                        callee's completion ran on execute's own thread
 *   output_views         "true": output i is a copy of input i in memory of
 *                        the backend's own, handed over with
 *                        nereid_batch_request_output_view (ABI 1.9); the
 *                        exported nereid_testing_views_* counters show what
 *                        the core released; the request parameter
 *                        view_wrong_size (string "true") hands it over with a
 *                        byte size 4 too large (the core refuses it)
 *   echo_parameters      names a TYPE_STRING output (models with
 *                        max_batch_size 0): each request gets there its
 *                        parameters as "name=value" elements, in order
 *                        (ABI 1.3 nereid_batch_request_parameter)
 * Every execute also checks the core's promise that one instance never runs
 * two batches at once, and fails the batch if it does.
 */
#include <inttypes.h>
#include <pthread.h>
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
    if (param_true(model, "show_backend_config"))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "backend config %s",
                                nereid_backend_config_json(nereid_model_backend(model)));
    if (param_true(model, "fail_model_init"))
        return nereid_error_new(NEREID_ERROR_INTERNAL, "testing backend: model init failed");
    const char *attempts = nereid_model_parameter(model, "fail_model_init_attempts");
    const char *path = nereid_model_parameter(model, "init_attempts_file");
    if (attempts && path) {
        long seen = 0;
        FILE *f = fopen(path, "a+");
        if (!f)
            return nereid_error_new(NEREID_ERROR_INTERNAL, "testing backend: cannot open %s", path);
        for (int c; (c = fgetc(f)) != EOF;)
            seen += c == '\n';
        fputs("init\n", f);
        fclose(f);
        if (seen < strtol(attempts, NULL, 10))
            return nereid_error_new(NEREID_ERROR_INTERNAL,
                                    "testing backend: model init attempt %ld failed", seen + 1);
    }
    const char *delay = nereid_model_parameter(model, "model_init_delay_ms");
    if (delay) sleep_ms(strtol(delay, NULL, 10));
    const char *inline_max = nereid_model_parameter(model, "inline_max_us");
    if (inline_max) nereid_model_set_inline_max_us(model, strtoull(inline_max, NULL, 10));
    const char *wait = nereid_model_parameter(model, "model_init_wait_for_file");
    for (int i = 0; wait && access(wait, F_OK) != 0 && i < 30000; i++)
        sleep_ms(1);
    const char *resident = nereid_model_parameter(model, "model_init_resident_bytes");
    size_t resident_bytes = resident ? strtoull(resident, NULL, 10) : 0;
    if (resident_bytes) {
        char *block = malloc(resident_bytes);
        if (!block)
            return nereid_error_new(NEREID_ERROR_INTERNAL, "testing backend: out of memory");
        memset(block, 1, resident_bytes);
        nereid_model_set_state(model, block);
    }
    return NULL;
}

NEREID_EXPORT nereid_error_t *nereid_backend_model_fini(nereid_model_t *model)
{
    free(nereid_model_state(model));
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

/* execution_log: executes running (across models), and the lock that
 * orders the log's lines as the executes happened. */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static int log_running;

static void log_execution(const nereid_model_t *model, bool start)
{
    const char *path = nereid_model_parameter(model, "execution_log");
    if (!path) return;
    pthread_mutex_lock(&log_lock);
    log_running += start ? 1 : -1;
    FILE *f = fopen(path, "a");
    if (f) {
        if (start)
            fprintf(f, "start %s %d\n", nereid_model_name(model), log_running);
        else
            fprintf(f, "end %s\n", nereid_model_name(model));
        fclose(f);
    }
    pthread_mutex_unlock(&log_lock);
}

/* "name=value" of parameter i of request r into buf (at most cap bytes). */
static size_t parameter_text(const nereid_batch_t *batch, size_t r, size_t i, char *buf, size_t cap)
{
    const char *name;
    nereid_parameter_type_t type;
    const void *value;
    if (nereid_batch_request_parameter(batch, r, i, &name, &type, &value)) return 0;
    int n;
    switch (type) {
    case NEREID_PARAMETER_STRING:
        n = snprintf(buf, cap, "%s=%s", name, (const char *)value);
        break;
    case NEREID_PARAMETER_INT:
        n = snprintf(buf, cap, "%s=%" PRId64, name, *(const int64_t *)value);
        break;
    case NEREID_PARAMETER_BOOL:
        n = snprintf(buf, cap, "%s=%s", name, *(const bool *)value ? "true" : "false");
        break;
    default:
        n = snprintf(buf, cap, "%s=%.17g", name, *(const double *)value);
        break;
    }
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

/* The echo_parameters output of request r: BYTES [n_parameters]. */
static nereid_error_t *echo_parameters(nereid_batch_t *batch, size_t r, const char *output)
{
    size_t n = nereid_batch_request_parameter_count(batch, r), total = 0;
    char text[1024];
    for (size_t i = 0; i < n; i++)
        total += 4 + parameter_text(batch, r, i, text, sizeof text);
    int64_t shape[1] = {(int64_t)n};
    void *buf;
    nereid_error_t *err =
        nereid_batch_request_output(batch, r, output, NEREID_TYPE_BYTES, shape, 1, total, &buf);
    if (err) return err;
    unsigned char *p = buf;
    for (size_t i = 0; i < n; i++) {
        uint32_t len = (uint32_t)parameter_text(batch, r, i, text, sizeof text);
        for (int b = 0; b < 4; b++)
            *p++ = (unsigned char)(len >> (8 * b));
        memcpy(p, text, len);
        p += len;
    }
    return NULL;
}

NEREID_EXPORT nereid_error_t *nereid_backend_execute(nereid_instance_t *instance,
                                                     nereid_batch_t *batch)
{
    instance_state_t *st = nereid_instance_state(instance);
    if (atomic_exchange(&st->busy, true))
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "testing backend: instance '%s' entered twice at once",
                                nereid_instance_name(instance));
    log_execution(nereid_instance_model(instance), true);
    nereid_error_t *err = execute(instance, batch);
    log_execution(nereid_instance_model(instance), false);
    atomic_store(&st->busy, false);
    return err;
}

/* call_model: one in-process request and where its completion ran. */
typedef struct call_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done, failed;
    pthread_t thread;
} call_wait_t;

static void call_done(nereid_response_t *resp, void *userp)
{
    call_wait_t *w = userp;
    pthread_mutex_lock(&w->mu);
    w->failed = nereid_response_error(resp) != NULL;
    w->thread = pthread_self();
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    nereid_response_free(resp);
}

/* Sends request r's INPUT0 to model `callee` and waits for the answer. */
static nereid_error_t *call_model(const nereid_model_t *model, nereid_batch_t *batch, size_t r,
                                  const char *callee)
{
    nereid_datatype_t dt;
    const int64_t *shape;
    size_t rank, size;
    const void *data;
    nereid_error_t *err =
        nereid_batch_request_input(batch, r, "INPUT0", &dt, &shape, &rank, &data, &size);
    nereid_request_t *req = NULL;
    if (!err) err = nereid_request_new(nereid_model_server(model), callee, -1, &req);
    if (!err) err = nereid_request_add_input(req, "INPUT0", dt, shape, rank, data, size);
    call_wait_t w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    if (!err) err = nereid_server_infer_async(nereid_model_server(model), req, NULL, call_done, &w);
    if (err) {
        nereid_request_free(req);
        return err;
    }
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    if (w.failed)
        return nereid_error_new(NEREID_ERROR_INTERNAL, "testing backend: call to %s failed",
                                callee);
    bool same = pthread_equal(w.thread, pthread_self());
    return nereid_batch_request_set_response_parameter(batch, r, "callee_on_caller_thread",
                                                       NEREID_PARAMETER_BOOL, &same);
}

/* Output views (output_views): handed over, released by the core, and
 * refused by it (the backend kept and freed those itself). */
static atomic_long views_given, views_released, views_refused;

NEREID_EXPORT long nereid_testing_views_outstanding(void)
{
    return atomic_load(&views_given) - atomic_load(&views_released);
}

NEREID_EXPORT long nereid_testing_views_released(void)
{
    return atomic_load(&views_released);
}

NEREID_EXPORT long nereid_testing_views_refused(void)
{
    return atomic_load(&views_refused);
}

static void view_release(void *userp)
{
    free(userp);
    atomic_fetch_add(&views_released, 1);
}

/* Input i to output i of every request, each a view of a malloc'ed copy. */
static void output_views(const nereid_model_t *model, nereid_batch_t *batch)
{
    size_t n = nereid_model_output_count(model);
    for (size_t r = 0; r < nereid_batch_request_count(batch); r++) {
        const char *wrong = nereid_batch_request_parameter_string(batch, r, "view_wrong_size");
        size_t extra = wrong && strcmp(wrong, "true") == 0 ? 4 : 0;
        for (size_t i = 0; i < n && i < nereid_batch_input_count(batch); i++) {
            const char *in_name = nereid_batch_input_name(batch, i), *out_name;
            nereid_datatype_t dt;
            const int64_t *shape, *dims;
            size_t rank, byte_size, out_rank;
            const void *data;
            nereid_model_output(model, i, &out_name, &dt, &dims, &out_rank);
            nereid_error_t *err = nereid_batch_request_input(batch, r, in_name, &dt, &shape, &rank,
                                                             &data, &byte_size);
            if (!err) {
                void *copy = malloc(byte_size + extra + 1);
                if (!copy) abort();
                memcpy(copy, data, byte_size);
                err = nereid_batch_request_output_view(batch, r, out_name, dt, shape, rank, copy,
                                                       byte_size + extra, view_release, copy);
                if (err) {
                    free(copy);
                    atomic_fetch_add(&views_refused, 1);
                } else {
                    atomic_fetch_add(&views_given, 1);
                }
            }
            if (err) {
                nereid_batch_set_request_error(batch, r, err);
                break;
            }
        }
    }
}

static nereid_error_t *execute(nereid_instance_t *instance, nereid_batch_t *batch)
{
    const nereid_model_t *model = nereid_instance_model(instance);
    const char *callee = nereid_model_parameter(model, "call_model");
    for (size_t r = 0; callee && r < nereid_batch_request_count(batch); r++) {
        nereid_error_t *err = call_model(model, batch, r, callee);
        if (err) return err;
    }
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
        int64_t cap;
        if (!nereid_batch_request_parameter_int(batch, r, "wait_for_file_ms", &cap)) cap = 10000;
        for (int64_t i = 0; path && access(path, F_OK) != 0 && i < cap; i++) {
            if (may_stop && nereid_batch_request_is_cancelled(batch, r)) break;
            sleep_ms(1);
        }
    }
    if (param_true(model, "fail_execute"))
        return nereid_error_new(NEREID_ERROR_INTERNAL, "testing backend: execute failed");
    nereid_error_t *err = NULL;
    if (param_true(model, "output_views"))
        output_views(model, batch);
    else if ((err = copy_inputs_to_outputs(model, batch, false)))
        return err;
    const char *echo = nereid_model_parameter(model, "echo_parameters");
    for (size_t r = 0; echo && nereid_batch_output_requested(batch, echo) &&
                       r < nereid_batch_request_count(batch);
         r++)
        if ((err = echo_parameters(batch, r, echo))) return err;
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
