/*
 * This file contains request tracing as Triton does it (server/src/tracer.cc
 * and the core's trace activities): the --trace-config flags, trace
 * settings (global and per model, with Triton's fallback and clearing
 * rules), sampling by rate and count, and the two outputs: the JSON trace
 * file of triton mode (written per setting, optionally every log_frequency
 * traces to <file>.<n>) and OpenTelemetry spans (otlp.c exports them).
 *
 * A trace is a root (one per sampled request, holding the setting it was
 * sampled by) with one handle per traced request: the request itself and,
 * for an ensemble, each step's request (parent_id = the ensemble's id).
 * References: the frontend holds one, each request holding a handle holds
 * one; the last release writes the trace (or exports its spans).
 */
#include "core/trace.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "core/core.h"
#include "core/otlp.h"
#include "core/server_internal.h"
#include "core/util.h"

#define TRACE_LEVEL_TIMESTAMPS 0x4u /* Triton's TRITONSERVER_TRACE_LEVEL_* bits */
#define TRACE_LEVEL_TENSORS 0x8u

typedef enum trace_mode { MODE_TRITON = 0, MODE_OPENTELEMETRY = 1 } trace_mode_t;

/* ---- Growing strings ---- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf_t;

static void sb_add(sbuf_t *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > b->cap)
            b->cap *= 2;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(sbuf_t *b, const char *s)
{
    sb_add(b, s, strlen(s));
}

static void sb_fmt(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_fmt(sbuf_t *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        sb_add(b, tmp, (size_t)n);
        return;
    }
    char *big = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_add(b, big, (size_t)n);
    free(big);
}

/* A JSON string literal (quotes included). */
static void sb_json_str(sbuf_t *b, const char *s)
{
    sb_add(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_add(b, e, 2);
        } else if (c < 0x20) {
            sb_fmt(b, "\\u%04x", c);
        } else {
            sb_add(b, s, 1);
        }
    }
    sb_add(b, "\"", 1);
}

/* ---- Trace files ---- */

typedef struct trace_file {
    char *name;
    int refs; /* under the tracer's files_lock */
    pthread_mutex_t lock;
    FILE *f;
    bool first_write;
    _Atomic uint32_t index; /* next <name>.<index> */
    struct trace_file *next;
} trace_file_t;

/* ---- Settings ---- */

typedef struct trace_setting {
    _Atomic int refs;
    struct nereid_tracer *tracer;
    uint32_t level, rate;
    int32_t count; /* remaining traces (-1 = unlimited); under lock */
    uint32_t log_frequency;
    trace_file_t *file;
    trace_mode_t mode;
    bool level_set, rate_set, count_set, log_frequency_set, file_set;
    const char *invalid; /* why no trace is sampled, or NULL */
    pthread_mutex_t lock;
    uint64_t sample, created, collected, sample_in_stream;
    sbuf_t stream; /* traces not yet written */
} trace_setting_t;

typedef struct model_setting {
    char *model;
    trace_setting_t *setting;
    struct model_setting *next;
} model_setting_t;

typedef struct name_node {
    char *name;
    struct name_node *next;
} name_node_t;

struct nereid_tracer {
    _Atomic int active;         /* settings with a level other than OFF */
    pthread_mutex_t write_lock; /* serializes updates */
    pthread_mutex_t read_lock;  /* guards global and models (the pointers) */
    trace_setting_t *global_default, *global;
    model_setting_t *models;
    name_node_t *fallback_models; /* models whose settings copy some global values */
    pthread_mutex_t files_lock;
    trace_file_t *files;
    /* The mode's --trace-config settings shown by the settings API. */
    char **config_keys, **config_values;
    size_t n_config;
    otel_exporter_t *exporter;
};

/* ---- Traces ---- */

#define SPAN_STACK 4

struct nereid_trace {
    struct trace_root *root;
    uint64_t id, parent_id;
    char *model_name;
    int64_t model_version;
    char *request_id;               /* set with REQUEST_START ("" when none) */
    bool started;                   /* REQUEST_START reported */
    sbuf_t stream;                  /* this id's JSON entries (triton mode) */
    otel_span_t *stack[SPAN_STACK]; /* open spans, innermost last */
    int depth;
    struct nereid_trace *next;
};

typedef struct trace_root {
    _Atomic int refs;
    pthread_mutex_t lock;
    trace_setting_t *setting;
    nereid_trace_t *handles, *last; /* creation order; the first is the root request's */
    /* opentelemetry */
    int64_t unix_offset_ns; /* realtime - monotonic at the start */
    uint8_t trace_id[16];
    char *trace_state;
    otel_span_t *root_span;
    otel_span_t *ended; /* spans to export */
} trace_root_t;

static _Atomic uint64_t next_trace_id = 1;

/* ---- C++ std::stoi / std::stoul, as Triton parses numbers ---- */

typedef enum { NUM_OK, NUM_INVALID, NUM_RANGE } num_rc_t;

static num_rc_t cxx_stoi(const char *s, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s) return NUM_INVALID;
    if (errno == ERANGE || v < INT_MIN || v > INT_MAX) return NUM_RANGE;
    *out = (int)v;
    return NUM_OK;
}

static num_rc_t cxx_stoul(const char *s, unsigned long *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (end == s) return NUM_INVALID;
    if (errno == ERANGE) return NUM_RANGE;
    *out = v;
    return NUM_OK;
}

static char *dupn(const char *s, size_t n)
{
    char *r = xmalloc(n + 1);
    memcpy(r, s, n);
    r[n] = '\0';
    return r;
}

/* ---- Files ---- */

static trace_file_t *file_get(nereid_tracer_t *t, const char *name)
{
    pthread_mutex_lock(&t->files_lock);
    trace_file_t *f = t->files;
    while (f && strcmp(f->name, name))
        f = f->next;
    if (!f) {
        f = xcalloc(1, sizeof *f);
        f->name = xstrdup(name);
        f->first_write = true;
        pthread_mutex_init(&f->lock, NULL);
        f->next = t->files;
        t->files = f;
    }
    f->refs++;
    pthread_mutex_unlock(&t->files_lock);
    return f;
}

static void file_put(nereid_tracer_t *t, trace_file_t *f)
{
    pthread_mutex_lock(&t->files_lock);
    if (--f->refs > 0) {
        pthread_mutex_unlock(&t->files_lock);
        return;
    }
    for (trace_file_t **p = &t->files; *p; p = &(*p)->next)
        if (*p == f) {
            *p = f->next;
            break;
        }
    pthread_mutex_unlock(&t->files_lock);
    if (f->f) {
        fputs("]", f->f);
        fclose(f->f);
    }
    pthread_mutex_destroy(&f->lock);
    free(f->name);
    free(f);
}

/* Appends traces (comma-separated entries) to the file, or writes them as
 * a JSON array of their own to <name>.<index>. */
