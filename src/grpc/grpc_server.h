/*
 * This file contains the gRPC frontend's interface: it serves Triton's
 * inference.GRPCInferenceService (and grpc.health.v1.Health/Check) with the
 * gRPC core C API, calling only include/nereid/server.h.
 */
#ifndef NEREID_GRPC_SERVER_H
#define NEREID_GRPC_SERVER_H

#include "frontend/restricted.h"
#include "frontend/tls.h"
#include "nereid/server.h"
#include "nereid/shm.h"

typedef struct grpc_options {
    const char *address;                 /* "0.0.0.0" when NULL */
    int port;                            /* 8001 in Triton; 0 picks a free port */
    int infer_thread_count;              /* completion-queue threads; <= 0 means one per core */
    const restricted_apis_t *restricted; /* --grpc-restricted-protocol (borrowed); NULL = none */
    tls_options_t tls; /* --grpc-use-ssl, --grpc-use-ssl-mutual, --grpc-*-cert/key; off */
    const char *header_forward_pattern; /* --grpc-header-forward-pattern (RE2); NULL = off */
    /* client shared memory (borrowed); NULL = none registered */
    nereid_shm_registry_t *shm;
    bool reuse_port; /* --reuse-grpc-port: SO_REUSEPORT (false) */
    /* Triton's gRPC keepalive flags (grpc's channel arguments; Triton's
     * defaults from grpc_options_init; a keepalive time or timeout <= 0
     * leaves grpc's own default). */
    int keepalive_time_ms;                            /* 7200000 */
    int keepalive_timeout_ms;                         /* 20000 */
    bool keepalive_permit_without_calls;              /* false */
    int http2_max_pings_without_data;                 /* 2 */
    int http2_min_recv_ping_interval_without_data_ms; /* 300000 */
    int http2_max_ping_strikes;                       /* 2 */
    /* --grpc-infer-response-compression-level: a grpc_compression_level
     * (0 none .. 3 high) for ModelInfer and ModelStreamInfer responses */
    int infer_compression_level;
    /* --grpc-max-response-pool-size: a stream's decoupled responses queued
     * for writing at once; a producer beyond it waits (INT_MAX) */
    int max_response_pool_size;
} grpc_options_t;

typedef struct grpc_frontend grpc_frontend_t;

/* Fills opts with Triton's defaults (0.0.0.0:8001, 2 threads). */
void grpc_options_init(grpc_options_t *opts);

/* Binds address:port and starts serving server (borrowed: it must outlive
 * the frontend). On success *out is the frontend; stop it with
 * grpc_frontend_stop. Fails (UNAVAILABLE) when the port cannot be bound,
 * including when another process already listens on it, and (INVALID_ARG)
 * when TLS is on and its files cannot be read or RE2 refuses the header
 * forwarding pattern. */
nereid_error_t *grpc_frontend_start(nereid_server_t *server, const grpc_options_t *opts,
                                    grpc_frontend_t **out);
/* Starts gRPC's library (grpc_init: its threads and tables, a few ms) on
 * a thread of its own, so that the work overlaps what the caller does
 * before grpc_frontend_start (loading the models); grpc_frontend_prestart_end
 * waits for it and drops its hold on the library. Optional; one pair per
 * process, both from the main thread. */
void grpc_frontend_prestart(void);
void grpc_frontend_prestart_end(void);
/* The port actually bound (useful with port 0). */
int grpc_frontend_port(const grpc_frontend_t *fe);
/* Graceful exit (Triton's GracefulStop): the listener closes and clients
 * are told to open no more calls (a new call fails to connect); calls in
 * flight go on. A stream answers the requests it has open and then ends
 * with OK; a request that arrives on it meanwhile is refused with Triton's
 * "GRPC server is shutting down and has stopped accepting new requests.",
 * unless it continues a sequence the stream started. Any thread; NULL is
 * fine. */
void grpc_frontend_drain(grpc_frontend_t *fe);
/* Calls (unary and streams) not over yet: what a drain waits for. */
long grpc_frontend_calls(grpc_frontend_t *fe);
/* Stops accepting calls (drains if that was not done), cancels the calls
 * still open, waits until every in-flight inference callback has run, and
 * frees fe. Call it before nereid_server_free. NULL is fine. */
void grpc_frontend_stop(grpc_frontend_t *fe);

#endif
