/*
 * This file contains the sequence batcher's interface (sequence_batching in
 * config.pbtxt): requests are routed by correlation id to a batch slot
 * (direct strategy) or to a candidate sequence of one instance (oldest
 * strategy); the scheduler injects the control tensors the model asks for
 * and keeps each sequence's implicit state between requests.
 */
#ifndef NEREID_SEQUENCE_H
#define NEREID_SEQUENCE_H

#include "sched/scheduler.h"

/* Creates the sequence batcher for m (m->config->sequence_batching is set).
 * Errors: an unreadable or mis-sized initial_state data_file. */
nereid_error_t *sequence_batcher_create(model_t *m, scheduler_t **out);

/* Makes a warmup request acceptable to the sequence batcher: a one-request
 * sequence (START and END) with a correlation id of the model's CORRID
 * type. No-op for models without sequence batching. */
void sequence_batcher_prepare_warmup(const model_t *m, nereid_request_t *req);

#endif