static void file_save(trace_file_t *f, const sbuf_t *traces, bool to_index_file)
{
    const char *text = traces->p ? traces->p : "";
    if (to_index_file) {
        char *name = xasprintf("%s.%u", f->name, atomic_fetch_add(&f->index, 1));
        FILE *out = fopen(name, "w");
        if (!out) {
            LOG_ERROR("failed creating trace file: %s: %s", name, strerror(errno));
        } else {
            fprintf(out, "[%s]", text);
            fclose(out);
        }
        free(name);
        return;
    }
    pthread_mutex_lock(&f->lock);
    if (f->first_write) {
        f->f = fopen(f->name, "w");
        if (!f->f) {
            LOG_ERROR("failed creating trace file: %s: %s", f->name, strerror(errno));
            pthread_mutex_unlock(&f->lock);
            return;
        }
        fputs("[", f->f);
        f->first_write = false;
    } else if (f->f) {
        fputs(",", f->f);
    }
    if (f->f) {
        fputs(text, f->f);
        fflush(f->f);
    }
    pthread_mutex_unlock(&f->lock);
}

/* ---- Settings ---- */

static trace_setting_t *setting_new(nereid_tracer_t *t, uint32_t level, uint32_t rate,
                                    int32_t count, uint32_t log_frequency, const char *file,
                                    trace_mode_t mode)
{
    trace_setting_t *s = xcalloc(1, sizeof *s);
    atomic_init(&s->refs, 1);
    s->tracer = t;
    s->level = level;
    s->rate = rate;
    s->count = count;
    s->log_frequency = log_frequency;
    s->file = file_get(t, file);
    s->mode = mode;
    pthread_mutex_init(&s->lock, NULL);
    if (level == 0)
        s->invalid = "tracing is disabled";
    else if (rate == 0)
        s->invalid = "sample rate must be non-zero";
    else if (mode == MODE_TRITON && !file[0])
        s->invalid = "trace file name is not given";
    return s;
}

static void setting_ref(trace_setting_t *s)
{
    atomic_fetch_add(&s->refs, 1);
}

static void setting_unref(trace_setting_t *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1) return;
    if (s->mode == MODE_TRITON && s->stream.len > 0)
        file_save(s->file, &s->stream, s->log_frequency != 0);
    file_put(s->tracer, s->file);
    free(s->stream.p);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* Recomputes the tracer's active flag; caller holds write_lock. */
static void update_active(nereid_tracer_t *t)
{
    int active = t->global->level != 0;
    for (model_setting_t *m = t->models; m; m = m->next)
        if (m->setting->level != 0) active = 1;
    atomic_store(&t->active, active);
}

/* The setting a request to model samples by, with a reference. */
static trace_setting_t *setting_for(nereid_tracer_t *t, const char *model)
{
    pthread_mutex_lock(&t->read_lock);
    trace_setting_t *s = t->global;
    if (model)
        for (model_setting_t *m = t->models; m; m = m->next)
            if (!strcmp(m->model, model)) {
                s = m->setting;
                break;
            }
    setting_ref(s);
    pthread_mutex_unlock(&t->read_lock);
    return s;
}

/* ---- The tracer ---- */

static char *lower(const char *s)
{
    char *r = xstrdup(s);
    for (char *p = r; *p; p++)
        if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
    return r;
}

/* Triton's ParseTraceLevelOption: 0 = OFF. */
static nereid_error_t *parse_level(const char *arg, uint32_t *out)
{
    char *l = lower(arg);
    nereid_error_t *err = NULL;
    if (!strcmp(l, "false") || !strcmp(l, "off"))
        *out = 0;
    else if (!strcmp(l, "true") || !strcmp(l, "on") || !strcmp(l, "min") || !strcmp(l, "max") ||
             !strcmp(l, "timestamps"))
        *out = TRACE_LEVEL_TIMESTAMPS;
    else if (!strcmp(l, "tensors"))
        *out = TRACE_LEVEL_TENSORS;
    else
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG, "invalid value for trace level option: %s",
                               l);
    free(l);
    return err;
}

static nereid_error_t *parse_mode(const char *arg, trace_mode_t *out)
{
    char *l = lower(arg);
    nereid_error_t *err = NULL;
    if (!strcmp(l, "triton"))
        *out = MODE_TRITON;
    else if (!strcmp(l, "opentelemetry"))
        *out = MODE_OPENTELEMETRY;
    else
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "invalid value for trace mode option: %s. Available options are "
                               "\"triton\" and \"opentelemetry\"",
                               l);
    free(l);
    return err;
}

/* ParseOption<int> / ParseOption<uint32_t>. */
static nereid_error_t *parse_int(const char *arg, int *out)
{
    num_rc_t rc = cxx_stoi(arg, out);
    if (rc == NUM_INVALID)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "Invalid option value. Got %s", arg);
    if (rc == NUM_RANGE)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "Provided option value is out of bound. Got %s", arg);
    return NULL;
}

static nereid_error_t *parse_u32(const char *arg, uint32_t *out)
{
    unsigned long v;
    num_rc_t rc = cxx_stoul(arg, &v);
    if (rc == NUM_INVALID)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "Invalid option value. Got %s", arg);
    if (rc == NUM_RANGE)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "Provided option value is out of bound. Got %s", arg);
    *out = (uint32_t)v;
    return NULL;
}

/* Prefixes err with Triton's "Bad option: "<what>"." line. */
static nereid_error_t *bad_option(nereid_error_t *err, const char *what)
{
    nereid_error_t *e = nereid_error_new(NEREID_ERROR_INVALID_ARG, "Bad option: \"%s\".\n%s", what,
                                         nereid_error_message(err));
    nereid_error_free(err);
    return e;
}

typedef struct config_entry {
    int mode; /* -1 = global */
    const char *setting, *value;
} config_entry_t;

static void config_add(nereid_tracer_t *t, const char *key, const char *value)
{
    t->config_keys = xrealloc(t->config_keys, (t->n_config + 1) * sizeof *t->config_keys);
    t->config_values = xrealloc(t->config_values, (t->n_config + 1) * sizeof *t->config_values);
    t->config_keys[t->n_config] = xstrdup(key);
    t->config_values[t->n_config++] = xstrdup(value);
}

