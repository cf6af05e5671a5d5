/*
 * This file contains the OpenTelemetry side of tracing: spans as Triton's
 * opentelemetry mode produces them, and a batch exporter that sends ended
 * spans to an OTLP/HTTP collector (protobuf, POST <url>) from its own
 * thread, so that a request never waits for the network.
 */
#ifndef NEREID_OTLP_H
#define NEREID_OTLP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct otel_event {
    char *name;
    uint64_t time_unix_ns;
} otel_event_t;

typedef struct otel_attr {
    const char *key; /* static */
    bool is_int;
    int64_t i;
    char *s; /* owned when !is_int */
} otel_attr_t;

#define OTEL_MAX_ATTRS 5

typedef struct otel_span {
    uint8_t trace_id[16], span_id[8], parent_span_id[8];
    bool has_parent;
    char *name;
    char *trace_state; /* the propagated W3C tracestate, or NULL */
    uint64_t start_unix_ns, end_unix_ns;
    otel_event_t *events;
    size_t n_events, cap_events;
    otel_attr_t attrs[OTEL_MAX_ATTRS];
    size_t n_attrs;
    struct otel_span *next; /* exporter queue link */
} otel_span_t;

/* A new span named name (copied); ids are left to the caller. */
otel_span_t *otel_span_new(const char *name, uint64_t start_unix_ns);
void otel_span_add_event(otel_span_t *span, const char *name, uint64_t time_unix_ns);
void otel_span_attr_int(otel_span_t *span, const char *key, int64_t value);
void otel_span_attr_str(otel_span_t *span, const char *key, const char *value);
void otel_span_free(otel_span_t *span);
/* Random non-zero ids (thread-local generator seeded from getrandom). */
void otel_random_id(uint8_t *out, size_t n);

/* Parses a W3C traceparent header value ("00-<32 hex>-<16 hex>-<2 hex>");
 * false when absent or invalid (all-zero ids, version ff, bad hex). */
bool otel_parse_traceparent(const char *value, uint8_t trace_id[16], uint8_t span_id[8]);

typedef struct otel_exporter otel_exporter_t;

typedef struct otel_exporter_options {
    const char *url;
    const char *const *resource_keys; /* resource attributes, last one wins per key */
    const char *const *resource_values;
    size_t n_resource;
    uint32_t max_queue_size;        /* spans held at most; more are dropped */
    uint32_t schedule_delay_ms;     /* export at least this often when spans wait */
    uint32_t max_export_batch_size; /* spans per request at most; a full batch exports at once */
} otel_exporter_options_t;

/* Starts the exporter thread. NULL if the thread can not start. */
otel_exporter_t *otel_exporter_new(const otel_exporter_options_t *opts);
/* Queues ended spans (a list linked by next; takes ownership). Never blocks
 * on the network: spans beyond max_queue_size are dropped (and counted). */
void otel_exporter_submit(otel_exporter_t *e, otel_span_t *spans);
/* Exports what is queued, stops the thread, frees e. */
void otel_exporter_free(otel_exporter_t *e);

#endif
