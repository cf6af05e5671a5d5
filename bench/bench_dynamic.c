/*
 * This file contains the dynamic batching benchmark: two ONNX models with
 * [1,256] FP32 requests — "small", a 256x256 MatMul+Add, and "large", a
 * 256->4096->256 MatMul+Add pair with 8 MB of weights — each served by
 * build/nereid (one instance, one intra-op thread) over HTTP to 16 concurrent
 * keep-alive clients (binary tensor extension), once without batching
 * (default scheduler) and once with dynamic_batching (preferred size 16, no
 * delay), and, in the same run, raw ONNX Runtime Run calls on the same model
 * at batch 16 (the offline ceiling) and batch 1. It prints throughput
 * (inferences/s), p50/p99 latency, the average dynamic batch and the ratios.
 *
 *   build/bench/bench_dynamic [seconds per mode [clients]]
 *       (default 5 s and 16 clients, at most 64; run from the repo root)
 *
 * With C closed-loop clients and one instance that never waits, a client can
 * be in at most every other batch (its next request cannot arrive before
 * the batch after its own has started), so batches average at most C/2:
 * the raw run at batch min(C/2, 16) is the ceiling for that load, printed
 * next to the offline one.
 *
 * The model files come from bench/matmul_model.py (/usr/bin/python3, onnx).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../backends/onnxruntime/ort_api.h"
#include "../tests/unit/test_util.h"

#define MAX_CLIENTS 64
#define WIDTH 256
#define RAW_BATCH 16
#define MAX_SAMPLES (1u << 21)

typedef struct result {
    const char *name;
    double per_sec; /* inferences (batch elements) per second */
    double p50_us, p99_us;
} result_t;

/* Sorts lat (n samples) and fills the percentiles. */
static void percentiles(result_t *r, uint64_t *lat, size_t n)
{
    if (!n) return;
    qsort(lat, n, sizeof *lat, cmp_u64);
    r->p50_us = (double)lat[n / 2] / 1000.0;
    r->p99_us = (double)lat[(size_t)((double)(n - 1) * 0.99)] / 1000.0;
}

/* ---- HTTP client ---- */

static int n_clients = 16; /* concurrent closed-loop clients */

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

