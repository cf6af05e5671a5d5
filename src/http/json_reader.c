/*
 * This file contains the JSON reader: a recursive-descent parser into arena
 * nodes, a number converter with an exact fast path (Clinger: at most 19
 * significant digits forming an integer <= 2^53 scaled by 10^±22 is one
 * correctly rounded operation) and strtod for the rest, and the converter of
 * "data" spans straight into tensor memory.
 */
#include "http/json_reader.h"

#include "http/numfmt.h"
#include "http/numparse.h"
#include "http/par.h"
#include "http/swar.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PARSE_DEPTH 1000
#define MAX_DATA_DEPTH 100
#define PREFIX "failed to parse the request JSON buffer: "

/* rapidjson's GetParseError_En texts. */
#define E_EMPTY "The document is empty."
#define E_NOT_SINGULAR "The document root must not be followed by other values."
#define E_VALUE "Invalid value."
#define E_MISS_NAME "Missing a name for object member."
#define E_MISS_COLON "Missing a colon after a name of object member."
#define E_OBJ_COMMA "Missing a comma or '}' after an object member."
#define E_ARR_COMMA "Missing a comma or ']' after an array element."
#define E_NUL "A string other than tensor data contains a NUL character (\\u0000)."
#define E_HEX "Incorrect hex digit after \\u escape in string."
#define E_SURROGATE "The surrogate pair in string is invalid."
#define E_ESCAPE "Invalid escape character in string."
#define E_QUOTE "Missing a closing quotation mark in string."
#define E_ENCODING "Invalid encoding in string."
#define E_TOO_BIG "Number too big to be stored in double."
#define E_FRACTION "Miss fraction part in number."
#define E_EXPONENT "Miss exponent in number."
#define E_DEPTH "Nesting too deep."

/* ---- Arena ---------------------------------------------------------------- */

void jarena_init(jarena_t *a)
{
    a->cur = a->first;
    a->end = a->first + sizeof a->first;
    a->blocks = NULL;
}

void *jarena_alloc(jarena_t *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if ((size_t)(a->end - a->cur) < n) {
        size_t size = n + 16 > 8192 ? n + 16 : 8192;
        char *b = malloc(size);
        if (!b) return NULL;
        *(void **)b = a->blocks;
        a->blocks = b;
        a->cur = b + 16;
        a->end = b + size;
    }
    void *p = a->cur;
    a->cur += n;
    return p;
}

void jarena_adopt(jarena_t *a, void *block)
{
    *(void **)block = a->blocks;
    a->blocks = block;
}

void jarena_free(jarena_t *a)
{
    void *b = a->blocks;
    while (b) {
        void *next = *(void **)b;
        free(b);
        b = next;
    }
    jarena_init(a);
}

/* ---- Numbers -------------------------------------------------------------- */

static const double pow10_exact[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                       1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                       1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static inline bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Scans the number at s (< end) by the JSON grammar plus rapidjson's
 * NaN/Inf/Infinity. Returns its end, or NULL with *err set. */
static const char *scan_number(const char *s, const char *end, const char **err)
{
    const char *q = s;
    if (q < end && *q == '-') q++;
    if (q < end && (*q == 'N' || *q == 'I')) {
        if (end - q >= 3 && !memcmp(q, "NaN", 3)) return q + 3;
        if (end - q >= 3 && !memcmp(q, "Inf", 3)) {
            q += 3;
            if (q < end && *q == 'i') {
                if (end - q >= 5 && !memcmp(q, "inity", 5)) return q + 5;
                *err = E_VALUE;
                return NULL;
            }
            return q;
        }
        *err = E_VALUE;
        return NULL;
    }
    if (q >= end || !is_digit(*q)) {
        *err = E_VALUE;
        return NULL;
    }
    if (*q == '0')
        q++;
    else
        while (q < end && is_digit(*q))
            q++;
    if (q < end && *q == '.') {
        q++;
        if (q >= end || !is_digit(*q)) {
            *err = E_FRACTION;
            return NULL;
        }
        while (q < end && is_digit(*q))
            q++;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < end && (*q == '+' || *q == '-')) q++;
        if (q >= end || !is_digit(*q)) {
            *err = E_EXPONENT;
            return NULL;
        }
        while (q < end && is_digit(*q))
            q++;
    }
    return q;
}

/* Converts the checked number text s[0..n) into *v (JV_INT, JV_UINT or
 * JV_DOUBLE). Returns false when it overflows a double. */
