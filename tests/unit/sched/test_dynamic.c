/*
 * This file contains unit tests of the dynamic batcher through the in-process
 * API. Each case starts a server on a one-model repository (the `testing`
 * backend copies INPUT0 to OUTPUT0; a request's delay_ms parameter keeps an
 * instance busy) and observes the batches formed through batch_stats, the
 * completion order and the responses. NEREID_DELAY_SCHEDULER holds the first
 * batch until enough requests are queued, so the cases do not depend on
 * timing except where a timeout or delay is the subject, and there the
 * margins are wide.
 */
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "test_util.h"

#define MAX_RESULTS 64
#define MAX_WIDTH 16

typedef struct result {
    char id[32];
    bool failed;
    nereid_error_code_t code; /* when failed */
    char msg[256];
    bool output_ok; /* OUTPUT0 equals INPUT0 with the request's shape */
} result_t;

typedef struct collector {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int n_done;
    result_t results[MAX_RESULTS]; /* completion order */
} collector_t;

typedef struct call {
    collector_t *c;
    char id[32];
    int64_t shape[2];
    float data[MAX_WIDTH * 8];
} call_t;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void collector_init(collector_t *c)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
}

static void collector_destroy(collector_t *c)
{
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
}

static bool output_matches(const nereid_response_t *resp, const call_t *k)
{
    if (nereid_response_output_count(resp) != 1) return false;
    const char *name;
    nereid_datatype_t dt;
    const int64_t *shape;
    size_t rank, size;
    const void *data;
    nereid_response_output(resp, 0, &name, &dt, &shape, &rank, &data, &size, NULL);
    size_t n = (size_t)(k->shape[0] * k->shape[1]);
    return strcmp(name, "OUTPUT0") == 0 && dt == NEREID_TYPE_FP32 && rank == 2 &&
           shape[0] == k->shape[0] && shape[1] == k->shape[1] && size == n * sizeof(float) &&
           memcmp(data, k->data, size) == 0;
}

static void on_done(nereid_response_t *resp, void *userp)
{
    call_t *k = userp;
    collector_t *c = k->c;
    pthread_mutex_lock(&c->lock);
    if (c->n_done < MAX_RESULTS) {
        result_t *r = &c->results[c->n_done];
        snprintf(r->id, sizeof r->id, "%s", k->id);
        const nereid_error_t *err = nereid_response_error(resp);
        if (err) {
            r->failed = true;
            r->code = nereid_error_code(err);
            snprintf(r->msg, sizeof r->msg, "%s", nereid_error_message(err));
        } else {
            r->output_ok = output_matches(resp, k);
        }
    }
    c->n_done++;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    nereid_response_free(resp);
    free(k);
}

/* Waits (30 s at most) until n requests completed. */
static bool collector_wait(collector_t *c, int n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 30;
    pthread_mutex_lock(&c->lock);
    while (c->n_done < n)
        if (pthread_cond_timedwait(&c->cond, &c->lock, &ts) != 0) break;
    bool ok = c->n_done >= n;
    pthread_mutex_unlock(&c->lock);
    return ok;
}

static const result_t *find_result(collector_t *c, const char *id)
{
    for (int i = 0; i < c->n_done && i < MAX_RESULTS; i++)
        if (strcmp(c->results[i].id, id) == 0) return &c->results[i];
    return NULL;
}

/* The completion position of id, or -1. */
static int position(collector_t *c, const char *id)
{
    const result_t *r = find_result(c, id);
    return r ? (int)(r - c->results) : -1;
}

typedef struct opts {
    int64_t batch;     /* 0 = 1 */
    int64_t width;     /* 0 = 4 */
    uint64_t priority; /* 0 = default */
    uint64_t timeout_us;
    int64_t delay_ms; /* testing backend: busy time of the batch */
    bool no_id;
} opts_t;

