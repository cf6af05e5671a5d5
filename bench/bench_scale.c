/*
 * This file contains the many-models benchmark of issue 27: for each N it
 * writes a scratch repository of N small ONNX add_sub models (copies of
 * examples/models/add_sub_onnx, one CPU instance each, ONNX Runtime's shared
 * thread pools), starts build/nereid on it and reports the time from start
 * to /v2/health/ready and the server's CPU time until then (a steadier
 * number than the time on a shared machine), the resident memory and
 * thread count at ready (/proc/<pid>/status), the server's CPU over an idle
 * period right after ready (/proc/<pid>/stat utime + stime, in % of one
 * core) and the latency of the first request to the first model and then
 * to the last one (with `-- --model-control-mode=explicit
 * --model-load-on-demand=true` these include the loads; the first also the
 * backend's start). With -b it also runs the
 * memory-return burst: 32 HTTP/JSON requests of 1M FP32 values each, 8 at a
 * time, to an identity model, and prints the resident memory before the
 * burst, right after it and over the next 5 idle seconds. With -e K it then
 * sends one request to each of K more models in turn (with on-demand
 * loading and a budget: a load and an eviction each) and prints their mean
 * and worst latency and the RSS and threads after them. "after %" is the
 * server's CPU over 3 idle seconds after the first two requests (thread
 * pools that spin-wait after work show there). With -t the models are the
 * same add_sub as TorchScript, served by the pytorch backend; -c gives each
 * model that many instances (default 1).
 *
 * Usage (from the repository root, after `make models`):
 *   build/bench/bench_scale [-i idle_seconds] [-b] [-t] [-c instances] [-e K] [-s path/to/nereid]
 * [N ...]
 *                           [-- nereid flags]
 * Defaults: N = 10 100 1000, 10 idle seconds, this build's nereid (-s runs
 * another build, e.g. main's, with its own backends directory).
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_proc.h"

#define ADD_SUB_ONNX "examples/models/add_sub_onnx/1/model.onnx"
#define MAX_N 16
#define MAX_EXTRA 32
#define BURST_ELEMENTS (1 << 20)
#define BURST_REQUESTS 32
#define BURST_CONCURRENCY 8

static char nereid[512], backends[600];
static const char *extra[MAX_EXTRA];
static int n_extra;
static pid_t child;
static int evict_models; /* -e: requests to this many more models after the first two */

static void die(const char *what)
{
    fprintf(stderr, "bench_scale: %s: %s\n", what, strerror(errno));
    if (child > 0) kill(child, SIGKILL);
    exit(1);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void write_path(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len) die(path);
    fclose(f);
}

static char *read_path(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) die(path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = malloc((size_t)n + 1);
    if (!data || fread(data, 1, (size_t)n, f) != (size_t)n) die(path);
    fclose(f);
    *len = (size_t)n;
    return data;
}

static void make_dir(const char *path)
{
    if (mkdir(path, 0755) != 0 && errno != EEXIST) die(path);
}

/* ---- HTTP ---------------------------------------------------------------- */

/* Sends one request (body may be NULL) on a new connection and reads the
 * whole answer; returns its status (0 on a connection failure). */
static int http_call(int port, const char *method, const char *url, const char *body,
                     size_t body_len)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int status = 0;
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) goto done;
    char head[512];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, url, body ? body_len : 0);
    if (write(fd, head, (size_t)n) != n) goto done;
    for (size_t off = 0; body && off < body_len;) {
        ssize_t w = write(fd, body + off, body_len - off);
        if (w <= 0) goto done;
        off += (size_t)w;
    }
    static __thread char buf[1 << 16];
    size_t got = 0;
    char first[16] = {0};
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r <= 0) break;
        if (got < 12) memcpy(first + got, buf, (size_t)r < 12 - got ? (size_t)r : 12 - got);
        got += (size_t)r;
    }
    if (got >= 12) status = atoi(first + 9);
done:
    if (fd >= 0) close(fd);
    return status;
}

/* ---- The server ---------------------------------------------------------- */

static int start_server(const char *repo, int *port_out)
{
    int port = bench_free_port();
    char port_arg[32], grpc_arg[32], repo_arg[300];
    snprintf(port_arg, sizeof port_arg, "--http-port=%d", port);
    snprintf(grpc_arg, sizeof grpc_arg, "--grpc-port=%d", bench_free_port());
    snprintf(repo_arg, sizeof repo_arg, "--model-repository=%s", repo);
    const char *argv[16 + MAX_EXTRA];
    int argc = 0;
    argv[argc++] = nereid;
    argv[argc++] = repo_arg;
    argv[argc++] = backends;
    argv[argc++] = port_arg;
    argv[argc++] = grpc_arg;
    argv[argc++] = "--allow-metrics=false";
    argv[argc++] = "--log-info=false";
    for (int i = 0; i < n_extra; i++)
        argv[argc++] = extra[i];
    argv[argc] = NULL;
    child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1), dup2(null, 2);
        execv(nereid, (char *const *)argv);
        _exit(127);
    }
    *port_out = port;
    return child;
}

