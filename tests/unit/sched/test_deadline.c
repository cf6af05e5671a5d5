/*
 * Request deadlines (the client's timeout) in every queue (default
 * scheduler, dynamic batcher, rate limiter, ensemble steps; the sequence
 * batcher's backlog, as Triton): a request whose timeout passes while it is
 * queued behind an execution that does not end fails with Triton's
 * timed-out error (UNAVAILABLE "Request timeout expired"; the sequence
 * batcher's own text) and counts as a REJECTED failure, without executing;
 * requests without a timeout are untouched.
 * The blocking execution ends only when the test creates a file, and only
 * after the timed-out request has answered: the answer cannot come from an
 * instance looking at its queue. Sleeps only make sure a deadline passed
 * (a lower bound), never that something happened in time.
 */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "server_util.h"
#include "test_util.h"

static float in_data[4] = {1, 2, 3, 4};

#define IO                                                                                         \
    "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"                           \
    "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
#define EXPIRED_TEXT "Request timeout expired"
#define SEQ_EXPIRED_TEXT "timeout of the corresponding sequence has been expired"

static void testing_model(const char *name, int max_batch, const char *extra)
{
    char config[2048];
    snprintf(config, sizeof config,
             "name: \"%s\"\nbackend: \"testing\"\nmax_batch_size: %d\n%s" IO "%s", name, max_batch,
             strstr(extra, "instance_group") ? ""
                                             : "instance_group [ { count: 1 kind: KIND_CPU } ]\n",
             extra);
    write_model(name, config);
}

/* A request for model with timeout_us (0: none); wait names a file execute
 * waits for, started one it creates when it starts. */
static nereid_request_t *request(nereid_server_t *s, const char *model, bool batching,
                                 uint64_t timeout_us, const char *wait, const char *started)
{
    nereid_request_t *req = NULL;
    int64_t shape[2] = {1, 4};
    char path[600];
    nereid_error_t *err = nereid_request_new(s, model, -1, &req);
    if (!err)
        err =
            nereid_request_add_input(req, "INPUT0", NEREID_TYPE_FP32, batching ? shape : shape + 1,
                                     batching ? 2 : 1, in_data, sizeof in_data);
    if (!err && wait) {
        snprintf(path, sizeof path, "%s/%s", repo, wait);
        err = nereid_request_set_parameter_string(req, "wait_for_file", path);
    }
    if (!err && started) {
        snprintf(path, sizeof path, "%s/%s", repo, started);
        err = nereid_request_set_parameter_string(req, "started_file", path);
    }
    CHECK(err == NULL);
    nereid_error_free(err);
    if (timeout_us) nereid_request_set_timeout_us(req, timeout_us);
    return req;
}

static void submit(nereid_server_t *s, nereid_request_t *req, waiter_t *w)
{
    waiter_init(w);
    nereid_error_t *err = nereid_server_infer_async(s, req, NULL, waiter_on_done, w);
    CHECK_MSG(err == NULL, "%s", err ? nereid_error_message(err) : "");
    if (err) {
        nereid_error_free(err);
        nereid_request_free(req);
        w->done = 1;
        w->failed = 1;
    }
}

/* Waits until the file repo/rel exists (created by the testing backend). */
static void wait_file(const char *rel)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", repo, rel);
    int i = 0;
    while (access(path, F_OK) != 0 && i++ < 60000)
        usleep(1000);
    CHECK_MSG(i <= 60000, "%s never appeared", rel);
}

/* Whether w's request has not answered yet (the blocking execution still
 * runs: the testing backend gives up waiting after 10 s, then a queue
 * would see the expired requests itself). */
static bool pending(waiter_t *w)
{
    pthread_mutex_lock(&w->lock);
    bool yes = w->done == 0;
    pthread_mutex_unlock(&w->lock);
    return yes;
}

