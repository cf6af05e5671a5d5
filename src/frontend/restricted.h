/*
 * This file contains Triton's restricted API groups, shared by the HTTP and
 * gRPC frontends: parsing --http-restricted-api / --grpc-restricted-protocol
 * values ("<group>[,<group>...]:<key>=<value>") with Triton's rules and
 * error texts, and the header (or metadata) pair a restricted group needs.
 */
#ifndef NEREID_RESTRICTED_H
#define NEREID_RESTRICTED_H

#include <stdbool.h>

/* X(enum, Triton's group name), in Triton's order. */
#define RESTRICTED_GROUP_MAP(X)                                                                    \
    X(HEALTH, "health")                                                                            \
    X(METADATA, "metadata")                                                                        \
    X(INFERENCE, "inference")                                                                      \
    X(SHARED_MEMORY, "shared-memory")                                                              \
    X(MODEL_CONFIG, "model-config")                                                                \
    X(MODEL_REPOSITORY, "model-repository")                                                        \
    X(STATISTICS, "statistics")                                                                    \
    X(TRACE, "trace")                                                                              \
    X(LOGGING, "logging")

typedef enum restricted_group {
#define X(e, name) RESTRICTED_##e,
    RESTRICTED_GROUP_MAP(X)
#undef X
        RESTRICTED_N,
    RESTRICTED_NONE = -1 /* a route or RPC outside every group */
} restricted_group_t;

/* Per group, the header that must be present with exactly this value; a
 * NULL header leaves the group open. Strings are owned (restricted_free). */
typedef struct restricted_apis {
    char *header[RESTRICTED_N];
    char *value[RESTRICTED_N];
} restricted_apis_t;

/* Adds one flag value to r. option_name is the flag without "--" (for the
 * format error), key_prefix goes before the key ("" for HTTP,
 * "triton-grpc-protocol-" for gRPC), feature_type is "api" or "protocol".
 * Returns NULL, or Triton's error text (caller frees); a group may appear
 * in one flag only. */
char *restricted_parse(restricted_apis_t *r, const char *arg, const char *option_name,
                       const char *key_prefix, const char *feature_type);

/* The header group g needs, or NULL when g is open (r may be NULL). */
const char *restricted_header(const restricted_apis_t *r, restricted_group_t g);

/* Whether a request whose header holds value (NULL: absent) may use g. */
bool restricted_allows(const restricted_apis_t *r, restricted_group_t g, const char *value);

/* Frees the strings; r itself is the caller's. */
void restricted_free(restricted_apis_t *r);

#endif