static void stop_server(void)
{
    kill(child, SIGINT);
    waitpid(child, NULL, 0);
    child = 0;
}

static bool wait_ready(int port, double limit_s)
{
    double end = now_s() + limit_s;
    while (now_s() < end) {
        if (http_call(port, "GET", "/v2/health/ready", NULL, 0) == 200) return true;
        if (waitpid(child, NULL, WNOHANG) == child) return false;
        sleep_s(0.002);
    }
    return false;
}

/* VmRSS in MiB and Threads of pid. */
static void proc_status(pid_t pid, double *rss_mib, long *threads)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    *rss_mib = 0;
    *threads = 0;
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        long v;
        if (sscanf(line, "VmRSS: %ld kB", &v) == 1) *rss_mib = (double)v / 1024.0;
        if (sscanf(line, "Threads: %ld", &v) == 1) *threads = v;
    }
    fclose(f);
}

static void remove_repo(const char *repo)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", repo);
    if (system(cmd) != 0) fprintf(stderr, "bench_scale: could not remove %s\n", repo);
}

/* ---- Many models ------------------------------------------------------- */

static const char add_sub_config[] =
    "name: \"%s\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 8\n"
    "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ 16 ] },\n"
    "        { name: \"INPUT1\" data_type: TYPE_FP32 dims: [ 16 ] } ]\n"
    "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ 16 ] },\n"
    "         { name: \"OUTPUT1\" data_type: TYPE_FP32 dims: [ 16 ] } ]\n"
    "instance_group [ { count: %d kind: KIND_CPU } ]\n";

/* -t: the same add_sub as TorchScript (tests/integration/pytorch_models.py
 * writes it; LibTorch's process-wide intra-op and inter-op pools). */
static const char pt_add_sub_config[] =
    "name: \"%s\"\nbackend: \"pytorch\"\nmax_batch_size: 0\n"
    "input [ { name: \"INPUT__0\" data_type: TYPE_FP32 dims: [ 16 ] },\n"
    "        { name: \"INPUT__1\" data_type: TYPE_FP32 dims: [ 16 ] } ]\n"
    "output [ { name: \"OUTPUT__0\" data_type: TYPE_FP32 dims: [ 16 ] },\n"
    "         { name: \"OUTPUT__1\" data_type: TYPE_FP32 dims: [ 16 ] } ]\n"
    "instance_group [ { count: %d kind: KIND_CPU } ]\n";

static const char pt_add_sub_request[] =
    "{\"inputs\":[{\"name\":\"INPUT__0\",\"datatype\":\"FP32\",\"shape\":[16],"
    "\"data\":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]},"
    "{\"name\":\"INPUT__1\",\"datatype\":\"FP32\",\"shape\":[16],"
    "\"data\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}]}";

static bool torch_models;      /* -t */
static int instance_count = 1; /* -c */
#define AFTER_IDLE_S 3.0       /* idle period measured after the first requests */

static const char add_sub_request[] =
    "{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"FP32\",\"shape\":[1,16],"
    "\"data\":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]},"
    "{\"name\":\"INPUT1\",\"datatype\":\"FP32\",\"shape\":[1,16],"
    "\"data\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}]}";