nereid_error_t *nereid_tracer_new(const char *const *names, const char *const *values, size_t n,
                                  nereid_tracer_t **out)
{
    *out = NULL;
    uint32_t level = 0, lv;
    int rate = 1000, count = -1, log_frequency = 0;
    const char *file = "";
    trace_mode_t mode = MODE_TRITON;
    bool explicit_off = false, level_flag = false, rate_flag = false, count_flag = false,
         file_flag = false, logf_flag = false;
    config_entry_t *entries = xcalloc(n ? n : 1, sizeof *entries);
    char **owned = xcalloc(n ? 2 * n : 1, sizeof *owned);
    size_t n_entries = 0, n_owned = 0;
    nereid_error_t *err = NULL;
    for (size_t i = 0; !err && i < n; i++) {
        const char *name = names[i], *v = values[i];
        char what[64];
        snprintf(what, sizeof what, "--%s", name);
        if (!strcmp(name, "trace-file")) {
            fprintf(stderr, "Warning: '--trace-file' has been deprecated and will be removed in "
                            "future releases. Please use '--trace-config triton,file=<filepath> "
                            "instead.\n");
            file_flag = true;
            file = v;
        } else if (!strcmp(name, "trace-level")) {
            fprintf(stderr, "Warning: '--trace-level' has been deprecated and will be removed in "
                            "future releases. Please use '--trace-config "
                            "level=<OFF|TIMESTAMPS|TENSORS> instead.\n");
            level_flag = true;
            if (!(err = parse_level(v, &lv))) {
                explicit_off |= lv == 0;
                level |= lv;
            }
        } else if (!strcmp(name, "trace-rate")) {
            fprintf(stderr, "Warning: '--trace-rate' has been deprecated and will be removed in "
                            "future releases. Please use '--trace-config rate=<rate value> "
                            "instead.\n");
            rate_flag = true;
            err = parse_int(v, &rate);
        } else if (!strcmp(name, "trace-count")) {
            fprintf(stderr, "Warning: '--trace-count' has been deprecated and will be removed in "
                            "future releases. Please use '--trace-config count=<count value> "
                            "instead.\n");
            count_flag = true;
            err = parse_int(v, &count);
        } else if (!strcmp(name, "trace-log-frequency")) {
            fprintf(stderr, "Warning: '--trace-log-frequency' has been deprecated and will be "
                            "removed in future releases. Please use '--trace-config "
                            "triton,log-frequency=<log frequency value> instead.\n");
            logf_flag = true;
            err = parse_int(v, &log_frequency);
        } else {
            /* --trace-config [<mode>,]<setting>=<value> */
            const char *comma = strchr(v, ',');
            const char *eq = strchr(comma ? comma + 1 : v, '=');
            int m = -1;
            if (comma == v) {
                err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                       "No trace mode specified. --trace-config option format is "
                                       "<trace mode>,<setting>=<value> or <setting>=<value>. Got "
                                       "%s",
                                       v);
            } else if (comma) {
                char *ms = dupn(v, (size_t)(comma - v));
                trace_mode_t pm;
                err = parse_mode(ms, &pm);
                free(ms);
                m = (int)pm;
            }
            const char *setting_start = comma ? comma + 1 : v;
            if (!err && (!eq || eq == setting_start || !eq[1]))
                err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                       "--trace-config option format is '<trace "
                                       "mode>,<setting>=<value>'. Got %s",
                                       v);
            if (!err) {
                char *setting = dupn(setting_start, (size_t)(eq - setting_start));
                owned[n_owned++] = setting;
                entries[n_entries++] = (config_entry_t){m, setting, eq + 1};
            }
        }
        if (err) err = bad_option(err, what);
    }
    /* Global settings (SetGlobalTraceArgs). */
    for (size_t i = 0; !err && i < n_entries; i++) {
        config_entry_t *e = &entries[i];
        if (e->mode != -1) continue;
        if (!strcmp(e->setting, "rate")) {
            if (rate_flag)
                fprintf(stderr, "Warning: Overriding deprecated '--trace-rate' in favor of "
                                "provided rate value in --trace-config!\n");
            err = parse_int(e->value, &rate);
        } else if (!strcmp(e->setting, "level")) {
            if (level_flag)
                fprintf(stderr, "Warning: Overriding deprecated '--trace-level' in favor of "
                                "provided level in --trace-config!\n");
            if (!(err = parse_level(e->value, &lv))) {
                explicit_off |= lv == 0;
                level |= lv;
            }
        } else if (!strcmp(e->setting, "mode")) {
            err = parse_mode(e->value, &mode);
        } else if (!strcmp(e->setting, "count")) {
            if (count_flag)
                fprintf(stderr, "Warning: Overriding deprecated '--trace-count' in favor of "
                                "provided count in --trace-config!\n");
            err = parse_int(e->value, &count);
        }
        if (err) {
            char what[128];
            snprintf(what, sizeof what, "--trace-config %s", e->setting);
            err = bad_option(err, what);
        }
    }
    nereid_tracer_t *t = xcalloc(1, sizeof *t);
    pthread_mutex_init(&t->write_lock, NULL);
    pthread_mutex_init(&t->read_lock, NULL);
    pthread_mutex_init(&t->files_lock, NULL);
    /* Mode settings (SetTritonTraceArgs / SetOpenTelemetryTraceArgs). */
    const char *url = "http://localhost:4318/v1/traces";
    uint32_t bsp[3];
    bool bsp_set[3] = {false, false, false};
    static const char *const bsp_keys[3] = {"bsp_max_queue_size", "bsp_schedule_delay",
                                            "bsp_max_export_batch_size"};
    static const char *const bsp_env[3] = {"OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_SCHEDULE_DELAY",
                                           "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"};
    static const char *const bsp_default[3] = {"2048", "5000", "512"};
    const char **res_keys = xcalloc(n_entries + 64, sizeof *res_keys);
    const char **res_values = xcalloc(n_entries + 64, sizeof *res_values);
    size_t n_res = 0;
    if (!err && mode == MODE_OPENTELEMETRY) {
        if (file_flag)
            fprintf(stderr, "Warning: '--trace-file' is deprecated and will be ignored with "
                            "opentelemetry tracing mode. \n");
        if (logf_flag)
            fprintf(stderr, "Warning: '--trace-log-frequency' is deprecated and will be ignored "
                            "with opentelemetry tracing mode.\n");
    }
    for (size_t i = 0; !err && i < n_entries; i++) {
        config_entry_t *e = &entries[i];
        if (e->mode != (int)mode) continue;
        if (mode == MODE_TRITON) {
            if (!strcmp(e->setting, "file")) {
                if (file_flag)
                    fprintf(stderr, "Warning: Overriding deprecated '--trace-file' in favor of "
                                    "provided file in --trace-config!\n");
                file = e->value;
            } else if (!strcmp(e->setting, "log-frequency")) {
                if (logf_flag)
                    fprintf(stderr, "Warning: Overriding deprecated '--trace-log-frequency' in "
                                    "favor of provided log-frequency in --trace-config!\n");
                err = parse_int(e->value, &log_frequency);
                if (err) {
                    char what[128];
                    snprintf(what, sizeof what, "--trace-config triton,%s", e->setting);
                    err = bad_option(err, what);
                }
            } else {
                config_add(t, e->setting, e->value);
            }
            continue;
        }
        int b = -1;
        for (int k = 0; k < 3; k++)
            if (!strcmp(e->setting, bsp_keys[k])) b = k;
        if (b >= 0) {
            err = parse_u32(e->value, &bsp[b]);
            if (err) {
                char what[128];
                snprintf(what, sizeof what, "--trace-config opentelemetry,%s", e->setting);
                err = bad_option(err, what);
                break;
            }
            bsp_set[b] = true;
            char num[16];
            snprintf(num, sizeof num, "%u", bsp[b]);
            config_add(t, e->setting, num);
            continue;
        }
        config_add(t, e->setting, e->value);
    }
    if (!err && mode == MODE_OPENTELEMETRY) {
        for (int k = 0; !err && k < 3; k++) {
            if (bsp_set[k]) continue;
            const char *env = getenv(bsp_env[k]);
            const char *v = env ? env : bsp_default[k];
            err = parse_u32(v, &bsp[k]);
            if (err) {
                char what[64];
                snprintf(what, sizeof what, "%s", bsp_env[k]);
                err = bad_option(err, what);
                break;
            }
            char num[16];
            snprintf(num, sizeof num, "%u", bsp[k]);
            config_add(t, bsp_keys[k], num);
        }
        /* Resource: OTEL_RESOURCE_ATTRIBUTES, then Triton's service.name,
         * then each resource=<key>=<value> (a later key replaces). */
        const char *env = getenv("OTEL_RESOURCE_ATTRIBUTES");
        char *env_copy = env ? xstrdup(env) : NULL;
        if (env_copy) owned[n_owned++] = env_copy;
        for (char *save = NULL, *kv = env_copy ? strtok_r(env_copy, ",", &save) : NULL;
             kv && n_res < 60; kv = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(kv, '=');
            if (!eq) continue;
            *eq = '\0';
            res_keys[n_res] = kv;
            res_values[n_res++] = eq + 1;
        }
        res_keys[n_res] = "service.name";
        res_values[n_res++] = "triton-inference-server";
        for (size_t i = 0; i < n_entries; i++) {
            config_entry_t *e = &entries[i];
            if (e->mode != MODE_OPENTELEMETRY) continue;
            if (!strcmp(e->setting, "url")) url = e->value;
            if (!strcmp(e->setting, "resource")) {
                const char *eq = strchr(e->value, '=');
                /* Triton: substr(0, npos) and substr(npos + 1): no '=' gives
                 * the whole text as key and value. */
                char *key = eq ? dupn(e->value, (size_t)(eq - e->value)) : xstrdup(e->value);
                owned[n_owned++] = key;
                res_keys[n_res] = key;
                res_values[n_res++] = eq ? eq + 1 : e->value;
            }
        }
    }
    if (!err && explicit_off) level = 0;
    if (!err) {
        if ((level & TRACE_LEVEL_TENSORS) && mode == MODE_OPENTELEMETRY)
            LOG_WARN("Tensor level tracing is not supported by the mode: opentelemetry");
        t->global_default =
            setting_new(t, level, (uint32_t)rate, count, (uint32_t)log_frequency, file, mode);
        t->global =
            setting_new(t, level, (uint32_t)rate, count, (uint32_t)log_frequency, file, mode);
        atomic_store(&t->active, level != 0);
        if (mode == MODE_OPENTELEMETRY) {
            otel_exporter_options_t eo = {url, res_keys, res_values, n_res, bsp[0], bsp[1], bsp[2]};
            t->exporter = otel_exporter_new(&eo);
            if (!t->exporter)
                err = nereid_error_new(NEREID_ERROR_INTERNAL,
                                       "failed to start the OpenTelemetry exporter thread");
        }
    }
    free(res_keys);
    free(res_values);
    for (size_t i = 0; i < n_owned; i++)
        free(owned[i]);
    free(owned);
    free(entries);
    if (err) {
        nereid_tracer_free(t);
        return err;
    }
    *out = t;
    return NULL;
}

