/*
 * This file contains the HTTP frontend benchmark: it starts Nereid in-process
 * on a loopback port and drives it with wrk (Lua scripts send prebuilt
 * bodies), measuring in one run (a) the transport floor (GET
 * /v2/health/live, a trivial libmicrohttpd reply), (b) identity FP32[1]
 * binary inference, (c) add_sub inference from examples/models, each at 1
 * connection (median latency) and 32 connections (throughput), and (d) JSON
 * versus binary for a 65,536-element tensor (FP32 short decimals (i % 1024)
 * / 8; random FP32 as 17-digit doubles, random FP64, random INT32; the JSON
 * rows print req/s at 1 connection), and the server's CPU time per request of
 * the 65,536-element rows. It prints ratios to the floor. A second floor is
 * an echo of the identity request's own body: a libmicrohttpd daemon in this
 * process with the HTTP frontend's flags and thread count that reads the
 * POST body and sends it back (what any server on this library pays for the
 * same bytes in and out). For the small rows it also prints the server's
 * CPU time per request at 32 connections. BENCH_SECONDS sets the duration
 * of each run (default 3).
 *
 * Usage: build/bench/bench_http   (needs wrk on PATH)
 *        build/bench/bench_http --echo PORT   (the echo floor alone, until SIGTERM)
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <microhttpd.h>

#include "http/http_server.h"
#include "../tests/unit/test_util.h"

typedef struct result {
    double median_us;
    double rps;
    double cpu_us; /* this process's (the server's) CPU time per request */
} result_t;

/* CPU seconds (user + system) this process has used so far. */
static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

static int port;
static int seconds = 3;

/* Writes len bytes to the absolute path; exits on failure. */
static void write_path(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len) {
        fprintf(stderr, "bench: cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    fclose(f);
}

/* A Lua script that POSTs the body in file body_path with the given IHCL
 * (-1: none). Returns the script path. */
static const char *post_script(const char *name, const char *body_path, long ihcl)
{
    static char path[512];
    char lua[2048];
    int n = snprintf(lua, sizeof lua,
                     "local f = assert(io.open(\"%s\", \"rb\"))\n"
                     "wrk.method = \"POST\"\nwrk.body = f:read(\"*a\")\nf:close()\n",
                     body_path);
    if (ihcl >= 0)
        n += snprintf(lua + n, sizeof lua - (size_t)n,
                      "wrk.headers[\"Inference-Header-Content-Length\"] = \"%ld\"\n"
                      "wrk.headers[\"Content-Type\"] = \"application/octet-stream\"\n",
                      ihcl);
    snprintf(path, sizeof path, "%s/%s.lua", repo, name);
    write_path(path, lua, (size_t)n);
    return path;
}

/* Writes a binary-extension body for inputs of n FP32 values each. */
static long binary_body(const char *path, const char *const *names, size_t n_inputs, size_t n,
                        const char *shape)
{
    char json[4096];
    int k = snprintf(json, sizeof json, "{\"inputs\":[");
    for (size_t i = 0; i < n_inputs; i++)
        k += snprintf(json + k, sizeof json - (size_t)k,
                      "%s{\"name\":\"%s\",\"datatype\":\"FP32\",\"shape\":%s,"
                      "\"parameters\":{\"binary_data_size\":%zu}}",
                      i ? "," : "", names[i], shape, n * 4);
    k += snprintf(json + k, sizeof json - (size_t)k,
                  "],\"parameters\":{\"binary_data_output\":true}}");
    size_t total = (size_t)k + n_inputs * n * 4;
    char *body = malloc(total);
    memcpy(body, json, (size_t)k);
    for (size_t i = 0; i < n_inputs * n; i++) {
        float f = (float)i * 0.5f;
        memcpy(body + (size_t)k + i * 4, &f, 4);
    }
    write_path(path, body, total);
    free(body);
    return k;
}

/* JSON bodies of the 65,536-element rows. */
typedef enum { SHORT_FP32, RANDOM_FP32, RANDOM_FP64, RANDOM_INT32 } json_kind_t;

/* Writes a JSON request of n elements: SHORT_FP32 (i % 1024) / 8, RANDOM_FP32
 * random floats as 17-digit doubles (as Triton prints FP32), RANDOM_FP64
 * random doubles in 17 digits, RANDOM_INT32 random int32. */
static void json_body(const char *path, size_t n, json_kind_t kind)
{
    static const char *dt[] = {"FP32", "FP32", "FP64", "INT32"};
    size_t cap = n * 28 + 256, len = 0;
    char *b = malloc(cap);
    uint64_t x = 0x9E3779B97F4A7C15ULL;
    len += (size_t)snprintf(b, cap,
                            "{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"%s\","
                            "\"shape\":[1,%zu],\"data\":[",
                            dt[kind], n);
    for (size_t i = 0; i < n; i++) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        uint64_t r = x * 2685821657736338717ULL;
        double u = (double)(r >> 11) * 0x1p-53 * 2 - 1; /* [-1, 1) */
        const char *sep = i ? "," : "";
        if (kind == SHORT_FP32)
            len += (size_t)snprintf(b + len, cap - len, "%s%g", sep, (double)(i % 1024) / 8);
        else if (kind == RANDOM_FP32)
            len += (size_t)snprintf(b + len, cap - len, "%s%.17g", sep, (double)(float)(u * 1000));
        else if (kind == RANDOM_FP64)
            len += (size_t)snprintf(b + len, cap - len, "%s%.17g", sep, u * 1000);
        else
            len += (size_t)snprintf(b + len, cap - len, "%s%d", sep, (int32_t)(uint32_t)r);
    }
    len += (size_t)snprintf(b + len, cap - len, "]}]}");
    write_path(path, b, len);
    free(b);
}

