/*
 * This file contains the core's small helpers: allocation, clocks, logging,
 * and the confined reading of files a model configuration names.
 */
#include "core/util.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

void util_cond_init_monotonic(pthread_cond_t *c)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
}

void util_cond_wait_until(pthread_cond_t *c, pthread_mutex_t *m, uint64_t deadline_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(deadline_ns / 1000000000u),
                          .tv_nsec = (long)(deadline_ns % 1000000000u)};
    pthread_cond_timedwait(c, m, &ts);
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

/* Appends text to a growable buffer. */
typedef struct log_buf {
    char *p;
    size_t len, cap;
    char small[2048];
} log_buf_t;

static void lb_put(log_buf_t *b, const char *text, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = 2 * (b->len + n + 1);
        if (b->p == b->small) {
            b->p = xmalloc(cap);
            memcpy(b->p, b->small, b->len);
        } else {
            b->p = xrealloc(b->p, cap);
        }
        b->cap = cap;
    }
    memcpy(b->p + b->len, text, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/* The message as a JSON string (Triton's TritonJson::SerializeString, as
 * rapidjson writes it): quotes, backslash and control characters escaped,
 * other bytes as they are. */
static void lb_put_json_string(log_buf_t *b, const char *msg)
{
    lb_put(b, "\"", 1);
    const char *run = msg;
    for (const char *p = msg; *p; p++) {
        unsigned char ch = (unsigned char)*p;
        if (ch >= 0x20 && ch != '"' && ch != '\\') continue;
        lb_put(b, run, (size_t)(p - run));
        char esc[8];
        switch (ch) {
        case '"':
            lb_put(b, "\\\"", 2);
            break;
        case '\\':
            lb_put(b, "\\\\", 2);
            break;
        case '\b':
            lb_put(b, "\\b", 2);
            break;
        case '\f':
            lb_put(b, "\\f", 2);
            break;
        case '\n':
            lb_put(b, "\\n", 2);
            break;
        case '\r':
            lb_put(b, "\\r", 2);
            break;
        case '\t':
            lb_put(b, "\\t", 2);
            break;
        default:
            snprintf(esc, sizeof esc, "\\u%04X", ch);
            lb_put(b, esc, 6);
        }
        run = p + 1;
    }
    lb_put(b, run, strlen(run));
    lb_put(b, "\"", 1);
}

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *log_file;      /* --log-file, or NULL: stderr */
static char *log_file_name; /* "" when none */
static int log_escape = -1; /* TRITON_SERVER_ESCAPE_LOG_MESSAGES; -1 = not read yet */

nereid_error_t *log_open_file(const char *path)
{
    FILE *f = fopen(path, "a");
    if (!f)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "failed to open log file '%s': %s", path,
                                strerror(errno));
    pthread_mutex_lock(&log_lock);
    if (log_file) fclose(log_file);
    log_file = f;
    free(log_file_name);
    log_file_name = xstrdup(path);
    pthread_mutex_unlock(&log_lock);
    return NULL;
}

const char *log_file_path(void)
{
    return log_file_name ? log_file_name : "";
}

