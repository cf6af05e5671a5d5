/*
 * This file contains unit tests of the ensemble scheduler through the
 * in-process API: results of a two-step chain, parallel branches taking about
 * one branch's time, step error propagation, statistics of the ensemble and
 * its composing models, load-time validation errors, and a client allocator
 * receiving the ensemble outputs.
 */
#include "check.h"
#include "server_util.h"

#define INT4 "data_type: TYPE_INT32 dims: [ 4 ]"

static void make_models(void)
{
    make_repo_dir("ensemble");
    write_model("add_sub",
                "backend: \"add_sub\" max_batch_size: 8\n"
                "input [ { name: \"INPUT0\" " INT4 " }, { name: \"INPUT1\" " INT4 " } ]\n"
                "output [ { name: \"OUTPUT0\" " INT4 " }, { name: \"OUTPUT1\" " INT4 " } ]\n");
    /* OUT_SUM = (a+b)+(a-b) = 2a, OUT_DIFF = (a+b)-(a-b) = 2b */
    write_model("chain",
                "platform: \"ensemble\" max_batch_size: 8\n"
                "input [ { name: \"A\" " INT4 " }, { name: \"B\" " INT4 " } ]\n"
                "output [ { name: \"OUT_SUM\" " INT4 " }, { name: \"OUT_DIFF\" " INT4 " } ]\n"
                "ensemble_scheduling { step [\n"
                "  { model_name: \"add_sub\" model_version: -1\n"
                "    input_map { key: \"INPUT0\" value: \"A\" } input_map { key: \"INPUT1\" value: "
                "\"B\" }\n"
                "    output_map { key: \"OUTPUT0\" value: \"S\" } output_map { key: \"OUTPUT1\" "
                "value: \"D\" } },\n"
                "  { model_name: \"add_sub\" model_version: -1\n"
                "    input_map { key: \"INPUT0\" value: \"S\" } input_map { key: \"INPUT1\" value: "
                "\"D\" }\n"
                "    output_map { key: \"OUTPUT0\" value: \"OUT_SUM\" } output_map { key: "
                "\"OUTPUT1\" value: \"OUT_DIFF\" } } ] }\n");
    const char *slow = "backend: \"testing\" max_batch_size: 8\n"
                       "parameters { key: \"execute_delay_ms\" value { string_value: \"300\" } }\n"
                       "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n"
                       "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n";
    write_model("slow_a", slow);
    write_model("slow_b", slow);
    write_model("fails", "backend: \"testing\" max_batch_size: 8\n"
                         "parameters { key: \"fail_execute\" value { string_value: \"true\" } }\n"
                         "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n"
                         "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n");
    const char *par = "platform: \"ensemble\" max_batch_size: 8\n"
                      "input [ { name: \"X\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n"
                      "output [ { name: \"P\" data_type: TYPE_FP32 dims: [ 2 ] },\n"
                      "         { name: \"Q\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n"
                      "ensemble_scheduling { step [\n"
                      "  { model_name: \"slow_a\" input_map { key: \"INPUT0\" value: \"X\" }\n"
                      "    output_map { key: \"OUTPUT0\" value: \"P\" } },\n"
                      "  { model_name: \"%s\" input_map { key: \"INPUT0\" value: \"X\" }\n"
                      "    output_map { key: \"OUTPUT0\" value: \"Q\" } } ] }\n";
    char buf[2048];
    snprintf(buf, sizeof buf, par, "slow_b");
    write_model("parallel", buf);
    snprintf(buf, sizeof buf, par, "fails");
    write_model("broken_step", buf);
    /* A dynamically batched step batches across ensemble requests. */
    write_model("batched", "backend: \"testing\" max_batch_size: 8\n"
                           "dynamic_batching { max_queue_delay_microseconds: 200000 }\n"
                           "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n"
                           "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n");
    write_model("via_batched", "platform: \"ensemble\" max_batch_size: 8\n"
                               "input [ { name: \"X\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n"
                               "output [ { name: \"P\" data_type: TYPE_FP32 dims: [ 2 ] } ]\n"
                               "ensemble_scheduling { step [ { model_name: \"batched\"\n"
                               "  input_map { key: \"INPUT0\" value: \"X\" }\n"
                               "  output_map { key: \"OUTPUT0\" value: \"P\" } } ] }\n");
    /* Load-time validation failures. */
    write_model("bad_type",
                "platform: \"ensemble\" max_batch_size: 8\n"
                "input [ { name: \"X\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n"
                "output [ { name: \"Y\" " INT4 " } ]\n"
                "ensemble_scheduling { step [ { model_name: \"add_sub\"\n"
                "  input_map { key: \"INPUT0\" value: \"X\" } input_map { key: \"INPUT1\" value: "
                "\"X\" }\n"
                "  output_map { key: \"OUTPUT0\" value: \"Y\" } } ] }\n");
    write_model("bad_shape",
                "platform: \"ensemble\" max_batch_size: 8\n"
                "input [ { name: \"X\" data_type: TYPE_INT32 dims: [ 3 ] } ]\n"
                "output [ { name: \"Y\" " INT4 " } ]\n"
                "ensemble_scheduling { step [ { model_name: \"add_sub\"\n"
                "  input_map { key: \"INPUT0\" value: \"X\" } input_map { key: \"INPUT1\" value: "
                "\"X\" }\n"
                "  output_map { key: \"OUTPUT0\" value: \"Y\" } } ] }\n");
    write_model("missing_step", "platform: \"ensemble\" max_batch_size: 8\n"
                                "input [ { name: \"X\" " INT4 " } ]\n"
                                "output [ { name: \"Y\" " INT4 " } ]\n"
                                "ensemble_scheduling { step [ { model_name: \"no_such_model\"\n"
                                "  input_map { key: \"INPUT0\" value: \"X\" }\n"
                                "  output_map { key: \"OUTPUT0\" value: \"Y\" } } ] }\n");
    /* Triton compares a step's dims without the batch dimension (or as full
     * shapes), -1 matching anything: a non-batching ensemble over a batching
     * step, and a batching one over a non-batching step, load. */
    write_model("nop", "backend: \"identity\" max_batch_size: 8\n"
                       "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
                       "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] "
                       "label_filename: \"labels.txt\" } ]\n");
    write_file("nop/labels.txt", "zero\none\ntwo\nthree\n");
    write_model("nop4", "backend: \"identity\" max_batch_size: 4\n"
                        "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
                        "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n");
    write_model("nop_nobatch",
                "backend: \"identity\" max_batch_size: 0\n"
                "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n"
                "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n");
    const char *one = "platform: \"ensemble\" max_batch_size: %d\n"
                      "input [ { name: \"IN\" data_type: TYPE_FP32 dims: [ %s ] } ]\n"
                      "output [ { name: \"OUT\" data_type: TYPE_FP32 dims: [ %s ] %s } ]\n"
                      "ensemble_scheduling { step [ { model_name: \"%s\"\n"
                      "  input_map { key: \"INPUT0\" value: \"IN\" }\n"
                      "  output_map { key: \"OUTPUT0\" value: \"OUT\" } } ] }\n";
    snprintf(buf, sizeof buf, one, 0, "16", "16", "", "nop");
    write_model("nobatch_over_batch", buf);
    snprintf(buf, sizeof buf, one, 4, "4", "4", "", "nop_nobatch");
    write_model("batch_over_nobatch", buf);
    snprintf(buf, sizeof buf, one, 4, "4", "2, 2", "reshape { shape: [ 4 ] }", "nop");
    write_model("reshaped_out", buf);
    snprintf(buf, sizeof buf, one, 8, "4", "4", "", "nop4");
    write_model("too_big_batch", buf);
    snprintf(buf, sizeof buf, one, 0, "4", "5", "", "nop_nobatch");
    write_model("nobatch_mismatch", buf);
    /* A step asking for a version that is not loaded. */
    write_model("needs_v2",
                "platform: \"ensemble\" max_batch_size: 8\n"
                "input [ { name: \"X\" " INT4 " } ]\n"
                "output [ { name: \"Y\" " INT4 " } ]\n"
                "ensemble_scheduling { step [ { model_name: \"add_sub\" model_version: 2\n"
                "  input_map { key: \"INPUT0\" value: \"X\" } input_map { key: \"INPUT1\" value: "
                "\"X\" }\n"
                "  output_map { key: \"OUTPUT0\" value: \"Y\" } } ] }\n");
    /* An ensemble whose step is an ensemble loaded after it by name. */
    const char *nest = "platform: \"ensemble\" max_batch_size: 8\n"
                       "input [ { name: \"X\" " INT4 " } ]\n"
                       "output [ { name: \"Y\" " INT4 " } ]\n"
                       "ensemble_scheduling { step [ { model_name: \"%s\"\n"
                       "  input_map [ %s ]\n"
                       "  output_map { key: \"%s\" value: \"Y\" } } ] }\n";
    snprintf(buf, sizeof buf, nest, "z_inner", "{ key: \"X\" value: \"X\" }", "Y");
    write_model("a_outer", buf);
    snprintf(buf, sizeof buf, nest, "add_sub",
             "{ key: \"INPUT0\" value: \"X\" }, { key: \"INPUT1\" value: \"X\" }", "OUTPUT0");
    write_model("z_inner", buf);
    /* A step whose backend library does not exist. */
    write_model("no_lib", "backend: \"nosuch\" max_batch_size: 8\n"
                          "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n"
                          "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n");
    snprintf(buf, sizeof buf, one, 8, "4", "4", "", "no_lib");
    write_model("over_no_lib", buf);
    /* Two ensembles using each other. */
    const char *cyc = "platform: \"ensemble\" max_batch_size: 8\n"
                      "input [ { name: \"X\" " INT4 " } ]\n"
                      "output [ { name: \"Y\" " INT4 " } ]\n"
                      "ensemble_scheduling { step [ { model_name: \"%s\"\n"
                      "  input_map { key: \"X\" value: \"X\" }\n"
                      "  output_map { key: \"Y\" value: \"Y\" } } ] }\n";
    snprintf(buf, sizeof buf, cyc, "cycle_b");
    write_model("cycle_a", buf);
    snprintf(buf, sizeof buf, cyc, "cycle_a");
    write_model("cycle_b", buf);
}