/* Submits one request to model "m"; returns the synchronous error, if any. */
static nereid_error_t *submit(nereid_server_t *s, collector_t *c, const char *id, opts_t o)
{
    call_t *k = calloc(1, sizeof *k);
    k->c = c;
    snprintf(k->id, sizeof k->id, "%s", id);
    k->shape[0] = o.batch ? o.batch : 1;
    k->shape[1] = o.width ? o.width : 4;
    size_t n = (size_t)(k->shape[0] * k->shape[1]);
    for (size_t i = 0; i < n; i++)
        k->data[i] = (float)(id[0] * 1000 + id[strlen(id) - 1] * 10) + (float)i;
    nereid_request_t *req;
    nereid_error_t *err = nereid_request_new(s, "m", 0, &req);
    if (err) {
        free(k);
        return err;
    }
    if (!o.no_id) nereid_request_set_id(req, id);
    nereid_request_add_input(req, "INPUT0", NEREID_TYPE_FP32, k->shape, 2, k->data,
                             n * sizeof(float));
    if (o.priority) nereid_request_set_priority(req, o.priority);
    if (o.timeout_us) nereid_request_set_timeout_us(req, o.timeout_us);
    if (o.delay_ms) nereid_request_set_parameter_int(req, "delay_ms", o.delay_ms);
    err = nereid_server_infer_async(s, req, NULL, on_done, k);
    if (err) {
        nereid_request_free(req);
        free(k);
    }
    return err;
}

static void submit_ok(nereid_server_t *s, collector_t *c, const char *id, opts_t o)
{
    nereid_error_t *err = submit(s, c, id, o);
    CHECK(err == NULL);
    if (err) {
        fprintf(stderr, "submit %s: %s\n", id, nereid_error_message(err));
        nereid_error_free(err);
    }
}

/* ---- Server per case ---- */

/* Starts a server whose only model is "m" with this config.pbtxt; hold > 0
 * sets NEREID_DELAY_SCHEDULER for it. */
static nereid_server_t *start_config(const char *config, int hold)
{
    make_repo_dir("dynamic");
    write_model("m", config);
    if (hold > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", hold);
        setenv("NEREID_DELAY_SCHEDULER", v, 1);
    } else {
        unsetenv("NEREID_DELAY_SCHEDULER");
    }
    nereid_server_options_t o;
    repo_options(&o);
    nereid_server_t *s = NULL;
    nereid_error_t *err = nereid_server_new(&o, &s);
    unsetenv("NEREID_DELAY_SCHEDULER");
    if (err) {
        fprintf(stderr, "server: %s\n", nereid_error_message(err));
        nereid_error_free(err);
    }
    CHECK(s != NULL);
    return s;
}

/* The testing backend (FP32 INPUT0 -> OUTPUT0, dims [-1]) with max_batch_size
 * mbs and extra config text. */
static nereid_server_t *start(int mbs, const char *extra, int hold)
{
    char config[2048];
    snprintf(config, sizeof config,
             "backend: \"testing\" max_batch_size: %d\n"
             "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
             "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n%s\n",
             mbs, extra);
    return start_config(config, hold);
}

static void finish(nereid_server_t *s)
{
    if (s) nereid_server_free(s);
    remove_repo();
}

/* Executions of batch size `size` so far (batch_stats compute_infer.count). */
static long batch_count(nereid_server_t *s, int size)
{
    json_t *st = model_stats_json(s, "m", 0);
    if (!st) return -1;
    long count = 0;
    json_t *stats = json_object_get(st, "batch_stats");
    size_t i;
    json_t *b;
    json_array_foreach(stats, i, b)
    {
        if (json_integer_value(json_object_get(b, "batch_size")) == size)
            count = (long)json_integer_value(
                json_object_get(json_object_get(b, "compute_infer"), "count"));
    }
    json_decref(st);
    return count;
}

/* A top-level count of the model's statistics ("execution_count", ...) or,
 * with sub, inference_stats.<key>.<sub>. */
