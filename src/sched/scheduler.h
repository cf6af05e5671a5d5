/*
 * This file contains the scheduler interface: the only scheduler header the
 * core includes. A model's config picks one scheduler (default, dynamic
 * batcher, sequence batcher, ensemble), a strategy behind a narrow set of
 * operations. Requests enter with enqueue (any thread); each model
 * instance's execution thread (the core's) pulls batches with next_batch,
 * has the core execute them, then hands them back to batch_done.
 *
 * The core's side is injected, as Triton hands its schedulers an OnSchedule
 * function: sched_core_t runs a batch on an instance and completes its
 * requests, references models, and lets an ensemble hold and submit to its
 * composing models. Schedulers include only the core's request and model
 * headers, and call by name only the core-object API of core/request.h
 * (requests, responses, batches; scripts/layers.txt, CTest check_symbols).
 */
#ifndef NEREID_SCHEDULER_H
#define NEREID_SCHEDULER_H

#include "core/request.h"

typedef struct scheduler scheduler_t;

/* What the core gives every scheduler (Thread: any unless noted). */
typedef struct sched_core {
    /* Runs batch on inst: the backend's execute, outputs, timing; does not
     * complete the requests. Thread: one that owns inst for now (its
     * execution thread, or a caller it was claimed for). */
    void (*execute)(model_instance_t *inst, batch_t *batch);
    /* Records the executed batch's statistics; with finish, completes every
     * request (request_finish) and resets the batch. */
    void (*complete)(batch_t *batch, bool finish);
    /* Looks name/version up (in namespace ns when not NULL) and holds it
     * (model_release ends the hold): an ensemble's composing models. */
    nereid_error_t *(*hold_model)(nereid_server_t *s, const char *ns, const char *name,
                                  int64_t version, model_t **out);
    /* Ends a hold_model hold (model_release). */
    void (*release_model)(model_t *m);
    /* Takes / drops a reference on m (model_ref / model_unref; model.c,
     * Ownership): a thread that is none of the model's own and goes on
     * using it after a completion it ran (an inline run). */
    void (*ref_model)(model_t *m);
    void (*unref_model)(model_t *m);
    /* Submits req to m, which the caller holds: an ensemble's step. Same
     * contract as nereid_server_infer_async. */
    nereid_error_t *(*submit)(model_t *m, nereid_request_t *req,
                              const nereid_response_allocator_t *allocator,
                              nereid_complete_fn done_fn, void *done_userp);
    /* submit for a step whose model may answer 0..N times (decoupled):
     * nereid_server_infer_stream's contract. */
    nereid_error_t *(*submit_stream)(model_t *m, nereid_request_t *req,
                                     const nereid_response_allocator_t *allocator,
                                     nereid_response_fn fn, void *userp);
    /* --rate-limit (Triton's rate limiter hands a batcher an instance
     * first, then the batch is formed): blocks until inst's turn, which its
     * next execute then uses; release_turn gives an unused turn back.
     * No-ops for an instance that is not rate limited. Thread: inst's. */
    void (*acquire_turn)(model_instance_t *inst);
    void (*release_turn)(model_instance_t *inst);
} sched_core_t;

