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

/* Element readers: one token at p into v; NULL when it is not one. */
template <typename T> struct read_signed {
    NUMPARSE_INLINE const char *operator()(const char *p, const char *end, T *v) const
    {
        bool neg;
        uint64_t m;
        p = read_integer(p, end, &neg, &m);
        if (!p || m > (uint64_t)INT64_MAX + neg) return nullptr;
        *v = (T)(neg ? 0 - m : m); /* two's complement; the low bits are kept */
        return p;
    }
};

template <typename T> struct read_unsigned {
    NUMPARSE_INLINE const char *operator()(const char *p, const char *end, T *v) const
    {
        bool neg;
        uint64_t m;
        p = read_integer(p, end, &neg, &m);
        if (!p || (neg && m)) return nullptr;
        *v = (T)m;
        return p;
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
};

/* n elements separated by commas (whitespace allowed around them) and the
 * closing bracket; anything else (a count other than n included) fails. */
template <typename T, typename Read>
const char *array_loop(const char *p, const char *end, char *out, size_t n)
{
    Read read;
    for (size_t i = 0;; i++) {
        T v;
        if (!(p = read(p, end, &v))) return nullptr;
        memcpy(out + i * sizeof v, &v, sizeof v);
        if (p < end && *p == ',') {
            p++;
        } else {
            p = skip_ws(p, end);
            if (p >= end) return nullptr;
            if (*p == ']') return i + 1 == n ? p + 1 : nullptr;
            if (*p != ',') return nullptr;
            p++;
        }
        if (i + 1 == n) return nullptr;
        if (p < end && is_ws(*p)) p = skip_ws(p, end);
    }
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

extern "C" const char *numparse_array(numparse_kind_t kind, const char *p, const char *end,
                                      char *out, size_t n)
{
    switch (kind) {
    case NUMPARSE_INT8:
        return array_loop<uint8_t, read_signed<uint8_t>>(p, end, out, n);
    case NUMPARSE_INT16:
        return array_loop<uint16_t, read_signed<uint16_t>>(p, end, out, n);
    case NUMPARSE_INT32:
        return array_loop<uint32_t, read_signed<uint32_t>>(p, end, out, n);
    case NUMPARSE_INT64:
        return array_loop<uint64_t, read_signed<uint64_t>>(p, end, out, n);
    case NUMPARSE_UINT8:
        return array_loop<uint8_t, read_unsigned<uint8_t>>(p, end, out, n);
    case NUMPARSE_UINT16:
        return array_loop<uint16_t, read_unsigned<uint16_t>>(p, end, out, n);
    case NUMPARSE_UINT32:
        return array_loop<uint32_t, read_unsigned<uint32_t>>(p, end, out, n);
    case NUMPARSE_UINT64:
        return array_loop<uint64_t, read_unsigned<uint64_t>>(p, end, out, n);
    case NUMPARSE_FP32:
        return array_loop<float, read_real<float>>(p, end, out, n);
    case NUMPARSE_FP64:
        return array_loop<double, read_real<double>>(p, end, out, n);
    }
    return nullptr;
}