static bool convert_number(const char *s, size_t n, jv_t *v)
{
    const char *q = s, *end = s + n;
    bool neg = *q == '-';
    if (neg) q++;
    if (*q == 'N') {
        v->type = JV_DOUBLE;
        v->v.d = NAN;
        return true;
    }
    if (*q == 'I') {
        v->type = JV_DOUBLE;
        v->v.d = neg ? -INFINITY : INFINITY;
        return true;
    }
    uint64_t m = 0;
    bool overflow = false;
    for (; q < end && is_digit(*q); q++) {
        unsigned d = (unsigned)(*q - '0');
        if (m > (UINT64_MAX - d) / 10) overflow = true;
        if (!overflow) m = m * 10 + d;
    }
    if (!overflow && q == end) {
        if (!neg && m <= INT64_MAX) {
            v->type = JV_INT;
            v->v.i = (int64_t)m;
            return true;
        }
        if (!neg) {
            v->type = JV_UINT;
            v->v.u = m;
            return true;
        }
        if (m <= (uint64_t)INT64_MAX + 1) {
            v->type = JV_INT;
            v->v.i = m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m;
            return true;
        }
    }
    /* A real (or an integer beyond 64 bits): recount the significand. */
    v->type = JV_DOUBLE;
    m = 0;
    int n_digits = 0;
    long e10 = 0;
    bool exact = true;
    q = s + (neg ? 1 : 0);
    for (; q < end && is_digit(*q); q++) {
        unsigned d = (unsigned)(*q - '0');
        if (!m && !d) continue;
        if (n_digits < 19) {
            m = m * 10 + d;
            n_digits++;
        } else {
            e10++;
            if (d) exact = false;
        }
    }
    if (q < end && *q == '.') {
        for (q++; q < end && is_digit(*q); q++) {
            unsigned d = (unsigned)(*q - '0');
            if (!m && !d) {
                e10--;
                continue;
            }
            if (n_digits < 19) {
                m = m * 10 + d;
                n_digits++;
                e10--;
            } else if (d) {
                exact = false;
            }
        }
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        q++;
        bool eneg = *q == '-';
        if (*q == '+' || *q == '-') q++;
        long x = 0;
        for (; q < end && is_digit(*q); q++)
            if (x < 100000) x = x * 10 + (*q - '0');
        e10 += eneg ? -x : x;
    }
    if (m == 0) {
        v->v.d = neg ? -0.0 : 0.0;
        return true;
    }
    if (exact && m <= (1ULL << 53) && e10 >= -22 && e10 <= 22) {
        double d = (double)m;
        d = e10 < 0 ? d / pow10_exact[-e10] : d * pow10_exact[e10];
        v->v.d = neg ? -d : d;
        return true;
    }
    char small[64], *buf = n < sizeof small ? small : malloc(n + 1);
    if (!buf) {
        v->v.d = NAN;
        return false;
    }
    memcpy(buf, s, n);
    buf[n] = '\0';
    double d = strtod(buf, NULL);
    if (buf != small) free(buf);
    v->v.d = d;
    return !isinf(d);
}

/* ---- Strings -------------------------------------------------------------- */