static long model_stat(nereid_server_t *s, const char *key, const char *sub)
{
    json_t *m = model_stats_json(s, "m", 0);
    json_t *v =
        sub ? json_object_get(json_object_get(json_object_get(m, "inference_stats"), key), sub)
            : json_object_get(m, key);
    long r = v ? (long)json_integer_value(v) : -1;
    json_decref(m);
    return r;
}

/* The model's number of distinct batch sizes executed. */
static size_t batch_kinds(nereid_server_t *s)
{
    size_t n = 0;
    for (int b = 1; b <= 16; b++)
        if (batch_count(s, b) > 0) n++;
    return n;
}

/* nv_inference_pending_request_count for m, or -1. */
static long pending(nereid_server_t *s)
{
    char *text = NULL;
    nereid_error_t *err = nereid_server_metrics(s, &text);
    if (err) {
        nereid_error_free(err);
        return -1;
    }
    const char *key = "nv_inference_pending_request_count{model=\"m\",version=\"1\"} ";
    char *p = strstr(text, key);
    long v = p ? strtol(p + strlen(key), NULL, 10) : -1;
    free(text);
    return v;
}

/* Waits (10 s at most) until the pending count is n: the instance has taken
 * what it is going to run. */
static bool wait_pending(nereid_server_t *s, long n)
{
    for (int i = 0; i < 10000; i++) {
        if (pending(s) == n) return true;
        sleep_ms(1);
    }
    return false;
}

/* ---- Cases ---- */

/* Six queued requests with preferred sizes 2 and 4: the largest preferred
 * size that can be formed (4), then 2. */
static void test_preferred_sizes(void)
{
    nereid_server_t *s = start(8, "dynamic_batching { preferred_batch_size: [ 2, 4 ] }", 6);
    if (!s) return finish(s);
    collector_t c;
    collector_init(&c);
    const char *ids[] = {"a1", "a2", "a3", "a4", "a5", "a6"};
    for (int i = 0; i < 6; i++)
        submit_ok(s, &c, ids[i], (opts_t){0});
    CHECK(collector_wait(&c, 6));
    CHECK(batch_count(s, 4) == 1);
    CHECK(batch_count(s, 2) == 1);
    CHECK(batch_kinds(s) == 2);
    CHECK(model_stat(s, "execution_count", NULL) == 2);
    CHECK(model_stat(s, "inference_count", NULL) == 6);
    CHECK(model_stat(s, "queue", "count") == 6);
    CHECK(model_stat(s, "success", "count") == 6);
    for (int i = 0; i < 6; i++) {
        const result_t *r = find_result(&c, ids[i]);
        CHECK(r && !r->failed && r->output_ok);
    }
    finish(s);
    collector_destroy(&c);
}

/* With a delay and no preferred size reachable, the batch waits for the
 * delay, then goes as is. */
static void test_delay_expiry(void)
{
    nereid_server_t *s = start(
        8, "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 300000 }",
        3);
    if (!s) return finish(s);
    collector_t c;
    collector_init(&c);
    uint64_t t0 = now_ms();
    submit_ok(s, &c, "d1", (opts_t){0});
    submit_ok(s, &c, "d2", (opts_t){0});
    submit_ok(s, &c, "d3", (opts_t){0});
    CHECK(collector_wait(&c, 3));
    CHECK(now_ms() - t0 >= 300);
    CHECK(batch_count(s, 3) == 1);
    CHECK(batch_kinds(s) == 1);
    finish(s);
    collector_destroy(&c);
}

/* A preferred size reached during the delay goes at once. */
static void test_preferred_completes_early(void)
{
    nereid_server_t *s = start(
        8,
        "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 20000000 }",
        0);
    if (!s) return finish(s);
    collector_t c;
    collector_init(&c);
    uint64_t t0 = now_ms();
    const char *ids[] = {"e1", "e2", "e3", "e4"};
    for (int i = 0; i < 4; i++)
        submit_ok(s, &c, ids[i], (opts_t){0});
    CHECK(collector_wait(&c, 4));
    CHECK(now_ms() - t0 < 10000);
    CHECK(batch_count(s, 4) == 1);
    CHECK(batch_kinds(s) == 1);
    finish(s);
    collector_destroy(&c);
}

