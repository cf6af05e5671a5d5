/*
 * This file contains the number text converters declared in numfmt.h: a C
 * wrapper over rapidjson's double printer (Grisu2 and its layout, the very
 * code Triton's JSON writer runs, so the bytes are Triton's) with an exact
 * shortcut for short decimals, fast_float's exact parser, integer printing
 * with a digit-pair table, and the per-datatype loops that print a whole
 * tensor.
 */
#include "http/numfmt.h"

#include <fast_float/fast_float.h>
#include <rapidjson/internal/dtoa.h>

#include <cstring>

namespace
{

const char kPairs[] = "00010203040506070809101112131415161718192021222324252627282930"
                      "31323334353637383940414243444546474849505152535455565758596061"
                      "62636465666768697071727374757677787980818283848586878889909192"
                      "93949596979899";

constexpr uint64_t kPow10[20] = {1ULL,
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
                                 100000000000000000ULL,
                                 1000000000000000000ULL,
                                 10000000000000000000ULL};

/* Decimal digits of v (v < 10^20). */
inline int digit_count(uint64_t v)
{
    int n = ((64 - __builtin_clzll(v | 1)) * 1233) >> 12; /* floor(log10(2^bits)) */
    return n + (v >= kPow10[n]);
}

/* Writes exactly 8 digits of v < 10^8 at o (two independent halves). */
inline void put8(char *o, uint32_t v)
{
    uint32_t a = v / 10000, b = v % 10000;
    std::memcpy(o, kPairs + 2 * (a / 100), 2);
    std::memcpy(o + 2, kPairs + 2 * (a % 100), 2);
    std::memcpy(o + 4, kPairs + 2 * (b / 100), 2);
    std::memcpy(o + 6, kPairs + 2 * (b % 100), 2);
}

/* Writes the decimal digits of v ending at e (exclusive): 8 at a time while
 * more than 8 remain, then in pairs with 32-bit arithmetic. */
inline void put_digits(char *e, uint64_t v)
{
    while (v >= 100000000) {
        e -= 8;
        put8(e, (uint32_t)(v % 100000000));
        v /= 100000000;
    }
    uint32_t w = (uint32_t)v;
    while (w >= 100) {
        unsigned r = w % 100;
        w /= 100;
        e -= 2;
        std::memcpy(e, kPairs + 2 * r, 2);
    }
    if (w >= 10)
        std::memcpy(e - 2, kPairs + 2 * w, 2);
    else
        e[-1] = (char)('0' + w);
}

inline char *put_u64(char *o, uint64_t v)
{
    if (v < 10) {
        *o = (char)('0' + v);
        return o + 1;
    }
    int n = digit_count(v);
    put_digits(o + n, v);
    return o + n;
}

inline char *put_i64(char *o, int64_t v)
{
    if (v < 0) {
        *o++ = '-';
        return put_u64(o, (uint64_t)0 - (uint64_t)v);
    }
    return put_u64(o, (uint64_t)v);
}

/* 5^j and the bound on f for f * 5^j < 10^15, j <= 21 (5^22 > 10^15). */
constexpr uint64_t kPow5[22] = {1ULL,
                                5ULL,
                                25ULL,
                                125ULL,
                                625ULL,
                                3125ULL,
                                15625ULL,
                                78125ULL,
                                390625ULL,
                                1953125ULL,
                                9765625ULL,
                                48828125ULL,
                                244140625ULL,
                                1220703125ULL,
                                6103515625ULL,
                                30517578125ULL,
                                152587890625ULL,
                                762939453125ULL,
                                3814697265625ULL,
                                19073486328125ULL,
                                95367431640625ULL,
                                476837158203125ULL};
struct Pow5Bounds {
    uint64_t v[22];
    constexpr Pow5Bounds() : v()
    {
        for (int j = 0; j < 22; j++)
            v[j] = 1000000000000000ULL / kPow5[j];
    }
};
constexpr Pow5Bounds kPow5Bound;

/* Short decimals without Grisu2. A positive finite v = f * 2^e (f odd) whose
 * exact decimal value D has at most 15 significant digits is what Grisu2
 * prints: D is inside Grisu2's (narrowed) rounding interval, whose width is
 * at most 2^-52 v, while any decimal with fewer digits is at least 10^-15 v
 * away from D, so the digit generation stops exactly at D's last digit, and
 * GrisuRound cannot move it (one unit of that digit exceeds the interval).
 * Writes D in rapidjson's layout (Prettify's, for the plain forms; the
 * exponent forms go through Prettify itself) and returns the end, or NULL
 * when v is not such a value. Checked against plain Grisu2 for every float
 * (make test-exhaustive) and random doubles (test_numfmt). */
inline char *short_decimal(double v, char *o)
{
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    int be = (int)(bits >> 52);
    if (be == 0) return nullptr; /* subnormal: never short */
    uint64_t f = (bits & 0x000FFFFFFFFFFFFFULL) | 1ULL << 52;
    int e = be - 1075;
    int tz = __builtin_ctzll(f);
    f >>= tz;
    e += tz;
    uint64_t d;
    int k = 0;
    if (e >= 0) {
        if (e > 49 || f >= (1000000000000000ULL >> e)) return nullptr;
        d = f << e;
        while (d % 10 == 0) {
            d /= 10;
            k++;
        }
    } else {
        if (e < -21 || f >= kPow5Bound.v[-e]) return nullptr;
        d = f * kPow5[-e]; /* odd: no trailing zero */
        k = e;
    }
    int n = digit_count(d), kk = n + k;
    if (k >= 0 && kk <= 21) { /* 1234e7 -> 12340000000.0 */
        put_digits(o + n, d);
        std::memset(o + n, '0', (size_t)k);
        std::memcpy(o + kk, ".0", 2);
        return o + kk + 2;
    }
    if (kk > 0 && kk <= 21) {                              /* 1234e-2 -> 12.34 */
        uint64_t hi = d / kPow10[-k], lo = d % kPow10[-k]; /* -k < n <= 15 */
        std::memset(o + kk + 1, '0', (size_t)-k);          /* lo's leading zeros */
        put_digits(o + n + 1, lo);
        put_digits(o + kk, hi);
        o[kk] = '.';
        return o + n + 1;
    }
    if (kk > -6 && kk <= 0) { /* 1234e-6 -> 0.001234 */
        std::memcpy(o, "0.", 2);
        std::memset(o + 2, '0', (size_t)-kk);
        put_digits(o + 2 - kk + n, d);
        return o + 2 - kk + n;
    }
    put_digits(o + n, d);
    return rapidjson::internal::Prettify(o, n, k, 324);
}

/* rapidjson's Writer::WriteDouble with kWriteNanAndInfFlag, as Triton's
 * TritonJson writes: NaN (any sign), Infinity and -Infinity spelled out,
 * else internal::dtoa (at most 25 bytes), short decimals without Grisu2. */
inline char *put_double(char *o, double v)
{
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    if ((bits & 0x7FF0000000000000ULL) == 0x7FF0000000000000ULL) {
        if (bits & 0x000FFFFFFFFFFFFFULL) return std::memcpy(o, "NaN", 3), o + 3;
        if (bits >> 63) return std::memcpy(o, "-Infinity", 9), o + 9;
        return std::memcpy(o, "Infinity", 8), o + 8;
    }
    if (bits >> 63) *o++ = '-';
    if (!(bits << 1)) {
        std::memcpy(o, "0.0", 3);
        return o + 3;
    }
    double a = v < 0 ? -v : v;
    if (char *e = short_decimal(a, o)) return e;
    int length, K;
    rapidjson::internal::Grisu2(a, o, &length, &K);
    return rapidjson::internal::Prettify(o, length, K, 324);
}

template <typename T, typename W> char *put_array(char *o, const char *p, size_t n, W write)
{
    for (size_t i = 0; i < n; i++) {
        T v;
        std::memcpy(&v, p + i * sizeof v, sizeof v);
        o = write(o, v);
        *o++ = ',';
    }
    return n ? o - 1 : o;
}

} // namespace

