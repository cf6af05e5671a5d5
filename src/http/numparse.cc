/*
 * This file contains the one-scan JSON number readers of the tensor path
 * (numparse.h). A token is checked and its significand accumulated in the
 * same pass, eight digits at a time with fast_float's SWAR primitives while
 * eight digits remain, then digit by digit. A real with at most 19
 * significant digits then takes Clinger's exact case (significand <= 2^53,
 * |exponent| <= 22: one correctly rounded operation) or fast_float's
 * Eisel-Lemire step (compute_float), which is exact unless it says it is not
 * (power2 < 0); those and longer significands go to numfmt_parse_double.
 * The array loops inline the readers, so a tensor costs no call per element.
 */
#include "http/numparse.h"

#include "http/numfmt.h"

#include <fast_float/fast_float.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define NUMPARSE_INLINE inline __attribute__((always_inline))

namespace
{

const double pow10_exact[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

NUMPARSE_INLINE bool is_digit(char c)
{
    return (unsigned char)(c - '0') <= 9;
}

/* Adds the digits at p to m (m = m * 10^k + their value, k digits, modulo
 * 2^64; with Checked, *overflow is set when the exact value does not fit).
 * Returns the first non-digit (or end). */
template <bool Checked>
NUMPARSE_INLINE const char *scan_digits(const char *p, const char *end, uint64_t &m, bool *overflow)
{
    while (end - p >= 8) {
        uint64_t v = fast_float::read_u64(p);
        if (__builtin_expect(!fast_float::is_made_of_eight_digits_fast(v), 1)) break;
        uint64_t x = fast_float::parse_eight_digits_unrolled(v);
        if (Checked) {
            if (__builtin_mul_overflow(m, 100000000, &m) || __builtin_add_overflow(m, x, &m))
                *overflow = true;
        } else {
            m = m * 100000000 + x;
        }
        p += 8;
    }
    for (; p < end && is_digit(*p); p++) {
        uint64_t d = (uint64_t)(*p - '0');
        if (Checked) {
            if (__builtin_mul_overflow(m, 10, &m) || __builtin_add_overflow(m, d, &m))
                *overflow = true;
        } else {
            m = m * 10 + d;
        }
    }
    return p;
}

/* The full parse of the token s[0..p): more than 19 significant digits, or
 * an Eisel-Lemire result too close to call. */
__attribute__((noinline, cold)) const char *slow_double(const char *s, const char *p, double *out)
{
    if (numfmt_parse_double(s, p, out) != p || std::isinf(*out)) return nullptr;
    return p;
}

/* The exponent part at p ('e' already seen at p[-1]) added to *e10. */
__attribute__((noinline)) const char *read_exponent(const char *p, const char *end, int64_t *e10)
{
    bool eneg = p < end && *p == '-';
    if (p < end && (*p == '-' || *p == '+')) p++;
    if (p >= end || !is_digit(*p)) return nullptr;
    int64_t x = 0;
    for (; p < end && is_digit(*p); p++)
        if (x < 100000) x = x * 10 + (*p - '0');
    *e10 += eneg ? -x : x;
    return p;
}

/* m * 10^e10 (m != 0, at most 19 digits) by Eisel-Lemire, or the slow
 * parse of s[0..p) when that cannot decide. */
__attribute__((noinline)) const char *eisel_lemire(const char *s, const char *p, bool neg,
                                                   uint64_t m, int64_t e10, double *out)
{
    using format = fast_float::binary_format<double>;
    fast_float::adjusted_mantissa am = fast_float::compute_float<format>(e10, m);
    if (am.power2 < 0) return slow_double(s, p, out);
    if (am.power2 == format::infinite_power()) return nullptr;
    fast_float::to_float(neg, am, *out);
    return p;
}

NUMPARSE_INLINE const char *read_double(const char *s, const char *end, double *out)
{
    const char *p = s;
    bool neg = p < end && *p == '-';
    p += neg;
    if (p >= end) return nullptr;
    uint64_t m = 0;
    int64_t n_digits = 0, e10 = 0; /* significant digits; the value is m * 10^e10 */
    if (*p == '0') {
        p++;
    } else if (is_digit(*p)) {
        const char *first = p;
        p = scan_digits<false>(p, end, m, nullptr);
        n_digits = p - first;
    } else {
        return nullptr;
    }
    if (p < end && *p == '.') {
        const char *first = ++p;
        if (m == 0) /* "0.00...": leading zeros are not significant */
            while (p < end && *p == '0')
                p++;
        const char *significant = p;
        p = scan_digits<false>(p, end, m, nullptr);
        if (p == first) return nullptr;
        n_digits += p - significant;
        e10 -= p - first;
    }
    if (p < end && (*p | 0x20) == 'e' && !(p = read_exponent(p + 1, end, &e10))) return nullptr;
    if (n_digits > 19) return slow_double(s, p, out);
    if (m <= (1ULL << 53) && e10 >= -22 && e10 <= 22) {
        double d = (double)(int64_t)m; /* m == 0 gives 0 for any e10 */
        d = e10 < 0 ? d / pow10_exact[-e10] : d * pow10_exact[e10];
        *out = neg ? -d : d;
        return p;
    }
    if (m == 0) {
        *out = neg ? -0.0 : 0.0;
        return p;
    }
    return eisel_lemire(s, p, neg, m, e10, out);
}

NUMPARSE_INLINE const char *read_integer(const char *s, const char *end, bool *neg, uint64_t *mag)
{
    const char *p = s;
    *neg = p < end && *p == '-';
    p += *neg;
    if (p >= end) return nullptr;
    uint64_t m = 0;
    if (*p == '0') {
        p++;
    } else if (is_digit(*p)) {
        bool overflow = false;
        p = scan_digits<true>(p, end, m, &overflow);
        if (overflow) return nullptr;
    } else {
        return nullptr;
    }
    if (p < end && (*p == '.' || (*p | 0x20) == 'e')) return nullptr;
    *mag = m;
    return p;
}

NUMPARSE_INLINE bool is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

NUMPARSE_INLINE const char *skip_ws(const char *p, const char *end)
{
    while (p < end && is_ws(*p))
        p++;
    return p;
}

/* ---- Tokens of known length ----------------------------------------------
 * Inside an array whose separators are known, a token's length is known
 * before it is read: a short plain decimal ('-'? digits ('.' digits)?, at
 * most 8 bytes) is then checked and converted from one load, with no loop
 * and no branch on its digits; longer tokens take the scanners above. */

/* Bytes a token start needs before the buffer's end for the loads below. */
const ptrdiff_t PLAIN_ROOM = 8;

/* Bit 7 of each byte of v that is not a digit; exact for every byte (no
 * carry crosses bytes, unlike is_made_of_eight_digits_fast's test). */
NUMPARSE_INLINE uint64_t non_digit_flags(uint64_t v)
{
    uint64_t x = v ^ 0x3030303030303030ULL; /* digits become 0..9 */
    return (((x & 0x7F7F7F7F7F7F7F7FULL) + 0x7676767676767676ULL) | x) & 0x8080808080808080ULL;
}

/* low_mask[k]: the low k (0..8) bytes of a word. */
const uint64_t low_mask[9] = {0,
                              0xFFULL,
                              0xFFFFULL,
                              0xFFFFFFULL,
                              0xFFFFFFFFULL,
                              0xFFFFFFFFFFULL,
                              0xFFFFFFFFFFFFULL,
                              0xFFFFFFFFFFFFFFULL,
                              ~0ULL};

/* The value of the first n (1..8) digit bytes of v: the run is moved to the
 * end of the eight, '0's in front of it, and converted by fast_float's SWAR
 * step. */
NUMPARSE_INLINE uint64_t run_value(uint64_t v, unsigned n)
{
    return fast_float::parse_eight_digits_unrolled(v << (8 * (8 - n)) |
                                                   (0x3030303030303030ULL & low_mask[8 - n]));
}

/* Whether s[0..len) (8 bytes readable from s) is a plain decimal of at
 * most 8 bytes: '-'? digits ('.' digits)?; then its sign, its digits as m
 * and the count of fraction digits. With !point, only integers qualify.
 * One load: the point is closed up and all digits converted at once. */
NUMPARSE_INLINE bool plain_decimal(const char *s, ptrdiff_t len, bool point, bool *neg, uint64_t *m,
                                   unsigned *frac)
{
    if (len > 8) return false;
    uint64_t w = fast_float::read_u64(s);
    *neg = (w & 0xFF) == '-';
    w >>= 8 * *neg;
    ptrdiff_t k = len - *neg, a = k, b = 0; /* digits and point; integer, fraction digits */
    uint64_t f = non_digit_flags(w) & low_mask[k];
    if (f) {
        a = __builtin_ctzll(f) >> 3, b = k - a - 1;
        if (!point || (f & (f - 1)) || ((w >> (8 * a)) & 0xFF) != '.' || b < 1) return false;
        w = (w & low_mask[a]) | ((w >> 8) & ~low_mask[a]);
    }
    if (a < 1 || (a > 1 && (w & 0xFF) == '0')) return false;
    *m = run_value(w, (unsigned)(a + b));
    *frac = (unsigned)b;
    return true;
}

/* Element readers: one token at p into v; NULL when it is not one or its
 * value is outside the element type's range (the caller's slow path names
 * it). exact: the token is exactly s[0..e), PLAIN_ROOM bytes readable from
 * s when room. T is the storage type; signed types are stored in the
 * unsigned type of their width. */
template <typename T> NUMPARSE_INLINE bool signed_in_range(bool neg, uint64_t m)
{
    return m <= (uint64_t)std::numeric_limits<std::make_signed_t<T>>::max() + neg;
}

template <typename T> NUMPARSE_INLINE bool unsigned_in_range(bool neg, uint64_t m)
{
    return !(neg && m) && m <= std::numeric_limits<T>::max();
}

template <typename T> struct read_signed {
    NUMPARSE_INLINE const char *operator()(const char *p, const char *end, T *v) const
    {
        bool neg;
        uint64_t m;
        p = read_integer(p, end, &neg, &m);
        if (!p || !signed_in_range<T>(neg, m)) return nullptr;
        *v = (T)(neg ? 0 - m : m); /* two's complement of a value in range */
        return p;
    }
    NUMPARSE_INLINE bool exact(const char *s, const char *e, bool room, T *v) const
    {
        bool neg;
        uint64_t m;
        unsigned frac;
        if (room && plain_decimal(s, e - s, false, &neg, &m, &frac) && signed_in_range<T>(neg, m)) {
            *v = (T)(neg ? 0 - m : m);
            return true;
        }
        return (*this)(s, e, v) == e;
    }
};

template <typename T> struct read_unsigned {
    NUMPARSE_INLINE const char *operator()(const char *p, const char *end, T *v) const
    {
        bool neg;
        uint64_t m;
        p = read_integer(p, end, &neg, &m);
        if (!p || !unsigned_in_range<T>(neg, m)) return nullptr;
        *v = (T)m;
        return p;
    }
    NUMPARSE_INLINE bool exact(const char *s, const char *e, bool room, T *v) const
    {
        bool neg;
        uint64_t m;
        unsigned frac;
        if (room && plain_decimal(s, e - s, false, &neg, &m, &frac) &&
            unsigned_in_range<T>(neg, m)) {
            *v = (T)m;
            return true;
        }
        return (*this)(s, e, v) == e;
    }
};

/* FP32 is parsed as a double and rounded, as Triton does. */
template <typename T> struct read_real {
    NUMPARSE_INLINE const char *operator()(const char *p, const char *end, T *v) const
    {
        double d;
        p = read_double(p, end, &d);
        if (p) *v = (T)d;
        return p;
    }
    NUMPARSE_INLINE bool exact(const char *s, const char *e, bool room, T *v) const
    {
        bool neg;
        uint64_t m;
        unsigned frac;
        if (room && plain_decimal(s, e - s, true, &neg, &m, &frac)) {
            /* At most 8 digits: Clinger's exact case. */
            double d = (double)(int64_t)m / pow10_exact[frac];
            *v = (T)(neg ? -d : d);
            return true;
        }
        return (*this)(s, e, v) == e;
    }
};

/* BOOL: true/false as 1/0; exact reads the word with no branch on which. */
struct read_bool {
    NUMPARSE_INLINE const char *operator()(const char *p, const char *end, uint8_t *v) const
    {
        if (end - p >= 4 && !memcmp(p, "true", 4)) {
            *v = 1;
            return p + 4;
        }
        if (end - p >= 5 && !memcmp(p, "false", 5)) {
            *v = 0;
            return p + 5;
        }
        return nullptr;
    }
    NUMPARSE_INLINE bool exact(const char *s, const char *e, bool room, uint8_t *v) const
    {
        if (room) {
            uint64_t w = fast_float::read_u64(s);
            bool t = (e - s == 4) & ((w & 0xFFFFFFFFULL) == 0x65757274ULL);     /* "true" */
            bool f = (e - s == 5) & ((w & 0xFFFFFFFFFFULL) == 0x65736C6166ULL); /* "false" */
            unsigned ok = t | f;
            __asm__("" : "+r"(ok)); /* one branch on both, not one on each */
            if (ok) {
                *v = t;
                return true;
            }
        }
        return (*this)(s, e, v) == e;
    }
};

/* Elements i.. of n separated by commas (whitespace allowed around them)
 * and the closing bracket (close ']') or the comma after the last one (close
 * ','), one after the other; anything else (a count other than n included)
 * fails. */
template <typename T, typename Read>
const char *array_serial(const char *p, const char *end, char *out, size_t i, size_t n, char close)
{
    Read read;
    for (;; i++) {
        T v;
        if (!(p = read(p, end, &v))) return nullptr;
        memcpy(out + i * sizeof v, &v, sizeof v);
        if (p < end && *p == ',') {
            p++;
        } else {
            p = skip_ws(p, end);
            if (p >= end) return nullptr;
            if (*p == ']') return i + 1 == n && close == ']' ? p + 1 : nullptr;
            if (*p != ',') return nullptr;
            p++;
        }
        if (i + 1 == n) return close == ',' ? p : nullptr;
        if (p < end && is_ws(*p)) p = skip_ws(p, end);
    }
}

#ifdef __SSE2__
/* One bit per byte of p[0..64) that is a ',' or a ']'. */
NUMPARSE_INLINE uint64_t separators64(const char *p)
{
    const __m128i comma = _mm_set1_epi8(','), close = _mm_set1_epi8(']');
    uint64_t bits = 0;
    for (int k = 0; k < 4; k++) {
        __m128i x = _mm_loadu_si128((const __m128i *)(p + 16 * k));
        __m128i hit = _mm_or_si128(_mm_cmpeq_epi8(x, comma), _mm_cmpeq_epi8(x, close));
        bits |= (uint64_t)(uint32_t)_mm_movemask_epi8(hit) << (16 * k);
    }
    return bits;
}
#endif

/* The n elements from p: where 64 bytes remain, the separators of the next
 * 64 are found at once and each token is read between its start and its
 * separator, so no token's reading waits for the one before it (the reads
 * overlap in the core) and short ones take plain_decimal; a token that is
 * not exactly one number (whitespace before its separator included), the
 * tail, and arrays whose first token is long go one after the other. */
template <typename T, typename Read>
const char *array_loop(const char *p, const char *end, char *out, size_t n, char close)
{
    size_t i = 0;
#ifdef __SSE2__
    Read read;
    while (end - p >= 64) {
        const char *block = p;
        uint64_t seps = separators64(block);
        /* An array that starts with a long token (17-digit reals, big
         * integers) is read serially: the scan would not pay for itself. */
        if (!seps || (i == 0 && __builtin_ctzll(seps) > 12)) break;
        do {
            const char *sep = block + __builtin_ctzll(seps);
            seps &= seps - 1;
            T v = 0;
            if (!read.exact(p, sep, end - p >= PLAIN_ROOM, &v))
                return array_serial<T, Read>(p, end, out, i, n, close);
            memcpy(out + i * sizeof v, &v, sizeof v);
            if (*sep == ']') return i + 1 == n && close == ']' ? sep + 1 : nullptr;
            if (++i == n) return close == ',' ? sep + 1 : nullptr;
            p = sep + 1;
            if (p < end && is_ws(*p)) p = skip_ws(p, end);
        } while (seps);
    }
#endif
    return array_serial<T, Read>(p, end, out, i, n, close);
}

} // namespace

extern "C" const char *numparse_double(const char *s, const char *end, double *out)
{
    return read_double(s, end, out);
}

extern "C" const char *numparse_integer(const char *s, const char *end, bool *neg, uint64_t *mag)
{
    return read_integer(s, end, neg, mag);
}

/* Reals, BOOL and 8/16-bit integers, mostly short tokens, take the separators
 * first; 32/64-bit integers, mostly longer than one load, are read one
 * after the other (measured: the separator pass cost them more than it
 * saved). */
extern "C" const char *numparse_array_run(numparse_kind_t kind, const char *p, const char *end,
                                          char *out, size_t n, char close)
{
    switch (kind) {
    case NUMPARSE_INT8:
        return array_loop<uint8_t, read_signed<uint8_t>>(p, end, out, n, close);
    case NUMPARSE_INT16:
        return array_loop<uint16_t, read_signed<uint16_t>>(p, end, out, n, close);
    case NUMPARSE_INT32:
        return array_serial<uint32_t, read_signed<uint32_t>>(p, end, out, 0, n, close);
    case NUMPARSE_INT64:
        return array_serial<uint64_t, read_signed<uint64_t>>(p, end, out, 0, n, close);
    case NUMPARSE_UINT8:
        return array_loop<uint8_t, read_unsigned<uint8_t>>(p, end, out, n, close);
    case NUMPARSE_UINT16:
        return array_loop<uint16_t, read_unsigned<uint16_t>>(p, end, out, n, close);
    case NUMPARSE_UINT32:
        return array_serial<uint32_t, read_unsigned<uint32_t>>(p, end, out, 0, n, close);
    case NUMPARSE_UINT64:
        return array_serial<uint64_t, read_unsigned<uint64_t>>(p, end, out, 0, n, close);
    case NUMPARSE_FP32:
        return array_loop<float, read_real<float>>(p, end, out, n, close);
    case NUMPARSE_FP64:
        return array_loop<double, read_real<double>>(p, end, out, n, close);
    case NUMPARSE_BOOL:
        return array_loop<uint8_t, read_bool>(p, end, out, n, close);
    }
    return nullptr;
}

extern "C" const char *numparse_array(numparse_kind_t kind, const char *p, const char *end,
                                      char *out, size_t n)
{
    return numparse_array_run(kind, p, end, out, n, ']');
}

extern "C" const char *numparse_nth_comma(const char *p, const char *end, size_t k)
{
    if (k == 0) return nullptr;
#ifdef __SSE2__
    /* The commas of 64 bytes are counted by summing the compare masks (no
     * popcount instruction in the baseline); the block holding the k-th is
     * then searched byte by byte. */
    const __m128i comma = _mm_set1_epi8(','), zero = _mm_setzero_si128();
    while (end - p >= 64) {
        __m128i sum = zero;
        for (int j = 0; j < 4; j++)
            sum = _mm_sub_epi8(
                sum, _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * j)), comma));
        __m128i sad = _mm_sad_epu8(sum, zero);
        size_t c = (size_t)_mm_cvtsi128_si32(sad) + (size_t)_mm_extract_epi16(sad, 4);
        if (c >= k) break;
        k -= c;
        p += 64;
    }
#endif
    for (; p < end; p++)
        if (*p == ',' && --k == 0) return p;
    return nullptr;
}
