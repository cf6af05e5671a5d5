/*
 * This file contains the memory trimmer (mem_trim.h): one thread that
 * sleeps on a condition variable while nothing happened since its last
 * trim, waits out a quiet period once requests have ended, and calls
 * malloc_trim(0) when a whole period passed without one.
 *
 * Lock order: only t->lock. A note never takes it unless the trimmer is
 * parked; the parked flag and the event count are sequentially consistent
 * atomics, so either the trimmer sees the new count before it waits or the
 * noter sees the flag and signals under the lock.
 */
#include "http/mem_trim.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

struct mem_trim {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* CLOCK_MONOTONIC */
    bool stop;           /* under lock */
    uint64_t quiet_ns;
    _Atomic bool active;        /* a request ended since the trimmer last looked */
    _Atomic bool parked;        /* the trimmer waits for an event, untimed */
    _Atomic uint64_t n_trimmed; /* trims done */
};

static void deadline_after(struct timespec *ts, uint64_t ns)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    uint64_t total = (uint64_t)ts->tv_nsec + ns % 1000000000u;
    ts->tv_sec += (time_t)(ns / 1000000000u + total / 1000000000u);
    ts->tv_nsec = (long)(total % 1000000000u);
}

static void *trim_main(void *arg)
{
    mem_trim_t *t = arg;
    pthread_mutex_lock(&t->lock);
    bool pending = false; /* requests ended since the last trim */
    while (!t->stop) {
        if (!pending) {
            /* A note sets the flag before it reads parked, and this thread
             * sets parked before it takes the flag: one of the two sees the
             * other (a note before this thread ran counts too). */
            atomic_store(&t->parked, true);
            while (!t->stop && !atomic_exchange(&t->active, false))
                pthread_cond_wait(&t->cond, &t->lock);
            atomic_store(&t->parked, false);
            pending = !t->stop;
            continue;
        }
        struct timespec until;
        deadline_after(&until, t->quiet_ns);
        int rc = 0;
        while (!t->stop && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&t->cond, &t->lock, &until);
        if (t->stop) break;
        if (atomic_exchange(&t->active, false)) continue; /* still busy: another period */
        pthread_mutex_unlock(&t->lock);
        malloc_trim(0);
        atomic_fetch_add(&t->n_trimmed, 1);
        pthread_mutex_lock(&t->lock);
        pending = false;
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

mem_trim_t *mem_trim_start(uint64_t quiet_ns)
{
    mem_trim_t *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->quiet_ns = quiet_ns;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cond, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&t->lock, NULL);
    if (pthread_create(&t->thread, NULL, trim_main, t) != 0) {
        pthread_cond_destroy(&t->cond);
        pthread_mutex_destroy(&t->lock);
        free(t);
        return NULL;
    }
    return t;
}

void mem_trim_note(mem_trim_t *t)
{
    /* A plain load while the flag is set (the steady state under load): no
     * write to the shared line, which the trimmer clears once a period. */
    if (!t || atomic_load_explicit(&t->active, memory_order_relaxed)) return;
    atomic_store(&t->active, true);
    if (atomic_load(&t->parked)) {
        pthread_mutex_lock(&t->lock);
        pthread_cond_signal(&t->cond);
        pthread_mutex_unlock(&t->lock);
    }
}

uint64_t mem_trim_count(mem_trim_t *t)
{
    return t ? atomic_load(&t->n_trimmed) : 0;
}

void mem_trim_stop(mem_trim_t *t)
{
    if (!t) return;
    pthread_mutex_lock(&t->lock);
    t->stop = true;
    pthread_cond_signal(&t->cond);
    pthread_mutex_unlock(&t->lock);
    pthread_join(t->thread, NULL);
    pthread_cond_destroy(&t->cond);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;
static mem_trim_t *shared_trim; /* shared_lock */
static int shared_refs;         /* shared_lock */

mem_trim_t *mem_trim_acquire(uint64_t quiet_ns)
{
    pthread_mutex_lock(&shared_lock);
    if (!shared_trim) shared_trim = mem_trim_start(quiet_ns);
    if (shared_trim) shared_refs++;
    mem_trim_t *t = shared_trim;
    pthread_mutex_unlock(&shared_lock);
    return t;
}

void mem_trim_release(mem_trim_t *t)
{
    if (!t) return;
    pthread_mutex_lock(&shared_lock);
    bool last = --shared_refs == 0;
    if (last) shared_trim = NULL;
    pthread_mutex_unlock(&shared_lock);
    if (last) mem_trim_stop(t);
}
