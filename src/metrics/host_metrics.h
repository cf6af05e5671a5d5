/*
 * This file contains the host metrics Triton polls on Linux: CPU
 * utilization from /proc/stat and RAM total/used from /proc/meminfo,
 * refreshed by a background thread every --metrics-interval-ms and served
 * as the gauges nv_cpu_utilization, nv_cpu_memory_total_bytes and
 * nv_cpu_memory_used_bytes.
 */
#ifndef NEREID_HOST_METRICS_H
#define NEREID_HOST_METRICS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Aggregate "cpu " line of /proc/stat, in clock ticks. */
typedef struct host_cpu_times {
    uint64_t user, nice, system, idle, iowait, irq, softirq, steal;
} host_cpu_times_t;

typedef struct host_metrics host_metrics_t;

/* Parses the first line of a /proc/stat text; -1 if it is not the
 * aggregate "cpu " line or has fewer than eight numbers. */
int host_cpu_times_parse(const char *text, host_cpu_times_t *out);

/* Triton's utilization between two readings: busy ticks (user, nice,
 * system, irq, softirq, steal) over busy plus idle (idle, iowait), each
 * difference counted as 0 when the counter went backwards; 0 when no
 * tick passed. */
double host_cpu_utilization(const host_cpu_times_t *now, const host_cpu_times_t *before);

/* Parses a /proc/meminfo text into bytes; -1 if MemTotal or MemAvailable is
 * missing or available exceeds total (Triton then reports 0). */
int host_meminfo_parse(const char *text, uint64_t *total_bytes, uint64_t *used_bytes);

/* Takes the baseline reading and starts the polling thread, which refreshes
 * the gauges every interval_ms / 2 (Triton's poll loop); the gauges read 0
 * until the first poll. NULL when the thread cannot start. */
host_metrics_t *host_metrics_start(int interval_ms);

/* Appends the three gauge families in Prometheus text. Thread-safe. */
void host_metrics_text(host_metrics_t *hm, FILE *out);

/* Stops the thread and frees; NULL is fine. */
void host_metrics_stop(host_metrics_t *hm);

#endif
