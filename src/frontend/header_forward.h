/*
 * This file contains Triton's header forwarding, shared by the HTTP and gRPC
 * frontends (--http-header-forward-pattern, --grpc-header-forward-pattern):
 * an RE2 pattern, matched case-insensitively anywhere in a header name, picks
 * the headers (gRPC: metadata) that become string parameters of an inference
 * request, under the header's name as received and with its value.
 */
#ifndef NEREID_HEADER_FORWARD_H
#define NEREID_HEADER_FORWARD_H

#include <stdbool.h>
#include <stddef.h>

#include "nereid/server.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct header_forward header_forward_t;

/* Compiles "(?i)" + pattern with RE2, as Triton does. On a pattern RE2
 * refuses, NULL and *error (caller frees) says why. */
header_forward_t *header_forward_new(const char *pattern, char **error);

/* Whether the pattern matches somewhere in name[0..len) (RE2::PartialMatch). */
bool header_forward_match(const header_forward_t *hf, const char *name, size_t len);

/* Forwards one matching header into req: Triton's INVALID_ARG "Header
 * '<name>' is reserved for Triton usage and cannot be forwarded." for a
 * reserved parameter name (sequence_id, sequence_start, sequence_end,
 * priority, timeout, headers, binary_data_output, or a triton_ prefix),
 * else the string parameter (replacing a body parameter of that name). */
nereid_error_t *header_forward_apply(nereid_request_t *req, const char *name, size_t name_len,
                                     const char *value, size_t value_len);

void header_forward_free(header_forward_t *hf);

#ifdef __cplusplus
}
#endif

#endif
