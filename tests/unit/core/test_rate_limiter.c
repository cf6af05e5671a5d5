/*
 * This file contains unit tests of the rate limiter's core (src/core/
 * rate_limiter.c), driven step by step through its non-blocking calls:
 * default and explicit resource counts (Triton's documented examples),
 * its load errors, mutual exclusion per device and globally, the order of
 * turns by exec_count * priority, no overtaking, deferrals and their
 * expiry; and one blocking acquire across two threads.
 */
#include <pthread.h>
#include <sched.h>
#include <string.h>

#include "check.h"
#include "core/rate_limiter.h"

#define GLOBAL RATE_LIMITER_GLOBAL_DEVICE

/* Owners only need distinct addresses. */
static const char model_a[] = "a", model_b[] = "b", model_c[] = "c", model_g[] = "g";

static rate_limiter_instance_t *reg(rate_limiter_t *rl, const void *owner, int device,
                                    const rate_limiter_need_t *needs, size_t n, uint32_t priority)
{
    rate_limiter_instance_t *inst = NULL;
    nereid_error_t *err = rate_limiter_register(rl, owner, device, needs, n, priority, &inst);
    CHECK_MSG(err == NULL, "%s", err ? nereid_error_message(err) : "");
    nereid_error_free(err);
    return inst;
}

/* Unregisters insts (none staged or running) and frees rl. */
static void teardown(rate_limiter_t *rl, rate_limiter_instance_t *const *insts, size_t n)
{
    for (size_t i = 0; i < n; i++)
        rate_limiter_unregister(insts[i]);
    rate_limiter_free(rl);
}

/* rate_limiter.md: instances A, B, C on one device; each pool gets the
 * largest count any instance needs, and shrinks when it goes. */
static void test_default_counts(void)
{
    rate_limiter_t *rl = rate_limiter_new(NULL, 0);
    rate_limiter_need_t a[] = {{"R1", false, 4}, {"R2", false, 4}};
    rate_limiter_need_t b[] = {{"R2", false, 5}, {"R3", false, 10}, {"R4", false, 5}};
    rate_limiter_need_t c[] = {{"R1", false, 1}, {"R3", false, 7}, {"R4", false, 2}};
    rate_limiter_instance_t *ia = reg(rl, model_a, 0, a, 2, 0);
    rate_limiter_instance_t *ib = reg(rl, model_b, 0, b, 3, 0);
    rate_limiter_instance_t *ic = reg(rl, model_c, 0, c, 3, 0);
    CHECK(rate_limiter_capacity(rl, "R1", 0) == 4);
    CHECK(rate_limiter_capacity(rl, "R2", 0) == 5);
    CHECK(rate_limiter_capacity(rl, "R3", 0) == 10);
    CHECK(rate_limiter_capacity(rl, "R4", 0) == 5);
    CHECK(rate_limiter_capacity(rl, "R1", 1) == -1);
    rate_limiter_unregister(ib);
    CHECK(rate_limiter_capacity(rl, "R2", 0) == 4);
    CHECK(rate_limiter_capacity(rl, "R3", 0) == 7);
    CHECK(rate_limiter_capacity(rl, "R4", 0) == 2);
    rate_limiter_unregister(ia);
    rate_limiter_unregister(ic);
    CHECK(rate_limiter_capacity(rl, "R1", 0) == -1);
    rate_limiter_free(rl);
}

/* rate_limiter.md: --rate-limit-resource=R1:10 R2:5:0 R2:8:1 R3:2 with R3
 * global in a model: GLOBAL [R3: 2], device 0 [R1: 10, R2: 5], device 1
 * [R1: 10, R2: 8]. A name given twice for one device keeps the smaller. */