static nereid_request_t *chain_request(nereid_server_t *s, const int32_t *a, const int32_t *b)
{
    static const int64_t shape[2] = {1, 4};
    nereid_request_t *req;
    CHECK(nereid_request_new(s, "chain", 0, &req) == NULL);
    nereid_request_add_input(req, "A", NEREID_TYPE_INT32, shape, 2, a, 16);
    nereid_request_add_input(req, "B", NEREID_TYPE_INT32, shape, 2, b, 16);
    return req;
}

static void test_chain(nereid_server_t *s)
{
    int32_t a[4] = {1, 2, 3, 4}, b[4] = {10, 20, 30, 40};
    nereid_error_t *err;
    nereid_response_t *resp = infer_sync(s, chain_request(s, a, b), &err);
    CHECK(err == NULL && resp && !nereid_response_error(resp));
    if (!resp) return;
    CHECK(strcmp(nereid_response_model_name(resp), "chain") == 0);
    CHECK(nereid_response_output_count(resp) == 2);
    for (size_t i = 0; i < nereid_response_output_count(resp); i++) {
        const char *name;
        nereid_datatype_t dt;
        const int64_t *shape;
        size_t rank, size;
        const void *data;
        nereid_response_output(resp, i, &name, &dt, &shape, &rank, &data, &size, NULL);
        CHECK(dt == NEREID_TYPE_INT32 && rank == 2 && shape[0] == 1 && shape[1] == 4 && size == 16);
        const int32_t *v = data;
        const int32_t *src = strcmp(name, "OUT_SUM") == 0 ? a : b;
        CHECK(strcmp(name, i == 0 ? "OUT_SUM" : "OUT_DIFF") == 0);
        for (int k = 0; k < 4; k++)
            CHECK(v[k] == 2 * src[k]);
    }
    nereid_response_free(resp);
}

