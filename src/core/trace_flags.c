/*
 * This file contains the tracer's construction from the --trace-config
 * flags (Triton's names, values and errors, server/src/tracer.cc and
 * main.cc): the global setting, the mode's settings and the exporter.
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
#include "core/util.h"
#include "core/trace_internal.h"

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

/* What the flags say, gathered before the tracer is built. */
typedef struct trace_flags {
    uint32_t level;
    int rate, count, log_frequency;
    const char *file;
    trace_mode_t mode;
    bool explicit_off; /* a level was OFF: tracing stays off */
    bool level_flag, rate_flag, count_flag, file_flag, logf_flag; /* deprecated flags given */
    config_entry_t *entries; /* the --trace-config settings, in order */
    size_t n_entries;
    char **owned; /* strings the entries and the resource point into */
    size_t n_owned;
} trace_flags_t;

/* The OpenTelemetry exporter's options, from the mode's settings. */
typedef struct otel_flags {
    const char *url;
    uint32_t bsp[3];
    bool bsp_set[3];
    const char **res_keys, **res_values; /* the resource's attributes */
    size_t n_res;
} otel_flags_t;

static const char *const bsp_keys[3] = {"bsp_max_queue_size", "bsp_schedule_delay",
                                        "bsp_max_export_batch_size"};
static const char *const bsp_env[3] = {"OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_SCHEDULE_DELAY",
                                       "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"};
static const char *const bsp_default[3] = {"2048", "5000", "512"};

/* --trace-config [<mode>,]<setting>=<value>: one entry for later. */
static nereid_error_t *read_config_entry(trace_flags_t *f, const char *v)
{
    nereid_error_t *err = NULL;
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
        f->owned[f->n_owned++] = setting;
        f->entries[f->n_entries++] = (config_entry_t){m, setting, eq + 1};
    }
    return err;
}

/* One flag: a deprecated --trace-* flag takes effect now, a --trace-config
 * is kept for the steps below. */
static nereid_error_t *read_flag(trace_flags_t *f, const char *name, const char *v)
{
    nereid_error_t *err = NULL;
    char what[64];
    snprintf(what, sizeof what, "--%s", name);
    uint32_t lv;
    if (!strcmp(name, "trace-file")) {
        fprintf(stderr, "Warning: '--trace-file' has been deprecated and will be removed in "
                        "future releases. Please use '--trace-config triton,file=<filepath> "
                        "instead.\n");
        f->file_flag = true;
        f->file = v;
    } else if (!strcmp(name, "trace-level")) {
        fprintf(stderr, "Warning: '--trace-level' has been deprecated and will be removed in "
                        "future releases. Please use '--trace-config "
                        "level=<OFF|TIMESTAMPS|TENSORS> instead.\n");
        f->level_flag = true;
        if (!(err = parse_level(v, &lv))) {
            f->explicit_off |= lv == 0;
            f->level |= lv;
        }
    } else if (!strcmp(name, "trace-rate")) {
        fprintf(stderr, "Warning: '--trace-rate' has been deprecated and will be removed in "
                        "future releases. Please use '--trace-config rate=<rate value> "
                        "instead.\n");
        f->rate_flag = true;
        err = parse_int(v, &f->rate);
    } else if (!strcmp(name, "trace-count")) {
        fprintf(stderr, "Warning: '--trace-count' has been deprecated and will be removed in "
                        "future releases. Please use '--trace-config count=<count value> "
                        "instead.\n");
        f->count_flag = true;
        err = parse_int(v, &f->count);
    } else if (!strcmp(name, "trace-log-frequency")) {
        fprintf(stderr, "Warning: '--trace-log-frequency' has been deprecated and will be "
                        "removed in future releases. Please use '--trace-config "
                        "triton,log-frequency=<log frequency value> instead.\n");
        f->logf_flag = true;
        err = parse_int(v, &f->log_frequency);
    } else {
        err = read_config_entry(f, v);
    }
    return err ? bad_option(err, what) : NULL;
}