void nereid_tracer_free(nereid_tracer_t *t)
{
    if (!t) return;
    while (t->models) {
        model_setting_t *m = t->models;
        t->models = m->next;
        setting_unref(m->setting);
        free(m->model);
        free(m);
    }
    while (t->fallback_models) {
        name_node_t *f = t->fallback_models;
        t->fallback_models = f->next;
        free(f->name);
        free(f);
    }
    setting_unref(t->global);
    setting_unref(t->global_default);
    otel_exporter_free(t->exporter);
    for (size_t i = 0; i < t->n_config; i++) {
        free(t->config_keys[i]);
        free(t->config_values[i]);
    }
    free(t->config_keys);
    free(t->config_values);
    pthread_mutex_destroy(&t->write_lock);
    pthread_mutex_destroy(&t->read_lock);
    pthread_mutex_destroy(&t->files_lock);
    free(t);
}

void nereid_server_set_tracer(nereid_server_t *server, nereid_tracer_t *tracer)
{
    server->tracer = tracer;
}

bool nereid_server_tracing(nereid_server_t *server)
{
    nereid_tracer_t *t = server->tracer;
    return t && atomic_load_explicit(&t->active, memory_order_relaxed);
}

uint64_t nereid_trace_now_ns(void)
{
    return util_now_ns();
}

/* ---- Sampling ---- */

static int64_t unix_offset_ns(void)
{
    struct timespec rt, mono;
    clock_gettime(CLOCK_REALTIME, &rt);
    clock_gettime(CLOCK_MONOTONIC, &mono);
    return ((int64_t)rt.tv_sec - (int64_t)mono.tv_sec) * 1000000000ll +
           ((int64_t)rt.tv_nsec - (int64_t)mono.tv_nsec);
}

static nereid_trace_t *handle_new(trace_root_t *r, uint64_t parent_id)
{
    nereid_trace_t *h = xcalloc(1, sizeof *h);
    h->root = r;
    h->id = atomic_fetch_add(&next_trace_id, 1);
    h->parent_id = parent_id;
    if (r->last)
        r->last->next = h;
    else
        r->handles = h;
    r->last = h;
    return h;
}

nereid_trace_t *nereid_server_trace_start(nereid_server_t *server, const char *model,
                                          const char *traceparent, const char *tracestate)
{
    nereid_tracer_t *t = server->tracer;
    if (!t || !atomic_load_explicit(&t->active, memory_order_relaxed)) return NULL;
    trace_setting_t *s = setting_for(t, model);
    uint8_t remote_trace[16], remote_span[8];
    bool force = s->level != 0 && s->mode == MODE_OPENTELEMETRY &&
                 otel_parse_traceparent(traceparent, remote_trace, remote_span);
    bool hit = false;
    pthread_mutex_lock(&s->lock);
    if (s->rate != 0 && (s->invalid == NULL || force)) {
        hit = (++s->sample % s->rate) == 0;
        if (hit && s->count > 0) {
            s->count--;
            s->created++;
        } else if (hit && s->count == 0) {
            hit = false;
        }
    }
    pthread_mutex_unlock(&s->lock);
    if (!hit && !force) {
        setting_unref(s);
        return NULL;
    }
    trace_root_t *r = xcalloc(1, sizeof *r);
    atomic_init(&r->refs, 1);
    pthread_mutex_init(&r->lock, NULL);
    r->setting = s; /* the reference taken above */
    nereid_trace_t *h = handle_new(r, 0);
    if (s->mode == MODE_OPENTELEMETRY) {
        r->unix_offset_ns = unix_offset_ns();
        otel_span_t *span =
            otel_span_new("InferRequest", (uint64_t)((int64_t)util_now_ns() + r->unix_offset_ns));
        if (force) {
            memcpy(r->trace_id, remote_trace, 16);
            memcpy(span->parent_span_id, remote_span, 8);
            span->has_parent = true;
            if (tracestate && tracestate[0]) r->trace_state = xstrdup(tracestate);
        } else {
            otel_random_id(r->trace_id, 16);
        }
        memcpy(span->trace_id, r->trace_id, 16);
        otel_random_id(span->span_id, 8);
        if (r->trace_state) span->trace_state = xstrdup(r->trace_state);
        r->root_span = span;
        h->stack[h->depth++] = span;
    }
    return h;
}

