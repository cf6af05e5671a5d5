/*
 * This file declares the JSON mapping of Triton's generate extension
 * (POST /v2/models/<m>[/versions/<v>]/generate and /generate_stream): a
 * generate body becomes an inference request (each top-level member, and
 * each member of "parameters", is an input tensor when the model has an
 * input of that name, else a request parameter), and each response becomes
 * one flat JSON object (id, model_name, model_version and one member per
 * output, in name order; a one-element output as a scalar).
 */
#ifndef NEREID_HTTP_GENERATE_H
#define NEREID_HTTP_GENERATE_H

#include <stddef.h>

#include "http/infer_reply.h"
#include "nereid/server.h"

/* The input tensors' memory of one generate request: kept until its final
 * response. */
typedef struct generate_buffers {
    void **bufs;
    size_t n, cap;
} generate_buffers_t;

/* Builds *req_out from the generate body text[0..len) for model/version
 * (inputs read from the model's metadata; the body under the rules of every
 * JSON body; max_input_size bounds the input bytes). Tensor memory goes to
 * bufs (the caller frees it with generate_buffers_free after the request's
 * final response, or after nereid_request_free). On failure *req_out is NULL
 * and the error carries Triton's text. */
nereid_error_t *generate_request_build(nereid_server_t *core, const char *model, int64_t version,
                                       const char *text, size_t len, size_t max_input_size,
                                       nereid_request_t **req_out, generate_buffers_t *bufs);

void generate_buffers_free(generate_buffers_t *bufs);

/* Appends the generate JSON object of resp (which carries no error) to out.
 * Errors (an output JSON cannot carry) leave out as it was. */
nereid_error_t *generate_response_json(const nereid_response_t *resp, sbuf_t *out);

/* Appends {"error":"<message>"} to out; returns 0 or -1 (out of memory). */
int generate_error_json(const char *message, sbuf_t *out);

#endif