/* The response's error code, or -1 on success; frees the response. */
static int outcome_code(waiter_t *w, char *msg, size_t msg_size)
{
    nereid_response_t *resp = waiter_take(w);
    const nereid_error_t *e = resp ? nereid_response_error(resp) : NULL;
    int code = e ? (int)nereid_error_code(e) : -1;
    if (msg) snprintf(msg, msg_size, "%s", e ? nereid_error_message(e) : "");
    nereid_response_free(resp);
    return code;
}

/* nv_inference_request_failure{model,reason} for model. */
static long long failures(nereid_server_t *s, const char *model, const char *reason)
{
    char *text = NULL;
    nereid_error_t *err = nereid_server_metrics(s, &text);
    nereid_error_free(err);
    char want[200];
    snprintf(want, sizeof want,
             "nv_inference_request_failure{model=\"%s\",reason=\"%s\",version=\"1\"} ", model,
             reason);
    char *p = text ? strstr(text, want) : NULL;
    long long n = p ? atoll(p + strlen(want)) : 0;
    free(text);
    return n;
}

static long long executions(nereid_server_t *s, const char *model)
{
    return stat_value(s, model, 1, "execution_count", NULL);
}

/* Checks that w failed as timed out with text. */
static void check_expired(waiter_t *w, const char *text, const char *what)
{
    char msg[300];
    int code = outcome_code(w, msg, sizeof msg);
    CHECK_MSG(code == NEREID_ERROR_UNAVAILABLE, "%s: %d %s", what, code, msg);
    CHECK_MSG(strcmp(msg, text) == 0, "%s: '%s'", what, msg);
}

/* A: executes until released; B (timeout 200 ms) and C (none) queue behind
 * it on model (blocker: the model A runs on, when another one holds the
 * resource model waits for). B fails while A still executes; C runs. */
static void test_queued(nereid_server_t *s, const char *model, const char *blocker, bool batching,
                        const char *tag)
{
    char release[64], started[64];
    snprintf(release, sizeof release, "release-%s", tag);
    snprintf(started, sizeof started, "started-%s", tag);
    long long execs = executions(s, model);
    long long rejected = failures(s, model, "REJECTED");
    waiter_t a, b, c;
    submit(s, request(s, blocker, batching, 0, release, started), &a);
    wait_file(started);
    submit(s, request(s, model, batching, 200000, NULL, NULL), &b);
    submit(s, request(s, model, batching, 0, NULL, NULL), &c);
    check_expired(&b, EXPIRED_TEXT, tag);
    CHECK_MSG(pending(&a), "%s: B answered only once A was done", tag);
    write_file(release, "");
    CHECK_MSG(outcome_code(&a, NULL, 0) == -1, "%s", tag);
    CHECK_MSG(outcome_code(&c, NULL, 0) == -1, "%s", tag);
    long long ran = executions(s, model) - execs;
    long long want = strcmp(model, blocker) == 0 ? 2 : 1;
    CHECK_MSG(ran == want, "%s: %lld executions, want %lld", tag, ran, want);
    CHECK_MSG(failures(s, model, "REJECTED") == rejected + 1, "%s: %lld", tag,
              failures(s, model, "REJECTED"));
}

/* A dynamic batcher level with a queue policy follows Triton's rules alone:
 * without allow_timeout_override the client's timeout is ignored
 * (test_dynamic.c covers the rest of the policy rules). */
static void test_policy_keeps_triton_rule(nereid_server_t *s)
{
    waiter_t a, b;
    submit(s, request(s, "dynpol", true, 0, "release-pol", "started-pol"), &a);
    wait_file("started-pol");
    submit(s, request(s, "dynpol", true, 1000, NULL, NULL), &b);
    usleep(50000); /* past B's timeout */
    write_file("release-pol", "");
    CHECK(outcome_code(&a, NULL, 0) == -1);
    CHECK(outcome_code(&b, NULL, 0) == -1);
}

/* An ensemble's steps inherit its deadline, measured from its arrival: a
 * first step that runs past it leaves no time to the second, which fails
 * at once without executing (a step deadline measured from the step's own
 * submission would let it run). */
