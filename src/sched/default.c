/*
 * This file contains the default scheduler: a FIFO shared by the model's
 * instances; each free instance takes the oldest request and runs it alone.
 *
 * Hand-off cost: waking a thread blocked in pthread_cond_wait costs a futex
 * syscall on the submitting thread and a scheduler wake-up (several µs, tens
 * on a loaded machine) on the instance. So an instance that has just
 * finished a batch and finds the queue empty first spins for a short,
 * bounded time (NEREID_SPIN_US, default 20 µs, checked against the clock)
 * watching an atomic queue count; one instance per model spins at a time,
 * and enqueue signals the condition variable only when the queued requests
 * outnumber the instances about to look at the queue and one is blocked.
 *
 * A spin that times out is pure loss: requests are far apart, or the
 * submitting thread shares this CPU and cannot run while we spin. Each one
 * doubles a back-off (up to SPIN_BACKOFF_MAX idle periods without spinning);
 * a spin that finds work clears it. So spinning costs at most one bound per
 * SPIN_BACKOFF_MAX idle periods where it does not pay, and it gives the CPU
 * back to the frontend threads.
 *
 * Inline runs: cheaper still is no hand-off at all. When the model's
 * executions are short (moving average at most NEREID_INLINE_US, default
 * 50 µs; 0 turns this off), the queue is empty and an instance is blocked
 * waiting, the submitting thread claims that instance and runs the request
 * itself (run_inline, from enqueue), completion included; a request that finds
 * no idle instance queues as usual, and the inline caller takes up to a few
 * queued requests before it releases the instance (never for a decoupled
 * model: see default_scheduler_create). A claimed instance's
 * thread stays blocked until the release, so one instance still runs one
 * batch at a time, in FIFO order. Instances of such a model do not spin:
 * the work comes to them on the caller's thread.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>

#include "core/util.h"
#include "nereid/common.h"
#include "sched/deadline.h"
#include "sched/scheduler.h"

#define SPIN_DEFAULT_NS 20000u   /* longest idle spin after a batch */
#define SPIN_BACKOFF_MAX 256u    /* most idle periods skipped after failed spins */
#define SPIN_CHECK 16            /* pause iterations between clock reads */
#define INLINE_DEFAULT_NS 50000u /* longest average execution run inline */

/* Per instance (inst->sched_state, under the scheduler's lock): its thread
 * is blocked waiting for work, and a frontend thread has claimed it to run
 * requests itself. */
typedef struct default_inst {
    bool waiting;
    bool claimed;
} default_inst_t;

typedef struct default_scheduler {
    scheduler_t base;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    nereid_request_t *head, *tail; /* lock */
    bool stopped;                  /* lock */
    size_t n_blocked;              /* instance threads in pthread_cond_wait (lock) */
    _Atomic size_t n_claimed;      /* of those, claimed for inline runs (written under lock) */
    _Atomic size_t n_seeking;      /* in next_batch, not blocked (decremented under lock) */
    _Atomic size_t n_queued;       /* written under lock; read by a spinner */
    _Atomic bool stop_flag;        /* stopped, for a spinner */
    _Atomic bool spinning;         /* an instance is spinning for work */
    _Atomic uint32_t spin_skip;    /* idle periods left without spinning */
    _Atomic uint32_t spin_backoff; /* spin_skip after the next timed-out spin */
    uint64_t spin_ns;              /* spin bound; 0: never spin */
    uint64_t inline_ns;            /* inline runs for executions this short; 0: never */
    sched_timer_t timer;           /* armed for the earliest queued deadline */
} default_scheduler_t;

/* Whether the model's executions are short enough to run on the caller. */
static bool inline_ok(const default_scheduler_t *d)
{
    /* A rate-limited instance may wait for its turn: never on a frontend's
     * thread. */
    uint64_t bound = atomic_load_explicit(&d->base.model->inline_max_ns, memory_order_relaxed);
    return d->inline_ns && !d->base.model->rate_limited &&
           atomic_load_explicit(&d->base.model->exec_avg_ns, memory_order_relaxed) <=
               (bound ? bound : d->inline_ns);
}

