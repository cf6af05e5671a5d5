/*
 * This file contains the progress watchdog (--model-progress-timeout-secs):
 * a thread that notices a model whose executions stopped returning, marks
 * it wedged (not ready, new requests refused) and asks the backend to end
 * the stuck executions where it can (a Python worker is restarted).
 */
#ifndef NEREID_WATCHDOG_H
#define NEREID_WATCHDOG_H

#include <stdio.h>

#include "core/core.h"

typedef struct watchdog watchdog_t;

/* Starts watching s's loaded models: a model is wedged when one of its
 * executions has run for more than timeout_secs and none of its instances
 * completed one in that time. NULL when timeout_secs is 0 (off) or the
 * thread cannot start. */
watchdog_t *watchdog_start(nereid_server_t *s, int timeout_secs);
/* Stops and joins the watchdog; NULL is fine. */
void watchdog_stop(watchdog_t *w);
/* Called by the instance that completed an execution of m while m was
 * marked wedged: clears the mark. */
void watchdog_progressed(model_t *m);
/* The refusal a wedged model gives a new request (UNAVAILABLE). */
nereid_error_t *watchdog_refusal(const model_t *m);

#endif
