/*
 * This file contains the number text converters declared in numfmt.h: a C
 * wrapper over rapidjson's double printer (Grisu2 and its layout, the very
 * code Triton's JSON writer runs, so the bytes are Triton's), fast_float's
 * exact parser, and integer printing with a digit-pair table.
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

} // namespace

/* rapidjson's Writer::WriteDouble with kWriteNanAndInfFlag, as Triton's
 * TritonJson writes: NaN (any sign), Infinity and -Infinity spelled out,
 * else internal::dtoa (at most 25 bytes). */
extern "C" char *numfmt_double(char *o, double v)
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
    char tmp[20], *e = tmp + sizeof tmp, *d = e;
    while (v >= 100) {
        unsigned r = (unsigned)(v % 100);
        v /= 100;
        d -= 2;
        std::memcpy(d, kPairs + 2 * r, 2);
    }
    if (v >= 10) {
        d -= 2;
        std::memcpy(d, kPairs + 2 * v, 2);
    } else {
        *--d = (char)('0' + v);
    }
    size_t n = (size_t)(e - d);
    std::memcpy(o, d, n);
    return o + n;
}

extern "C" char *numfmt_i64(char *o, int64_t v)
{
    if (v < 0) {
        *o++ = '-';
        return numfmt_u64(o, (uint64_t)0 - (uint64_t)v);
    }
    return numfmt_u64(o, (uint64_t)v);
}

extern "C" const char *numfmt_parse_double(const char *s, const char *end, double *out)
{
    fast_float::from_chars_result r = fast_float::from_chars(s, end, *out);
    if (r.ec != std::errc()) return nullptr;
    return r.ptr;
}
