/*
 * This file contains unit tests of the core through the in-process API:
 * repository scanning, version policies, lifecycle, validation errors with
 * Triton's texts, inference on C backends, statistics, and stopping with
 * requests in flight.
 */
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "test_util.h"

static void make_repo(void)
{
    make_repo_dir("server");
    const char *add_sub = "name: \"add_sub\" backend: \"add_sub\" max_batch_size: 8\n"
                          "input [ { name: \"INPUT0\" data_type: TYPE_INT32 dims: [ 4 ] },\n"
                          "        { name: \"INPUT1\" data_type: TYPE_INT32 dims: [ 4 ] } ]\n"
                          "output [ { name: \"OUTPUT0\" data_type: TYPE_INT32 dims: [ 4 ] },\n"
                          "         { name: \"OUTPUT1\" data_type: TYPE_INT32 dims: [ 4 ] } ]\n";
    write_model("add_sub", add_sub);
    const char *multi = "backend: \"identity\" max_batch_size: 0\n"
                        "version_policy: { latest { num_versions: 2 } }\n"
                        "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 2, 2 ] } ]\n"
                        "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 2, 2 ] } ]\n";
    write_model("multi", multi);
    write_file("multi/2/.keep", "");
    write_file("multi/3/.keep", "");
    write_model("bad_config", "name: \"bad_config\"\nmax_batch_size: oops\n");
    write_model("failing",
                "backend: \"testing\"\n"
                "parameters { key: \"fail_model_init\" value { string_value: \"true\" } }\n"
                "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n"
                "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n");
    write_model("slow", "backend: \"testing\" max_batch_size: 4\n"
                        "parameters { key: \"execute_delay_ms\" value { string_value: \"20\" } }\n"
                        "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n"
                        "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n");
    write_model("reshaped", "backend: \"identity\" max_batch_size: 2\n"
                            "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 4 ]"
                            " reshape: { shape: [ 2, 2 ] } } ]\n"
                            "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 4 ]"
                            " reshape: { shape: [ 2, 2 ] } } ]\n");
    write_model("add_sub_dyn",
                "backend: \"add_sub\" max_batch_size: 8 dynamic_batching { }\n"
                "input [ { name: \"INPUT0\" data_type: TYPE_INT32 dims: [ 4 ] },\n"
                "        { name: \"INPUT1\" data_type: TYPE_INT32 dims: [ 4 ] } ]\n"
                "output [ { name: \"OUTPUT0\" data_type: TYPE_INT32 dims: [ 4 ] },\n"
                "         { name: \"OUTPUT1\" data_type: TYPE_INT32 dims: [ 4 ] } ]\n");
}

/* A server on the repository with the default (none) control mode. */
static nereid_server_t *start(bool exit_on_error, nereid_error_t **err)
{
    return start_server(NEREID_MODEL_CONTROL_NONE, NULL, 0, 0, exit_on_error, err);
}

static void test_add_sub(nereid_server_t *s)
{
    int32_t a[8] = {1, 2, 3, 4, 10, 20, 30, 40}, b[8] = {1, 1, 1, 1, 5, 5, 5, 5};
    int64_t shape[2] = {2, 4};
    nereid_request_t *req;
    CHECK(nereid_request_new(s, "add_sub", 0, &req) == NULL);
    nereid_request_set_id(req, "r1");
    CHECK(nereid_request_add_input(req, "INPUT0", NEREID_TYPE_INT32, shape, 2, a, sizeof a) ==
          NULL);
    CHECK(nereid_request_add_input(req, "INPUT1", NEREID_TYPE_INT32, shape, 2, b, sizeof b) ==
          NULL);
    nereid_error_t *err;
    nereid_response_t *resp = infer_sync(s, req, &err);
    CHECK(err == NULL && resp && !nereid_response_error(resp));
    if (!resp) return;
    CHECK(strcmp(nereid_response_id(resp), "r1") == 0);
    CHECK(nereid_response_model_version(resp) == 1);
    CHECK(nereid_response_output_count(resp) == 2);
    for (size_t i = 0; i < nereid_response_output_count(resp); i++) {
        const char *name;
        const int64_t *oshape;
        size_t rank, size;
        const void *data;
        nereid_datatype_t dt;
        nereid_response_output(resp, i, &name, &dt, &oshape, &rank, &data, &size, NULL);
        CHECK(dt == NEREID_TYPE_INT32 && rank == 2 && oshape[0] == 2 && oshape[1] == 4);
        CHECK(size == sizeof a);
        const int32_t *o = data;
        bool sum = strcmp(name, "OUTPUT0") == 0;
        for (int k = 0; k < 8; k++)
            CHECK(o[k] == (sum ? a[k] + b[k] : a[k] - b[k]));
    }
    nereid_response_free(resp);
}

