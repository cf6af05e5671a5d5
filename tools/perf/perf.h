/* nereid-perf: a load generator for any KServe v2 inference server (Nereid,
 * Triton, replicas behind a proxy), in the spirit of Triton's perf_analyzer.
 * perf.c runs the measurement; perf_http.c and perf_grpc.c are the two
 * transports, both speaking the KServe v2 protocol. */
#ifndef NEREID_PERF_H
#define NEREID_PERF_H

#include <stddef.h>
#include <stdint.h>

#define PERF_MAX_DIMS 16
#define PERF_ERR_LEN 512

/* One model input as the request sends it. */
typedef struct {
    char *name;
    char datatype[16];
    int64_t shape[PERF_MAX_DIMS]; /* full request shape, batch dimension included */
    int n_dims;
    unsigned char *data; /* raw tensor (BYTES: 4-byte length + bytes per element) */
    size_t byte_size;
    int64_t n_elements;
} perf_input_t;

/* What a run sends: the model, its inputs, and the encoding. */
typedef struct {
    const char *url; /* host:port, or a full http:// URL */
    const char *model;
    const char *version; /* "" for the server's choice */
    perf_input_t *inputs;
    int n_inputs;
    char **outputs; /* output names from the metadata */
    int n_outputs;
    int binary_input;    /* HTTP: binary tensor data extension; else JSON arrays */
    int binary_output;   /* HTTP: ask for binary outputs */
    int sequence_header; /* also send the sequence in Nereid-Sequence-* headers */
} perf_request_t;

/* Where a request stands in its sequence (stateful models). */
typedef struct {
    uint64_t id;
    int start, end;
} perf_sequence_t;

/* Model metadata as the transports report it (shapes as the server gives
 * them, -1 for variable dimensions). */
typedef struct {
    char name[256];
    char datatype[16];
    int64_t shape[PERF_MAX_DIMS];
    int n_dims;
} perf_tensor_meta_t;

typedef struct {
    perf_tensor_meta_t *inputs, *outputs;
    int n_inputs, n_outputs;
    int max_batch_size; /* from the model configuration; 0 when unknown */
    int is_sequence;    /* the configuration has sequence_batching */
} perf_model_meta_t;

/* Cumulative server statistics of one model (the statistics extension). */
typedef struct {
    uint64_t success_count, fail_count, inference_count, execution_count;
    uint64_t queue_ns, compute_input_ns, compute_infer_ns, compute_output_ns;
} perf_server_stats_t;

typedef struct perf_conn perf_conn_t;

/* A transport. connect() returns NULL with err set on failure; infer()
 * sends one request (seq NULL outside sequences) and returns 0 on success,
 * else -1 with err set (the server's message). */
typedef struct {
    const char *name;
    void (*init)(void); /* once before anything else */
    void (*shutdown)(void);
    int (*metadata)(const perf_request_t *req, perf_model_meta_t *out, char *err);
    int (*stats)(const char *url, const perf_request_t *req, perf_server_stats_t *out, char *err);
    perf_conn_t *(*connect)(const perf_request_t *req, char *err);
    int (*infer)(perf_conn_t *conn, const perf_sequence_t *seq, char *err);
    void (*close)(perf_conn_t *conn);
} perf_transport_t;

extern const perf_transport_t perf_http_transport;
extern const perf_transport_t perf_grpc_transport;

void perf_model_meta_free(perf_model_meta_t *meta);
size_t perf_datatype_size(const char *datatype); /* 0 for BYTES or unknown */

#endif