/* Requests of batch size 2 never split; max_batch_size 4 caps each batch:
 * 4, 4, 2. Outputs are scattered back to the right requests. (With a
 * preferred size of 3 Triton would send 2s only: see
 * test_mark_before_passing_largest_preferred.) */
static void test_max_batch_cap_and_batched_requests(void)
{
    nereid_server_t *s = start(4, "dynamic_batching { preferred_batch_size: [ 4 ] }", 5);
    if (!s) return finish(s);
    collector_t c;
    collector_init(&c);
    const char *ids[] = {"b1", "b2", "b3", "b4", "b5"};
    for (int i = 0; i < 5; i++)
        submit_ok(s, &c, ids[i], (opts_t){.batch = 2});
    CHECK(collector_wait(&c, 5));
    CHECK(batch_count(s, 4) == 2);
    CHECK(batch_count(s, 2) == 1);
    CHECK(batch_kinds(s) == 2);
    for (int i = 0; i < 5; i++) {
        const result_t *r = find_result(&c, ids[i]);
        CHECK(r && !r->failed && r->output_ok);
    }
    finish(s);
    collector_destroy(&c);
}

/* Requests whose non-batch shapes differ are not batched together; the
 * batcher does not reorder around the odd one. */
static void test_shape_mismatch(void)
{
    nereid_server_t *s = start(8, "dynamic_batching { }", 4);
    if (!s) return finish(s);
    collector_t c;
    collector_init(&c);
    submit_ok(s, &c, "s1", (opts_t){.width = 2});
    submit_ok(s, &c, "s2", (opts_t){.width = 2});
    submit_ok(s, &c, "s3", (opts_t){.width = 3});
    submit_ok(s, &c, "s4", (opts_t){.width = 2});
    CHECK(collector_wait(&c, 4));
    CHECK(batch_count(s, 2) == 1);
    CHECK(batch_count(s, 1) == 2);
    CHECK(batch_kinds(s) == 2);
    const char *ids[] = {"s1", "s2", "s3", "s4"};
    for (int i = 0; i < 4; i++) {
        const result_t *r = find_result(&c, ids[i]);
        CHECK(r && !r->failed && r->output_ok);
    }
    CHECK(position(&c, "s3") < position(&c, "s4"));
    finish(s);
    collector_destroy(&c);
}

/* Inputs marked allow_ragged_batch batch whatever their shapes; as in Triton
 * the backend gets such an input flat ([elements]), and a
 * BATCH_SCATTER_WITH_INPUT_SHAPE output is split back by each request's
 * input shape. */
static void test_ragged(void)
{
    nereid_server_t *s =
        start_config("backend: \"testing\" max_batch_size: 8\n"
                     "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] "
                     "allow_ragged_batch: true } ]\n"
                     "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
                     "batch_output [ { target_name: \"OUTPUT0\" "
                     "kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: \"INPUT0\" } ]\n"
                     "dynamic_batching { }\n",
                     2);
    if (!s) return finish(s);
    collector_t c;
    collector_init(&c);
    submit_ok(s, &c, "g1", (opts_t){.width = 2});
    submit_ok(s, &c, "g2", (opts_t){.width = 3});
    CHECK(collector_wait(&c, 2));
    CHECK(batch_count(s, 2) == 1);
    /* the backend saw one flat INPUT0 of 5 elements and produced OUTPUT0
     * flat; each request gets its part shaped like its INPUT0 */
    const char *ids[] = {"g1", "g2"};
    for (int i = 0; i < 2; i++) {
        const result_t *r = find_result(&c, ids[i]);
        CHECK(r && !r->failed && r->output_ok);
    }
    /* one request alone: the same flat input, the same shaping */
    submit_ok(s, &c, "g3", (opts_t){.width = 3});
    CHECK(collector_wait(&c, 3));
    const result_t *r3 = find_result(&c, "g3");
    CHECK(r3 && !r3->failed && r3->output_ok);
    finish(s);
    collector_destroy(&c);
}

