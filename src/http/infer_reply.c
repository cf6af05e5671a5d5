/*
 * This file contains the inference reply builder: a hand-written JSON writer
 * for the response header (numeric arrays are the hot part, so they are
 * written straight from the output buffers, without a JSON tree), binary
 * outputs as borrowed chunks, and classification through
 * nereid_response_classify.
 */
#include "http/infer_reply.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
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

int sbuf_append_json_string(sbuf_t *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    if (sbuf_reserve(b, n * 6 + 2)) return -1;
    char *o = b->data + b->len;
    *o++ = '"';
    for (size_t i = 0; i < n; i++) {
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

static char *write_u64(char *o, uint64_t v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *o++ = tmp[--n];
    return o;
}

static char *write_i64(char *o, int64_t v)
{
    if (v < 0) {
        *o++ = '-';
        return write_u64(o, (uint64_t)0 - (uint64_t)v);
    }
    return write_u64(o, (uint64_t)v);
}

static const uint64_t pow10_u64[18] = {1ULL,
                                       10ULL,
                                       100ULL,
                                       1000ULL,
                                       10000ULL,
                                       100000ULL,
                                       1000000ULL,
                                       10000000ULL,
                                       100000000ULL,
                                       1000000000ULL,
                                       10000000000ULL,
                                       100000000000ULL,
                                       1000000000000ULL,
                                       10000000000000ULL,
                                       100000000000000ULL,
                                       1000000000000000ULL,
                                       10000000000000000ULL,
                                       100000000000000000ULL};

/* Writes digits * 10^k (digits has no trailing zeros) in rapidjson's layout,
 * as Triton's writer prints doubles: "12.0", "0.001", "1e-7", "1.5e30". */
static char *write_decimal(char *o, bool neg, uint64_t digits, int k)
{
    static const char pairs[] = "00010203040506070809101112131415161718192021222324252627282930"
                                "31323334353637383940414243444546474849505152535455565758596061"
                                "62636465666768697071727374757677787980818283848586878889909192"
                                "93949596979899";
    char buf[24], *e = buf + sizeof buf, *d = e;
    while (digits >= 100) {
        unsigned r = (unsigned)(digits % 100);
        digits /= 100;
        d -= 2;
        memcpy(d, pairs + 2 * r, 2);
    }
    if (digits >= 10) {
        d -= 2;
        memcpy(d, pairs + 2 * digits, 2);
    } else {
        *--d = (char)('0' + digits);
    }
    int len = (int)(e - d);
    if (neg) *o++ = '-';
    int kk = len + k; /* digits before the decimal point */
    if (k >= 0 && kk <= 21) {
        memcpy(o, d, (size_t)len);
        o += len;
        memset(o, '0', (size_t)k);
        o += k;
        *o++ = '.';
        *o++ = '0';
    } else if (kk > 0 && kk <= 21) {
        memcpy(o, d, (size_t)kk);
        o += kk;
        *o++ = '.';
        memcpy(o, d + kk, (size_t)(len - kk));
        o += len - kk;
    } else if (kk > -6 && kk <= 0) {
        *o++ = '0';
        *o++ = '.';
        memset(o, '0', (size_t)-kk);
        o += -kk;
        memcpy(o, d, (size_t)len);
        o += len;
    } else {
        *o++ = d[0];
        if (len > 1) {
            *o++ = '.';
            memcpy(o, d + 1, (size_t)(len - 1));
            o += len - 1;
        }
        *o++ = 'e';
        int e = kk - 1;
        if (e < 0) *o++ = '-', e = -e;
        if (e >= 100)
            *o++ = (char)('0' + e / 100), e %= 100, *o++ = (char)('0' + e / 10);
        else if (e >= 10)
            *o++ = (char)('0' + e / 10);
        *o++ = (char)('0' + e % 10);
    }
    return o;
}

#if LDBL_MANT_DIG >= 64
#define HAVE_LONG_DOUBLE_64 1
static const long double pow10_ld[28] = {1e0L,  1e1L,  1e2L,  1e3L,  1e4L,  1e5L,  1e6L,  1e7L,
                                         1e8L,  1e9L,  1e10L, 1e11L, 1e12L, 1e13L, 1e14L, 1e15L,
                                         1e16L, 1e17L, 1e18L, 1e19L, 1e20L, 1e21L, 1e22L, 1e23L,
                                         1e24L, 1e25L, 1e26L, 1e27L}; /* exact: 5^27 < 2^64 */
#endif

/* Whether digits * 10^-s reads back as v (strtod; the rare undecided case). */
static bool reads_back_strtod(uint64_t digits, int s, double v)
{
    char tmp[48];
    snprintf(tmp, sizeof tmp, "%" PRIu64 "e%d", digits, -s);
    return strtod(tmp, NULL) == v;
}

/* Shortest digits (at most 17) such that digits * 10^k reads back as v
 * (> 0, finite). With s chosen so that v * 10^s has 17 integer digits, the
 * candidates are the nearest 17-, 16-, ... digit decimals, each compared
 * (as an exact integer) with v's rounding interval scaled by 10^s in 64-bit
 * long double: a few roundings of 2^-64 each, far inside the margin; strtod
 * decides the rare candidate too close to call. Returns false outside
 * ~1e-11..1e43 (where 10^s is no longer exact); the caller uses printf. */
static bool shortest_digits(double v, uint64_t *digits, int *k)
{
#ifdef HAVE_LONG_DOUBLE_64
    uint64_t bits;
    memcpy(&bits, &v, 8);
    int be = (int)(bits >> 52 & 0x7FF);
    if (be < 1023 - 37 || be > 1023 + 143) return false;
    bool pow2 = (bits & ((1ULL << 52) - 1)) == 0;  /* the gap below v is half */
    uint64_t ulp_bits = (uint64_t)(be - 52) << 52; /* 2^(be-1075), a normal double */
    double ulp;
    memcpy(&ulp, &ulp_bits, 8);
    int e10 = (int)floor((be - 1023) * 0.30102999566398120);
    long double scaled = 0;
    uint64_t c = 0;
    int s = 0;
    bool settled = false;
    for (int tries = 0; tries < 3 && !settled; tries++) {
        s = 16 - e10;
        if (s > 27 || s < -27) return false;
        scaled = s >= 0 ? (long double)v * pow10_ld[s] : (long double)v / pow10_ld[-s];
        c = (uint64_t)llrintl(scaled);
        if (c >= pow10_u64[17])
            e10++;
        else if (c < pow10_u64[16])
            e10--;
        else
            settled = true;
    }
    if (!settled) return false;
    long double h = (long double)ulp * 0.5L;
    h = s >= 0 ? h * pow10_ld[s] : h / pow10_ld[-s];
    long double hi = scaled + h, lo = scaled - (pow2 ? h * 0.5L : h);
    long double margin = scaled * 0x1p-60L;
    uint64_t fl = (long double)c > scaled ? c - 1 : c; /* floor(scaled) */
    bool have = false;
    for (int drop = 0; drop <= 16; drop++) {
        uint64_t unit = pow10_u64[drop];
        uint64_t a = fl / unit, cp = 0;
        /* The nearest of a and a + 1 first, then the other. */
        bool up = scaled - (long double)(a * unit) > (long double)unit / 2;
        for (int i = 0; i < 2 && !cp; i++) {
            uint64_t cand = (i == 0) == up ? a + 1 : a;
            if (cand == 0) continue;
            long double cv = (long double)(cand * unit);
            bool ok;
            if (cv - margin > lo && cv + margin < hi)
                ok = true;
            else if (cv + margin < lo || cv - margin > hi)
                ok = false;
            else
                ok = reads_back_strtod(cand, s - drop, v);
            if (ok) cp = cand;
        }
        if (!cp) break;
        while (cp % 10 == 0) {
            cp /= 10;
            drop++;
        }
        *digits = cp;
        *k = drop - s;
        have = true;
    }
    return have;
#else
    (void)v, (void)digits, (void)k;
    return false;
#endif
}

/* Digits of v from printf (slow path, outside 1e-11..1e43): the fewest that read back. */
static void printf_digits(double v, uint64_t *digits, int *k)
{
    char tmp[40];
    for (int prec = 0; prec <= 16; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec, v);
        if (strtod(tmp, NULL) == v) break;
    }
    uint64_t m = 0;
    int n = 0;
    const char *q = tmp;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') m = m * 10 + (uint64_t)(*q - '0'), n++;
    int kk = (*q == 'e' ? atoi(q + 1) : 0) - (n - 1);
    while (m && m % 10 == 0) {
        m /= 10;
        kk++;
    }
    *digits = m;
    *k = kk;
}

/* Writes v with the shortest digits that read back as v, NaN and Infinity
 * spelled as Triton writes them. FP32 outputs are widened to double first,
 * as Triton does (0.1f prints as 0.10000000149011612). */
static char *write_double(char *o, double v)
{
    if (isnan(v)) return memcpy(o, "NaN", 3), o + 3;
    if (isinf(v)) {
        if (v < 0) return memcpy(o, "-Infinity", 9), o + 9;
        return memcpy(o, "Infinity", 8), o + 8;
    }
    bool neg = signbit(v);
    if (v == 0) return write_decimal(o, neg, 0, 0);
    double a = fabs(v);
    uint64_t digits;
    int k;
    if (!shortest_digits(a, &digits, &k)) printf_digits(a, &digits, &k);
    return write_decimal(o, neg, digits, k);
}

/* Writes the flat JSON array of n elements of a fixed-size datatype. */
static int write_numeric_array(sbuf_t *b, nereid_datatype_t dt, const char *p, size_t n)
{
    /* Longest element: 24 chars for doubles, "-Infinity", 20 digits for u64. */
    if (sbuf_reserve(b, n * 28 + 2)) return -1;
    char *o = b->data + b->len;
    *o++ = '[';
    size_t es = nereid_datatype_byte_size(dt);
    for (size_t i = 0; i < n; i++, p += es) {
        if (i) *o++ = ',';
        switch (dt) {
        case NEREID_TYPE_BOOL:
            if (*p) {
                memcpy(o, "true", 4);
                o += 4;
            } else {
                memcpy(o, "false", 5);
                o += 5;
            }
            break;
        case NEREID_TYPE_UINT8:
            o = write_u64(o, *(const uint8_t *)p);
            break;
        case NEREID_TYPE_UINT16: {
            uint16_t v;
            memcpy(&v, p, 2);
            o = write_u64(o, v);
            break;
        }
        case NEREID_TYPE_UINT32: {
            uint32_t v;
            memcpy(&v, p, 4);
            o = write_u64(o, v);
            break;
        }
        case NEREID_TYPE_UINT64: {
            uint64_t v;
            memcpy(&v, p, 8);
            o = write_u64(o, v);
            break;
        }
        case NEREID_TYPE_INT8:
            o = write_i64(o, *(const int8_t *)p);
            break;
        case NEREID_TYPE_INT16: {
            int16_t v;
            memcpy(&v, p, 2);
            o = write_i64(o, v);
            break;
        }
        case NEREID_TYPE_INT32: {
            int32_t v;
            memcpy(&v, p, 4);
            o = write_i64(o, v);
            break;
        }
        case NEREID_TYPE_INT64: {
            int64_t v;
            memcpy(&v, p, 8);
            o = write_i64(o, v);
            break;
        }
        case NEREID_TYPE_FP32: {
            float v;
            memcpy(&v, p, 4);
            o = write_double(o, (double)v);
            break;
        }
        case NEREID_TYPE_FP64: {
            double v;
            memcpy(&v, p, 8);
            o = write_double(o, v);
            break;
        }
        default:
            return -1;
        }
    }
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

/* ---- Reply ---------------------------------------------------------------- */

static const infer_output_t *find_requested(const infer_parsed_t *parsed, const char *name)
{
    for (size_t i = 0; i < parsed->n_outputs; i++)
        if (!strcmp(parsed->outputs[i].name, name)) return &parsed->outputs[i];
    return NULL;
}

static int write_shape(sbuf_t *b, const int64_t *shape, size_t rank)
{
    if (sbuf_reserve(b, rank * 21 + 2)) return -1;
    char *o = b->data + b->len;
    *o++ = '[';
    for (size_t d = 0; d < rank; d++) {
        if (d) *o++ = ',';
        o = write_i64(o, shape[d]);
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
    if (sbuf_append_str(&b, "{")) goto oom;
    if (id && id[0] &&
        (sbuf_append_str(&b, "\"id\":") || sbuf_append_json_string(&b, id, strlen(id)) ||
         sbuf_append_str(&b, ",")))
        goto oom;
    const char *model = nereid_response_model_name(resp);
    snprintf(num, sizeof num, "%" PRId64, nereid_response_model_version(resp));
    if (sbuf_append_str(&b, "\"model_name\":") ||
        sbuf_append_json_string(&b, model ? model : "", model ? strlen(model) : 0) ||
        sbuf_append_str(&b, ",\"model_version\":\"") || sbuf_append_str(&b, num) ||
        sbuf_append_str(&b, "\",\"outputs\":["))
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
        if ((i && sbuf_append_str(&b, ",")) || sbuf_append_str(&b, "{\"name\":") ||
            sbuf_append_json_string(&b, name, strlen(name)) ||
            sbuf_append_str(&b, ",\"datatype\":\"") ||
            sbuf_append_str(&b, nereid_datatype_name(dt)) || sbuf_append_str(&b, "\",\"shape\":") ||
            write_shape(&b, shape, rank))
            goto oom;
        if (binary) {
            snprintf(num, sizeof num, "%zu", byte_size);
            if (sbuf_append_str(&b, ",\"parameters\":{\"binary_data_size\":") ||
                sbuf_append_str(&b, num) || sbuf_append_str(&b, "}}"))
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
        if (sbuf_append_str(&b, ",\"data\":")) goto oom;
        if (dt == NEREID_TYPE_BYTES) {
            if ((err = write_bytes_array(&b, data, byte_size, name))) goto fail;
        } else {
            size_t es = nereid_datatype_byte_size(dt);
            if (es == 0 || write_numeric_array(&b, dt, data, byte_size / es)) goto oom;
        }
        if (sbuf_append_str(&b, "}")) goto oom;
    }
    if (sbuf_append_str(&b, "]}")) goto oom;
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
