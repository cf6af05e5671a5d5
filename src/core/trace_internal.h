/*
 * This file contains what trace.c, trace_flags.c and trace_settings.c
 * share: the tracer, its settings and trace files, traces and their roots,
 * growing strings, and the functions one file calls in another.
 */
#ifndef NEREID_CORE_TRACE_INTERNAL_H
#define NEREID_CORE_TRACE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/otlp.h"
#include "core/trace.h"

#define TRACE_LEVEL_TIMESTAMPS 0x4u /* Triton's TRITONSERVER_TRACE_LEVEL_* bits */
#define TRACE_LEVEL_TENSORS 0x8u

typedef enum trace_mode { MODE_TRITON = 0, MODE_OPENTELEMETRY = 1 } trace_mode_t;

/* ---- Growing strings ---- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf_t;

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

typedef enum { NUM_OK, NUM_INVALID, NUM_RANGE } num_rc_t;

/* ---- trace.c ---- */

num_rc_t cxx_stoi(const char *s, int *out);
num_rc_t cxx_stoul(const char *s, unsigned long *out);
char *dupn(const char *s, size_t n);
trace_setting_t *setting_new(nereid_tracer_t *t, uint32_t level, uint32_t rate, int32_t count,
                             uint32_t log_frequency, const char *file, trace_mode_t mode);
void setting_unref(trace_setting_t *s);
void update_active(nereid_tracer_t *t);
trace_setting_t *setting_for(nereid_tracer_t *t, const char *model);

/* The server's tracer, or NULL (trace.c: the one place that reaches the
 * server's state). */
nereid_tracer_t *trace_server_tracer(nereid_server_t *server);

#endif
