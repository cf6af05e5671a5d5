/*
 * This file contains the queue of requests waiting for an on-demand load
 * (--model-load-on-demand=true): the frontend thread that received such a
 * request hands it here and goes back to its other clients; a few loader
 * threads (--model-load-thread-count, started when first needed) load the
 * model (repository_load_on_demand: one load however many requests wait)
 * and submit the request, or complete it with the load's error.
 */
#ifndef NEREID_ON_DEMAND_H
#define NEREID_ON_DEMAND_H

#include <stdbool.h>

#include "nereid/server.h"

/* Takes req if the model it names is in a repository and this thread is
 * not itself loading a model on demand: true when taken (its completion
 * then comes through done_fn, a load error too), false when the caller
 * keeps it. allocator is copied. Any thread. */
bool on_demand_defer(nereid_server_t *s, nereid_request_t *req,
                     const nereid_response_allocator_t *allocator, nereid_complete_fn done_fn,
                     void *done_userp);
/* Joins the loader threads; requests still queued complete with
 * UNAVAILABLE "Server not ready". Once, at server stop, after s->stopping
 * is set. */
void on_demand_stop(nereid_server_t *s);
/* Frees the queue, after on_demand_stop, when no thread uses the server. */
void on_demand_free(nereid_server_t *s);

#endif
