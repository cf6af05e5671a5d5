/*
 * This file contains the JSON tensor benchmark of issue 16: one or more
 * build/nereid binaries (e.g. today's tree and an older one) are started as
 * separate servers on a scratch repository of identity models, one per
 * datatype, and wrk drives each at 1 connection in turn (server A, server B,
 * A, B, ... for every case and round), so every ratio comes from one run on
 * the same machine. Cases, each a [1,65536] tensor echoed back as JSON: FP32
 * short decimals ((i % 1024) / 8), FP32 random (17-digit doubles, as Triton
 * prints FP32), FP64 random, every integer type over its full range, BOOL,
 * BYTES (short strings); plus FP32[1,65536] with the binary extension, which
 * is also sent to an in-process libmicrohttpd echo server (the floor: the
 * same MHD options as src/http/http_server.c, the body accumulated and sent
 * back without a copy), and the ratio binary identity / echo is printed.
 * Per case it prints req/s, p50 and the server's CPU time per request
 * (utime + stime from /proc, less sensitive to the machine's load), medians
 * over the rounds, and the rate ratio of each server to the first.
 *
 * Usage: build/bench/bench_json [-s seconds] [-r rounds] [-c case,...]
 *                               [label=path/to/nereid ...]
 * Without servers it runs this build's nereid (label "new"). Needs wrk.
 */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <microhttpd.h>
#include <netinet/in.h>
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

#define N_ELEMENTS 65536
#define MAX_SERVERS 4
#define MAX_ROUNDS 16

static char repo[256];
static int seconds = 2, rounds = 3;
static pid_t children[8];
static int n_children;

/* Stops the servers this process started (also when it exits on an error). */
static void stop_children(void)
{
    for (int i = 0; i < n_children; i++) {
        kill(children[i], SIGTERM);
        waitpid(children[i], NULL, 0);
    }
    n_children = 0;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_json: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void write_path(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len) die(path);
    fclose(f);
}

/* ---- Cases ------------------------------------------------------------- */

typedef enum { K_FP32_SHORT, K_FP32_RAND, K_FP64, K_INT, K_UINT, K_BOOL, K_BYTES, K_BINARY } kind_t;

typedef struct bench_case {
    const char *name;     /* case name (-c) */
    const char *datatype; /* model input/output datatype */
    kind_t kind;
    int bits; /* integers: width */
    char script[512];
} bench_case_t;

static bench_case_t cases[] = {
    {"fp32_short", "FP32", K_FP32_SHORT, 0, ""}, {"fp32_rand", "FP32", K_FP32_RAND, 0, ""},
    {"fp64_rand", "FP64", K_FP64, 0, ""},        {"int8", "INT8", K_INT, 8, ""},
    {"int16", "INT16", K_INT, 16, ""},           {"int32", "INT32", K_INT, 32, ""},
    {"int64", "INT64", K_INT, 64, ""},           {"uint8", "UINT8", K_UINT, 8, ""},
    {"uint16", "UINT16", K_UINT, 16, ""},        {"uint32", "UINT32", K_UINT, 32, ""},
    {"uint64", "UINT64", K_UINT, 64, ""},        {"bool", "BOOL", K_BOOL, 0, ""},
    {"bytes", "BYTES", K_BYTES, 0, ""},          {"fp32_binary", "FP32", K_BINARY, 0, ""},
};
#define N_CASES (sizeof cases / sizeof cases[0])

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static uint64_t next_rand(void)
{
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return rng * 2685821657736338717ULL;
}

/* Writes the request body of c; returns the Inference-Header-Content-Length
 * (-1 for a JSON-only body). */