static double to_us(double v, const char *unit)
{
    if (!strcmp(unit, "ms")) return v * 1e3;
    if (!strcmp(unit, "s")) return v * 1e6;
    return v;
}

static result_t run_wrk(const char *path, const char *script, int connections)
{
    char cmd[1024];
    int threads = connections > 1 ? 2 : 1;
    snprintf(cmd, sizeof cmd, "wrk -t%d -c%d -d%ds --latency %s%s http://127.0.0.1:%d%s 2>&1",
             threads, connections, seconds, script ? "-s " : "", script ? script : "", port, path);
    double cpu0 = cpu_seconds();
    FILE *p = popen(cmd, "r");
    if (!p) {
        fprintf(stderr, "bench: cannot run wrk\n");
        exit(1);
    }
    result_t r = {0};
    char line[512];
    bool bad = false;
    while (fgets(line, sizeof line, p)) {
        double v;
        char unit[8];
        if (sscanf(line, " 50%% %lf%7[a-z]", &v, unit) == 2)
            r.median_us = to_us(v, unit);
        else if (sscanf(line, "Requests/sec: %lf", &v) == 1)
            r.rps = v;
        else if (sscanf(line, " %lf requests in", &v) == 1)
            r.cpu_us = v; /* the request count, for now */
        else if (strstr(line, "Non-2xx") || strstr(line, "Socket errors"))
            bad = true, fprintf(stderr, "bench: %s: %s", path, line);
    }
    if (pclose(p) != 0 || r.rps == 0 || bad) {
        fprintf(stderr, "bench: wrk failed for %s (command: %s)\n", path, cmd);
        exit(1);
    }
    r.cpu_us = r.cpu_us > 0 ? (cpu_seconds() - cpu0) * 1e6 / r.cpu_us : 0;
    return r;
}

/* The echo floor: collects the body of a POST (MHD hands it over in
 * pieces) and answers it back, with the Content-Type Nereid uses. */
typedef struct echo_conn {
    size_t len;
    char body[4096];
} echo_conn_t;

