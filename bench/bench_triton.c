/*
 * This file contains the Triton backend API's per-request cost benchmark:
 * the same [1,16] FP32 identity request through nereid_server_infer_async
 * on one client thread (as bench_core), once into Nereid's identity backend
 * (libnereid_identity.so) and once into the Triton-API test backend
 * tests/tritonbackends/tidentity.c (libtriton_tidentity.so through
 * libtritonserver.so), without and with the four response parameters
 * Triton's identity backend sets. The difference of the medians is what the
 * Triton layer costs per request. Rounds alternate between the models.
 *
 *   build/bench/bench_triton [iterations per round]   (default 20000; from the repo root)
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../tests/unit/test_util.h"
#include "nereid/server.h"

static float in0[16];
static _Atomic(nereid_response_t *) done_response;

static void on_done(nereid_response_t *resp, void *userp)
{
    (void)userp;
    atomic_store_explicit(&done_response, resp, memory_order_release);
}

static int once(nereid_server_t *server, const char *model)
{
    static const int64_t shape[1] = {16};
    nereid_request_t *req = NULL;
    nereid_error_t *err = nereid_request_new(server, model, -1, &req);
    if (!err) err = nereid_request_add_input(req, "INPUT0", NEREID_TYPE_FP32, shape, 1, in0, 64);
    if (!err) err = nereid_server_infer_async(server, req, NULL, on_done, NULL);
    if (err) {
        fprintf(stderr, "bench_triton: %s\n", nereid_error_message(err));
        nereid_error_free(err);
        nereid_request_free(req);
        return -1;
    }
    nereid_response_t *resp;
    while (!(resp = atomic_exchange_explicit(&done_response, NULL, memory_order_acquire)))
        ;
    int rc = nereid_response_error(resp) || nereid_response_output_count(resp) != 1 ? -1 : 0;
    if (!rc) {
        const void *data;
        size_t size;
        nereid_response_output(resp, 0, NULL, NULL, NULL, NULL, &data, &size, NULL);
        if (size != 64 || memcmp(data, in0, 64) != 0) rc = -1;
    }
    if (rc) fprintf(stderr, "bench_triton: wrong response from %s\n", model);
    nereid_response_free(resp);
    return rc;
}

static void write_config(const char *repo, const char *name, const char *backend, const char *extra)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", repo, name);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/1", repo, name);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/config.pbtxt", repo, name);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f,
            "name: \"%s\"\nbackend: \"%s\"\nmax_batch_size: 0\n"
            "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
            "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n%s\n",
            name, backend, extra);
    fclose(f);
}

static double median_us(uint64_t *t, size_t n)
{
    qsort(t, n, sizeof *t, cmp_u64);
    return (double)t[n / 2] / 1e3;
}

int main(int argc, char **argv)
{
    size_t iters = argc > 1 ? strtoul(argv[1], NULL, 10) : 20000;
    if (iters < 1) iters = 1;
    for (int i = 0; i < 16; i++)
        in0[i] = (float)i * 0.25f;
    char repo[] = "/tmp/nereid-bench-triton-XXXXXX";
    if (!mkdtemp(repo)) return 1;
    write_config(repo, "nereid_identity", "identity", "");
    write_config(repo, "triton_identity", "tidentity", "");
    write_config(repo, "triton_noparams", "tidentity",
                 "parameters { key: \"response_parameters\" value { string_value: \"false\" } }");
    /* Triton's search finds the library in the model directory. */
    const char *triton_models[2] = {"triton_identity", "triton_noparams"};
    char link[2][4096];
    for (int i = 0; i < 2; i++) {
        snprintf(link[i], sizeof link[i], "%s/%s/libtriton_tidentity.so", repo, triton_models[i]);
        if (symlink(NEREID_DEFAULT_BACKEND_DIR
                    "/../tritonbackends/tidentity/libtriton_tidentity.so",
                    link[i]) != 0)
            return 1;
    }
    nereid_server_options_t opts;
    nereid_server_options_init(&opts);
    const char *repos[] = {repo};
    opts.model_repositories = repos;
    opts.n_model_repositories = 1;
    opts.log_info = false;
    nereid_server_t *server = NULL;
    nereid_error_t *err = nereid_server_new(&opts, &server);
    int rc = 0;
    if (err) {
        fprintf(stderr, "bench_triton: %s\n", nereid_error_message(err));
        nereid_error_free(err);
        rc = 1;
    }
    enum { MODELS = 3, ROUNDS = 3 };
    const char *models[MODELS] = {"nereid_identity", "triton_noparams", "triton_identity"};
    double med[MODELS][ROUNDS];
    uint64_t *t = calloc(iters, sizeof *t);
    for (int round = 0; round < ROUNDS && !rc; round++)
        for (int m = 0; m < MODELS && !rc; m++) {
            for (size_t i = 0; i < iters && !rc; i++) {
                uint64_t t0 = now_ns();
                rc = once(server, models[m]);
                t[i] = now_ns() - t0;
            }
            med[m][round] = median_us(t, iters);
        }
    if (!rc) {
        printf("identity [16] FP32, %zu calls per round, one client thread, medians per round\n",
               iters);
        for (int m = 0; m < MODELS; m++)
            printf("  %-16s %7.2f %7.2f %7.2f us\n", models[m], med[m][0], med[m][1], med[m][2]);
        for (int m = 1; m < MODELS; m++)
            printf("  %-16s %+7.2f %+7.2f %+7.2f us per request over nereid_identity\n", models[m],
                   med[m][0] - med[0][0], med[m][1] - med[0][1], med[m][2] - med[0][2]);
    }
    free(t);
    if (server) nereid_server_free(server);
    unlink(link[0]);
    unlink(link[1]);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", repo);
    if (system(cmd) != 0) rc = 1;
    return rc ? 1 : 0;
}
