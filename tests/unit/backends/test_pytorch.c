/*
 * This file contains the in-process tests of the pytorch backend: TorchScript
 * models generated with Debian's python3-torch into a temporary repository
 * (tests/integration/pytorch_models.py), served by nereid_server_new and
 * driven with nereid_server_infer_async. Exact outputs for every supported
 * datatype, name mappings, tuple outputs, strings, dynamic batching, a
 * stateful model, request errors and load failures.
 *
 * Skips (exit 0 with a note) only when the backend library was not built
 * because LibTorch is absent; scripts/setup.sh installs it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "test_util.h"

static nereid_server_t *server;

/* Submits a request; returns the submit error (caller frees) or NULL with
 * the request in flight on w. */
static nereid_error_t *submit(const char *model, const tensor_t *in, size_t n_in, waiter_t *w)
{
    nereid_request_t *req = NULL;
    nereid_error_t *err = request_with_inputs(server, model, in, n_in, &req);
    waiter_init(w);
    if (!err) err = nereid_server_infer_async(server, req, NULL, waiter_on_done, w);
    if (err) {
        nereid_request_free(req);
        waiter_destroy(w);
    }
    return err;
}

/* Runs model on the inputs; returns the response (NULL when submission
 * failed, with *submit_err set). */
static nereid_response_t *infer(const char *model, const tensor_t *in, size_t n_in,
                                nereid_error_t **submit_err)
{
    waiter_t w;
    nereid_error_t *err = submit(model, in, n_in, &w);
    if (submit_err)
        *submit_err = err;
    else if (err) {
        fprintf(stderr, "submit %s: %s\n", model, nereid_error_message(err));
        nereid_error_free(err);
    }
    return err ? NULL : waiter_take(&w);
}

/* The error text of a failed inference, submit- or response-time; "" when
 * it succeeded. Copied into buf. */
static const char *infer_error(const char *model, const tensor_t *in, size_t n_in, char *buf,
                               size_t size)
{
    nereid_error_t *serr = NULL;
    nereid_response_t *resp = infer(model, in, n_in, &serr);
    buf[0] = '\0';
    if (serr) {
        snprintf(buf, size, "%s", nereid_error_message(serr));
        nereid_error_free(serr);
    } else if (resp) {
        const nereid_error_t *e = nereid_response_error(resp);
        if (e) snprintf(buf, size, "%s", nereid_error_message(e));
        nereid_response_free(resp);
    }
    return buf;
}

/* Finds output name; checks datatype and shape; returns its data. */
static const void *output(nereid_response_t *resp, const char *name, nereid_datatype_t datatype,
                          const int64_t *shape, size_t rank, size_t *byte_size)
{
    nereid_datatype_t dt;
    const int64_t *s;
    size_t r, bs;
    const void *data;
    if (find_output(resp, name, &dt, &s, &r, &data, &bs)) {
        CHECK(dt == datatype);
        CHECK(r == rank);
        if (r == rank) CHECK(memcmp(s, shape, rank * sizeof *shape) == 0);
        if (byte_size) *byte_size = bs;
        return data;
    }
    fprintf(stderr, "output %s missing\n", name);
    check_failed++;
    return NULL;
}

static bool response_ok(nereid_response_t *resp)
{
    if (!resp) return false;
    const nereid_error_t *e = nereid_response_error(resp);
    if (e) fprintf(stderr, "response error: %s\n", nereid_error_message(e));
    return e == NULL;
}

/* ---- Tests ---- */

static void test_add_sub(void)
{
    float a[16], b[16];
    for (int i = 0; i < 16; i++)
        a[i] = (float)i, b[i] = 0.5f * (float)i + 1.0f;
    tensor_t in[] = {{"INPUT__0", NEREID_TYPE_FP32, {16}, 1, a, sizeof a},
                     {"INPUT__1", NEREID_TYPE_FP32, {16}, 1, b, sizeof b}};
    nereid_response_t *resp = infer("pt_add_sub", in, 2, NULL);
    CHECK(response_ok(resp));
    int64_t shape[] = {16};
    const float *sum = output(resp, "OUTPUT__0", NEREID_TYPE_FP32, shape, 1, NULL);
    const float *diff = output(resp, "OUTPUT__1", NEREID_TYPE_FP32, shape, 1, NULL);
    for (int i = 0; sum && diff && i < 16; i++) {
        CHECK(sum[i] == a[i] + b[i]);
        CHECK(diff[i] == a[i] - b[i]);
    }
    nereid_response_free(resp);
}

