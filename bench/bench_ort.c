/*
 * This file contains the ONNX Runtime overhead benchmark: the add_sub ONNX
 * example model with [1,16] FP32 inputs, run on one client thread through
 * nereid_server_infer_async and, in the same process, through a raw ORT Run
 * on the same tensors with the same session settings (intra-op threads 1,
 * ORT-allocated outputs copied out; and again with outputs bound to
 * caller buffers). It prints the medians and the server path's overhead
 * over the raw call.
 *
 *   build/bench/bench_ort [iterations]      (default 20000; run from the repo root
 *                                            after `make models`)
 */
#include <limits.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../tests/unit/test_util.h"
#include "../backends/onnxruntime/ort_api.h"

#define MODEL "add_sub_onnx"
#define ROUNDS 10

static double median_us(uint64_t *v, size_t n)
{
    qsort(v, n, sizeof(*v), cmp_u64);
    return (double)v[n / 2] / 1000.0;
}

static double percentile_us(uint64_t *v, size_t n, double p) /* v sorted */
{
    return (double)v[(size_t)((double)(n - 1) * p)] / 1000.0;
}

static float in0[16], in1[16], out0[16], out1[16];

/* ---- server path ------------------------------------------------------ */

static _Atomic(nereid_response_t *) done_response;

static void on_done(nereid_response_t *resp, void *userp)
{
    (void)userp;
    atomic_store_explicit(&done_response, resp, memory_order_release);
}

static int server_once(nereid_server_t *server)
{
    static const int64_t shape[2] = {1, 16};
    nereid_request_t *req = NULL;
    nereid_error_t *err = nereid_request_new(server, MODEL, -1, &req);
    if (!err) err = nereid_request_add_input(req, "INPUT0", NEREID_TYPE_FP32, shape, 2, in0, 64);
    if (!err) err = nereid_request_add_input(req, "INPUT1", NEREID_TYPE_FP32, shape, 2, in1, 64);
    if (!err) err = nereid_server_infer_async(server, req, NULL, on_done, NULL);
    if (err) {
        fprintf(stderr, "bench_ort: %s\n", nereid_error_message(err));
        nereid_error_free(err);
        nereid_request_free(req);
        return -1;
    }
    nereid_response_t *resp;
    while (!(resp = atomic_exchange_explicit(&done_response, NULL, memory_order_acquire)))
        ; /* spin: measure the server, not this thread's wake-up */
    int rc = 0;
    if (nereid_response_error(resp)) {
        fprintf(stderr, "bench_ort: %s\n", nereid_error_message(nereid_response_error(resp)));
        rc = -1;
    } else {
        for (size_t i = 0; i < nereid_response_output_count(resp); i++) {
            const char *name;
            nereid_datatype_t dt;
            const int64_t *oshape;
            size_t rank, size;
            const void *data;
            void *userp;
            nereid_response_output(resp, i, &name, &dt, &oshape, &rank, &data, &size, &userp);
            memcpy(strcmp(name, "OUTPUT0") ? out1 : out0, data, size < 64 ? size : 64);
        }
    }
    nereid_response_free(resp);
    return rc;
}

/* ---- raw ORT path ----------------------------------------------------- */

typedef struct raw {
    ort_api_t api;
    OrtEnv *env;
    OrtSession *session;
    OrtMemoryInfo *info;
} raw_t;

static int ort_ok(const ort_api_t *api, OrtStatus *st)
{
    if (!st) return 0;
    fprintf(stderr, "bench_ort: onnx runtime error: %s\n", api->GetErrorMessage(st));
    api->ReleaseStatus(st);
    return -1;
}

static int raw_open(raw_t *r, const char *model_path)
{
    char lib[PATH_MAX], err[512];
    const char *env = getenv("NEREID_ORT_LIBRARY");
    snprintf(lib, sizeof(lib), "%s",
             env && *env ? env : NEREID_DEFAULT_BACKEND_DIR "/libonnxruntime.so.1");
    if (ort_api_load(&r->api, lib, err, sizeof(err)) != 0) {
        fprintf(stderr, "bench_ort: %s\n", err);
        return -1;
    }
    const ort_api_t *api = &r->api;
    OrtSessionOptions *opts = NULL;
    int rc = ort_ok(api, api->CreateEnv(ORT_LOG_WARNING, "bench", &r->env));
    if (!rc) rc = ort_ok(api, api->CreateSessionOptions(&opts));
    if (!rc) rc = ort_ok(api, api->SetIntraOpNumThreads(opts, 1));
    if (!rc) rc = ort_ok(api, api->CreateSession(r->env, model_path, opts, &r->session));
    if (!rc)
        rc = ort_ok(api,
                    api->CreateCpuMemoryInfo(ORT_ARENA_ALLOCATOR, ORT_MEM_TYPE_DEFAULT, &r->info));
    if (opts) api->ReleaseSessionOptions(opts);
    return rc;
}

/* bind: outputs are wrapped around out0/out1 before Run (as the backend does
 * for outputs of known shape) instead of allocated by ORT and copied. */
