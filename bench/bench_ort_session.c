/*
 * This file contains what one ONNX Runtime session costs (issue 42): it
 * creates N sessions from N distinct model files, as the onnxruntime
 * backend does (CreateSessionFromArray, the environment's shared thread
 * pools, DisablePerSessionThreads), once per set of session options, each
 * set in a child process of its own so one set's freed memory does not
 * serve the next, the sets taking turns over rounds. Per set it prints the
 * medians over rounds of the CPU time per session created, the resident
 * memory each adds, what each adds at its first Run, and the CPU time of a
 * Run of one session ([1,16] FP32 in, the output bound; the process's CPU,
 * pool threads included).
 *
 * The models are bench/bench_scale_distinct.py's (MLPs 16->64->4):
 *   bench/bench_scale_distinct.py -n 1000 -r 1 --keep /tmp/distinct
 *   build/bench/bench_ort_session /tmp/distinct/n1000 [N [rounds]]   (default 1000, 3)
 *
 * With --concurrent it runs a model file ([8,16] FP32 in, [8,4] out, as
 * those MLPs) from two threads, on two sessions and on one, in turns over
 * rounds, and prints the wall time per run: what instances that share a
 * session (the backend's default) pay against sessions of their own.
 *   build/bench/bench_ort_session --concurrent model.onnx [runs per thread]
 * The runtime is build/backends/libonnxruntime.so.1 (run from the repository
 * root), or NEREID_ORT_LIBRARY.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../backends/onnxruntime/ort_api.h"

/* OrtApi slots not in ort_api.h: CreateAndRegisterAllocator (144). */
typedef OrtStatus *(*register_allocator_fn)(OrtEnv *env, const OrtMemoryInfo *info,
                                            const void *arena_cfg);

typedef struct {
    const char *name;
    int level;     /* GraphOptimizationLevel */
    bool arena;    /* the session's own CPU arena */
    bool env_pool; /* the environment's shared arena (session.use_env_allocators) */
} variant_t;

static const variant_t variants[] = {
    {"all optimizations, arena (Triton's default)", ORT_ENABLE_ALL, true, false},
    {"all optimizations, no arena", ORT_ENABLE_ALL, false, false},
    {"all optimizations, environment's arena", ORT_ENABLE_ALL, true, true},
    {"extended optimizations, arena", ORT_ENABLE_EXTENDED, true, false},
    {"basic optimizations, arena", ORT_ENABLE_BASIC, true, false},
    {"basic optimizations, no arena (tiny models now)", ORT_ENABLE_BASIC, false, false},
    {"no optimizations, no arena", ORT_DISABLE_ALL, false, false},
};

static ort_api_t api;

static void check(OrtStatus *st)
{
    if (!st) return;
    fprintf(stderr, "bench_ort_session: %s\n", api.GetErrorMessage(st));
    exit(1);
}

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &v) == 1) break;
    if (f) fclose(f);
    return (double)v;
}

static char *read_file(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        perror(path);
        exit(1);
    }
    char *buf = malloc((size_t)st.st_size);
    if (!buf || read(fd, buf, (size_t)st.st_size) != st.st_size) {
        perror(path);
        exit(1);
    }
    close(fd);
    *len = (size_t)st.st_size;
    return buf;
}