/* A client allocator counting its allocations. */
typedef struct counting_alloc {
    int allocs, releases;
} counting_alloc_t;

static nereid_error_t *count_alloc(void *userp, const char *name, nereid_datatype_t dt,
                                   const int64_t *shape, size_t rank, size_t size, void **buffer,
                                   void **buffer_userp)
{
    (void)name, (void)dt, (void)shape, (void)rank;
    counting_alloc_t *c = userp;
    __atomic_fetch_add(&c->allocs, 1, __ATOMIC_SEQ_CST);
    *buffer = malloc(size ? size : 1);
    *buffer_userp = c;
    return NULL;
}

static void count_release(void *userp, void *buffer, void *buffer_userp, size_t size)
{
    (void)size, (void)buffer_userp;
    counting_alloc_t *c = userp;
    __atomic_fetch_add(&c->releases, 1, __ATOMIC_SEQ_CST);
    free(buffer);
}

static void test_client_allocator(nereid_server_t *s)
{
    int32_t a[4] = {5, 6, 7, 8}, b[4] = {1, 1, 1, 1};
    nereid_request_t *req = chain_request(s, a, b);
    nereid_request_add_requested_output(req, "OUT_DIFF", 0);
    counting_alloc_t c = {0, 0};
    nereid_response_allocator_t alloc = {
        .alloc_fn = count_alloc, .release_fn = count_release, .userp = &c};
    waiter_t w;
    waiter_init(&w);
    nereid_error_t *err = nereid_server_infer_async(s, req, &alloc, waiter_on_done, &w);
    CHECK(err == NULL);
    if (err) {
        nereid_error_free(err);
        nereid_request_free(req);
        return;
    }
    waiter_wait(&w, 1);
    CHECK(w.resp && !nereid_response_error(w.resp));
    CHECK(nereid_response_output_count(w.resp) == 1);
    const char *name;
    const void *data;
    void *buffer_userp;
    nereid_response_output(w.resp, 0, &name, NULL, NULL, NULL, &data, NULL, &buffer_userp);
    CHECK(strcmp(name, "OUT_DIFF") == 0 && ((const int32_t *)data)[0] == 2);
    /* The step wrote the ensemble output straight into the client's buffer. */
    CHECK(buffer_userp == &c);
    CHECK(c.allocs == 1);
    nereid_response_free(w.resp);
    CHECK(c.releases == 1);
}