static int connect_port(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads one HTTP/1.1 response on fd into buf; returns the status code (-1 on
 * error); *body_len gets the Content-Length. */
static int read_response(int fd, char *buf, size_t cap, size_t *body_len)
{
    size_t have = 0;
    char *end = NULL;
    while (!end) {
        if (have + 1 >= cap) return -1;
        ssize_t r = read(fd, buf + have, cap - 1 - have);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        have += (size_t)r;
        buf[have] = 0;
        end = strstr(buf, "\r\n\r\n");
    }
    int status = atoi(buf + 9);
    const char *cl = strcasestr(buf, "\r\nContent-Length:");
    size_t len = cl ? strtoul(cl + 17, NULL, 10) : 0;
    size_t head = (size_t)(end + 4 - buf);
    if (head + len >= cap) return -1;
    while (have < head + len) {
        ssize_t r = read(fd, buf + have, cap - 1 - have);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        have += (size_t)r;
    }
    *body_len = len;
    return status;
}

typedef struct client {
    pthread_t thread;
    int port;
    const char *model;
    _Atomic bool *stop;
    _Atomic bool *measure;
    uint64_t *lat; /* MAX_SAMPLES / n_clients */
    size_t n_lat;
    size_t errors;
} client_t;

static void *client_main(void *arg)
{
    client_t *c = arg;
    int fd = connect_port(c->port);
    if (fd < 0) {
        c->errors++;
        return NULL;
    }
    char json[512];
    int jlen = snprintf(json, sizeof json,
                        "{\"inputs\":[{\"name\":\"INPUT0\",\"shape\":[1,%d],\"datatype\":\"FP32\","
                        "\"parameters\":{\"binary_data_size\":%d}}],\"outputs\":[{\"name\":"
                        "\"OUTPUT0\",\"parameters\":{\"binary_data\":true}}]}",
                        WIDTH, WIDTH * 4);
    size_t body = (size_t)jlen + WIDTH * 4;
    char *req = malloc(1024 + body);
    int hlen = snprintf(req, 1024,
                        "POST /v2/models/%s/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        "Content-Type: application/octet-stream\r\n"
                        "Inference-Header-Content-Length: %d\r\nContent-Length: %zu\r\n\r\n",
                        c->model, jlen, body);
    memcpy(req + hlen, json, (size_t)jlen);
    float *x = (float *)(req + hlen + jlen);
    for (int i = 0; i < WIDTH; i++)
        x[i] = (float)(i % 7) * 0.25f;
    size_t req_len = (size_t)hlen + body;
    size_t cap = 64 * 1024;
    char *buf = malloc(cap);
    size_t max_lat = MAX_SAMPLES / (size_t)n_clients;
    while (!atomic_load(c->stop)) {
        uint64_t t0 = now_ns();
        size_t len;
        if (write_all(fd, req, req_len) != 0 || read_response(fd, buf, cap, &len) != 200 ||
            len < WIDTH * 4) {
            c->errors++;
            break;
        }
        uint64_t dt = now_ns() - t0;
        if (atomic_load(c->measure) && c->n_lat < max_lat) c->lat[c->n_lat++] = dt;
    }
    free(buf);
    free(req);
    close(fd);
    return NULL;
}

/* 16 clients against model for warm + secs seconds; measures the last secs. */
static int run_http(int port, const char *model, double secs, result_t *r)
{
    _Atomic bool stop = false, measure = false;
    client_t cl[MAX_CLIENTS];
    uint64_t *lat = malloc(MAX_SAMPLES * sizeof *lat);
    for (int i = 0; i < n_clients; i++) {
        cl[i] = (client_t){.port = port,
                           .model = model,
                           .stop = &stop,
                           .measure = &measure,
                           .lat = lat + (size_t)i * (MAX_SAMPLES / (size_t)n_clients)};
        pthread_create(&cl[i].thread, NULL, client_main, &cl[i]);
    }
    usleep(500000);
    atomic_store(&measure, true);
    uint64_t t0 = now_ns();
    usleep((useconds_t)(secs * 1e6));
    atomic_store(&measure, false);
    uint64_t t1 = now_ns();
    atomic_store(&stop, true);
    size_t total = 0, errors = 0;
    for (int i = 0; i < n_clients; i++) {
        pthread_join(cl[i].thread, NULL);
        errors += cl[i].errors;
    }
    /* Compact the per-client samples. */
    for (int i = 0; i < n_clients; i++) {
        memmove(lat + total, cl[i].lat, cl[i].n_lat * sizeof *lat);
        total += cl[i].n_lat;
    }
    r->name = model;
    r->per_sec = (double)total / ((double)(t1 - t0) / 1e9);
    percentiles(r, lat, total);
    free(lat);
    if (errors) fprintf(stderr, "bench_dynamic: %zu client errors on %s\n", errors, model);
    return errors ? -1 : 0;
}

/* ---- raw ORT ---- */

static int ort_ok(const ort_api_t *api, OrtStatus *st)
{
    if (!st) return 0;
    fprintf(stderr, "bench_dynamic: onnx runtime error: %s\n", api->GetErrorMessage(st));
    api->ReleaseStatus(st);
    return -1;
}

/* Runs the model at batch for secs seconds in this thread. */
static int run_raw(const char *model_path, int batch, double secs, result_t *r)
{
    char lib[PATH_MAX], err[512];
    const char *env = getenv("NEREID_ORT_LIBRARY");
    snprintf(lib, sizeof lib, "%s",
             env && *env ? env : NEREID_DEFAULT_BACKEND_DIR "/libonnxruntime.so.1");
    ort_api_t api;
    if (ort_api_load(&api, lib, err, sizeof err) != 0) {
        fprintf(stderr, "bench_dynamic: %s\n", err);
        return -1;
    }
    OrtEnv *env_ = NULL;
    OrtSessionOptions *opts = NULL;
    OrtSession *session = NULL;
    OrtMemoryInfo *info = NULL;
    int rc = ort_ok(&api, api.CreateEnv(ORT_LOG_WARNING, "bench", &env_));
    if (!rc) rc = ort_ok(&api, api.CreateSessionOptions(&opts));
    if (!rc) rc = ort_ok(&api, api.SetIntraOpNumThreads(opts, 1));
    if (!rc) rc = ort_ok(&api, api.CreateSession(env_, model_path, opts, &session));
    if (!rc)
        rc =
            ort_ok(&api, api.CreateCpuMemoryInfo(ORT_ARENA_ALLOCATOR, ORT_MEM_TYPE_DEFAULT, &info));
    float *in = calloc((size_t)batch * WIDTH, sizeof *in);
    float *out = calloc((size_t)batch * WIDTH, sizeof *out);
    for (int i = 0; i < batch * WIDTH; i++)
        in[i] = (float)(i % 7) * 0.25f;
    int64_t shape[2] = {batch, WIDTH};
    size_t bytes = (size_t)batch * WIDTH * sizeof(float);
    const char *in_names[] = {"INPUT0"}, *out_names[] = {"OUTPUT0"};
    uint64_t *lat = malloc(MAX_SAMPLES * sizeof *lat);
    size_t n = 0;
    uint64_t t0 = now_ns(), t_measure = t0 + 500000000u, t_end = t_measure + (uint64_t)(secs * 1e9);
    uint64_t t_start = 0, runs = 0;
    while (!rc) {
        uint64_t a = now_ns();
        if (a >= t_end) break;
        if (!t_start && a >= t_measure) t_start = a;
        OrtValue *x = NULL, *y = NULL;
        rc = ort_ok(&api, api.CreateTensorWithDataAsOrtValue(info, in, bytes, shape, 2,
                                                             ORT_ELEM_FLOAT, &x));
        if (!rc)
            rc = ort_ok(&api, api.CreateTensorWithDataAsOrtValue(info, out, bytes, shape, 2,
                                                                 ORT_ELEM_FLOAT, &y));
        if (!rc)
            rc = ort_ok(&api, api.Run(session, NULL, in_names, (const OrtValue *const *)&x, 1,
                                      out_names, 1, &y));
        if (x) api.ReleaseValue(x);
        if (y) api.ReleaseValue(y);
        if (t_start) {
            if (n < MAX_SAMPLES) lat[n++] = now_ns() - a;
            runs++;
        }
    }
    uint64_t t1 = now_ns();
    r->per_sec = t_start ? (double)(runs * (uint64_t)batch) / ((double)(t1 - t_start) / 1e9) : 0;
    percentiles(r, lat, n);
    free(lat);
    free(in);
    free(out);
    if (info) api.ReleaseMemoryInfo(info);
    if (session) api.ReleaseSession(session);
    if (opts) api.ReleaseSessionOptions(opts);
    if (env_) api.ReleaseEnv(env_);
    ort_api_unload(&api);
    return rc;
}

/* inference_count / execution_count from the model's statistics. */
static double average_batch(int port, const char *model)
{
    int fd = connect_port(port);
    if (fd < 0) return 0;
    char q[256], buf[65536];
    snprintf(q, sizeof q, "GET /v2/models/%s/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", model);
    size_t len;
    int status = write_all(fd, q, strlen(q)) == 0 ? read_response(fd, buf, sizeof buf, &len) : -1;
    close(fd);
    if (status != 200) return 0;
    const char *inf = strstr(buf, "\"inference_count\":"),
               *exe = strstr(buf, "\"execution_count\":");
    if (!inf || !exe) return 0;
    double n_inf = atof(inf + 18), n_exe = atof(exe + 18);
    return n_exe > 0 ? n_inf / n_exe : 0;
}

/* ---- the server process ---- */

static pid_t spawn_server(const char *nereid, const char *model_repo, int http, int grpc,
                          int metrics)
{
    char a[5][PATH_MAX + 32];
    snprintf(a[0], sizeof a[0], "--model-repository=%s", model_repo);
    snprintf(a[1], sizeof a[1], "--http-port=%d", http);
    snprintf(a[2], sizeof a[2], "--grpc-port=%d", grpc);
    snprintf(a[3], sizeof a[3], "--metrics-port=%d", metrics);
    snprintf(a[4], sizeof a[4], "--http-address=127.0.0.1");
    pid_t pid = fork();
    if (pid == 0) {
        execl(nereid, nereid, a[0], a[1], a[2], a[3], a[4], "--grpc-address=127.0.0.1",
              (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Waits (60 s at most) until GET /v2/health/ready answers 200. */
static bool wait_ready(int port, pid_t pid)
{
    for (int i = 0; i < 3000; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid) return false;
        int fd = connect_port(port);
        if (fd >= 0) {
            const char *q = "GET /v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
            char buf[4096];
            size_t len;
            int status =
                write_all(fd, q, strlen(q)) == 0 ? read_response(fd, buf, sizeof buf, &len) : -1;
            close(fd);
            if (status == 200) return true;
        }
        usleep(20000);
    }
    return false;
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 5.0;
    if (secs <= 0) secs = 5.0;
    if (argc > 2) n_clients = atoi(argv[2]);
    if (n_clients < 1 || n_clients > MAX_CLIENTS) {
        fprintf(stderr, "bench_dynamic: clients must be 1..%d\n", MAX_CLIENTS);
        return 2;
    }
    int bound_batch = n_clients / 2 < RAW_BATCH ? (n_clients / 2 ? n_clients / 2 : 1) : RAW_BATCH;
    signal(SIGPIPE, SIG_IGN);
    char dir[] = "/tmp/nereid-bench-dynamic-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    char cmd[PATH_MAX * 2];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 bench/matmul_model.py %s", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "bench_dynamic: %s failed (run from the repo root)\n", cmd);
        return 1;
    }
    char model_repo[PATH_MAX], nereid[PATH_MAX];
    snprintf(model_repo, sizeof model_repo, "%s/repo", dir);
    const char *build = getenv("NEREID_BUILD");
    snprintf(nereid, sizeof nereid, "%s/nereid", build && *build ? build : "build");

    int http = free_port(), grpc = free_port(), metrics = free_port();
    pid_t pid = spawn_server(nereid, model_repo, http, grpc, metrics);
    int rc = 1;
    if (pid < 0 || !wait_ready(http, pid)) {
        fprintf(stderr, "bench_dynamic: %s did not become ready\n", nereid);
        goto out;
    }
    static const struct {
        const char *size, *what;
    } models[] = {{"small", "256x256 MatMul+Add"},
                  {"large", "256x4096 MatMul+Add, 4096x256 MatMul+Add (8 MB of weights)"}};
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
        char nobatch[64], dynamic[64], onnx[PATH_MAX + 16];
        snprintf(nobatch, sizeof nobatch, "%s_nobatch", models[m].size);
        snprintf(dynamic, sizeof dynamic, "%s_dynamic", models[m].size);
        snprintf(onnx, sizeof onnx, "%s/%s.onnx", dir, models[m].size);
        printf("\n%s: %s, [1,256] FP32 per request, %d HTTP clients, %.1f s per mode\n",
               models[m].size, models[m].what, n_clients, secs);
        result_t res[5] = {{0}};
        if (run_http(http, nobatch, secs, &res[0]) != 0) goto out;
        res[0].name = "HTTP, no batching";
        if (run_http(http, dynamic, secs, &res[1]) != 0) goto out;
        res[1].name = "HTTP, dynamic batching";
        double avg_batch = average_batch(http, dynamic);
        if (run_raw(onnx, RAW_BATCH, secs, &res[2]) != 0) goto out;
        res[2].name = "raw ORT Run, batch 16";
        if (run_raw(onnx, 1, secs, &res[3]) != 0) goto out;
        res[3].name = "raw ORT Run, batch 1";
        if (run_raw(onnx, bound_batch, secs, &res[4]) != 0) goto out;
        char bound_name[40];
        snprintf(bound_name, sizeof bound_name, "raw ORT Run, batch %d", bound_batch);
        res[4].name = bound_name;
        printf("%-24s %14s %10s %10s\n", "mode", "inferences/s", "p50 us", "p99 us");
        for (int i = 0; i < 5; i++)
            printf("%-24s %14.0f %10.1f %10.1f\n", res[i].name, res[i].per_sec, res[i].p50_us,
                   res[i].p99_us);
        printf("dynamic batching: average batch %.1f\n", avg_batch);
        printf("dynamic / no batching:      %.2fx\n", res[1].per_sec / res[0].per_sec);
        printf("dynamic / raw batch 16:     %.1f%% (target >= 85%%)\n",
               100.0 * res[1].per_sec / res[2].per_sec);
        printf("raw batch %d / raw batch 16: %.1f%% (ceiling for %d closed-loop clients)\n",
               bound_batch, 100.0 * res[4].per_sec / res[2].per_sec, n_clients);
        printf("dynamic / raw batch %d:      %.1f%%\n", bound_batch,
               100.0 * res[1].per_sec / res[4].per_sec);
        fflush(stdout);
    }
    rc = 0;
out:
    if (pid > 0) {
        kill(pid, SIGINT);
        waitpid(pid, NULL, 0);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "bench_dynamic: could not remove %s\n", dir);
    return rc;
}
