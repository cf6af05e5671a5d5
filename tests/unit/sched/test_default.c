/*
 * This file contains the tests of the default scheduler's inline runs: a
 * request for a model whose executions are short, finding an idle instance,
 * runs and completes on the submitting thread; a slow model, a model that
 * just turned slow, and NEREID_INLINE_US=0 hand requests to the instance
 * thread; many threads on one and two instances never run one instance
 * twice at once (the testing backend fails a batch if they do), lose no
 * request, and count every execution; unloading while requests run inline
 * neither crashes nor hangs; an ensemble's first step, submitted while the
 * server lock is held, is queued rather than run inline; a backend's own
 * bound (nereid_model_set_inline_max_us) lets a slow model run inline, and
 * NEREID_INLINE_US=0 still wins over it. "Short" is set to
 * 100 ms here (INLINE_US) so the outcomes do not depend on the machine's
 * load; the slow cases sleep 300 ms and more.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "server_util.h"
#include "test_util.h"

#define INLINE_US "100000" /* 100 ms */

/* One request's completion: where and when it ran. */
typedef struct call {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done, failed;
    pthread_t thread;
    char message[160];
    int callee_inline; /* response parameter callee_on_caller_thread: 1, 0, -1 absent */
} call_t;

static void on_done(nereid_response_t *resp, void *userp)
{
    call_t *c = userp;
    pthread_mutex_lock(&c->lock);
    c->thread = pthread_self();
    c->failed = nereid_response_error(resp) != NULL;
    if (c->failed)
        snprintf(c->message, sizeof c->message, "%s",
                 nereid_error_message(nereid_response_error(resp)));
    c->callee_inline = -1;
    for (size_t i = 0; i < nereid_response_parameter_count(resp); i++) {
        const char *name;
        int type;
        const void *value;
        nereid_response_parameter(resp, i, &name, &type, &value);
        if (strcmp(name, "callee_on_caller_thread") == 0 && type == 2 /* bool */)
            c->callee_inline = *(const bool *)value;
    }
    c->done = true;
    pthread_cond_signal(&c->cond);
    pthread_mutex_unlock(&c->lock);
    nereid_response_free(resp);
}

static float in_data[4] = {1, 2, 3, 4};

static nereid_request_t *make_request(nereid_server_t *s, const char *model, int delay_ms)
{
    nereid_request_t *req = NULL;
    int64_t shape[1] = {4};
    nereid_error_t *err = nereid_request_new(s, model, -1, &req);
    if (!err)
        err = nereid_request_add_input(req, "INPUT0", NEREID_TYPE_FP32, shape, 1, in_data,
                                       sizeof in_data);
    if (!err && delay_ms) err = nereid_request_set_parameter_int(req, "delay_ms", delay_ms);
    CHECK(err == NULL);
    nereid_error_free(err);
    return req;
}

static void call_init(call_t *c)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
}

static void call_fini(call_t *c)
{
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
}

/* Submits req with c as its completion. When refused, frees the error and
 * req and returns false. */
static bool call_submit(nereid_server_t *s, nereid_request_t *req, call_t *c)
{
    nereid_error_t *err = nereid_server_infer_async(s, req, NULL, on_done, c);
    if (!err) return true;
    nereid_error_free(err);
    nereid_request_free(req);
    return false;
}

static bool call_done(call_t *c)
{
    pthread_mutex_lock(&c->lock);
    bool done = c->done;
    pthread_mutex_unlock(&c->lock);
    return done;
}

/* Waits for the completion. Called right after call_submit, returns true
 * when it already ran, on this thread: before the submit returned. */
static bool call_wait(call_t *c)
{
    pthread_mutex_lock(&c->lock);
    bool early = c->done;
    while (!c->done)
        pthread_cond_wait(&c->cond, &c->lock);
    pthread_mutex_unlock(&c->lock);
    return early && pthread_equal(c->thread, pthread_self());
}

/* Submits one request and waits for it. Returns true when it completed on
 * this thread before nereid_server_infer_async returned. */
static bool run_one(nereid_server_t *s, const char *model, int delay_ms, bool *failed)
{
    call_t c;
    call_init(&c);
    bool submitted = call_submit(s, make_request(s, model, delay_ms), &c);
    CHECK(submitted);
    bool here = submitted && call_wait(&c);
    *failed = !submitted || c.failed;
    if (submitted && c.failed) fprintf(stderr, "request to %s failed: %s\n", model, c.message);
    call_fini(&c);
    return here;
}