static void run_models(int n, double idle_s, const char *onnx, size_t onnx_len)
{
    char repo[64];
    snprintf(repo, sizeof repo, "/tmp/nereid-bench-scale-XXXXXX");
    if (!mkdtemp(repo)) die("mkdtemp");
    for (int i = 0; i < n; i++) {
        char name[32], path[256], config[1024];
        snprintf(name, sizeof name, "add_sub_%04d", i);
        snprintf(path, sizeof path, "%s/%s", repo, name);
        make_dir(path);
        snprintf(path, sizeof path, "%s/%s/1", repo, name);
        make_dir(path);
        snprintf(path, sizeof path, "%s/%s/1/model.%s", repo, name, torch_models ? "pt" : "onnx");
        write_path(path, onnx, onnx_len);
        snprintf(path, sizeof path, "%s/%s/config.pbtxt", repo, name);
        int len = snprintf(config, sizeof config, torch_models ? pt_add_sub_config : add_sub_config,
                           name, instance_count);
        write_path(path, config, (size_t)len);
    }
    int port;
    double t0 = now_s();
    pid_t pid = start_server(repo, &port);
    if (!wait_ready(port, 300)) {
        fprintf(stderr, "bench_scale: nereid did not become ready with %d models\n", n);
        stop_server();
        remove_repo(repo);
        exit(1);
    }
    double ready_s = now_s() - t0, rss;
    long threads;
    proc_status(pid, &rss, &threads);
    double cpu0 = bench_cpu_seconds(pid);
    sleep_s(idle_s);
    double cpu1 = bench_cpu_seconds(pid), rss_idle;
    long threads_idle;
    proc_status(pid, &rss_idle, &threads_idle);
    const char *body = torch_models ? pt_add_sub_request : add_sub_request;
    size_t body_len = strlen(body);
    double t1 = now_s();
    int status = http_call(port, "POST", "/v2/models/add_sub_0000/infer", body, body_len);
    double first_ms = (now_s() - t1) * 1e3;
    /* Another model's first request (with --model-load-on-demand: a load
     * without the backend's own start). */
    char url[64];
    snprintf(url, sizeof url, "/v2/models/add_sub_%04d/infer", n - 1);
    t1 = now_s();
    status = status == 200 ? http_call(port, "POST", url, body, body_len) : status;
    double other_ms = (now_s() - t1) * 1e3;
    /* Idle again after those requests: pools that spin after work show here. */
    double cpu2 = bench_cpu_seconds(pid);
    sleep_s(AFTER_IDLE_S);
    double cpu3 = bench_cpu_seconds(pid);
    printf("%6d %10.3f %9.2f %9.1f %8ld %12.2f %10.1f %9.2f %9.2f %9.2f%s\n", n, ready_s, cpu0, rss,
           threads, (cpu1 - cpu0) / idle_s * 100.0, rss_idle, first_ms, other_ms,
           (cpu3 - cpu2) / AFTER_IDLE_S * 100.0, status == 200 ? "" : "  (first request failed)");
    fflush(stdout);
    int k = evict_models < n - 1 ? evict_models : n - 1, failed = 0;
    double sum_ms = 0, max_ms = 0;
    for (int i = 1; i <= k; i++) {
        snprintf(url, sizeof url, "/v2/models/add_sub_%04d/infer", i);
        t1 = now_s();
        failed += http_call(port, "POST", url, body, body_len) != 200;
        double ms = (now_s() - t1) * 1e3;
        sum_ms += ms;
        max_ms = ms > max_ms ? ms : max_ms;
    }
    if (k > 0) {
        proc_status(pid, &rss, &threads);
        printf("       then %d more models, one request each: mean %.2f ms, worst %.2f ms, "
               "RSS %.1f MiB, %ld threads%s\n",
               k, sum_ms / k, max_ms, rss, threads, failed ? "  (some requests failed)" : "");
        fflush(stdout);
    }
    stop_server();
    remove_repo(repo);
}

/* ---- Memory return after a burst ---------------------------------------- */

static char *burst_body;
static size_t burst_len;
static int burst_port;
static _Atomic int burst_failed;

static void *burst_client(void *arg)
{
    (void)arg;
    for (int i = 0; i < BURST_REQUESTS / BURST_CONCURRENCY; i++)
        if (http_call(burst_port, "POST", "/v2/models/identity_fp32/infer", burst_body,
                      burst_len) != 200)
            burst_failed = 1;
    return NULL;
}

static void run_burst(void)
{
    char repo[64], path[256];
    snprintf(repo, sizeof repo, "/tmp/nereid-bench-scale-XXXXXX");
    if (!mkdtemp(repo)) die("mkdtemp");
    snprintf(path, sizeof path, "%s/identity_fp32", repo);
    make_dir(path);
    snprintf(path, sizeof path, "%s/identity_fp32/1", repo);
    make_dir(path);
    snprintf(path, sizeof path, "%s/identity_fp32/config.pbtxt", repo);
    static const char config[] =
        "name: \"identity_fp32\"\nbackend: \"identity\"\nmax_batch_size: 8\n"
        "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
        "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n";
    write_path(path, config, sizeof config - 1);

    size_t cap = (size_t)BURST_ELEMENTS * 12 + 256;
    burst_body = malloc(cap);
    if (!burst_body) die("malloc");
    size_t n = (size_t)snprintf(burst_body, cap,
                                "{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"FP32\","
                                "\"shape\":[1,%d],\"data\":[",
                                BURST_ELEMENTS);
    for (int i = 0; i < BURST_ELEMENTS; i++)
        n += (size_t)snprintf(burst_body + n, cap - n, "%s%g", i ? "," : "",
                              (double)(i % 1024) / 8.0);
    n += (size_t)snprintf(burst_body + n, cap - n, "]}]}");
    burst_len = n;

    pid_t pid = start_server(repo, &burst_port);
    if (!wait_ready(burst_port, 60)) {
        fprintf(stderr, "bench_scale: nereid did not become ready for the burst\n");
        stop_server();
        remove_repo(repo);
        exit(1);
    }
    sleep_s(1);
    double before, after;
    long threads;
    proc_status(pid, &before, &threads);
    double t0 = now_s();
    pthread_t clients[BURST_CONCURRENCY];
    for (int i = 0; i < BURST_CONCURRENCY; i++)
        if (pthread_create(&clients[i], NULL, burst_client, NULL) != 0) die("pthread_create");
    for (int i = 0; i < BURST_CONCURRENCY; i++)
        pthread_join(clients[i], NULL);
    double burst_s = now_s() - t0;
    proc_status(pid, &after, &threads);
    printf("\nburst: %d requests of %d FP32 values as JSON (%.1f MB each), %d at a time, "
           "%.2f s%s\n",
           BURST_REQUESTS, BURST_ELEMENTS, (double)burst_len / 1e6, BURST_CONCURRENCY, burst_s,
           burst_failed ? " (some requests FAILED)" : "");
    printf("RSS MiB: before %.1f, right after %.1f", before, after);
    for (int s = 1; s <= 5; s++) {
        sleep_s(1);
        proc_status(pid, &after, &threads);
        printf(", +%ds %.1f", s, after);
    }
    printf("\n");
    stop_server();
    remove_repo(repo);
    free(burst_body);
}