static void test_arg_names(void)
{
    /* Config lists y then x; forward(x, y) returns x - y. */
    float x[] = {10, 20, 30}, y[] = {1, 2, 3};
    tensor_t in[] = {{"x", NEREID_TYPE_FP32, {3}, 1, x, sizeof x},
                     {"y", NEREID_TYPE_FP32, {3}, 1, y, sizeof y}};
    nereid_response_t *resp = infer("pt_arg_names", in, 2, NULL);
    CHECK(response_ok(resp));
    int64_t shape[] = {3};
    const float *d = output(resp, "diff", NEREID_TYPE_FP32, shape, 1, NULL);
    if (d) CHECK(d[0] == 9 && d[1] == 18 && d[2] == 27);
    nereid_response_free(resp);
}

static void test_tuple(void)
{
    float x[] = {-1.5f, 0.0f, 2.5f};
    tensor_t in[] = {{"X__0", NEREID_TYPE_FP32, {3}, 1, x, sizeof x}};
    nereid_response_t *resp = infer("pt_tuple", in, 1, NULL);
    CHECK(response_ok(resp));
    int64_t shape[] = {3};
    const float *dbl = output(resp, "DOUBLE__0", NEREID_TYPE_FP32, shape, 1, NULL);
    const int64_t *lng = output(resp, "LONG__1", NEREID_TYPE_INT64, shape, 1, NULL);
    const uint8_t *pos = output(resp, "BOOL__2", NEREID_TYPE_BOOL, shape, 1, NULL);
    if (dbl) CHECK(dbl[0] == -3.0f && dbl[1] == 0.0f && dbl[2] == 5.0f);
    if (lng) CHECK(lng[0] == -1 && lng[1] == 0 && lng[2] == 2);
    if (pos) CHECK(pos[0] == 0 && pos[1] == 0 && pos[2] == 1);
    nereid_response_free(resp);
}

