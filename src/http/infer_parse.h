/*
 * This file contains the KServe v2 inference request parser of the HTTP
 * frontend: it turns a request body (JSON header, optionally followed by the
 * binary tensor data of Triton's binary extension) into an infer_parsed_t,
 * with no socket and no server involved, so it can be fuzzed on its own.
 * infer_parsed_to_request then builds a nereid_request_t from the result.
 *
 * Tensor data is borrowed from the body (binary inputs) or owned by the parsed
 * request (JSON inputs converted to their binary layout), so the body and the
 * parsed request must outlive the nereid_request_t built from them. The JSON
 * header is read by json_reader (arena nodes; "data" arrays converted once,
 * straight from the text into the tensor buffer).
 */
#ifndef NEREID_HTTP_INFER_PARSE_H
#define NEREID_HTTP_INFER_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "http/json_reader.h"
#include "nereid/server.h"
#include "nereid/shm.h"

/* No Inference-Header-Content-Length: the whole body is JSON. */
#define INFER_HEADER_LENGTH_NONE SIZE_MAX

typedef struct infer_input {
    const char *name; /* borrowed from the parsed JSON */
    nereid_datatype_t datatype;
    int64_t *shape; /* in the arena */
    size_t rank;
    const void *data; /* borrowed from the body or the parse arena, or == owned_data */
    size_t byte_size;
    void *owned_data;       /* JSON data converted to the binary layout, or NULL */
    const char *shm_region; /* shared_memory_region, or NULL (data set by infer_parsed_shm) */
    uint64_t shm_offset, shm_byte_size;
} infer_input_t;

typedef struct infer_output {
    const char *name; /* borrowed from the parsed JSON */
    bool binary;      /* binary_data, or the request's binary_data_output */
    uint32_t class_count;
    const char *shm_region; /* shared_memory_region, or NULL */
    uint64_t shm_offset, shm_byte_size;
} infer_output_t;

typedef struct infer_parsed {
    const char *id;
    infer_input_t *inputs;
    size_t n_inputs;
    infer_output_t *outputs;
    size_t n_outputs;
    bool binary_data_output; /* default for outputs not listed */
    bool has_sequence_id;
    uint64_t sequence_id;
    const char *sequence_id_string; /* non-NULL when given as a string */
    bool sequence_start, sequence_end;
    bool has_priority;
    uint64_t priority;
    bool has_timeout;
    uint64_t timeout_us;
    const jv_t *parameters; /* the request "parameters" object, or NULL */
    bool raw;               /* raw binary request: every output binary */
    bool has_shm;           /* some input or output names a shared memory region */
    jarena_t arena;         /* last: nodes, strings, inputs, outputs, shapes */
} infer_parsed_t;

/* Describes the single input of a model for a raw binary request. */
typedef struct infer_raw_model {
    const char *model;
    size_t n_inputs;            /* inputs in the model config */
    const char *input_name;     /* the first input */
    nereid_datatype_t datatype; /* of the first input */
    const int64_t *dims;        /* config dims, without the batch dimension */
    size_t n_dims;
    bool batching; /* max_batch_size > 0 */
} infer_raw_model_t;

/* Parses body[0..len): the first header_len bytes are JSON (the whole body
 * when header_len is INFER_HEADER_LENGTH_NONE), the rest binary input data.
 * model names the model in error texts; max_input_size caps JSON inputs.
 * On success fills *out (free with infer_parsed_free); on failure returns an
 * error with Triton's code and text and *out is zeroed. */
nereid_error_t *infer_parse(const char *body, size_t len, size_t header_len, const char *model,
                            size_t max_input_size, infer_parsed_t *out);

/* Parses a raw binary request (Inference-Header-Content-Length: 0): the whole
 * body is the one input of the model described by info. */
nereid_error_t *infer_parse_raw(const char *body, size_t len, const infer_raw_model_t *info,
                                infer_parsed_t *out);

/* Builds a request for model/version from parsed; *out borrows parsed's data
 * (and the body). Caller frees *out with nereid_request_free unless
 * nereid_server_infer_async took it. */
nereid_error_t *infer_parsed_to_request(nereid_server_t *server, const char *model, int64_t version,
                                        const infer_parsed_t *parsed, nereid_request_t **out);

/* Resolves the shared memory regions parsed names (Triton's checks and
 * texts): inputs get their data in the region, outputs their targets in
 * *use, which holds the regions until nereid_shm_use_finish/free. Nothing to
 * do when parsed->has_shm is false. */
nereid_error_t *infer_parsed_shm(infer_parsed_t *parsed, nereid_shm_registry_t *reg,
                                 nereid_shm_use_t **use);

/* Frees what parsed owns; parsed may be zeroed (or freed already). */
void infer_parsed_free(infer_parsed_t *parsed);

#endif