static nereid_request_t *x_request(nereid_server_t *s, const char *model, const float *x)
{
    static const int64_t shape[2] = {1, 2};
    nereid_request_t *req;
    CHECK(nereid_request_new(s, model, 0, &req) == NULL);
    nereid_request_add_input(req, "X", NEREID_TYPE_FP32, shape, 2, x, 8);
    return req;
}

static void test_parallel(nereid_server_t *s)
{
    float x[2] = {1.5f, -2.5f};
    double t0 = now_ms();
    nereid_error_t *err;
    nereid_response_t *resp = infer_sync(s, x_request(s, "parallel", x), &err);
    double elapsed = now_ms() - t0;
    CHECK(err == NULL && resp && !nereid_response_error(resp));
    if (!resp) return;
    CHECK(nereid_response_output_count(resp) == 2);
    for (size_t i = 0; i < nereid_response_output_count(resp); i++) {
        const void *data;
        nereid_response_output(resp, i, NULL, NULL, NULL, NULL, &data, NULL, NULL);
        CHECK(((const float *)data)[0] == 1.5f && ((const float *)data)[1] == -2.5f);
    }
    nereid_response_free(resp);
    /* Two 300 ms branches: sequential would take >= 600 ms. */
    printf("parallel ensemble (2 x 300 ms branches): %.0f ms\n", elapsed);
    CHECK(elapsed >= 290 && elapsed < 550);
}