/* ---- Activities ---- */

static nereid_trace_t *handle_by_id(trace_root_t *r, uint64_t id)
{
    for (nereid_trace_t *h = r->handles; h; h = h->next)
        if (h->id == id) return h;
    return NULL;
}

static void otel_start_span(nereid_trace_t *h, const char *name, bool request_span, uint64_t ns)
{
    trace_root_t *r = h->root;
    otel_span_t *parent = NULL;
    if (request_span && h->parent_id != 0) {
        nereid_trace_t *p = handle_by_id(r, h->parent_id);
        if (p && p->depth > 0) parent = p->stack[p->depth - 1];
    } else if (h->depth > 0) {
        parent = h->stack[h->depth - 1];
    }
    otel_span_t *span = otel_span_new(name, (uint64_t)((int64_t)ns + r->unix_offset_ns));
    memcpy(span->trace_id, r->trace_id, 16);
    otel_random_id(span->span_id, 8);
    if (parent) {
        memcpy(span->parent_span_id, parent->span_id, 8);
        span->has_parent = true;
    } else if (r->root_span && r->root_span->has_parent) {
        memcpy(span->parent_span_id, r->root_span->parent_span_id, 8);
        span->has_parent = true;
    }
    if (r->trace_state) span->trace_state = xstrdup(r->trace_state);
    if (h->depth < SPAN_STACK) {
        h->stack[h->depth++] = span;
    } else {
        otel_span_free(span);
    }
}

static void otel_end_span(nereid_trace_t *h, uint64_t unix_ns)
{
    if (h->depth == 0) return;
    otel_span_t *span = h->stack[--h->depth];
    span->end_unix_ns = unix_ns;
    span->next = h->root->ended;
    h->root->ended = span;
}

static const char *const activity_names[] = {
    "REQUEST_START",        "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"};
enum {
    ACT_REQUEST_START,
    ACT_QUEUE_START,
    ACT_COMPUTE_START,
    ACT_COMPUTE_INPUT_END,
    ACT_COMPUTE_OUTPUT_START,
    ACT_COMPUTE_END,
    ACT_REQUEST_END
};

/* A core activity of handle h; caller holds the root's lock. */
static void activity_locked(nereid_trace_t *h, int act, uint64_t ns, const char *request_id)
{
    trace_root_t *r = h->root;
    if (!(r->setting->level & TRACE_LEVEL_TIMESTAMPS)) return;
    const char *name = activity_names[act];
    if (r->setting->mode == MODE_OPENTELEMETRY) {
        if (act == ACT_REQUEST_START) {
            otel_start_span(h, h->model_name, true, ns);
            otel_span_t *s = h->stack[h->depth - 1];
            otel_span_attr_str(s, "triton.model_name", h->model_name);
            otel_span_attr_int(s, "triton.model_version", h->model_version);
            otel_span_attr_int(s, "triton.trace_id", (int64_t)h->id);
            otel_span_attr_int(s, "triton.trace_parent_id", (int64_t)h->parent_id);
            if (request_id && request_id[0]) otel_span_attr_str(s, "triton.request_id", request_id);
        } else if (act == ACT_COMPUTE_START) {
            otel_start_span(h, "compute", false, ns);
        }
        uint64_t unix_ns = (uint64_t)((int64_t)ns + r->unix_offset_ns);
        if (h->depth > 0) otel_span_add_event(h->stack[h->depth - 1], name, unix_ns);
        if (act == ACT_REQUEST_END || act == ACT_COMPUTE_END) otel_end_span(h, unix_ns);
        return;
    }
    sbuf_t *b = &h->stream;
    if (b->len) sb_add(b, ",", 1);
    if (act == ACT_REQUEST_START) {
        sb_fmt(b, "{\"id\":%llu,\"model_name\":", (unsigned long long)h->id);
        sb_json_str(b, h->model_name);
        sb_fmt(b, ",\"model_version\":%lld", (long long)h->model_version);
        if (request_id && request_id[0]) {
            sb_str(b, ",\"request_id\":");
            sb_json_str(b, request_id);
        }
        if (h->parent_id) sb_fmt(b, ",\"parent_id\":%llu", (unsigned long long)h->parent_id);
        sb_str(b, "},");
    }
    sb_fmt(b, "{\"id\":%llu,\"timestamps\":[{\"name\":\"%s\",\"ns\":%llu}]}",
           (unsigned long long)h->id, name, (unsigned long long)ns);
}

/* Triton mode: a named timestamp entry of handle h (root's lock held). */
static void stamp_locked(nereid_trace_t *h, const char *name, uint64_t ns)
{
    sbuf_t *b = &h->stream;
    if (b->len) sb_add(b, ",", 1);
    sb_fmt(b, "{\"id\":%llu,\"timestamps\":[{\"name\":", (unsigned long long)h->id);
    sb_json_str(b, name);
    sb_fmt(b, ",\"ns\":%llu}]}", (unsigned long long)ns);
}

void nereid_trace_timestamp(nereid_trace_t *h, const char *name, uint64_t ns)
{
    if (!h) return;
    trace_root_t *r = h->root;
    if (!(r->setting->level & TRACE_LEVEL_TIMESTAMPS)) return;
    pthread_mutex_lock(&r->lock);
    if (r->setting->mode == MODE_OPENTELEMETRY) {
        if (r->root_span)
            otel_span_add_event(r->root_span, name, (uint64_t)((int64_t)ns + r->unix_offset_ns));
    } else {
        /* Frontend timestamps go to the trace's own id (Triton's
         * Trace::CaptureTimestamp). */
        stamp_locked(r->handles, name, ns);
    }
    pthread_mutex_unlock(&r->lock);
}

void nereid_trace_activity(nereid_trace_t *h, const char *name, uint64_t ns)
{
    if (!h || !name) return;
    trace_root_t *r = h->root;
    pthread_mutex_lock(&r->lock);
    if (!(r->setting->level & TRACE_LEVEL_TIMESTAMPS)) {
        /* not recorded */
    } else if (r->setting->mode == MODE_OPENTELEMETRY) {
        if (h->depth > 0)
            otel_span_add_event(h->stack[h->depth - 1], name,
                                (uint64_t)((int64_t)ns + r->unix_offset_ns));
    } else {
        stamp_locked(h, name, ns);
    }
    pthread_mutex_unlock(&r->lock);
}

void nereid_trace_info(const nereid_trace_t *h, uint64_t *id, uint64_t *parent_id,
                       const char **model_name, int64_t *model_version, const char **request_id)
{
    if (id) *id = h ? h->id : 0;
    if (parent_id) *parent_id = h ? h->parent_id : 0;
    if (model_name) *model_name = h ? h->model_name : NULL;
    if (model_version) *model_version = h ? h->model_version : 0;
    if (request_id) *request_id = h && h->request_id ? h->request_id : "";
}

