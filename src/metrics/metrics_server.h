/*
 * This file contains the metrics frontend's interface: Prometheus text from
 * nereid_server_metrics served on the metrics port the way Triton serves it.
 */
#ifndef NEREID_METRICS_SERVER_H
#define NEREID_METRICS_SERVER_H

#include "nereid/server.h"

typedef struct metrics_options {
    const char *address; /* default: the HTTP address */
    int port;            /* --metrics-port, default 8002; 0 = any free port */
    bool cpu_metrics;    /* --allow-cpu-metrics, default true: the nv_cpu_* gauges */
    int interval_ms;     /* --metrics-interval-ms, default 2000: host metrics polling */
} metrics_options_t;

typedef struct metrics_server metrics_server_t;

void metrics_options_init(metrics_options_t *opts);

/* Starts serving core's metrics (core borrowed until metrics_server_stop).
 * On failure an UNAVAILABLE error and *out is NULL. */
nereid_error_t *metrics_server_start(nereid_server_t *core, const metrics_options_t *opts,
                                     metrics_server_t **out);

int metrics_server_port(const metrics_server_t *server);

/* Stops and frees; NULL is fine. */
void metrics_server_stop(metrics_server_t *server);

#endif