/* Wakes an unclaimed blocked instance, if any (lock held). A claimed one
 * may be woken too; it goes back to waiting. */
static void wake_locked(default_scheduler_t *d)
{
    if (d->n_blocked <= d->n_claimed) return;
    if (d->n_claimed)
        pthread_cond_broadcast(&d->cond);
    else
        pthread_cond_signal(&d->cond);
}

/* Inline runs this thread is inside (run_inline), and the model whose
 * execute it is running inline right now (NULL outside an execute, in
 * completions included). */
static _Thread_local int inline_depth;
static _Thread_local const model_t *inline_executing;

/* Whether a request for s's model submitted on this thread may run inline.
 * Outside inline runs, yes. Inside one, only a request that an inline
 * execute of another model submits (a backend's in-process request, e.g.
 * Triton's BLS), and one level deep: that execute waits for the answer, so
 * running the callee here spares a hand-off to its instance thread and
 * back. Requests submitted from a completion (an ensemble's next step) or
 * for the running model itself still queue (the instance this thread holds
 * cannot be claimed; completions must not nest). */
static bool may_run_inline(const scheduler_t *s)
{
    return inline_depth == 0 ||
           (inline_depth == 1 && inline_executing && inline_executing != s->model);
}

static model_instance_t *claim(scheduler_t *s);
static void run_inline(scheduler_t *s, model_instance_t *inst, nereid_request_t *req);