static nereid_error_t *submit_bad(nereid_server_t *s, const char *model, int64_t version,
                                  const char *in_name, nereid_datatype_t dt, const int64_t *shape,
                                  size_t rank, size_t bytes, const char *out_name)
{
    static int32_t data[64 * 9];
    nereid_request_t *req;
    nereid_request_new(s, model, version, &req);
    nereid_request_add_input(req, in_name, dt, shape, rank, data, bytes);
    if (strcmp(in_name, "INPUT0") == 0)
        nereid_request_add_input(req, "INPUT1", NEREID_TYPE_INT32, shape, rank, data, bytes);
    if (out_name) nereid_request_add_requested_output(req, out_name, 0);
    nereid_error_t *err;
    nereid_response_t *resp = infer_sync(s, req, &err);
    if (resp) nereid_response_free(resp);
    return err;
}

static void test_validation(nereid_server_t *s)
{
    int64_t ok[2] = {1, 4};
    CHECK_ERROR(submit_bad(s, "nope", 0, "INPUT0", NEREID_TYPE_INT32, ok, 2, 16, NULL),
                NEREID_ERROR_NOT_FOUND, "Request for unknown model: 'nope' is not found");
    CHECK_ERROR(submit_bad(s, "add_sub", 7, "INPUT0", NEREID_TYPE_INT32, ok, 2, 16, NULL),
                NEREID_ERROR_NOT_FOUND,
                "Request for unknown model: 'add_sub' version 7 is not found");
    CHECK_ERROR(
        submit_bad(s, "add_sub", 0, "INPUT0", NEREID_TYPE_FP32, ok, 2, 16, NULL),
        NEREID_ERROR_INVALID_ARG,
        "inference input 'INPUT0' data-type is 'FP32', but model 'add_sub' expects 'INT32'");
    CHECK_ERROR(
        submit_bad(s, "add_sub", 0, "INPUT0", NEREID_TYPE_INT32, (int64_t[]){1, 5}, 2, 20, NULL),
        NEREID_ERROR_INVALID_ARG,
        "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,4], got [1,5]");
    CHECK_ERROR(
        submit_bad(s, "add_sub", 0, "INPUT0", NEREID_TYPE_INT32, ok, 2, 12, NULL),
        NEREID_ERROR_INVALID_ARG,
        "input byte size mismatch for input 'INPUT0' for model 'add_sub'. Expected 16, got 12");
    CHECK_ERROR(
        submit_bad(s, "add_sub", 0, "INPUT0", NEREID_TYPE_INT32, (int64_t[]){9, 4}, 2, 144, NULL),
        NEREID_ERROR_INVALID_ARG, "inference request batch-size must be <= 8 for 'add_sub'");
    CHECK_ERROR(submit_bad(s, "add_sub", 0, "INPUTX", NEREID_TYPE_INT32, ok, 2, 16, NULL),
                NEREID_ERROR_INVALID_ARG,
                "unexpected inference input 'INPUTX' for model 'add_sub'");
    CHECK_ERROR(submit_bad(s, "add_sub", 0, "INPUT0", NEREID_TYPE_INT32, ok, 2, 16, "OUTPUT9"),
                NEREID_ERROR_INVALID_ARG,
                "unexpected inference output 'OUTPUT9' for model 'add_sub'");
    /* Missing INPUT1: add only INPUT0 through the non-INPUT0 path. */
    nereid_request_t *req;
    nereid_request_new(s, "add_sub", 0, &req);
    static int32_t d[4];
    nereid_request_add_input(req, "INPUT0", NEREID_TYPE_INT32, ok, 2, d, 16);
    nereid_error_t *err;
    nereid_response_t *resp = infer_sync(s, req, &err);
    CHECK(resp == NULL);
    CHECK_ERROR(err, NEREID_ERROR_INVALID_ARG,
                "expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['INPUT0'], "
                "but missing required input(s) ['INPUT1']");
    /* Triton's poll leaves a model whose config does not parse out of its
     * model table: unknown */
    CHECK_ERROR(submit_bad(s, "bad_config", 0, "INPUT0", NEREID_TYPE_INT32, ok, 2, 16, NULL),
                NEREID_ERROR_NOT_FOUND, "Request for unknown model: 'bad_config' is not found");
}