/* raw: msg as it is, whatever TRITON_SERVER_ESCAPE_LOG_MESSAGES says. */
static void log_emit(char level, const char *file, int line, const char *heading, const char *msg,
                     bool raw)
{
    if ((level == 'I' && !log_info_enabled) || (level == 'W' && !log_warning_enabled) ||
        (level == 'E' && !log_error_enabled))
        return;
    if (level == 'V') level = 'I'; /* Triton prints verbose records as INFO */
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    char pre[256];
    if (atomic_load_explicit(&log_format_iso8601, memory_order_relaxed))
        snprintf(pre, sizeof pre, "%04d-%02d-%02dT%02d:%02d:%02dZ %c %d %s:%d] ", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, level, (int)getpid(),
                 base, line);
    else
        snprintf(pre, sizeof pre, "%c%02d%02d %02d:%02d:%02d.%06ld %d %s:%d] ", level,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (long)tv.tv_usec,
                 (int)getpid(), base, line);
    log_buf_t b;
    b.p = b.small;
    b.len = 0;
    b.cap = sizeof b.small;
    lb_put(&b, pre, strlen(pre));
    pthread_mutex_lock(&log_lock);
    if (log_escape < 0) {
        const char *v = getenv("TRITON_SERVER_ESCAPE_LOG_MESSAGES");
        log_escape = !(v && strcmp(v, "0") == 0);
    }
    bool escape = log_escape;
    pthread_mutex_unlock(&log_lock);
    if (raw) {
        lb_put(&b, msg, strlen(msg));
    } else if (heading) { /* a heading line, then the object (table, config) as it is */
        if (escape)
            lb_put_json_string(&b, heading);
        else
            lb_put(&b, heading, strlen(heading));
        lb_put(&b, "\n", 1);
        lb_put(&b, msg, strlen(msg));
    } else if (escape) {
        lb_put_json_string(&b, msg);
    } else {
        lb_put(&b, msg, strlen(msg));
    }
    lb_put(&b, "\n", 1);
    pthread_mutex_lock(&log_lock);
    /* Triton: everything to the log file, else INFO on stdout, WARNING and
     * ERROR on stderr. */
    FILE *out = log_file ? log_file : level == 'I' ? stdout : stderr;
    fwrite(b.p, 1, b.len, out);
    fflush(out);
    pthread_mutex_unlock(&log_lock);
    if (b.p != b.small) free(b.p);
}

void log_write(char level, const char *file, int line, const char *heading, const char *msg)
{
    log_emit(level, file, line, heading, msg, false);
}

void log_write_raw(char level, const char *file, int line, const char *msg)
{
    log_emit(level, file, line, NULL, msg, true);
}

void log_msg(char level, const char *file, int line, const char *fmt, ...)
{
    if ((level == 'I' && !log_info_enabled) || (level == 'W' && !log_warning_enabled) ||
        (level == 'E' && !log_error_enabled))
        return;
    char small[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        log_write(level, file, line, NULL, small);
        return;
    }
    char *big = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    log_write(level, file, line, NULL, big);
    free(big);
}

/* ---- Files a model configuration names ---- */

/* Whether relpath stays under its root by its text alone: relative, and no
 * ".." climbs above the start. */
static bool lexically_inside(const char *relpath)
{
    if (relpath[0] == '/') return false;
    long depth = 0;
    for (const char *seg = relpath; *seg;) {
        size_t len = strcspn(seg, "/");
        if (len == 2 && seg[0] == '.' && seg[1] == '.') {
            if (--depth < 0) return false;
        } else if (len > 0 && !(len == 1 && seg[0] == '.')) {
            depth++;
        }
        seg += len;
        if (*seg == '/') seg++;
    }
    return true;
}

util_path_status_t util_confine_path(const char *root, const char *relpath, char **resolved)
{
    if (resolved) *resolved = NULL;
    if (!lexically_inside(relpath)) return UTIL_PATH_OUTSIDE;
    char *real_root = realpath(root, NULL);
    if (!real_root) return UTIL_PATH_MISSING;
    char *joined = xasprintf("%s/%s", root, relpath);
    char *real = realpath(joined, NULL);
    int saved = errno;
    free(joined);
    if (!real) {
        free(real_root);
        errno = saved;
        return UTIL_PATH_MISSING;
    }
    size_t n = strlen(real_root);
    if (n == 1) n = 0; /* root is "/" */
    bool inside = strncmp(real, real_root, n) == 0 && (real[n] == '/' || real[n] == 0);
    free(real_root);
    if (!inside) {
        free(real);
        return UTIL_PATH_OUTSIDE;
    }
    if (resolved)
        *resolved = real;
    else
        free(real);
    return UTIL_PATH_INSIDE;
}

