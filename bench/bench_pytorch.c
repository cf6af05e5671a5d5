/*
 * This file contains the LibTorch add_sub benchmark: the same TorchScript
 * model ([16] FP32 inputs, (a+b, a-b) outputs) called raw through the
 * backend's nereid_pytorch_raw_forward helper and through the whole server
 * (nereid_server_infer_async, default scheduler, one request at a time), in
 * one run, with the ratio printed. The C add_sub backend through the server
 * is measured too, as the floor the core itself costs.
 *
 *   build/bench/bench_pytorch [iterations]      (default 20000)
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../tests/unit/test_util.h"

typedef void *(*raw_load_fn)(const char *, char *, size_t);
typedef int (*raw_forward_fn)(void *, const float *const *, size_t, const int64_t *, size_t,
                              float *const *, size_t);
typedef void (*raw_free_fn)(void *);

typedef struct summary {
    double median_us, p99_us, mean_us;
} summary_t;

static summary_t summarize(uint64_t *ns, size_t n)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += ns[i];
    qsort(ns, n, sizeof *ns, cmp_u64);
    return (summary_t){ns[n / 2] / 1e3, ns[n * 99 / 100] / 1e3, (double)total / (double)n / 1e3};
}

static nereid_server_t *server;
static float a[16], b[16];

/* One add_sub request through the server; 0 on success. */
static int server_call(const char *const *model)
{
    tensor_t in[] = {{model[1], NEREID_TYPE_FP32, {16}, 1, a, sizeof a},
                     {model[2], NEREID_TYPE_FP32, {16}, 1, b, sizeof b}};
    nereid_request_t *req = NULL;
    nereid_error_t *err = request_with_inputs(server, model[0], in, 2, &req);
    nereid_response_t *resp = err ? NULL : infer_sync(server, req, &err);
    if (err) {
        fprintf(stderr, "bench_pytorch: %s\n", nereid_error_message(err));
        nereid_error_free(err);
        return -1;
    }
    int rc = nereid_response_error(resp) ? -1 : 0;
    nereid_response_free(resp);
    return rc;
}

int main(int argc, char **argv)
{
    size_t iters = argc > 1 ? (size_t)atol(argv[1]) : 20000;
    if (iters < 100) iters = 100;
    const char *lib = NEREID_DEFAULT_BACKEND_DIR "/libnereid_pytorch.so";
    if (access(lib, F_OK) != 0) {
        printf("bench_pytorch: skipped, %s not built (LibTorch missing)\n", lib);
        return 0;
    }
    make_repo_dir("bench-pytorch");
    char cmd[8192], model_path[4200];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 " NEREID_SOURCE_DIR "/tests/integration/pytorch_models.py %s "
             "pt_add_sub",
             repo);
    if (system(cmd) != 0) {
        fprintf(stderr, "bench_pytorch: model generation failed\n");
        return 1;
    }
    snprintf(model_path, sizeof model_path, "%s/pt_add_sub/1/model.pt", repo);
    write_model("c_add_sub",
                "name: \"c_add_sub\"\nbackend: \"add_sub\"\nmax_batch_size: 0\n"
                "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 16 ] },\n"
                "        { name: \"INPUT1\" data_type: TYPE_FP32 dims: [ 16 ] } ]\n"
                "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 16 ] },\n"
                "         { name: \"OUTPUT1\" data_type: TYPE_FP32 dims: [ 16 ] } ]\n");
    for (int i = 0; i < 16; i++)
        a[i] = (float)i, b[i] = 1.0f;

    /* Raw forward() through the backend library's helper. */
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    raw_load_fn raw_load = h ? (raw_load_fn)dlsym(h, "nereid_pytorch_raw_load") : NULL;
    raw_forward_fn raw_forward = h ? (raw_forward_fn)dlsym(h, "nereid_pytorch_raw_forward") : NULL;
    raw_free_fn raw_free = h ? (raw_free_fn)dlsym(h, "nereid_pytorch_raw_free") : NULL;
    if (!raw_load || !raw_forward || !raw_free) {
        fprintf(stderr, "bench_pytorch: %s\n", h ? "raw helpers missing" : dlerror());
        return 1;
    }
    char errbuf[1024];
    void *raw = raw_load(model_path, errbuf, sizeof errbuf);
    if (!raw) {
        fprintf(stderr, "bench_pytorch: %s\n", errbuf);
        return 1;
    }
    uint64_t *ns = malloc(iters * sizeof *ns);
    float out0[16], out1[16];
    const float *ins[] = {a, b};
    float *outs[] = {out0, out1};
    int64_t shape[] = {16};
    for (size_t i = 0; i < iters / 10; i++)
        raw_forward(raw, ins, 2, shape, 1, outs, 2);
    for (size_t i = 0; i < iters; i++) {
        uint64_t t0 = now_ns();
        if (raw_forward(raw, ins, 2, shape, 1, outs, 2) != 0) {
            fprintf(stderr, "bench_pytorch: raw forward failed\n");
            return 1;
        }
        ns[i] = now_ns() - t0;
    }
    if (out0[3] != 4.0f || out1[3] != 2.0f) {
        fprintf(stderr, "bench_pytorch: wrong raw result\n");
        return 1;
    }
    summary_t raw_s = summarize(ns, iters);
    raw_free(raw);

    /* The same model through the server. */
    nereid_server_options_t opts;
    repo_options(&opts);
    nereid_error_t *err = nereid_server_new(&opts, &server);
    if (err) {
        fprintf(stderr, "bench_pytorch: %s\n", nereid_error_message(err));
        return 1;
    }
    /* The PyTorch model, then the C add_sub backend as the core's floor. */
    static const char *const models[2][3] = {{"pt_add_sub", "INPUT__0", "INPUT__1"},
                                             {"c_add_sub", "INPUT0", "INPUT1"}};
    summary_t srv[2];
    for (int m = 0; m < 2; m++) {
        for (size_t i = 0; i < iters / 10; i++)
            server_call(models[m]);
        for (size_t i = 0; i < iters; i++) {
            uint64_t t0 = now_ns();
            if (server_call(models[m]) != 0) return 1;
            ns[i] = now_ns() - t0;
        }
        srv[m] = summarize(ns, iters);
    }
    summary_t srv_s = srv[0];
    nereid_server_free(server);
    dlclose(h);

    printf("pytorch add_sub [16] FP32, %zu sequential calls\n", iters);
    printf("  raw forward():             median %7.2f us  p99 %7.2f us  mean %7.2f us\n",
           raw_s.median_us, raw_s.p99_us, raw_s.mean_us);
    printf("  nereid_server_infer_async: median %7.2f us  p99 %7.2f us  mean %7.2f us\n",
           srv_s.median_us, srv_s.p99_us, srv_s.mean_us);
    printf("  C add_sub via the server:  median %7.2f us  p99 %7.2f us  mean %7.2f us\n",
           srv[1].median_us, srv[1].p99_us, srv[1].mean_us);
    printf("  ratio server/raw (median): %.2fx  (overhead %.2f us; core floor %.2f us)\n",
           srv_s.median_us / raw_s.median_us, srv_s.median_us - raw_s.median_us, srv[1].median_us);
    free(ns);
    return remove_repo() ? 0 : 1;
}
