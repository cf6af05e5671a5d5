/*
 * This file contains the schedulers' shared deadline timer: one thread for
 * the whole process that calls a scheduler back when the earliest deadline
 * of a request it queues falls due, so that a queue can fail its expired
 * requests while every instance is busy (request_expired, request.h).
 * A scheduler embeds a sched_timer_t, arms it with the earliest deadline it
 * holds and, in fire, takes its expired requests out and arms it again for
 * the next deadline. A thousand idle models cost nothing: the thread starts
 * with the first deadline and only armed timers are looked at.
 */
#ifndef NEREID_SCHED_DEADLINE_H
#define NEREID_SCHED_DEADLINE_H

#include <stdbool.h>
#include <stdint.h>

/* A timer fires at most this late: deadlines within one tick share a call,
 * so a queue of requests with distinct deadlines is not scanned once per
 * request. */
#define SCHED_TIMER_TICK_NS 1000000u

typedef struct sched_timer sched_timer_t;

struct sched_timer {
    /* Called on the timer thread, no lock held, once the armed time has
     * come; the timer is disarmed by then (fire may arm it again). */
    void (*fire)(sched_timer_t *t);
    /* The timer's own (under its lock). */
    uint64_t due_ns; /* armed for this monotonic time; 0: not armed */
    sched_timer_t *next;
};

/* Arms t for due_ns (monotonic), or keeps it armed for an earlier time.
 * due_ns 0 does nothing. Thread: any; may hold the scheduler's lock (the
 * timer never calls fire with its own lock held). */
void sched_timer_arm(sched_timer_t *t, uint64_t due_ns);
/* Disarms t and waits for a fire of t that is running to return. After it,
 * t fires no more unless armed again: a scheduler stops arming before it
 * calls this (its stopped flag, checked under its lock in fire). Thread:
 * any but the timer's (never from fire). */
void sched_timer_disarm(sched_timer_t *t);

#endif