static void test_versions(nereid_server_t *s)
{
    float data[4] = {1, 2, 3, 4};
    int64_t shape[2] = {2, 2};
    for (int64_t v = 0; v <= 3; v++) {
        nereid_request_t *req;
        nereid_request_new(s, "multi", v, &req);
        nereid_request_add_input(req, "INPUT0", NEREID_TYPE_FP32, shape, 2, data, sizeof data);
        nereid_error_t *err;
        nereid_response_t *resp = infer_sync(s, req, &err);
        if (v == 1) {
            CHECK_ERROR(err, NEREID_ERROR_NOT_FOUND, "'multi' version 1 is not found");
            continue;
        }
        CHECK(err == NULL && resp);
        if (!resp) continue;
        CHECK(nereid_response_model_version(resp) == (v == 0 ? 3 : v));
        const void *out;
        nereid_response_output(resp, 0, NULL, NULL, NULL, NULL, &out, NULL, NULL);
        CHECK(memcmp(out, data, sizeof data) == 0);
        nereid_response_free(resp);
    }
}

/* The backend sees reshape dims; the client gets the config dims back. */
static void test_reshape(nereid_server_t *s)
{
    float data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    nereid_request_t *req;
    nereid_request_new(s, "reshaped", 0, &req);
    nereid_request_add_input(req, "INPUT0", NEREID_TYPE_FP32, (int64_t[]){2, 4}, 2, data,
                             sizeof data);
    nereid_error_t *err;
    nereid_response_t *resp = infer_sync(s, req, &err);
    CHECK(err == NULL && resp && !nereid_response_error(resp));
    if (!resp) return;
    const int64_t *shape;
    size_t rank, size;
    const void *out;
    nereid_response_output(resp, 0, NULL, NULL, &shape, &rank, &out, &size, NULL);
    CHECK(rank == 2 && shape[0] == 2 && shape[1] == 4);
    CHECK(size == sizeof data && memcmp(out, data, sizeof data) == 0);
    nereid_response_free(resp);
}

/* Three requests held until all are queued run as one batch of 3: the core
 * gathers inputs and scatters both outputs back to the right requests. */
static void test_gather_scatter(nereid_server_t *s)
{
    enum { N = 3 };
    static int32_t a[N][4], b[N][4];
    waiter_t w[N];
    for (int r = 0; r < N; r++) {
        for (int k = 0; k < 4; k++) {
            a[r][k] = 100 * r + k;
            b[r][k] = r + 1;
        }
        waiter_init(&w[r]);
        nereid_request_t *req;
        nereid_request_new(s, "add_sub_dyn", 0, &req);
        nereid_request_add_input(req, "INPUT0", NEREID_TYPE_INT32, (int64_t[]){1, 4}, 2, a[r], 16);
        nereid_request_add_input(req, "INPUT1", NEREID_TYPE_INT32, (int64_t[]){1, 4}, 2, b[r], 16);
        CHECK(nereid_server_infer_async(s, req, NULL, waiter_on_done, &w[r]) == NULL);
    }
    for (int r = 0; r < N; r++) {
        waiter_wait(&w[r], 1);
        nereid_response_t *resp = w[r].resp;
        CHECK(resp && !nereid_response_error(resp) && nereid_response_output_count(resp) == 2);
        for (size_t i = 0; resp && i < nereid_response_output_count(resp); i++) {
            const char *name;
            const int64_t *shape;
            size_t rank;
            const void *data;
            nereid_response_output(resp, i, &name, NULL, &shape, &rank, &data, NULL, NULL);
            CHECK(rank == 2 && shape[0] == 1 && shape[1] == 4);
            const int32_t *o = data;
            bool sum = strcmp(name, "OUTPUT0") == 0;
            for (int k = 0; k < 4; k++)
                CHECK(o[k] == (sum ? a[r][k] + b[r][k] : a[r][k] - b[r][k]));
        }
        nereid_response_free(resp);
    }
    char *json;
    CHECK(nereid_server_model_statistics(s, "add_sub_dyn", 0, &json) == NULL);
    CHECK_STR_CONTAINS(json, "\"execution_count\":1");
    CHECK_STR_CONTAINS(json, "\"batch_size\":3");
    free(json);
}

