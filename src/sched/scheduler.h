/*
 * This file contains the scheduler interface. A model's config picks one
 * scheduler (default, dynamic batcher, sequence batcher, ensemble). Requests
 * enter with enqueue; each model instance's execution thread pulls batches
 * with next_batch, executes them, then calls batch_done (or, when the
 * scheduler has none, the core finishes every request of the batch).
 */
#ifndef NEREID_SCHEDULER_H
#define NEREID_SCHEDULER_H

#include "core/core.h"

typedef struct scheduler scheduler_t;

typedef struct scheduler_ops {
    const char *name;
    /* Takes ownership of req on success (NULL return); on error the caller
     * keeps req. Thread: any (frontend threads). */
    nereid_error_t *(*enqueue)(scheduler_t *s, nereid_request_t *req);
    /* Blocks until a batch for inst is ready and fills batch (batch_add).
     * Returns false when the scheduler is stopped and has nothing left for
     * inst. Thread: inst's execution thread. NULL for schedulers that run
     * no instances (ensemble). */
    bool (*next_batch)(scheduler_t *s, model_instance_t *inst, batch_t *batch);
    /* Optional: returns an idle instance claimed for req to run on the
     * caller's thread (scheduler_run_inline), or NULL to enqueue instead.
     * Thread: any; takes no lock the caller may hold. */
    model_instance_t *(*claim)(scheduler_t *s, nereid_request_t *req);
    /* With claim: when take_next and a request is queued, dequeues and
     * returns it, inst staying claimed; otherwise gives inst back to its
     * thread and returns NULL. */
    nereid_request_t *(*release)(scheduler_t *s, model_instance_t *inst, bool take_next);
    /* Optional: called after batch_execute. When set, the scheduler owns
     * finishing the batch (batch_finish or request_finish per request). */
    void (*batch_done)(scheduler_t *s, model_instance_t *inst, batch_t *batch);
    /* Stops taking requests; queued requests are still handed out by
     * next_batch (drain) or failed. Wakes every waiter and joins the
     * scheduler's own threads (reapers), if any. */
    void (*stop)(scheduler_t *s);
    /* Frees the scheduler after every instance thread has exited. */
    void (*destroy)(scheduler_t *s);
} scheduler_ops_t;

struct scheduler {
    const scheduler_ops_t *ops;
    model_t *model;
};

/* Creates the scheduler the model's config asks for. */
nereid_error_t *scheduler_create(model_t *m, scheduler_t **out);

/* Runs req, and then up to a few requests that queued meanwhile, on inst
 * (claimed with ops->claim) on the calling thread, completions included;
 * then releases inst. The caller holds no lock. */
void scheduler_run_inline(scheduler_t *s, model_instance_t *inst, nereid_request_t *req);

/* Scheduler test hooks: the count in environment variable nereid_name, else
 * in triton_name (Triton's name for the same hook, e.g.
 * TRITONSERVER_DELAY_SCHEDULER); 0 when neither is set or the value is not a
 * count (logged). */
size_t scheduler_env_count(const char *nereid_name, const char *triton_name);

/* Per-scheduler constructors. */
nereid_error_t *default_scheduler_create(model_t *m, scheduler_t **out);
nereid_error_t *dynamic_batcher_create(model_t *m, scheduler_t **out);
/* Ensembles: no instances; steps run on their composing models (ensemble.c). */
nereid_error_t *ensemble_scheduler_create(model_t *m, scheduler_t **out);

#endif