typedef struct scheduler_ops {
    const char *name;
    /* Takes ownership of req on success (NULL return); on error the caller
     * keeps req (a stopped scheduler: UNAVAILABLE "Server not ready").
     * May run req on the calling thread, completion included. Thread: any;
     * the caller holds no lock. */
    nereid_error_t *(*enqueue)(scheduler_t *s, nereid_request_t *req);
    /* Blocks until a batch for inst is ready and fills batch (batch_add).
     * Returns false when the scheduler is stopped and has nothing left for
     * inst. Thread: inst's execution thread. NULL for schedulers that run
     * no instances (ensemble). */
    bool (*next_batch)(scheduler_t *s, model_instance_t *inst, batch_t *batch);
    /* Optional: called after the core executed a batch from next_batch; the
     * scheduler then owns completing it (core->complete). Without it the
     * core completes every request. */
    void (*batch_done)(scheduler_t *s, model_instance_t *inst, batch_t *batch);
    /* Optional: the backend executing req (a request of a batch from
     * next_batch) wants it back in the queue instead of completed (Triton's
     * TRITONSERVER_REQUEST_RELEASE_RESCHEDULE). Returns an error when it
     * cannot be taken back (req is then the backend's to finish); otherwise
     * sets req->reschedule, and batch_done queues req again instead of
     * completing it. Thread: inst's execution thread, during execute.
     * Without it, every reschedule is refused (core/batch.c). */
    nereid_error_t *(*reschedule)(scheduler_t *s, nereid_request_t *req);
    /* Optional: makes a model warmup sample acceptable to this scheduler
     * (e.g. a one-request sequence), before it is validated and enqueued. */
    void (*prepare_warmup)(scheduler_t *s, nereid_request_t *req);
    /* Optional: adds to a warmup request (after prepare_warmup) what the
     * scheduler adds when it hands a request out (sequence controls and
     * start states), for a request that runs on one instance directly,
     * outside the scheduler (model_warmup_instance). */
    void (*prepare_direct)(scheduler_t *s, nereid_request_t *req);
    /* Stops taking requests; queued requests are still handed out by
     * next_batch (drain) or failed. Wakes every waiter and joins the
     * scheduler's own threads (reapers), if any. */
    void (*stop)(scheduler_t *s);
    /* Optional: wakes every instance thread waiting in next_batch, so that
     * one the core retired (inst->retired, set before this call) returns
     * false and exits; the others go on serving. Without it a model's
     * instances cannot change in place (model_update_instances). */
    void (*wake)(scheduler_t *s);
    /* Optional: before the core retires instances v[0..n) (an in-place
     * update), marks them so that they get no new work. One that still
     * serves live sequences (Triton's pending removal) keeps serving them:
     * the scheduler sets its lingering flag, and its next_batch returns
     * false once they have ended; the core does not wait for it. */
    void (*retire)(scheduler_t *s, model_instance_t *const *v, size_t n);
    /* Optional: Triton's in-flight inference count for this scheduler, used
     * in place of the model's queued requests while the server drains at
     * exit (a sequence batcher: the live sequences that hold a position,
     * Triton's SequenceBatchScheduler::InflightInferenceCount). Thread: any. */
    size_t (*inflight)(scheduler_t *s);
    /* Frees the scheduler after every instance thread has exited. */
    void (*destroy)(scheduler_t *s);
} scheduler_ops_t;

struct scheduler {
    const scheduler_ops_t *ops;
    const sched_core_t *core;
    model_t *model;
    /* Set by a scheduler's create, read by the core once it returns: the
     * model answers 0..N times per request (an ensemble with a decoupled
     * step), so the core marks the model's config decoupled. Schedulers
     * never edit the config themselves. */
    bool decoupled;
};

/* Creates the scheduler the model's config asks for; core stays valid for
 * the scheduler's life. */
nereid_error_t *scheduler_create(model_t *m, const sched_core_t *core, scheduler_t **out);

/* Scheduler test hooks: the count in environment variable nereid_name, else
 * in triton_name (Triton's name for the same hook, e.g.
 * TRITONSERVER_DELAY_SCHEDULER); 0 when neither is set or the value is not a
 * count (logged). */
size_t scheduler_env_count(const char *nereid_name, const char *triton_name);

/* Per-scheduler constructors (scheduler_create picks one). */
nereid_error_t *default_scheduler_create(model_t *m, const sched_core_t *core, scheduler_t **out);
nereid_error_t *dynamic_batcher_create(model_t *m, const sched_core_t *core, scheduler_t **out);
nereid_error_t *sequence_batcher_create(model_t *m, const sched_core_t *core, scheduler_t **out);
/* Ensembles: no instances; steps run on their composing models (ensemble.c). */
nereid_error_t *ensemble_scheduler_create(model_t *m, const sched_core_t *core, scheduler_t **out);

#endif