int main(int argc, char **argv)
{
    int counts[MAX_N], n_counts = 0;
    double idle_s = 10;
    bool burst = false;
    const char *server = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) {
            for (i++; i < argc && n_extra < MAX_EXTRA; i++)
                extra[n_extra++] = argv[i];
            break;
        }
        if (!strcmp(argv[i], "-i") && i + 1 < argc)
            idle_s = atof(argv[++i]);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc)
            server = argv[++i];
        else if (!strcmp(argv[i], "-b"))
            burst = true;
        else if (!strcmp(argv[i], "-t"))
            torch_models = true;
        else if (!strcmp(argv[i], "-c") && i + 1 < argc && atoi(argv[i + 1]) > 0)
            instance_count = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-e") && i + 1 < argc)
            evict_models = atoi(argv[++i]);
        else if (atoi(argv[i]) > 0 && n_counts < MAX_N)
            counts[n_counts++] = atoi(argv[i]);
        else {
            fprintf(stderr,
                    "usage: %s [-i idle_seconds] [-b] [-t] [-c instances] [-e K] [-s "
                    "path/to/nereid] [N ...] "
                    "[-- nereid flags]\n",
                    argv[0]);
            return 2;
        }
    }
    if (idle_s <= 0) return 2;
    if (n_counts == 0) {
        counts[n_counts++] = 10;
        counts[n_counts++] = 100;
        counts[n_counts++] = 1000;
    }
    if (server) {
        snprintf(nereid, sizeof nereid, "%s", server);
    } else {
        ssize_t len = readlink("/proc/self/exe", nereid, sizeof nereid - 16);
        if (len < 0) die("readlink");
        nereid[len] = 0;
        *strrchr(nereid, '/') = 0;
        strcat(nereid, "/../nereid");
    }
    char *slash = strrchr(nereid, '/');
    snprintf(backends, sizeof backends, "--backend-directory=%.*s/backends",
             slash ? (int)(slash - nereid) : 1, slash ? nereid : ".");
    signal(SIGPIPE, SIG_IGN);

    size_t onnx_len;
    char *onnx;
    if (torch_models) {
        char dir[] = "/tmp/nereid-bench-scale-pt-XXXXXX", cmd[256], path[128];
        if (!mkdtemp(dir)) die("mkdtemp");
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/python3 tests/integration/pytorch_models.py %s pt_add_sub", dir);
        if (system(cmd) != 0) {
            fprintf(stderr, "bench_scale: TorchScript model generation failed\n");
            return 1;
        }
        snprintf(path, sizeof path, "%s/pt_add_sub/1/model.pt", dir);
        onnx = read_path(path, &onnx_len);
        remove_repo(dir);
    } else {
        onnx = read_path(ADD_SUB_ONNX, &onnx_len);
    }
    printf("bench_scale: %s, add_sub %s models (%d instance%s each), %.0f s idle after ready, %.0f "
           "s after the first "
           "requests\n\n",
           nereid, torch_models ? "TorchScript" : "ONNX", instance_count,
           instance_count == 1 ? "" : "s", idle_s, AFTER_IDLE_S);
    printf("%6s %10s %9s %9s %8s %12s %10s %9s %9s %9s\n", "models", "ready s", "CPU s", "RSS MiB",
           "threads", "idle CPU %", "idle RSS", "first ms", "other ms", "after %");
    for (int i = 0; i < n_counts; i++)
        run_models(counts[i], idle_s, onnx, onnx_len);
    free(onnx);
    if (burst) run_burst();
    return 0;
}