static void test_ensemble(nereid_server_t *s)
{
    long long second = executions(s, "step2");
    waiter_t a;
    submit(s, request(s, "ens", false, 200000, "release-ens", "started-ens"), &a);
    wait_file("started-ens");
    usleep(300000); /* past the ensemble's timeout, while its first step runs */
    write_file("release-ens", "");
    /* A step's error, as Triton's ensembles report them. */
    check_expired(&a, "in ensemble 'ens', " EXPIRED_TEXT, "ensemble");
    CHECK(executions(s, "step2") == second);
    CHECK(failures(s, "step2", "REJECTED") == 1);

    /* With time left, both steps run. */
    submit(s, request(s, "ens", false, 60000000, NULL, NULL), &a);
    CHECK(outcome_code(&a, NULL, 0) == -1);
    CHECK(executions(s, "step2") == second + 1);
}

static void seq_request(nereid_server_t *s, uint64_t id, bool start, bool end, uint64_t timeout_us,
                        const char *wait, const char *started, waiter_t *w)
{
    nereid_request_t *req = request(s, "seq", false, timeout_us, wait, started);
    nereid_request_set_correlation_id(req, id);
    nereid_request_set_sequence_flags(req, start, end);
    submit(s, req, w);
}

/* Sequence batcher, Triton's rule: a request's timeout applies while its
 * sequence waits in the backlog for a position (the whole backlogged
 * sequence then fails, with the backlog's text); the requests of a
 * sequence that holds a position never time out, so a sequence never
 * loses a step (Triton's L0_sequence_batcher test_request_timeout). */
static void test_sequence(nereid_server_t *s)
{
    long long execs = executions(s, "seq");
    long long rejected = failures(s, "seq", "REJECTED");
    waiter_t a, b, c, d, e;
    seq_request(s, 7, true, false, 0, "release-seq", "started-seq", &a);
    wait_file("started-seq");
    seq_request(s, 7, false, false, 200000, NULL, NULL, &b);
    /* Backlogged: the model's one slot is sequence 7's. */
    seq_request(s, 9, true, false, 200000, NULL, NULL, &c);
    seq_request(s, 9, false, true, 0, NULL, NULL, &d);
    check_expired(&c, SEQ_EXPIRED_TEXT, "sequence, backlogged");
    check_expired(&d, SEQ_EXPIRED_TEXT, "sequence, backlogged behind");
    CHECK(pending(&a));
    usleep(50000); /* past B's timeout too */
    seq_request(s, 7, false, true, 0, NULL, NULL, &e);
    write_file("release-seq", "");
    CHECK(outcome_code(&a, NULL, 0) == -1);
    CHECK(outcome_code(&b, NULL, 0) == -1);
    CHECK(outcome_code(&e, NULL, 0) == -1);
    CHECK(executions(s, "seq") == execs + 3);
    CHECK(failures(s, "seq", "REJECTED") == rejected + 2);
    /* Sequence 9 has ended: a request without START is refused. */
    nereid_request_t *req = request(s, "seq", false, 0, NULL, NULL);
    nereid_request_set_correlation_id(req, 9);
    nereid_request_set_sequence_flags(req, false, true);
    waiter_t f;
    waiter_init(&f);
    nereid_error_t *err = nereid_server_infer_async(s, req, NULL, waiter_on_done, &f);
    CHECK(err != NULL);
    if (err) {
        CHECK_STR_CONTAINS(nereid_error_message(err), "must specify the START flag");
        nereid_request_free(req);
    }
    nereid_error_free(err);
    waiter_destroy(&f);
}

/* A request cancelled while it waits for a rate-limited instance's turn is
 * completed as CANCELLED without executing and counts with reason
 * CANCELED. */