static void test_explicit_counts(void)
{
    nereid_rate_limit_resource_t given[] = {
        {"R1", 10, -1}, {"R2", 5, 0}, {"R2", 8, 1}, {"R3", 2, -1}, {"R1", 12, -1}};
    rate_limiter_t *rl = rate_limiter_new(given, 5);
    rate_limiter_need_t needs[] = {{"R1", false, 1}, {"R2", false, 1}, {"R3", true, 1}};
    rate_limiter_instance_t *d0 = reg(rl, model_a, 0, needs, 3, 1);
    rate_limiter_instance_t *d1 = reg(rl, model_a, 1, needs, 3, 1);
    CHECK(rate_limiter_capacity(rl, "R3", GLOBAL) == 2);
    CHECK(rate_limiter_capacity(rl, "R1", 0) == 10);
    CHECK(rate_limiter_capacity(rl, "R2", 0) == 5);
    CHECK(rate_limiter_capacity(rl, "R1", 1) == 10);
    CHECK(rate_limiter_capacity(rl, "R2", 1) == 8);
    rate_limiter_unregister(d0);
    rate_limiter_unregister(d1);
    rate_limiter_free(rl);
}

static void test_errors(void)
{
    rate_limiter_t *rl = rate_limiter_new(NULL, 0);
    rate_limiter_need_t local[] = {{"R", false, 1}}, global[] = {{"R", true, 1}};
    rate_limiter_instance_t *a = reg(rl, model_a, 0, local, 1, 1), *b = NULL;
    CHECK_ERROR(rate_limiter_register(rl, model_b, 0, global, 1, 1, &b), NEREID_ERROR_INVALID_ARG,
                "Resource \"R\" is present as both global and device-specific resource in the "
                "model configuration.");
    CHECK(b == NULL);
    rate_limiter_unregister(a);
    b = reg(rl, model_b, 0, global, 1, 1); /* fine once the per-device user is gone */
    rate_limiter_unregister(b);
    rate_limiter_free(rl);

    nereid_rate_limit_resource_t given[] = {{"R", 2, -1}};
    rl = rate_limiter_new(given, 1);
    rate_limiter_need_t three[] = {{"R", false, 3}}, other[] = {{"S", false, 1}};
    CHECK_ERROR(rate_limiter_register(rl, model_a, 0, three, 1, 1, &a), NEREID_ERROR_INVALID_ARG,
                "Resource count for \"R\" is limited to 2 which will prevent scheduling of one or "
                "more model instances, the minimum required count is 3");
    CHECK(a == NULL);
    /* Once counts are given, a resource that is not given has none. */
    CHECK_ERROR(rate_limiter_register(rl, model_a, 0, other, 1, 1, &a), NEREID_ERROR_INVALID_ARG,
                "Resource count for \"S\" is limited to 0");
    a = reg(rl, model_a, 0, local, 1, 1); /* the failures left nothing behind */
    CHECK(rate_limiter_capacity(rl, "R", 0) == 2);
    CHECK(rate_limiter_capacity(rl, "S", 0) == -1);
    rate_limiter_unregister(a);
    rate_limiter_free(rl);
}

/* Count 1: one at a time; count 2: two; other devices have their own
 * copies of a per-device resource, but share a global one. */
