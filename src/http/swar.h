/*
 * This file contains the eight-bytes-at-a-time test shared by the JSON
 * string reader and writer: which bytes of a 64-bit word (first byte in the
 * lowest bits, as x86-64 and arm64 load it) a JSON string cannot hold as
 * they are.
 */
#ifndef NEREID_HTTP_SWAR_H
#define NEREID_HTTP_SWAR_H

#include <stdint.h>

/* The high bit of each byte of x that is '"', '\\' or below 0x20 (bytes
 * from 0x80 up are not marked). Per byte, the high bit of x - 0x20 & ~x
 * marks < 0x20, and of (x ^ c) - 1 & ~(x ^ c) a byte equal to c. A borrow
 * can mark a byte above a real mark, never below one, so the lowest mark is
 * exact: use __builtin_ctzll(m) >> 3 of a nonzero result, nothing more. */
static inline uint64_t swar_json_specials(uint64_t x)
{
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    uint64_t xq = x ^ (ones * '"'), xb = x ^ (ones * '\\');
    return (((x - ones * 0x20) & ~x) | ((xq - ones) & ~xq) | ((xb - ones) & ~xb)) & highs;
}

#endif