/* Global settings (Triton's SetGlobalTraceArgs). */
static nereid_error_t *apply_global_settings(trace_flags_t *f)
{
    nereid_error_t *err = NULL;
    uint32_t lv;
    for (size_t i = 0; !err && i < f->n_entries; i++) {
        config_entry_t *e = &f->entries[i];
        if (e->mode != -1) continue;
        if (!strcmp(e->setting, "rate")) {
            if (f->rate_flag)
                fprintf(stderr, "Warning: Overriding deprecated '--trace-rate' in favor of "
                                "provided rate value in --trace-config!\n");
            err = parse_int(e->value, &f->rate);
        } else if (!strcmp(e->setting, "level")) {
            if (f->level_flag)
                fprintf(stderr, "Warning: Overriding deprecated '--trace-level' in favor of "
                                "provided level in --trace-config!\n");
            if (!(err = parse_level(e->value, &lv))) {
                f->explicit_off |= lv == 0;
                f->level |= lv;
            }
        } else if (!strcmp(e->setting, "mode")) {
            err = parse_mode(e->value, &f->mode);
        } else if (!strcmp(e->setting, "count")) {
            if (f->count_flag)
                fprintf(stderr, "Warning: Overriding deprecated '--trace-count' in favor of "
                                "provided count in --trace-config!\n");
            err = parse_int(e->value, &f->count);
        }
        if (err) {
            char what[128];
            snprintf(what, sizeof what, "--trace-config %s", e->setting);
            err = bad_option(err, what);
        }
    }
    return err;
}

/* The mode's settings (Triton's SetTritonTraceArgs /
 * SetOpenTelemetryTraceArgs): the settings API shows them. */
static nereid_error_t *apply_mode_settings(trace_flags_t *f, nereid_tracer_t *t, otel_flags_t *o)
{
    nereid_error_t *err = NULL;
    if (f->mode == MODE_OPENTELEMETRY) {
        if (f->file_flag)
            fprintf(stderr, "Warning: '--trace-file' is deprecated and will be ignored with "
                            "opentelemetry tracing mode. \n");
        if (f->logf_flag)
            fprintf(stderr, "Warning: '--trace-log-frequency' is deprecated and will be ignored "
                            "with opentelemetry tracing mode.\n");
    }
    for (size_t i = 0; !err && i < f->n_entries; i++) {
        config_entry_t *e = &f->entries[i];
        if (e->mode != (int)f->mode) continue;
        if (f->mode == MODE_TRITON) {
            if (!strcmp(e->setting, "file")) {
                if (f->file_flag)
                    fprintf(stderr, "Warning: Overriding deprecated '--trace-file' in favor of "
                                    "provided file in --trace-config!\n");
                f->file = e->value;
            } else if (!strcmp(e->setting, "log-frequency")) {
                if (f->logf_flag)
                    fprintf(stderr, "Warning: Overriding deprecated '--trace-log-frequency' in "
                                    "favor of provided log-frequency in --trace-config!\n");
                err = parse_int(e->value, &f->log_frequency);
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
            err = parse_u32(e->value, &o->bsp[b]);
            if (err) {
                char what[128];
                snprintf(what, sizeof what, "--trace-config opentelemetry,%s", e->setting);
                err = bad_option(err, what);
                break;
            }
            o->bsp_set[b] = true;
            char num[16];
            snprintf(num, sizeof num, "%u", o->bsp[b]);
            config_add(t, e->setting, num);
            continue;
        }
        config_add(t, e->setting, e->value);
    }
    return err;
}

/* OpenTelemetry: the batch span processor's settings not given (from the
 * environment, else the defaults), the exporter's url and resource. */
static nereid_error_t *apply_otel_defaults(trace_flags_t *f, nereid_tracer_t *t, otel_flags_t *o)
{
    nereid_error_t *err = NULL;
    for (int k = 0; !err && k < 3; k++) {
        if (o->bsp_set[k]) continue;
        const char *env = getenv(bsp_env[k]);
        const char *v = env ? env : bsp_default[k];
        err = parse_u32(v, &o->bsp[k]);
        if (err) {
            char what[64];
            snprintf(what, sizeof what, "%s", bsp_env[k]);
            err = bad_option(err, what);
            break;
        }
        char num[16];
        snprintf(num, sizeof num, "%u", o->bsp[k]);
        config_add(t, bsp_keys[k], num);
    }
    if (err) return err;
    /* Resource: OTEL_RESOURCE_ATTRIBUTES, then Triton's service.name,
     * then each resource=<key>=<value> (a later key replaces). */
    const char *env = getenv("OTEL_RESOURCE_ATTRIBUTES");
    char *env_copy = env ? xstrdup(env) : NULL;
    if (env_copy) f->owned[f->n_owned++] = env_copy;
    for (char *save = NULL, *kv = env_copy ? strtok_r(env_copy, ",", &save) : NULL;
         kv && o->n_res < 60; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) continue;
        *eq = '\0';
        o->res_keys[o->n_res] = kv;
        o->res_values[o->n_res++] = eq + 1;
    }
    o->res_keys[o->n_res] = "service.name";
    o->res_values[o->n_res++] = "triton-inference-server";
    for (size_t i = 0; i < f->n_entries; i++) {
        config_entry_t *e = &f->entries[i];
        if (e->mode != MODE_OPENTELEMETRY) continue;
        if (!strcmp(e->setting, "url")) o->url = e->value;
        if (!strcmp(e->setting, "resource")) {
            const char *eq = strchr(e->value, '=');
            /* Triton: substr(0, npos) and substr(npos + 1): no '=' gives
             * the whole text as key and value. */
            char *key = eq ? dupn(e->value, (size_t)(eq - e->value)) : xstrdup(e->value);
            f->owned[f->n_owned++] = key;
            o->res_keys[o->n_res] = key;
            o->res_values[o->n_res++] = eq ? eq + 1 : e->value;
        }
    }
    return NULL;
}