static void test_all_types(void)
{
    uint8_t b[] = {1, 0, 1, 0}, u8[] = {0, 1, 2, 254};
    int8_t i8[] = {-128 + 1, -1, 0, 127};
    int16_t i16[] = {-2, 0, 3, 1000};
    int32_t i32[] = {-7, 0, 1, 100000};
    int64_t i64[] = {-5, 0, 6, 1LL << 40};
    uint16_t f16[] = {0x3c00, 0x4000, 0xbc00, 0x0000}; /* 1, 2, -1, 0 */
    float f32[] = {1, -2, 0.5f, 3};
    double f64[] = {0.25, -1, 2, 1e10};
    const char *names[] = {"BOOL",  "UINT8", "INT8", "INT16", "INT32",
                           "INT64", "FP16",  "FP32", "FP64"};
    nereid_datatype_t types[] = {NEREID_TYPE_BOOL,  NEREID_TYPE_UINT8, NEREID_TYPE_INT8,
                                 NEREID_TYPE_INT16, NEREID_TYPE_INT32, NEREID_TYPE_INT64,
                                 NEREID_TYPE_FP16,  NEREID_TYPE_FP32,  NEREID_TYPE_FP64};
    const void *data[] = {b, u8, i8, i16, i32, i64, f16, f32, f64};
    size_t sizes[] = {sizeof b,   sizeof u8,  sizeof i8,  sizeof i16, sizeof i32,
                      sizeof i64, sizeof f16, sizeof f32, sizeof f64};
    char in_names[9][32], out_names[9][32];
    tensor_t in[9];
    for (int i = 0; i < 9; i++) {
        snprintf(in_names[i], sizeof in_names[i], "IN%d_%s__%d", i, names[i], i);
        snprintf(out_names[i], sizeof out_names[i], "OUT%d_%s__%d", i, names[i], i);
        in[i] = (tensor_t){in_names[i], types[i], {4}, 1, data[i], sizes[i]};
    }
    nereid_response_t *resp = infer("pt_all_types", in, 9, NULL);
    CHECK(response_ok(resp));
    int64_t shape[] = {4};
    const void *o[9];
    for (int i = 0; i < 9; i++)
        o[i] = output(resp, out_names[i], types[i], shape, 1, NULL);
    for (int k = 0; k < 4; k++) {
        if (o[0]) CHECK(((const uint8_t *)o[0])[k] == !b[k]);
        if (o[1]) CHECK(((const uint8_t *)o[1])[k] == (uint8_t)(u8[k] + 1));
        if (o[2]) CHECK(((const int8_t *)o[2])[k] == (int8_t)(i8[k] - 1));
        if (o[3]) CHECK(((const int16_t *)o[3])[k] == (int16_t)(i16[k] * 2));
        if (o[4]) CHECK(((const int32_t *)o[4])[k] == i32[k] + 7);
        if (o[5]) CHECK(((const int64_t *)o[5])[k] == -i64[k]);
        if (o[7]) CHECK(((const float *)o[7])[k] == f32[k] / 2.0f);
        if (o[8]) CHECK(((const double *)o[8])[k] == f64[k] + 0.25);
    }
    uint16_t f16_expect[] = {0x4000, 0x4400, 0xc000, 0x0000}; /* 2, 4, -2, 0 */
    if (o[6]) CHECK(memcmp(o[6], f16_expect, sizeof f16_expect) == 0);
    nereid_response_free(resp);
}

static void test_strings(void)
{
    static const char in_bytes[] = "\x02\0\0\0ab\x00\0\0\0\x03\0\0\0x y";
    tensor_t in[] = {{"TEXT__0", NEREID_TYPE_BYTES, {3}, 1, in_bytes, sizeof in_bytes - 1}};
    nereid_response_t *resp = infer("pt_strings", in, 1, NULL);
    CHECK(response_ok(resp));
    int64_t shape[] = {3};
    size_t bs = 0;
    const char *o = output(resp, "UPPER__0", NEREID_TYPE_BYTES, shape, 1, &bs);
    static const char expect[] = "\x03\0\0\0AB!\x01\0\0\0!\x04\0\0\0X Y!";
    CHECK(bs == sizeof expect - 1);
    if (o && bs == sizeof expect - 1) CHECK(memcmp(o, expect, bs) == 0);
    nereid_response_free(resp);
}

static void test_dict_input(void)
{
    float a[] = {2, 3}, b[] = {5, 7};
    tensor_t in[] = {{"a", NEREID_TYPE_FP32, {2}, 1, a, sizeof a},
                     {"b", NEREID_TYPE_FP32, {2}, 1, b, sizeof b}};
    nereid_response_t *resp = infer("pt_dict", in, 2, NULL);
    CHECK(response_ok(resp));
    int64_t shape[] = {2};
    const float *o = output(resp, "OUTPUT__0", NEREID_TYPE_FP32, shape, 1, NULL);
    if (o) CHECK(o[0] == 10 && o[1] == 21);
    nereid_response_free(resp);
}

/* Three requests of batch 1, 2 and 1 in flight together: the dynamic
 * batcher (20 ms delay) may merge them; each answer must be its own. */
