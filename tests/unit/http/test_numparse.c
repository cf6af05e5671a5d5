/*
 * This file contains the unit tests of the one-scan JSON number readers
 * (src/http/numparse.cc) against the C library: millions of doubles (random
 * bit patterns over every exponent, printed with "%.17g" and in their
 * shortest round-trip form; FP32 values widened; short decimals) must read
 * as strtod reads them, bit for bit and to the same end; integers over the
 * whole 64-bit range and beyond must read as exact arithmetic says; edge
 * cases at the subnormal and overflow boundaries, at 19/20/25 significant
 * digits and the JSON grammar's rejections. Every token is read twice: at
 * the very end of its malloc'ed buffer (so ASan sees any read past end, and
 * fewer than 8 bytes remain) and followed by more text.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "http/numparse.h"

static uint64_t rng = 0x2545F4914F6CDD1DULL;

/* xorshift64*: deterministic across runs. */
static uint64_t next_random(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ULL;
}

static uint64_t bits_of(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

/* The token at the end of a buffer of exactly its length, and in a buffer
 * where ",1]" and 37 spaces follow it. */
#define ROOM 1024
static char *tail_buf, *pad_buf;

static const char *at_tail(const char *t, size_t n)
{
    memcpy(tail_buf + ROOM - n, t, n);
    return tail_buf + ROOM - n;
}

static const char *padded(const char *t, size_t n)
{
    memcpy(pad_buf, t, n);
    memset(pad_buf + n, ' ', 40);
    memcpy(pad_buf + n, ",1]", 3);
    return pad_buf;
}

static long n_double_checks;

/* text (a valid JSON number) reads as strtod reads it, in both placements;
 * an infinite value is refused. */
static void check_double(const char *text)
{
    size_t n = strlen(text);
    char *endp;
    errno = 0;
    double want = strtod(text, &endp);
    int bad = 0;
    for (int where = 0; where < 2; where++) {
        const char *s = where ? padded(text, n) : at_tail(text, n);
        const char *end = where ? pad_buf + ROOM : tail_buf + ROOM;
        double got = 0;
        const char *after = numparse_double(s, end, &got);
        if (isinf(want)) {
            if (after) bad = 1;
        } else if (!after || after != s + (endp - text) || bits_of(got) != bits_of(want)) {
            bad = 1;
        }
        if (bad) {
            CHECK_MSG(0, "\"%s\" (%s): got %.17g end %td, want %.17g end %td", text,
                      where ? "padded" : "at end", got, after ? after - s : -1, want, endp - text);
            return;
        }
    }
    /* The same token as a one-element array, with and without room after
     * it (the array loops read tokens of known length their own way). */
    for (int where = 0; where < 2; where++) {
        char *b = where ? pad_buf : tail_buf + ROOM - (n + 1);
        memcpy(b, text, n);
        b[n] = ']';
        if (where) memset(b + n + 1, ' ', 40);
        const char *end = where ? b + n + 41 : tail_buf + ROOM;
        double d = 0;
        float f = 0;
        const char *after = numparse_array(NUMPARSE_FP64, b, end, (char *)&d, 1);
        const char *after32 = numparse_array(NUMPARSE_FP32, b, end, (char *)&f, 1);
        if (isinf(want) ? after || after32
                        : after != b + n + 1 || bits_of(d) != bits_of(want) ||
                              after32 != b + n + 1 || memcmp(&f, &(float){(float)want}, 4)) {
            CHECK_MSG(0, "[%s] (%s): got %.17g, want %.17g", text, where ? "padded" : "at end", d,
                      want);
            return;
        }
    }
    n_double_checks++;
    if (n_double_checks % 65536 == 0) CHECK(1);
}

/* text is refused (NULL) or read only up to stop bytes (-1: refused). */
static void check_double_stop(const char *text, long stop)
{
    size_t n = strlen(text);
    for (int where = 0; where < 2; where++) {
        const char *s = where ? padded(text, n) : at_tail(text, n);
        const char *end = where ? pad_buf + ROOM : tail_buf + ROOM;
        double got;
        const char *after = numparse_double(s, end, &got);
        long at = after ? (long)(after - s) : -1;
        CHECK_MSG(at == stop, "\"%s\" (%s): stopped at %ld, want %ld", text,
                  where ? "padded" : "at end", at, stop);
        /* As a one-element array, any of these is refused ("1 " aside). */
        if (n && text[n - 1] == ' ') continue;
        char *b = where ? pad_buf : tail_buf + ROOM - (n + 1);
        memcpy(b, text, n);
        b[n] = ']';
        if (where) memset(b + n + 1, ' ', 40);
        double d;
        CHECK_MSG(
            !numparse_array(NUMPARSE_FP64, b, where ? b + n + 41 : tail_buf + ROOM, (char *)&d, 1),
            "[%s] accepted", text);
    }
}

/* The shortest of %.15g, %.16g, %.17g that reads back as d. */
static void shortest(char *buf, size_t size, double d)
{
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, size, "%.*g", prec, d);
        if (strtod(buf, NULL) == d) return;
    }
}

