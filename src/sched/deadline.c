/*
 * This file contains the schedulers' shared deadline timer (deadline.h):
 * a list of armed timers under one mutex and one detached thread, started
 * with the first arm, that sleeps until the earliest of them and fires it.
 * Workload assumed: the timers armed at once are the models with a queued
 * request that has a deadline (tens), so a scan of the list is cheap.
 */
#include "sched/deadline.h"

#include <pthread.h>
#include <stddef.h>
#include <time.h>

#include "core/util.h"
#include "nereid/common.h"

static pthread_mutex_t timer_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t timer_once = PTHREAD_ONCE_INIT;
static pthread_cond_t timer_cond;      /* monotonic: an earlier timer was armed */
static pthread_cond_t timer_done_cond; /* a fire returned */
static sched_timer_t *armed;           /* lock */
static const sched_timer_t *firing;    /* lock: the timer whose fire runs now */
static uint64_t wake_ns;               /* lock: when the thread wakes; 0: not sleeping on time */
static bool started, start_failed;     /* lock */

static void timer_init(void)
{
    util_cond_init_monotonic(&timer_cond);
    pthread_cond_init(&timer_done_cond, NULL);
}

/* Unlinks t from the armed list if it is there (lock held). */
static void unlink_locked(sched_timer_t *t)
{
    for (sched_timer_t **pp = &armed; *pp; pp = &(*pp)->next)
        if (*pp == t) {
            *pp = t->next;
            break;
        }
    t->next = NULL;
    t->due_ns = 0;
}

static void *timer_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&timer_lock);
    for (;;) {
        sched_timer_t *first = NULL;
        for (sched_timer_t *t = armed; t; t = t->next)
            if (!first || t->due_ns < first->due_ns) first = t;
        uint64_t now = util_now_ns();
        if (first && first->due_ns <= now) {
            unlink_locked(first);
            firing = first;
            pthread_mutex_unlock(&timer_lock);
            first->fire(first);
            pthread_mutex_lock(&timer_lock);
            firing = NULL;
            pthread_cond_broadcast(&timer_done_cond);
            continue;
        }
        if (!first) {
            wake_ns = 0;
            pthread_cond_wait(&timer_cond, &timer_lock);
            continue;
        }
        wake_ns = first->due_ns;
        util_cond_wait_until(&timer_cond, &timer_lock, wake_ns);
        wake_ns = 0;
    }
    return NULL;
}

void sched_timer_arm(sched_timer_t *t, uint64_t due_ns)
{
    if (!due_ns) return;
    /* Deadlines within one tick share one call (a fire scans its queue). */
    if (due_ns <= UINT64_MAX - SCHED_TIMER_TICK_NS)
        due_ns = (due_ns + SCHED_TIMER_TICK_NS - 1) / SCHED_TIMER_TICK_NS * SCHED_TIMER_TICK_NS;
    pthread_once(&timer_once, timer_init);
    pthread_mutex_lock(&timer_lock);
    if (!started && !start_failed) {
        if (nereid_start_detached(timer_main, NULL)) {
            started = true;
        } else {
            /* Deadlines are then applied only when an instance looks at
             * its queue. */
            start_failed = true;
            LOG_ERROR("unable to start the scheduler deadline thread");
        }
    }
    if (!t->due_ns) {
        t->next = armed;
        armed = t;
        t->due_ns = due_ns;
    } else if (due_ns < t->due_ns) {
        t->due_ns = due_ns;
    } else {
        pthread_mutex_unlock(&timer_lock);
        return;
    }
    if (!wake_ns || due_ns < wake_ns) pthread_cond_signal(&timer_cond);
    pthread_mutex_unlock(&timer_lock);
}

void sched_timer_disarm(sched_timer_t *t)
{
    pthread_once(&timer_once, timer_init);
    pthread_mutex_lock(&timer_lock);
    if (t->due_ns) unlink_locked(t);
    while (firing == t)
        pthread_cond_wait(&timer_done_cond, &timer_lock);
    pthread_mutex_unlock(&timer_lock);
}