static void test_batched(void)
{
    float x[3][8];
    int64_t rows[] = {1, 2, 1};
    waiter_t w[3];
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < 8; i++)
            x[r][i] = (float)(r * 100 + i);
        tensor_t in[] = {{"INPUT__0",
                          NEREID_TYPE_FP32,
                          {rows[r], 4},
                          2,
                          x[r],
                          (size_t)rows[r] * 4 * sizeof(float)}};
        nereid_error_t *err = submit("pt_batched", in, 1, &w[r]);
        CHECK(err == NULL);
        if (err) {
            fprintf(stderr, "submit: %s\n", nereid_error_message(err));
            nereid_error_free(err);
            return;
        }
    }
    for (int r = 0; r < 3; r++) {
        nereid_response_t *resp = waiter_take(&w[r]);
        CHECK(response_ok(resp));
        int64_t shape[] = {rows[r], 4};
        const float *o = output(resp, "OUTPUT__0", NEREID_TYPE_FP32, shape, 2, NULL);
        for (int i = 0; o && i < rows[r] * 4; i++)
            CHECK(o[i] == x[r][i] * 2.0f + 1.0f);
        nereid_response_free(resp);
    }
}

static void test_accumulator(void)
{
    /* Controls as ordinary inputs: START resets, READY adds. */
    int32_t values[] = {3, 4, 5, 10, 1};
    int32_t starts[] = {1, 0, 0, 1, 0};
    int32_t readies[] = {1, 1, 0, 1, 1};
    int32_t expect[] = {3, 7, 7, 10, 11};
    for (int s = 0; s < 5; s++) {
        tensor_t in[] = {{"INPUT__0", NEREID_TYPE_INT32, {1}, 1, &values[s], 4},
                         {"START__1", NEREID_TYPE_INT32, {1}, 1, &starts[s], 4},
                         {"READY__2", NEREID_TYPE_INT32, {1}, 1, &readies[s], 4}};
        nereid_response_t *resp = infer("pt_accumulator", in, 3, NULL);
        CHECK(response_ok(resp));
        int64_t shape[] = {1};
        const int32_t *o = output(resp, "OUTPUT__0", NEREID_TYPE_INT32, shape, 1, NULL);
        if (o) CHECK(*o == expect[s]);
        nereid_response_free(resp);
    }
}

static void test_errors(void)
{
    char msg[4096];
    float a[16] = {0}, b[16] = {0};
    /* Wrong shape: rejected by the core before the backend. */
    tensor_t bad_shape[] = {{"INPUT__0", NEREID_TYPE_FP32, {8}, 1, a, 8 * sizeof(float)},
                            {"INPUT__1", NEREID_TYPE_FP32, {16}, 1, b, sizeof b}};
    infer_error("pt_add_sub", bad_shape, 2, msg, sizeof msg);
    CHECK(strstr(msg, "unexpected shape for input 'INPUT__0' for model 'pt_add_sub'") != NULL);

    /* Shapes the config allows but the model cannot combine: a backend error. */
    tensor_t mismatch[] = {{"x", NEREID_TYPE_FP32, {3}, 1, a, 3 * sizeof(float)},
                           {"y", NEREID_TYPE_FP32, {4}, 1, b, 4 * sizeof(float)}};
    infer_error("pt_arg_names", mismatch, 2, msg, sizeof msg);
    CHECK(strncmp(msg, "PyTorch execute failure: ", 25) == 0);
    CHECK(strstr(msg, "must match the size of tensor") != NULL);

    /* Malformed string data. */
    static const char short_bytes[] = "\x09\0\0\0ab";
    tensor_t bad_str[] = {{"TEXT__0", NEREID_TYPE_BYTES, {1}, 1, short_bytes, 6}};
    infer_error("pt_strings", bad_str, 1, msg, sizeof msg);
    CHECK(msg[0] != '\0');

    /* The server still answers afterwards. */
    test_add_sub();
}

/* Every broken model fails to load with its own message (seen in the
 * repository index reason); the healthy model next to them still serves. */
