/*
 * This file contains the unit tests of the host metrics readings
 * (src/metrics/host_metrics.c): the /proc/stat aggregate line, Triton's
 * utilization formula (busy over busy plus idle, counters that went
 * backwards count as 0), and /proc/meminfo's used = MemTotal -
 * MemAvailable with its refusals.
 */
#include <stdint.h>
#include <stdio.h>

#include "check.h"
#include "metrics/host_metrics.h"

static void test_cpu_times(void)
{
    host_cpu_times_t t;
    CHECK(host_cpu_times_parse("cpu  10 20 30 40 50 60 70 80 90 100\ncpu0 1 2 3 4 5 6 7 8\n", &t) ==
          0);
    CHECK(t.user == 10 && t.nice == 20 && t.system == 30 && t.idle == 40);
    CHECK(t.iowait == 50 && t.irq == 60 && t.softirq == 70 && t.steal == 80);
    CHECK(host_cpu_times_parse("cpu0 1 2 3 4 5 6 7 8\n", &t) == -1);
    CHECK(host_cpu_times_parse("cpu  1 2 3\n", &t) == -1);
    CHECK(host_cpu_times_parse("", &t) == -1);
}

static void test_utilization(void)
{
    host_cpu_times_t a = {100, 0, 100, 1000, 100, 0, 0, 0};
    /* busy +30 (user 10, nice 5, system 5, irq 4, softirq 3, steal 3), idle +70 (60 + 10) */
    host_cpu_times_t b = {110, 5, 105, 1060, 110, 4, 3, 3};
    CHECK(host_cpu_utilization(&b, &a) == 0.3);
    CHECK(host_cpu_utilization(&a, &a) == 0.0); /* no tick passed: 0, not NaN */
    host_cpu_times_t c = b;
    c.idle = 0; /* went backwards: counts as 0 */
    c.iowait = 100;
    CHECK(host_cpu_utilization(&c, &a) == 1.0);
}

static void test_meminfo(void)
{
    uint64_t total, used;
    CHECK(host_meminfo_parse("MemTotal:       16000 kB\nMemFree:  1000 kB\n"
                             "MemAvailable:    4000 kB\nBuffers: 1 kB\n",
                             &total, &used) == 0);
    CHECK(total == 16000ull * 1024 && used == 12000ull * 1024);
    CHECK(host_meminfo_parse("MemTotal: 16000 kB\nMemFree: 1000 kB\n", &total, &used) == -1);
    CHECK(total == 0 && used == 0);
    CHECK(host_meminfo_parse("MemTotal: 100 kB\nMemAvailable: 200 kB\n", &total, &used) == -1);
}

int main(void)
{
    test_cpu_times();
    test_utilization();
    test_meminfo();
    return check_summary();
}
