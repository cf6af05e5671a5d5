/*
 * This file contains the tests of the in-tree C backends on input buffers
 * with no alignment (a client's tensor bytes sit anywhere in an HTTP body or
 * a protobuf message, and a batch of one hands them to the backend as they
 * are): add_sub and accumulator must read them element by element with
 * memcpy. The ASan+UBSan build (make test-asan) fails on a misaligned load.
 */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "test_util.h"

static nereid_server_t *server;

/* add_sub INT32 [4] and FP64 [2]: inputs at odd addresses. */
static void test_add_sub(void)
{
    _Alignas(8) uint8_t buf[2][1 + 16];
    int32_t a[4] = {1, 2, 3, 4}, b[4] = {10, 20, 30, 40};
    memcpy(buf[0] + 1, a, 16);
    memcpy(buf[1] + 1, b, 16);
    tensor_t in[2] = {{"INPUT0", NEREID_TYPE_INT32, {4}, 1, buf[0] + 1, 16},
                      {"INPUT1", NEREID_TYPE_INT32, {4}, 1, buf[1] + 1, 16}};
    nereid_request_t *req;
    nereid_error_t *err = request_with_inputs(server, "add_sub_i32", in, 2, &req);
    nereid_response_t *resp = err ? NULL : infer_sync(server, req, &err);
    CHECK_MSG(!err && resp && !nereid_response_error(resp), "add_sub_i32: %s",
              err ? nereid_error_message(err) : "");
    const void *sum = NULL, *diff = NULL;
    size_t n0 = 0, n1 = 0;
    find_output(resp, "OUTPUT0", NULL, NULL, NULL, &sum, &n0);
    find_output(resp, "OUTPUT1", NULL, NULL, NULL, &diff, &n1);
    CHECK(n0 == 16 && n1 == 16);
    if (n0 == 16 && n1 == 16) {
        int32_t s[4], d[4];
        memcpy(s, sum, 16);
        memcpy(d, diff, 16);
        for (int i = 0; i < 4; i++)
            CHECK_MSG(s[i] == a[i] + b[i] && d[i] == a[i] - b[i], "element %d", i);
    }
    nereid_response_free(resp);
    nereid_error_free(err);
}

/* accumulator (direct): a two-request sequence whose INPUT is misaligned. */
static void test_accumulator(void)
{
    int32_t values[2] = {5, 7}, want[2] = {5, 12};
    for (int step = 0; step < 2; step++) {
        _Alignas(8) uint8_t buf[1 + 4];
        memcpy(buf + 1, &values[step], 4);
        tensor_t in = {"INPUT", NEREID_TYPE_INT32, {1, 1}, 2, buf + 1, 4};
        nereid_request_t *req;
        nereid_error_t *err = request_with_inputs(server, "acc", &in, 1, &req);
        if (!err) {
            nereid_request_set_correlation_id(req, 42);
            nereid_request_set_sequence_flags(req, step == 0, step == 1);
        }
        nereid_response_t *resp = err ? NULL : infer_sync(server, req, &err);
        CHECK_MSG(!err && resp && !nereid_response_error(resp), "acc step %d: %s", step,
                  err ? nereid_error_message(err) : "");
        const void *out = NULL;
        size_t n = 0;
        find_output(resp, "OUTPUT", NULL, NULL, NULL, &out, &n);
        int32_t got = 0;
        if (n == 4) memcpy(&got, out, 4);
        CHECK_MSG(n == 4 && got == want[step], "acc step %d: %d, want %d", step, (int)got,
                  (int)want[step]);
        nereid_response_free(resp);
        nereid_error_free(err);
    }
}

int main(void)
{
    make_repo_dir("unaligned");
    write_model("add_sub_i32",
                "backend: \"add_sub\" max_batch_size: 0\n"
                "input [ { name: \"INPUT0\" data_type: TYPE_INT32 dims: [ 4 ] },\n"
                "        { name: \"INPUT1\" data_type: TYPE_INT32 dims: [ 4 ] } ]\n"
                "output [ { name: \"OUTPUT0\" data_type: TYPE_INT32 dims: [ 4 ] },\n"
                "         { name: \"OUTPUT1\" data_type: TYPE_INT32 dims: [ 4 ] } ]\n");
    write_model("acc", "backend: \"accumulator\" max_batch_size: 4\n"
                       "input [ { name: \"INPUT\" data_type: TYPE_INT32 dims: [ 1 ] } ]\n"
                       "output [ { name: \"OUTPUT\" data_type: TYPE_INT32 dims: [ 1 ] } ]\n"
                       "sequence_batching { direct { } control_input [\n"
                       "  { name: \"START\" control [ { kind: CONTROL_SEQUENCE_START "
                       "int32_false_true: [ 0, 1 ] } ] } ] }\n");
    nereid_error_t *err = NULL;
    server = start_server(NEREID_MODEL_CONTROL_NONE, NULL, 0, 0, true, &err);
    CHECK_MSG(server != NULL, "server: %s", err ? nereid_error_message(err) : "");
    nereid_error_free(err);
    if (server) {
        test_add_sub();
        test_accumulator();
        nereid_server_free(server);
    }
    remove_repo();
    return check_summary();
}
