/*
 * This file contains the small JSON reader of the HTTP inference path: one
 * pass over the request header into a tree of nodes allocated from an arena
 * (no malloc per value), with rapidjson's number model (int64, uint64 up to
 * UINT64_MAX, double; NaN/Inf/Infinity literals as Triton accepts them) and
 * rapidjson's error texts. The value of any "data" member of an object two
 * levels below the root (root -> "inputs" array -> input object) is checked
 * but kept as its raw text span, so tensor data is converted once, straight
 * into its binary layout, by json_reader_fill_data.
 */
#ifndef NEREID_HTTP_JSON_READER_H
#define NEREID_HTTP_JSON_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nereid/server.h"

typedef enum jv_type {
    JV_NULL,
    JV_FALSE,
    JV_TRUE,
    JV_INT,    /* integer syntax that fits int64 */
    JV_UINT,   /* integer syntax in (INT64_MAX, UINT64_MAX] */
    JV_DOUBLE, /* fraction/exponent, NaN/Infinity, or an integer beyond 64 bits */
    JV_STRING,
    JV_ARRAY,
    JV_OBJECT,
    JV_SPAN, /* raw text of a "data" value, checked but not converted */
} jv_type_t;

typedef struct jv {
    jv_type_t type;
    const char *key; /* member name (NUL-terminated) inside an object, else NULL */
    struct jv *next; /* next element or member */
    size_t len;      /* string bytes, array/object children, span bytes */
    union {
        int64_t i;
        uint64_t u;
        double d;
        const char *s;    /* string (NUL-terminated, may hold NULs) or span start */
        struct jv *child; /* first element or member */
    } v;
} jv_t;

/* Bump allocator; the first block is inline, so a small request mallocs
 * nothing. Not movable once used. */
typedef struct jarena {
    char *cur, *end;
    void *blocks; /* malloc'ed blocks, chained through their first word */
    _Alignas(16) char first[2048];
} jarena_t;

void jarena_init(jarena_t *a);
/* 16-byte aligned; NULL on OOM. */
void *jarena_alloc(jarena_t *a, size_t n);
/* Takes a malloc'ed block whose first 16 bytes are free for the arena's
 * use; freed with the arena. */
void jarena_adopt(jarena_t *a, void *block);
void jarena_free(jarena_t *a);

/* Parses text[0..len) into *root (nodes in arena). Errors are INTERNAL with
 * "failed to parse the request JSON buffer: <rapidjson text> at <offset>". */
nereid_error_t *json_reader_parse(const char *text, size_t len, jarena_t *arena, jv_t **root);

/* Checks the document text[0..len) at any depth without recursion (as
 * Triton's iterative rapidjson parse; its error texts, INTERNAL). When it
 * nests deeper than keep_depth, *flat is a copy in which each container
 * opened at depth keep_depth + 1 is empty ("[]" or "{}"): the same document
 * for every reader of its first keep_depth levels (caller frees with free);
 * else *flat is NULL. */
nereid_error_t *json_reader_check(const char *text, size_t len, size_t keep_depth, char **flat,
                                  size_t *flat_len);

/* json_reader_parse for an inference request: a "data" value that follows
 * its input's "datatype" (a number type or BOOL) and "shape" (non-negative
 * integers of at most data_max bytes in all) and is a flat array of exactly
 * that many valid elements of that type is checked and converted in one
 * pass, straight into tensor memory in the arena (jv_span_t.data); any other
 * "data" is only checked and left to json_reader_fill_data, which then
 * gives the errors. data_max 0 converts nothing. */
nereid_error_t *json_reader_parse_infer(const char *text, size_t len, jarena_t *arena,
                                        size_t data_max, jv_t **root);

/* A JV_SPAN node (jv_span: v as one, or NULL). data, when not NULL, is the span already converted
 * into count elements of datatype (little-endian, as json_reader_fill_data would write them). */
typedef struct jv_span {
    jv_t node;
    void *data;
    size_t count;
    nereid_datatype_t datatype;
} jv_span_t;

static inline const jv_span_t *jv_span(const jv_t *v)
{
    return v && v->type == JV_SPAN ? (const jv_span_t *)v : NULL;
}

/* First member named key of object o (rapidjson's FindMember), or NULL. */
const jv_t *jv_get(const jv_t *o, const char *key);

static inline bool jv_is_number(const jv_t *v)
{
    return v->type == JV_INT || v->type == JV_UINT || v->type == JV_DOUBLE;
}
/* rapidjson IsUint64: non-negative integer syntax within 64 bits. */
static inline bool jv_get_uint(const jv_t *v, uint64_t *out)
{
    if (v->type == JV_UINT || (v->type == JV_INT && v->v.i >= 0)) {
        *out = v->v.u;
        return true;
    }
    return false;
}

/* Conversion of a "data" span into the binary layout of datatype. */
typedef struct jfill {
    nereid_datatype_t datatype;
    const char *field;   /* "data", for error texts */
    const char *input;   /* the input's name, for error texts (may be NULL) */
    const char *base;    /* start of the parsed text, for error offsets */
    char *out;           /* NULL on the BYTES sizing pass */
    size_t element_size; /* 0 for BYTES */
    size_t n_expected;   /* elements the shape asks for */
    size_t n_seen;       /* leaves visited */
    size_t bytes_total;  /* BYTES: 4-byte prefixes + string bytes */
    size_t offset;       /* BYTES: write position */
} jfill_t;

/* Walks the (already checked) span v, flat or nested up to 100 levels,
 * writing each leaf; Triton's texts for wrong leaf types and leaf counts
 * beyond n_expected (the caller checks too few). */
nereid_error_t *json_reader_fill_data(const jv_t *span, jfill_t *f);

/* The range JSON integers of datatype dt must be in (*lo..*hi) and its text
 * for errors ("0 to 255"); false when dt is not an integer datatype. */
bool json_int_range(nereid_datatype_t dt, int64_t *lo, uint64_t *hi, const char **text);

#endif