static int hex_value(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool read_hex4(const char *q, const char *end, unsigned *out)
{
    if (end - q < 4) return false;
    unsigned x = 0;
    for (int i = 0; i < 4; i++) {
        int h = hex_value(q[i]);
        if (h < 0) return false;
        x = x << 4 | (unsigned)h;
    }
    *out = x;
    return true;
}

/* Length of the well-formed UTF-8 sequence at q (lead byte >= 0x80), or 0. */
static size_t utf8_sequence(const unsigned char *q, const unsigned char *end)
{
    unsigned c = q[0];
    size_t n;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 0;
    if ((size_t)(end - q) < n) return 0;
    if (q[1] < lo || q[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if (q[i] < 0x80 || q[i] > 0xBF) return 0;
    return n;
}

/* Scans the string whose opening quote is at s. Returns the position after
 * the closing quote, or NULL with *err and *at set. *escaped tells whether the
 * content needs decoding. */
/* Skips the bytes at q that need no attention inside a string (printable
 * ASCII other than '"' and '\\') eight at a time. Returns the first byte
 * to look at (or where fewer than 8 bytes remain). */
static inline const char *skip_plain(const char *q, const char *end)
{
    while (end - q >= 8) {
        uint64_t x;
        memcpy(&x, q, 8);
        uint64_t m = swar_json_specials(x) | (x & 0x8080808080808080ULL);
        if (m) return q + (__builtin_ctzll(m) >> 3);
        q += 8;
    }
    return q;
}

static const char *scan_string(const char *s, const char *end, bool *escaped, const char **err,
                               const char **at)
{
    const char *q = s + 1;
    *escaped = false;
    for (;;) {
        q = skip_plain(q, end);
        if (q >= end) {
            *err = E_QUOTE, *at = q;
            return NULL;
        }
        unsigned char c = (unsigned char)*q;
        if (c == '"') return q + 1;
        if (c == '\\') {
            *escaped = true;
            if (q + 1 >= end) {
                *err = E_QUOTE, *at = q + 1;
                return NULL;
            }
            char e = q[1];
            if (e == 'u') {
                unsigned u;
                if (!read_hex4(q + 2, end, &u)) {
                    *err = E_HEX, *at = q + 2;
                    return NULL;
                }
                q += 6;
                if (u >= 0xD800 && u <= 0xDBFF) {
                    unsigned lo;
                    if (end - q < 2 || q[0] != '\\' || q[1] != 'u' || !read_hex4(q + 2, end, &lo) ||
                        lo < 0xDC00 || lo > 0xDFFF) {
                        *err = E_SURROGATE, *at = q;
                        return NULL;
                    }
                    q += 6;
                } else if (u >= 0xDC00 && u <= 0xDFFF) {
                    *err = E_SURROGATE, *at = q;
                    return NULL;
                }
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || e == '\0') {
                *err = E_ESCAPE, *at = q + 1;
                return NULL;
            }
            q += 2;
            continue;
        }
        if (c < 0x20) {
            *err = E_ENCODING, *at = q;
            return NULL;
        }
        if (c < 0x80) {
            q++;
            continue;
        }
        size_t n = utf8_sequence((const unsigned char *)q, (const unsigned char *)end);
        if (!n) {
            *err = E_ENCODING, *at = q;
            return NULL;
        }
        q += n;
    }
}

static char *put_utf8(char *o, unsigned u)
{
    if (u < 0x80) {
        *o++ = (char)u;
    } else if (u < 0x800) {
        *o++ = (char)(0xC0 | u >> 6);
        *o++ = (char)(0x80 | (u & 0x3F));
    } else if (u < 0x10000) {
        *o++ = (char)(0xE0 | u >> 12);
        *o++ = (char)(0x80 | (u >> 6 & 0x3F));
        *o++ = (char)(0x80 | (u & 0x3F));
    } else {
        *o++ = (char)(0xF0 | u >> 18);
        *o++ = (char)(0x80 | (u >> 12 & 0x3F));
        *o++ = (char)(0x80 | (u >> 6 & 0x3F));
        *o++ = (char)(0x80 | (u & 0x3F));
    }
    return o;
}

/* Decodes the checked string content s[0..n) (between the quotes) into out
 * (NULL: only measure). Returns the decoded length. */
static size_t decode_string(const char *s, size_t n, char *out)
{
    const char *q = s, *end = s + n;
    size_t len = 0;
    char tmp[4];
    while (q < end) {
        const char *bs = memchr(q, '\\', (size_t)(end - q));
        size_t run = bs ? (size_t)(bs - q) : (size_t)(end - q);
        if (out) memcpy(out + len, q, run);
        len += run;
        q += run;
        if (!bs) break;
        char e = q[1];
        unsigned u;
        q += 2;
        switch (e) {
        case 'b':
            u = '\b';
            break;
        case 'f':
            u = '\f';
            break;
        case 'n':
            u = '\n';
            break;
        case 'r':
            u = '\r';
            break;
        case 't':
            u = '\t';
            break;
        case 'u':
            read_hex4(q, end, &u);
            q += 4;
            if (u >= 0xD800 && u <= 0xDBFF) {
                unsigned lo = 0xDC00;
                read_hex4(q + 2, end, &lo);
                q += 6;
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            }
            break;
        default:
            u = (unsigned char)e;
        }
        size_t k = (size_t)(put_utf8(tmp, u) - tmp);
        if (out) memcpy(out + len, tmp, k);
        len += k;
    }
    return len;
}

/* ---- Parser --------------------------------------------------------------- */

typedef struct jparser {
    const char *base, *p, *end;
    jarena_t *arena;
    const char *err;
    size_t err_off;
    bool oom;
    bool nul;        /* the error is a NUL in a string (400, not a syntax error) */
    size_t data_max; /* json_reader_parse_infer's bound; 0: no conversion */
} jparser_t;

static bool fail(jparser_t *p, const char *msg, const char *at)
{
    if (!p->err) {
        p->err = msg;
        p->err_off = (size_t)(at - p->base);
    }
    return false;
}

static inline void skip_ws(jparser_t *p)
{
    while (p->p < p->end && (*p->p == ' ' || *p->p == '\n' || *p->p == '\r' || *p->p == '\t'))
        p->p++;
}

static jv_t *new_node(jparser_t *p, jv_type_t type)
{
    jv_t *v = jarena_alloc(p->arena, sizeof *v);
    if (!v) {
        p->oom = true;
        fail(p, "out of memory", p->p);
        return NULL;
    }
    v->type = type;
    v->key = NULL;
    v->next = NULL;
    v->len = 0;
    v->v.u = 0;
    return v;
}

/* Parses a string at p->p; with out, stores it decoded and NUL-terminated. */
static bool parse_string(jparser_t *p, const char **out, size_t *out_len)
{
    bool escaped;
    const char *err, *at;
    const char *start = p->p;
    const char *after = scan_string(start, p->end, &escaped, &err, &at);
    if (!after) return fail(p, err, at);
    p->p = after;
    if (!out) return true;
    size_t raw = (size_t)(after - start) - 2;
    char *s = jarena_alloc(p->arena, raw + 1);
    if (!s) {
        p->oom = true;
        return fail(p, "out of memory", start);
    }
    size_t n = escaped ? decode_string(start + 1, raw, s) : (memcpy(s, start + 1, raw), raw);
    s[n] = '\0';
    /* One rule for every name, key and string value: no NUL (only \u0000
     * makes one). Tensor data is a span, converted elsewhere, so BYTES
     * elements stay binary-safe. */
    if (escaped && memchr(s, '\0', n)) {
        p->nul = true;
        return fail(p, E_NUL, start);
    }
    *out = s;
    *out_len = n;
    return true;
}

/* ---- One-pass conversion of flat "data" arrays ---------------------------- */

static inline const char *ws_skip(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

/* One loop per number datatype and BOOL (numparse.cc). */
#define FAST_NUMBERS(name, kind)                                                                   \
    static const char *name(const char *p, const char *end, char *out, size_t n)                   \
    {                                                                                              \
        return par_numparse_array(kind, p, end, out, n);                                           \
    }
FAST_NUMBERS(fast_int8, NUMPARSE_INT8)
FAST_NUMBERS(fast_int16, NUMPARSE_INT16)
FAST_NUMBERS(fast_int32, NUMPARSE_INT32)
FAST_NUMBERS(fast_int64, NUMPARSE_INT64)
FAST_NUMBERS(fast_uint8, NUMPARSE_UINT8)
FAST_NUMBERS(fast_uint16, NUMPARSE_UINT16)
FAST_NUMBERS(fast_uint32, NUMPARSE_UINT32)
FAST_NUMBERS(fast_uint64, NUMPARSE_UINT64)
FAST_NUMBERS(fast_fp32, NUMPARSE_FP32)
FAST_NUMBERS(fast_fp64, NUMPARSE_FP64)

FAST_NUMBERS(fast_bool, NUMPARSE_BOOL)

typedef const char *fast_fn(const char *p, const char *end, char *out, size_t n);

static fast_fn *fast_converter(nereid_datatype_t dt)
{
    switch (dt) {
    case NEREID_TYPE_BOOL:
        return fast_bool;
    case NEREID_TYPE_INT8:
        return fast_int8;
    case NEREID_TYPE_INT16:
        return fast_int16;
    case NEREID_TYPE_INT32:
        return fast_int32;
    case NEREID_TYPE_INT64:
        return fast_int64;
    case NEREID_TYPE_UINT8:
        return fast_uint8;
    case NEREID_TYPE_UINT16:
        return fast_uint16;
    case NEREID_TYPE_UINT32:
        return fast_uint32;
    case NEREID_TYPE_UINT64:
        return fast_uint64;
    case NEREID_TYPE_FP32:
        return fast_fp32;
    case NEREID_TYPE_FP64:
        return fast_fp64;
    default:
        return NULL;
    }
}

/* Tries the one-pass conversion of the "data" value at p->p of an input
 * object whose first "datatype" and "shape" members (if any) came before
 * it. On success p->p is past the value and span is filled; else nothing
 * changed (the memory taken is given back). */
static bool convert_span(jparser_t *p, const jv_t *datatype, const jv_t *shape, jv_span_t *span)
{
    if (!datatype || !shape || datatype->type != JV_STRING || shape->type != JV_ARRAY) return false;
    nereid_datatype_t dt = nereid_datatype_from_name(datatype->v.s);
    fast_fn *fn = fast_converter(dt);
    size_t es = nereid_datatype_byte_size(dt);
    if (!fn || !es) return false;
    size_t count = 1;
    for (const jv_t *d = shape->v.child; d; d = d->next) {
        if (d->type != JV_INT || d->v.i < 0) return false;
        if (d->v.i != 0 && count > p->data_max / (size_t)d->v.i) return false;
        count *= (size_t)d->v.i;
    }
    if (count > p->data_max / es) return false;
    const char *q = p->p, *end = p->end;
    if (q >= end || *q != '[') return false;
    q = ws_skip(q + 1, end);
    if (count == 0) {
        if (q >= end || *q != ']') return false;
        span->data = jarena_alloc(p->arena, 1);
        q++;
    } else {
        /* The tensor gets its own block, given back on failure. */
        char *out = malloc(16 + count * es);
        if (!out) return false;
        q = fn(q, end, out + 16, count);
        if (!q) {
            free(out);
            return false;
        }
        jarena_adopt(p->arena, out);
        span->data = out + 16;
    }
    if (!span->data) return false;
    span->count = count;
    span->datatype = dt;
    p->p = q;
    return true;
}

/* Parses the value at p->p (after whitespace). out NULL: check only.
 * level is the nesting level of the value (root 0). */
static bool parse_value(jparser_t *p, jv_t **out, int level);

static bool parse_array(jparser_t *p, jv_t **out, int level)
{
    jv_t *a = NULL, **tail = NULL;
    if (out) {
        if (!(a = new_node(p, JV_ARRAY))) return false;
        *out = a;
        tail = &a->v.child;
    }
    p->p++;
    skip_ws(p);
    if (p->p < p->end && *p->p == ']') {
        p->p++;
        return true;
    }
    for (;;) {
        jv_t *e = NULL;
        if (!parse_value(p, out ? &e : NULL, level + 1)) return false;
        if (out) {
            *tail = e;
            tail = &e->next;
            a->len++;
        }
        skip_ws(p);
        if (p->p < p->end && *p->p == ',') {
            p->p++;
            skip_ws(p);
            continue;
        }
        if (p->p < p->end && *p->p == ']') {
            p->p++;
            return true;
        }
        return fail(p, E_ARR_COMMA, p->p);
    }
}

static bool parse_object(jparser_t *p, jv_t **out, int level)
{
    jv_t *o = NULL, **tail = NULL;
    if (out) {
        if (!(o = new_node(p, JV_OBJECT))) return false;
        *out = o;
        tail = &o->v.child;
    }
    p->p++;
    skip_ws(p);
    if (p->p < p->end && *p->p == '}') {
        p->p++;
        return true;
    }
    const jv_t *datatype = NULL, *shape = NULL; /* first of each, before "data" */
    for (;;) {
        if (p->p >= p->end || *p->p != '"') return fail(p, E_MISS_NAME, p->p);
        const char *key = NULL;
        size_t key_len = 0;
        if (!parse_string(p, out ? &key : NULL, &key_len)) return false;
        skip_ws(p);
        if (p->p >= p->end || *p->p != ':') return fail(p, E_MISS_COLON, p->p);
        p->p++;
        skip_ws(p);
        jv_t *m = NULL;
        if (out && level == 2 && key_len == 4 && !memcmp(key, "data", 4)) {
            /* Tensor data: converted in one pass when it can be, else
             * checked and kept as text. */
            const char *start = p->p;
            jv_span_t *span = jarena_alloc(p->arena, sizeof *span);
            if (!span) {
                p->oom = true;
                return fail(p, "out of memory", p->p);
            }
            memset(span, 0, sizeof *span);
            if (!(p->data_max && convert_span(p, datatype, shape, span)) &&
                !parse_value(p, NULL, level + 1))
                return false;
            m = &span->node;
            m->type = JV_SPAN;
            m->v.s = start;
            m->len = (size_t)(p->p - start);
        } else if (!parse_value(p, out ? &m : NULL, level + 1)) {
            return false;
        }
        if (out && level == 2 && m->type == JV_STRING && key_len == 8 &&
            !memcmp(key, "datatype", 8) && !datatype)
            datatype = m;
        if (out && level == 2 && m->type == JV_ARRAY && key_len == 5 && !memcmp(key, "shape", 5) &&
            !shape)
            shape = m;
        if (out) {
            m->key = key;
            *tail = m;
            tail = &m->next;
            o->len++;
        }
        skip_ws(p);
        if (p->p < p->end && *p->p == ',') {
            p->p++;
            skip_ws(p);
            continue;
        }
        if (p->p < p->end && *p->p == '}') {
            p->p++;
            return true;
        }
        return fail(p, E_OBJ_COMMA, p->p);
    }
}

static bool parse_literal(jparser_t *p, const char *word, size_t n)
{
    if ((size_t)(p->end - p->p) < n || memcmp(p->p, word, n)) return fail(p, E_VALUE, p->p);
    p->p += n;
    return true;
}

static bool parse_value(jparser_t *p, jv_t **out, int level)
{
    if (p->p >= p->end) return fail(p, E_VALUE, p->p);
    if (level > MAX_PARSE_DEPTH) return fail(p, E_DEPTH, p->p);
    char c = *p->p;
    switch (c) {
    case '{':
        return parse_object(p, out, level);
    case '[':
        return parse_array(p, out, level);
    case '"': {
        const char *s = NULL;
        size_t n = 0;
        if (!parse_string(p, out ? &s : NULL, &n)) return false;
        if (out) {
            if (!(*out = new_node(p, JV_STRING))) return false;
            (*out)->v.s = s;
            (*out)->len = n;
        }
        return true;
    }
    case 't':
        if (!parse_literal(p, "true", 4)) return false;
        return !out || (*out = new_node(p, JV_TRUE));
    case 'f':
        if (!parse_literal(p, "false", 5)) return false;
        return !out || (*out = new_node(p, JV_FALSE));
    case 'n':
        if (!parse_literal(p, "null", 4)) return false;
        return !out || (*out = new_node(p, JV_NULL));
    default: {
        const char *err = NULL, *start = p->p;
        const char *after = scan_number(start, p->end, &err);
        if (!after) return fail(p, err, start);
        p->p = after;
        if (!out) return true;
        if (!(*out = new_node(p, JV_DOUBLE))) return false;
        if (!convert_number(start, (size_t)(after - start), *out)) return fail(p, E_TOO_BIG, start);
        return true;
    }
    }
}

nereid_error_t *json_reader_parse(const char *text, size_t len, jarena_t *arena, jv_t **root)
{
    return json_reader_parse_infer(text, len, arena, 0, root);
}

/* ---- Checking any depth ---------------------------------------------------- */

static inline const char *ws_at(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

typedef struct flat_text {
    char *data;
    size_t len, cap;
} flat_text_t;

/* Appends text[from, to) to the flattened copy, then, when opener is set,
 * its empty container. Returns -1 when out of memory. */
static int flat_put(flat_text_t *flat, const char *from, const char *to, char opener)
{
    size_t n = (size_t)(to - from) + 2;
    if (flat->len + n + 1 > flat->cap) {
        size_t cap = flat->cap ? flat->cap : 256;
        while (cap < flat->len + n + 1)
            cap *= 2;
        char *grown = realloc(flat->data, cap);
        if (!grown) return -1;
        flat->data = grown, flat->cap = cap;
    }
    memcpy(flat->data + flat->len, from, (size_t)(to - from));
    flat->len += (size_t)(to - from);
    if (opener) {
        memcpy(flat->data + flat->len, opener == '[' ? "[]" : "{}", 2);
        flat->len += 2;
    }
    flat->data[flat->len] = '\0';
    return 0;
}

nereid_error_t *json_reader_check(const char *text, size_t len, size_t keep_depth, char **flat,
                                  size_t *flat_len)
{
    *flat = NULL;
    *flat_len = 0;
    const char *p = text, *end = text + len, *err = NULL, *at = NULL;
    const char *copied = text; /* flat holds text[0, copied) */
    flat_text_t out = {0};
    char *stack = NULL; /* '[' or '{' per open container */
    size_t depth = 0, cap = 0;
    bool oom = false;
    p = ws_at(p, end);
    if (p >= end) {
        err = E_EMPTY, at = p;
        goto done;
    }
    for (;;) {
        /* A value at p. */
        if (p >= end) {
            err = E_VALUE, at = p;
            goto done;
        }
        char c = *p;
        if (c == '[' || c == '{') {
            if (depth == cap) {
                size_t ncap = cap ? 2 * cap : 64;
                char *grown = realloc(stack, ncap);
                if (!grown) {
                    oom = true;
                    goto done;
                }
                stack = grown, cap = ncap;
            }
            stack[depth++] = c;
            if (depth == keep_depth + 1) {
                if (flat_put(&out, copied, p, c)) {
                    oom = true;
                    goto done;
                }
            }
            p = ws_at(p + 1, end);
            if (p < end && *p == (c == '[' ? ']' : '}')) {
                p++;
                goto closed;
            }
            if (c == '[') continue;
            goto member;
        } else if (c == '"') {
            bool escaped;
            const char *after = scan_string(p, end, &escaped, &err, &at);
            if (!after) goto done;
            p = after;
        } else if (c == 't' || c == 'f' || c == 'n') {
            const char *word = c == 't' ? "true" : c == 'f' ? "false" : "null";
            size_t n = strlen(word);
            if ((size_t)(end - p) < n || memcmp(p, word, n)) {
                err = E_VALUE, at = p;
                goto done;
            }
            p += n;
        } else {
            const char *after = scan_number(p, end, &err);
            if (!after) {
                at = p;
                goto done;
            }
            jv_t v;
            if (!convert_number(p, (size_t)(after - p), &v)) {
                err = E_TOO_BIG, at = p;
                goto done;
            }
            p = after;
        }
    next:
        /* After a value: the end, or what its container allows. */
        if (depth == 0) {
            p = ws_at(p, end);
            if (p < end) err = E_NOT_SINGULAR, at = p;
            goto done;
        }
        p = ws_at(p, end);
        if (p < end && *p == ',') {
            p = ws_at(p + 1, end);
            if (stack[depth - 1] == '[') continue;
            goto member;
        }
        if (p < end && *p == (stack[depth - 1] == '[' ? ']' : '}')) {
            p++;
            goto closed;
        }
        err = stack[depth - 1] == '[' ? E_ARR_COMMA : E_OBJ_COMMA, at = p;
        goto done;
    closed:
        if (depth-- == keep_depth + 1) copied = p; /* past the flattened container */
        goto next;
    member:
        if (p >= end || *p != '"') {
            err = E_MISS_NAME, at = p;
            goto done;
        }
        {
            bool escaped;
            const char *after = scan_string(p, end, &escaped, &err, &at);
            if (!after) goto done;
            p = ws_at(after, end);
        }
        if (p >= end || *p != ':') {
            err = E_MISS_COLON, at = p;
            goto done;
        }
        p = ws_at(p + 1, end);
    }
done:
    free(stack);
    if (oom || (!err && out.data && flat_put(&out, copied, end, 0))) {
        free(out.data);
        return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory parsing the request JSON");
    }
    if (err) {
        free(out.data);
        return nereid_error_new(NEREID_ERROR_INTERNAL, PREFIX "%s at %zu", err,
                                (size_t)(at - text));
    }
    *flat = out.data;
    *flat_len = out.len;
    return NULL;
}

nereid_error_t *json_reader_parse_infer(const char *text, size_t len, jarena_t *arena,
                                        size_t data_max, jv_t **root)
{
    if (root) *root = NULL;
    jparser_t p = {
        .base = text, .p = text, .end = text + len, .arena = arena, .data_max = data_max};
    skip_ws(&p);
    if (p.p >= p.end) {
        fail(&p, E_EMPTY, p.p);
    } else if (parse_value(&p, root, 0)) {
        skip_ws(&p);
        if (p.p < p.end) fail(&p, E_NOT_SINGULAR, p.p);
    }
    if (!p.err) return NULL;
    if (root) *root = NULL;
    if (p.oom)
        return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory parsing the request JSON");
    return nereid_error_new(p.nul ? NEREID_ERROR_INVALID_ARG : NEREID_ERROR_INTERNAL,
                            PREFIX "%s at %zu", p.err, p.err_off);
}

const jv_t *jv_get(const jv_t *o, const char *key)
{
    if (!o || o->type != JV_OBJECT) return NULL;
    for (const jv_t *m = o->v.child; m; m = m->next)
        if (!strcmp(m->key, key)) return m;
    return NULL;
}

/* ---- Data spans ------------------------------------------------------------ */

static nereid_error_t *type_error(const char *field, const char *want)
{
    return nereid_error_new(NEREID_ERROR_INTERNAL,
                            "Unable to parse '%s': attempt to access JSON non-%s as %s", field,
                            want, want);
}

static const char *want_name(nereid_datatype_t dt)
{
    switch (dt) {
    case NEREID_TYPE_BOOL:
        return "boolean";
    case NEREID_TYPE_INT8:
    case NEREID_TYPE_INT16:
    case NEREID_TYPE_INT32:
    case NEREID_TYPE_INT64:
        return "signed-integer";
    case NEREID_TYPE_UINT8:
    case NEREID_TYPE_UINT16:
    case NEREID_TYPE_UINT32:
    case NEREID_TYPE_UINT64:
        return "unsigned-integer";
    case NEREID_TYPE_FP32:
        return "float";
    case NEREID_TYPE_FP64:
        return "double";
    default:
        return "string";
    }
}

/* Converts one number leaf (text already checked by the grammar) at *pp into
 * dst; one converter per datatype, chosen once per tensor. */
typedef nereid_error_t *number_fn(const char **pp, const char *end, jfill_t *f, char *dst);

/* The integer leaf of *pp as JV_INT, JV_UINT or JV_DOUBLE. */
static jv_t int_leaf(const char **pp, const char *end)
{
    const char *err, *p = *pp;
    const char *after = scan_number(p, end, &err);
    jv_t v;
    convert_number(p, (size_t)(after - p), &v);
    *pp = after;
    return v;
}

static const struct {
    nereid_datatype_t dt;
    int64_t lo;
    uint64_t hi;
    const char *text;
} int_ranges[] = {
    {NEREID_TYPE_INT8, INT8_MIN, INT8_MAX, "-128 to 127"},
    {NEREID_TYPE_INT16, INT16_MIN, INT16_MAX, "-32768 to 32767"},
    {NEREID_TYPE_INT32, INT32_MIN, INT32_MAX, "-2147483648 to 2147483647"},
    {NEREID_TYPE_INT64, INT64_MIN, INT64_MAX, "-9223372036854775808 to 9223372036854775807"},
    {NEREID_TYPE_UINT8, 0, UINT8_MAX, "0 to 255"},
    {NEREID_TYPE_UINT16, 0, UINT16_MAX, "0 to 65535"},
    {NEREID_TYPE_UINT32, 0, UINT32_MAX, "0 to 4294967295"},
    {NEREID_TYPE_UINT64, 0, UINT64_MAX, "0 to 18446744073709551615"},
};

bool json_int_range(nereid_datatype_t dt, int64_t *lo, uint64_t *hi, const char **text)
{
    for (size_t i = 0; i < sizeof int_ranges / sizeof int_ranges[0]; i++) {
        if (int_ranges[i].dt != dt) continue;
        *lo = int_ranges[i].lo, *hi = int_ranges[i].hi, *text = int_ranges[i].text;
        return true;
    }
    return false;
}

/* An integer that Triton would cast to a narrower type (300 as UINT8 becomes
 * 44) is refused instead. The text names the input, the value as sent and
 * the range. Integers no int64 (signed types) or uint64 (unsigned types)
 * holds keep Triton's type error. */
static nereid_error_t *range_error(const char *p, const char *after, const jfill_t *f)
{
    int64_t lo;
    uint64_t hi;
    const char *range = "";
    json_int_range(f->datatype, &lo, &hi, &range);
    int len = after - p > 64 ? 64 : (int)(after - p);
    return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                            "value %.*s%s of input '%s' is out of range for datatype %s (%s)", len,
                            p, after - p > 64 ? "..." : "", f->input ? f->input : "",
                            nereid_datatype_name(f->datatype), range);
}

#define SIGNED_LEAF(name, T, MIN, MAX)                                                             \
    static nereid_error_t *name(const char **pp, const char *end, jfill_t *f, char *dst)           \
    {                                                                                              \
        const char *p = *pp;                                                                       \
        jv_t v = int_leaf(pp, end);                                                                \
        if (v.type != JV_INT) return type_error(f->field, "signed-integer");                       \
        if (v.v.i < (MIN) || v.v.i > (MAX)) return range_error(p, *pp, f);                         \
        T y = (T)v.v.u;                                                                            \
        memcpy(dst, &y, sizeof y);                                                                 \
        return NULL;                                                                               \
    }
#define UNSIGNED_LEAF(name, T, MAX)                                                                \
    static nereid_error_t *name(const char **pp, const char *end, jfill_t *f, char *dst)           \
    {                                                                                              \
        const char *p = *pp;                                                                       \
        jv_t v = int_leaf(pp, end);                                                                \
        uint64_t x;                                                                                \
        if (!jv_get_uint(&v, &x)) return type_error(f->field, "unsigned-integer");                 \
        if (x > (MAX)) return range_error(p, *pp, f);                                              \
        T y = (T)x;                                                                                \
        memcpy(dst, &y, sizeof y);                                                                 \
        return NULL;                                                                               \
    }
SIGNED_LEAF(leaf_int8, uint8_t, INT8_MIN, INT8_MAX)
SIGNED_LEAF(leaf_int16, uint16_t, INT16_MIN, INT16_MAX)
SIGNED_LEAF(leaf_int32, uint32_t, INT32_MIN, INT32_MAX)
SIGNED_LEAF(leaf_int64, uint64_t, INT64_MIN, INT64_MAX)
UNSIGNED_LEAF(leaf_uint8, uint8_t, UINT8_MAX)
UNSIGNED_LEAF(leaf_uint16, uint16_t, UINT16_MAX)
UNSIGNED_LEAF(leaf_uint32, uint32_t, UINT32_MAX)
UNSIGNED_LEAF(leaf_uint64, uint64_t, UINT64_MAX)

/* The nearest double to the number leaf at *pp (rapidjson's NaN, Inf and
 * Infinity included); false when it overflows a double. */
static inline bool real_leaf(const char **pp, const char *end, double *d)
{
    const char *p = *pp, *q = p + (*p == '-');
    if (*q == 'N' || *q == 'I') {
        const char *err;
        *pp = scan_number(p, end, &err);
        *d = *q == 'N' ? NAN : q == p ? INFINITY : -INFINITY;
        return true;
    }
    const char *after = numfmt_parse_double(p, end, d);
    if (!after) { /* not reached: the grammar checked the text */
        const char *err;
        jv_t v;
        after = scan_number(p, end, &err);
        convert_number(p, (size_t)(after - p), &v);
        *d = v.type == JV_INT ? (double)v.v.i : v.type == JV_UINT ? (double)v.v.u : v.v.d;
    }
    *pp = after;
    return !isinf(*d);
}

static nereid_error_t *too_big(const char *p, const jfill_t *f)
{
    return nereid_error_new(NEREID_ERROR_INTERNAL, PREFIX E_TOO_BIG " at %zu",
                            (size_t)(p - f->base));
}

static nereid_error_t *leaf_fp64(const char **pp, const char *end, jfill_t *f, char *dst)
{
    const char *p = *pp;
    double d;
    if (!real_leaf(pp, end, &d)) return too_big(p, f);
    memcpy(dst, &d, 8);
    return NULL;
}

/* Parsed as a double, then rounded to float, as Triton does. */
static nereid_error_t *leaf_fp32(const char **pp, const char *end, jfill_t *f, char *dst)
{
    const char *p = *pp;
    double d;
    if (!real_leaf(pp, end, &d)) return too_big(p, f);
    float y = (float)d;
    memcpy(dst, &y, 4);
    return NULL;
}

/* BOOL and BYTES take no numbers. */
static nereid_error_t *leaf_none(const char **pp, const char *end, jfill_t *f, char *dst)
{
    (void)pp, (void)end, (void)dst;
    return type_error(f->field, want_name(f->datatype));
}

static number_fn *number_converter(nereid_datatype_t dt)
{
    switch (dt) {
    case NEREID_TYPE_INT8:
        return leaf_int8;
    case NEREID_TYPE_INT16:
        return leaf_int16;
    case NEREID_TYPE_INT32:
        return leaf_int32;
    case NEREID_TYPE_INT64:
        return leaf_int64;
    case NEREID_TYPE_UINT8:
        return leaf_uint8;
    case NEREID_TYPE_UINT16:
        return leaf_uint16;
    case NEREID_TYPE_UINT32:
        return leaf_uint32;
    case NEREID_TYPE_UINT64:
        return leaf_uint64;
    case NEREID_TYPE_FP32:
        return leaf_fp32;
    case NEREID_TYPE_FP64:
        return leaf_fp64;
    default:
        return leaf_none;
    }
}

static nereid_error_t *fill_leaf(const char **pp, const char *end, jfill_t *f, number_fn *num)
{
    const char *p = *pp;
    if (f->n_seen >= f->n_expected)
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "Unable to parse 'data': Shape does not match true shape of "
                                "'data' field");
    size_t i = f->n_seen++;
    char *dst = f->out ? f->out + i * f->element_size : NULL;
    nereid_datatype_t dt = f->datatype;
    char c = *p;
    if (c == 't' || c == 'f') {
        if (dt != NEREID_TYPE_BOOL) return type_error(f->field, want_name(dt));
        if (dst) dst[0] = c == 't';
        *pp = p + (c == 't' ? 4 : 5);
        return NULL;
    }
    if (c == '"') {
        if (dt != NEREID_TYPE_BYTES) return type_error(f->field, want_name(dt));
        bool escaped;
        const char *err, *at;
        const char *after = scan_string(p, end, &escaped, &err, &at);
        size_t raw = (size_t)(after - p) - 2;
        size_t n = escaped ? decode_string(p + 1, raw, NULL) : raw;
        if (n > UINT32_MAX)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG, "BYTES element too long");
        if (f->out) {
            uint32_t n32 = (uint32_t)n;
            memcpy(f->out + f->offset, &n32, 4);
            if (escaped)
                decode_string(p + 1, raw, f->out + f->offset + 4);
            else
                memcpy(f->out + f->offset + 4, p + 1, n);
            f->offset += 4 + n;
        } else {
            f->bytes_total += 4 + n;
        }
        *pp = after;
        return NULL;
    }
    if (c == '{' || c == 'n' || c == '[') return type_error(f->field, want_name(dt));
    return num(pp, end, f, dst);
}

static inline const char *ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

static nereid_error_t *fill_value(const char **pp, const char *end, int depth, jfill_t *f,
                                  number_fn *num)
{
    const char *p = *pp;
    /* Triton's ReadDataFromJsonHelper: the data value is depth 0, and any
     * array or element at depth 100 or more is refused. */
    if (depth >= MAX_DATA_DEPTH)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "JSON nesting depth exceeds maximum allowed limit (%d)",
                                MAX_DATA_DEPTH);
    if (*p != '[') return fill_leaf(pp, end, f, num);
    p = ws(p + 1, end);
    if (*p == ']') {
        *pp = p + 1;
        return NULL;
    }
    for (;;) {
        nereid_error_t *err = fill_value(&p, end, depth + 1, f, num);
        if (err) return err;
        p = ws(p, end);
        if (*p++ == ']') break;
        p = ws(p, end);
    }
    *pp = p;
    return NULL;
}

nereid_error_t *json_reader_fill_data(const jv_t *span, jfill_t *f)
{
    const char *p = span->v.s;
    return fill_value(&p, span->v.s + span->len, 0, f, number_converter(f->datatype));
}
