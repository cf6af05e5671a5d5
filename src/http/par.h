/*
 * This file declares the helpers that convert one large JSON tensor on
 * several cores: a few threads, started with the HTTP server, each taking
 * one part of an array whose conversion its caller splits. A part goes to a
 * helper only when one is idle; otherwise the caller converts it itself, so
 * a busy server does the same work as without them and an idle core cuts
 * one request's latency. Arrays under PAR_MIN_ELEMENTS are never split.
 */
#ifndef NEREID_HTTP_PAR_H
#define NEREID_HTTP_PAR_H

#include <stddef.h>

#include "http/numfmt.h"
#include "http/numparse.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Arrays of fewer elements (BOOL: 8 times as many, a few ns each) are
 * converted by their caller alone (the fuzz build splits arrays of 2 and
 * more, so the fuzzers reach the parts). */
#ifndef PAR_MIN_ELEMENTS
#define PAR_MIN_ELEMENTS 16384
#endif

/* At most this many helper threads (parts per array: helpers + 1). */
#define PAR_MAX_HELPERS 3

/* Starts the helpers if none run: helpers of them, or with helpers < 0 one
 * fewer than the online CPUs (at most PAR_MAX_HELPERS). Calls nest: each
 * par_start is undone by one par_stop, and the last stops the threads.
 * Returns 0, or -1 when no thread could start (arrays are then converted
 * by their callers). Any thread. */
int par_start(int helpers);

/* Undoes one par_start; the last waits for the parts in progress and joins
 * the helpers. Any thread, never from a part. */
void par_stop(void);

/* Helper threads running now (0 when stopped). */
int par_helpers(void);

/* Parts the helpers have converted since the process started. */
unsigned long par_parts_helped(void);

/* numparse_array, the parts of a long array read at once by idle helpers:
 * same result, same return value. */
const char *par_numparse_array(numparse_kind_t kind, const char *p, const char *end, char *out,
                               size_t n);

/* numfmt_array, the parts of a long array written at once by idle helpers
 * (each into its own share of the room, then moved up behind the one
 * before): same text. o needs n * NUMFMT_ARRAY_ROOM bytes. */
char *par_numfmt_array(char *o, numfmt_kind_t kind, const void *data, size_t n);

#ifdef __cplusplus
}
#endif

#endif
