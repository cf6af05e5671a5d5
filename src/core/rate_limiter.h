/*
 * This file contains the rate limiter (Triton's --rate-limit=execution_count):
 * a model instance whose instance_group has rate_limiter resources executes
 * only when those resources are free, across every model of the server.
 *
 * Resources are named counts, either per device (each device has its own
 * copies) or global (one pool). The server's count of a resource is the
 * largest count any one registered instance needs, unless
 * --rate-limit-resource gives it; once any resource is given explicitly,
 * a resource that is not given has none (Triton's rule), so a model needing
 * it fails to load.
 *
 * An instance that has a batch asks for a turn (it is "staged"); staged
 * instances get their turns in the order of exec_count * priority (lowest
 * first, priority 0 counting as 1, ties to the one staged first): an
 * instance of priority 2 gets half the turns of one of priority 1 under
 * contention. Only the first in that order may start: when its resources
 * are busy, the others wait too (no overtaking), as in Triton.
 *
 * exec_count starts at RATE_LIMITER_STARTUP_TURNS, not 0: Triton passes
 * each instance's INIT and WARM_UP payloads through the limiter before it
 * serves, and each counts as an execution (ModelInstanceContext::Release),
 * so an instance of priority 2 starts 2 behind one of priority 1 rather
 * than level with it (L0_rate_limiter's cross-model ratio depends on it).
 * Warmup samples, which Triton runs inside its one WARM_UP payload, are
 * therefore not counted here.
 *
 * An instance that finishes while its model still has queued requests is,
 * in Triton, staged again before the next turn is chosen. Here its thread
 * asks a moment later, so it is deferred: it takes its place in the order
 * at release (its staged_seq then), and no staged instance after it starts
 * until it (or another instance of its model) asks again, even when another
 * instance's thread is back first; a deferral that nobody claims lapses
 * after RATE_LIMITER_DEFER_NS, so a cancelled request never stalls the
 * others.
 *
 * Workload assumed: tens of instances, a handful of resources each; every
 * operation scans them under one mutex. Instances without rate_limiter
 * resources, and every instance when the limiter is off, are not
 * registered and never touch it.
 */
#ifndef NEREID_RATE_LIMITER_H
#define NEREID_RATE_LIMITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nereid/server.h"

/* The device of global resources (rate_limiter_capacity). */
#define RATE_LIMITER_GLOBAL_DEVICE (-2)
/* Executions every instance has had when it starts serving (Triton's INIT
 * and WARM_UP payloads). */
#define RATE_LIMITER_STARTUP_TURNS 2
/* How long a deferred choice waits for its instance to come back. */
#define RATE_LIMITER_DEFER_NS (20 * 1000 * 1000)

typedef struct rate_limiter rate_limiter_t;
/* One registered model instance. */
typedef struct rate_limiter_instance rate_limiter_instance_t;

/* One resource an instance needs (instance_group rate_limiter resources). */
typedef struct rate_limiter_need {
    const char *name;
    bool global;    /* one pool for the server, else the instance's device's */
    uint32_t count; /* copies held while the instance executes */
} rate_limiter_need_t;

/* Creates a limiter. explicit (borrowed during the call, may be NULL when
 * n_explicit is 0) are the --rate-limit-resource counts; device -1 means
 * every device. A name given twice for one device keeps the smaller count
 * (Triton). Caller frees with rate_limiter_free after unregistering every
 * instance. */
rate_limiter_t *rate_limiter_new(const nereid_rate_limit_resource_t *explicit, size_t n_explicit);
void rate_limiter_free(rate_limiter_t *rl);

/* Registers an instance running on device that needs needs[0..n_needs)
 * (borrowed during the call; a name listed twice keeps the last count) at
 * priority. owner groups the instances of one model (deferrals, above).
 * Fails with INVALID_ARG and Triton's texts when a resource is both global
 * and per device among the registered instances, or when an explicit count
 * is below what this instance needs; the limiter is then unchanged and *out
 * NULL. Thread: any (model loads run in parallel). */
nereid_error_t *rate_limiter_register(rate_limiter_t *rl, const void *owner, int device,
                                      const rate_limiter_need_t *needs, size_t n_needs,
                                      uint32_t priority, rate_limiter_instance_t **out);
/* Unregisters and frees inst (NULL: no-op); it must not be staged or
 * running (its thread has exited). The server's default counts shrink back
 * to what the remaining instances need. */
void rate_limiter_unregister(rate_limiter_instance_t *inst);

/* Blocks until inst may execute, holding its resources from then on.
 * Thread: the one executing inst's batch; takes only the limiter's lock. */
void rate_limiter_acquire(rate_limiter_instance_t *inst);
/* Ends inst's execution: frees its resources, counts the execution (unless
 * warmup: a model warmup batch, already counted in
 * RATE_LIMITER_STARTUP_TURNS) and starts whichever staged instances may now
 * run. more_work: inst's model has queued requests (it will most likely ask
 * again at once). */
void rate_limiter_release(rate_limiter_instance_t *inst, bool more_work, bool warmup);

/* ---- Models (model.c) ---- */

struct model;
/* Registers every instance of m whose instance_group has rate_limiter
 * resources with its server's limiter (sets inst->rate_limit, and
 * m->rate_limited when any); nothing with --rate-limit=off. On error the instances registered so
 * far stay registered; rate_limiter_remove_model undoes them. Called before the instance threads
 * start. */
nereid_error_t *rate_limiter_add_model(struct model *m);
/* rate_limiter_add_model for one instance of m (an in-place instance
 * update adds them one by one). */
struct model_instance;
nereid_error_t *rate_limiter_add_instance(struct model *m, struct model_instance *inst);
/* Unregisters m's instances; their threads have exited. */
void rate_limiter_remove_model(struct model *m);

/* ---- The non-blocking core, for tests ---- */

/* Stages inst (it must not be staged or running) and returns whether it may
 * execute now; if not, rate_limiter_running(inst) turns true once it may. */
bool rate_limiter_try_acquire(rate_limiter_instance_t *inst);
bool rate_limiter_running(rate_limiter_instance_t *inst);
/* inst is staged: waiting for its turn. */
bool rate_limiter_staged(rate_limiter_instance_t *inst);
/* Drops every outstanding deferral and starts what may run (what the
 * waiters do after RATE_LIMITER_DEFER_NS). */
void rate_limiter_expire_deferrals(rate_limiter_t *rl);
/* Copies of resource name available on device (RATE_LIMITER_GLOBAL_DEVICE:
 * the global pool), or -1 when no registered instance needs it there. */
long rate_limiter_capacity(rate_limiter_t *rl, const char *name, int device);

#endif
