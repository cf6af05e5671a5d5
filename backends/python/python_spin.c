/*
 * This file contains spin-wait: execute's thread watching a word the
 * worker counts its messages in, instead of sleeping in recvmsg, for an
 * answer that comes in tens of µs; the budget, the back-off, and the page
 * the word lives in (sent to each new worker). Described below.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "nereid/common.h"
#include "python_internal.h"

/* ---- spin-wait: waiting for the worker's answer without sleeping ----
 *
 * A worker answers a small execute in tens of µs; a thread that blocks in
 * recvmsg for that answer sleeps, and waking it costs several µs (more when
 * its CPU went idle on a virtual machine). So execute's thread first watches a word in a page it
 * shares with the worker (M_SPIN_PAGE, sent at the worker's start only when
 * spin-wait-us > 0): the worker writes there how many messages it has sent,
 * after each sendmsg. While that is not more than the server has received,
 * the thread spins (pause, no syscall; sched_yield now and then, so a
 * runnable thread on its CPU is not kept waiting), at most until a budget,
 * then blocks in recvmsg as before. The word is only a hint: a worker that
 * writes nonsense makes the server spin for nothing or not at all, never
 * read a message that is not there.
 *
 * Budget: spin-wait-us, or 1.5x the median EXECUTE -> DONE time of the
 * instance's last SPIN_RECENT executes that spun when that is shorter. An
 * instance whose median is longer than spin-wait-us does not spin (it
 * probes one execute in SPIN_PROBE_EVERY); SPIN_MISSES_MAX spins in a row
 * that ran out stop spinning for SPIN_PROBE_EVERY executes, and so do
 * SPIN_CONTENDED_MAX spins in a row that another thread interrupted
 * (spin_wait). No spin unless this
 * is the only Python execute in flight in the process, for one request
 * (spin_hint_set), nor when the instance's previous execute ended under
 * SPIN_MIN_GAP_NS ago (requests queue: the CPU has other work).
 *
 * The worker's side: the page also carries a hint the server writes before
 * each EXECUTE, how long the worker may spin for its next request once it
 * has answered this one (spin-wait-us when this execute is alone, else 0);
 * the worker spins at most that, and stops (and backs off) when threads
 * wait for a CPU (nereid_stub/channel.py, spin_recv). That side is
 * what lowers the latency (it removes the worker's wake-up for EXECUTE).
 *
 * On by default (200 µs) where the process may use 2 CPUs or more: with the
 * hint and the worker's load check it lowers the latency at 1 connection
 * and keeps the throughput at 4 (docs/performance.md, "Merged main,
 * session 12"). */
#define SPIN_PROBE_EVERY 32
#define SPIN_MIN_GAP_NS (15 * 1000)
#define SPIN_CONTENDED_NS (4 * 1000)
#define SPIN_MISSES_MAX 4
#define SPIN_CONTENDED_MAX 2 /* interrupted spins in a row that stop spinning */

atomic_int g_executing; /* python executes in flight in the process */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* This execute's spin budget (ns; 0: block at once). Execute's thread. */
uint64_t spin_budget_ns(instance_t *in, uint64_t now_ns, bool alone)
{
    uint64_t max = g_backend->spin_max_ns;
    if (!max || !in->spin.word) return 0;
    if (in->spin.skip) {
        in->spin.skip--;
        return 0;
    }
    if (!alone) return 0;
    /* exec_end_ns is written by executes only (under mu, for the reader) */
    if (now_ns - in->exec_end_ns < SPIN_MIN_GAP_NS) return 0; /* requests queue: CPU is busy */
    if (in->spin.n < SPIN_RECENT) return max;                 /* still learning */
    uint64_t sorted[SPIN_RECENT];
    memcpy(sorted, in->spin.recent_ns, sizeof sorted);
    qsort(sorted, SPIN_RECENT, sizeof *sorted, cmp_u64);
    uint64_t median = sorted[SPIN_RECENT / 2];
    if (median > max) { /* too slow to wait for spinning: probe now and then */
        in->spin.skip = SPIN_PROBE_EVERY - 1;
        return max;
    }
    return median * 3 / 2 < max ? median * 3 / 2 : max;
}

/* Tells the worker, before EXECUTE, whether it may spin for its next
 * request once it has answered this one: only when this is the only
 * Python execute in flight in the process, for one request (else the CPU
 * it would spin on is wanted by another instance's worker and the threads
 * that feed it). The worker adds its own checks (Worker.spin_recv).
 * Execute's thread. */
void spin_hint_set(instance_t *in, bool alone)
{
    if (!in->spin.hint) return;
    uint64_t us = alone ? g_backend->spin_max_ns / 1000 : 0;
    in->spin.hints += us != 0;
    atomic_store_explicit(in->spin.hint, us, memory_order_relaxed); /* sendmsg orders it */
}

