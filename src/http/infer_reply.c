/*
 * This file contains the inference reply builder: a hand-written JSON writer
 * for the response header (numeric arrays are the hot part, so they are
 * written straight from the output buffers, without a JSON tree), binary
 * outputs as borrowed chunks, and classification through
 * nereid_response_classify.
 */
#include "http/infer_reply.h"

#include "http/numfmt.h"
#include "http/par.h"
#include "http/swar.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Growable buffer ------------------------------------------------------ */

int sbuf_reserve(sbuf_t *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

int sbuf_append(sbuf_t *b, const char *s, size_t n)
{
    if (sbuf_reserve(b, n)) return -1;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int sbuf_append_str(sbuf_t *b, const char *s)
{
    return sbuf_append(b, s, strlen(s));
}

/* Appends a string literal (its length known at compile time). */
#define SBUF_LIT(b, lit) sbuf_append((b), (lit), sizeof(lit) - 1)

/* Appends v in decimal. */
static int sbuf_append_u64(sbuf_t *b, uint64_t v)
{
    if (sbuf_reserve(b, 20)) return -1;
    b->len = (size_t)(numfmt_u64(b->data + b->len, v) - b->data);
    b->data[b->len] = '\0';
    return 0;
}

int sbuf_append_json_string(sbuf_t *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    if (sbuf_reserve(b, n * 6 + 2)) return -1;
    char *o = b->data + b->len;
    *o++ = '"';
    for (size_t i = 0; i < n; i++) {
        /* Plain bytes eight at a time, up to the first one to escape. */
        while (n - i >= 8) {
            uint64_t x;
            memcpy(&x, s + i, 8);
            uint64_t m = swar_json_specials(x);
            size_t k = m ? (size_t)__builtin_ctzll(m) >> 3 : 8;
            memcpy(o, s + i, 8); /* room: n * 6 reserved */
            o += k;
            i += k;
            if (m) break;
        }
        if (i == n) break;
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            *o++ = '\\';
            *o++ = (char)c;
        } else if (c < 0x20) {
            *o++ = '\\';
            switch (c) {
            case '\n':
                *o++ = 'n';
                break;
            case '\r':
                *o++ = 'r';
                break;
            case '\t':
                *o++ = 't';
                break;
            case '\b':
                *o++ = 'b';
                break;
            case '\f':
                *o++ = 'f';
                break;
            default:
                *o++ = 'u';
                *o++ = '0';
                *o++ = '0';
                *o++ = hex[c >> 4];
                *o++ = hex[c & 15];
            }
        } else {
            *o++ = (char)c;
        }
    }
    *o++ = '"';
    b->len = (size_t)(o - b->data);
    b->data[b->len] = '\0';
    return 0;
}

/* ---- Numbers -------------------------------------------------------------- */

/* Writes the flat JSON array of n elements of a fixed-size datatype straight
 * into the buffer, reserved once for the longest text (numfmt_array: one
 * loop per datatype). */
static int write_numeric_array(sbuf_t *b, nereid_datatype_t dt, const char *p, size_t n)
{
    numfmt_kind_t kind;
    switch (dt) {
    case NEREID_TYPE_BOOL:
        kind = NUMFMT_BOOL;
        break;
    case NEREID_TYPE_UINT8:
        kind = NUMFMT_U8;
        break;
    case NEREID_TYPE_UINT16:
        kind = NUMFMT_U16;
        break;
    case NEREID_TYPE_UINT32:
        kind = NUMFMT_U32;
        break;
    case NEREID_TYPE_UINT64:
        kind = NUMFMT_U64;
        break;
    case NEREID_TYPE_INT8:
        kind = NUMFMT_I8;
        break;
    case NEREID_TYPE_INT16:
        kind = NUMFMT_I16;
        break;
    case NEREID_TYPE_INT32:
        kind = NUMFMT_I32;
        break;
    case NEREID_TYPE_INT64:
        kind = NUMFMT_I64;
        break;
    case NEREID_TYPE_FP32:
        kind = NUMFMT_F32;
        break;
    case NEREID_TYPE_FP64:
        kind = NUMFMT_F64;
        break;
    default:
        return -1;
    }
    if (n > (SIZE_MAX - 64) / NUMFMT_ARRAY_ROOM || sbuf_reserve(b, n * NUMFMT_ARRAY_ROOM + 2))
        return -1;
    char *o = b->data + b->len;
    *o++ = '[';
    o = par_numfmt_array(o, kind, p, n);
    *o++ = ']';
    b->len = (size_t)(o - b->data);
    b->data[b->len] = '\0';
    return 0;
}

/* Writes a serialized BYTES tensor (4-byte LE length prefixes) as strings. */
static nereid_error_t *write_bytes_array(sbuf_t *b, const char *p, size_t byte_size,
                                         const char *name)
{
    if (sbuf_append(b, "[", 1)) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    size_t off = 0;
    bool first = true;
    while (off < byte_size) {
        uint32_t n;
        if (byte_size - off < 4) goto bad;
        memcpy(&n, p + off, 4);
        off += 4;
        if (n > byte_size - off) goto bad;
        if ((!first && sbuf_append(b, ",", 1)) || sbuf_append_json_string(b, p + off, n))
            return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
        first = false;
        off += n;
    }
    if (sbuf_append(b, "]", 1)) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    return NULL;
bad:
    return nereid_error_new(NEREID_ERROR_INTERNAL, "output '%s' holds malformed BYTES data", name);
}

nereid_error_t *infer_reply_write_data(sbuf_t *b, nereid_datatype_t dt, const void *data,
                                       size_t byte_size, const char *name)
{
    if (dt == NEREID_TYPE_BYTES) return write_bytes_array(b, data, byte_size, name);
    if (dt == NEREID_TYPE_FP16 || dt == NEREID_TYPE_BF16)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "sending %s data via JSON is not supported. Please use the "
                                "binary data format for output",
                                nereid_datatype_name(dt));
    size_t es = nereid_datatype_byte_size(dt);
    if (es == 0 || write_numeric_array(b, dt, data, byte_size / es))
        return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory building the response");
    return NULL;
}