/* A testing model; inline_max_us > 0 also sets the backend's own inline
 * bound for it. */
static void write_testing_model_bound(const char *name, int instances, int delay_ms,
                                      long inline_max_us)
{
    char config[1024], bound[128] = "";
    if (inline_max_us > 0)
        snprintf(bound, sizeof bound,
                 ", { key: \"inline_max_us\" value: { string_value: \"%ld\" } }", inline_max_us);
    snprintf(config, sizeof config,
             "name: \"%s\"\nbackend: \"testing\"\nmax_batch_size: 0\n"
             "instance_group [ { count: %d kind: KIND_CPU } ]\n"
             "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
             "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
             "parameters [ { key: \"execute_delay_ms\" value: { string_value: \"%d\" } }%s ]\n",
             name, instances, delay_ms, bound);
    write_model(name, config);
}

static void write_testing_model(const char *name, int instances, int delay_ms)
{
    write_testing_model_bound(name, instances, delay_ms, 0);
}

/* Runs requests until one runs inline (at most 1000); returns whether one
 * did. Right after a request ran on the instance thread, the next may find
 * that thread not yet back to waiting and queue, for as long as a loaded
 * machine keeps that thread off a CPU: a pause after each queued run gives
 * it the time. Once one runs inline the thread stays blocked, and a serial
 * client's requests all run inline. */
static bool until_inline(nereid_server_t *s, const char *model)
{
    bool failed;
    for (int i = 0; i < 1000; i++) {
        if (run_one(s, model, 0, &failed)) return true;
        CHECK(!failed);
        usleep(2000);
    }
    return false;
}

static void test_fast_runs_inline(nereid_server_t *s)
{
    bool failed;
    /* The first execution has no measured duration yet: instance thread. */
    CHECK(!run_one(s, "fast1", 0, &failed));
    CHECK(!failed);
    CHECK(until_inline(s, "fast1"));
    int here = 0;
    for (int i = 0; i < 20; i++) {
        here += run_one(s, "fast1", 0, &failed);
        CHECK(!failed);
    }
    CHECK_MSG(here == 20, "%d, want %d", here, 20);
}

static void test_slow_not_inline(nereid_server_t *s)
{
    bool failed;
    int here = 0;
    for (int i = 0; i < 3; i++) {
        here += run_one(s, "slow", 0, &failed);
        CHECK(!failed);
    }
    CHECK_MSG(here == 0, "%d, want %d", here, 0);
}

/* A fast model's request that takes long raises the average: the next ones
 * go to the instance thread until fast runs bring it down again. */
static void test_turns_slow(nereid_server_t *s)
{
    bool failed;
    CHECK(until_inline(s, "fast2"));
    CHECK(run_one(s, "fast2", 900, &failed)); /* 900 ms, still inline */
    CHECK(!failed);
    CHECK(!run_one(s, "fast2", 0, &failed));
    CHECK(!failed);
    /* Fast runs on the instance thread bring the average down again. */
    CHECK(until_inline(s, "fast2"));
}

typedef struct hammer {
    nereid_server_t *s;
    const char *model;
    int n, failed, here;
    bool tolerate_unavailable;
} hammer_t;

static void *hammer_main(void *arg)
{
    hammer_t *h = arg;
    for (int i = 0; i < h->n; i++) {
        call_t c;
        call_init(&c);
        if (!call_submit(h->s, make_request(h->s, h->model, 0), &c)) {
            /* Only while the model is being unloaded and loaded again. */
            if (!h->tolerate_unavailable) h->failed++;
        } else {
            h->here += call_wait(&c);
            if (c.failed) {
                h->failed++;
                fprintf(stderr, "%s: %s\n", h->model, c.message);
            }
        }
        call_fini(&c);
    }
    return NULL;
}

/* Six threads at once: some requests run inline, the rest queue; the
 * instance count still bounds concurrency and nothing is lost. */
