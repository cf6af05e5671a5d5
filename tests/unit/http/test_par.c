/*
 * This file contains the unit tests of the helpers that convert one large
 * JSON tensor on several cores (src/http/par.c): with 1 and 3 helpers, every
 * element type read from long arrays (random values, random whitespace
 * around the commas, more text after the array) must give exactly the
 * tensor and end position of the one-run reader, and every broken array
 * (a bad token, a missing or doubled comma, an early ']' at and around each
 * split point; one element more or fewer) the same refusal; every type
 * written must give exactly the one-run writer's text. Several callers at
 * once (the helpers then mostly busy) must get the same answers; the parts
 * the helpers ran are counted, so a split that never happens fails.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "http/par.h"

static uint64_t next_random(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}

/* Elements of the long arrays (BOOL splits from 8 times the minimum). */
#define N_ELEMENTS (3 * PAR_MIN_ELEMENTS + 7)
#define N_BOOL (8 * PAR_MIN_ELEMENTS + 7)

static const numparse_kind_t kParseKinds[] = {
    NUMPARSE_INT8,  NUMPARSE_INT16,  NUMPARSE_INT32,  NUMPARSE_INT64,
    NUMPARSE_UINT8, NUMPARSE_UINT16, NUMPARSE_UINT32, NUMPARSE_UINT64,
    NUMPARSE_FP32,  NUMPARSE_FP64,   NUMPARSE_BOOL,
};
static const char *const kParseNames[] = {"INT8",   "INT16",  "INT32", "INT64", "UINT8", "UINT16",
                                          "UINT32", "UINT64", "FP32",  "FP64",  "BOOL"};

/* One token of kind at o; returns its end. */
static char *put_token(char *o, numparse_kind_t kind, uint64_t *s)
{
    uint64_t r = next_random(s);
    switch (kind) {
    case NUMPARSE_INT8:
        return o + sprintf(o, "%d", (int)(int8_t)r);
    case NUMPARSE_INT16:
        return o + sprintf(o, "%d", (int)(int16_t)r);
    case NUMPARSE_INT32:
        return o + sprintf(o, "%" PRId32, (int32_t)r);
    case NUMPARSE_INT64:
        return o + sprintf(o, "%" PRId64, (int64_t)r);
    case NUMPARSE_UINT8:
        return o + sprintf(o, "%u", (unsigned)(uint8_t)r);
    case NUMPARSE_UINT16:
        return o + sprintf(o, "%u", (unsigned)(uint16_t)r);
    case NUMPARSE_UINT32:
        return o + sprintf(o, "%" PRIu32, (uint32_t)r);
    case NUMPARSE_UINT64:
        return o + sprintf(o, "%" PRIu64, r);
    case NUMPARSE_FP32:
    case NUMPARSE_FP64:
        /* Long random values and short decimals, mixed. */
        if (r & 1) return o + sprintf(o, "%.17g", (double)(int64_t)r / 1e9);
        return o + sprintf(o, "%g", (double)(int)(r >> 40) / 8);
    case NUMPARSE_BOOL:
        return o + sprintf(o, "%s", (r & 1) ? "true" : "false");
    }
    return o;
}

/* Whitespace around a comma now and then: none, spaces, a newline. */
static char *put_ws(char *o, uint64_t *s)
{
    uint64_t r = next_random(s) % 16;
    if (r == 0) *o++ = ' ';
    if (r == 1) *o++ = '\n';
    if (r == 2) o += sprintf(o, " \t ");
    return o;
}

/* The text of an array of n tokens from its first one, its ']' and more of
 * the body; *start is where numparse_array starts. */
static char *array_text(numparse_kind_t kind, size_t n, uint64_t seed, size_t *len)
{
    char *t = malloc(n * 32 + 64), *o = t;
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        if (i) {
            o = put_ws(o, &s);
            *o++ = ',';
            o = put_ws(o, &s);
        }
        o = put_token(o, kind, &s);
    }
    o = put_ws(o, &s);
    o += sprintf(o, "],\"parameters\":{\"a\":1,\"b\":[1,2,3]}}]}");
    *len = (size_t)(o - t);
    return t;
}

/* par_numparse_array against numparse_array on text (len bytes) for n. */
static void compare_read(numparse_kind_t kind, const char *name, const char *text, size_t len,
                         size_t n, const char *what)
{
    char *a = calloc(n + 1, 8), *b = calloc(n + 1, 8);
    const char *ra = numparse_array(kind, text, text + len, a, n);
    const char *rb = par_numparse_array(kind, text, text + len, b, n);
    CHECK_MSG(ra == rb, "%s %s n=%zu: ends at %td, one run at %td", name, what, n,
              rb ? rb - text : -1, ra ? ra - text : -1);
    if (ra && rb) CHECK_MSG(memcmp(a, b, n * 8) == 0, "%s %s: tensors differ", name, what);
    free(a);
    free(b);
}

/* The start of token i of text (the first byte after i commas and any
 * whitespace). */
static char *token_at(char *text, size_t len, size_t i)
{
    char *p = i ? (char *)numparse_nth_comma(text, text + len, i) + 1 : text;
    while (*p == ' ' || *p == '\n' || *p == '\t')
        p++;
    return p;
}