static void run_once(OrtSession *s, const OrtMemoryInfo *info)
{
    static float in[16], out[4];
    static const int64_t in_shape[2] = {1, 16}, out_shape[2] = {1, 4};
    const char *in_name = "INPUT0", *out_name = "OUTPUT0";
    OrtValue *vi, *vo;
    check(
        api.CreateTensorWithDataAsOrtValue(info, in, sizeof in, in_shape, 2, ORT_ELEM_FLOAT, &vi));
    check(api.CreateTensorWithDataAsOrtValue(info, out, sizeof out, out_shape, 2, ORT_ELEM_FLOAT,
                                             &vo));
    check(api.Run(s, NULL, &in_name, (const OrtValue *const *)&vi, 1, &out_name, 1, &vo));
    api.ReleaseValue(vi);
    api.ReleaseValue(vo);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

enum { COLUMNS = 5 };

/* Writes the set's figures to out[COLUMNS]. */
static void measure(const variant_t *v, const char *dir, int n, double *out)
{
    OrtThreadingOptions *tp;
    OrtEnv *env;
    check(api.CreateThreadingOptions(&tp));
    check(api.SetGlobalSpinControl(tp, 0));
    check(api.CreateEnvWithGlobalThreadPools(ORT_LOG_WARNING, "bench", tp, &env));
    api.ReleaseThreadingOptions(tp);
    OrtMemoryInfo *info;
    check(api.CreateCpuMemoryInfo(ORT_ARENA_ALLOCATOR, ORT_MEM_TYPE_DEFAULT, &info));
    OrtSessionOptions *o;
    check(api.CreateSessionOptions(&o));
    check(api.SetSessionGraphOptimizationLevel(o, v->level));
    check(api.DisablePerSessionThreads(o));
    if (!v->arena) check(api.DisableCpuMemArena(o));
    if (v->env_pool) {
        const ort_api_base_t *(*get_base)(void);
        *(void **)&get_base = dlsym(api.dl, "OrtGetApiBase");
        register_allocator_fn reg =
            (register_allocator_fn)get_base()->get_api(ORT_API_VERSION_USED)[144];
        check(reg(env, info, NULL));
        check(api.AddSessionConfigEntry(o, "session.use_env_allocators", "1"));
    }
    OrtSession **sessions = calloc((size_t)n, sizeof(*sessions));
    double rss0 = rss_kib(), cpu0 = cpu_s();
    for (int i = 0; i < n; i++) {
        char path[4096];
        size_t len;
        snprintf(path, sizeof path, "%s/mlp_%04d/1/model.onnx", dir, i);
        char *data = read_file(path, &len);
        check(api.CreateSessionFromArray(env, data, len, o, &sessions[i]));
        free(data);
    }
    double cpu1 = cpu_s(), rss1 = rss_kib();
    for (int i = 0; i < n; i++)
        run_once(sessions[i], info);
    double cpu2 = cpu_s(), rss2 = rss_kib();
    enum { RUNS = 5000 };
    double t0 = cpu_s();
    for (int k = 0; k < RUNS; k++)
        run_once(sessions[0], info);
    double run_us = (cpu_s() - t0) / RUNS * 1e6;
    out[0] = (cpu1 - cpu0) * 1e3 / n;
    out[1] = (rss1 - rss0) / n;
    out[2] = (cpu2 - cpu1) * 1e3 / n;
    out[3] = (rss2 - rss1) / n;
    out[4] = run_us;
}

static double wall_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

typedef struct {
    OrtSession *session;
    const OrtMemoryInfo *info;
    int runs;
} runner_t;

static void *run_batches(void *arg)
{
    runner_t *r = arg;
    float in[8 * 16] = {0}, out[8 * 4];
    const int64_t in_shape[2] = {8, 16}, out_shape[2] = {8, 4};
    const char *in_name = "INPUT0", *out_name = "OUTPUT0";
    for (int k = 0; k < r->runs; k++) {
        OrtValue *vi, *vo;
        check(api.CreateTensorWithDataAsOrtValue(r->info, in, sizeof in, in_shape, 2,
                                                 ORT_ELEM_FLOAT, &vi));
        check(api.CreateTensorWithDataAsOrtValue(r->info, out, sizeof out, out_shape, 2,
                                                 ORT_ELEM_FLOAT, &vo));
        check(api.Run(r->session, NULL, &in_name, (const OrtValue *const *)&vi, 1, &out_name, 1,
                      &vo));
        api.ReleaseValue(vi);
        api.ReleaseValue(vo);
    }
    return NULL;
}

/* Two threads on two sessions, then on one, in turns; medians over rounds. */
static int concurrent(const char *model, int runs)
{
    OrtThreadingOptions *tp;
    OrtEnv *env;
    check(api.CreateThreadingOptions(&tp));
    check(api.SetGlobalSpinControl(tp, 0));
    check(api.CreateEnvWithGlobalThreadPools(ORT_LOG_WARNING, "bench", tp, &env));
    api.ReleaseThreadingOptions(tp);
    OrtMemoryInfo *info;
    check(api.CreateCpuMemoryInfo(ORT_ARENA_ALLOCATOR, ORT_MEM_TYPE_DEFAULT, &info));
    OrtSessionOptions *o;
    check(api.CreateSessionOptions(&o));
    check(api.DisablePerSessionThreads(o));
    OrtSession *s[2];
    check(api.CreateSession(env, model, o, &s[0]));
    check(api.CreateSession(env, model, o, &s[1]));
    enum { ROUNDS = 7 };
    double us[2][ROUNDS];
    for (int r = 0; r < ROUNDS; r++)
        for (int one = 0; one < 2; one++) {
            runner_t w[2] = {{s[0], info, runs}, {s[one ? 0 : 1], info, runs}};
            pthread_t t[2];
            double t0 = wall_s();
            for (int i = 0; i < 2; i++)
                if (pthread_create(&t[i], NULL, run_batches, &w[i]) != 0) return 1;
            for (int i = 0; i < 2; i++)
                pthread_join(t[i], NULL);
            us[one][r] = (wall_s() - t0) / (2.0 * runs) * 1e6;
        }
    for (int one = 0; one < 2; one++) {
        qsort(us[one], ROUNDS, sizeof(double), cmp_double);
        printf("two threads, %s: %.2f us a run (median of %d rounds of %d runs a thread)\n",
               one ? "one session " : "two sessions", us[one][ROUNDS / 2], ROUNDS, runs);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODELS_DIR [N [rounds]] | --concurrent MODEL [runs]\n", argv[0]);
        return 2;
    }
    bool conc = argc > 2 && !strcmp(argv[1], "--concurrent");
    int n = argc > 2 ? atoi(argv[2]) : 1000, rounds = argc > 3 ? atoi(argv[3]) : 3;
    if (conc) n = rounds = 1;
    if (n < 1 || rounds < 1) return 2;
    const char *lib = getenv("NEREID_ORT_LIBRARY");
    char err[512];
    if (ort_api_load(&api, lib && *lib ? lib : "build/backends/libonnxruntime.so.1", err,
                     sizeof err) != 0) {
        fprintf(stderr, "bench_ort_session: %s\n", err);
        return 1;
    }
    if (conc) return concurrent(argv[2], argc > 3 && atoi(argv[3]) > 0 ? atoi(argv[3]) : 20000);
    enum { N_VARIANTS = sizeof variants / sizeof variants[0] };
    size_t size = (size_t)rounds * N_VARIANTS * COLUMNS * sizeof(double);
    double *results = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (results == MAP_FAILED) return 1;
    for (int r = 0; r < rounds; r++)
        for (size_t i = 0; i < N_VARIANTS; i++) {
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                measure(&variants[i], argv[1], n, &results[((size_t)r * N_VARIANTS + i) * COLUMNS]);
                _exit(0);
            }
            int status;
            if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
                WEXITSTATUS(status) != 0)
                return 1;
        }
    printf("%d sessions, ONNX Runtime %s, medians over %d rounds\n", n, api.version, rounds);
    printf("%-50s %9s %9s %9s %9s %7s\n", "session options", "create", "create", "1st run",
           "1st run", "run");
    printf("%-50s %9s %9s %9s %9s %7s\n", "", "cpu ms", "KiB", "cpu ms", "KiB", "cpu us");
    for (size_t i = 0; i < N_VARIANTS; i++) {
        double med[COLUMNS], col[64];
        for (int c = 0; c < COLUMNS; c++) {
            int k = 0;
            for (int r = 0; r < rounds && k < 64; r++)
                col[k++] = results[((size_t)r * N_VARIANTS + i) * COLUMNS + (size_t)c];
            qsort(col, (size_t)k, sizeof col[0], cmp_double);
            med[c] = col[k / 2];
        }
        printf("%-50s %9.3f %9.1f %9.3f %9.1f %7.2f\n", variants[i].name, med[0], med[1], med[2],
               med[3], med[4]);
    }
    munmap(results, size);
    return 0;
}
