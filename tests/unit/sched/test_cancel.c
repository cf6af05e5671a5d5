/*
 * Request cancellation (server.h cancel tokens) through each scheduler: a
 * queued request is completed as CANCELLED without executing, an executing
 * one completes (or stops, when its backend asks), an ensemble submits no
 * further step, a cancelled sequence frees its slot. Every wait is on a
 * file the test creates or on a completion, never on time.
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

static void testing_model(const char *name, const char *extra)
{
    char config[2048];
    snprintf(config, sizeof config,
             "name: \"%s\"\nbackend: \"testing\"\nmax_batch_size: 0\n"
             "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
             "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
             "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n%s",
             name, extra);
    write_model(name, config);
}

/* A request for model; wait names a file execute waits for, started one
 * it creates when it starts; token (may be NULL) is attached. */
static nereid_request_t *request(nereid_server_t *s, const char *model, const char *wait,
                                 const char *started, bool stop_on_cancel,
                                 nereid_cancel_token_t *token)
{
    nereid_request_t *req = NULL;
    bool batching = strcmp(model, "dyn") == 0;
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
    if (!err && stop_on_cancel)
        err = nereid_request_set_parameter_string(req, "stop_on_cancel", "true");
    CHECK(err == NULL);
    nereid_error_free(err);
    if (token) nereid_request_set_cancel_token(req, token);
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
    while (access(path, F_OK) != 0 && i++ < 10000)
        usleep(1000);
    CHECK_MSG(i <= 10000, "%s never appeared", rel);
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

/* nv_inference_request_failure{model,reason=CANCELED} for model. */
static long long cancel_failures(nereid_server_t *s, const char *model)
{
    char *text = NULL;
    nereid_error_t *err = nereid_server_metrics(s, &text);
    nereid_error_free(err);
    char want[200];
    snprintf(want, sizeof want,
             "nv_inference_request_failure{model=\"%s\",reason=\"CANCELED\",version=\"1\"} ",
             model);
    char *p = text ? strstr(text, want) : NULL;
    long long n = p ? atoll(p + strlen(want)) : -1;
    free(text);
    return n;
}

static long long response_cancel_count(nereid_server_t *s, const char *model)
{
    json_t *st = model_stats_json(s, model, 1);
    json_t *c = json_object_get(
        json_object_get(json_object_get(json_object_get(st, "response_stats"), "0"), "cancel"),
        "count");
    long long n = c ? json_integer_value(c) : 0;
    json_decref(st);
    return n;
}

/* A request queued behind an executing one is cancelled: it completes with
 * CANCELLED (empty message, as Triton) once the instance looks at the
 * queue, and never executes. */
static void test_queued(nereid_server_t *s, const char *model, const char *tag)
{
    char release[64], started[64];
    snprintf(release, sizeof release, "release-%s", tag);
    snprintf(started, sizeof started, "started-%s", tag);
    long long execs = stat_value(s, model, 1, "execution_count", NULL);
    waiter_t a, b, c;
    submit(s, request(s, model, release, started, false, NULL), &a);
    wait_file(started);
    nereid_cancel_token_t *t = nereid_cancel_token_new();
    submit(s, request(s, model, NULL, NULL, false, t), &b);
    submit(s, request(s, model, NULL, NULL, false, NULL), &c);
    nereid_request_cancel(t);
    nereid_cancel_token_free(t);
    write_file(release, "");
    char msg[200];
    CHECK_MSG(outcome_code(&a, NULL, 0) == -1, "%s", model);
    int code = outcome_code(&b, msg, sizeof msg);
    CHECK_MSG(code == NEREID_ERROR_CANCELLED, "%s: %d %s", model, code, msg);
    CHECK_STR(msg, "");
    CHECK_MSG(outcome_code(&c, NULL, 0) == -1, "%s", model);
    long long ran = stat_value(s, model, 1, "execution_count", NULL) - execs;
    CHECK_MSG(ran == 2, "%s: %lld executions, want 2", model, ran);
    CHECK_MSG(cancel_failures(s, model) == 1, "%s: %lld", model, cancel_failures(s, model));
}

/* A request cancelled while it executes completes normally when its
 * backend does not look; when it does (stop_on_cancel), it stops with
 * CANCELLED and counts as a cancelled response. */
static void test_executing(nereid_server_t *s)
{
    waiter_t a;
    nereid_cancel_token_t *t = nereid_cancel_token_new();
    submit(s, request(s, "slow", "release-exec", "started-exec", false, t), &a);
    wait_file("started-exec");
    nereid_request_cancel(t);
    write_file("release-exec", "");
    CHECK(outcome_code(&a, NULL, 0) == -1);
    nereid_cancel_token_free(t);

    long long before = response_cancel_count(s, "slow");
    t = nereid_cancel_token_new();
    submit(s, request(s, "slow", "never", "started-stop", true, t), &a);
    wait_file("started-stop");
    nereid_request_cancel(t);
    char msg[200];
    int code = outcome_code(&a, msg, sizeof msg);
    CHECK_MSG(code == NEREID_ERROR_CANCELLED, "%d %s", code, msg);
    CHECK_STR(msg, "testing backend: cancelled");
    CHECK(response_cancel_count(s, "slow") == before + 1);
    nereid_cancel_token_free(t);
}

/* An ensemble cancelled while its first step executes submits no second
 * step: the second model never executes. */
static void test_ensemble(nereid_server_t *s)
{
    long long second = stat_value(s, "step2", 1, "execution_count", NULL);
    waiter_t a;
    nereid_cancel_token_t *t = nereid_cancel_token_new();
    submit(s, request(s, "ens", "release-ens", "started-ens", false, t), &a);
    wait_file("started-ens");
    nereid_request_cancel(t);
    write_file("release-ens", "");
    char msg[200];
    int code = outcome_code(&a, msg, sizeof msg);
    CHECK_MSG(code == NEREID_ERROR_CANCELLED, "%d %s", code, msg);
    CHECK(stat_value(s, "step2", 1, "execution_count", NULL) == second);
    CHECK(stat_value(s, "step1", 1, "execution_count", NULL) >= 1);
    CHECK_MSG(cancel_failures(s, "ens") >= 1, "ens: %lld", cancel_failures(s, "ens"));
    nereid_cancel_token_free(t);

    /* Not cancelled: both steps run. */
    submit(s, request(s, "ens", NULL, NULL, false, NULL), &a);
    CHECK(outcome_code(&a, NULL, 0) == -1);
    CHECK(stat_value(s, "step2", 1, "execution_count", NULL) == second + 1);
}

/* A token cancelled before submission: the request never runs. */
static void test_before_submit(nereid_server_t *s)
{
    long long execs = stat_value(s, "slow", 1, "execution_count", NULL);
    nereid_cancel_token_t *t = nereid_cancel_token_new();
    nereid_request_cancel(t);
    CHECK(nereid_cancel_token_cancelled(t));
    waiter_t a;
    submit(s, request(s, "slow", NULL, NULL, false, t), &a);
    nereid_cancel_token_free(t);
    CHECK(outcome_code(&a, NULL, 0) == NEREID_ERROR_CANCELLED);
    CHECK(stat_value(s, "slow", 1, "execution_count", NULL) == execs);
}

/* Sequence batcher: a sequence whose queued request is cancelled ends; its
 * slot (the model's only one) serves the next sequence, and the cancelled
 * sequence's id needs START again. */
static void seq_request(nereid_server_t *s, uint64_t id, bool start, bool end, const char *wait,
                        const char *started, nereid_cancel_token_t *t, waiter_t *w)
{
    nereid_request_t *req = request(s, "seq", wait, started, false, t);
    nereid_request_set_correlation_id(req, id);
    nereid_request_set_sequence_flags(req, start, end);
    submit(s, req, w);
}

static void test_sequence(nereid_server_t *s)
{
    long long execs = stat_value(s, "seq", 1, "execution_count", NULL);
    waiter_t a, b, c, d;
    seq_request(s, 7, true, false, "release-seq", "started-seq", NULL, &a);
    wait_file("started-seq");
    nereid_cancel_token_t *t = nereid_cancel_token_new();
    seq_request(s, 7, false, false, NULL, NULL, t, &b);
    seq_request(s, 7, false, true, NULL, NULL, NULL, &c);
    nereid_request_cancel(t);
    nereid_cancel_token_free(t);
    write_file("release-seq", "");
    CHECK(outcome_code(&a, NULL, 0) == -1);
    CHECK(outcome_code(&b, NULL, 0) == NEREID_ERROR_CANCELLED);
    CHECK(outcome_code(&c, NULL, 0) == NEREID_ERROR_CANCELLED);
    CHECK(stat_value(s, "seq", 1, "execution_count", NULL) == execs + 1);
    CHECK_MSG(cancel_failures(s, "seq") == 2, "seq: %lld", cancel_failures(s, "seq"));
    /* The slot is free: a new sequence runs. */
    seq_request(s, 8, true, true, NULL, NULL, NULL, &d);
    CHECK(outcome_code(&d, NULL, 0) == -1);
    /* Sequence 7 has ended: a request without START is refused. */
    nereid_request_t *req = request(s, "seq", NULL, NULL, false, NULL);
    nereid_request_set_correlation_id(req, 7);
    nereid_request_set_sequence_flags(req, false, true);
    nereid_error_t *err = nereid_server_infer_async(s, req, NULL, waiter_on_done, &d);
    CHECK(err != NULL);
    if (err) {
        CHECK_STR_CONTAINS(nereid_error_message(err), "must specify the START flag");
        nereid_request_free(req);
    }
    nereid_error_free(err);
}

int main(void)
{
    make_repo_dir("cancel");
    testing_model("slow", "parameters [ { key: \"execute_delay_ms\" value: { string_value: "
                          "\"1\" } } ]\n");
    testing_model("step1", "");
    testing_model("step2", "");
    write_model("dyn", "name: \"dyn\"\nbackend: \"testing\"\nmax_batch_size: 8\n"
                       "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
                       "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
                       "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
                       "dynamic_batching { }\n");
    write_model("seq", "name: \"seq\"\nbackend: \"testing\"\nmax_batch_size: 0\n"
                       "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
                       "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
                       "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
                       "sequence_batching { max_sequence_idle_microseconds: 60000000 }\n");
    write_model("ens", "platform: \"ensemble\"\nmax_batch_size: 0\n"
                       "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
                       "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
                       "ensemble_scheduling { step [\n"
                       "  { model_name: \"step1\" input_map { key: \"INPUT0\" value: \"INPUT0\" }\n"
                       "    output_map { key: \"OUTPUT0\" value: \"MID\" } },\n"
                       "  { model_name: \"step2\" input_map { key: \"INPUT0\" value: \"MID\" }\n"
                       "    output_map { key: \"OUTPUT0\" value: \"OUTPUT0\" } } ] }\n");
    nereid_error_t *err = NULL;
    nereid_server_t *s = start_server(NEREID_MODEL_CONTROL_NONE, NULL, 0, 0, true, &err);
    CHECK(err == NULL && s);
    nereid_error_free(err);
    if (s) {
        test_queued(s, "slow", "default");
        test_queued(s, "dyn", "dyn");
        test_executing(s);
        test_ensemble(s);
        test_before_submit(s);
        test_sequence(s);
        nereid_server_free(s);
    }
    remove_repo();
    return check_summary();
}
