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

#endif