void trace_request_start(nereid_request_t *req)
{
    nereid_trace_t *h = req->trace;
    trace_root_t *r = h->root;
    pthread_mutex_lock(&r->lock);
    if (!h->model_name) {
        h->model_name = xstrdup(req->model->name);
        h->model_version = req->model->version;
    }
    h->started = true;
    if (!h->request_id) h->request_id = xstrdup(req->id ? req->id : "");
    activity_locked(h, ACT_REQUEST_START, req->t_request_ns, req->id);
    activity_locked(h, ACT_QUEUE_START, req->t_queue_start_ns, NULL);
    pthread_mutex_unlock(&r->lock);
}

void trace_compute(nereid_trace_t *h, uint64_t start_ns, uint64_t input_end_ns,
                   uint64_t output_start_ns, uint64_t end_ns)
{
    trace_root_t *r = h->root;
    pthread_mutex_lock(&r->lock);
    activity_locked(h, ACT_COMPUTE_START, start_ns, NULL);
    activity_locked(h, ACT_COMPUTE_INPUT_END, input_end_ns, NULL);
    activity_locked(h, ACT_COMPUTE_OUTPUT_START, output_start_ns, NULL);
    activity_locked(h, ACT_COMPUTE_END, end_ns, NULL);
    pthread_mutex_unlock(&r->lock);
}

/* ---- Tensor activities ---- */

/* One element of a tensor as Triton's tracer writes it with a C++ stream:
 * integers in decimal, 8-bit integers as the character they hold, bools as
 * 0/1, floats with six significant digits (here JSON-escaped, so that a
 * quote byte does not break the file). */
static void sb_element(sbuf_t *b, nereid_datatype_t dt, const unsigned char *p)
{
    switch (dt) {
    case NEREID_TYPE_BOOL:
        sb_str(b, p[0] ? "1" : "0");
        break;
    case NEREID_TYPE_UINT8:
    case NEREID_TYPE_INT8: {
        char c[2] = {(char)p[0], 0};
        if (c[0] == '"' || c[0] == '\\' || (unsigned char)c[0] < 0x20)
            sb_fmt(b, "\\u%04x", (unsigned)p[0]);
        else
            sb_str(b, c);
        break;
    }
#define INT_CASE(T, ctype, fmt, cast)                                                              \
    case T: {                                                                                      \
        ctype v;                                                                                   \
        memcpy(&v, p, sizeof v);                                                                   \
        sb_fmt(b, fmt, (cast)v);                                                                   \
        break;                                                                                     \
    }
        INT_CASE(NEREID_TYPE_UINT16, uint16_t, "%u", unsigned)
        INT_CASE(NEREID_TYPE_UINT32, uint32_t, "%u", unsigned)
        INT_CASE(NEREID_TYPE_UINT64, uint64_t, "%llu", unsigned long long)
        INT_CASE(NEREID_TYPE_INT16, int16_t, "%d", int)
        INT_CASE(NEREID_TYPE_INT32, int32_t, "%d", int)
        INT_CASE(NEREID_TYPE_INT64, int64_t, "%lld", long long)
        INT_CASE(NEREID_TYPE_FP32, float, "%g", double)
        INT_CASE(NEREID_TYPE_FP64, double, "%g", double)
#undef INT_CASE
    default:
        break;
    }
}

/* One tensor activity entry on h's stream; caller holds the root's lock. */
static void tensor_locked(nereid_trace_t *h, const char *activity, const char *name,
                          nereid_datatype_t dt, const int64_t *shape, size_t rank, const void *data,
                          size_t byte_size)
{
    uint64_t count = 1;
    for (size_t i = 0; i < rank; i++)
        count *= (uint64_t)(shape[i] > 0 ? shape[i] : 0);
    size_t esize = nereid_datatype_byte_size(dt);
    if (esize && count * esize > byte_size) return; /* never read past the buffer */
    sbuf_t *b = &h->stream;
    if (b->len) sb_add(b, ",", 1);
    sb_fmt(b, "{\"id\":%llu,\"activity\":\"%s\",\"tensor\":{\"name\":", (unsigned long long)h->id,
           activity);
    sb_json_str(b, name);
    sb_str(b, ",\"data\":\"");
    const unsigned char *p = data;
    if (dt == NEREID_TYPE_BYTES) {
        size_t off = 0;
        for (uint64_t e = 0; e < count; e++) {
            uint32_t len;
            if (off + 4 > byte_size) break;
            memcpy(&len, p + off, 4);
            off += 4;
            if (off + len > byte_size) break;
            /* Triton writes \"<element>\"; the element JSON-escaped */
            sbuf_t tmp = {0};
            char *s = dupn((const char *)p + off, len);
            sb_json_str(&tmp, s);
            free(s);
            sb_str(b, "\\\"");
            if (tmp.len >= 2) sb_add(b, tmp.p + 1, tmp.len - 2);
            sb_str(b, "\\\"");
            free(tmp.p);
            off += len;
            if (e + 1 < count) sb_add(b, ",", 1);
        }
    } else if (esize && dt != NEREID_TYPE_FP16 && dt != NEREID_TYPE_BF16) {
        for (uint64_t e = 0; e < count; e++) {
            sb_element(b, dt, p + e * esize);
            if (e + 1 < count) sb_add(b, ",", 1);
        }
    }
    sb_str(b, "\",\"shape\":\"");
    for (size_t i = 0; i < rank; i++)
        sb_fmt(b, "%s%lld", i ? "," : "", (long long)shape[i]);
    sb_fmt(b, "\",\"dtype\":\"%s\"}}", nereid_datatype_name(dt));
}

static bool tensors_traced(const nereid_trace_t *h)
{
    const trace_setting_t *s = h->root->setting;
    return (s->level & TRACE_LEVEL_TENSORS) && s->mode == MODE_TRITON;
}

void trace_queue_inputs(nereid_request_t *req)
{
    nereid_trace_t *h = req->trace;
    if (!h || !tensors_traced(h)) return;
    trace_root_t *r = h->root;
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; i < req->n_inputs; i++) {
        const req_input_t *in = &req->inputs[i];
        tensor_locked(h, "TENSOR_QUEUE_INPUT", in->name, in->datatype, in->shape, in->rank,
                      in->data, in->byte_size);
    }
    pthread_mutex_unlock(&r->lock);
}

void trace_response_outputs(nereid_trace_t *h, const nereid_response_t *resp)
{
    if (!h || !tensors_traced(h) || resp->error) return;
    trace_root_t *r = h->root;
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; i < resp->n_outputs; i++) {
        const resp_output_t *o = &resp->outputs[i];
        tensor_locked(h, "TENSOR_BACKEND_OUTPUT", o->name, o->datatype, o->shape, o->rank, o->data,
                      o->byte_size);
    }
    pthread_mutex_unlock(&r->lock);
}

/* ---- Release: writing and exporting ---- */

static void setting_write_trace(trace_setting_t *s, trace_root_t *r)
{
    pthread_mutex_lock(&s->lock);
    s->sample_in_stream++;
    s->collected++;
    for (nereid_trace_t *h = r->handles; h; h = h->next) {
        if (!h->stream.len) continue;
        if (s->stream.len) sb_add(&s->stream, ",", 1);
        sb_add(&s->stream, h->stream.p, h->stream.len);
    }
    if ((s->count == 0 && s->collected == s->sample) ||
        (s->log_frequency != 0 && s->sample_in_stream >= s->log_frequency)) {
        s->sample_in_stream = 0;
        sbuf_t out = s->stream;
        s->stream = (sbuf_t){0};
        pthread_mutex_unlock(&s->lock);
        file_save(s->file, &out, true);
        free(out.p);
        return;
    }
    pthread_mutex_unlock(&s->lock);
}

