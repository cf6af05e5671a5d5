/*
 * This file contains the core's per-request cost benchmark: the C add_sub
 * example model ([1,16] FP32, default scheduler) through
 * nereid_server_infer_async on one client thread, with nothing but the core
 * between the call and the backend. Completion is awaited by spinning on an
 * atomic, as bench_ort does, so the number is the server's cost.
 *
 *   build/bench/bench_core [iterations]     (default 20000; from the repo root)
 *
 * Under valgrind the per-request instruction and allocation counts are the
 * difference of two runs, e.g. (memcheck prints "total heap usage"):
 *   valgrind build/bench/bench_core 1100 vs. valgrind build/bench/bench_core 100
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../tests/unit/test_util.h"
#include "nereid/server.h"

#define MODEL "add_sub"

static float in0[16], in1[16];
static _Atomic(nereid_response_t *) done_response;

static void on_done(nereid_response_t *resp, void *userp)
{
    (void)userp;
    atomic_store_explicit(&done_response, resp, memory_order_release);
}

static int once(nereid_server_t *server)
{
    static const int64_t shape[2] = {1, 16};
    nereid_request_t *req = NULL;
    nereid_error_t *err = nereid_request_new(server, MODEL, -1, &req);
    if (!err) err = nereid_request_add_input(req, "INPUT0", NEREID_TYPE_FP32, shape, 2, in0, 64);
    if (!err) err = nereid_request_add_input(req, "INPUT1", NEREID_TYPE_FP32, shape, 2, in1, 64);
    if (!err) err = nereid_server_infer_async(server, req, NULL, on_done, NULL);
    if (err) {
        fprintf(stderr, "bench_core: %s\n", nereid_error_message(err));
        nereid_error_free(err);
        nereid_request_free(req);
        return -1;
    }
    nereid_response_t *resp;
    while (!(resp = atomic_exchange_explicit(&done_response, NULL, memory_order_acquire)))
        ;
    int rc = 0;
    if (nereid_response_error(resp) || nereid_response_output_count(resp) != 2) rc = -1;
    for (size_t i = 0; !rc && i < 2; i++) {
        const void *data;
        size_t size;
        nereid_response_output(resp, i, NULL, NULL, NULL, NULL, &data, &size, NULL);
        const float *o = data;
        for (int k = 0; k < 16; k++)
            if (size != 64 || o[k] != (i ? in0[k] - in1[k] : in0[k] + in1[k])) rc = -1;
    }
    if (rc) fprintf(stderr, "bench_core: wrong response\n");
    nereid_response_free(resp);
    return rc;
}

int main(int argc, char **argv)
{
    size_t iters = argc > 1 ? strtoul(argv[1], NULL, 10) : 20000;
    if (iters < 1) iters = 1;
    for (int i = 0; i < 16; i++) {
        in0[i] = (float)i;
        in1[i] = (float)(16 - i) * 0.5f;
    }
    nereid_server_options_t opts;
    nereid_server_options_init(&opts);
    const char *repos[] = {NEREID_SOURCE_DIR "/examples/models"};
    const char *load[] = {MODEL};
    opts.model_repositories = repos;
    opts.n_model_repositories = 1;
    opts.model_control_mode = NEREID_MODEL_CONTROL_EXPLICIT;
    opts.load_models = load;
    opts.n_load_models = 1;
    nereid_server_t *server = NULL;
    nereid_error_t *err = nereid_server_new(&opts, &server);
    if (err) {
        fprintf(stderr, "bench_core: %s\n", nereid_error_message(err));
        nereid_error_free(err);
        return 1;
    }
    uint64_t *t = calloc(iters, sizeof *t);
    int rc = 0;
    for (size_t i = 0; i < iters && !rc; i++) {
        uint64_t t0 = now_ns();
        rc = once(server);
        t[i] = now_ns() - t0;
    }
    if (!rc) {
        qsort(t, iters, sizeof *t, cmp_u64);
        printf("add_sub (C backend) [1,16] FP32, %zu calls, one client thread\n", iters);
        printf("  server infer_async  median %7.2f us  p90 %7.2f us  p99 %7.2f us\n",
               (double)t[iters / 2] / 1e3, (double)t[(iters - 1) * 9 / 10] / 1e3,
               (double)t[(iters - 1) * 99 / 100] / 1e3);
    }
    free(t);
    nereid_server_free(server);
    return rc ? 1 : 0;
}
