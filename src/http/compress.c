/*
 * This file contains the gzip/deflate codec: "deflate" is the zlib format
 * (raw deflate is also accepted on input), "gzip" the gzip format.
 */
#include "http/compress.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>

http_encoding_t http_encoding_parse(const char *h)
{
    if (!h || !h[0] || !strcmp(h, "identity")) return HTTP_ENCODING_IDENTITY;
    if (!strcmp(h, "gzip")) return HTTP_ENCODING_GZIP;
    if (!strcmp(h, "deflate")) return HTTP_ENCODING_DEFLATE;
    return HTTP_ENCODING_UNSUPPORTED;
}

http_encoding_t http_accept_encoding(const char *h)
{
    http_encoding_t best = HTTP_ENCODING_IDENTITY;
    double best_q = -1.0;
    while (h && *h) {
        const char *end = strchr(h, ',');
        size_t n = end ? (size_t)(end - h) : strlen(h);
        const char *p = h, *stop = h + n;
        while (p < stop && isspace((unsigned char)*p))
            p++;
        const char *name = p;
        while (p < stop && *p != ';' && !isspace((unsigned char)*p))
            p++;
        size_t name_len = (size_t)(p - name);
        double q = 1.0;
        const char *semi = memchr(p, ';', (size_t)(stop - p));
        if (semi) {
            const char *qs = semi + 1;
            while (qs < stop && isspace((unsigned char)*qs))
                qs++;
            if (stop - qs >= 2 && qs[0] == 'q' && qs[1] == '=') q = strtod(qs + 2, NULL);
        }
        http_encoding_t enc = HTTP_ENCODING_UNSUPPORTED;
        if (name_len == 4 && !strncasecmp(name, "gzip", 4))
            enc = HTTP_ENCODING_GZIP;
        else if (name_len == 7 && !strncasecmp(name, "deflate", 7))
            enc = HTTP_ENCODING_DEFLATE;
        else if (name_len == 8 && !strncasecmp(name, "identity", 8))
            enc = HTTP_ENCODING_IDENTITY;
        if (enc != HTTP_ENCODING_UNSUPPORTED && q > 0 && q > best_q) {
            best = enc;
            best_q = q;
        }
        h = end ? end + 1 : NULL;
    }
    return best;
}

static nereid_error_t *too_big(size_t max)
{
    return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                            "Decompressed data size exceeds the maximum allowed value of %zu "
                            "bytes. Use --http-max-input-size to increase the limit.",
                            max);
}

static nereid_error_t *inflate_with(int window_bits, const char *in, size_t len, size_t max,
                                    char **out, size_t *out_len)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, window_bits) != Z_OK)
        return nereid_error_new(NEREID_ERROR_INTERNAL, "failed to initialize decompression");
    size_t cap = len * 4 + 64, used = 0;
    if (cap > max + 1) cap = max + 1;
    char *buf = malloc(cap);
    nereid_error_t *err = NULL;
    if (!buf) {
        inflateEnd(&zs);
        return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    }
    zs.next_in = (Bytef *)in;
    zs.avail_in = (uInt)len;
    for (;;) {
        if (used == cap) {
            if (cap > max) {
                err = too_big(max);
                break;
            }
            size_t ncap = cap * 2 > max + 1 ? max + 1 : cap * 2;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                err = nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
                break;
            }
            buf = nb;
            cap = ncap;
        }
        zs.next_out = (Bytef *)buf + used;
        zs.avail_out = (uInt)(cap - used);
        int rc = inflate(&zs, Z_NO_FLUSH);
        used = cap - zs.avail_out;
        if (rc == Z_STREAM_END) {
            if (used > max) err = too_big(max);
            break;
        }
        if (rc != Z_OK && !(rc == Z_BUF_ERROR && used == cap)) {
            err = nereid_error_new(NEREID_ERROR_INVALID_ARG, "failed to decompress the data: %s",
                                   zs.msg ? zs.msg : "truncated or corrupt input");
            break;
        }
    }
    inflateEnd(&zs);
    if (err) {
        free(buf);
        return err;
    }
    *out = buf;
    *out_len = used;
    return NULL;
}

nereid_error_t *http_decompress(http_encoding_t enc, const char *in, size_t len, size_t max,
                                char **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    if (len == 0) return nereid_error_new(NEREID_ERROR_INVALID_ARG, "nothing to be decompressed");
    if (len > UINT32_MAX) return too_big(max);
    if (enc == HTTP_ENCODING_GZIP) return inflate_with(16 + MAX_WBITS, in, len, max, out, out_len);
    /* deflate: the zlib format, or raw deflate as some clients send it. */
    nereid_error_t *err = inflate_with(MAX_WBITS, in, len, max, out, out_len);
    if (err && nereid_error_code(err) == NEREID_ERROR_INVALID_ARG &&
        strncmp(nereid_error_message(err), "Decompressed", 12)) {
        nereid_error_t *raw = inflate_with(-MAX_WBITS, in, len, max, out, out_len);
        if (!raw) {
            nereid_error_free(err);
            return NULL;
        }
        nereid_error_free(raw);
    }
    return err;
}

int http_compress(http_encoding_t enc, const reply_chunk_t *chunks, size_t n_chunks, char **out,
                  size_t *out_len)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    int bits = enc == HTTP_ENCODING_GZIP ? 16 + MAX_WBITS : MAX_WBITS;
    if (deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, bits, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        return -1;
    size_t total = 0;
    for (size_t i = 0; i < n_chunks; i++)
        total += chunks[i].byte_size;
    size_t cap = deflateBound(&zs, total) + 64 * (n_chunks + 1);
    char *buf = malloc(cap);
    if (!buf) {
        deflateEnd(&zs);
        return -1;
    }
    zs.next_out = (Bytef *)buf;
    zs.avail_out = (uInt)cap;
    int rc = Z_OK;
    for (size_t i = 0; i < n_chunks && rc == Z_OK; i++) {
        zs.next_in = (Bytef *)chunks[i].data;
        zs.avail_in = (uInt)chunks[i].byte_size;
        rc = deflate(&zs, Z_NO_FLUSH);
        if (zs.avail_in) rc = Z_BUF_ERROR;
    }
    if (rc == Z_OK) rc = deflate(&zs, Z_FINISH);
    deflateEnd(&zs);
    if (rc != Z_STREAM_END) {
        free(buf);
        return -1;
    }
    *out = buf;
    *out_len = cap - zs.avail_out;
    return 0;
}