extern "C" char *numfmt_double(char *o, double v)
{
    return put_double(o, v);
}

extern "C" char *numfmt_double_grisu(char *o, double v)
{
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    if ((bits & 0x7FF0000000000000ULL) == 0x7FF0000000000000ULL) {
        if (bits & 0x000FFFFFFFFFFFFFULL) return std::memcpy(o, "NaN", 3), o + 3;
        if (bits >> 63) return std::memcpy(o, "-Infinity", 9), o + 9;
        return std::memcpy(o, "Infinity", 8), o + 8;
    }
    return rapidjson::internal::dtoa(v, o);
}

extern "C" char *numfmt_u64(char *o, uint64_t v)
{
    return put_u64(o, v);
}

extern "C" char *numfmt_i64(char *o, int64_t v)
{
    return put_i64(o, v);
}

extern "C" char *numfmt_array(char *o, numfmt_kind_t kind, const void *data, size_t n)
{
    const char *p = static_cast<const char *>(data);
    switch (kind) {
    case NUMFMT_BOOL:
        for (size_t i = 0; i < n; i++) {
            if (p[i]) {
                std::memcpy(o, "true,", 5);
                o += 5;
            } else {
                std::memcpy(o, "false,", 6);
                o += 6;
            }
        }
        return n ? o - 1 : o;
    case NUMFMT_U8:
        return put_array<uint8_t>(o, p, n, put_u64);
    case NUMFMT_U16:
        return put_array<uint16_t>(o, p, n, put_u64);
    case NUMFMT_U32:
        return put_array<uint32_t>(o, p, n, put_u64);
    case NUMFMT_U64:
        return put_array<uint64_t>(o, p, n, put_u64);
    case NUMFMT_I8:
        return put_array<int8_t>(o, p, n, put_i64);
    case NUMFMT_I16:
        return put_array<int16_t>(o, p, n, put_i64);
    case NUMFMT_I32:
        return put_array<int32_t>(o, p, n, put_i64);
    case NUMFMT_I64:
        return put_array<int64_t>(o, p, n, put_i64);
    case NUMFMT_F32: /* widened to double first, as Triton writes FP32 */
        return put_array<float>(o, p, n, [](char *q, float v) { return put_double(q, (double)v); });
    case NUMFMT_F64:
        return put_array<double>(o, p, n, put_double);
    }
    return o;
}

extern "C" const char *numfmt_parse_double(const char *s, const char *end, double *out)
{
    fast_float::from_chars_result r = fast_float::from_chars(s, end, *out);
    if (r.ec != std::errc()) return nullptr;
    return r.ptr;
}