static void test_documents(nereid_server_t *s)
{
    char *json;
    CHECK(nereid_server_repository_index(s, false, &json) == NULL);
    json_t *idx = json_loads(json, 0, NULL);
    free(json);
    size_t i;
    json_t *e;
    int seen = 0;
    json_array_foreach(idx, i, e)
    {
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *state = json_string_value(json_object_get(e, "state"));
        const char *reason = json_string_value(json_object_get(e, "reason"));
        if (strcmp(name, "bad_config") == 0) {
            seen++;
            CHECK(strcmp(state, "UNAVAILABLE") == 0);
            CHECK_STR_CONTAINS(reason, "config.pbtxt:2:");
        } else if (strcmp(name, "failing") == 0) {
            seen++;
            CHECK(strcmp(state, "UNAVAILABLE") == 0);
            CHECK_STR_CONTAINS(reason, "testing backend: model init failed");
        } else if (strcmp(name, "multi") == 0) {
            seen++;
            CHECK(strcmp(state, "READY") == 0);
        }
    }
    CHECK(seen == 4); /* bad_config, failing, multi v2, multi v3 */
    json_decref(idx);

    CHECK(nereid_server_model_metadata(s, "add_sub", 0, &json) == NULL);
    CHECK_STR_CONTAINS(json, "\"name\":\"add_sub\",\"versions\":[\"1\"],\"platform\":\"add_sub\"");
    CHECK_STR_CONTAINS(json, "{\"name\":\"INPUT0\",\"datatype\":\"INT32\",\"shape\":[-1,4]}");
    free(json);
    CHECK(nereid_server_model_config(s, "add_sub", 0, &json) == NULL);
    CHECK_STR_CONTAINS(json, "\"max_batch_size\":8");
    free(json);
    bool ready;
    CHECK(nereid_server_model_is_ready(s, "multi", 2, &ready) == NULL && ready);
    CHECK(nereid_server_model_is_ready(s, "failing", 1, &ready) == NULL && !ready);
    CHECK(!nereid_server_is_ready(s)); /* failing is not ready (bad_config is not counted) */
    CHECK(nereid_server_is_live(s));
}

static void test_stats(nereid_server_t *s)
{
    char *json;
    CHECK(nereid_server_model_statistics(s, "add_sub", 0, &json) == NULL);
    json_t *doc = json_loads(json, 0, NULL);
    free(json);
    json_t *st = json_array_get(json_object_get(doc, "model_stats"), 0);
    /* test_add_sub ran one batch-2 request successfully. */
    CHECK(json_integer_value(json_object_get(st, "inference_count")) == 2);
    CHECK(json_integer_value(json_object_get(st, "execution_count")) == 1);
    json_t *inf = json_object_get(st, "inference_stats");
    CHECK(json_integer_value(json_object_get(json_object_get(inf, "success"), "count")) == 1);
    json_t *bs = json_array_get(json_object_get(st, "batch_stats"), 0);
    CHECK(json_integer_value(json_object_get(bs, "batch_size")) == 2);
    /* One request, one response: response_stats "0" counts it once. */
    json_t *r0 = json_object_get(json_object_get(st, "response_stats"), "0");
    CHECK(json_integer_value(json_object_get(json_object_get(r0, "success"), "count")) == 1);
    CHECK(json_integer_value(json_object_get(json_object_get(r0, "fail"), "count")) == 0);
    CHECK(json_integer_value(json_object_get(json_object_get(r0, "compute_infer"), "count")) == 1);
    json_decref(doc);
    nereid_error_t *err = nereid_server_model_statistics(s, "nope", 0, &json);
    CHECK_ERROR(err, NEREID_ERROR_INVALID_ARG, "requested model 'nope' is not available");
    char *text;
    CHECK(nereid_server_metrics(s, &text) == NULL);
    CHECK_STR_CONTAINS(text, "nv_inference_count{model=\"add_sub\",version=\"1\"} 2\n");
    CHECK_STR_CONTAINS(
        text, "nv_inference_request_failure{model=\"add_sub\",reason=\"BACKEND\",version=\"1\"} 0");
    free(text);
}

/* Requests queued behind a slow model all complete when the server stops. */
static void test_stop_in_flight(nereid_server_t *s)
{
    enum { N = 6 };
    waiter_t w;
    waiter_init(&w);
    static float in[N];
    for (int i = 0; i < N; i++) {
        nereid_request_t *req;
        nereid_request_new(s, "slow", 0, &req);
        nereid_request_add_input(req, "INPUT0", NEREID_TYPE_FP32, (int64_t[]){1, 1}, 2, &in[i], 4);
        nereid_error_t *err = nereid_server_infer_async(s, req, NULL, waiter_on_done, &w);
        CHECK(err == NULL);
    }
    nereid_server_free(s);
    CHECK(w.done == N);
    nereid_response_free(w.resp);
}

int main(void)
{
    make_repo();
    nereid_error_t *err;
    nereid_server_t *s = start(true, &err);
    CHECK(s == NULL && err != NULL);
    if (err) {
        CHECK_STR_CONTAINS(nereid_error_message(err), "failed to load");
        nereid_error_free(err);
    }
    setenv("NEREID_DELAY_SCHEDULER", "3", 1); /* only add_sub_dyn batches dynamically */
    s = start(false, &err);
    unsetenv("NEREID_DELAY_SCHEDULER");
    CHECK(s != NULL && err == NULL);
    if (!s) return check_summary();
    test_add_sub(s);
    test_validation(s);
    test_versions(s);
    test_reshape(s);
    test_gather_scatter(s);
    test_documents(s);
    test_stats(s);
    test_stop_in_flight(s);
    remove_repo();
    return check_summary();
}