/* Level 1 before level 2; priority 0 or above priority_levels uses the
 * default level; FIFO within a level. One request per batch. */
static void test_priorities(void)
{
    nereid_server_t *s =
        start(1, "dynamic_batching { priority_levels: 2 default_priority_level: 2 }", 5);
    if (!s) return finish(s);
    collector_t c;
    collector_init(&c);
    submit_ok(s, &c, "low1", (opts_t){.priority = 2});
    submit_ok(s, &c, "dflt", (opts_t){.priority = 0});
    submit_ok(s, &c, "high1", (opts_t){.priority = 1});
    submit_ok(s, &c, "over", (opts_t){.priority = 7});
    submit_ok(s, &c, "high2", (opts_t){.priority = 1});
    CHECK(collector_wait(&c, 5));
    CHECK(position(&c, "high1") == 0);
    CHECK(position(&c, "high2") == 1);
    CHECK(position(&c, "low1") == 2);
    CHECK(position(&c, "dflt") == 3);
    CHECK(position(&c, "over") == 4);
    CHECK(batch_count(s, 1) == 5);
    finish(s);
    collector_destroy(&c);
}

/* A full queue rejects at once with Triton's text; the pending metric counts
 * the queued requests; stopping the server drains the held queue (the hold
 * is never reached). */
static void test_max_queue_size(void)
{
    nereid_server_t *s =
        start(8, "dynamic_batching { default_queue_policy { max_queue_size: 2 } }", 100);
    if (!s) return finish(s);
    collector_t c;
    collector_init(&c);
    submit_ok(s, &c, "q1", (opts_t){0});
    submit_ok(s, &c, "q2", (opts_t){0});
    nereid_error_t *err = submit(s, &c, "q3", (opts_t){0});
    CHECK(err != NULL);
    if (err) {
        CHECK(nereid_error_code(err) == NEREID_ERROR_UNAVAILABLE);
        CHECK(strcmp(nereid_error_message(err), "[request id: q3] Exceeds maximum queue size") ==
              0);
        nereid_error_free(err);
    }
    err = submit(s, &c, "q4", (opts_t){.no_id = true});
    CHECK(err != NULL);
    if (err) {
        CHECK(strcmp(nereid_error_message(err),
                     "[request id: <id_unknown>] Exceeds maximum queue size") == 0);
        nereid_error_free(err);
    }
    CHECK(pending(s) == 2);
    nereid_server_stop(s);
    CHECK(collector_wait(&c, 2));
    const result_t *r1 = find_result(&c, "q1"), *r2 = find_result(&c, "q2");
    CHECK(r1 && !r1->failed && r1->output_ok);
    CHECK(r2 && !r2->failed && r2->output_ok);
    finish(s);
    collector_destroy(&c);
}

/* REJECT: a request that waits past its timeout fails with Triton's text,
 * on time: while the only instance is still busy. */
static void test_reject_timeout(void)
{
    nereid_server_t *s = start(1,
                               "dynamic_batching { default_queue_policy { "
                               "default_timeout_microseconds: 100000 timeout_action: REJECT } }",
                               0);
    if (!s) return finish(s);
    collector_t c;
    collector_init(&c);
    submit_ok(s, &c, "busy", (opts_t){.delay_ms = 1500});
    CHECK(wait_pending(s, 0));
    submit_ok(s, &c, "late", (opts_t){0});
    CHECK(collector_wait(&c, 2));
    const result_t *busy = find_result(&c, "busy"), *late = find_result(&c, "late");
    CHECK(busy && !busy->failed);
    CHECK(position(&c, "late") == 0);
    CHECK(late && late->failed && late->code == NEREID_ERROR_UNAVAILABLE);
    if (late) CHECK(strcmp(late->msg, "Request timeout expired") == 0);
    CHECK(model_stat(s, "fail", "count") == 1);
    CHECK(model_stat(s, "execution_count", NULL) == 1);
    CHECK(batch_count(s, 1) == 1);
    CHECK(pending(s) == 0);
    finish(s);
    collector_destroy(&c);
}

