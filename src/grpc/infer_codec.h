/*
 * This file contains the conversion between Triton's gRPC inference messages
 * (inference.ModelInferRequest / ModelInferResponse /
 * ModelStreamInferResponse) and Nereid's in-process requests and responses.
 */
#ifndef NEREID_GRPC_INFER_CODEC_H
#define NEREID_GRPC_INFER_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>

#include "grpc_service.pb-c.h"
#include "nereid/server.h"
#include "nereid/shm.h"

/* Buffers made while converting typed contents; they back the request's
 * inputs until its completion callback has run. */
typedef struct infer_scratch {
    void **bufs;
    size_t n_bufs;
    nereid_shm_registry_t *shm; /* set by the caller: where regions are found */
    nereid_shm_use_t *shm_use;  /* regions the request uses */
    bool shm_outputs;           /* some output goes to shared memory */
} infer_scratch_t;

/* Finishes the request's use of shared memory and frees the buffers. */
void infer_scratch_free(infer_scratch_t *s);

/* The response allocator a request built with s needs: NULL (Nereid's own
 * buffers) unless outputs go to shared memory; then *storage, which writes
 * them into their regions (s must live until the request completes). */
const nereid_response_allocator_t *infer_codec_allocator(infer_scratch_t *s,
                                                         nereid_response_allocator_t *storage);

/* Unpacks a ModelInferRequest; NULL (and *err INVALID_ARG) when malformed.
 * Free with inference__model_infer_request__free_unpacked(msg, NULL). */
Inference__ModelInferRequest *infer_codec_parse(const uint8_t *data, size_t len,
                                                nereid_error_t **err);

/* Parses a version string as Triton does: "" = -1 (policy), else an integer.
 * Errors are INVALID_ARG with Triton's text. */
nereid_error_t *infer_codec_version(const char *s, int64_t *out);

/* Builds a request from msg: id, parameters, inputs (typed contents or raw,
 * all or nothing), requested outputs (with classification). Inputs borrow
 * msg's memory and scratch's buffers: both must live until the request
 * completes or is freed. */
nereid_error_t *infer_codec_request(nereid_server_t *server,
                                    const Inference__ModelInferRequest *msg,
                                    infer_scratch_t *scratch, nereid_request_t **out);

/* Serializes a successful response as ModelInferResponse (stream = false) or
 * as ModelStreamInferResponse{infer_response} with the response parameter
 * triton_final_response = true (stream = true). Outputs go in
 * raw_output_contents; large outputs are referenced, not copied. Takes
 * ownership of resp in every case. NULL with *err on failure. */
grpc_byte_buffer *infer_codec_response(nereid_response_t *resp, bool stream, nereid_error_t **err);

/* infer_codec_response(resp, true, err) with triton_final_response = final
 * (a decoupled model's responses before its last are not final). */
grpc_byte_buffer *infer_codec_stream_response(nereid_response_t *resp, bool final,
                                              nereid_error_t **err);

/* A ModelStreamInferResponse carrying error_message (may be "": a decoupled
 * model's empty final response) and, in infer_response, only id, model_name
 * and model_version (each may be NULL); final >= 0 adds the
 * triton_final_response parameter with that value (final < 0: none, as for
 * a request that could not be submitted). */
grpc_byte_buffer *infer_codec_stream_error(const char *message, const char *id, const char *model,
                                           const char *version, int final);

#endif