static void test_concurrent(nereid_server_t *s, const char *model)
{
    bool failed;
    run_one(s, model, 0, &failed); /* measure a first duration */
    long long before = stat_value(s, model, 1, "execution_count", NULL);
    enum { THREADS = 6, PER = 400 };
    hammer_t h[THREADS];
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) {
        h[t] = (hammer_t){.s = s, .model = model, .n = PER};
        pthread_create(&th[t], NULL, hammer_main, &h[t]);
    }
    int failures = 0, here = 0;
    for (int t = 0; t < THREADS; t++) {
        pthread_join(th[t], NULL);
        failures += h[t].failed;
        here += h[t].here;
    }
    CHECK_MSG(failures == 0, "%d, want %d", failures, 0);
    CHECK(stat_value(s, model, 1, "execution_count", NULL) - before == THREADS * PER);
    /* Usually some of them ran inline; on a machine loaded enough to keep the
     * instance thread off a CPU throughout, all may have queued: then a serial
     * client still finds the instance idle afterwards. */
    if (here == 0) fprintf(stderr, "%s: no concurrent request ran inline\n", model);
    CHECK(here > 0 || until_inline(s, model));
}

/* The ensemble's scheduler submits its first step from inside its enqueue,
 * with no server lock held: the step may run inline on the submitting
 * thread. While it runs (it waits for a file), the server's write lock must
 * be free: a load of another model from this thread completes before the
 * file is written. With the lock held across enqueue, the load would wait
 * for the testing backend's 10 s limit and the request would finish first. */
typedef struct ens_submit {
    nereid_server_t *s;
    nereid_request_t *req;
    call_t *c;
    bool submitted;
} ens_submit_t;

static void *ens_submit_main(void *arg)
{
    ens_submit_t *e = arg;
    e->submitted = call_submit(e->s, e->req, e->c);
    return NULL;
}

static void test_ensemble_first_step_unlocked(void)
{
    static const char *load[] = {"fast3", "ens", "fast2"};
    nereid_error_t *err = NULL;
    nereid_server_t *s = start_server(NEREID_MODEL_CONTROL_EXPLICIT, load, 3, 0, true, &err);
    CHECK(err == NULL && s);
    nereid_error_free(err);
    if (!s) return;
    CHECK(until_inline(s, "fast3"));
    char path[600];
    snprintf(path, sizeof path, "%s/release-ensemble", repo);
    call_t c;
    call_init(&c);
    nereid_request_t *req = make_request(s, "ens", 0);
    err = nereid_request_set_parameter_string(req, "wait_for_file", path);
    CHECK(err == NULL);
    nereid_error_free(err);
    ens_submit_t e = {.s = s, .req = req, .c = &c};
    pthread_t th;
    pthread_create(&th, NULL, ens_submit_main, &e);
    /* Give the submission time to reach the step (a longer wait only makes
     * the check stronger; a shorter one cannot make it fail wrongly). */
    usleep(200000);
    err = nereid_server_unload_model(s, "fast2", false);
    nereid_error_free(err);
    err = nereid_server_load_model(s, "fast2", NULL, NULL, NULL, NULL, 0);
    CHECK(err == NULL);
    nereid_error_free(err);
    CHECK(!call_done(&c));
    write_file("release-ensemble", "");
    pthread_join(th, NULL);
    CHECK(e.submitted);
    if (e.submitted) {
        call_wait(&c);
        CHECK(!c.failed);
    }
    call_fini(&c);
    nereid_server_free(s);
}

/* A request that an inline execute submits to another model (the testing
 * backend's call_model, as a BLS call does) runs inline too, one level
 * down: "caller" runs on this thread, and fast2's completion on the same
 * thread. Runs until both happen in one request (the instance threads must
 * be back to waiting, as in until_inline; a caller run on its own thread
 * runs fast2 inline there, which proves nothing); returns whether they
 * did. Before nesting was allowed, fast2 always queued from an inline
 * caller. */
static bool callee_runs_nested(nereid_server_t *s)
{
    CHECK(until_inline(s, "fast2"));
    CHECK(until_inline(s, "caller"));
    for (int i = 0; i < 1000; i++) {
        call_t c;
        call_init(&c);
        bool submitted = call_submit(s, make_request(s, "caller", 0), &c);
        CHECK(submitted);
        bool here = submitted && call_wait(&c);
        CHECK(submitted && !c.failed);
        int nested = c.callee_inline;
        call_fini(&c);
        CHECK(nested >= 0);
        if (here && nested == 1) return true;
        usleep(2000);
    }
    return false;
}