static void test_reads(int helpers)
{
    unsigned long before = par_parts_helped();
    for (size_t k = 0; k < sizeof kParseKinds / sizeof *kParseKinds; k++) {
        numparse_kind_t kind = kParseKinds[k];
        const char *name = kParseNames[k];
        size_t n = kind == NUMPARSE_BOOL ? N_BOOL : N_ELEMENTS, len;
        char *text = array_text(kind, n, 77 + k, &len);
        unsigned long was = par_parts_helped();
        compare_read(kind, name, text, len, n, "valid");
        CHECK_MSG((par_parts_helped() > was) == (helpers > 0), "%s: split %lu parts, %d helpers",
                  name, par_parts_helped() - was, helpers);
        compare_read(kind, name, text, len, n - 1, "one fewer");
        compare_read(kind, name, text, len, n + 1, "one more");
        compare_read(kind, name, text, len, PAR_MIN_ELEMENTS, "a prefix");
        /* Broken at and around every split point of 2, 3 and 4 parts, and
         * at both ends. */
        size_t at[32], n_at = 0;
        for (size_t parts = 2; parts <= 4; parts++)
            for (size_t j = 1; j < parts; j++)
                for (int d = -1; d <= 1; d++)
                    at[n_at++] = n * j / parts + (size_t)d;
        at[n_at++] = 0;
        at[n_at++] = n - 1;
        for (size_t i = 0; i < n_at; i++) {
            char *copy = malloc(len + 2);
            static const char *const breaks[] = {"x", "]", ",", "[", "-"};
            for (size_t m = 0; m < sizeof breaks / sizeof *breaks; m++) {
                memcpy(copy, text, len);
                char *tok = token_at(copy, len, at[i]);
                *tok = breaks[m][0];
                char what[64];
                snprintf(what, sizeof what, "token %zu starting '%s'", at[i], breaks[m]);
                compare_read(kind, name, copy, len, n, what);
            }
            /* The comma before the token gone (two tokens run together). */
            if (at[i]) {
                memcpy(copy, text, len);
                *(char *)numparse_nth_comma(copy, copy + len, at[i]) = ' ';
                compare_read(kind, name, copy, len, n, "a comma gone");
            }
            free(copy);
        }
        free(text);
    }
    if (helpers)
        CHECK_MSG(par_parts_helped() > before, "no part read by a helper (%d helpers)", helpers);
    else
        CHECK(par_parts_helped() == before);
}

static const numfmt_kind_t kFmtKinds[] = {
    NUMFMT_BOOL, NUMFMT_U8,  NUMFMT_U16, NUMFMT_U32, NUMFMT_U64, NUMFMT_I8,
    NUMFMT_I16,  NUMFMT_I32, NUMFMT_I64, NUMFMT_F32, NUMFMT_F64,
};

/* Random elements of 8 bytes each (any bits; reals: no NaN payload rules
 * matter, both writers print the same). */
static void compare_write(numfmt_kind_t kind, size_t n, uint64_t seed)
{
    uint64_t s = seed, *data = malloc(n * 8);
    for (size_t i = 0; i < n; i++)
        data[i] = next_random(&s) >> (next_random(&s) % 64);
    char *a = malloc(n * NUMFMT_ARRAY_ROOM + 1), *b = malloc(n * NUMFMT_ARRAY_ROOM + 1);
    char *ea = numfmt_array(a, kind, data, n);
    char *eb = par_numfmt_array(b, kind, data, n);
    CHECK_MSG(ea - a == eb - b && memcmp(a, b, (size_t)(ea - a)) == 0,
              "kind %d n=%zu: %td bytes, one run %td", (int)kind, n, eb - b, ea - a);
    free(a);
    free(b);
    free(data);
}

static void test_writes(int helpers)
{
    unsigned long before = par_parts_helped();
    for (size_t k = 0; k < sizeof kFmtKinds / sizeof *kFmtKinds; k++) {
        unsigned long was = par_parts_helped();
        compare_write(kFmtKinds[k], kFmtKinds[k] == NUMFMT_BOOL ? N_BOOL : N_ELEMENTS, 5 + k);
        CHECK_MSG((par_parts_helped() > was) == (helpers > 0), "kind %d: split %lu parts", (int)k,
                  par_parts_helped() - was);
        compare_write(kFmtKinds[k], PAR_MIN_ELEMENTS, 9 + k);
        compare_write(kFmtKinds[k], PAR_MIN_ELEMENTS - 1, 13 + k);
    }
    if (helpers)
        CHECK_MSG(par_parts_helped() > before, "no part written by a helper (%d helpers)", helpers);
}

/* Callers at once: each part goes to whichever helper is idle, or stays. */
static void *caller(void *arg)
{
    uint64_t seed = (uint64_t)(uintptr_t)arg;
    for (int round = 0; round < 4; round++) {
        size_t len, n = PAR_MIN_ELEMENTS * 2 + (size_t)round;
        char *text = array_text(NUMPARSE_FP32, n, seed + (uint64_t)round, &len);
        compare_read(NUMPARSE_FP32, "FP32", text, len, n, "concurrent");
        free(text);
        compare_write(NUMFMT_F64, n, seed * 3 + (uint64_t)round);
    }
    return NULL;
}

static void test_concurrent_callers(void)
{
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, caller, (void *)(i + 1));
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
}

int main(void)
{
    /* No helpers yet: everything in one run. */
    CHECK(par_helpers() == 0);
    test_reads(0);
    test_writes(0);

    CHECK(par_start(1) == 0);
    CHECK(par_helpers() == 1);
    test_reads(1);
    test_writes(1);
    /* Nested starts keep the helpers until the last stop. */
    CHECK(par_start(3) == 0);
    CHECK(par_helpers() == 1);
    par_stop();
    CHECK(par_helpers() == 1);
    par_stop();
    CHECK(par_helpers() == 0);
    par_stop(); /* one stop too many: nothing */

    CHECK(par_start(3) == 0);
    CHECK(par_helpers() == 3);
    test_reads(3);
    test_writes(3);
    test_concurrent_callers();
    par_stop();
    CHECK(par_helpers() == 0);
    test_writes(0);
    return check_summary();
}
