/*
 * This file contains small helpers shared by the core: checked allocation,
 * monotonic/wall clocks, logging, and the confined reading of files a model
 * configuration names.
 */
#ifndef NEREID_UTIL_H
#define NEREID_UTIL_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>

#include "nereid/server.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Allocation that aborts on out-of-memory (a server cannot serve without it). */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Calls fn(name, is_dir, arg) for each entry of directory dir but "." and
 * "..", in directory order, until fn returns false; is_dir follows
 * symlinks (stat when the directory entry does not tell). Reads with
 * getdents64 into a stack buffer: no heap (opendir's buffer is 32 KiB per
 * call, a visible cost when thousands of model directories are listed).
 * Returns -1 when dir cannot be opened, else 0. Any thread. */
int util_dir_each(const char *dir, bool (*fn)(const char *name, bool is_dir, void *arg), void *arg);
uint64_t util_now_ns(void); /* CLOCK_MONOTONIC */
/* A condition variable timed on CLOCK_MONOTONIC, and a wait on it until
 * deadline_ns (util_now_ns's clock). */
void util_cond_init_monotonic(pthread_cond_t *c);
void util_cond_wait_until(pthread_cond_t *c, pthread_mutex_t *m, uint64_t deadline_ns);
uint64_t util_wall_ms(void); /* ms since the epoch */

/* ---- Files a model configuration names ----
 * A configuration arrives from the repository or from a client (the load
 * API's "config" and "file:" parameters), so every file it names is read
 * only from inside the model's directory. */

/* Largest label file read (label_filename): 4 MiB. */
#define UTIL_LABEL_FILE_MAX_BYTES ((size_t)4 << 20)
/* Largest TYPE_STRING data file read (initial_state data_file, warmup
 * input_data_file): 64 MiB. Other datatypes read exactly the tensor's size. */
#define UTIL_STRING_DATA_FILE_MAX_BYTES ((size_t)64 << 20)

typedef enum util_path_status {
    UTIL_PATH_INSIDE,  /* exists and resolves inside root */
    UTIL_PATH_MISSING, /* cannot be resolved (errno says why); lexically inside root */
    UTIL_PATH_OUTSIDE, /* absolute, or ".." or a symlink leads outside root */
} util_path_status_t;

/* Resolves relpath under the directory root: absolute paths and paths whose
 * ".." segments climb above root are OUTSIDE without touching the disk;
 * otherwise root/relpath is resolved with realpath (following every
 * symlink) and is OUTSIDE unless it lands in root's own resolution. When
 * resolved is non-NULL it receives the canonical path on INSIDE (caller
 * frees), else NULL. */
util_path_status_t util_confine_path(const char *root, const char *relpath, char **resolved);

/* util_read_confined flags. */
#define UTIL_READ_TEXT 1u   /* refuse a file containing a NUL byte */
#define UTIL_READ_PREFIX 2u /* a file larger than max_bytes is read up to max_bytes */

/* Reads the regular file relpath under root (see util_confine_path) into
 * *out, NUL-terminated, its length in *out_bytes (caller frees *out). The
 * file is opened without blocking (a FIFO never stalls the load) and must
 * be a regular file of at most max_bytes (or, with UTIL_READ_PREFIX, only
 * its first max_bytes are read). subject names the field for the error,
 * e.g. "label file path '<path>' for output 'O' in model 'm'". Errors:
 * UNSUPPORTED "<subject> is outside model directory" (Triton's text for
 * labels); INVALID_ARG for a missing, unreadable, non-regular, too large or
 * NUL-holding file. Out-parameters are zeroed on failure. */
nereid_error_t *util_read_confined(const char *root, const char *relpath, size_t max_bytes,
                                   unsigned flags, const char *subject, char **out,
                                   size_t *out_bytes);

/* Reads a tensor's data file, <root>/<folder>/<file> (initial_state and
 * warmup data, Triton's folders), through util_read_confined: a TYPE_STRING
 * tensor (is_string) takes the whole file, at most
 * UTIL_STRING_DATA_FILE_MAX_BYTES; any other tensor at most its first
 * tensor_bytes (a shorter file is the caller's error to report). */
nereid_error_t *util_read_tensor_file(const char *root, const char *folder, const char *file,
                                      size_t tensor_bytes, bool is_string, const char *subject,
                                      char **out, size_t *out_bytes);

/* Runtime-changeable (logging.c, nereid_server_update_log_settings). */
extern _Atomic int log_verbose_level;
extern _Atomic bool log_info_enabled, log_warning_enabled, log_error_enabled;
extern _Atomic int log_format_iso8601; /* 0 = Triton default format */
/* Triton's log records, on stderr or in the --log-file:
 * "I1122 00:00:00.000000 <pid> <file>:<line>] msg" (UTC; or ISO8601's
 * "2026-11-22T00:00:00Z I <pid> <file>:<line>] msg"). The message is written
 * as a JSON string (escaped, so client text can not forge a record) unless
 * TRITON_SERVER_ESCAPE_LOG_MESSAGES=0, as Triton does. level: 'I', 'W', 'E',
 * or 'V' (verbose: printed as 'I', whatever --log-info says). Any thread. */
void log_msg(char level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* One record of a finished message; with a heading, the heading is the
 * (escaped) first line and msg follows unescaped on the next lines (Triton's
 * tables and config dumps). */
void log_write(char level, const char *file, int line, const char *heading, const char *msg);
/* One record whose message is written as it is, never escaped (Triton's
 * LOG_TABLE_INFO: the startup model table starts with a newline). */
void log_write_raw(char level, const char *file, int line, const char *msg);
/* Sends every later record to path (appended; Triton's --log-file). */
nereid_error_t *log_open_file(const char *path);
/* The --log-file path, "" when records go to stderr. */
const char *log_file_path(void);
#define LOG_INFO(...) log_msg('I', __FILE__, __LINE__, __VA_ARGS__)
#define LOG_WARN(...) log_msg('W', __FILE__, __LINE__, __VA_ARGS__)
#define LOG_ERROR(...) log_msg('E', __FILE__, __LINE__, __VA_ARGS__)
#define LOG_VERBOSE(...)                                                                           \
    do {                                                                                           \
        if (log_verbose_level > 0) log_msg('V', __FILE__, __LINE__, __VA_ARGS__);                  \
    } while (0)
/* Triton's LOG_VERBOSE(2): --log-verbose=2 and up */
#define LOG_VERBOSE2(...)                                                                          \
    do {                                                                                           \
        if (log_verbose_level >= 2) log_msg('V', __FILE__, __LINE__, __VA_ARGS__);                 \
    } while (0)

#endif