/* DELAY: a timed-out request stays, behind the requests of its level that
 * have not timed out. Its timeout comes from the request (override). */
static void test_delay_timeout(void)
{
    nereid_server_t *s = start(1,
                               "dynamic_batching { default_queue_policy { "
                               "default_timeout_microseconds: 60000000 timeout_action: DELAY "
                               "allow_timeout_override: true } }",
                               0);
    if (!s) return finish(s);
    collector_t c;
    collector_init(&c);
    submit_ok(s, &c, "busy", (opts_t){.delay_ms = 600});
    CHECK(wait_pending(s, 0));
    submit_ok(s, &c, "expired", (opts_t){.timeout_us = 100000});
    submit_ok(s, &c, "fresh", (opts_t){0});
    CHECK(collector_wait(&c, 3));
    CHECK(position(&c, "busy") == 0);
    CHECK(position(&c, "fresh") == 1);
    CHECK(position(&c, "expired") == 2);
    const result_t *r = find_result(&c, "expired");
    CHECK(r && !r->failed && r->output_ok);
    finish(s);
    collector_destroy(&c);
}

/* allow_timeout_override: a request timeout shortens the level's timeout,
 * never lengthens it, is ignored without the override, and is ignored when
 * the level has no timeout. Levels: 1 = 60 s with override, 2 = 100 ms with
 * override, 3 = 60 s without override, 4 = no timeout with override. */
static void test_timeout_override(void)
{
    nereid_server_t *s = start(
        1,
        "dynamic_batching { priority_levels: 4 default_priority_level: 1\n"
        "  priority_queue_policy { key: 1 value { default_timeout_microseconds: 60000000 "
        "allow_timeout_override: true } }\n"
        "  priority_queue_policy { key: 2 value { default_timeout_microseconds: 100000 "
        "allow_timeout_override: true } }\n"
        "  priority_queue_policy { key: 3 value { default_timeout_microseconds: 60000000 } }\n"
        "  priority_queue_policy { key: 4 value { allow_timeout_override: true } } }",
        0);
    if (!s) return finish(s);
    collector_t c;
    collector_init(&c);
    submit_ok(s, &c, "busy", (opts_t){.delay_ms = 600, .priority = 1});
    CHECK(wait_pending(s, 0));
    submit_ok(s, &c, "shorter", (opts_t){.priority = 1, .timeout_us = 100000});
    submit_ok(s, &c, "plain", (opts_t){.priority = 1});
    submit_ok(s, &c, "longer", (opts_t){.priority = 2, .timeout_us = 60000000});
    submit_ok(s, &c, "nooverride", (opts_t){.priority = 3, .timeout_us = 100000});
    submit_ok(s, &c, "nodefault", (opts_t){.priority = 4, .timeout_us = 100000});
    CHECK(collector_wait(&c, 6));
    const result_t *r;
    r = find_result(&c, "shorter");
    CHECK(r && r->failed && strcmp(r->msg, "Request timeout expired") == 0);
    r = find_result(&c, "longer");
    CHECK(r && r->failed && strcmp(r->msg, "Request timeout expired") == 0);
    r = find_result(&c, "plain");
    CHECK(r && !r->failed);
    r = find_result(&c, "nooverride");
    CHECK(r && !r->failed);
    r = find_result(&c, "nodefault");
    CHECK(r && !r->failed);
    finish(s);
    collector_destroy(&c);
}

/* Two instances, one request per batch; "slow" runs longer than "fast",
 * which runs beside it, and "last" waits for a free instance. With
 * preserve_ordering the responses come in dispatch order; without it "fast"
 * comes before "slow" (the control). */