static double random_finite(void)
{
    for (;;) {
        uint64_t u = next_random();
        double d;
        memcpy(&d, &u, 8);
        if (isfinite(d)) return d;
    }
}

static void test_random_doubles(void)
{
    char buf[64];
    for (int i = 0; i < 600000; i++) {
        double d = random_finite();
        snprintf(buf, sizeof buf, "%.17g", d);
        check_double(buf);
        shortest(buf, sizeof buf, d);
        check_double(buf);
    }
    /* FP32 values widened, as Triton prints them, in the range the benchmark
     * sends and over the whole float range. */
    for (int i = 0; i < 400000; i++) {
        uint64_t r = next_random();
        double u = (double)(r >> 11) * 0x1p-53 * 2 - 1;
        snprintf(buf, sizeof buf, "%.17g", (double)(float)(u * 1000));
        check_double(buf);
        uint32_t fb = (uint32_t)(r >> 7);
        float f;
        memcpy(&f, &fb, 4);
        if (!isfinite(f)) continue;
        snprintf(buf, sizeof buf, "%.17g", (double)f);
        check_double(buf);
        snprintf(buf, sizeof buf, "%.9g", (double)f);
        check_double(buf);
    }
    /* Short decimals: 1..19 random digits, as an integer, with a decimal
     * point somewhere, after "0." and zeros, with or without an exponent. */
    for (int i = 0; i < 600000; i++) {
        uint64_t r = next_random();
        char digits[24];
        int nd = 1 + (int)(r % 19);
        for (int k = 0; k < nd; k++)
            digits[k] = (char)('0' + next_random() % 10);
        if (nd > 1 && digits[0] == '0') digits[0] = '7';
        digits[nd] = '\0';
        const char *sign = (r >> 8) & 1 ? "-" : "";
        int mode = (int)((r >> 9) % 3), ip = 1 + (int)((r >> 12) % (uint64_t)nd);
        int len;
        if (mode == 0)
            len = snprintf(buf, sizeof buf, "%s%s", sign, digits);
        else if (mode == 1 && ip < nd && digits[0] != '0')
            len = snprintf(buf, sizeof buf, "%s%.*s.%s", sign, ip, digits, digits + ip);
        else
            len = snprintf(buf, sizeof buf, "%s0.%.*s%s", sign, (int)((r >> 20) % 12),
                           "000000000000", digits);
        if ((r >> 24) & 1)
            snprintf(buf + len, sizeof buf - (size_t)len, "%s%d", (r >> 25) & 1 ? "e" : "E",
                     (int)((r >> 26) % 61) - 30);
        check_double(buf);
    }
    for (int k = 0; k < 1024 * 8; k++) {
        snprintf(buf, sizeof buf, "%g", (double)(k % 1024) / 8);
        check_double(buf);
    }
    CHECK_MSG(n_double_checks > 3000000, "%ld doubles", n_double_checks);
}