static void test_step_error(nereid_server_t *s)
{
    float x[2] = {1, 2};
    nereid_error_t *err;
    nereid_response_t *resp = infer_sync(s, x_request(s, "broken_step", x), &err);
    CHECK(err == NULL && resp);
    if (!resp) return;
    const nereid_error_t *rerr = nereid_response_error(resp);
    CHECK(rerr != NULL);
    if (rerr) {
        CHECK_STR(nereid_error_message(rerr),
                  "in ensemble 'broken_step', testing backend: execute failed");
        CHECK(nereid_error_code(rerr) == NEREID_ERROR_INTERNAL);
    }
    CHECK(nereid_response_output_count(resp) == 0);
    nereid_response_free(resp);
    /* Triton counts a failed ensemble request twice (its error response,
     * then the end of its request tracker). */
    CHECK(stat_value(s, "broken_step", 1, "inference_stats", "fail") == 2);
    CHECK(stat_value(s, "broken_step", 1, "inference_stats", "success") == 0);
}

static void test_stats(nereid_server_t *s)
{
    long long before = stat_value(s, "add_sub", 1, "execution_count", NULL);
    long long ens_before = stat_value(s, "chain", 1, "inference_count", NULL);
    int32_t a[4] = {1, 1, 1, 1}, b[4] = {2, 2, 2, 2};
    for (int i = 0; i < 3; i++) {
        nereid_error_t *err;
        nereid_response_t *resp = infer_sync(s, chain_request(s, a, b), &err);
        CHECK(resp && !nereid_response_error(resp));
        nereid_response_free(resp);
    }
    CHECK(stat_value(s, "add_sub", 1, "execution_count", NULL) == before + 6);
    CHECK(stat_value(s, "chain", 1, "inference_count", NULL) == ens_before + 3);
    CHECK(stat_value(s, "chain", 1, "execution_count", NULL) == ens_before + 3);
    long long success = stat_value(s, "chain", 1, "inference_stats", "success");
    CHECK(success == ens_before + 3);
    CHECK(stat_value(s, "chain", 1, "inference_stats", "queue") == success);
    CHECK(stat_value(s, "chain", 1, "inference_stats", "compute_infer") == success);
}

/* Model name's version 1 is unavailable with a reason containing text. */
static void check_reason(nereid_server_t *s, const char *name, const char *text)
{
    json_t *row = index_row(s, name, "1");
    CHECK(strcmp(row_str(row, "state"), "UNAVAILABLE") == 0);
    CHECK_STR_CONTAINS(row_str(row, "reason"), text);
    json_decref(row);
}

static void test_validation(nereid_server_t *s)
{
    check_reason(s, "bad_type",
                 "in ensemble bad_type, ensemble tensor X: inconsistent data type: TYPE_FP32 is "
                 "inferred from model bad_type while TYPE_INT32 is inferred from model add_sub");
    check_reason(s, "bad_shape",
                 "in ensemble bad_shape, ensemble tensor X: inconsistent shape: [-1,3] is "
                 "inferred from model bad_shape while [-1,4] is inferred from model add_sub");
    check_reason(s, "too_big_batch",
                 "ensemble too_big_batch allows maximum batch size 8, but it contains model nop4 "
                 "which only allows maximum batch size to be 4");
    check_reason(s, "nobatch_mismatch",
                 "in ensemble nobatch_mismatch, ensemble tensor OUT: inconsistent shape: [5] is "
                 "inferred from model nobatch_mismatch while [4] is inferred from model "
                 "nop_nobatch");
    json_t *row = index_row(s, "needs_v2", NULL);
    CHECK_STR_CONTAINS(row_str(row, "reason"),
                       "ensemble 'needs_v2' depends on 'add_sub' whose required version 2 is not "
                       "loaded.");
    json_decref(row);
    row = index_row(s, "missing_step", NULL);
    CHECK(strcmp(row_str(row, "state"), "UNAVAILABLE") == 0);
    CHECK_STR_CONTAINS(row_str(row, "reason"),
                       "ensemble missing_step contains models that are not available or "
                       "ambiguous: no_such_model");
    json_decref(row);
    row = index_row(s, "cycle_a", NULL);
    CHECK(strcmp(row_str(row, "state"), "UNAVAILABLE") == 0);
    CHECK_STR_CONTAINS(row_str(row, "reason"),
                       "circular dependency between ensembles: cycle_a -> ... -> cycle_b -> "
                       "cycle_a");
    json_decref(row);
    row = index_row(s, "over_no_lib", NULL);
    CHECK_STR_CONTAINS(row_str(row, "reason"),
                       "ensemble 'over_no_lib' depends on 'no_lib' which has no loaded version. "
                       "Model 'no_lib' loading failed with error: Invalid argument: unable to find "
                       "backend library for backend 'nosuch', try specifying runtime on the model "
                       "configuration.");
    json_decref(row);
    /* The inner ensemble is loaded first, as the outer one's step. */
    row = index_row(s, "a_outer", "1");
    CHECK(strcmp(row_str(row, "state"), "READY") == 0);
    json_decref(row);
    row = index_row(s, "z_inner", "1");
    CHECK(strcmp(row_str(row, "state"), "READY") == 0);
    json_decref(row);
    bool ready = true;
    nereid_error_free(nereid_server_model_is_ready(s, "bad_type", 1, &ready));
    CHECK(!ready);
}