/* Records how an execute that spun went: its EXECUTE -> DONE time, and
 * whether the answer came while spinning or another thread wanted the CPU
 * (then, the second time in a row, no spin for SPIN_PROBE_EVERY executes:
 * a lone interruption, e.g. a timer's thread run once, is not contention,
 * and backing off for it lost a third of the spins at FP32[65536], where the reader
 * thread's lazy re-arm check, every ~2 ms, came every few requests;
 * docs/performance.md, "The server's spin, interrupted"). */
void spin_record(instance_t *in, uint64_t took_ns, bool hit, bool contended)
{
    in->spin.recent_ns[in->spin.n++ % SPIN_RECENT] = took_ns;
    in->spin.hits += hit;
    in->spin.misses_in_row = hit ? 0 : in->spin.misses_in_row + 1;
    in->spin.contended_in_row = contended ? in->spin.contended_in_row + 1 : 0;
    if (in->spin.contended_in_row >= SPIN_CONTENDED_MAX ||
        in->spin.misses_in_row >= SPIN_MISSES_MAX) {
        in->spin.misses_in_row = 0;
        in->spin.contended_in_row = 0;
        in->spin.skip = SPIN_PROBE_EVERY;
    }
}

/* Spins until the worker has sent a message not received yet (1), until_ns
 * passed (0), or another thread wanted this CPU (-1: a sched_yield, or the
 * time between two checks, took over SPIN_CONTENDED_NS, and the worker's
 * message has not come meanwhile). */
int spin_wait(const instance_t *in, uint64_t until_ns)
{
    const _Atomic uint64_t *w = in->spin.word;
    uint64_t last = nereid_now_ns();
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(w, memory_order_acquire) > in->msgs_in) return 1;
        nereid_cpu_relax();
        if (i % 32 == 0) {
            uint64_t now = nereid_now_ns();
            bool away = now - last > SPIN_CONTENDED_NS; /* this thread was preempted */
            if (!away && i % 64 == 0) { /* a thread that wants this CPU runs meanwhile */
                sched_yield();
                uint64_t after = nereid_now_ns();
                away = after - now > SPIN_CONTENDED_NS;
                now = after;
            }
            /* The thread that ran meanwhile may have been the worker itself
             * (woken on this CPU): then its answer is there. */
            if (away) return atomic_load_explicit(w, memory_order_acquire) > in->msgs_in ? 1 : -1;
            if (now >= until_ns) return 0;
            last = now;
        }
    }
}

/* The page for the word, sent to a new worker before INIT (a payload in a
 * memfd, as any large message: JSON {"spin_us":N} padded to 24 bytes, then
 * a 16-byte blob: the worker's word, and the hint the server writes before
 * each EXECUTE). Sealed against shrinking: the worker cannot make the
 * server's reads fault. Without it (spin-wait-us=0, or no memory) neither
 * side ever spins. */
void spin_page_send(instance_t *in)
{
    if (!g_backend->spin_max_ns) return;
    int fd = memfd_create("nereid-python-spin", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return;
    void *map = MAP_FAILED;
    if (ftruncate(fd, SPIN_PAGE_BYTES) == 0 &&
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
        map = mmap(NULL, SPIN_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED) {
        /* JSON {"spin_us":N} padded to SPIN_JSON_BYTES: the worker spins as
         * long for its next message (the word follows, 8-byte aligned) */
        char js[SPIN_JSON_BYTES + 1];
        int n = snprintf(js, sizeof js, "{\"spin_us\":%llu}",
                         (unsigned long long)(g_backend->spin_max_ns / 1000));
        memset(js + n, ' ', SPIN_JSON_BYTES - (size_t)n);
        memcpy(map, js, SPIN_JSON_BYTES);
        uint8_t hdr[HDR_BYTES];
        hdr_pack(hdr, M_SPIN_PAGE, SPIN_JSON_BYTES, 16);
        if (send_with_fd(in->chan, hdr, fd) == 0) {
            in->spin.map = map;
            in->spin.word = (const _Atomic uint64_t *)((uint8_t *)map + SPIN_JSON_BYTES);
            in->spin.hint = (_Atomic uint64_t *)((uint8_t *)map + SPIN_JSON_BYTES + 8);
        } else {
            munmap(map, SPIN_PAGE_BYTES);
        }
    }
    close(fd);
}

void spin_page_drop(instance_t *in)
{
    if (in->spin.map) munmap(in->spin.map, SPIN_PAGE_BYTES);
    in->spin.map = NULL;
    in->spin.word = NULL;
    in->spin.hint = NULL;
}
