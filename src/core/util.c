/*
 * This file contains the core's small helpers: allocation, clocks, logging.
 */
#include "core/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "nereid/backend.h"

_Atomic int log_verbose_level;
_Atomic bool log_info_enabled = true, log_warning_enabled = true, log_error_enabled = true;
_Atomic int log_format_iso8601;

static void oom(void)
{
    fputs("nereid: out of memory\n", stderr);
    abort();
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) oom();
    return p;
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) oom();
    return p;
}

void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p) oom();
    return p;
}

char *xstrdup(const char *s)
{
    char *p = strdup(s ? s : "");
    if (!p) oom();
    return p;
}

char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    char *s;
    va_start(ap, fmt);
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0) oom();
    return s;
}

uint64_t util_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t nereid_now_ns(void)
{
    return util_now_ns();
}

uint64_t util_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

void log_msg(char level, const char *module, const char *fmt, ...)
{
    if ((level == 'I' && !log_info_enabled) || (level == 'W' && !log_warning_enabled) ||
        (level == 'E' && !log_error_enabled))
        return;
    struct timeval tv;
    struct tm tm;
    char line[2048];
    gettimeofday(&tv, NULL);
    int n;
    if (atomic_load_explicit(&log_format_iso8601, memory_order_relaxed)) {
        gmtime_r(&tv.tv_sec, &tm);
        n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02dZ %c %d %s] ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     level, (int)getpid(), module);
    } else {
        localtime_r(&tv.tv_sec, &tm);
        n = snprintf(line, sizeof line, "%c%02d%02d %02d:%02d:%02d.%06ld %d %s] ", level,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (long)tv.tv_usec,
                     (int)getpid(), module);
    }
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}