static void run_ordering(bool preserve)
{
    char extra[256];
    snprintf(extra, sizeof extra,
             "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
             "dynamic_batching { preserve_ordering: %s }",
             preserve ? "true" : "false");
    nereid_server_t *s = start(1, extra, 3);
    if (!s) return finish(s);
    collector_t c;
    collector_init(&c);
    submit_ok(s, &c, "slow", (opts_t){.delay_ms = 400});
    submit_ok(s, &c, "fast", (opts_t){0});
    submit_ok(s, &c, "last", (opts_t){.delay_ms = 100});
    CHECK(collector_wait(&c, 3));
    if (preserve) {
        CHECK(position(&c, "slow") == 0);
        CHECK(position(&c, "fast") == 1);
        CHECK(position(&c, "last") == 2);
    } else {
        CHECK(position(&c, "fast") < position(&c, "slow"));
        CHECK(position(&c, "last") < position(&c, "slow"));
    }
    for (int i = 0; i < 3; i++)
        CHECK(!c.results[i].failed && c.results[i].output_ok);
    CHECK(batch_count(s, 1) == 3);
    finish(s);
    collector_destroy(&c);
}

static void test_preserve_ordering(void)
{
    run_ordering(true);
    run_ordering(false);
}

/* Delay 0: a free instance takes the first request alone; requests that
 * queue while it runs batch together. */
static void test_zero_delay(void)
{
    nereid_server_t *s = start(8, "dynamic_batching { }", 0);
    if (!s) return finish(s);
    collector_t c;
    collector_init(&c);
    submit_ok(s, &c, "z1", (opts_t){.delay_ms = 300});
    CHECK(wait_pending(s, 0));
    submit_ok(s, &c, "z2", (opts_t){0});
    submit_ok(s, &c, "z3", (opts_t){0});
    submit_ok(s, &c, "z4", (opts_t){0});
    CHECK(pending(s) == 3);
    CHECK(collector_wait(&c, 4));
    CHECK(batch_count(s, 1) == 1);
    CHECK(batch_count(s, 3) == 1);
    CHECK(batch_kinds(s) == 2);
    finish(s);
    collector_destroy(&c);
}

/* Model warmup runs through the batcher before the model serves; the
 * NEREID_DELAY_SCHEDULER hold does not stop it and still holds the first
 * client batch. */
static void test_warmup_not_held(void)
{
    nereid_server_t *s =
        start(8,
              "dynamic_batching { }\n"
              "model_warmup [ { name: \"w\" batch_size: 1 inputs { key: \"INPUT0\" "
              "value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]",
              2);
    if (!s) return finish(s);
    collector_t c;
    collector_init(&c);
    submit_ok(s, &c, "w1", (opts_t){0});
    sleep_ms(50); /* a released hold would run w1 now; the correct code cannot fail here */
    CHECK(pending(s) == 1);
    submit_ok(s, &c, "w2", (opts_t){0});
    CHECK(collector_wait(&c, 2));
    CHECK(batch_count(s, 2) == 1);
    finish(s);
    collector_destroy(&c);
}

/* Triton's rule for a batch at or above the largest preferred size: a
 * request of batch 7 with preferred sizes 2 and 6 goes at once, not after
 * the (long) queue delay. */
static void test_above_largest_preferred_goes_at_once(void)
{
    nereid_server_t *s = start(8,
                               "dynamic_batching { preferred_batch_size: [ 2, 6 ] "
                               "max_queue_delay_microseconds: 20000000 }",
                               0);
    if (!s) return finish(s);
    collector_t c;
    collector_init(&c);
    uint64_t t0 = now_ms();
    submit_ok(s, &c, "p7", (opts_t){.batch = 7, .width = 1});
    CHECK(collector_wait(&c, 1));
    CHECK(now_ms() - t0 < 10000);
    CHECK(batch_count(s, 7) == 1);
    const result_t *r = find_result(&c, "p7");
    CHECK(r && !r->failed && r->output_ok);
    finish(s);
    collector_destroy(&c);
}