/* ---- Reply ---------------------------------------------------------------- */

static const infer_output_t *find_requested(const infer_parsed_t *parsed, const char *name)
{
    for (size_t i = 0; i < parsed->n_outputs; i++)
        if (!strcmp(parsed->outputs[i].name, name)) return &parsed->outputs[i];
    return NULL;
}

/* ,"parameters":{...} of the response parameters a backend set (Triton's
 * order: after model_version), nothing when there are none. */
static int write_parameters(sbuf_t *b, const nereid_response_t *resp)
{
    size_t n = nereid_response_parameter_count(resp);
    if (n == 0) return 0;
    if (SBUF_LIT(b, ",\"parameters\":{")) return -1;
    for (size_t i = 0; i < n; i++) {
        const char *name;
        int type;
        const void *value;
        nereid_response_parameter(resp, i, &name, &type, &value);
        if ((i && SBUF_LIT(b, ",")) || sbuf_append_json_string(b, name, strlen(name)) ||
            SBUF_LIT(b, ":"))
            return -1;
        char num[NUMFMT_DOUBLE_ROOM + 8];
        char *end = num;
        if (type == 0) {
            if (sbuf_append_json_string(b, value, strlen(value))) return -1;
            continue;
        } else if (type == 1) {
            int64_t v;
            memcpy(&v, value, sizeof v);
            end = numfmt_i64(num, v);
        } else if (type == 2) {
            end = stpcpy(num, *(const bool *)value ? "true" : "false");
        } else {
            double v;
            memcpy(&v, value, sizeof v);
            end = numfmt_double(num, v);
        }
        if (sbuf_append(b, num, (size_t)(end - num))) return -1;
    }
    return SBUF_LIT(b, "}");
}

static int write_shape(sbuf_t *b, const int64_t *shape, size_t rank)
{
    if (sbuf_reserve(b, rank * 21 + 2)) return -1;
    char *o = b->data + b->len;
    *o++ = '[';
    for (size_t d = 0; d < rank; d++) {
        if (d) *o++ = ',';
        o = numfmt_i64(o, shape[d]);
    }
    *o++ = ']';
    b->len = (size_t)(o - b->data);
    b->data[b->len] = '\0';
    return 0;
}

