/*
 * This file contains the response cache benchmark: the C identity model
 * ([1,16] FP32, default scheduler) through nereid_server_infer_async on one
 * client thread, three ways on one server with --cache-config
 * local,size=1048576:
 *   run      the model without response_cache (every request executes)
 *   hit      the same model with response_cache, the same input every time
 *   miss     the cached model, a new input every time (lookup + execution +
 *            insertion, evicting once the cache is full)
 * and the hit/run ratio. Completion is awaited by spinning on an atomic (as
 * bench_core does), so the numbers are the server's cost.
 *
 *   build/bench/bench_cache [iterations]     (default 20000)
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nereid/server.h"

#define MODEL_CONFIG                                                                               \
    "backend: \"identity\"\nmax_batch_size: 8\n"                                                   \
    "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"                           \
    "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static _Atomic(nereid_response_t *) done_response;

static void on_done(nereid_response_t *resp, void *userp)
{
    (void)userp;
    atomic_store_explicit(&done_response, resp, memory_order_release);
}

static int once(nereid_server_t *server, const char *model, const float *in)
{
    static const int64_t shape[2] = {1, 16};
    nereid_request_t *req = NULL;
    nereid_error_t *err = nereid_request_new(server, model, -1, &req);
    if (!err) err = nereid_request_add_input(req, "INPUT0", NEREID_TYPE_FP32, shape, 2, in, 64);
    if (!err) err = nereid_server_infer_async(server, req, NULL, on_done, NULL);
    if (err) {
        fprintf(stderr, "bench_cache: %s\n", nereid_error_message(err));
        nereid_error_free(err);
        nereid_request_free(req);
        return -1;
    }
    nereid_response_t *resp;
    while (!(resp = atomic_exchange_explicit(&done_response, NULL, memory_order_acquire)))
        ;
    const void *data = NULL;
    size_t size = 0;
    int rc = nereid_response_error(resp) || nereid_response_output_count(resp) != 1 ? -1 : 0;
    if (!rc) nereid_response_output(resp, 0, NULL, NULL, NULL, NULL, &data, &size, NULL);
    if (rc || size != 64 || memcmp(data, in, 64) != 0) {
        fprintf(stderr, "bench_cache: wrong response from %s\n", model);
        rc = -1;
    }
    nereid_response_free(resp);
    return rc;
}

typedef struct result {
    double min_us, median_us, p99_us;
} result_t;

/* Runs iters requests; fresh_inputs gives every request its own input. */
static int measure(nereid_server_t *server, const char *model, size_t iters, bool fresh_inputs,
                   result_t *out)
{
    float in[16];
    for (int i = 0; i < 16; i++)
        in[i] = (float)i * 0.5f;
    uint64_t *t = calloc(iters, sizeof *t);
    int rc = 0;
    for (size_t i = 0; i < iters / 10 && !rc; i++) /* warm up */
        rc = once(server, model, in);
    for (size_t i = 0; i < iters && !rc; i++) {
        if (fresh_inputs) in[0] = (float)(i + 1) * 3.0f;
        uint64_t t0 = now_ns();
        rc = once(server, model, in);
        t[i] = now_ns() - t0;
    }
    if (!rc) {
        qsort(t, iters, sizeof *t, cmp_u64);
        out->min_us = (double)t[0] / 1e3;
        out->median_us = (double)t[iters / 2] / 1e3;
        out->p99_us = (double)t[(iters - 1) * 99 / 100] / 1e3;
    }
    free(t);
    return rc;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) abort();
    fputs(text, f);
    fclose(f);
}

/* <repo>/<name>/{config.pbtxt,1/} */
static void write_model(const char *repo, const char *name, bool cached)
{
    char path[512], config[1024];
    snprintf(path, sizeof path, "%s/%s", repo, name);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/1", repo, name);
    mkdir(path, 0755);
    snprintf(config, sizeof config, "name: \"%s\"\n%s%s", name, MODEL_CONFIG,
             cached ? "response_cache { enable: true }\n" : "");
    snprintf(path, sizeof path, "%s/%s/config.pbtxt", repo, name);
    write_text(path, config);
}

int main(int argc, char **argv)
{
    size_t iters = argc > 1 ? strtoul(argv[1], NULL, 10) : 20000;
    if (iters < 10) iters = 10;
    char repo[] = "/tmp/nereid-bench-cache-XXXXXX";
    if (!mkdtemp(repo)) return 1;
    write_model(repo, "identity", false);
    write_model(repo, "identity_cached", true);
    nereid_server_options_t opts;
    nereid_server_options_init(&opts);
    const char *repos[] = {repo};
    opts.model_repositories = repos;
    opts.n_model_repositories = 1;
    opts.log_info = false;
    opts.cache_name = "local";
    opts.cache_config_json = "{\"size\":\"1048576\"}";
    nereid_server_t *server = NULL;
    nereid_error_t *err = nereid_server_new(&opts, &server);
    int rc = 0;
    if (err) {
        fprintf(stderr, "bench_cache: %s\n", nereid_error_message(err));
        nereid_error_free(err);
        rc = 1;
    }
    result_t run, hit, miss;
    if (!rc) rc = measure(server, "identity", iters, false, &run);
    if (!rc) rc = measure(server, "identity_cached", iters, false, &hit);
    if (!rc) rc = measure(server, "identity_cached", iters, true, &miss);
    if (!rc) {
        printf("identity (C backend) [1,16] FP32, default scheduler, %zu calls each, one client "
               "thread, --cache-config local,size=1048576\n",
               iters);
        const struct {
            const char *name;
            const result_t *r;
        } rows[] = {{"run (no cache)", &run}, {"cache hit", &hit}, {"cache miss", &miss}};
        for (size_t i = 0; i < 3; i++)
            printf("  %-15s min %6.2f us  median %6.2f us  p99 %6.2f us\n", rows[i].name,
                   rows[i].r->min_us, rows[i].r->median_us, rows[i].r->p99_us);
        printf("  hit / run: median %.2f, min %.2f\n", hit.median_us / run.median_us,
               hit.min_us / run.min_us);
    }
    nereid_server_free(server);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", repo);
    if (system(cmd) != 0) rc = 1;
    return rc ? 1 : 0;
}