static void test_unload_while_inline(void)
{
    static const char *load[] = {"fast1"};
    nereid_error_t *err = NULL;
    nereid_server_t *s = start_server(NEREID_MODEL_CONTROL_EXPLICIT, load, 1, 0, true, &err);
    CHECK(err == NULL && s);
    nereid_error_free(err);
    if (!s) return;
    enum { THREADS = 3 };
    hammer_t h[THREADS];
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) {
        h[t] = (hammer_t){.s = s, .model = "fast1", .n = 3000, .tolerate_unavailable = true};
        pthread_create(&th[t], NULL, hammer_main, &h[t]);
    }
    for (int i = 0; i < 10; i++) {
        err = nereid_server_unload_model(s, "fast1", false);
        CHECK(err == NULL);
        nereid_error_free(err);
        err = nereid_server_load_model(s, "fast1", NULL, NULL, NULL, NULL, 0);
        CHECK(err == NULL);
        nereid_error_free(err);
    }
    int failures = 0;
    for (int t = 0; t < THREADS; t++) {
        pthread_join(th[t], NULL);
        failures += h[t].failed;
    }
    CHECK_MSG(failures == 0, "%d, want %d", failures, 0);
    nereid_server_free(s);
}

int main(void)
{
    make_repo_dir("default-sched");
    write_testing_model("fast1", 1, 0);
    write_testing_model("fast2", 1, 0);
    write_testing_model("fast_two", 2, 0);
    write_testing_model("slow", 1, 300);
    /* 300 ms executions under a backend bound of 10 s: inline like a fast one */
    write_testing_model_bound("slow_bound", 1, 300, 10 * 1000 * 1000);
    write_testing_model("fast3", 1, 0);
    write_model("caller", "name: \"caller\"\nbackend: \"testing\"\nmax_batch_size: 0\n"
                          "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
                          "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
                          "parameters [ { key: \"call_model\" value: { string_value: "
                          "\"fast2\" } } ]\n");
    write_model("ens", "platform: \"ensemble\"\nmax_batch_size: 0\n"
                       "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
                       "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
                       "ensemble_scheduling { step [\n"
                       "  { model_name: \"fast3\" input_map { key: \"INPUT0\" value: \"INPUT0\" }\n"
                       "    output_map { key: \"OUTPUT0\" value: \"MID\" } },\n"
                       "  { model_name: \"fast3\" input_map { key: \"INPUT0\" value: \"MID\" }\n"
                       "    output_map { key: \"OUTPUT0\" value: \"OUTPUT0\" } } ] }\n");
    /* A bound far above a testing execution's few µs, so that a loaded
     * machine's preemptions cannot push a fast model over it, and far
     * below the slow cases' sleeps. */
    setenv("NEREID_INLINE_US", INLINE_US, 1);
    nereid_error_t *err = NULL;
    nereid_server_t *s = start_server(NEREID_MODEL_CONTROL_NONE, NULL, 0, 0, true, &err);
    CHECK(err == NULL && s);
    nereid_error_free(err);
    if (s) {
        test_fast_runs_inline(s);
        test_slow_not_inline(s);
        CHECK(until_inline(s, "slow_bound"));
        test_turns_slow(s);
        test_concurrent(s, "fast1");
        test_concurrent(s, "fast_two");
        CHECK(callee_runs_nested(s));
        nereid_server_free(s);
    }
    test_ensemble_first_step_unlocked();
    test_unload_while_inline();

    /* NEREID_INLINE_US=0: never inline. */
    setenv("NEREID_INLINE_US", "0", 1);
    s = start_server(NEREID_MODEL_CONTROL_NONE, NULL, 0, 0, true, &err);
    CHECK(err == NULL && s);
    nereid_error_free(err);
    if (s) {
        bool failed;
        int here = 0;
        for (int i = 0; i < 10; i++)
            here += run_one(s, "fast1", 0, &failed);
        for (int i = 0; i < 3; i++)
            here += run_one(s, "slow_bound", 0, &failed);
        CHECK_MSG(here == 0, "%d, want %d", here, 0);
        /* Nor is the callee of an execute on an instance thread run there. */
        for (int i = 0; i < 5; i++) {
            call_t c;
            call_init(&c);
            CHECK(call_submit(s, make_request(s, "caller", 0), &c));
            call_wait(&c);
            CHECK(!c.failed && c.callee_inline == 0);
            call_fini(&c);
        }
        nereid_server_free(s);
    }
    unsetenv("NEREID_INLINE_US");
    remove_repo();
    return check_summary();
}