nereid_error_t *infer_reply_build(const nereid_response_t *resp, const infer_parsed_t *parsed,
                                  infer_reply_t *out)
{
    memset(out, 0, sizeof *out);
    size_t n_outputs = nereid_response_output_count(resp);
    sbuf_t b = {0};
    nereid_error_t *err = NULL;
    /* Room for a small reply's header in one allocation. */
    if (sbuf_reserve(&b, 448 + 96 * n_outputs)) goto oom;
    if (n_outputs + 1 <= INFER_REPLY_INLINE_OUTPUTS) {
        out->chunks = out->inline_chunks;
        out->owned = out->inline_owned;
    } else {
        out->chunks = calloc(n_outputs + 1, sizeof *out->chunks);
        out->owned = calloc(n_outputs + 1, sizeof *out->owned);
    }
    if (!out->chunks || !out->owned) goto oom;
    out->n_chunks = 1;

    char num[32];
    const char *id = nereid_response_id(resp);
    if (SBUF_LIT(&b, "{")) goto oom;
    if (id && id[0] &&
        (SBUF_LIT(&b, "\"id\":") || sbuf_append_json_string(&b, id, strlen(id)) ||
         SBUF_LIT(&b, ",")))
        goto oom;
    const char *model = nereid_response_model_name(resp);
    size_t num_len = (size_t)(numfmt_i64(num, nereid_response_model_version(resp)) - num);
    if (SBUF_LIT(&b, "\"model_name\":") ||
        sbuf_append_json_string(&b, model ? model : "", model ? strlen(model) : 0) ||
        SBUF_LIT(&b, ",\"model_version\":\"") || sbuf_append(&b, num, num_len) ||
        SBUF_LIT(&b, "\"") || write_parameters(&b, resp) || SBUF_LIT(&b, ",\"outputs\":["))
        goto oom;

    for (size_t i = 0; i < n_outputs; i++) {
        const char *name;
        nereid_datatype_t dt;
        const int64_t *shape;
        size_t rank, byte_size;
        const void *data;
        void *buffer_userp;
        nereid_response_output(resp, i, &name, &dt, &shape, &rank, &data, &byte_size,
                               &buffer_userp);
        const infer_output_t *req = find_requested(parsed, name);
        bool binary = req ? req->binary : (parsed->binary_data_output || parsed->raw);
        uint32_t k = req ? req->class_count : nereid_response_output_class_count(resp, i);
        int64_t cls_shape[2];
        if (k > 0) {
            char *bytes;
            size_t cls_size;
            err = nereid_response_classify(resp, i, k, &bytes, &cls_size, cls_shape, &rank);
            if (err) goto fail;
            out->owned[out->n_owned++] = bytes;
            dt = NEREID_TYPE_BYTES;
            shape = cls_shape;
            data = bytes;
            byte_size = cls_size;
        }
        if ((i && SBUF_LIT(&b, ",")) || SBUF_LIT(&b, "{\"name\":") ||
            sbuf_append_json_string(&b, name, strlen(name)) || SBUF_LIT(&b, ",\"datatype\":\"") ||
            sbuf_append_str(&b, nereid_datatype_name(dt)) || SBUF_LIT(&b, "\",\"shape\":") ||
            write_shape(&b, shape, rank))
            goto oom;
        /* In shared memory: Triton sends neither data nor parameters. */
        if (req && req->shm_region) {
            if (SBUF_LIT(&b, "}")) goto oom;
            continue;
        }
        /* An empty output goes as "data":[] even when binary was asked for
         * (what Triton's clients read back with the output's datatype;
         * L0_backend_identity's [1,0] tensors). */
        if (byte_size == 0) {
            if (SBUF_LIT(&b, ",\"data\":[]}")) goto oom;
            continue;
        }
        if (binary) {
            if (SBUF_LIT(&b, ",\"parameters\":{\"binary_data_size\":") ||
                sbuf_append_u64(&b, byte_size) || SBUF_LIT(&b, "}}"))
                goto oom;
            out->chunks[out->n_chunks++] = (reply_chunk_t){data, byte_size};
            out->binary = true;
            continue;
        }
        if (dt == NEREID_TYPE_FP16 || dt == NEREID_TYPE_BF16) {
            err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                   "sending %s data via JSON is not supported. Please use the "
                                   "binary data format for output",
                                   nereid_datatype_name(dt));
            goto fail;
        }
        if (SBUF_LIT(&b, ",\"data\":")) goto oom;
        if (dt == NEREID_TYPE_BYTES) {
            if ((err = write_bytes_array(&b, data, byte_size, name))) goto fail;
        } else {
            size_t es = nereid_datatype_byte_size(dt);
            if (es == 0 || write_numeric_array(&b, dt, data, byte_size / es)) goto oom;
        }
        if (SBUF_LIT(&b, "}")) goto oom;
    }
    if (SBUF_LIT(&b, "]}")) goto oom;
    out->json_len = b.len;
    /* Small binary outputs are copied behind the JSON: one buffer goes out
     * with the headers in one send, where an iovec reply costs a second. */
    size_t tail = 0;
    for (size_t i = 1; i < out->n_chunks; i++)
        tail += out->chunks[i].byte_size;
    if (out->n_chunks > 1 && tail <= INFER_REPLY_INLINE_MAX) {
        if (sbuf_reserve(&b, tail)) goto oom;
        for (size_t i = 1; i < out->n_chunks; i++) {
            memcpy(b.data + b.len, out->chunks[i].data, out->chunks[i].byte_size);
            b.len += out->chunks[i].byte_size;
        }
        out->n_chunks = 1;
    }
    out->json = b.data;
    out->chunks[0] = (reply_chunk_t){out->json, out->n_chunks == 1 ? b.len : out->json_len};
    return NULL;
oom:
    err = nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory building the response");
fail:
    free(b.data);
    infer_reply_free(out);
    return err;
}

void infer_reply_free(infer_reply_t *reply)
{
    for (size_t i = 0; i < reply->n_owned; i++)
        free(reply->owned[i]);
    if (reply->owned != reply->inline_owned) free(reply->owned);
    if (reply->chunks != reply->inline_chunks) free(reply->chunks);
    free(reply->json);
    memset(reply, 0, sizeof *reply);
}
