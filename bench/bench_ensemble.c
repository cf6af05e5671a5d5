/*
 * This file contains the ensemble and model-management benchmark, in
 * process (no network): per-request latency of the C identity model called
 * directly, through a 1-step ensemble and through a 4-step chain ensemble
 * ([1,4096] FP32, one request at a time, p50/p99), then throughput of the
 * 4-step chain with 16 requests in flight, then RSS across 50 explicit
 * load/unload cycles of the chain and its steps (memory is returned).
 *
 *   build/bench/bench_ensemble [requests per mode]   (default 2000; run from
 *                                                     the repo root)
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../tests/unit/test_util.h"

#define WIDTH 4096

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static long rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

static void make_repo(void)
{
    make_repo_dir("bench-ensemble");
    const char *io = "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 4096 ] } ]\n"
                     "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 4096 ] } ]\n";
    char buf[4096];
    snprintf(buf, sizeof buf, "backend: \"identity\" max_batch_size: 8\n%s", io);
    write_model("identity", buf);
    for (int steps = 1; steps <= 4; steps += 3) {
        int n = snprintf(buf, sizeof buf,
                         "platform: \"ensemble\" max_batch_size: 8\n%sensemble_scheduling { step [",
                         io);
        for (int s = 0; s < steps; s++) {
            char in[16], out[16];
            snprintf(in, sizeof in, s == 0 ? "INPUT0" : "t%d", s);
            snprintf(out, sizeof out, s == steps - 1 ? "OUTPUT0" : "t%d", s + 1);
            n += snprintf(buf + n, sizeof buf - (size_t)n,
                          "%s { model_name: \"identity\" input_map { key: \"INPUT0\" value: "
                          "\"%s\" } output_map { key: \"OUTPUT0\" value: \"%s\" } }",
                          s ? "," : "", in, out);
        }
        snprintf(buf + n, sizeof buf - (size_t)n, " ] }\n");
        char name[16];
        snprintf(name, sizeof name, "chain%d", steps);
        write_model(name, buf);
    }
}

static float input[WIDTH];

static int submit(nereid_server_t *s, const char *model, waiter_t *w)
{
    static const int64_t shape[2] = {1, WIDTH};
    nereid_request_t *req;
    if (nereid_request_new(s, model, 0, &req)) return -1;
    nereid_request_add_input(req, "INPUT0", NEREID_TYPE_FP32, shape, 2, input, sizeof input);
    nereid_error_t *err = nereid_server_infer_async(s, req, NULL, waiter_on_done, w);
    if (err) {
        nereid_error_free(err);
        nereid_request_free(req);
        return -1;
    }
    return 0;
}

static void latency(nereid_server_t *s, const char *model, int n)
{
    double *lat = calloc((size_t)n, sizeof *lat);
    waiter_t w;
    waiter_init(&w);
    for (int i = 0; i < n; i++) {
        double t0 = now_us();
        if (submit(s, model, &w)) abort();
        waiter_wait(&w, i + 1);
        lat[i] = now_us() - t0;
    }
    qsort(lat, (size_t)n, sizeof *lat, cmp_double);
    printf("  %-9s p50 %7.1f us  p99 %7.1f us  (%d failed)\n", model, lat[n / 2], lat[n * 99 / 100],
           w.failed);
    nereid_response_free(waiter_take(&w));
    free(lat);
}

static void throughput(nereid_server_t *s, const char *model, int n)
{
    waiter_t w;
    waiter_init(&w);
    double t0 = now_us();
    for (int i = 0; i < n; i++) {
        pthread_mutex_lock(&w.lock);
        while (i - w.done >= 16)
            pthread_cond_wait(&w.cond, &w.lock);
        pthread_mutex_unlock(&w.lock);
        if (submit(s, model, &w)) abort();
    }
    waiter_wait(&w, n);
    double secs = (now_us() - t0) / 1e6;
    printf("  %-9s %8.0f ensemble requests/s with 16 in flight (%d failed)\n", model, n / secs,
           w.failed);
    nereid_response_free(waiter_take(&w));
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 2000;
    if (n < 100) n = 100;
    make_repo();
    const char *load[] = {"*"};
    nereid_error_t *err;
    nereid_server_t *s = start_server(NEREID_MODEL_CONTROL_EXPLICIT, load, 1, 0, true, &err);
    if (err) {
        fprintf(stderr, "%s\n", nereid_error_message(err));
        return 1;
    }
    printf("latency, one request at a time, [1,%d] FP32:\n", WIDTH);
    latency(s, "identity", n);
    latency(s, "chain1", n);
    latency(s, "chain4", n);
    printf("throughput:\n");
    throughput(s, "chain4", n);

    long before = rss_kb();
    for (int i = 0; i < 50; i++) {
        nereid_error_t *e = nereid_server_load_model(s, "chain4", NULL, NULL, NULL, NULL, 0);
        if (!e) e = nereid_server_unload_model(s, "chain4", true);
        if (e) {
            fprintf(stderr, "%s\n", nereid_error_message(e));
            nereid_error_free(e);
            break;
        }
    }
    printf("RSS before 50 load/unload cycles %ld kB, after %ld kB\n", before, rss_kb());
    nereid_server_free(s);
    return remove_repo() ? 0 : 1;
}
