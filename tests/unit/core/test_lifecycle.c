/*
 * This file contains unit tests of model lifetimes (src/core/model.c,
 * "Ownership"): a model whose warmup fails is freed only after its instance
 * threads are gone, at start-up, on explicit loads and on reloads (under
 * ASan a thread reading the freed model fails the test).
 */
#include "check.h"
#include "server_util.h"

#define F2 "data_type: TYPE_FP32 dims: [ 2 ]"
#define IO "input [ { name: \"INPUT0\" " F2 " } ]\noutput [ { name: \"OUTPUT0\" " F2 " } ]\n"

static const char *testing_cfg = "backend: \"testing\" max_batch_size: 8\n" IO;

/* Every execute fails, so the zero_data warmup sample fails the load. */
static const char *warmfail_cfg =
    "backend: \"testing\" max_batch_size: 8\n"
    "parameters { key: \"fail_execute\" value { string_value: \"true\" } }\n"
    "instance_group [ { count: 2 kind: KIND_CPU } ]\n" IO
    "model_warmup [ { name: \"zeros\" batch_size: 1 inputs { key: \"INPUT0\"\n"
    "  value { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } } } ]\n";

/* The same as a config override for the repository load API. */
static const char *warmfail_json =
    "{\"backend\":\"testing\",\"max_batch_size\":8,"
    "\"parameters\":{\"fail_execute\":{\"string_value\":\"true\"}},"
    "\"input\":[{\"name\":\"INPUT0\",\"data_type\":\"TYPE_FP32\",\"dims\":[2]}],"
    "\"output\":[{\"name\":\"OUTPUT0\",\"data_type\":\"TYPE_FP32\",\"dims\":[2]}],"
    "\"model_warmup\":[{\"name\":\"zeros\",\"batch_size\":1,\"inputs\":{\"INPUT0\":"
    "{\"data_type\":\"TYPE_FP32\",\"dims\":[2],\"zero_data\":true}}}]}";

#define WARMUP_TEXT "failed to run warmup sample 'zeros': testing backend: execute failed; "

/* NULL when an inference on model succeeds, else its error message. */
static const char *try_infer(nereid_server_t *s, const char *model)
{
    static const float x[2] = {3, 4};
    static const int64_t shape[2] = {1, 2};
    nereid_request_t *req;
    nereid_request_new(s, model, -1, &req);
    nereid_request_add_input(req, "INPUT0", NEREID_TYPE_FP32, shape, 2, x, 8);
    nereid_error_t *err;
    nereid_response_t *resp = infer_sync(s, req, &err);
    return outcome_text(err, resp);
}

static void check_unavailable(nereid_server_t *s, const char *name)
{
    json_t *row = index_row(s, name, "1");
    CHECK_STR(row_str(row, "state"), "UNAVAILABLE");
    CHECK_STR_CONTAINS(row_str(row, "reason"), WARMUP_TEXT);
    json_decref(row);
}

/* Start-up with exit_on_error off: the failed model is reported, the rest
 * serves. */
static void test_startup(void)
{
    for (int i = 0; i < 4; i++) {
        nereid_error_t *err = NULL;
        nereid_server_t *s = start_server(NEREID_MODEL_CONTROL_NONE, NULL, 0, 0, false, &err);
        CHECK(err == NULL && s);
        if (!s) {
            nereid_error_free(err);
            return;
        }
        check_unavailable(s, "warmfail");
        CHECK(try_infer(s, "good") == NULL);
        nereid_server_free(s);
    }
}

/* Explicit loads of the failing model, and reloads of a serving model with
 * a failing config (the old version keeps serving). */
static void test_explicit(void)
{
    nereid_error_t *err = NULL;
    nereid_server_t *s = start_server(NEREID_MODEL_CONTROL_EXPLICIT, NULL, 0, 0, false, &err);
    CHECK(err == NULL && s);
    if (!s) {
        nereid_error_free(err);
        return;
    }
    for (int i = 0; i < 12; i++) {
        err = nereid_server_load_model(s, "warmfail", NULL, NULL, NULL, NULL, 0);
        CHECK(err != NULL);
        if (err) CHECK_STR_CONTAINS(nereid_error_message(err), WARMUP_TEXT);
        nereid_error_free(err);
        check_unavailable(s, "warmfail");
    }
    CHECK(nereid_server_load_model(s, "good", NULL, NULL, NULL, NULL, 0) == NULL);
    for (int i = 0; i < 12; i++) {
        err = nereid_server_load_model(s, "good", warmfail_json, NULL, NULL, NULL, 0);
        CHECK(err != NULL);
        if (err)
            CHECK_STR_CONTAINS(nereid_error_message(err),
                               "failed to run warmup sample 'zeros': testing backend: "
                               "execute failed; ");
        nereid_error_free(err);
        CHECK(try_infer(s, "good") == NULL);
    }
    nereid_server_free(s);
}

int main(void)
{
    make_repo_dir("lifecycle");
    write_model("good", testing_cfg);
    write_model("warmfail", warmfail_cfg);
    test_startup();
    test_explicit();
    if (!remove_repo()) abort();
    return check_summary();
}