static void root_free(trace_root_t *r)
{
    trace_setting_t *s = r->setting;
    if (s->mode == MODE_OPENTELEMETRY) {
        uint64_t unix_now = (uint64_t)((int64_t)util_now_ns() + r->unix_offset_ns);
        for (nereid_trace_t *h = r->handles; h; h = h->next)
            while (h->depth > 0)
                otel_end_span(h, unix_now);
        if (s->tracer->exporter && r->ended)
            otel_exporter_submit(s->tracer->exporter, r->ended);
        else
            while (r->ended) {
                otel_span_t *n = r->ended->next;
                otel_span_free(r->ended);
                r->ended = n;
            }
        r->ended = NULL;
    } else {
        setting_write_trace(s, r);
    }
    while (r->handles) {
        nereid_trace_t *h = r->handles;
        r->handles = h->next;
        free(h->stream.p);
        free(h->model_name);
        free(h->request_id);
        free(h);
    }
    free(r->trace_state);
    pthread_mutex_destroy(&r->lock);
    setting_unref(s);
    free(r);
}

void nereid_trace_release(nereid_trace_t *h)
{
    if (!h) return;
    trace_root_t *r = h->root;
    if (atomic_fetch_sub(&r->refs, 1) == 1) root_free(r);
}

void nereid_request_set_trace(nereid_request_t *req, nereid_trace_t *h)
{
    if (req->trace) nereid_trace_release(req->trace);
    req->trace = NULL;
    if (!h) return;
    atomic_fetch_add(&h->root->refs, 1);
    req->trace = h;
}

void trace_request_end(nereid_request_t *req)
{
    nereid_trace_t *h = req->trace;
    req->trace = NULL;
    if (h->started) {
        trace_root_t *r = h->root;
        pthread_mutex_lock(&r->lock);
        activity_locked(h, ACT_REQUEST_END, util_now_ns(), NULL);
        pthread_mutex_unlock(&r->lock);
    }
    nereid_trace_release(h);
}

static nereid_trace_t *trace_spawn_child(nereid_trace_t *parent)
{
    trace_root_t *r = parent->root;
    atomic_fetch_add(&r->refs, 1);
    pthread_mutex_lock(&r->lock);
    nereid_trace_t *h = handle_new(r, parent->id);
    pthread_mutex_unlock(&r->lock);
    return h;
}

void request_inherit_trace(nereid_request_t *step, const nereid_request_t *parent)
{
    step->trace = trace_spawn_child(parent->trace);
}

/* ---- Settings API ---- */

static nereid_error_t *check_model(nereid_server_t *s, const char *model)
{
    if (!model || !model[0]) return NULL;
    bool ready = false;
    nereid_error_t *err = nereid_server_model_is_ready(s, model, -1, &ready);
    nereid_error_free(err);
    if (ready) return NULL;
    return nereid_error_new(NEREID_ERROR_INVALID_ARG, "Request for unknown model : %s", model);
}

static const char *mode_name(trace_mode_t m)
{
    return m == MODE_OPENTELEMETRY ? "opentelemetry" : "triton";
}

nereid_error_t *nereid_server_trace_settings(nereid_server_t *server, const char *model,
                                             char **json_out)
{
    *json_out = NULL;
    nereid_tracer_t *t = server->tracer;
    if (!t)
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE, "the server does not support tracing");
    nereid_error_t *err = check_model(server, model);
    if (err) return err;
    trace_setting_t *s = setting_for(t, model && model[0] ? model : NULL);
    pthread_mutex_lock(&s->lock);
    int32_t count = s->count;
    pthread_mutex_unlock(&s->lock);
    json_t *doc = json_object();
    json_t *levels = json_array();
    if (s->level == 0) json_array_append_new(levels, json_string("OFF"));
    if (s->level & TRACE_LEVEL_TIMESTAMPS) json_array_append_new(levels, json_string("TIMESTAMPS"));
    if (s->level & TRACE_LEVEL_TENSORS) json_array_append_new(levels, json_string("TENSORS"));
    json_object_set_new(doc, "trace_level", levels);
    char num[32];
    snprintf(num, sizeof num, "%u", s->rate);
    json_object_set_new(doc, "trace_rate", json_string(num));
    snprintf(num, sizeof num, "%d", count);
    json_object_set_new(doc, "trace_count", json_string(num));
    if (s->mode == MODE_TRITON) {
        snprintf(num, sizeof num, "%u", s->log_frequency);
        json_object_set_new(doc, "log_frequency", json_string(num));
        json_object_set_new(doc, "trace_file", json_string(s->file->name));
    }
    json_object_set_new(doc, "trace_mode", json_string(mode_name(s->mode)));
    for (size_t i = 0; i < t->n_config; i++)
        json_object_set_new(doc, t->config_keys[i], json_string(t->config_values[i]));
    setting_unref(s);
    *json_out = json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(doc);
    if (!*json_out) return nereid_error_new(NEREID_ERROR_INTERNAL, "unable to serialize JSON");
    return NULL;
}

/* Triton's TraceManager::NewSetting. */
typedef struct new_setting {
    bool clear_level, clear_rate, clear_count, clear_log_frequency;
    const uint32_t *level, *rate, *log_frequency;
    const int32_t *count;
} new_setting_t;

static bool fallback_has(nereid_tracer_t *t, const char *model, bool remove)
{
    for (name_node_t **p = &t->fallback_models; *p; p = &(*p)->next)
        if (!strcmp((*p)->name, model)) {
            if (remove) {
                name_node_t *n = *p;
                *p = n->next;
                free(n->name);
                free(n);
            }
            return true;
        }
    return false;
}