/* The global settings and, in opentelemetry mode, the exporter. */
static nereid_error_t *tracer_start(nereid_tracer_t *t, const trace_flags_t *f,
                                    const otel_flags_t *o)
{
    if ((f->level & TRACE_LEVEL_TENSORS) && f->mode == MODE_OPENTELEMETRY)
        LOG_WARN("Tensor level tracing is not supported by the mode: opentelemetry");
    t->global_default = setting_new(t, f->level, (uint32_t)f->rate, f->count,
                                    (uint32_t)f->log_frequency, f->file, f->mode);
    t->global = setting_new(t, f->level, (uint32_t)f->rate, f->count, (uint32_t)f->log_frequency,
                            f->file, f->mode);
    atomic_store(&t->active, f->level != 0);
    if (f->mode == MODE_OPENTELEMETRY) {
        otel_exporter_options_t eo = {o->url,    o->res_keys, o->res_values, o->n_res,
                                      o->bsp[0], o->bsp[1],   o->bsp[2]};
        t->exporter = otel_exporter_new(&eo);
        if (!t->exporter)
            return nereid_error_new(NEREID_ERROR_INTERNAL,
                                    "failed to start the OpenTelemetry exporter thread");
    }
    return NULL;
}

nereid_error_t *nereid_tracer_new(const char *const *names, const char *const *values, size_t n,
                                  nereid_tracer_t **out)
{
    *out = NULL;
    trace_flags_t f = {.rate = 1000, .count = -1, .file = "", .mode = MODE_TRITON};
    f.entries = xcalloc(n ? n : 1, sizeof *f.entries);
    f.owned = xcalloc(n ? 2 * n : 1, sizeof *f.owned);
    nereid_error_t *err = NULL;
    for (size_t i = 0; !err && i < n; i++)
        err = read_flag(&f, names[i], values[i]);
    if (!err) err = apply_global_settings(&f);
    nereid_tracer_t *t = xcalloc(1, sizeof *t);
    pthread_mutex_init(&t->write_lock, NULL);
    pthread_mutex_init(&t->read_lock, NULL);
    pthread_mutex_init(&t->files_lock, NULL);
    otel_flags_t o = {.url = "http://localhost:4318/v1/traces"};
    o.res_keys = xcalloc(f.n_entries + 64, sizeof *o.res_keys);
    o.res_values = xcalloc(f.n_entries + 64, sizeof *o.res_values);
    if (!err) err = apply_mode_settings(&f, t, &o);
    if (!err && f.mode == MODE_OPENTELEMETRY) err = apply_otel_defaults(&f, t, &o);
    if (!err && f.explicit_off) f.level = 0;
    if (!err) err = tracer_start(t, &f, &o);
    free(o.res_keys);
    free(o.res_values);
    for (size_t i = 0; i < f.n_owned; i++)
        free(f.owned[i]);
    free(f.owned);
    free(f.entries);
    if (err) {
        nereid_tracer_free(t);
        return err;
    }
    *out = t;
    return NULL;
}