/* One FP32 input IN of the given shape (values 0..n-1) through model; checks
 * the output OUT's shape and values. */
static void check_passthrough(nereid_server_t *s, const char *model, const int64_t *shape,
                              size_t rank, const int64_t *want, size_t want_rank)
{
    float x[16];
    size_t n = 1;
    for (size_t d = 0; d < rank; d++)
        n *= (size_t)shape[d];
    for (size_t i = 0; i < n; i++)
        x[i] = (float)i;
    nereid_request_t *req;
    CHECK(nereid_request_new(s, model, 0, &req) == NULL);
    nereid_request_add_input(req, "IN", NEREID_TYPE_FP32, shape, rank, x, n * sizeof(float));
    nereid_error_t *err;
    nereid_response_t *resp = infer_sync(s, req, &err);
    CHECK(err == NULL && resp);
    if (!resp) return;
    if (nereid_response_error(resp))
        fprintf(stderr, "%s: %s\n", model, nereid_error_message(nereid_response_error(resp)));
    CHECK(!nereid_response_error(resp) && nereid_response_output_count(resp) == 1);
    if (nereid_response_output_count(resp) == 1) {
        const int64_t *oshape;
        size_t orank, size;
        const void *data;
        nereid_response_output(resp, 0, NULL, NULL, &oshape, &orank, &data, &size, NULL);
        CHECK(orank == want_rank && size == n * sizeof(float));
        for (size_t d = 0; d < orank && d < want_rank; d++)
            CHECK(oshape[d] == want[d]);
        CHECK(memcmp(data, x, size) == 0);
    }
    nereid_response_free(resp);
}

static void test_batch_conversion(nereid_server_t *s)
{
    /* [16] reaches the batching step as [1,16] and comes back as [16]. */
    check_passthrough(s, "nobatch_over_batch", (int64_t[]){16}, 1, (int64_t[]){16}, 1);
    /* [1,4] reaches the non-batching step as [4] and comes back as [1,4]. */
    check_passthrough(s, "batch_over_nobatch", (int64_t[]){1, 4}, 2, (int64_t[]){1, 4}, 2);
    /* An output with reshape [4] is returned with its dims [2,2]. */
    check_passthrough(s, "reshaped_out", (int64_t[]){1, 4}, 2, (int64_t[]){1, 2, 2}, 3);
}

/* The ensemble's batch_stats: one execution per request of its batch size,
 * batch size 1 for a non-batching ensemble. */
