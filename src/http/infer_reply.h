/*
 * This file contains the inference reply builder of the HTTP frontend: the
 * response JSON (Triton's key order, JSON or binary outputs, classification)
 * and the list of body chunks that follow it. Binary outputs are referenced in
 * place (the buffers the core wrote into), never copied.
 */
#ifndef NEREID_HTTP_INFER_REPLY_H
#define NEREID_HTTP_INFER_REPLY_H

#include <stddef.h>

#include "http/infer_parse.h"
#include "nereid/server.h"

typedef struct reply_chunk {
    const void *data; /* borrowed: the response's output buffer or reply memory */
    size_t byte_size;
} reply_chunk_t;

/* Binary outputs totalling at most this many bytes are copied into the JSON
 * buffer (chunks[0] then holds the whole body). */
#define INFER_REPLY_INLINE_MAX 4096
#define INFER_REPLY_INLINE_OUTPUTS 8

typedef struct infer_reply {
    char *json;            /* owned; the JSON header, then inlined binary outputs */
    size_t json_len;       /* of the JSON header alone (Inference-Header-Content-Length) */
    reply_chunk_t *chunks; /* chunks[0] is the JSON; binary outputs follow in order */
    size_t n_chunks;
    bool binary;  /* any binary output: octet-stream + Inference-Header-Content-Length */
    void **owned; /* classification buffers the chunks point into */
    size_t n_owned;
    /* chunks and owned for replies of up to 7 outputs (no allocation);
     * the reply must not move once built */
    reply_chunk_t inline_chunks[INFER_REPLY_INLINE_OUTPUTS];
    void *inline_owned[INFER_REPLY_INLINE_OUTPUTS];
} infer_reply_t;

/* Builds the reply for resp (which must carry no error) to the request
 * parsed. Chunks borrow resp's output buffers: keep them alive until the reply
 * is sent. On failure returns the error and *out is zeroed. */
nereid_error_t *infer_reply_build(const nereid_response_t *resp, const infer_parsed_t *parsed,
                                  infer_reply_t *out);

void infer_reply_free(infer_reply_t *reply);

/* Appends s as a JSON string literal (quotes and escapes) to a growable
 * buffer; used by the frontend for small documents. Returns 0 or -1 (OOM). */
typedef struct sbuf {
    char *data;
    size_t len, cap;
} sbuf_t;

/* Appends the tensor (byte_size bytes of datatype dt at data; BYTES
 * serialized with 4-byte length prefixes) as one flat JSON array, as the
 * "data" of an inference reply. FP16/BF16 are INVALID_ARG, as in Triton. */
nereid_error_t *infer_reply_write_data(sbuf_t *b, nereid_datatype_t dt, const void *data,
                                       size_t byte_size, const char *name);

int sbuf_reserve(sbuf_t *b, size_t extra);
int sbuf_append(sbuf_t *b, const char *s, size_t n);
int sbuf_append_str(sbuf_t *b, const char *s);
int sbuf_append_json_string(sbuf_t *b, const char *s, size_t n);

#endif