static void test_load_failures(const char *path)
{
    static const struct {
        const char *model, *text;
    } cases[] = {
        {"pt_missing", "unable to find '"},
        {"pt_count", "unable to load model 'pt_count', configuration expects 1 inputs, model "
                     "provides 2"},
        {"pt_corrupt", "failed to load model 'pt_corrupt'"},
        {"pt_gpu", "KIND_GPU"},
        {"pt_uint16", "unsupported datatype TYPE_UINT16 for input 'INPUT__0' for model "
                      "'pt_uint16'"},
        {"pt_bad_param", "failed to convert 'maybe' to boolean for parameter 'INFERENCE_MODE'"},
    };
    nereid_server_options_t opts;
    repo_options_for(&opts, path);
    opts.exit_on_error = false;
    nereid_server_t *s = NULL;
    nereid_error_t *err = nereid_server_new(&opts, &s);
    CHECK(err == NULL);
    if (err) {
        fprintf(stderr, "server: %s\n", nereid_error_message(err));
        nereid_error_free(err);
        return;
    }
    char *index = NULL;
    err = nereid_server_repository_index(s, false, &index);
    CHECK(err == NULL);
    nereid_error_free(err);
    for (size_t i = 0; index && i < sizeof cases / sizeof cases[0]; i++) {
        bool ready = true;
        nereid_error_t *e = nereid_server_model_is_ready(s, cases[i].model, -1, &ready);
        CHECK(e != NULL || !ready);
        nereid_error_free(e);
        if (!strstr(index, cases[i].text)) {
            fprintf(stderr, "load failure of %s: expected \"%s\" in %s\n", cases[i].model,
                    cases[i].text, index);
            check_failed++;
        }
    }
    free(index);
    nereid_server_free(s);
}

/* Models with sequence_batching controls and implicit state load: their
 * controls and state map to forward() by `<name>__<index>`. */
static void test_sequence_models_load(const char *path)
{
    nereid_server_options_t opts;
    repo_options_for(&opts, path);
    nereid_server_t *s = NULL;
    nereid_error_t *err = nereid_server_new(&opts, &s);
    CHECK(err == NULL);
    if (err) {
        fprintf(stderr, "sequence models: %s\n", nereid_error_message(err));
        nereid_error_free(err);
        return;
    }
    const char *models[] = {"pt_seq_accumulator", "pt_seq_state"};
    for (int i = 0; i < 2; i++) {
        bool ready = false;
        nereid_error_t *e = nereid_server_model_is_ready(s, models[i], -1, &ready);
        CHECK(e == NULL && ready);
        nereid_error_free(e);
    }
    nereid_server_free(s);
}

static int run(const char *cmd)
{
    int rc = system(cmd);
    if (rc != 0) fprintf(stderr, "command failed (%d): %s\n", rc, cmd);
    return rc;
}

int main(void)
{
    char lib[4096];
    snprintf(lib, sizeof lib, "%s/libnereid_pytorch.so", test_backend_dir());
    if (access(lib, F_OK) != 0) {
        printf("test_pytorch: skipped, %s was not built (LibTorch missing; run "
               "scripts/setup.sh)\n",
               lib);
        return 0;
    }
    make_repo_dir("pytorch");
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 tests/integration/pytorch_models.py %s/models && "
             "/usr/bin/python3 tests/integration/pytorch_models.py %s/broken --broken && "
             "/usr/bin/python3 tests/integration/pytorch_models.py %s/sequence --sequence",
             repo, repo, repo);
    if (run(cmd) != 0) return 1;

    char models[4200], broken[4200], sequence[4200];
    snprintf(models, sizeof models, "%s/models", repo);
    snprintf(broken, sizeof broken, "%s/broken", repo);
    snprintf(sequence, sizeof sequence, "%s/sequence", repo);
    nereid_server_options_t opts;
    repo_options_for(&opts, models);
    nereid_error_t *err = nereid_server_new(&opts, &server);
    if (err) {
        fprintf(stderr, "nereid_server_new: %s\n", nereid_error_message(err));
        nereid_error_free(err);
        check_failed++;
    } else {
        test_add_sub();
        test_arg_names();
        test_tuple();
        test_all_types();
        test_strings();
        test_dict_input();
        test_batched();
        test_accumulator();
        test_errors();
        nereid_server_free(server);
    }
    test_load_failures(broken);
    test_sequence_models_load(sequence);

    remove_repo();
    return check_summary();
}