static long write_body(const bench_case_t *c, const char *path)
{
    size_t cap = (size_t)N_ELEMENTS * 32 + 512, len = 0;
    char *b = malloc(cap);
    if (!b) die("malloc");
    if (c->kind == K_BINARY) {
        len = (size_t)snprintf(b, cap,
                               "{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"FP32\","
                               "\"shape\":[1,%d],\"parameters\":{\"binary_data_size\":%d}}],"
                               "\"parameters\":{\"binary_data_output\":true}}",
                               N_ELEMENTS, N_ELEMENTS * 4);
        long header = (long)len;
        for (int i = 0; i < N_ELEMENTS; i++) {
            float f = (float)i * 0.5f;
            memcpy(b + len, &f, 4);
            len += 4;
        }
        write_path(path, b, len);
        free(b);
        return header;
    }
    len = (size_t)snprintf(b, cap,
                           "{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"%s\","
                           "\"shape\":[1,%d],\"data\":[",
                           c->datatype, N_ELEMENTS);
    for (int i = 0; i < N_ELEMENTS; i++) {
        uint64_t r = next_rand();
        double u = (double)(r >> 11) * 0x1p-53 * 2 - 1; /* [-1, 1) */
        if (i) b[len++] = ',';
        char *o = b + len;
        size_t room = cap - len;
        switch (c->kind) {
        case K_FP32_SHORT:
            len += (size_t)snprintf(o, room, "%g", (double)(i % 1024) / 8);
            break;
        case K_FP32_RAND:
            len += (size_t)snprintf(o, room, "%.17g", (double)(float)(u * 1000));
            break;
        case K_FP64:
            len += (size_t)snprintf(o, room, "%.17g", u * 1000);
            break;
        case K_INT: {
            int64_t v = (int64_t)r >> (64 - c->bits);
            len += (size_t)snprintf(o, room, "%lld", (long long)v);
            break;
        }
        case K_UINT: {
            uint64_t v = r >> (64 - c->bits);
            len += (size_t)snprintf(o, room, "%llu", (unsigned long long)v);
            break;
        }
        case K_BOOL:
            len += (size_t)snprintf(o, room, "%s", r >> 63 ? "true" : "false");
            break;
        default:
            len += (size_t)snprintf(o, room, "\"item%u\"", (unsigned)(r >> 44));
            break;
        }
    }
    len += (size_t)snprintf(b + len, cap - len, "]}]}");
    write_path(path, b, len);
    free(b);
    return -1;
}

static void write_script(bench_case_t *c)
{
    char body[400], lua[2048];
    snprintf(body, sizeof body, "%s/%s.body", repo, c->name);
    long ihcl = write_body(c, body);
    int n = snprintf(lua, sizeof lua,
                     "local f = assert(io.open(\"%s\", \"rb\"))\n"
                     "wrk.method = \"POST\"\nwrk.body = f:read(\"*a\")\nf:close()\n",
                     body);
    if (ihcl >= 0)
        n += snprintf(lua + n, sizeof lua - (size_t)n,
                      "wrk.headers[\"Inference-Header-Content-Length\"] = \"%ld\"\n"
                      "wrk.headers[\"Content-Type\"] = \"application/octet-stream\"\n",
                      ihcl);
    snprintf(c->script, sizeof c->script, "%s/%s.lua", repo, c->name);
    write_path(c->script, lua, (size_t)n);
}

static void write_models(void)
{
    for (size_t i = 0; i < N_CASES; i++) {
        const bench_case_t *c = &cases[i];
        if (c->kind == K_BINARY || c->kind == K_FP32_RAND) continue; /* fp32_short's model */
        char dir[512], cfg[1024];
        snprintf(dir, sizeof dir, "%s/id_%s", repo, c->datatype);
        mkdir(dir, 0755);
        snprintf(cfg, sizeof cfg, "%s/1", dir);
        mkdir(cfg, 0755);
        int n = snprintf(cfg, sizeof cfg,
                         "name: \"id_%s\"\nbackend: \"identity\"\nmax_batch_size: 8\n"
                         "input [ { name: \"INPUT0\" data_type: TYPE_%s dims: [ -1 ] } ]\n"
                         "output [ { name: \"OUTPUT0\" data_type: TYPE_%s dims: [ -1 ] } ]\n",
                         c->datatype, c->kind == K_BYTES ? "STRING" : c->datatype,
                         c->kind == K_BYTES ? "STRING" : c->datatype);
        strcat(dir, "/config.pbtxt");
        write_path(dir, cfg, (size_t)n);
    }
}

/* ---- Servers ------------------------------------------------------------ */

typedef struct server {
    const char *label;
    const char *path; /* nereid binary; NULL for the echo floor */
    pid_t pid;
    int port;
} server_t;

/* True once GET url answers 200. */
static bool http_ok(int port, const char *url)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bool ok = false;
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        char req[256], resp[64] = {0};
        int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                         url);
        if (write(fd, req, (size_t)n) == n && read(fd, resp, sizeof resp - 1) > 12)
            ok = !strncmp(resp + 9, "200", 3);
    }
    if (fd >= 0) close(fd);
    return ok;
}

static void start_server(server_t *s)
{
    s->port = bench_free_port();
    char port[32], grpc[32], repo_arg[300], backends[600];
    snprintf(port, sizeof port, "--http-port=%d", s->port);
    snprintf(grpc, sizeof grpc, "--grpc-port=%d", bench_free_port());
    snprintf(repo_arg, sizeof repo_arg, "--model-repository=%s", repo);
    snprintf(backends, sizeof backends, "--backend-directory=%s", s->path);
    char *slash = strrchr(backends, '/');
    if (!slash) die("server path needs a directory");
    strcpy(slash, "/backends");
    s->pid = fork();
    if (s->pid < 0) die("fork");
    if (s->pid == 0) {
        int null = open("/dev/null", 1);
        dup2(null, 1), dup2(null, 2);
        execl(s->path, s->path, repo_arg, backends, port, grpc, "--allow-metrics=false",
              "--http-thread-count=2", "--log-info=false", (char *)NULL);
        _exit(127);
    }
    children[n_children++] = s->pid;
    for (int i = 0; i < 600; i++) {
        if (http_ok(s->port, "/v2/health/ready")) return;
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "bench_json: %s did not become ready\n", s->path);
    exit(1);
}

