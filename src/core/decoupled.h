/*
 * This file contains the core's decoupled-response hooks (decoupled.c): the
 * few places where request finishing and batch statistics must know that a
 * backend took a request's response sender.
 */
#ifndef NEREID_DECOUPLED_H
#define NEREID_DECOUPLED_H

#include <stdbool.h>

#include "core/core.h"

/* request_finish calls this first. When a backend took req's sender, the
 * scheduler's finish after execute only releases the request to the sender
 * (which finishes it at its final flag, maybe right now): returns true and
 * frees err. Otherwise returns false and changes nothing. */
bool decoupled_release(nereid_request_t *req, nereid_error_t *err);
/* True when a backend took req's sender (its responses are counted by the
 * sender, not by the batch). */
bool decoupled_has_sender(const nereid_request_t *req);
/* True when req's final goes to its client as the final flag alone. */
bool decoupled_flags_only(const nereid_request_t *req);
/* Observes req's first response for the time-to-first-response histogram
 * (once per request; later calls do nothing). */
void request_first_response(nereid_request_t *req);
/* The model's config says model_transaction_policy { decoupled: true }. */
bool model_is_decoupled(const model_t *m);

#endif
