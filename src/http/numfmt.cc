/*
 * This file contains the number text converters declared in numfmt.h:
 * doubles printed exactly as Triton's JSON writer prints them (rapidjson's
 * Grisu2 and its layout, the very code Triton runs), through an exact
 * shortcut for short decimals and a loop-free computation of Grisu2's own
 * digits, with rapidjson itself for the few values neither covers;
 * fast_float's exact parser; integer printing with a digit-pair table; and
 * the per-datatype loops that print a whole tensor.
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

/* Writes exactly f digits of v < 10^f ending at e (exclusive), with
 * leading zeros. */
inline void put_fixed(char *e, uint64_t v, int f)
{
    for (; f >= 8; f -= 8) {
        e -= 8;
        put8(e, (uint32_t)(v % 100000000));
        v /= 100000000;
    }
    uint32_t w = (uint32_t)v;
    for (; f >= 2; f -= 2) {
        e -= 2;
        std::memcpy(e, kPairs + 2 * (w % 100), 2);
        w /= 100;
    }
    if (f) e[-1] = (char)('0' + w);
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

typedef unsigned __int128 u128;

/* Division by 10^f (1 <= f <= 19) of any d < 2^60 as one multiplication:
 * with L = ceil(log2 10^f), m = ceil(2^(60+L) / 10^f) < 2^61 and
 * floor(d * m / 2^(60+L)) = floor(d / 10^f), since the error d * (m -
 * 2^(60+L) / 10^f) / 2^(60+L) stays below 2^-L <= 10^-f. */
struct Recip {
    uint64_t m[20];
    int shift[20];
    constexpr Recip() : m(), shift()
    {
        for (int f = 1; f < 20; f++) {
            int L = 0;
            while (((u128)1 << L) < kPow10[f])
                L++;
            u128 num = (u128)1 << (60 + L);
            m[f] = (uint64_t)((num + kPow10[f] - 1) / kPow10[f]);
            shift[f] = 60 + L;
        }
    }
};
constexpr Recip kRecip;

inline uint64_t div_pow10(uint64_t d, int f)
{
    return (uint64_t)(((u128)d * kRecip.m[f]) >> kRecip.shift[f]);
}

/* Writes the n digits of d (10^(n-1) <= d < 10^n, d < 2^60) times 10^k in
 * rapidjson's layout, as Prettify(buffer, n, k, 324) does, without moving
 * digits around: "12340000000.0", "12.34" (the two parts written in place),
 * "0.001234"; the exponent forms ("1e30", "1.234e-7") through Prettify
 * itself. Writes at most 25 bytes from o. Returns the end. */
inline char *put_layout(char *o, uint64_t d, int n, int k)
{
    int kk = n + k;           /* 10^(kk-1) <= value < 10^kk */
    if (k >= 0 && kk <= 21) { /* 1234e7 -> 12340000000.0 */
        put_digits(o + n, d);
        std::memset(o + n, '0', (size_t)k);
        std::memcpy(o + kk, ".0", 2);
        return o + kk + 2;
    }
    if (kk > 0 && kk <= 21) {                                     /* 1234e-2 -> 12.34 */
        uint64_t hi = div_pow10(d, -k), lo = d - hi * kPow10[-k]; /* -k < n */
        put_fixed(o + n + 1, lo, -k);
        put_digits(o + kk, hi);
        o[kk] = '.';
        return o + n + 1;
    }
    if (kk > -6 && kk <= 0) {          /* 1234e-6 -> 0.001234 */
        std::memcpy(o, "0.000000", 8); /* "0." and up to 5 zeros */
        put_digits(o + 2 - kk + n, d);
        return o + 2 - kk + n;
    }
    put_digits(o + n, d);
    return rapidjson::internal::Prettify(o, n, k, 324);
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
 * Writes D in rapidjson's layout and returns the end, or NULL when v is not
 * such a value. Checked against plain Grisu2 for every float (make
 * test-exhaustive) and random doubles (test_numfmt). */
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
    return put_layout(o, d, digit_count(d), k);
}

/* rapidjson's GetCachedPower(e, &K) picks cached power number
 * (ceil((-61 - e) * 0.30102999566398114 + 347) >> 3) + 1 (and K from it)
 * with double arithmetic; the same expression evaluated at compile time for
 * every exponent a boundary can have gives the same numbers by table. */
constexpr int kCachedIndexMinE = -1150, kCachedIndexMaxE = 980;
struct CachedIndex {
    uint8_t v[kCachedIndexMaxE - kCachedIndexMinE + 1];
    constexpr CachedIndex() : v()
    {
        for (int e = kCachedIndexMinE; e <= kCachedIndexMaxE; e++) {
            double dk = (-61 - e) * 0.30102999566398114 + 347;
            int k = static_cast<int>(dk);
            if (dk - k > 0.0) k++;
            v[e - kCachedIndexMinE] = (uint8_t)((k >> 3) + 1);
        }
    }
};
constexpr CachedIndex kCachedIndex;

/* rapidjson's Grisu2 (Grisu2 + DigitGen + GrisuRound in internal/dtoa.h),
 * computed without its digit-by-digit loop for the case that covers every
 * double but a few: the integral part p1 of the scaled upper bound Mp has
 * 1..9 digits and the generation stops in the fraction (p2 > delta, so no
 * integral step stops). The fraction step j stops at the first j with
 * (p2 * 10^j mod 2^s) < delta * 10^j; once true that stays true, and it is
 * true as soon as delta * 10^j >= 2^s, so j is found from delta's magnitude
 * with a check or two. The digits are then p1 * 10^j + floor(p2 * 10^j /
 * 2^s), GrisuRound's decrements are applied to that integer (the last digit
 * never drops below 0: a 0 there would have stopped the previous step), and
 * rapidjson's quirk is kept that from the ninth fraction digit on it does
 * not round (its power table has 9 entries). False when v needs the real
 * Grisu2. Checked against rapidjson for every float (make test-exhaustive)
 * and random doubles (test_numfmt). */
inline bool grisu2_fast(double v, uint64_t *digits, int *len, int *K)
{
    using rapidjson::internal::DiyFp;
    const DiyFp dv(v);
    DiyFp w_m, w_p;
    dv.NormalizedBoundaries(&w_m, &w_p);
    if (w_p.e < kCachedIndexMinE || w_p.e > kCachedIndexMaxE) return false;
    unsigned index = kCachedIndex.v[w_p.e - kCachedIndexMinE];
    *K = 348 - (int)(index << 3);
    const DiyFp c_mk = rapidjson::internal::GetCachedPowerByIndex(index);
    const DiyFp W = dv.Normalize() * c_mk;
    DiyFp Wp = w_p * c_mk, Wm = w_m * c_mk;
    Wm.f++;
    Wp.f--;
    uint64_t delta = Wp.f - Wm.f;
    int s = -Wp.e;
    if (s > 60 || s < 4 || delta < 256) return false;
    uint64_t one = 1ULL << s, mask = one - 1;
    uint64_t p1 = Wp.f >> s, p2 = Wp.f & mask;
    if (p1 == 0 || p1 >= 1000000000 || p2 <= delta) return false;
    /* jmax, the first j with delta * 10^j >= 2^s, is the estimate j0
     * (1233/4096 < log10 2: never above it) plus at most 2; below jmax,
     * delta * 10^j < 2^s, so those products do not wrap. The stop is at
     * jmax, jmax - 1 or (rarely) lower: the tests at j0 - 1, j0 and j0 + 1
     * are made side by side (each counts only below jmax, and at j >= 1)
     * and the lowest true one wins; below j0 - 1 a loop goes on. */
    int j0 = ((s - (63 - __builtin_clzll(delta)) - 1) * 1233) >> 12;
    if (j0 > 17) return false;
    uint64_t pm = j0 ? kPow10[j0 - 1] : 0, p0 = kPow10[j0], pp = kPow10[j0 + 1];
    int ca = delta * p0 < one, cb = delta * pp < one;
    int jmax = j0 + ca + (ca & cb);
    bool cm = ((p2 * pm) & mask) < delta * pm; /* false when pm is 0 (j0 = 0) */
    bool c0 = ((p2 * p0) & mask) < delta * p0;
    bool cp = ((p2 * pp) & mask) < delta * pp;
    int j = jmax;
    j = cp && j0 + 1 < jmax ? j0 + 1 : j;
    j = c0 && j0 < jmax && j0 >= 1 ? j0 : j;
    j = cm && j0 - 1 < jmax && j0 >= 2 ? j0 - 1 : j;
    if (j == j0 - 1)
        while (j > 1 && ((p2 * kPow10[j - 1]) & mask) < delta * kPow10[j - 1])
            j--;
    uint64_t rest = (p2 * kPow10[j]) & mask, dj = delta * kPow10[j];
    uint64_t d = p1 * kPow10[j] + (uint64_t)(((u128)p2 * kPow10[j]) >> s);
    uint64_t wp_w = (Wp.f - W.f) * (j < 9 ? kPow10[j] : 0);
    while (rest < wp_w && dj - rest >= one &&
           (rest + one < wp_w || wp_w - rest > rest + one - wp_w)) {
        d--;
        rest += one;
    }
    *digits = d;
    *len = digit_count(p1) + j;
    *K -= j;
    return true;
}

/* rapidjson's Writer::WriteDouble with kWriteNanAndInfFlag, as Triton's
 * TritonJson writes: NaN (any sign), Infinity and -Infinity spelled out,
 * else internal::dtoa's text (at most 25 bytes): short decimals directly,
 * nearly all others through grisu2_fast, the rest through rapidjson. */
inline char *put_double(char *o, double v)
{
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    if ((bits & 0x7FF0000000000000ULL) == 0x7FF0000000000000ULL) {
        if (bits & 0x000FFFFFFFFFFFFFULL) return std::memcpy(o, "NaN", 3), o + 3;
        if (bits >> 63) return std::memcpy(o, "-Infinity", 9), o + 9;
        return std::memcpy(o, "Infinity", 8), o + 8;
    }
    *o = '-';
    o += bits >> 63;
    if (!(bits << 1)) {
        std::memcpy(o, "0.0", 3);
        return o + 3;
    }
    double a = v < 0 ? -v : v;
    if (char *e = short_decimal(a, o)) return e;
    uint64_t d;
    int length, K;
    if (grisu2_fast(a, &d, &length, &K)) return put_layout(o, d, length, K);
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
    case NUMFMT_BOOL: {
        /* 8 bytes stored either way (room is 26), "false," or "true," picked
         * by index: no branch (-O3 makes one of a select, mispredicted on
         * random data). */
        uint64_t words[2];
        std::memcpy(&words[0], "false,\0\0", 8);
        std::memcpy(&words[1], "true,\0\0\0", 8);
        for (size_t i = 0; i < n; i++) {
            unsigned b = p[i] != 0;
            std::memcpy(o, &words[b], 8);
            o += 6 - b;
        }
        return n ? o - 1 : o;
    }
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