static nereid_error_t *default_enqueue(scheduler_t *s, nereid_request_t *req)
{
    default_scheduler_t *d = (default_scheduler_t *)s;
    /* A request submitted from inside an inline run (an ensemble's next
     * step, from the previous step's completion) queues: it would otherwise
     * wait for the instance this thread holds, or nest runs. The inline
     * caller takes it from the queue once its own run is complete. */
    model_instance_t *inst = may_run_inline(s) ? claim(s) : NULL;
    if (inst) {
        run_inline(s, inst, req);
        return NULL;
    }
    pthread_mutex_lock(&d->lock);
    if (d->stopped) {
        pthread_mutex_unlock(&d->lock);
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready");
    }
    req->next = NULL;
    if (d->tail)
        d->tail->next = req;
    else
        d->head = req;
    d->tail = req;
    if (req->deadline_ns) sched_timer_arm(&d->timer, req->deadline_ns);
    atomic_fetch_add(&s->model->stats.pending, 1);
    size_t queued = atomic_fetch_add(&d->n_queued, 1) + 1;
    /* Each seeking instance takes a request without a wake-up: it checks
     * the queue under the lock before it blocks. */
    if (queued > atomic_load(&d->n_seeking)) wake_locked(d);
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

/* Takes the oldest queued request (lock held, queue not empty). */
static nereid_request_t *pop_locked(default_scheduler_t *d)
{
    nereid_request_t *req = d->head;
    d->head = req->next;
    if (!d->head) d->tail = NULL;
    req->next = NULL;
    atomic_fetch_sub(&d->n_queued, 1);
    atomic_fetch_sub(&d->base.model->stats.pending, 1);
    return req;
}

/* The deadline timer: fails the queued requests whose deadline passed,
 * even while every instance is busy, and arms the timer for the next. */
static void default_fire(sched_timer_t *t)
{
    default_scheduler_t *d =
        (default_scheduler_t *)((char *)t - offsetof(default_scheduler_t, timer));
    nereid_request_t *expired = NULL, **tail = &expired;
    uint64_t now = util_now_ns(), next = 0;
    pthread_mutex_lock(&d->lock);
    nereid_request_t **link = &d->head, *prev = NULL;
    while (*link) {
        nereid_request_t *r = *link;
        if (!request_expired(r, now)) {
            if (r->deadline_ns && (!next || r->deadline_ns < next)) next = r->deadline_ns;
            prev = r;
            link = &r->next;
            continue;
        }
        *link = r->next;
        if (d->tail == r) d->tail = prev;
        r->next = NULL;
        *tail = r;
        tail = &r->next;
        atomic_fetch_sub(&d->n_queued, 1);
        atomic_fetch_sub(&d->base.model->stats.pending, 1);
    }
    if (next && !d->stopped) sched_timer_arm(&d->timer, next);
    pthread_mutex_unlock(&d->lock);
    while (expired) {
        nereid_request_t *r = expired;
        expired = r->next;
        r->next = NULL;
        request_finish_expired(r, NULL);
    }
}

/* Claims a blocked, unclaimed instance (lock held). */
static model_instance_t *claim_locked(default_scheduler_t *d)
{
    model_t *m = d->base.model;
    if (d->stopped || d->head || d->n_blocked <= d->n_claimed) return NULL;
    for (size_t i = 0; i < m->n_instances; i++) {
        model_instance_t *inst = m->instances[i];
        default_inst_t *di = inst->sched_state;
        if (di && di->waiting && !di->claimed && !atomic_load(&inst->retired)) {
            di->claimed = true;
            d->n_claimed++;
            return inst;
        }
    }
    return NULL;
}

/* When every instance is claimed by an inline caller, one of them is free
 * again within about one short execution: waiting for it (up to the spin
 * bound) costs less than queueing, which makes the completion run on
 * another thread. */
static model_instance_t *claim(scheduler_t *s)
{
    default_scheduler_t *d = (default_scheduler_t *)s;
    if (!inline_ok(d)) return NULL;
    size_t n = s->model->n_instances;
    uint64_t start = 0;
    for (;;) {
        pthread_mutex_lock(&d->lock);
        model_instance_t *inst = claim_locked(d);
        bool all_claimed = !inst && !d->stopped && !d->head && d->n_claimed == n;
        pthread_mutex_unlock(&d->lock);
        if (inst || !all_claimed || !d->spin_ns) return inst;
        if (!start) start = util_now_ns();
        for (int i = 0; atomic_load_explicit(&d->n_claimed, memory_order_relaxed) == n &&
                        !atomic_load_explicit(&d->n_queued, memory_order_relaxed);
             i++) {
            if (i % SPIN_CHECK == 0 && util_now_ns() - start >= d->spin_ns) return NULL;
            nereid_cpu_relax();
        }
    }
}

/* When take_next and a request is queued, dequeues and returns it, inst
 * staying claimed; otherwise gives inst back to its thread, returns NULL. */
static nereid_request_t *release(scheduler_t *s, model_instance_t *inst, bool take_next)
{
    default_scheduler_t *d = (default_scheduler_t *)s;
    nereid_request_t *req = NULL;
    pthread_mutex_lock(&d->lock);
    if (take_next && d->head) {
        req = pop_locked(d);
    } else {
        ((default_inst_t *)inst->sched_state)->claimed = false;
        d->n_claimed--;
        /* Its thread (or another) takes what queued meanwhile, or exits. */
        if (d->head || d->stopped || atomic_load(&inst->retired)) pthread_cond_broadcast(&d->cond);
    }
    pthread_mutex_unlock(&d->lock);
    return req;
}

/* Queued requests an inline caller runs after its own before it hands the
 * instance back to its thread: bounds how long a frontend thread is kept. */
#define INLINE_TAKE_MAX 4

/* Runs req, and then up to a few requests that queued meanwhile, on inst
 * (claimed) on the calling thread, completions included; then releases
 * inst. */
static void run_inline(scheduler_t *s, model_instance_t *inst, nereid_request_t *req)
{
    model_t *m = s->model;
    const sched_core_t *core = s->core; /* the core's, outlives s */
    /* The request's model reference ends with its completion, and this
     * thread is none of the model's own (model.c, Ownership): the release
     * below still needs the scheduler, so the run holds a reference of its
     * own and drops it last. */
    core->ref_model(m);
    inline_depth++;
    nereid_request_t *slot[1];
    batch_t batch = {.reqs = slot, .cap_reqs = 1};
    for (int taken = 0; req; taken++) {
        if (request_cancelled(req)) {
            request_finish_cancelled(req);
        } else {
            batch_add(&batch, req);
            const model_t *outer = inline_executing;
            inline_executing = m;
            s->core->execute(inst, &batch);
            inline_executing = outer;
            s->core->complete(&batch, true);
        }
        req = release(s, inst, taken < INLINE_TAKE_MAX);
    }
    inline_depth--;
    core->unref_model(m);
}

/* Spins while the queue is empty, up to the bound, unless backing off. */
static void spin_for_work(default_scheduler_t *d)
{
    if (atomic_load_explicit(&d->n_queued, memory_order_relaxed)) return;
    uint32_t skip = atomic_load_explicit(&d->spin_skip, memory_order_relaxed);
    if (skip) {
        atomic_store_explicit(&d->spin_skip, skip - 1, memory_order_relaxed);
        return;
    }
    if (atomic_exchange(&d->spinning, true)) return;
    uint64_t start = util_now_ns();
    bool found = false;
    while (!found) {
        for (int i = 0; i < SPIN_CHECK; i++) {
            if (atomic_load_explicit(&d->n_queued, memory_order_relaxed) ||
                atomic_load_explicit(&d->stop_flag, memory_order_relaxed)) {
                found = true;
                break;
            }
            nereid_cpu_relax();
        }
        if (!found && util_now_ns() - start >= d->spin_ns) break;
    }
    atomic_store(&d->spinning, false);
    if (found) {
        atomic_store_explicit(&d->spin_backoff, 0, memory_order_relaxed);
    } else {
        uint32_t b = atomic_load_explicit(&d->spin_backoff, memory_order_relaxed);
        b = b ? (2 * b < SPIN_BACKOFF_MAX ? 2 * b : SPIN_BACKOFF_MAX) : 1;
        atomic_store_explicit(&d->spin_backoff, b, memory_order_relaxed);
        atomic_store_explicit(&d->spin_skip, b, memory_order_relaxed);
    }
}

/* Whether inst may take a request now, or leave (lock held). */
static bool can_take(const default_scheduler_t *d, const model_instance_t *inst,
                     const default_inst_t *di)
{
    return !di->claimed && (d->head || d->stopped || atomic_load(&inst->retired));
}

static bool default_next_batch(scheduler_t *s, model_instance_t *inst, batch_t *batch)
{
    default_scheduler_t *d = (default_scheduler_t *)s;
again:
    atomic_fetch_add(&d->n_seeking, 1);
    if (d->spin_ns && !inline_ok(d)) spin_for_work(d);
    pthread_mutex_lock(&d->lock);
    default_inst_t *di = inst->sched_state;
    if (!di) inst->sched_state = di = xcalloc(1, sizeof *di);
    if (!can_take(d, inst, di) && inst->turn_held) {
        /* The requests it took the turn for left the queue (expired,
         * taken by another instance): give the turn back before waiting. */
        atomic_fetch_sub(&d->n_seeking, 1);
        pthread_mutex_unlock(&d->lock);
        s->core->release_turn(inst);
        goto again;
    }
    if (!can_take(d, inst, di)) {
        atomic_fetch_sub(&d->n_seeking, 1);
        while (!can_take(d, inst, di)) {
            d->n_blocked++;
            di->waiting = true;
            pthread_cond_wait(&d->cond, &d->lock);
            di->waiting = false;
            d->n_blocked--;
        }
        atomic_fetch_add(&d->n_seeking, 1);
    }
    atomic_fetch_sub(&d->n_seeking, 1);
    if (atomic_load(&inst->retired)) {
        /* Removed by an instance update: leave; another takes the queue. */
        if (d->head) wake_locked(d);
        pthread_mutex_unlock(&d->lock);
        if (inst->turn_held) s->core->release_turn(inst);
        return false;
    }
    if (d->head && inst->rate_limit && !inst->turn_held) {
        /* Rate limited: the request waits for the instance's turn in this
         * queue, where its deadline still applies (Triton's rate limiter
         * hands a scheduler an instance first, as in dynamic.c). */
        pthread_mutex_unlock(&d->lock);
        s->core->acquire_turn(inst);
        goto again;
    }
    nereid_request_t *req = d->head ? pop_locked(d) : NULL;
    if (req) {
        /* More work and a blocked instance: pass the wake-up on. */
        if (d->head) wake_locked(d);
    }
    pthread_mutex_unlock(&d->lock);
    if (!req) {
        if (inst->turn_held) s->core->release_turn(inst);
        return false;
    }
    if (request_cancelled(req)) {
        /* Removed from the queue without running (Triton's CANCELLED). */
        request_finish_cancelled(req);
        goto again;
    }
    if (request_expired(req, util_now_ns())) {
        /* Its deadline passed before the timer took it out. */
        request_finish_expired(req, NULL);
        goto again;
    }
    batch_add(batch, req);
    return true;
}

static void default_stop(scheduler_t *s)
{
    default_scheduler_t *d = (default_scheduler_t *)s;
    pthread_mutex_lock(&d->lock);
    d->stopped = true;
    atomic_store(&d->stop_flag, true);
    pthread_cond_broadcast(&d->cond);
    pthread_mutex_unlock(&d->lock);
    /* Queued requests still drain; their deadlines apply as they are
     * taken. */
    sched_timer_disarm(&d->timer);
}

static void default_wake(scheduler_t *s)
{
    default_scheduler_t *d = (default_scheduler_t *)s;
    pthread_mutex_lock(&d->lock);
    pthread_cond_broadcast(&d->cond);
    pthread_mutex_unlock(&d->lock);
}

static void default_destroy(scheduler_t *s)
{
    default_scheduler_t *d = (default_scheduler_t *)s;
    sched_timer_disarm(&d->timer);
    /* Instances drained the queue before exiting; anything left failed. */
    while (d->head) {
        nereid_request_t *r = d->head;
        d->head = r->next;
        request_finish(r, nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready"),
                       FAILURE_OTHER);
    }
    model_t *m = s->model;
    for (size_t i = 0; i < m->n_instances; i++) {
        free(m->instances[i]->sched_state);
        m->instances[i]->sched_state = NULL;
    }
    pthread_mutex_destroy(&d->lock);
    pthread_cond_destroy(&d->cond);
    free(d);
}

static const scheduler_ops_t default_ops = {
    .name = "default",
    .enqueue = default_enqueue,
    .next_batch = default_next_batch,
    .stop = default_stop,
    .wake = default_wake,
    .destroy = default_destroy,
};

nereid_error_t *default_scheduler_create(model_t *m, const sched_core_t *core, scheduler_t **out)
{
    default_scheduler_t *d = xcalloc(1, sizeof *d);
    d->base.ops = &default_ops;
    d->base.model = m;
    d->base.core = core;
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->cond, NULL);
    d->timer.fire = default_fire;
    /* NEREID_SPIN_US: the idle spin's upper bound in µs (0 disables). */
    const char *env = getenv("NEREID_SPIN_US");
    d->spin_ns = env && *env ? (uint64_t)strtoull(env, NULL, 10) * 1000u : SPIN_DEFAULT_NS;
    /* NEREID_INLINE_US: longest average execution run on the caller's
     * thread, in µs (0 disables inline runs). */
    env = getenv("NEREID_INLINE_US");
    d->inline_ns = env && *env ? (uint64_t)strtoull(env, NULL, 10) * 1000u : INLINE_DEFAULT_NS;
    /* Never for a decoupled model: its execute may send responses for a
     * long time before it returns (a Python model sending one token a
     * second), and run on a frontend's thread it would hold that thread,
     * and with it the very stream its responses go out on, until then. */
    if (m->config->model_transaction_policy && m->config->model_transaction_policy->decoupled)
        d->inline_ns = 0;
    *out = &d->base;
    return NULL;
}
