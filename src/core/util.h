/*
 * This file contains small helpers shared by the core: checked allocation,
 * monotonic/wall clocks and logging.
 */
#ifndef NEREID_UTIL_H
#define NEREID_UTIL_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Allocation that aborts on out-of-memory (a server cannot serve without it). */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

uint64_t util_now_ns(void);  /* CLOCK_MONOTONIC */
uint64_t util_wall_ms(void); /* ms since the epoch */

/* Runtime-changeable (logging.c, nereid_server_update_log_settings). */
extern _Atomic int log_verbose_level;
extern _Atomic bool log_info_enabled, log_warning_enabled, log_error_enabled;
extern _Atomic int log_format_iso8601; /* 0 = Triton default format */
/* Triton-style log lines on stderr: "I1122 00:00:00.000000 <pid> <module>] msg". */
void log_msg(char level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define LOG_INFO(mod, ...) log_msg('I', mod, __VA_ARGS__)
#define LOG_WARN(mod, ...) log_msg('W', mod, __VA_ARGS__)
#define LOG_ERROR(mod, ...) log_msg('E', mod, __VA_ARGS__)
#define LOG_VERBOSE(mod, ...)                                                                      \
    do {                                                                                           \
        if (log_verbose_level > 0) log_msg('V', mod, __VA_ARGS__);                                 \
    } while (0)

#endif