/* UpdateTraceSettingInternal; caller holds write_lock. */
static nereid_error_t *update_internal(nereid_tracer_t *t, const char *model,
                                       const new_setting_t *ns)
{
    const trace_setting_t *cur = NULL, *fb;
    model_setting_t *ms = NULL;
    if (model) {
        for (ms = t->models; ms && strcmp(ms->model, model); ms = ms->next)
            ;
        if (ms) cur = ms->setting;
        fb = t->global;
    } else {
        cur = t->global;
        fb = t->global_default;
    }
    uint32_t level = fb->level, rate = fb->rate, log_frequency = fb->log_frequency;
    int32_t count = fb->count;
    const char *file = fb->file->name;
    bool level_set = !ns->clear_level && ((cur && cur->level_set) || ns->level);
    bool rate_set = !ns->clear_rate && ((cur && cur->rate_set) || ns->rate);
    bool count_set = !ns->clear_count && ((cur && cur->count_set) || ns->count);
    bool logf_set =
        !ns->clear_log_frequency && ((cur && cur->log_frequency_set) || ns->log_frequency);
    bool file_set = cur && cur->file_set;
    if (level_set) level = ns->level ? *ns->level : cur->level;
    if (rate_set) rate = ns->rate ? *ns->rate : cur->rate;
    if (count_set) count = ns->count ? *ns->count : cur->count;
    if (logf_set) log_frequency = ns->log_frequency ? *ns->log_frequency : cur->log_frequency;
    if (file_set) file = cur->file->name;
    if (model) {
        bool all = level_set && rate_set && count_set && logf_set && file_set;
        bool none = !(level_set || rate_set || count_set || logf_set || file_set);
        if (all) {
            fallback_has(t, model, true);
        } else if (none) {
            if (ms) {
                pthread_mutex_lock(&t->read_lock);
                for (model_setting_t **p = &t->models; *p; p = &(*p)->next)
                    if (*p == ms) {
                        *p = ms->next;
                        break;
                    }
                pthread_mutex_unlock(&t->read_lock);
                setting_unref(ms->setting);
                free(ms->model);
                free(ms);
            }
            return NULL;
        } else if (!fallback_has(t, model, false)) {
            name_node_t *n = xcalloc(1, sizeof *n);
            n->name = xstrdup(model);
            n->next = t->fallback_models;
            t->fallback_models = n;
        }
    }
    trace_setting_t *s = setting_new(t, level, rate, count, log_frequency, file, fb->mode);
    s->level_set = level_set;
    s->rate_set = rate_set;
    s->count_set = count_set;
    s->log_frequency_set = logf_set;
    s->file_set = file_set;
    if (s->invalid && level != 0) {
        nereid_error_t *err = nereid_error_new(
            NEREID_ERROR_INVALID_ARG, "Attempting to set invalid trace setting :%s", s->invalid);
        setting_unref(s);
        return err;
    }
    trace_setting_t *old;
    pthread_mutex_lock(&t->read_lock);
    if (!model) {
        old = t->global;
        t->global = s;
    } else if (ms) {
        old = ms->setting;
        ms->setting = s;
    } else {
        old = NULL;
        ms = xcalloc(1, sizeof *ms);
        ms->model = xstrdup(model);
        ms->setting = s;
        ms->next = t->models;
        t->models = ms;
    }
    pthread_mutex_unlock(&t->read_lock);
    setting_unref(old);
    return NULL;
}

static nereid_error_t *update(nereid_tracer_t *t, const char *model, const new_setting_t *ns)
{
    pthread_mutex_lock(&t->write_lock);
    nereid_error_t *err = update_internal(t, model, ns);
    if (!err && !model) {
        /* Models that copy global values take the new ones. */
        new_setting_t none = {0};
        size_t n = 0;
        for (name_node_t *f = t->fallback_models; f; f = f->next)
            n++;
        char **names = xcalloc(n ? n : 1, sizeof *names);
        n = 0;
        for (name_node_t *f = t->fallback_models; f; f = f->next)
            names[n++] = xstrdup(f->name);
        for (size_t i = 0; i < n; i++) {
            if (!err) err = update_internal(t, names[i], &none);
            free(names[i]);
        }
        free(names);
    }
    update_active(t);
    pthread_mutex_unlock(&t->write_lock);
    return err;
}

static const nereid_trace_setting_t *find_key(const nereid_trace_setting_t *settings, size_t n,
                                              const char *key)
{
    for (size_t i = 0; i < n; i++)
        if (settings[i].key && !strcmp(settings[i].key, key)) return &settings[i];
    return NULL;
}

/* One number setting: stoi, Triton's texts. */
static nereid_error_t *number_setting(const nereid_trace_setting_t *v, bool grpc, bool is_count,
                                      int *out)
{
    if (grpc && v->n_values > 1)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "expect only 1 value for '%s'", v->key);
    const char *text = v->values[0] ? v->values[0] : "";
    num_rc_t rc = cxx_stoi(text, out);
    if (rc == NUM_INVALID)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "Unable to parse '%s', got: %s", v->key,
                                text);
    if (rc == NUM_RANGE)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "Unable to parse '%s', value is out of range [ %s, %s ], got: %s",
                                v->key, is_count ? "-1" : "0",
                                is_count ? "2147483647" : "4294967295", text);
    if (is_count && *out < -1)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "Unable to parse 'trace_count'. Expecting value >= -1, got:%s%s",
                                grpc ? " " : "", text);
    return NULL;
}

nereid_error_t *nereid_server_update_trace_settings(nereid_server_t *server, const char *model,
                                                    const nereid_trace_setting_t *settings,
                                                    size_t n, bool grpc, char **json_out)
{
    *json_out = NULL;
    nereid_tracer_t *t = server->tracer;
    if (!t)
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE, "the server does not support tracing");
    nereid_error_t *err = check_model(server, model);
    if (err) return err;
    if (grpc && n == 0) return nereid_server_trace_settings(server, model, json_out);
    if (find_key(settings, n, "trace_file"))
        return nereid_error_new(NEREID_ERROR_UNSUPPORTED,
                                "trace file location can not be updated through network protocol");
    new_setting_t ns = {0};
    uint32_t level = 0, rate, log_frequency;
    int32_t count;
    const nereid_trace_setting_t *v = find_key(settings, n, "trace_level");
    if (v) {
        if (v->type_error) return nereid_error_new(NEREID_ERROR_INTERNAL, "%s", v->type_error);
        if (!v->values) {
            ns.clear_level = true;
        } else {
            for (size_t i = 0; i < v->n_values; i++) {
                const char *l = v->values[i] ? v->values[i] : "";
                if (!strcmp(l, "OFF")) {
                    if (v->n_values != 1)
                        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                                "Expect only one trace level 'OFF' is specified");
                    level = 0;
                    ns.level = &level;
                } else if (!strcmp(l, "TIMESTAMPS")) {
                    level |= TRACE_LEVEL_TIMESTAMPS;
                    ns.level = &level;
                } else if (!strcmp(l, "TENSORS")) {
                    level |= TRACE_LEVEL_TENSORS;
                    ns.level = &level;
                }
            }
        }
    }
    static const char *const num_keys[3] = {"trace_rate", "trace_count", "log_frequency"};
    for (int k = 0; k < 3; k++) {
        v = find_key(settings, n, num_keys[k]);
        if (!v) continue;
        if (v->type_error) return nereid_error_new(NEREID_ERROR_INTERNAL, "%s", v->type_error);
        if (!v->values || (grpc && v->n_values == 0)) {
            if (k == 0) ns.clear_rate = true;
            if (k == 1) ns.clear_count = true;
            if (k == 2) ns.clear_log_frequency = true;
            continue;
        }
        int value = 0;
        if (v->n_values == 0) continue;
        if ((err = number_setting(v, grpc, k == 1, &value))) return err;
        if (k == 0) {
            rate = (uint32_t)value;
            ns.rate = &rate;
        } else if (k == 1) {
            count = value;
            ns.count = &count;
        } else {
            log_frequency = (uint32_t)value;
            ns.log_frequency = &log_frequency;
        }
    }
    err = update(t, model && model[0] ? model : NULL, &ns);
    if (err) return err;
    return nereid_server_trace_settings(server, model, json_out);
}
