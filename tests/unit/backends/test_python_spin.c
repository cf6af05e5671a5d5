/*
 * This file contains unit tests of the python backend's spin-wait
 * (backends/python/python_spin.c, included here with the wire file it
 * uses): the spin budget and its back-off; the reader thread's looks at
 * its registration between executes and their back-off.
 */
#include "../../../backends/python/python_spin.c"
#include "../../../backends/python/python_wire.c"

#include "check.h"

backend_state_t *g_backend; /* python.c's: set by the test */

/* spin-wait's back-off: an interrupted spin stops the spinning only when
 * the spin before it was interrupted too (a lone interruption, such as
 * the reader thread's periodic check running once, is not contention);
 * SPIN_MISSES_MAX spins in a row that ran out stop it as before. */
static void test_spin_back_off(void)
{
    backend_state_t bs = {.spin_max_ns = 200 * 1000};
    backend_state_t *saved = g_backend;
    g_backend = &bs;
    _Atomic uint64_t word = 0;
    instance_t in = {.spin.word = &word};
    uint64_t now = 1000 * 1000 * 1000;
    CHECK(spin_budget_ns(&in, now, true) == bs.spin_max_ns); /* still learning */
    for (int i = 0; i < SPIN_RECENT; i++)
        spin_record(&in, 20 * 1000, true, false);
    CHECK(spin_budget_ns(&in, now, true) == 30 * 1000); /* 1.5 x the median */
    /* interrupted once, answered meanwhile or not: the next execute spins */
    spin_record(&in, 20 * 1000, true, true);
    CHECK(in.spin.skip == 0 && spin_budget_ns(&in, now, true) != 0);
    spin_record(&in, 20 * 1000, false, false);
    spin_record(&in, 20 * 1000, false, true);
    CHECK(in.spin.skip == 0 && spin_budget_ns(&in, now, true) != 0);
    spin_record(&in, 20 * 1000, true, false); /* not interrupted: the count starts again */
    spin_record(&in, 20 * 1000, true, true);
    CHECK(in.spin.skip == 0);
    /* interrupted twice in a row: no spin for SPIN_PROBE_EVERY executes */
    spin_record(&in, 20 * 1000, true, true);
    CHECK(in.spin.skip == SPIN_PROBE_EVERY);
    for (int i = 0; i < SPIN_PROBE_EVERY; i++)
        CHECK(spin_budget_ns(&in, now, true) == 0);
    CHECK(spin_budget_ns(&in, now, true) != 0);
    /* SPIN_MISSES_MAX spins in a row that ran out */
    for (int i = 0; i < SPIN_MISSES_MAX - 1; i++)
        spin_record(&in, 20 * 1000, false, false);
    CHECK(in.spin.skip == 0);
    spin_record(&in, 20 * 1000, false, false);
    CHECK(in.spin.skip == SPIN_PROBE_EVERY);
    /* never for an execute that is not alone */
    in.spin.skip = 0;
    CHECK(spin_budget_ns(&in, now, false) == 0);
    g_backend = saved;
}

/* The reader's looks while executes keep coming: 2, 4, 8, then 16 ms
 * apart, less the time since the last execute ended; at least 1 ms; arming
 * (reader_arm_locked zeroes the count) starts again from 2 ms. */
static void test_lazy_arm_back_off(void)
{
    unsigned checks = 0;
    CHECK(lazy_arm_wait_ms(0, &checks) == 2 && checks == 1);
    CHECK(lazy_arm_wait_ms(0, &checks) == 4 && checks == 2);
    CHECK(lazy_arm_wait_ms(500 * 1000, &checks) == 8); /* 7.5 ms, rounded up */
    CHECK(lazy_arm_wait_ms(0, &checks) == 16 && checks == LAZY_ARM_SHIFT_MAX);
    CHECK(lazy_arm_wait_ms(0, &checks) == 16 && checks == LAZY_ARM_SHIFT_MAX);
    CHECK(lazy_arm_wait_ms(20ull * 1000 * 1000, &checks) == 1); /* overdue: soon */
    checks = 0;
    CHECK(lazy_arm_wait_ms(1500 * 1000, &checks) == 1);
}

int main(void)
{
    test_spin_back_off();
    test_lazy_arm_back_off();
    return check_summary();
}
