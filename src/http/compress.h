/*
 * This file contains the gzip/deflate codec of the HTTP frontend (zlib):
 * request bodies with Content-Encoding and replies for Accept-Encoding.
 */
#ifndef NEREID_HTTP_COMPRESS_H
#define NEREID_HTTP_COMPRESS_H

#include <stddef.h>

#include "http/infer_reply.h"
#include "nereid/server.h"

typedef enum http_encoding {
    HTTP_ENCODING_IDENTITY,
    HTTP_ENCODING_GZIP,
    HTTP_ENCODING_DEFLATE,
    HTTP_ENCODING_UNSUPPORTED,
} http_encoding_t;

/* Content-Encoding of a request: NULL/""/identity, gzip, deflate (exact). */
http_encoding_t http_encoding_parse(const char *header);

/* The highest-weighted of identity/gzip/deflate in Accept-Encoding. */
http_encoding_t http_accept_encoding(const char *header);

/* Decompresses in[0..len) into a malloc'ed *out (caller frees); the result
 * may not exceed max bytes. Errors are Triton's texts (400). */
nereid_error_t *http_decompress(http_encoding_t enc, const char *in, size_t len, size_t max,
                                char **out, size_t *out_len);

/* Compresses the concatenation of chunks into a malloc'ed *out. Returns 0,
 * or -1 (then the caller sends the reply uncompressed). */
int http_compress(http_encoding_t enc, const reply_chunk_t *chunks, size_t n_chunks, char **out,
                  size_t *out_len);

#endif
