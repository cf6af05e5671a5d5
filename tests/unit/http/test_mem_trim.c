/*
 * This file contains the unit tests of the HTTP frontend's memory trimmer
 * (src/http/mem_trim.c): it never trims without a request having ended,
 * trims once after requests stop (not again while nothing happens), trims
 * after notes from several threads at once, stops while asleep or while
 * waiting out a quiet period, and accepts NULL. Waits for a trim poll with a
 * generous deadline; the "never" checks only look after a pause.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "check.h"
#include "http/mem_trim.h"

#define QUIET_NS 20000000u /* 20 ms */

static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits (up to 10 s) until t has trimmed at least n times. */
static bool wait_trims(mem_trim_t *t, uint64_t n)
{
    for (int i = 0; i < 1000 && mem_trim_count(t) < n; i++)
        pause_ms(10);
    return mem_trim_count(t) >= n;
}

static void *noter(void *arg)
{
    for (int i = 0; i < 20000; i++)
        mem_trim_note(arg);
    return NULL;
}

int main(void)
{
    mem_trim_t *t = mem_trim_start(QUIET_NS);
    CHECK(t != NULL);
    pause_ms(100);
    CHECK_MSG(mem_trim_count(t) == 0, "trimmed %llu times without a request",
              (unsigned long long)mem_trim_count(t));

    mem_trim_note(t);
    CHECK(wait_trims(t, 1));
    pause_ms(100);
    CHECK_MSG(mem_trim_count(t) == 1, "trimmed %llu times after one request",
              (unsigned long long)mem_trim_count(t));

    pthread_t threads[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&threads[i], NULL, noter, t);
    for (int i = 0; i < 4; i++)
        pthread_join(threads[i], NULL);
    CHECK(wait_trims(t, 2));
    mem_trim_stop(t); /* asleep */

    t = mem_trim_start(5000000000u); /* 5 s: stopped during the quiet wait */
    mem_trim_note(t);
    pause_ms(20);
    mem_trim_stop(t);

    mem_trim_note(NULL);
    CHECK(mem_trim_count(NULL) == 0);
    mem_trim_stop(NULL);

    /* The shared trimmer: one for both frontends, stopped by the last
     * release; a later acquire starts a new one. */
    mem_trim_t *a = mem_trim_acquire(QUIET_NS), *b = mem_trim_acquire(5000000000u);
    CHECK(a != NULL && a == b);
    mem_trim_note(b);
    CHECK(wait_trims(a, 1)); /* the first acquire's quiet period */
    mem_trim_release(a);
    mem_trim_note(b); /* still running for b */
    CHECK(wait_trims(b, 2));
    mem_trim_release(b);
    mem_trim_t *c = mem_trim_acquire(QUIET_NS);
    CHECK(c != NULL && mem_trim_count(c) == 0);
    mem_trim_release(c);
    mem_trim_release(NULL);
    return check_summary();
}
