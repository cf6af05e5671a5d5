/*
 * This file declares the one-scan number token readers of the JSON tensor
 * path: each checks the JSON number grammar and builds the value in the same
 * pass, eight digits at a time where eight bytes remain (fast_float's SWAR
 * primitives), and converts reals by Clinger's exact case or fast_float's
 * Eisel-Lemire step; only more than 19 significant digits or an ambiguous
 * Eisel-Lemire result take the full parse (numfmt_parse_double). Whole
 * "data" arrays are read by one loop per element type.
 */
#ifndef NEREID_HTTP_NUMPARSE_H
#define NEREID_HTTP_NUMPARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Reads the JSON number token at s (s <= end; never reads at or past end):
 * '-'? ('0' | [1-9][0-9]*) ('.' [0-9]+)? ([eE] [+-]? [0-9]+)?, into the
 * nearest double (the same value as strtod). Returns the end of the token,
 * or NULL when s does not start with such a token or its value overflows to
 * infinity. What follows the token is not checked ("01" reads as "0"). No
 * NaN/Infinity. */
const char *numparse_double(const char *s, const char *end, double *out);

/* Reads the JSON integer token at s: '-'? ('0' | [1-9][0-9]*) with a
 * magnitude of at most UINT64_MAX, into *neg and *mag. Returns the end of
 * the token, or NULL when s does not start with one, the magnitude
 * overflows, or the token goes on with a fraction or an exponent. What
 * follows otherwise is not checked ("01" reads as "0"). */
const char *numparse_integer(const char *s, const char *end, bool *neg, uint64_t *mag);

/* Element types of numparse_array. */
typedef enum numparse_kind {
    NUMPARSE_INT8,
    NUMPARSE_INT16,
    NUMPARSE_INT32,
    NUMPARSE_INT64,
    NUMPARSE_UINT8,
    NUMPARSE_UINT16,
    NUMPARSE_UINT32,
    NUMPARSE_UINT64,
    NUMPARSE_FP32,
    NUMPARSE_FP64,
    NUMPARSE_BOOL,
} numparse_kind_t;

/* Reads a flat JSON array of exactly n (>= 1) elements of kind whose first
 * element starts at p (after the '[' and any whitespace), up to and
 * including its ']', into out (n elements, little-endian, any alignment):
 * integers by numparse_integer within the type's range (INTn: [-2^(n-1),
 * 2^(n-1)-1]; UINTn: [0, 2^n-1], "-0" allowed; nothing wraps), reals by
 * numparse_double (FP32: that double rounded to float, as Triton does),
 * BOOL true/false as one byte 1/0. Returns the position after the ']', or
 * NULL for anything else (another count, another token, a value out of
 * range or overflowing). */
const char *numparse_array(numparse_kind_t kind, const char *p, const char *end, char *out,
                           size_t n);

/* numparse_array for one run of an array split in parts: the n elements
 * from p, followed by the closing bracket (close ']', the last part; returns
 * the position after it) or by a comma (close ',', any other part; returns
 * the position after the comma). */
const char *numparse_array_run(numparse_kind_t kind, const char *p, const char *end, char *out,
                               size_t n, char close);

/* The k-th (k >= 1) comma of [p, end), or NULL when there are fewer. */
const char *numparse_nth_comma(const char *p, const char *end, size_t k);

#ifdef __cplusplus
}
#endif

#endif