/* Queued 1 then 7 (held by Triton's TRITONSERVER_DELAY_SCHEDULER name):
 * adding the 7 passes the largest preferred size (6) before any preferred
 * size was reached, so Triton sends the 1 alone, then the 7; together they
 * would have fit max_batch_size 8. */
static void test_mark_before_passing_largest_preferred(void)
{
    setenv("TRITONSERVER_DELAY_SCHEDULER", "2", 1);
    nereid_server_t *s = start(8,
                               "dynamic_batching { preferred_batch_size: [ 2, 6 ] "
                               "max_queue_delay_microseconds: 20000000 }",
                               0);
    unsetenv("TRITONSERVER_DELAY_SCHEDULER");
    if (!s) return finish(s);
    collector_t c;
    collector_init(&c);
    uint64_t t0 = now_ms();
    submit_ok(s, &c, "q1", (opts_t){.width = 1});
    submit_ok(s, &c, "q7", (opts_t){.batch = 7, .width = 1});
    CHECK(collector_wait(&c, 2));
    CHECK(now_ms() - t0 < 10000);
    CHECK(batch_count(s, 1) == 1);
    CHECK(batch_count(s, 7) == 1);
    CHECK(batch_kinds(s) == 2);
    CHECK(position(&c, "q1") == 0);
    finish(s);
    collector_destroy(&c);
}

/* The identity backend sleeps execute_delay_ms in every execute, as
 * Triton's identity backend does (Triton's batcher suites rely on it to keep
 * an instance busy). */
static void test_identity_execute_delay(void)
{
    nereid_server_t *s = start_config(
        "backend: \"identity\" max_batch_size: 8\n"
        "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
        "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
        "dynamic_batching { }\n"
        "parameters [ { key: \"execute_delay_ms\" value: { string_value: \"400\" } } ]\n",
        0);
    if (!s) return finish(s);
    collector_t c;
    collector_init(&c);
    uint64_t t0 = now_ms();
    submit_ok(s, &c, "i1", (opts_t){0});
    CHECK(collector_wait(&c, 1));
    CHECK(now_ms() - t0 >= 400);
    CHECK(model_stat(s, "compute_infer", "ns") >= 400L * 1000 * 1000);
    const result_t *r = find_result(&c, "i1");
    CHECK(r && !r->failed && r->output_ok);
    finish(s);
    collector_destroy(&c);
}

/* The identity backend copies request by request, as Triton's does: a
 * ragged input needs no batch_output there, each request gets its own
 * shape back (L0_batcher's custom_zero_1_float32). */
static void test_identity_ragged(void)
{
    nereid_server_t *s =
        start_config("backend: \"identity\" max_batch_size: 8\n"
                     "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] "
                     "allow_ragged_batch: true } ]\n"
                     "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
                     "dynamic_batching { }\n",
                     2);
    if (!s) return finish(s);
    collector_t c;
    collector_init(&c);
    submit_ok(s, &c, "r1", (opts_t){.width = 4});
    submit_ok(s, &c, "r2", (opts_t){.width = 2});
    CHECK(collector_wait(&c, 2));
    CHECK(batch_count(s, 2) == 1);
    const char *ids[] = {"r1", "r2"};
    for (int i = 0; i < 2; i++) {
        const result_t *r = find_result(&c, ids[i]);
        CHECK(r && !r->failed && r->output_ok);
    }
    finish(s);
    collector_destroy(&c);
}

int main(void)
{
    test_preferred_sizes();
    test_delay_expiry();
    test_preferred_completes_early();
    test_max_batch_cap_and_batched_requests();
    test_shape_mismatch();
    test_ragged();
    test_priorities();
    test_max_queue_size();
    test_reject_timeout();
    test_delay_timeout();
    test_timeout_override();
    test_preserve_ordering();
    test_zero_delay();
    test_warmup_not_held();
    test_above_largest_preferred_goes_at_once();
    test_mark_before_passing_largest_preferred();
    test_identity_execute_delay();
    test_identity_ragged();
    return check_summary();
}