/* ---- The echo floor ------------------------------------------------------ */

typedef struct echo_conn {
    char *data;
    size_t len, cap;
} echo_conn_t;

static enum MHD_Result echo_request(void *cls, struct MHD_Connection *mc, const char *url,
                                    const char *method, const char *version,
                                    const char *upload_data, size_t *upload_data_size,
                                    void **con_cls)
{
    (void)cls, (void)url, (void)method, (void)version;
    echo_conn_t *c = *con_cls;
    if (!c) {
        if (!(c = calloc(1, sizeof *c))) return MHD_NO;
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Length");
        c->cap = cl ? strtoull(cl, NULL, 10) : 0;
        if (c->cap && !(c->data = malloc(c->cap))) return MHD_NO;
        *con_cls = c;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        if (c->len + n > c->cap) {
            size_t cap = c->cap ? c->cap * 2 : 4096;
            while (cap < c->len + n)
                cap *= 2;
            char *p = realloc(c->data, cap);
            if (!p) return MHD_NO;
            c->data = p, c->cap = cap;
        }
        memcpy(c->data + c->len, upload_data, n);
        c->len += n;
        *upload_data_size = 0;
        return MHD_YES;
    }
    /* The body goes back as it came, handed over without a copy. */
    struct MHD_Response *r =
        MHD_create_response_from_buffer_with_free_callback_cls(c->len, c->data, free, c->data);
    c->data = NULL;
    const char *ihcl =
        MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Inference-Header-Content-Length");
    if (ihcl) MHD_add_response_header(r, "Inference-Header-Content-Length", ihcl);
    MHD_add_response_header(r, "Content-Type", "application/octet-stream");
    enum MHD_Result ret = MHD_queue_response(mc, 200, r);
    MHD_destroy_response(r);
    return ret;
}

static void echo_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                           enum MHD_RequestTerminationCode toe)
{
    (void)cls, (void)mc, (void)toe;
    echo_conn_t *c = *con_cls;
    if (c) free(c->data), free(c);
    *con_cls = NULL;
}

/* Options as src/http/http_server.c's http_server_start sets them for a
 * loopback server (keep in step with it). */
static struct MHD_Daemon *start_echo(server_t *s)
{
    s->port = bench_free_port();
    s->pid = 0;
    return MHD_start_daemon(
        MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG,
        (uint16_t)s->port, NULL, NULL, echo_request, NULL, MHD_OPTION_NOTIFY_COMPLETED,
        echo_completed, NULL, MHD_OPTION_CONNECTION_TIMEOUT, 60u, MHD_OPTION_THREAD_POOL_SIZE, 2u,
        MHD_OPTION_END);
}

/* ---- Runs ------------------------------------------------------------------ */

typedef struct sample {
    double rps, p50_us, cpu_us;
} sample_t;

static double to_us(double v, const char *unit)
{
    if (!strcmp(unit, "ms")) return v * 1e3;
    if (!strcmp(unit, "s")) return v * 1e6;
    return v;
}

static sample_t run_wrk(const server_t *s, const bench_case_t *c)
{
    char cmd[1024], url[128];
    if (!s->path)
        snprintf(url, sizeof url, "/echo");
    else
        snprintf(url, sizeof url, "/v2/models/id_%s/infer", c->datatype);
    snprintf(cmd, sizeof cmd, "wrk -t1 -c1 -d%ds --latency -s %s http://127.0.0.1:%d%s 2>&1",
             seconds, c->script, s->port, url);
    double cpu0 = bench_cpu_seconds(s->pid);
    FILE *p = popen(cmd, "r");
    if (!p) die("wrk");
    sample_t r = {0};
    double n = 0;
    char line[512];
    bool bad = false;
    while (fgets(line, sizeof line, p)) {
        double v;
        char unit[8];
        if (sscanf(line, " 50%% %lf%7[a-z]", &v, unit) == 2)
            r.p50_us = to_us(v, unit);
        else if (sscanf(line, "Requests/sec: %lf", &v) == 1)
            r.rps = v;
        else if (sscanf(line, " %lf requests in", &v) == 1)
            n = v;
        else if (strstr(line, "Non-2xx") || strstr(line, "Socket errors"))
            bad = true, fprintf(stderr, "bench_json: %s %s: %s", s->label, c->name, line);
    }
    if (pclose(p) != 0 || r.rps == 0 || bad) {
        fprintf(stderr, "bench_json: wrk failed: %s\n", cmd);
        exit(1);
    }
    r.cpu_us = n > 0 ? (bench_cpu_seconds(s->pid) - cpu0) * 1e6 / n : 0;
    return r;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static bool case_selected(const char *list, const char *name)
{
    if (!list) return true;
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)); p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == 0)) return true;
    return false;
}

