/*
 * This file contains the response cache (Triton's "local" cache): whole
 * responses of models with `response_cache { enable: true }`, keyed by the
 * request's model, version, inputs and requested outputs, evicted least
 * recently used within a byte budget. The core calls cache_lookup once per
 * submitted request before the scheduler; a miss arranges the insertion
 * when the response completes.
 */
#ifndef NEREID_CACHE_H
#define NEREID_CACHE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/core.h"

typedef struct response_cache response_cache_t;

/* Creates the cache implementation name (only "local") from its settings,
 * a JSON object such as {"size":"1048576"}. Triton's error texts. */
nereid_error_t *cache_create(const char *name, const char *config_json, response_cache_t **out);
/* Frees the cache and every entry (no request may be in flight). */
void cache_destroy(response_cache_t *c);

/* True when requests to m go through the server's cache: the server has
 * one and m's config enables it. */
bool cache_enabled(const model_t *m);

/* For a validated request whose response slots are prepared (submit): on a
 * hit fills the response from the cache (or sets its error), records the
 * statistics and returns true; the caller then finishes the request with
 * request_finish(req, NULL, ...) and does not schedule it. On a miss returns false
 * and arranges that a successful response is inserted when it completes;
 * if the request is then not submitted after all, call cache_forget.
 * Does nothing (false) for models without the cache. */
bool cache_lookup(nereid_request_t *req);
/* Undoes a miss's arrangement for a request whose submission failed. */
void cache_forget(nereid_request_t *req);

/* Triton's cache metric families (nv_cache_*) for the server's cache. */
void cache_metrics_text(FILE *out, response_cache_t *c);

/* Counters for tests and benchmarks. */
typedef struct cache_counters {
    uint64_t entries, used_bytes, size, lookups, hits, misses, evictions;
} cache_counters_t;
void cache_read_counters(response_cache_t *c, cache_counters_t *out);

#endif