static void test_rate_limited_cancel(nereid_server_t *s)
{
    long long execs = executions(s, "rl");
    long long canceled = failures(s, "rl", "CANCELED");
    waiter_t a, b, c;
    submit(s, request(s, "rl_holder", false, 0, "release-rlc", "started-rlc"), &a);
    wait_file("started-rlc");
    nereid_cancel_token_t *t = nereid_cancel_token_new();
    nereid_request_t *req = request(s, "rl", false, 0, NULL, NULL);
    nereid_request_set_cancel_token(req, t);
    submit(s, req, &b);
    nereid_request_cancel(t);
    nereid_cancel_token_free(t);
    write_file("release-rlc", "");
    CHECK(outcome_code(&a, NULL, 0) == -1);
    CHECK(outcome_code(&b, NULL, 0) == NEREID_ERROR_CANCELLED);
    submit(s, request(s, "rl", false, 0, NULL, NULL), &c);
    CHECK(outcome_code(&c, NULL, 0) == -1);
    CHECK(executions(s, "rl") == execs + 1);
    CHECK(failures(s, "rl", "CANCELED") == canceled + 1);
}

/* A request with time left is never touched: it waits as long as it must. */
static void test_time_left(nereid_server_t *s)
{
    waiter_t a, b;
    submit(s, request(s, "slow", false, 0, "release-left", "started-left"), &a);
    wait_file("started-left");
    submit(s, request(s, "slow", false, 60000000, NULL, NULL), &b);
    usleep(20000);
    write_file("release-left", "");
    CHECK(outcome_code(&a, NULL, 0) == -1);
    CHECK(outcome_code(&b, NULL, 0) == -1);
}

int main(void)
{
    make_repo_dir("deadline");
    testing_model("slow", 0, "");
    testing_model("dyn", 8, "dynamic_batching { }\n");
    testing_model("dynpol", 8,
                  "dynamic_batching { default_queue_policy { default_timeout_microseconds: "
                  "60000000 } }\n");
    testing_model("step1", 0, "");
    testing_model("step2", 0, "");
    testing_model("seq", 0, "sequence_batching { max_sequence_idle_microseconds: 60000000 }\n");
    /* Rate limited: both need the one copy of global resource R. */
    const char *rl_group = "instance_group [ { count: 1 kind: KIND_CPU rate_limiter { resources "
                           "[ { name: \"R\" global: true count: 1 } ] } } ]\n";
    testing_model("rl", 0, rl_group);
    testing_model("rl_holder", 0, rl_group);
    write_model("ens", "name: \"ens\"\nplatform: \"ensemble\"\nmax_batch_size: 0\n" IO
                       "ensemble_scheduling { step [\n"
                       "  { model_name: \"step1\" input_map { key: \"INPUT0\" value: \"INPUT0\" }\n"
                       "    output_map { key: \"OUTPUT0\" value: \"MID\" } },\n"
                       "  { model_name: \"step2\" input_map { key: \"INPUT0\" value: \"MID\" }\n"
                       "    output_map { key: \"OUTPUT0\" value: \"OUTPUT0\" } } ] }\n");
    nereid_server_options_t o;
    repo_options(&o);
    o.exit_on_error = true;
    o.model_control_mode = NEREID_MODEL_CONTROL_NONE;
    o.rate_limit = NEREID_RATE_LIMIT_EXECUTION_COUNT;
    nereid_server_t *s = NULL;
    nereid_error_t *err = nereid_server_new(&o, &s);
    CHECK_MSG(err == NULL && s, "%s", err ? nereid_error_message(err) : "");
    nereid_error_free(err);
    if (s) {
        test_queued(s, "slow", "slow", false, "default");
        test_queued(s, "dyn", "dyn", true, "dynamic");
        test_queued(s, "rl", "rl_holder", false, "rate-limited");
        test_policy_keeps_triton_rule(s);
        test_ensemble(s);
        test_sequence(s);
        test_rate_limited_cancel(s);
        test_time_left(s);
        nereid_server_free(s);
    }
    remove_repo();
    return check_summary();
}
