/*
 * This file contains the default scheduler: a FIFO shared by the model's
 * instances; each free instance takes the oldest request and runs it alone.
 *
 * Hand-off cost: waking a thread blocked in pthread_cond_wait costs a futex
 * syscall on the submitting thread and a scheduler wake-up (several µs) on
 * the instance. So an instance that has just finished a batch and finds the
 * queue empty first spins for a short, bounded time (spin_ns, at most
 * NEREID_SPIN_US, default 20 µs, checked against the clock) watching an
 * atomic queue count; one instance per model spins at a time, and enqueue
 * signals the condition variable only when the queued requests outnumber
 * the spinner and a thread is blocked. The budget adapts: a spin that times
 * out halves it (down to zero), an idle period short enough that a spin
 * would have caught it restores it, so a model whose requests arrive far
 * apart stops spinning and gives the CPU back to the frontend threads.
 */
#include <pthread.h>
#include <stdlib.h>

#include "core/util.h"
#include "sched/scheduler.h"

#define SPIN_DEFAULT_NS 20000u /* longest idle spin after a batch */
#define SPIN_MIN_NS 1000u      /* below this a timed-out spin stops spinning */
#define SPIN_CHECK 16          /* pause iterations between clock reads */

typedef struct default_scheduler {
    scheduler_t base;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    nereid_request_t *head, *tail; /* lock */
    bool stopped;                  /* lock */
    size_t n_blocked;              /* instance threads in pthread_cond_wait (lock) */
    _Atomic size_t n_seeking;      /* in next_batch, not blocked (decremented under lock) */
    _Atomic size_t n_queued;       /* written under lock; read by a spinner */
    _Atomic bool stop_flag;        /* stopped, for a spinner */
    _Atomic bool spinning;         /* an instance is spinning for work */
    _Atomic uint64_t spin_ns;      /* current spin budget (adaptive) */
    uint64_t spin_max_ns;          /* 0: never spin */
} default_scheduler_t;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static nereid_error_t *default_enqueue(scheduler_t *s, nereid_request_t *req)
{
    default_scheduler_t *d = (default_scheduler_t *)s;
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
    atomic_fetch_add(&s->model->stats.pending, 1);
    size_t queued = atomic_fetch_add(&d->n_queued, 1) + 1;
    /* Each seeking instance takes a request without a wake-up: it checks
     * the queue under the lock before it blocks. */
    if (d->n_blocked && queued > atomic_load(&d->n_seeking)) pthread_cond_signal(&d->cond);
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

/* Spins while the queue is empty, up to the current budget; returns when the
 * spin began (0 when it did not spin). */
static uint64_t spin_for_work(default_scheduler_t *d)
{
    uint64_t budget = atomic_load_explicit(&d->spin_ns, memory_order_relaxed);
    if (!budget || atomic_load_explicit(&d->n_queued, memory_order_relaxed) ||
        atomic_exchange(&d->spinning, true))
        return 0;
    uint64_t start = util_now_ns();
    bool found = false;
    while (!found) {
        for (int i = 0; i < SPIN_CHECK; i++) {
            if (atomic_load_explicit(&d->n_queued, memory_order_relaxed) ||
                atomic_load_explicit(&d->stop_flag, memory_order_relaxed)) {
                found = true;
                break;
            }
            cpu_relax();
        }
        if (!found && util_now_ns() - start >= budget) break;
    }
    atomic_store(&d->spinning, false);
    if (!found) {
        budget /= 2;
        atomic_store_explicit(&d->spin_ns, budget < SPIN_MIN_NS ? 0 : budget, memory_order_relaxed);
    }
    return start;
}

static bool default_next_batch(scheduler_t *s, model_instance_t *inst, batch_t *batch)
{
    (void)inst;
    default_scheduler_t *d = (default_scheduler_t *)s;
    atomic_fetch_add(&d->n_seeking, 1);
    uint64_t idle_start = d->spin_max_ns ? spin_for_work(d) : 0;
    pthread_mutex_lock(&d->lock);
    bool blocked = false;
    if (!d->head && !d->stopped) {
        if (d->spin_max_ns && !idle_start) idle_start = util_now_ns();
        atomic_fetch_sub(&d->n_seeking, 1);
        while (!d->head && !d->stopped) {
            d->n_blocked++;
            pthread_cond_wait(&d->cond, &d->lock);
            d->n_blocked--;
        }
        atomic_fetch_add(&d->n_seeking, 1);
        blocked = true;
    }
    atomic_fetch_sub(&d->n_seeking, 1);
    nereid_request_t *req = d->head;
    /* The request arrived soon enough after the instance went idle that a
     * full spin would have caught it (its enqueue time, not this thread's
     * wake-up, which a loaded machine delays): spin again next time. */
    if (req && blocked && d->spin_max_ns &&
        (req->t_queue_start_ns <= idle_start ||
         req->t_queue_start_ns - idle_start < d->spin_max_ns))
        atomic_store_explicit(&d->spin_ns, d->spin_max_ns, memory_order_relaxed);
    if (req) {
        d->head = req->next;
        if (!d->head) d->tail = NULL;
        req->next = NULL;
        atomic_fetch_sub(&d->n_queued, 1);
        atomic_fetch_sub(&s->model->stats.pending, 1);
        /* More work and a blocked instance: pass the wake-up on. */
        if (d->head && d->n_blocked) pthread_cond_signal(&d->cond);
    }
    pthread_mutex_unlock(&d->lock);
    if (!req) return false;
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
}

static void default_destroy(scheduler_t *s)
{
    default_scheduler_t *d = (default_scheduler_t *)s;
    /* Instances drained the queue before exiting; anything left failed. */
    while (d->head) {
        nereid_request_t *r = d->head;
        d->head = r->next;
        request_finish(r, nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready"),
                       FAILURE_OTHER);
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
    .destroy = default_destroy,
};

nereid_error_t *default_scheduler_create(model_t *m, scheduler_t **out)
{
    default_scheduler_t *d = xcalloc(1, sizeof *d);
    d->base.ops = &default_ops;
    d->base.model = m;
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->cond, NULL);
    /* NEREID_SPIN_US: the idle spin's upper bound in µs (0 disables). */
    const char *env = getenv("NEREID_SPIN_US");
    d->spin_max_ns = env && *env ? (uint64_t)strtoull(env, NULL, 10) * 1000u : SPIN_DEFAULT_NS;
    atomic_store(&d->spin_ns, d->spin_max_ns);
    *out = &d->base;
    return NULL;
}
