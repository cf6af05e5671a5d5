/*
 * This file contains the host metrics poller (see host_metrics.h): one
 * thread that sleeps on a condition variable for half the metrics interval,
 * reads /proc/stat and /proc/meminfo, and stores the three gauge values
 * under a mutex for the metrics frontend to print.
 */
#include "metrics/host_metrics.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROC_READ_MAX_BYTES 65536

struct host_metrics {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stopping;
    int interval_ms;
    host_cpu_times_t last; /* reading the next utilization is measured from */
    bool have_last;
    double utilization;   /* [0, 1] */
    uint64_t total_bytes; /* MemTotal */
    uint64_t used_bytes;  /* MemTotal - MemAvailable */
};

int host_cpu_times_parse(const char *text, host_cpu_times_t *out)
{
    memset(out, 0, sizeof *out);
    if (strncmp(text, "cpu ", 4) != 0) return -1;
    unsigned long long v[8];
    if (sscanf(text + 4, "%llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
               &v[4], &v[5], &v[6], &v[7]) != 8)
        return -1;
    *out = (host_cpu_times_t){v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]};
    return 0;
}

static uint64_t wrap_sub(uint64_t a, uint64_t b)
{
    return a > b ? a - b : 0;
}

double host_cpu_utilization(const host_cpu_times_t *now, const host_cpu_times_t *before)
{
    uint64_t busy = wrap_sub(now->user, before->user) + wrap_sub(now->nice, before->nice) +
                    wrap_sub(now->system, before->system) + wrap_sub(now->irq, before->irq) +
                    wrap_sub(now->softirq, before->softirq) + wrap_sub(now->steal, before->steal);
    uint64_t idle = wrap_sub(now->idle, before->idle) + wrap_sub(now->iowait, before->iowait);
    if (busy + idle == 0) return 0.0;
    return (double)busy / (double)(busy + idle);
}

int host_meminfo_parse(const char *text, uint64_t *total_bytes, uint64_t *used_bytes)
{
    *total_bytes = *used_bytes = 0;
    bool have_total = false, have_avail = false;
    unsigned long long total_kb = 0, avail_kb = 0;
    for (const char *line = text; line && *line;) {
        if (sscanf(line, "MemTotal: %llu", &total_kb) == 1) have_total = true;
        if (sscanf(line, "MemAvailable: %llu", &avail_kb) == 1) have_avail = true;
        line = strchr(line, '\n');
        if (line) line++;
    }
    if (!have_total || !have_avail || avail_kb > total_kb) return -1;
    *total_bytes = (uint64_t)total_kb * 1024;
    *used_bytes = (uint64_t)(total_kb - avail_kb) * 1024;
    return 0;
}

/* Reads a /proc file (size 0 in stat) into a NUL-terminated buffer. */
static int read_proc(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return n ? 0 : -1;
}

static void poll_once(host_metrics_t *hm, char *buf)
{
    host_cpu_times_t now;
    bool cpu_ok = read_proc("/proc/stat", buf, PROC_READ_MAX_BYTES) == 0 &&
                  host_cpu_times_parse(buf, &now) == 0;
    uint64_t total = 0, used = 0;
    if (read_proc("/proc/meminfo", buf, PROC_READ_MAX_BYTES) == 0)
        host_meminfo_parse(buf, &total, &used);
    pthread_mutex_lock(&hm->lock);
    hm->utilization = 0.0;
    if (cpu_ok) {
        if (hm->have_last) hm->utilization = host_cpu_utilization(&now, &hm->last);
        hm->last = now;
        hm->have_last = true;
    }
    hm->total_bytes = total;
    hm->used_bytes = used;
    pthread_mutex_unlock(&hm->lock);
}

static void *poll_main(void *arg)
{
    host_metrics_t *hm = arg;
    char *buf = malloc(PROC_READ_MAX_BYTES);
    if (!buf) return NULL;
    long half_ms = hm->interval_ms / 2;
    if (half_ms < 1) half_ms = 1; /* Triton spins at 0; a millisecond is as good */
    pthread_mutex_lock(&hm->lock);
    while (!hm->stopping) {
        struct timespec deadline;
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_sec += half_ms / 1000;
        deadline.tv_nsec += (half_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
        int rc = 0;
        while (!hm->stopping && rc == 0)
            rc = pthread_cond_timedwait(&hm->cond, &hm->lock, &deadline);
        if (hm->stopping) break;
        pthread_mutex_unlock(&hm->lock);
        poll_once(hm, buf);
        pthread_mutex_lock(&hm->lock);
    }
    pthread_mutex_unlock(&hm->lock);
    free(buf);
    return NULL;
}

host_metrics_t *host_metrics_start(int interval_ms)
{
    host_metrics_t *hm = calloc(1, sizeof *hm);
    if (!hm) return NULL;
    hm->interval_ms = interval_ms > 0 ? interval_ms : 0;
    char *buf = malloc(PROC_READ_MAX_BYTES);
    if (buf && read_proc("/proc/stat", buf, PROC_READ_MAX_BYTES) == 0 &&
        host_cpu_times_parse(buf, &hm->last) == 0)
        hm->have_last = true;
    free(buf);
    pthread_mutex_init(&hm->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&hm->cond, &attr);
    pthread_condattr_destroy(&attr);
    if (pthread_create(&hm->thread, NULL, poll_main, hm) != 0) {
        pthread_mutex_destroy(&hm->lock);
        pthread_cond_destroy(&hm->cond);
        free(hm);
        return NULL;
    }
    return hm;
}

/* The shortest text that reads back as d (prometheus-cpp's to_chars). */
static void shortest_double(char *buf, size_t cap, double d)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, d);
        if (strtod(buf, NULL) == d) return;
    }
}

void host_metrics_text(host_metrics_t *hm, FILE *out)
{
    pthread_mutex_lock(&hm->lock);
    double util = hm->utilization;
    uint64_t total = hm->total_bytes, used = hm->used_bytes;
    pthread_mutex_unlock(&hm->lock);
    char util_text[32];
    shortest_double(util_text, sizeof util_text, util);
    fprintf(out,
            "# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]\n"
            "# TYPE nv_cpu_utilization gauge\nnv_cpu_utilization %s\n"
            "# HELP nv_cpu_memory_total_bytes CPU total memory (RAM), in bytes\n"
            "# TYPE nv_cpu_memory_total_bytes gauge\nnv_cpu_memory_total_bytes %" PRIu64 "\n"
            "# HELP nv_cpu_memory_used_bytes CPU used memory (RAM), in bytes\n"
            "# TYPE nv_cpu_memory_used_bytes gauge\nnv_cpu_memory_used_bytes %" PRIu64 "\n",
            util_text, total, used);
}

void host_metrics_stop(host_metrics_t *hm)
{
    if (!hm) return;
    pthread_mutex_lock(&hm->lock);
    hm->stopping = true;
    pthread_cond_signal(&hm->cond);
    pthread_mutex_unlock(&hm->lock);
    pthread_join(hm->thread, NULL);
    pthread_mutex_destroy(&hm->lock);
    pthread_cond_destroy(&hm->cond);
    free(hm);
}