static void test_double_edges(void)
{
    static const char *ok[] = {
        "0",
        "-0",
        "0.0",
        "-0.0",
        "0.0e5",
        "0e-999999999",
        "-0e99999999",
        "0.000",
        "1E+2",
        "1e+2",
        "1e2",
        "1E2",
        "1.5E-3",
        "123.456e-7",
        "5",
        "-5",
        "127.875",
        /* 19 / 20 / 25 significant digits */
        "1234567890123456789",
        "12345678901234567890",
        "1234567890123456789012345",
        "9999999999999999999",
        "99999999999999999999",
        "18446744073709551615",
        "18446744073709551616",
        "0.1234567890123456789",
        "0.12345678901234567890",
        "1.234567890123456789012345",
        "1234567890123456789.5",
        "0.000000000000000000000000000012345678901234567890123",
        "1.0000000000000000000000000000000000000000000000000001",
        /* 2^53 and its neighbours, halfway cases */
        "9007199254740992",
        "9007199254740993",
        "9007199254740994",
        "9007199254740995",
        "9007199254740993.0000000000000001",
        "4503599627370496.5",
        "4503599627370497.5",
        "0.1000000000000000055511151231257827",
        "0.1000000000000000055511151231257828",
        /* Clinger bounds */
        "1e22",
        "1e23",
        "1e-22",
        "1e-23",
        "9007199254740992e22",
        "9007199254740993e-22",
        /* subnormals and the underflow boundary */
        "4.9406564584124654e-324",
        "2.4703282292062327e-324",
        "2.4703282292062328e-324",
        "2.4703282292062327208828439643411068618252990130716238221279284125033775364e-324",
        "1e-324",
        "3e-324",
        "1e-400",
        "-1e-400",
        "2.2250738585072011e-308",
        "2.2250738585072014e-308",
        "2.2250738585072012e-308",
        "4.9e-324",
        "5e-324",
        "1.5e-323",
        /* the overflow boundary */
        "1.7976931348623157e308",
        "1.7976931348623158e308",
        "1.7976931348623158079e308",
        "1.7976931348623159e308",
        "1e308",
        "1e309",
        "-1e309",
        "1e99999",
        "-1e99999999",
        "179769313486231580793728971405303415079934132710037826936173778980444968292764750946"
        "6490000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "0",
        "0.00000000000000000000000000000000000000000000000000000000000000000000000001",
        "100000000000000000000000",
        "1e0",
        "1e-0",
        "1e+0",
        "1e00000000000000000000000001",
        "7.038531e-26",
        "3.4028234663852886e38",
        "3.4028235677973366e38",
        "1.401298464324817e-45",
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        check_double(ok[i]);
    /* The grammar: refusals, and tokens that end early (what follows is
     * the caller's to refuse). */
    check_double_stop("", -1);
    check_double_stop("-", -1);
    check_double_stop("+1", -1);
    check_double_stop("--1", -1);
    check_double_stop("-+1", -1);
    check_double_stop(".5", -1);
    check_double_stop("-.5", -1);
    check_double_stop("1.", -1);
    check_double_stop("1.e5", -1);
    check_double_stop("1e", -1);
    check_double_stop("1e+", -1);
    check_double_stop("1e-", -1);
    check_double_stop("1E", -1);
    check_double_stop("NaN", -1);
    check_double_stop("Infinity", -1);
    check_double_stop("-Infinity", -1);
    check_double_stop("inf", -1);
    check_double_stop("\"1\"", -1);
    check_double_stop(" 1", -1);
    check_double_stop("01", 1);
    check_double_stop("-01", 2);
    check_double_stop("00.5", 1);
    check_double_stop("0x1", 1);
    check_double_stop("1e5.5", 3);
    check_double_stop("1.5.5", 3);
    check_double_stop("12a", 2);
    check_double_stop("1 ", 1);
    check_double_stop("123456789012345678901234567890x", 30);
}

/* text reads as sign and magnitude want (ok), or is refused. */
static void check_integer(const char *text, int ok, int want_neg, uint64_t want)
{
    size_t n = strlen(text);
    for (int where = 0; where < 2; where++) {
        const char *s = where ? padded(text, n) : at_tail(text, n);
        const char *end = where ? pad_buf + ROOM : tail_buf + ROOM;
        bool neg = false;
        uint64_t mag = 0;
        const char *after = numparse_integer(s, end, &neg, &mag);
        int good = ok ? after == s + n && neg == want_neg && mag == want : !after;
        char *b = where ? pad_buf : tail_buf + ROOM - (n + 1);
        memcpy(b, text, n);
        b[n] = ']';
        if (where) memset(b + n + 1, ' ', 40);
        const char *aend = where ? b + n + 41 : tail_buf + ROOM;
        uint64_t u = 0;
        const char *au = numparse_array(NUMPARSE_UINT64, b, aend, (char *)&u, 1);
        int64_t i64 = 0;
        const char *ai = numparse_array(NUMPARSE_INT64, b, aend, (char *)&i64, 1);
        if (ok && !(want_neg && want))
            good = good && au == b + n + 1 && u == want;
        else
            good = good && !au;
        if (ok && want <= (uint64_t)INT64_MAX + want_neg)
            good = good && ai == b + n + 1 && (uint64_t)i64 == (want_neg ? 0 - want : want);
        else
            good = good && !ai;
        if (!good) {
            CHECK_MSG(0, "\"%s\" (%s): got %s%" PRIu64 " end %td, want %s", text,
                      where ? "padded" : "at end", neg ? "-" : "", mag, after ? after - s : -1,
                      ok ? "a value" : "refusal");
            return;
        }
    }
    CHECK(1);
}

static void test_integers(void)
{
    char buf[64];
    for (int i = 0; i < 400000; i++) {
        uint64_t r = next_random(), v = next_random() >> (r % 64);
        int neg = (r >> 8) & 1;
        snprintf(buf, sizeof buf, "%s%" PRIu64, neg ? "-" : "", v);
        check_integer(buf, 1, neg, v);
    }
    /* 20 to 25 digits, mostly on UINT64_MAX's leading digits so both sides
     * of it are hit: exact arithmetic decides. */
    const char *max = "18446744073709551615";
    for (int i = 0; i < 100000; i++) {
        uint64_t r = next_random();
        int len = 20 + (int)(r % 6);
        for (int k = 0; k < len; k++) {
            uint64_t q = next_random();
            buf[k] = k < 20 && q % 4 ? max[k] : (char)('0' + q % 10);
        }
        if (buf[0] == '0') buf[0] = '1';
        buf[len] = '\0';
        unsigned __int128 x = 0;
        for (int k = 0; k < len; k++)
            x = x * 10 + (unsigned)(buf[k] - '0');
        check_integer(buf, x <= UINT64_MAX, 0, (uint64_t)x);
    }
    check_integer("0", 1, 0, 0);
    check_integer("-0", 1, 1, 0);
    check_integer("9223372036854775807", 1, 0, INT64_MAX);
    check_integer("-9223372036854775808", 1, 1, (uint64_t)INT64_MAX + 1);
    check_integer("18446744073709551615", 1, 0, UINT64_MAX);
    check_integer("-18446744073709551615", 1, 1, UINT64_MAX);
    check_integer("18446744073709551616", 0, 0, 0);
    check_integer("18446744073709551620", 0, 0, 0);
    check_integer("99999999999999999999", 0, 0, 0);
    check_integer("100000000000000000000", 0, 0, 0);
    check_integer("1234567890123456789012345", 0, 0, 0);
    check_integer("12345678", 1, 0, 12345678);
    check_integer("1234567", 1, 0, 1234567);
    check_integer("123456789", 1, 0, 123456789);
    check_integer("1.0", 0, 0, 0);
    check_integer("1.5", 0, 0, 0);
    check_integer("1e2", 0, 0, 0);
    check_integer("1E2", 0, 0, 0);
    check_integer("0.0", 0, 0, 0);
    check_integer("0e0", 0, 0, 0);
    check_integer("", 0, 0, 0);
    check_integer("-", 0, 0, 0);
    check_integer("+1", 0, 0, 0);
    check_integer("--1", 0, 0, 0);
    check_integer("a", 0, 0, 0);
    check_integer("NaN", 0, 0, 0);
    /* "01" reads as "0": the caller refuses what follows. */
    bool neg;
    uint64_t mag;
    const char *t = at_tail("01", 2);
    CHECK(numparse_integer(t, t + 2, &neg, &mag) == t + 1 && mag == 0);
    t = at_tail("0x1", 3);
    CHECK(numparse_integer(t, t + 3, &neg, &mag) == t + 1 && mag == 0);
}

/* numparse_array over text (the "data" value after '[' and whitespace):
 * returns the bytes consumed or -1, the elements in out. */
static long array(numparse_kind_t kind, const char *text, size_t n, void *out)
{
    size_t len = strlen(text);
    char *b = malloc(len ? len : 1);
    memcpy(b, text, len);
    const char *after = numparse_array(kind, b, b + len, out, n);
    long r = after ? (long)(after - b) : -1;
    free(b);
    return r;
}

static void test_arrays(void)
{
    double d[4];
    float f[4];
    int64_t i64[4];
    uint64_t u64[4];
    int8_t i8[4];
    uint16_t u16[4];
    CHECK(array(NUMPARSE_FP64, "1.5,-2,3e2]", 3, d) == 11 && d[0] == 1.5 && d[1] == -2 &&
          d[2] == 300);
    CHECK(array(NUMPARSE_FP64, "1.5 , -2 ,\n\t3e2 \r]", 3, d) == 18 && d[2] == 300);
    CHECK(array(NUMPARSE_FP64, "1.5,-2,3e2]", 2, d) == -1);
    CHECK(array(NUMPARSE_FP64, "1.5,-2,3e2]", 4, d) == -1);
    CHECK(array(NUMPARSE_FP64, "1.5,-2,3e2", 3, d) == -1);
    CHECK(array(NUMPARSE_FP64, "1.5,-2,3e2 ", 3, d) == -1);
    CHECK(array(NUMPARSE_FP64, "1.5,,3]", 3, d) == -1);
    CHECK(array(NUMPARSE_FP64, "1.5,01]", 2, d) == -1);
    CHECK(array(NUMPARSE_FP64, "1.5 2]", 2, d) == -1);
    CHECK(array(NUMPARSE_FP64, "1.5,NaN]", 2, d) == -1);
    CHECK(array(NUMPARSE_FP64, "1e309]", 1, d) == -1);
    CHECK(array(NUMPARSE_FP64, "1.5,0x1]", 2, d) == -1);
    CHECK(array(NUMPARSE_FP64, "1.5,]", 2, d) == -1);
    CHECK(array(NUMPARSE_FP64, "1.5,2],", 2, d) == 6);
    /* FP32: the double rounded to float (double rounding, as Triton). */
    CHECK(array(NUMPARSE_FP32, "0.1,1.00000005960464477539062500001]", 2, f) == 36 &&
          f[0] == 0.1f && f[1] == 1.0f);
    CHECK(array(NUMPARSE_INT64, "-9223372036854775808,9223372036854775807,0,-0]", 4, i64) == 46 &&
          i64[0] == INT64_MIN && i64[1] == INT64_MAX && i64[2] == 0 && i64[3] == 0);
    CHECK(array(NUMPARSE_INT64, "9223372036854775808]", 1, i64) == -1);
    CHECK(array(NUMPARSE_INT64, "-9223372036854775809]", 1, i64) == -1);
    CHECK(array(NUMPARSE_INT64, "1.0]", 1, i64) == -1);
    CHECK(array(NUMPARSE_UINT64, "18446744073709551615,-0]", 2, u64) == 24 &&
          u64[0] == UINT64_MAX && u64[1] == 0);
    CHECK(array(NUMPARSE_UINT64, "18446744073709551616]", 1, u64) == -1);
    CHECK(array(NUMPARSE_UINT64, "-1]", 1, u64) == -1);
    CHECK(array(NUMPARSE_INT8, "-128,127,-1]", 3, i8) == 12 && i8[0] == -128 && i8[1] == 127 &&
          i8[2] == -1);
    CHECK(array(NUMPARSE_UINT16, "65535,7]", 2, u16) == 8 && u16[0] == 65535 && u16[1] == 7);
    /* Out of the type's range: refused, never wrapped (the slow path names
     * the value); on both the block scan (long arrays) and the serial read. */
    CHECK(array(NUMPARSE_INT8, "128]", 1, i8) == -1);
    CHECK(array(NUMPARSE_INT8, "-129]", 1, i8) == -1);
    CHECK(array(NUMPARSE_UINT16, "65536]", 1, u16) == -1);
    CHECK(array(NUMPARSE_UINT16, "-1]", 1, u16) == -1);
    uint8_t u8[40];
    uint32_t u32[4];
    int32_t i32[4];
    CHECK(array(NUMPARSE_UINT8, "255,0]", 2, u8) == 6 && u8[0] == 255);
    CHECK(array(NUMPARSE_UINT8, "300]", 1, u8) == -1);
    CHECK(array(NUMPARSE_UINT8,
                "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,300,"
                "24,25,26,27,28,29,30]",
                30, u8) == -1);
    CHECK(array(NUMPARSE_INT32, "2147483647,-2147483648]", 2, i32) == 23 && i32[0] == INT32_MAX &&
          i32[1] == INT32_MIN);
    CHECK(array(NUMPARSE_INT32, "3000000000]", 1, i32) == -1);
    CHECK(array(NUMPARSE_INT32, "-2147483649]", 1, i32) == -1);
    CHECK(array(NUMPARSE_UINT32, "4294967295]", 1, u32) == 11 && u32[0] == UINT32_MAX);
    CHECK(array(NUMPARSE_UINT32, "4294967296]", 1, u32) == -1);
}

/* A random valid number token for kind into buf. */
static void random_token(char *buf, size_t size, numparse_kind_t kind)
{
    uint64_t r = next_random();
    if (kind == NUMPARSE_FP32 || kind == NUMPARSE_FP64) {
        double u = (double)(next_random() >> 11) * 0x1p-53 * 2 - 1;
        switch (r % 6) {
        case 5:
            snprintf(buf, size, "%" PRIu64 "e%d", next_random() >> (r >> 8) % 64,
                     (int)(r >> 16) % 40 - 20);
            break;
        case 0:
            snprintf(buf, size, "%.17g", (double)(float)(u * 1000));
            break;
        case 1:
            snprintf(buf, size, "%g", (double)(r >> 8 & 1023) / 8);
            break;
        case 2:
            snprintf(buf, size, "%.17g", random_finite());
            break;
        case 3:
            snprintf(buf, size, "%.*g", 1 + (int)(r >> 8) % 17, u * 1e6);
            break;
        default:
            snprintf(buf, size, "%" PRId64, (int64_t)next_random() >> (r >> 8) % 64);
        }
        return;
    }
    if (kind == NUMPARSE_BOOL) {
        snprintf(buf, size, "%s", r & 1 ? "true" : "false");
        return;
    }
    uint64_t v = next_random() >> (r >> 8) % 64;
    if (kind == NUMPARSE_INT8 || kind == NUMPARSE_UINT16) {
        /* Mostly in range, rarely any 64-bit value (then refused). */
        if ((r >> 20) % 256) v &= kind == NUMPARSE_INT8 ? 0x7F : 0xFFFF;
        snprintf(buf, size, "%s%" PRIu64, kind == NUMPARSE_INT8 && (r >> 24) & 1 ? "-" : "",
                 v >> 1);
        return;
    }
    if (kind == NUMPARSE_INT64)
        snprintf(buf, size, "%s%" PRIu64, (r >> 20) & 1 ? "-" : "", v >> 1);
    else
        snprintf(buf, size, "%" PRIu64, v);
}

static const char *const separators[] = {",", ", ", " ,", " , ", ",\n  ", "\t,\r\n"};
static const char *const bad_bools[] = {"tru",      "True", "1",         "falsey", "nul",
                                        "\"true\"", "fals", "truefalse", "",       "true false"};
static const char *const bad_tokens[] = {"1.", "01",  "NaN", "1e",    "--1",  "",    "-",
                                         ".5", "1e+", "0x1", "1.5.5", "true", "1 2", "\"1\""};

/* Random arrays of up to 200 elements, every separator JSON allows, checked
 * element by element against numparse_double / numparse_integer on each
 * token (BOOL: true/false); with a bad token or a wrong count somewhere,
 * refused. */
static void test_random_arrays(void)
{
    static const numparse_kind_t kinds[] = {NUMPARSE_FP64,   NUMPARSE_FP32, NUMPARSE_INT64,
                                            NUMPARSE_UINT64, NUMPARSE_INT8, NUMPARSE_UINT16,
                                            NUMPARSE_BOOL};
    static const size_t sizes[] = {8, 4, 8, 8, 1, 2, 1};
    size_t cap = 200 * 48 + 64;
    char *text = malloc(cap), tok[64];
    double *want_d = malloc(200 * sizeof *want_d);
    uint64_t *want_u = malloc(200 * sizeof *want_u);
    int n_ok = 0, n_refused = 0;
    for (int iter = 0; iter < 20000; iter++) {
        uint64_t r = next_random();
        numparse_kind_t kind = kinds[r % 7];
        size_t es = sizes[r % 7];
        size_t n = 1 + (r >> 2) % 200, len = 0;
        int one_sep = (r >> 10) & 1; /* one separator style for the whole array */
        const char *sep0 = separators[(r >> 11) % 6];
        long bad_at = (r >> 14) % 4 == 0 ? (long)((r >> 16) % n) : -1;
        int out_of_range = 0;
        size_t count = n + ((r >> 30) % 8 == 0 ? 1 : 0) - ((r >> 30) % 8 == 1 && n > 1 ? 1 : 0);
        for (size_t i = 0; i < count; i++) {
            if (i) {
                const char *sep = one_sep ? sep0 : separators[next_random() % 6];
                len += (size_t)snprintf(text + len, cap - len, "%s", sep);
            }
            if ((long)i == bad_at && kind == NUMPARSE_BOOL)
                snprintf(tok, sizeof tok, "%s", bad_bools[next_random() % 10]);
            else if ((long)i == bad_at)
                snprintf(tok, sizeof tok, "%s", bad_tokens[next_random() % 14]);
            else
                random_token(tok, sizeof tok, kind);
            if (i < n) {
                if (kind == NUMPARSE_BOOL) {
                    want_u[i] = !strcmp(tok, "true");
                } else if (kind != NUMPARSE_FP64 && kind != NUMPARSE_FP32) {
                    bool neg;
                    uint64_t mag = 0;
                    numparse_integer(tok, tok + strlen(tok), &neg, &mag);
                    want_u[i] = neg ? 0 - mag : mag;
                    if (kind == NUMPARSE_INT8 && mag > 127u + neg) out_of_range = 1;
                    if (kind == NUMPARSE_UINT16 && mag > 65535) out_of_range = 1;
                } else {
                    want_d[i] = strtod(tok, NULL);
                }
            }
            len += (size_t)snprintf(text + len, cap - len, "%s", tok);
        }
        len += (size_t)snprintf(text + len, cap - len, "%s]", (r >> 40) & 1 ? " " : "");
        size_t close = len;
        if ((r >> 41) & 1) len += (size_t)snprintf(text + len, cap - len, "}]}%40s", "");
        char *b = malloc(len); /* exact size: ASan sees a read past the end */
        memcpy(b, text, len);
        char *out = malloc(n * 8); /* exact size too */
        const char *after = numparse_array(kind, b, b + len, out, n);
        int valid = bad_at < 0 && count == n && !out_of_range;
        if (!valid) {
            CHECK_MSG(after == NULL, "kind %d n %zu: accepted \"%.*s\"", (int)kind, n, (int)close,
                      text);
            n_refused++;
        } else {
            int same = after == b + close;
            for (size_t i = 0; same && i < n; i++) {
                if (kind == NUMPARSE_FP64)
                    same = bits_of(((double *)out)[i]) == bits_of(want_d[i]);
                else if (kind == NUMPARSE_FP32)
                    same = !memcmp(out + 4 * i, &(float){(float)want_d[i]}, 4);
                else
                    same = !memcmp(out + es * i, &want_u[i], es);
            }
            CHECK_MSG(same, "kind %d n %zu: \"%.*s\" read wrong", (int)kind, n, (int)close, text);
            n_ok++;
        }
        free(b);
        free(out);
    }
    CHECK_MSG(n_ok > 9000 && n_refused > 3000, "%d read, %d refused", n_ok, n_refused);
    free(text);
    free(want_d);
    free(want_u);
}

int main(void)
{
    tail_buf = malloc(ROOM);
    pad_buf = malloc(ROOM);
    test_double_edges();
    test_integers();
    test_arrays();
    test_random_arrays();
    test_random_doubles();
    free(tail_buf);
    free(pad_buf);
    return check_summary();
}
