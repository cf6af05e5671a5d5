/*
 * This file contains the unit tests of the JSON number text converters
 * (src/http/numfmt.cc) and of the "data" converter into tensor memory
 * (json_reader_fill_data): golden texts as Triton's writer (rapidjson's
 * Grisu2) prints edge values and values whose 17th digit is not the nearest,
 * random doubles and floats printed in that layout and parsed back bit for
 * bit, integers over the full 64-bit ranges, and the parse rules and error
 * texts per datatype.
 */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "http/json_reader.h"
#include "http/numfmt.h"

static uint64_t rng = 0x9E3779B97F4A7C15ULL;

/* xorshift64*: deterministic across runs. */
static uint64_t next_random(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ULL;
}

static const char *fmt(double v)
{
    static char buf[64];
    char *e = numfmt_double(buf, v);
    *e = '\0';
    return buf;
}

static uint64_t bits_of(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

static double double_of(uint64_t u)
{
    double d;
    memcpy(&d, &u, 8);
    return d;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_golden_doubles(void)
{
    CHECK_STR(fmt(0.0), "0.0");
    CHECK_STR(fmt(-0.0), "-0.0");
    CHECK_STR(fmt(1.0), "1.0");
    CHECK_STR(fmt(-12.0), "-12.0");
    CHECK_STR(fmt(0.5), "0.5");
    CHECK_STR(fmt(12.375), "12.375");
    CHECK_STR(fmt(0.1), "0.1");
    CHECK_STR(fmt((double)0.1f), "0.10000000149011612");
    CHECK_STR(fmt(0.001), "0.001");
    CHECK_STR(fmt(0.000001), "0.000001");
    CHECK_STR(fmt(1e-7), "1e-7");
    CHECK_STR(fmt(-1.5e-7), "-1.5e-7");
    CHECK_STR(fmt(1e20), "100000000000000000000.0");
    CHECK_STR(fmt(1e21), "1e21");
    CHECK_STR(fmt(1.5e30), "1.5e30");
    CHECK_STR(fmt(123456789012345678.0), "123456789012345680.0");
    CHECK_STR(fmt(9007199254740993.0), "9007199254740992.0");
    CHECK_STR(fmt(0.3), "0.3");
    CHECK_STR(fmt(2.0 / 3), "0.6666666666666666");
    /* Grisu2's 17th digit is not always the nearest; Triton prints these so. */
    CHECK_STR(fmt(18446744073709551615.0), "18446744073709553000.0");
    CHECK_STR(fmt(double_of(0x0d83b3e29a21487aULL)), "1.4427754422401725e-243");
    CHECK_STR(fmt(double_of(0x7d6e0b878a794779ULL)), "1.5351064531638966e296");
    CHECK_STR(fmt(double_of(0xd566404840a2ab9dULL)), "-2.4918394899649605e103");
    CHECK_STR(fmt((double)float_of(0x9a21487aU)), "-3.3352565756201249e-23");
    CHECK_STR(fmt((double)float_of(0x098c4828U)), "3.3771629438177847e-33");
    CHECK_STR(fmt((double)float_of(0xafc200acU)), "-3.5288871824690207e-10");
    CHECK_STR(fmt((double)1e-7f), "1.0000000116860974e-7");
    CHECK_STR(fmt(DBL_MAX), "1.7976931348623157e308");
    CHECK_STR(fmt(-DBL_MAX), "-1.7976931348623157e308");
    CHECK_STR(fmt(DBL_MIN), "2.2250738585072014e-308");
    CHECK_STR(fmt(double_of(1)), "5e-324");
    CHECK_STR(fmt(double_of(0x000FFFFFFFFFFFFFULL)), "2.225073858507201e-308");
    CHECK_STR(fmt((double)FLT_MAX), "3.4028234663852887e38");
    CHECK_STR(fmt((double)FLT_MIN), "1.1754943508222876e-38");
    CHECK_STR(fmt((double)float_of(1)), "1.401298464324817e-45");
    CHECK_STR(fmt(NAN), "NaN");
    CHECK_STR(fmt(-NAN), "NaN");
    CHECK_STR(fmt(INFINITY), "Infinity");
    CHECK_STR(fmt(-INFINITY), "-Infinity");
}

/* Whether text is laid out as rapidjson prints v (finite, nonzero): a plain
 * decimal with a '.' for 1e-6 <= |v| < 1e21 (Prettify's -6 < kk <= 21), else
 * d[.ddd]e[-]x; 1 to 17 significant digits. */
static bool layout_ok(const char *text, double v)
{
    double a = fabs(v);
    const char *e = strchr(text, 'e');
    bool plain = a >= 1e-6 && a < 1e21;
    if (plain != !e) return false;
    if (plain && !strchr(text, '.')) return false;
    if (e && (e[1] == '+' || (e[-1] == '0' && e[-2] == '.'))) return false;
    int digits = 0, last = 0; /* significant digits: first to last nonzero */
    for (const char *p = text; *p && *p != 'e'; p++) {
        if (*p < '0' || *p > '9' || (!digits && *p == '0')) continue;
        digits++;
        if (*p != '0') last = digits;
    }
    return last >= 1 && last <= 17;
}

static int grisu_differs; /* numfmt_double's short-decimal path vs plain Grisu2 */

/* parse(print(x)) is x, bit for bit, and print(x) has the layout. */
static void check_double(double v, int *layout, int *roundtrip)
{
    char a[64], g[64];
    *numfmt_double(a, v) = '\0';
    *numfmt_double_grisu(g, v) = '\0';
    if (strcmp(a, g) && grisu_differs++ < 10) fprintf(stderr, "%a: %s, Grisu2 %s\n", v, a, g);
    if (!layout_ok(a, v) && (*layout)++ < 10) fprintf(stderr, "bad layout for %a: %s\n", v, a);
    double back;
    const char *end = numfmt_parse_double(a, a + strlen(a), &back);
    if ((!end || *end || bits_of(back) != bits_of(v)) && (*roundtrip)++ < 10)
        fprintf(stderr, "round trip failed for %a: %s\n", v, a);
}

static void test_random_doubles(void)
{
    int mismatch = 0, roundtrip = 0;
    grisu_differs = 0;
    for (int i = 0; i < 1000000; i++) {
        double v = double_of(next_random());
        if (!isfinite(v) || v == 0) continue;
        check_double(v, &mismatch, &roundtrip);
    }
    /* Magnitudes people send: uniform in a few decades. */
    for (int i = 0; i < 100000; i++) {
        double v =
            (double)(next_random() >> 11) * 0x1p-53 * pow(10, (int)(next_random() % 24) - 12);
        check_double(i & 1 ? -v : v, &mismatch, &roundtrip);
    }
    CHECK_MSG(mismatch == 0, "%d doubles printed in a wrong layout", mismatch);
    CHECK_MSG(roundtrip == 0, "%d doubles did not round-trip", roundtrip);
    CHECK_MSG(grisu_differs == 0, "%d doubles printed differently from Grisu2", grisu_differs);
}

/* Every binary exponent (so every cached power numfmt's table picks, and
 * the subnormals), each with the significands where Grisu2's cases change:
 * a power of two (its lower boundary is closer), one ulp above and below,
 * all ones, and random ones; all printed as rapidjson prints them. */
static void test_every_exponent(void)
{
    int layout = 0, roundtrip = 0;
    grisu_differs = 0;
    for (uint64_t be = 0; be < 2047; be++) {
        uint64_t sig[8] = {0, 1, 2, 0x000FFFFFFFFFFFFFULL, 0x0008000000000000ULL};
        for (int i = 5; i < 8; i++)
            sig[i] = next_random() >> 12;
        for (int i = 0; i < 8; i++) {
            double v = double_of(be << 52 | sig[i]);
            if (v == 0) continue;
            check_double(v, &layout, &roundtrip);
            check_double(-v, &layout, &roundtrip);
        }
    }
    CHECK_MSG(layout == 0 && roundtrip == 0, "%d layout, %d round-trip failures", layout,
              roundtrip);
    CHECK_MSG(grisu_differs == 0, "%d doubles printed differently from Grisu2", grisu_differs);
}

static void test_random_floats(void)
{
    int layout = 0, roundtrip = 0;
    for (int i = 0; i < 200000; i++) {
        float f = float_of((uint32_t)next_random());
        if (!isfinite(f) || f == 0) continue;
        char a[64];
        *numfmt_double(a, (double)f) = '\0';
        if (!layout_ok(a, f) && layout++ < 10) fprintf(stderr, "bad layout for %a: %s\n", f, a);
        double back;
        numfmt_parse_double(a, a + strlen(a), &back);
        float fb = (float)back;
        if (memcmp(&fb, &f, 4) && roundtrip++ < 10)
            fprintf(stderr, "round trip failed for %a: %s\n", (double)f, a);
    }
    /* Short decimals, the bench's (i % 1024) / 8, print short. */
    for (int i = 1; i < 1024; i++) {
        char a[64], want[64];
        *numfmt_double(a, (double)((float)i / 8)) = '\0';
        snprintf(want, sizeof want, i % 8 ? "%g" : "%.1f", i / 8.0);
        if (strcmp(a, want) && layout++ < 10) fprintf(stderr, "%s, want %s\n", a, want);
    }
    CHECK_MSG(layout == 0, "%d floats printed in a wrong layout", layout);
    CHECK_MSG(roundtrip == 0, "%d floats did not round-trip", roundtrip);
}

/* The short-decimal shortcut prints what Grisu2 prints: exact binary
 * fractions and integers around its 15-digit bound, and numfmt_array's loops
 * match element by element. */
static void test_short_decimals(void)
{
    CHECK_STR(fmt(999999999999999.0), "999999999999999.0");
    CHECK_STR(fmt(1e15), "1000000000000000.0");
    CHECK_STR(fmt(9007199254740991.0), "9007199254740991.0");
    CHECK_STR(fmt(0x1p-20), "9.5367431640625e-7");
    CHECK_STR(fmt(0x1p-21), "4.76837158203125e-7");
    CHECK_STR(fmt(0x1p-22), "2.384185791015625e-7");
    CHECK_STR(fmt(1024.0), "1024.0");
    CHECK_STR(fmt(-0.125), "-0.125");
    CHECK_STR(fmt(1e20), "100000000000000000000.0");
    CHECK_STR(fmt(0x1p60), "1152921504606847000.0"); /* Grisu2, not exact */
    int layout = 0, roundtrip = 0;
    grisu_differs = 0;
    for (int64_t i = -100000; i <= 100000; i++)
        for (int k = 0; k <= 24 && i; k += 3)
            check_double(ldexp((double)i, -k), &layout, &roundtrip);
    for (int i = 0; i < 200000; i++) {
        uint64_t r = next_random();
        double v = ldexp((double)(r >> (r % 64) | 1), (int)(next_random() % 80) - 40);
        check_double(i & 1 ? -v : v, &layout, &roundtrip);
        double p10 = pow(10, (int)(next_random() % 30) - 15);
        check_double((double)(int64_t)(next_random() >> 40 | 1) * p10, &layout, &roundtrip);
    }
    CHECK_MSG(grisu_differs == 0, "%d values printed differently from Grisu2", grisu_differs);
    CHECK(layout == 0 && roundtrip == 0);

    /* numfmt_array against element-by-element printing. */
    enum { N = 4096 };
    static union {
        double d[N];
        float f[N];
        int64_t i[N];
        uint8_t b[N * 8];
    } in;
    static char got[N * NUMFMT_ARRAY_ROOM + 1], want[N * NUMFMT_ARRAY_ROOM + 1];
    for (int kind = NUMFMT_BOOL; kind <= NUMFMT_F64; kind++) {
        for (size_t i = 0; i < sizeof in.b; i++)
            in.b[i] = (uint8_t)next_random();
        for (int i = 0; i < N / 2; i++) {
            if (kind == NUMFMT_F32) in.f[i] = (float)(i % 1024) / 8;
            if (kind == NUMFMT_F64) in.d[i] = (double)(i % 1000) / 16;
            if (kind == NUMFMT_BOOL) in.b[i] &= 1;
        }
        /* Every plain layout, both signs: 1e-6 <= |v| < 1e21 at every decade,
         * integers and 16 to 18 digits among them. */
        for (int i = N / 2; i < N / 2 + N / 4; i++) {
            double m = (double)(next_random() >> 11) * 0x1p-53;
            if (i % 3 == 0) m = (double)(next_random() >> (11 + next_random() % 50));
            double v = m * pow(10, (int)(next_random() % 30) - 7);
            v = i & 1 ? -v : v;
            if (kind == NUMFMT_F32) in.f[i] = (float)v;
            if (kind == NUMFMT_F64) in.d[i] = v;
        }
        for (size_t n = 0; n <= N; n = n ? n * 4 : 1) {
            *numfmt_array(got, (numfmt_kind_t)kind, in.b, n) = '\0';
            char *o = want;
            for (size_t i = 0; i < n; i++) {
                if (i) *o++ = ',';
                switch (kind) {
                case NUMFMT_BOOL:
                    o += sprintf(o, "%s", in.b[i] ? "true" : "false");
                    break;
                case NUMFMT_U8:
                    o = numfmt_u64(o, in.b[i]);
                    break;
                case NUMFMT_U16:
                    o = numfmt_u64(o, ((uint16_t *)in.b)[i]);
                    break;
                case NUMFMT_U32:
                    o = numfmt_u64(o, ((uint32_t *)in.b)[i]);
                    break;
                case NUMFMT_U64:
                    o = numfmt_u64(o, ((uint64_t *)in.b)[i]);
                    break;
                case NUMFMT_I8:
                    o = numfmt_i64(o, ((int8_t *)in.b)[i]);
                    break;
                case NUMFMT_I16:
                    o = numfmt_i64(o, ((int16_t *)in.b)[i]);
                    break;
                case NUMFMT_I32:
                    o = numfmt_i64(o, ((int32_t *)in.b)[i]);
                    break;
                case NUMFMT_I64:
                    o = numfmt_i64(o, in.i[i]);
                    break;
                case NUMFMT_F32:
                    o = numfmt_double_grisu(o, (double)in.f[i]);
                    break;
                default:
                    o = numfmt_double_grisu(o, in.d[i]);
                }
            }
            *o = '\0';
            CHECK_MSG(!strcmp(got, want), "numfmt_array kind %d, %zu elements", kind, n);
        }
    }
}

static const char *fmt_u(uint64_t v)
{
    static char buf[32];
    *numfmt_u64(buf, v) = '\0';
    return buf;
}

static const char *fmt_i(int64_t v)
{
    static char buf[32];
    *numfmt_i64(buf, v) = '\0';
    return buf;
}

static void test_integers(void)
{
    CHECK_STR(fmt_u(0), "0");
    CHECK_STR(fmt_u(9), "9");
    CHECK_STR(fmt_u(10), "10");
    CHECK_STR(fmt_u(99), "99");
    CHECK_STR(fmt_u(100), "100");
    CHECK_STR(fmt_u(255), "255");
    CHECK_STR(fmt_u(UINT64_MAX), "18446744073709551615");
    CHECK_STR(fmt_i(INT64_MIN), "-9223372036854775808");
    CHECK_STR(fmt_i(INT64_MAX), "9223372036854775807");
    CHECK_STR(fmt_i(-1), "-1");
    CHECK_STR(fmt_i(-128), "-128");
    CHECK_STR(fmt_i(123456789012345678), "123456789012345678");
    int bad = 0;
    for (int i = 0; i < 100000; i++) {
        uint64_t u = next_random() >> (next_random() % 64);
        char want[32];
        snprintf(want, sizeof want, "%" PRIu64, u);
        if (strcmp(fmt_u(u), want)) bad++;
        snprintf(want, sizeof want, "%" PRId64, (int64_t)u);
        if (strcmp(fmt_i((int64_t)u), want)) bad++;
    }
    CHECK_MSG(bad == 0, "%d integers printed differently from printf", bad);
}

/* Converts the JSON "data" text into n elements of dt at out. */
static nereid_error_t *fill(nereid_datatype_t dt, const char *text, void *out, size_t n)
{
    jv_t span = {.type = JV_SPAN, .len = strlen(text)};
    span.v.s = text;
    jfill_t f = {.datatype = dt,
                 .field = "data",
                 .input = "I",
                 .base = text,
                 .out = out,
                 .element_size = nereid_datatype_byte_size(dt),
                 .n_expected = n};
    nereid_error_t *err = json_reader_fill_data(&span, &f);
    if (!err && f.n_seen != n) return nereid_error_new(NEREID_ERROR_INTERNAL, "short fill");
    return err;
}

#define NON(want) "Unable to parse 'data': attempt to access JSON non-" want " as " want

static void test_fill(void)
{
    float f[8];
    CHECK(
        !fill(NEREID_TYPE_FP32, "[0.1,-0.0,1e-7,3.4028234663852886e38,NaN,-Infinity,Inf,7]", f, 8));
    CHECK(f[0] == 0.1f && f[1] == 0 && signbit(f[1]) && f[2] == 1e-7f && f[3] == FLT_MAX);
    CHECK(isnan(f[4]) && !signbit(f[4]) && f[5] == -INFINITY && f[6] == INFINITY && f[7] == 7);
    /* A double rounded to float (Triton's double then cast), not parsed as a float. */
    CHECK(!fill(NEREID_TYPE_FP32, "[1.00000005960464477550,1e39,-NaN]", f, 3));
    CHECK(f[0] == (float)1.00000005960464477550 && f[1] == INFINITY && isnan(f[2]) &&
          !signbit(f[2]));

    double d[6];
    CHECK(!fill(NEREID_TYPE_FP64,
                "[ 5e-324 , [2.2250738585072014e-308], 123456789012345678, "
                "18446744073709551616, -9223372036854775808, 1.7976931348623157e308 ]",
                d, 6));
    CHECK(d[0] == double_of(1) && d[1] == DBL_MIN && d[2] == 123456789012345678.0);
    CHECK(d[3] == 18446744073709551616.0 && d[4] == -9223372036854775808.0 && d[5] == DBL_MAX);
    CHECK_ERROR(fill(NEREID_TYPE_FP64, "[1, 1e309]", d, 2), NEREID_ERROR_INTERNAL,
                "failed to parse the request JSON buffer: Number too big to be stored in "
                "double. at 4");
    CHECK_ERROR(fill(NEREID_TYPE_FP32, "[-1.8e308]", f, 1), NEREID_ERROR_INTERNAL,
                "Number too big to be stored in double. at 1");
    CHECK_ERROR(fill(NEREID_TYPE_FP32, "[true]", f, 1), NEREID_ERROR_INTERNAL, NON("float"));

    int64_t i64[3];
    CHECK(!fill(NEREID_TYPE_INT64, "[-9223372036854775808,9223372036854775807,0]", i64, 3));
    CHECK(i64[0] == INT64_MIN && i64[1] == INT64_MAX && i64[2] == 0);
    CHECK_ERROR(fill(NEREID_TYPE_INT64, "[9223372036854775808]", i64, 1), NEREID_ERROR_INTERNAL,
                NON("signed-integer"));
    CHECK_ERROR(fill(NEREID_TYPE_INT32, "[1.0]", i64, 1), NEREID_ERROR_INTERNAL,
                NON("signed-integer"));
    CHECK_ERROR(fill(NEREID_TYPE_INT8, "[NaN]", i64, 1), NEREID_ERROR_INTERNAL,
                NON("signed-integer"));
    int8_t i8[2];
    CHECK(!fill(NEREID_TYPE_INT8, "[-128,127]", i8, 2));
    CHECK(i8[0] == -128 && i8[1] == 127);
    CHECK_ERROR(fill(NEREID_TYPE_INT8, "[1,-129]", i8, 2), NEREID_ERROR_INVALID_ARG,
                "value -129 of input 'I' is out of range for datatype INT8 (-128 to 127)");
    CHECK_ERROR(fill(NEREID_TYPE_INT32, "[3000000000]", i64, 1), NEREID_ERROR_INVALID_ARG,
                "value 3000000000 of input 'I' is out of range for datatype INT32 "
                "(-2147483648 to 2147483647)");
    int16_t i16[1];
    CHECK(!fill(NEREID_TYPE_INT16, "[-32768]", i16, 1));
    CHECK(i16[0] == -32768);

    uint64_t u64[2];
    CHECK(!fill(NEREID_TYPE_UINT64, "[18446744073709551615,0]", u64, 2));
    CHECK(u64[0] == UINT64_MAX && u64[1] == 0);
    CHECK_ERROR(fill(NEREID_TYPE_UINT64, "[-1]", u64, 1), NEREID_ERROR_INTERNAL,
                NON("unsigned-integer"));
    CHECK_ERROR(fill(NEREID_TYPE_UINT64, "[18446744073709551616]", u64, 1), NEREID_ERROR_INTERNAL,
                NON("unsigned-integer"));
    uint8_t u8[2];
    CHECK_ERROR(fill(NEREID_TYPE_UINT8, "[300]", u8, 1), NEREID_ERROR_INVALID_ARG,
                "value 300 of input 'I' is out of range for datatype UINT8 (0 to 255)");
    CHECK(!fill(NEREID_TYPE_UINT8, "[255,0]", u8, 2));
    CHECK(u8[0] == 255 && u8[1] == 0);
    uint32_t u32[1];
    CHECK(!fill(NEREID_TYPE_UINT32, "[4294967295]", u32, 1));
    CHECK(u32[0] == UINT32_MAX);

    uint8_t b[2];
    CHECK(!fill(NEREID_TYPE_BOOL, "[true,false]", b, 2));
    CHECK(b[0] == 1 && b[1] == 0);
    CHECK_ERROR(fill(NEREID_TYPE_BOOL, "[1]", b, 1), NEREID_ERROR_INTERNAL, NON("boolean"));
}

/* json_reader_parse_infer with and without the one-pass conversion: the
 * same outcome (error text, or tensor bytes) for flat arrays of every type,
 * valid and not, and the conversion taken exactly for the valid ones. */
static bool one_pass_quiet;

static bool one_pass_case(const char *dt, const char *data, int64_t n, bool want_fast)
{
    char body[8192];
    snprintf(body, sizeof body,
             "{\"inputs\":[{\"name\":\"I\",\"datatype\":\"%s\",\"shape\":[%" PRId64
             "],\"data\":%s}]}",
             dt, n, data);
    size_t len = strlen(body);
    jarena_t a, b;
    jarena_init(&a);
    jarena_init(&b);
    jv_t *ra, *rb;
    nereid_error_t *ea = json_reader_parse_infer(body, len, &a, 1 << 20, &ra);
    nereid_error_t *eb = json_reader_parse(body, len, &b, &rb);
    bool ok = (ea == NULL) == (eb == NULL);
    if (ok && ea) ok = !strcmp(nereid_error_message(ea), nereid_error_message(eb));
    if (ok && !ea) {
        const jv_t *in = jv_get(jv_get(ra, "inputs")->v.child, "data");
        const jv_t *in_b = jv_get(jv_get(rb, "inputs")->v.child, "data");
        const jv_span_t *span = jv_span(in);
        ok = span && (span->data != NULL) == want_fast;
        nereid_datatype_t t = nereid_datatype_from_name(dt);
        size_t es = nereid_datatype_byte_size(t);
        static char slow[8192];
        if (ok && span->data) {
            ok = span->count == (size_t)n && span->datatype == t &&
                 !fill(t, in_b->v.s, slow, (size_t)n) && !memcmp(slow, span->data, (size_t)n * es);
        }
    }
    if (!ok && !one_pass_quiet) fprintf(stderr, "one pass differs: %s %s\n", dt, data);
    if (ea) nereid_error_free(ea);
    if (eb) nereid_error_free(eb);
    jarena_free(&a);
    jarena_free(&b);
    return ok;
}

/* Same outcome, with or without the one pass (either is right). */
static bool one_pass_same(const char *dt, const char *data, int64_t n)
{
    one_pass_quiet = true;
    bool ok = one_pass_case(dt, data, n, false) || one_pass_case(dt, data, n, true);
    one_pass_quiet = false;
    if (!ok) fprintf(stderr, "one pass differs: %s %s\n", dt, data);
    return ok;
}

static void test_one_pass(void)
{
    static const char *types[] = {"BOOL",   "INT8",   "INT16",  "INT32", "INT64", "UINT8",
                                  "UINT16", "UINT32", "UINT64", "FP32",  "FP64"};
    static const char *tokens[] = {"0",
                                   "-0",
                                   "1",
                                   "-1",
                                   "127",
                                   "-128",
                                   "255",
                                   "256",
                                   "32767",
                                   "-32768",
                                   "65535",
                                   "2147483647",
                                   "-2147483648",
                                   "4294967295",
                                   "9223372036854775807",
                                   "-9223372036854775808",
                                   "9223372036854775808",
                                   "18446744073709551615",
                                   "18446744073709551616",
                                   "123456789012345678",
                                   "0.5",
                                   "-0.0",
                                   "1e-7",
                                   "1E+2",
                                   "3.4028234663852886e38",
                                   "1e39",
                                   "1e309",
                                   "-1.8e308",
                                   "5e-324",
                                   "2.2250738585072014e-308",
                                   "0.10000000149011612",
                                   "123.456e-5",
                                   "0.000000000000000000000000001",
                                   "12345678901234567890123",
                                   "true",
                                   "false",
                                   "NaN",
                                   "-Infinity",
                                   "Inf",
                                   "null",
                                   "\"s\"",
                                   "[1]",
                                   "{}",
                                   "01",
                                   "1.",
                                   ".5",
                                   "-",
                                   "+1",
                                   "1e",
                                   "1e+",
                                   "--1",
                                   "0x1",
                                   "1.5.5",
                                   "tru",
                                   "truex",
                                   "1 2"};
    size_t nt = sizeof tokens / sizeof *tokens;
    int bad = 0;
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        for (size_t k = 0; k < nt; k++) {
            char data[256];
            /* Alone, and between two valid elements with spacing variants. */
            snprintf(data, sizeof data, "[%s]", tokens[k]);
            bad += !one_pass_same(types[t], data, 1);
            const char *ok = t == 0 ? "true" : "1";
            snprintf(data, sizeof data, "[ %s ,%s, %s\n]", ok, tokens[k], ok);
            bad += !one_pass_same(types[t], data, 3);
            bad += !one_pass_case(types[t], data, 2, false);
            bad += !one_pass_case(types[t], data, 4, false);
        }
        bad += !one_pass_case(types[t], "[]", 0, true);
        bad += !one_pass_case(types[t], "[ ]", 0, true);
        bad += !one_pass_case(types[t], "[[1]]", 1, false);
        bad += !one_pass_case(types[t], "[1,]", 1, false);
        bad += !one_pass_case(types[t], "[1", 1, false);
    }
    /* The valid ones took the one pass. */
    CHECK(one_pass_case("INT64", "[-9223372036854775808,9223372036854775807]", 2, true));
    CHECK(one_pass_case("UINT64", "[18446744073709551615,-0]", 2, true));
    /* Out of range: refused by the one pass, then by the slow path with a
     * text that names the input and the value (Triton would wrap them). */
    CHECK(one_pass_case("INT8", "[-129,300]", 2, false));
    CHECK(one_pass_case("FP32", "[0.1,-0.0,1e-7,3.4028234663852886e38,1e39]", 5, true));
    CHECK(one_pass_case("FP64", "[5e-324,123456789012345678,0.000000000000000000000000001]", 3,
                        true));
    CHECK(one_pass_case("BOOL", "[true, false]", 2, true));
    /* Not taken: NaN, a leading zero, too many digits for an integer. */
    CHECK(one_pass_case("FP32", "[NaN]", 1, false));
    CHECK(one_pass_case("INT32", "[1.0]", 1, false));
    CHECK(one_pass_case("UINT64", "[18446744073709551616]", 1, false));
    CHECK_MSG(bad == 0, "%d one-pass cases differ", bad);
}

int main(void)
{
    test_golden_doubles();
    test_random_doubles();
    test_every_exponent();
    test_random_floats();
    test_short_decimals();
    test_integers();
    test_fill();
    test_one_pass();
    return check_summary();
}
