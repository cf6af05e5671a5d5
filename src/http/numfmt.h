/*
 * This file declares the number text converters of the JSON tensor path:
 * shortest round-trip printing of doubles in Triton's (rapidjson's) layout,
 * integers through a digit-pair table, and exact parsing of JSON number text.
 * Doubles go through rapidjson (Triton's printer) and fast_float (numfmt.cc).
 */
#ifndef NEREID_HTTP_NUMFMT_H
#define NEREID_HTTP_NUMFMT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes a caller must have room for at o for one numfmt_double call (the
 * longest text is 25 bytes, e.g. "-0.0000012345678901234567"). */
#define NUMFMT_DOUBLE_ROOM 32

/* Writes v exactly as Triton's JSON writer does (rapidjson's Grisu2: at most
 * 17 digits that read back as v, usually the shortest, not always the
 * nearest; layout "12.0", "0.001", "1e-7", "1.5e30", "-0.0"), NaN as "NaN"
 * and infinities as "Infinity"/"-Infinity". Returns the end of the text. */
char *numfmt_double(char *o, double v);

/* numfmt_double without the short-decimal shortcut: rapidjson's dtoa as it
 * is (for tests that compare the two). */
char *numfmt_double_grisu(char *o, double v);

/* Writes v in decimal (at most 20 bytes). Returns the end of the text. */
char *numfmt_u64(char *o, uint64_t v);

/* Writes v in decimal (at most 20 bytes). Returns the end of the text. */
char *numfmt_i64(char *o, int64_t v);

/* Element types of numfmt_array. */
typedef enum numfmt_kind {
    NUMFMT_BOOL,
    NUMFMT_U8,
    NUMFMT_U16,
    NUMFMT_U32,
    NUMFMT_U64,
    NUMFMT_I8,
    NUMFMT_I16,
    NUMFMT_I32,
    NUMFMT_I64,
    NUMFMT_F32,
    NUMFMT_F64,
} numfmt_kind_t;

/* Bytes per element numfmt_array may write (the longest double text, 25
 * bytes, and its comma). */
#define NUMFMT_ARRAY_ROOM 26

/* Writes the n elements at data (any alignment) as JSON values separated by
 * commas, without brackets: one loop per kind, each number printed as
 * numfmt_double / numfmt_u64 / numfmt_i64 do (FP32 widened to double, as
 * Triton writes it), BOOL as true/false. o needs n * NUMFMT_ARRAY_ROOM
 * bytes. Returns the end of the text. */
char *numfmt_array(char *o, numfmt_kind_t kind, const void *data, size_t n);

/* Parses the JSON number text at s (< end) already checked by the grammar
 * (digits, fraction, exponent; no NaN/Infinity) into the nearest double.
 * Returns the end of the number, or NULL if the text is not a number. */
const char *numfmt_parse_double(const char *s, const char *end, double *out);

#ifdef __cplusplus
}
#endif

#endif