static void test_exclusion(void)
{
    nereid_rate_limit_resource_t given[] = {{"R", 2, 1}, {"R", 1, 0}, {"G", 1, -1}};
    rate_limiter_t *rl = rate_limiter_new(given, 3);
    rate_limiter_need_t r[] = {{"R", false, 1}}, g[] = {{"G", true, 1}};
    rate_limiter_instance_t *a0 = reg(rl, model_a, 0, r, 1, 1), *b0 = reg(rl, model_b, 0, r, 1, 1);
    rate_limiter_instance_t *a1 = reg(rl, model_a, 1, r, 1, 1), *b1 = reg(rl, model_b, 1, r, 1, 1);
    rate_limiter_instance_t *c1 = reg(rl, model_c, 1, r, 1, 1);
    CHECK(rate_limiter_try_acquire(a1)); /* device 1: its own two copies */
    CHECK(rate_limiter_try_acquire(b1));
    CHECK(rate_limiter_try_acquire(a0));
    CHECK(!rate_limiter_try_acquire(b0));
    rate_limiter_release(a0, false, false);
    CHECK(rate_limiter_running(b0));
    CHECK(!rate_limiter_try_acquire(c1));
    rate_limiter_release(b1, false, false);
    CHECK(rate_limiter_running(c1));
    rate_limiter_release(b0, false, false);
    rate_limiter_release(a1, false, false);
    rate_limiter_release(c1, false, false);

    rate_limiter_instance_t *g0 = reg(rl, model_g, 0, g, 1, 1), *g1 = reg(rl, model_g, 1, g, 1, 1);
    CHECK(rate_limiter_try_acquire(g0));
    CHECK(!rate_limiter_try_acquire(g1)); /* one global copy across devices */
    rate_limiter_release(g0, false, false);
    CHECK(rate_limiter_running(g1));
    rate_limiter_release(g1, false, false);
    rate_limiter_instance_t *all[] = {a0, b0, a1, b1, c1, g0, g1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        rate_limiter_unregister(all[i]);
    rate_limiter_free(rl);
}

/* Which of insts is running (exactly one expected), or -1. */
static int running_one(rate_limiter_instance_t **insts, int n)
{
    int found = -1;
    for (int i = 0; i < n; i++)
        if (rate_limiter_running(insts[i])) {
            if (found >= 0) return -2;
            found = i;
        }
    return found;
}

/* A (priority 1) and B (priority 2) share R (count 1) and always have work:
 * each finishing instance asks again at once, as an instance thread does.
 * B gets half of A's turns (Triton: exec_count * priority, lowest first). */
static void test_priority_ratio(uint32_t prio_a, uint32_t prio_b, int want_a, int want_b)
{
    rate_limiter_t *rl = rate_limiter_new(NULL, 0);
    rate_limiter_need_t r[] = {{"R", false, 1}};
    rate_limiter_instance_t *insts[] = {reg(rl, model_a, 0, r, 1, prio_a),
                                        reg(rl, model_b, 0, r, 1, prio_b)};
    CHECK(rate_limiter_try_acquire(insts[0]));
    CHECK(!rate_limiter_try_acquire(insts[1]));
    int turns[2] = {1, 0};
    for (int t = 1; t < 30; t++) {
        int who = running_one(insts, 2);
        CHECK_MSG(who >= 0, "turn %d: %d", t, who);
        if (who < 0) break;
        rate_limiter_release(insts[who], true, false);
        rate_limiter_try_acquire(insts[who]);
        int next = running_one(insts, 2);
        CHECK_MSG(next >= 0, "turn %d: %d", t, next);
        if (next < 0) break;
        turns[next]++;
    }
    CHECK_MSG(turns[0] == want_a && turns[1] == want_b, "priorities %u/%u: %d/%d turns", prio_a,
              prio_b, turns[0], turns[1]);
    int who = running_one(insts, 2);
    if (who >= 0) rate_limiter_release(insts[who], false, false);
    who = running_one(insts, 2);
    if (who >= 0) rate_limiter_release(insts[who], false, false);
    rate_limiter_unregister(insts[0]);
    rate_limiter_unregister(insts[1]);
    rate_limiter_free(rl);
}

/* L0_rate_limiter's cross-model case, turn by turn: A (priority 1) starts
 * alone, B (priority 2) asks during A's first turn, both always have work.
 * Triton counts each instance's INIT and WARM_UP payloads as executions
 * (A starts at 2, B at 2 * 2), stages the finishing instance again
 * (OnRelease) before it chooses, and its staged priority queue keeps the
 * earlier-staged instance on top on a tie: B runs after A's turns 2, 4,
 * 6, ... (from 0 counts it would run after A's turns 1, 2, 4, ..., one turn
 * more: L0_rate_limiter's 80/45 = 1.78 instead of 80/44 = 1.82). */
static void test_triton_turn_sequence(void)
{
    static const char want[] = "AABAABAABAABAABA";
    rate_limiter_t *rl = rate_limiter_new(NULL, 0);
    rate_limiter_need_t r[] = {{"R", false, 1}};
    rate_limiter_instance_t *insts[] = {reg(rl, model_a, 0, r, 1, 1), reg(rl, model_b, 0, r, 1, 2)};
    char got[sizeof want] = "A";
    CHECK(rate_limiter_try_acquire(insts[0]));
    CHECK(!rate_limiter_try_acquire(insts[1]));
    for (size_t t = 1; t + 1 < sizeof want; t++) {
        int who = running_one(insts, 2);
        CHECK_MSG(who >= 0, "turn %zu: %d", t, who);
        if (who < 0) break;
        rate_limiter_release(insts[who], true, false);
        rate_limiter_try_acquire(insts[who]);
        int next = running_one(insts, 2);
        CHECK_MSG(next >= 0, "turn %zu: %d", t, next);
        if (next < 0) break;
        got[t] = next ? 'B' : 'A';
    }
    CHECK_MSG(!strcmp(got, want), "turns %s, want %s", got, want);
    for (int i = 0; i < 2; i++) {
        int who = running_one(insts, 2);
        if (who >= 0) rate_limiter_release(insts[who], false, false);
    }
    rate_limiter_unregister(insts[0]);
    rate_limiter_unregister(insts[1]);
    rate_limiter_free(rl);
}

/* An instance released with more work takes its place in the order then
 * (Triton stages it in OnRelease), not when its thread asks: B, whose
 * thread is back first, still waits for A, which comes before it. */
static void test_released_keeps_its_place(void)
{
    rate_limiter_t *rl = rate_limiter_new(NULL, 0);
    rate_limiter_need_t r[] = {{"R", false, 1}};
    rate_limiter_instance_t *a = reg(rl, model_a, 0, r, 1, 1), *b = reg(rl, model_b, 0, r, 1, 2);
    CHECK(rate_limiter_try_acquire(a));
    CHECK(!rate_limiter_try_acquire(b));  /* b: 2 * 2 */
    rate_limiter_release(a, true, false); /* a: 3 < 4 */
    CHECK(!rate_limiter_running(b));
    CHECK(rate_limiter_try_acquire(a));
    rate_limiter_release(a, true, false); /* a: 4, b staged first: b */
    CHECK(rate_limiter_running(b));
    rate_limiter_release(b, true, false); /* b: 3 * 2; a (4) not back yet */
    CHECK(!rate_limiter_try_acquire(b));
    CHECK(rate_limiter_try_acquire(a));
    CHECK(rate_limiter_staged(b));
    rate_limiter_release(a, false, false);
    CHECK(rate_limiter_running(b));
    rate_limiter_release(b, false, false);
    teardown(rl, (rate_limiter_instance_t *[]){a, b}, 2);
}

/* Warmup executions are not counted (Triton runs every warmup sample in one
 * WARM_UP payload, counted in RATE_LIMITER_STARTUP_TURNS): after three
 * warmup runs A (2) still comes before B (3). */
static void test_warmup_not_counted(void)
{
    rate_limiter_t *rl = rate_limiter_new(NULL, 0);
    rate_limiter_need_t r[] = {{"R", false, 1}};
    rate_limiter_instance_t *holder = reg(rl, model_g, 0, r, 1, 1);
    rate_limiter_instance_t *a = reg(rl, model_a, 0, r, 1, 1), *b = reg(rl, model_b, 0, r, 1, 1);
    for (int i = 0; i < 3; i++) {
        CHECK(rate_limiter_try_acquire(a));
        rate_limiter_release(a, false, true);
    }
    CHECK(rate_limiter_try_acquire(b));
    rate_limiter_release(b, false, false);
    CHECK(rate_limiter_try_acquire(holder));
    CHECK(!rate_limiter_try_acquire(b));
    CHECK(!rate_limiter_try_acquire(a));
    rate_limiter_release(holder, false, false);
    CHECK(rate_limiter_running(a) && !rate_limiter_running(b));
    rate_limiter_release(a, false, false);
    CHECK(rate_limiter_running(b));
    rate_limiter_release(b, false, false);
    teardown(rl, (rate_limiter_instance_t *[]){holder, a, b}, 3);
}

/* The first in turn order waits for its resource; a later one that would
 * fit waits behind it (no overtaking). */
static void test_no_overtaking(void)
{
    rate_limiter_t *rl = rate_limiter_new(NULL, 0);
    rate_limiter_need_t r[] = {{"R", false, 1}}, s[] = {{"S", false, 1}};
    rate_limiter_instance_t *holder = reg(rl, model_g, 0, r, 1, 1);
    rate_limiter_instance_t *a = reg(rl, model_a, 0, r, 1, 1), *b = reg(rl, model_b, 0, s, 1, 1);
    CHECK(rate_limiter_try_acquire(holder));
    CHECK(!rate_limiter_try_acquire(a));
    CHECK(!rate_limiter_try_acquire(b)); /* S is free, but a comes first */
    rate_limiter_release(holder, false, false);
    CHECK(rate_limiter_running(a) && rate_limiter_running(b));
    rate_limiter_release(a, false, false);
    rate_limiter_release(b, false, false);
    teardown(rl, (rate_limiter_instance_t *[]){holder, a, b}, 3);
}

/* A finishing instance with more work defers the choice while it comes first;
 * its own return, a sibling's, or the expiry ends the deferral. */
static void test_deferral(void)
{
    rate_limiter_t *rl = rate_limiter_new(NULL, 0);
    rate_limiter_need_t r[] = {{"R", false, 1}};
    rate_limiter_instance_t *a1 = reg(rl, model_a, 0, r, 1, 1), *a2 = reg(rl, model_a, 0, r, 1, 1);
    rate_limiter_instance_t *b = reg(rl, model_b, 0, r, 1, 4);
    CHECK(rate_limiter_try_acquire(b));
    CHECK(!rate_limiter_try_acquire(a1));
    rate_limiter_release(b, false, false);
    CHECK(rate_limiter_running(a1));
    CHECK(!rate_limiter_try_acquire(b));   /* b: 3 * 4, a1: 2 */
    rate_limiter_release(a1, true, false); /* a1 would win: deferred */
    CHECK(!rate_limiter_running(b));
    CHECK(rate_limiter_try_acquire(a1));   /* back at once, and first */
    rate_limiter_release(a1, true, false); /* 4 < 12: deferred again */
    CHECK(!rate_limiter_running(b));
    CHECK(rate_limiter_try_acquire(a2)); /* its sibling took the work */
    rate_limiter_release(a2, true, false);
    rate_limiter_expire_deferrals(rl); /* nobody came back */
    CHECK(rate_limiter_running(b));
    rate_limiter_release(b, true, false); /* deferred, but a1 (4) comes before b (16) */
    CHECK(rate_limiter_try_acquire(a1));
    rate_limiter_release(a1, false, false); /* no more work: no deferral */
    CHECK(rate_limiter_try_acquire(b));
    rate_limiter_release(b, false, false);
    rate_limiter_unregister(a1);
    rate_limiter_unregister(a2);
    rate_limiter_unregister(b);
    rate_limiter_free(rl);
}

static void *acquire_main(void *arg)
{
    rate_limiter_acquire(arg);
    return NULL;
}

/* A thread blocked in rate_limiter_acquire runs once the holder releases;
 * a deferral nobody claims lapses by itself (the waiter's timed wait). */
static void test_blocking(void)
{
    rate_limiter_t *rl = rate_limiter_new(NULL, 0);
    rate_limiter_need_t r[] = {{"R", false, 1}};
    rate_limiter_instance_t *a = reg(rl, model_a, 0, r, 1, 1), *b = reg(rl, model_b, 0, r, 1, 5);
    rate_limiter_acquire(a);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, acquire_main, b) == 0);
    rate_limiter_release(a, false, false);
    pthread_join(t, NULL);
    CHECK(rate_limiter_running(b));
    rate_limiter_release(b, false, false); /* b: 3 turns * 5 */
    rate_limiter_acquire(a);               /* a: 3 turns * 1 */
    CHECK(pthread_create(&t, NULL, acquire_main, b) == 0);
    /* Once b waits, a finishes with work and would win: deferred, but a
     * never asks again. */
    while (!rate_limiter_staged(b))
        sched_yield();
    rate_limiter_release(a, true, false);
    pthread_join(t, NULL);
    CHECK(rate_limiter_running(b));
    rate_limiter_release(b, false, false);
    rate_limiter_unregister(a);
    rate_limiter_unregister(b);
    rate_limiter_free(rl);
}

int main(void)
{
    test_default_counts();
    test_explicit_counts();
    test_errors();
    test_exclusion();
    test_priority_ratio(1, 2, 20, 10);
    test_priority_ratio(1, 1, 15, 15);
    test_priority_ratio(0, 3, 23, 7); /* priority 0 counts as 1; B starts 2 * 3 */
    test_triton_turn_sequence();
    test_warmup_not_counted();
    test_released_keeps_its_place();
    test_no_overtaking();
    test_deferral();
    test_blocking();
    return check_summary();
}