static int raw_once(raw_t *r, bool bind)
{
    static const int64_t shape[2] = {1, 16};
    static const char *const in_names[2] = {"INPUT0", "INPUT1"};
    static const char *const out_names[2] = {"OUTPUT0", "OUTPUT1"};
    const ort_api_t *api = &r->api;
    OrtValue *in[2] = {NULL, NULL}, *out[2] = {NULL, NULL};
    int rc = ort_ok(api, api->CreateTensorWithDataAsOrtValue(r->info, in0, 64, shape, 2,
                                                             ORT_ELEM_FLOAT, &in[0]));
    if (!rc)
        rc = ort_ok(api, api->CreateTensorWithDataAsOrtValue(r->info, in1, 64, shape, 2,
                                                             ORT_ELEM_FLOAT, &in[1]));
    for (int i = 0; i < 2 && bind && !rc; i++)
        rc = ort_ok(api, api->CreateTensorWithDataAsOrtValue(r->info, i ? out1 : out0, 64, shape, 2,
                                                             ORT_ELEM_FLOAT, &out[i]));
    if (!rc)
        rc = ort_ok(api, api->Run(r->session, NULL, in_names, (const OrtValue *const *)in, 2,
                                  out_names, 2, out));
    for (int i = 0; i < 2 && !bind && !rc; i++) {
        void *p;
        rc = ort_ok(api, api->GetTensorMutableData(out[i], &p));
        if (!rc) memcpy(i ? out1 : out0, p, 64);
    }
    for (int i = 0; i < 2; i++) {
        if (in[i]) api->ReleaseValue(in[i]);
        if (out[i]) api->ReleaseValue(out[i]);
    }
    return rc;
}

static void raw_close(raw_t *r)
{
    if (r->info) r->api.ReleaseMemoryInfo(r->info);
    if (r->session) r->api.ReleaseSession(r->session);
    if (r->env) r->api.ReleaseEnv(r->env);
}

static int check_outputs(void)
{
    for (int i = 0; i < 16; i++)
        if (out0[i] != in0[i] + in1[i] || out1[i] != in0[i] - in1[i]) return -1;
    return 0;
}

int main(int argc, char **argv)
{
    size_t iters = argc > 1 ? strtoul(argv[1], NULL, 10) : 20000;
    if (iters < ROUNDS * 10) iters = ROUNDS * 10;
    for (int i = 0; i < 16; i++) {
        in0[i] = (float)i;
        in1[i] = (float)(16 - i) * 0.5f;
    }
    const char *models = NEREID_SOURCE_DIR "/examples/models";
    char model_path[PATH_MAX];
    snprintf(model_path, sizeof(model_path), "%s/" MODEL "/1/model.onnx", models);

    nereid_server_options_t opts;
    repo_options_for(&opts, models);
    const char *load[] = {MODEL};
    opts.model_control_mode = NEREID_MODEL_CONTROL_EXPLICIT;
    opts.load_models = load;
    opts.n_load_models = 1;
    nereid_server_t *server = NULL;
    nereid_error_t *err = nereid_server_new(&opts, &server);
    if (err) {
        fprintf(stderr, "bench_ort: %s (run `make models` first)\n", nereid_error_message(err));
        nereid_error_free(err);
        return 1;
    }
    raw_t raw = {0};
    if (raw_open(&raw, model_path) != 0) {
        nereid_server_free(server);
        return 1;
    }

    uint64_t *ts = calloc(iters, sizeof(uint64_t)), *tr = calloc(iters, sizeof(uint64_t));
    uint64_t *tb = calloc(iters, sizeof(uint64_t));
    int rc = 0;
    for (size_t i = 0; i < 1000 && !rc; i++)
        rc = server_once(server) | raw_once(&raw, false) | raw_once(&raw, true); /* warm up */
    /* Alternate rounds so both paths see the same machine conditions. */
    size_t per_round = iters / ROUNDS, n = 0;
    for (int round = 0; round < ROUNDS && !rc; round++) {
        for (size_t i = 0; i < per_round && !rc; i++) {
            uint64_t t0 = now_ns();
            rc = server_once(server);
            ts[n + i] = now_ns() - t0;
        }
        for (size_t i = 0; i < per_round && !rc; i++) {
            uint64_t t0 = now_ns();
            rc = raw_once(&raw, false);
            tr[n + i] = now_ns() - t0;
        }
        for (size_t i = 0; i < per_round && !rc; i++) {
            uint64_t t0 = now_ns();
            rc = raw_once(&raw, true);
            tb[n + i] = now_ns() - t0;
        }
        n += per_round;
    }
    if (!rc && check_outputs() != 0) {
        fprintf(stderr, "bench_ort: wrong add_sub results\n");
        rc = -1;
    }
    if (!rc) {
        double ms = median_us(ts, n), mr = median_us(tr, n);
        printf("add_sub_onnx [1,16] FP32, %zu iterations each, one client thread\n", n);
        printf("  server infer_async  median %7.2f us  p90 %7.2f us  p99 %7.2f us\n", ms,
               percentile_us(ts, n, 0.9), percentile_us(ts, n, 0.99));
        printf("  raw ORT Run         median %7.2f us  p90 %7.2f us  p99 %7.2f us\n", mr,
               percentile_us(tr, n, 0.9), percentile_us(tr, n, 0.99));
        double mb = median_us(tb, n);
        printf("  raw ORT Run, bound  median %7.2f us  p90 %7.2f us  p99 %7.2f us\n", mb,
               percentile_us(tb, n, 0.9), percentile_us(tb, n, 0.99));
        printf("  ratio %.2fx, server overhead %.2f us (target < 5 us)\n", ms / mr, ms - mr);
    }
    char *stats = NULL;
    nereid_error_t *serr = nereid_server_model_statistics(server, MODEL, -1, &stats);
    if (!rc && !serr && getenv("BENCH_STATS")) printf("%s\n", stats);
    nereid_error_free(serr);
    free(stats);
    free(ts);
    free(tr);
    free(tb);
    raw_close(&raw);
    nereid_server_free(server);
    return rc ? 1 : 0;
}