static enum MHD_Result echo_request(void *cls, struct MHD_Connection *c, const char *url,
                                    const char *method, const char *version,
                                    const char *upload_data, size_t *upload_data_size,
                                    void **con_cls)
{
    (void)cls, (void)url, (void)method, (void)version;
    echo_conn_t *e = *con_cls;
    if (e == NULL) {
        *con_cls = e = calloc(1, sizeof(*e));
        return e ? MHD_YES : MHD_NO;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        if (n > sizeof(e->body) - e->len) return MHD_NO;
        memcpy(e->body + e->len, upload_data, n);
        e->len += n;
        *upload_data_size = 0;
        return MHD_YES;
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer(e->len, e->body, MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(r, "Content-Type", "application/octet-stream");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

static void echo_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                           enum MHD_RequestTerminationCode toe)
{
    (void)cls, (void)c, (void)toe;
    free(*con_cls);
    *con_cls = NULL;
}

/* The echo daemon, flags and thread count as the HTTP frontend's, on
 * *echo_port (0: any); sets *echo_port to its port. */
static struct MHD_Daemon *echo_start(int *echo_port)
{
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | MHD_USE_ITC,
        (uint16_t)*echo_port, NULL, NULL, echo_request, NULL, MHD_OPTION_NOTIFY_COMPLETED,
        echo_completed, NULL, MHD_OPTION_THREAD_POOL_SIZE, 2u, MHD_OPTION_END);
    if (d == NULL) {
        fprintf(stderr, "bench: cannot start the echo daemon\n");
        exit(1);
    }
    *echo_port = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port;
    return d;
}

/* bench_http --echo PORT: only the echo floor, until SIGTERM or SIGINT
 * (bench/bench_http_ab.py measures it against Nereid binaries). */
static int echo_only(const char *port_text)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* MHD's threads inherit the mask */
    int echo_port = atoi(port_text), sig;
    struct MHD_Daemon *echo = echo_start(&echo_port);
    sigwait(&set, &sig);
    MHD_stop_daemon(echo);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--echo")) return echo_only(argv[2]);
    const char *env = getenv("BENCH_SECONDS");
    if (env && atoi(env) > 0) seconds = atoi(env);
    if (system("wrk --version >/dev/null 2>&1") == -1) {
        fprintf(stderr, "bench: wrk not found (apt-get install wrk)\n");
        return 1;
    }
    make_repo_dir("bench-http");
    write_model("models/bench_identity",
                "name: \"bench_identity\"\nbackend: \"identity\"\nmax_batch_size: 8\n"
                "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
                "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n");
    write_model("models/bench_identity_fp64",
                "name: \"bench_identity_fp64\"\nbackend: \"identity\"\nmax_batch_size: 8\n"
                "input [ { name: \"INPUT0\" data_type: TYPE_FP64 dims: [ -1 ] } ]\n"
                "output [ { name: \"OUTPUT0\" data_type: TYPE_FP64 dims: [ -1 ] } ]\n");
    write_model("models/bench_identity_int32",
                "name: \"bench_identity_int32\"\nbackend: \"identity\"\nmax_batch_size: 8\n"
                "input [ { name: \"INPUT0\" data_type: TYPE_INT32 dims: [ -1 ] } ]\n"
                "output [ { name: \"OUTPUT0\" data_type: TYPE_INT32 dims: [ -1 ] } ]\n");

    char models[512], examples[512];
    snprintf(models, sizeof models, "%s/models", repo);
    /* add_sub_onnx (ONNX Runtime) once `make models` generated it, else the C add_sub. */
    struct stat st;
    const char *add_sub = "add_sub_onnx";
    snprintf(examples, sizeof examples, "%s/examples/models/add_sub_onnx/1/model.onnx",
             NEREID_SOURCE_DIR);
    if (stat(examples, &st) != 0) add_sub = "add_sub";
    snprintf(examples, sizeof examples, "%s/examples/models/%s/config.pbtxt", NEREID_SOURCE_DIR,
             add_sub);
    bool have_add_sub = stat(examples, &st) == 0;
    snprintf(examples, sizeof examples, "%s/examples/models", NEREID_SOURCE_DIR);
    const char *repos[2] = {models, examples};

    nereid_server_options_t so;
    nereid_server_options_init(&so);
    so.model_repositories = repos;
    so.n_model_repositories = have_add_sub ? 2 : 1;
    so.model_control_mode = NEREID_MODEL_CONTROL_EXPLICIT;
    const char *load[4] = {"bench_identity", "bench_identity_fp64", "bench_identity_int32",
                           add_sub};
    so.load_models = load;
    so.n_load_models = have_add_sub ? 4 : 3;
    nereid_server_t *server;
    nereid_error_t *err = nereid_server_new(&so, &server);
    if (err) {
        fprintf(stderr, "bench: %s\n", nereid_error_message(err));
        return 1;
    }
    /* As the binary runs: a tracer with tracing off (Triton's default). */
    nereid_tracer_t *tracer = NULL;
    nereid_error_free(nereid_tracer_new(NULL, NULL, 0, &tracer));
    nereid_server_set_tracer(server, tracer);
    http_options_t ho;
    http_options_init(&ho);
    ho.address = "127.0.0.1";
    ho.port = 0;
    ho.thread_count = 2;
    http_server_t *http;
    if ((err = http_server_start(server, &ho, &http))) {
        fprintf(stderr, "bench: %s\n", nereid_error_message(err));
        return 1;
    }
    port = http_server_port(http);

    const char *in0[] = {"INPUT0"}, *in01[] = {"INPUT0", "INPUT1"};
    char body[512];
    snprintf(body, sizeof body, "%s/identity.bin", repo);
    const char *s_identity =
        strdup(post_script("identity", body, binary_body(body, in0, 1, 1, "[1,1]")));
    snprintf(body, sizeof body, "%s/add_sub.bin", repo);
    const char *s_add_sub =
        strdup(post_script("add_sub", body, binary_body(body, in01, 2, 16, "[1,16]")));
    snprintf(body, sizeof body, "%s/big.bin", repo);
    const char *s_big_bin =
        strdup(post_script("big_bin", body, binary_body(body, in0, 1, 65536, "[1,65536]")));
    snprintf(body, sizeof body, "%s/big.json", repo);
    json_body(body, 65536, SHORT_FP32);
    const char *s_big_json = strdup(post_script("big_json", body, -1));
    const char *s_rand_json[3];
    static const char *rand_name[3] = {"rand_fp32", "rand_fp64", "rand_int32"};
    for (int k = 0; k < 3; k++) {
        snprintf(body, sizeof body, "%s/%s.json", repo, rand_name[k]);
        json_body(body, 65536, (json_kind_t)(RANDOM_FP32 + k));
        s_rand_json[k] = strdup(post_script(rand_name[k], body, -1));
    }

    printf("HTTP benchmark on 127.0.0.1:%d, wrk %ds per run, %ld CPUs\n", port, seconds,
           sysconf(_SC_NPROCESSORS_ONLN));
    result_t floor1 = run_wrk("/v2/health/live", NULL, 1);
    result_t floor32 = run_wrk("/v2/health/live", NULL, 32);
    int nereid_port = port, echo_port = 0;
    struct MHD_Daemon *echo = echo_start(&echo_port);
    port = echo_port;
    result_t echo1 = run_wrk("/v2/models/bench_identity/infer", s_identity, 1);
    result_t echo32 = run_wrk("/v2/models/bench_identity/infer", s_identity, 32);
    port = nereid_port;
    MHD_stop_daemon(echo);
    result_t id1 = run_wrk("/v2/models/bench_identity/infer", s_identity, 1);
    result_t id32 = run_wrk("/v2/models/bench_identity/infer", s_identity, 32);
    result_t as1 = {0}, as32 = {0};
    char add_sub_path[128], label[64];
    snprintf(add_sub_path, sizeof add_sub_path, "/v2/models/%s/infer", add_sub);
    if (have_add_sub) {
        as1 = run_wrk(add_sub_path, s_add_sub, 1);
        as32 = run_wrk(add_sub_path, s_add_sub, 32);
    }
    result_t bin1 = run_wrk("/v2/models/bench_identity/infer", s_big_bin, 1);
    result_t json1 = run_wrk("/v2/models/bench_identity/infer", s_big_json, 1);
    static const char *rand_path[3] = {"/v2/models/bench_identity/infer",
                                       "/v2/models/bench_identity_fp64/infer",
                                       "/v2/models/bench_identity_int32/infer"};
    result_t rand1[3];
    for (int k = 0; k < 3; k++)
        rand1[k] = run_wrk(rand_path[k], s_rand_json[k], 1);

    printf("\n%-34s %12s %12s %14s %12s\n", "case", "p50 c=1 (us)", "+us vs floor", "req/s c=32",
           "vs floor");
    printf("%-34s %12.1f %12s %14.0f %11.0f%%\n", "floor GET /v2/health/live", floor1.median_us,
           "-", floor32.rps, 100.0);
    printf("%-34s %12.1f %12.1f %14.0f %11.0f%%\n", "floor echo of identity's body",
           echo1.median_us, echo1.median_us - floor1.median_us, echo32.rps,
           100.0 * echo32.rps / floor32.rps);
    printf("%-34s %12.1f %12.1f %14.0f %11.0f%%\n", "identity FP32[1] binary", id1.median_us,
           id1.median_us - floor1.median_us, id32.rps, 100.0 * id32.rps / floor32.rps);
    printf("identity vs the echo floor: p50 c=1 %+.1f us, req/s c=32 %.2f of the echo's\n",
           id1.median_us - echo1.median_us, id32.rps / echo32.rps);
    printf("server CPU per request at c=32 (us): GET floor %.1f, echo floor %.1f, "
           "identity %.1f\n",
           floor32.cpu_us, echo32.cpu_us, id32.cpu_us);
    if (have_add_sub)
        printf("%-34s %12.1f %12.1f %14.0f %11.0f%%\n",
               strcat(strcpy(label, add_sub), " FP32[16] binary"), as1.median_us,
               as1.median_us - floor1.median_us, as32.rps, 100.0 * as32.rps / floor32.rps);
    printf("%-34s %12.1f %12s %14s %12s\n", "identity FP32[65536] binary", bin1.median_us, "", "",
           "");
    printf("%-34s %12.1f %12s %14.1f %12s\n", "identity FP32[65536] JSON short", json1.median_us,
           "", json1.rps, "");
    static const char *rand_label[3] = {"identity FP32[65536] JSON random",
                                        "identity FP64[65536] JSON random",
                                        "identity INT32[65536] JSON random"};
    for (int k = 0; k < 3; k++)
        printf("%-34s %12.1f %12s %14.1f %12s\n", rand_label[k], rand1[k].median_us, "",
               rand1[k].rps, "");
    printf("JSON/binary latency ratio for 65,536 FP32: %.1fx\n", json1.median_us / bin1.median_us);
    printf("server CPU per request (us, user+system of this process, load-independent):\n"
           "  65,536 binary %.0f, JSON short %.0f, FP32 random %.0f, FP64 random %.0f, "
           "INT32 random %.0f\n",
           bin1.cpu_us, json1.cpu_us, rand1[0].cpu_us, rand1[1].cpu_us, rand1[2].cpu_us);

    http_server_stop(http);
    nereid_server_free(server);
    nereid_tracer_free(tracer);
    free((void *)s_identity);
    free((void *)s_add_sub);
    free((void *)s_big_bin);
    free((void *)s_big_json);
    for (int k = 0; k < 3; k++)
        free((void *)s_rand_json[k]);
    return remove_repo() ? 0 : 1;
}