nereid_error_t *util_read_confined(const char *root, const char *relpath, size_t max_bytes,
                                   unsigned flags, const char *subject, char **out,
                                   size_t *out_bytes)
{
    *out = NULL;
    *out_bytes = 0;
    char *path;
    switch (util_confine_path(root, relpath, &path)) {
    case UTIL_PATH_OUTSIDE:
        return nereid_error_new(NEREID_ERROR_UNSUPPORTED, "%s is outside model directory", subject);
    case UTIL_PATH_MISSING:
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "unable to open %s: %s", subject,
                                strerror(errno));
    case UTIL_PATH_INSIDE:
        break;
    }
    /* O_NONBLOCK: opening a FIFO must not wait for a writer. O_NOFOLLOW: the
     * resolved path has no symlink left, so one appearing now is refused. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW | O_NONBLOCK);
    int saved = errno;
    free(path);
    if (fd < 0)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "unable to open %s: %s", subject,
                                strerror(saved));
    struct stat st;
    nereid_error_t *err = NULL;
    char *buf = NULL;
    size_t len = 0;
    if (fstat(fd, &st) != 0) {
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG, "unable to read %s: %s", subject,
                               strerror(errno));
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG, "%s is not a regular file", subject);
        goto done;
    }
    uint64_t size = st.st_size > 0 ? (uint64_t)st.st_size : 0;
    if (size > max_bytes && !(flags & UTIL_READ_PREFIX)) {
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "%s is %llu bytes, more than the limit of %zu bytes", subject,
                               (unsigned long long)size, max_bytes);
        goto done;
    }
    size_t want = size < max_bytes ? (size_t)size : max_bytes;
    buf = xmalloc(want + 1);
    while (len < want) {
        ssize_t n = read(fd, buf + len, want - len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            err = nereid_error_new(NEREID_ERROR_INVALID_ARG, "unable to read %s: %s", subject,
                                   strerror(errno));
            goto done;
        }
        if (n == 0) break; /* the file shrank meanwhile */
        len += (size_t)n;
    }
    buf[len] = 0;
    if ((flags & UTIL_READ_TEXT) && memchr(buf, 0, len))
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG, "%s contains a NUL byte", subject);
done:
    close(fd);
    if (err) {
        free(buf);
        return err;
    }
    *out = buf;
    *out_bytes = len;
    return NULL;
}

nereid_error_t *util_read_tensor_file(const char *root, const char *folder, const char *file,
                                      size_t tensor_bytes, bool is_string, const char *subject,
                                      char **out, size_t *out_bytes)
{
    char *rel = xasprintf("%s/%s", folder, file);
    nereid_error_t *err =
        util_read_confined(root, rel, is_string ? UTIL_STRING_DATA_FILE_MAX_BYTES : tensor_bytes,
                           is_string ? 0 : UTIL_READ_PREFIX, subject, out, out_bytes);
    free(rel);
    return err;
}

int util_dir_each(const char *dir, bool (*fn)(const char *name, bool is_dir, void *arg), void *arg)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    char buf[4096] __attribute__((aligned(8)));
    ssize_t got;
    bool go = true;
    while (go && (got = getdents64(fd, buf, sizeof buf)) > 0) {
        for (ssize_t off = 0; go && off < got;) {
            const struct dirent64 *e = (const struct dirent64 *)(buf + off);
            if (e->d_reclen == 0) break;
            off += e->d_reclen;
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            bool is_dir = e->d_type == DT_DIR;
            if (e->d_type == DT_UNKNOWN || e->d_type == DT_LNK) {
                struct stat st;
                is_dir = fstatat(fd, e->d_name, &st, 0) == 0 && S_ISDIR(st.st_mode);
            }
            go = fn(e->d_name, is_dir, arg);
        }
    }
    close(fd);
    return 0;
}