static void test_batch_stats(nereid_server_t *s)
{
    for (int i = 0; i < 3; i++)
        check_passthrough(s, "nobatch_over_batch", (int64_t[]){16}, 1, (int64_t[]){16}, 1);
    json_t *st = model_stats_json(s, "nobatch_over_batch", 1);
    json_t *bs = json_object_get(st, "batch_stats");
    CHECK(json_array_size(bs) == 1);
    json_t *b0 = json_array_get(bs, 0);
    CHECK(json_integer_value(json_object_get(b0, "batch_size")) == 1);
    CHECK(json_integer_value(json_object_get(json_object_get(b0, "compute_infer"), "count")) == 4);
    json_decref(st);
}

/* Classification of an ensemble output without labels uses the labels of
 * the composing model's output that writes it. */
static void test_labels(nereid_server_t *s)
{
    float x[4] = {0, 3, 1, 2};
    nereid_request_t *req;
    CHECK(nereid_request_new(s, "reshaped_out", 0, &req) == NULL);
    nereid_request_add_input(req, "IN", NEREID_TYPE_FP32, (int64_t[]){1, 4}, 2, x, sizeof x);
    nereid_error_t *err;
    nereid_response_t *resp = infer_sync(s, req, &err);
    CHECK(resp && !nereid_response_error(resp));
    if (!resp) return;
    char *bytes = NULL;
    size_t size = 0, rank = 0;
    int64_t shape[8];
    CHECK(nereid_response_classify(resp, 0, 1, &bytes, &size, shape, &rank) == NULL);
    /* one BYTES element: 4-byte length, then "3.000000:1:one" */
    CHECK(size == 4 + strlen("3.000000:1:one") && memcmp(bytes + 4, "3.000000:1:one", 14) == 0);
    free(bytes);
    nereid_response_free(resp);
}

static void test_concurrent(nereid_server_t *s)
{
    enum { N = 32 };
    static int32_t a[N][4], b[N][4];
    waiter_t w;
    waiter_init(&w);
    int submitted = 0;
    for (int i = 0; i < N; i++) {
        for (int k = 0; k < 4; k++) {
            a[i][k] = i + k;
            b[i][k] = i - k;
        }
        if (nereid_server_infer_async(s, chain_request(s, a[i], b[i]), NULL, waiter_on_done, &w) ==
            NULL)
            submitted++;
    }
    CHECK(submitted == N);
    waiter_wait(&w, submitted);
    CHECK(w.resp && !nereid_response_error(w.resp));
    nereid_response_free(w.resp);
}

static void test_batched_step(nereid_server_t *s)
{
    enum { N = 4 };
    static float x[N][2];
    waiter_t w;
    waiter_init(&w);
    int submitted = 0;
    for (int i = 0; i < N; i++) {
        x[i][0] = (float)i;
        if (nereid_server_infer_async(s, x_request(s, "via_batched", x[i]), NULL, waiter_on_done,
                                      &w) == NULL)
            submitted++;
    }
    CHECK(submitted == N);
    waiter_wait(&w, submitted);
    CHECK(w.resp && !nereid_response_error(w.resp));
    nereid_response_free(w.resp);
    CHECK(stat_value(s, "via_batched", 1, "inference_count", NULL) == N);
    long long execs = stat_value(s, "batched", 1, "execution_count", NULL);
    printf("4 ensemble requests -> %lld executions of the dynamically batched step\n", execs);
    CHECK(execs >= 1 && execs < N);
    CHECK(stat_value(s, "batched", 1, "inference_count", NULL) == N);
}

int main(void)
{
    make_models();
    nereid_error_t *err;
    nereid_server_t *s = start_server(NEREID_MODEL_CONTROL_NONE, NULL, 0, 0, false, &err);
    CHECK(err == NULL && s != NULL);
    if (err) {
        fprintf(stderr, "%s\n", nereid_error_message(err));
        return 1;
    }
    test_chain(s);
    test_client_allocator(s);
    test_parallel(s);
    test_step_error(s);
    test_stats(s);
    test_validation(s);
    test_concurrent(s);
    test_batched_step(s);
    test_batch_conversion(s);
    test_batch_stats(s);
    test_labels(s);
    nereid_server_free(s);
    if (!remove_repo()) abort();
    return check_summary();
}