int main(int argc, char **argv)
{
    server_t servers[MAX_SERVERS + 1];
    int n_servers = 0;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-s") && i + 1 < argc)
            seconds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-c") && i + 1 < argc)
            only = argv[++i];
        else if (strchr(argv[i], '=') && n_servers < MAX_SERVERS) {
            char *eq = strchr(argv[i], '=');
            *eq = 0;
            servers[n_servers++] = (server_t){argv[i], eq + 1, 0, 0};
        } else {
            fprintf(stderr,
                    "usage: %s [-s seconds] [-r rounds] [-c case,...] "
                    "[label=path/to/nereid ...]\n",
                    argv[0]);
            return 2;
        }
    }
    if (rounds < 1 || rounds > MAX_ROUNDS || seconds < 1) return 2;
    static char self[512];
    if (n_servers == 0) {
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 16);
        if (n < 0) die("readlink");
        self[n] = 0;
        char *slash = strrchr(self, '/');
        *slash = 0;
        slash = strrchr(self, '/');
        strcpy(slash, "/nereid");
        servers[n_servers++] = (server_t){"new", self, 0, 0};
    }
    if (system("wrk --version >/dev/null 2>&1") == -1) die("wrk");
    signal(SIGPIPE, SIG_IGN);
    /* The echo's body buffers stay in the heap, as http_server_start has it. */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
    snprintf(repo, sizeof repo, "/tmp/nereid-bench-json-XXXXXX");
    if (!mkdtemp(repo)) die("mkdtemp");
    write_models();
    for (size_t i = 0; i < N_CASES; i++)
        write_script(&cases[i]);
    atexit(stop_children);
    for (int i = 0; i < n_servers; i++)
        start_server(&servers[i]);
    server_t *echo = &servers[n_servers];
    *echo = (server_t){"echo", NULL, 0, 0};
    struct MHD_Daemon *echo_daemon = start_echo(echo);
    if (!echo_daemon) die("echo daemon");

    printf("bench_json: %d element tensors, 1 connection, %d rounds of %d s, servers:", N_ELEMENTS,
           rounds, seconds);
    for (int i = 0; i < n_servers; i++)
        printf(" %s=%s", servers[i].label, servers[i].path);
    printf("\n\n%-12s", "case");
    for (int i = 0; i < n_servers; i++)
        printf(" %10s/s %9s %9s", servers[i].label, "p50 us", "cpu us");
    for (int i = 1; i < n_servers; i++)
        printf(" %5s/%-5s", servers[i].label, servers[0].label);
    printf("\n");
    for (size_t k = 0; k < N_CASES; k++) {
        bench_case_t *c = &cases[k];
        if (!case_selected(only, c->name)) continue;
        int n_run = n_servers + (c->kind == K_BINARY ? 1 : 0);
        double rps[MAX_SERVERS + 1][MAX_ROUNDS], p50[MAX_SERVERS + 1][MAX_ROUNDS],
            cpu[MAX_SERVERS + 1][MAX_ROUNDS];
        for (int r = 0; r < rounds; r++)
            for (int i = 0; i < n_run; i++) {
                sample_t s = run_wrk(&servers[i], c);
                rps[i][r] = s.rps, p50[i][r] = s.p50_us, cpu[i][r] = s.cpu_us;
            }
        double m_rps[MAX_SERVERS + 1], m_p50[MAX_SERVERS + 1];
        printf("%-12s", c->name);
        for (int i = 0; i < n_run; i++) {
            m_rps[i] = median(rps[i], rounds);
            m_p50[i] = median(p50[i], rounds);
            if (i < n_servers)
                printf(" %12.1f %9.0f %9.0f", m_rps[i], m_p50[i], median(cpu[i], rounds));
        }
        for (int i = 1; i < n_servers; i++)
            printf(" %10.2fx", m_rps[i] / m_rps[0]);
        printf("\n");
        if (c->kind == K_BINARY) {
            printf("%-12s %12.1f %9.0f %9s   (in-process MHD echo of the same body)\n", "echo",
                   m_rps[n_servers], m_p50[n_servers], "-");
            for (int i = 0; i < n_servers; i++)
                printf("  %s: binary identity time / echo time = %.2f (per-request, from req/s)\n",
                       servers[i].label, m_rps[n_servers] / m_rps[i]);
        }
        fflush(stdout);
    }
    stop_children();
    MHD_stop_daemon(echo_daemon);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", repo);
    return system(cmd) == 0 ? 0 : 1;
}
