/*
 * This file contains the reading of a worker's socket. One thread at
 * a time reads it: the reader thread between executes, execute's own
 * thread during one (execute_read_done, so the DONE reaches it without a
 * thread hand-off), or a readiness check that asks the model about itself
 * on the thread that reads (ready_pump). Each message goes where it
 * belongs: a reply (READY, DONE, FINALIZED) to the instance thread's
 * mailbox (deliver_reply), everything else — log lines, decoupled
 * responses, BLS calls, pb_utils calls, cancellation checks, readiness
 * answers — to its handler (dispatch). A socket error or a malformed
 * message ends the worker (worker_died) before the thread that found it
 * gives the socket up ("Ending the worker" below). "Arming the reader"
 * says how the socket passes between the reader thread and execute.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>

#include "python_internal.h"

/* The instance whose socket this thread reads (reader_main, or execute in
 * execute_read_done), and how deep in ready_pump it is. */
_Thread_local instance_t *tls_reading;
_Thread_local int tls_pump_depth;
_Thread_local bool tls_exec_reading; /* ... and it is execute */

static bool dispatch(instance_t *in, msg_t **m, char *why, size_t why_cap);
static bool deliver_reply(instance_t *in, msg_t **m, char *why, size_t why_cap);

/* A readiness check on the thread that reads the worker's socket (the
 * model asked about itself from execute or a thread of its own): reads and
 * serves the worker's messages until is_ready()'s answer (answers past
 * `seen`) or the deadline (false). Execute's DONE is kept for it; a broken
 * socket or a malformed message is left in in->pump_fail for the reading
 * loop, which ends the worker. */
bool ready_pump(instance_t *in, uint64_t seen, const struct timespec *dl)
{
    char why[512] = "";
    tls_pump_depth++;
    for (;;) {
        pthread_mutex_lock(&in->mu);
        bool answered = in->rq_answers != seen, failed = in->pump_fail != NULL;
        pthread_mutex_unlock(&in->mu);
        if (answered || failed) break;
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        long long ms =
            (long long)(dl->tv_sec - now.tv_sec) * 1000 + (dl->tv_nsec - now.tv_nsec) / 1000000;
        if (ms <= 0) {
            tls_pump_depth--;
            return false;
        }
        struct pollfd p = {in->chan->fd, POLLIN, 0};
        if (poll(&p, 1, (int)(ms > INT_MAX ? INT_MAX : ms)) <= 0) continue;
        msg_t *m;
        int rc = msg_recv_into(in->chan->fd, &in->rx, &m, why, sizeof why, MSG_DONTWAIT, in->rbuf);
        if (rc == 2) continue;
        bool ok = rc == 1;
        in->msgs_in += ok;
        if (ok && m->type == M_DONE && tls_exec_reading && !in->early_done) {
            in->early_done = m; /* execute_read_done takes it */
            m = NULL;
        } else if (ok && (m->type == M_READY || m->type == M_DONE || m->type == M_FINALIZED)) {
            ok = !tls_exec_reading && deliver_reply(in, &m, why, sizeof why);
            if (!ok && !why[0]) snprintf(why, sizeof why, "an unexpected reply");
        } else if (ok) {
            ok = dispatch(in, &m, why, sizeof why);
        }
        msg_free(m);
        if (!ok) {
            pthread_mutex_lock(&in->mu);
            if (!in->pump_fail) in->pump_fail = strdup(rc == 0 ? "" : why);
            pthread_cond_broadcast(&in->cv);
            pthread_mutex_unlock(&in->mu);
        }
        why[0] = '\0';
    }
    tls_pump_depth--;
    return true;
}

/* ---- The reader thread ---- */

/* Ending the worker. The thread that finds the worker broken or misbehaving
 * ends it (worker_died, which records the reason) while it still holds the
 * socket, and a thread that takes the socket after that reads nothing more
 * from it (in->reaped). Otherwise what the worker sent after the fault
 * could be read by the other thread first and blamed instead: garbage sent
 * by is_ready() while a check reads (ready_pump) fails the model's
 * is_model_ready() call, its execute returns, and the reader thread, given
 * the socket back, would read that DONE — expected by nobody — and end the
 * worker for "an unexpected reply" before execute ends it for the garbage. */

/* Handles a message that is not a reply (log, decoupled response,
 * cancellation check, BLS call), on whichever thread reads the socket.
 * Takes *m (sets it NULL when kept). false: the worker misbehaved. */
static bool dispatch(instance_t *in, msg_t **m, char *why, size_t why_cap)
{
    switch ((*m)->type) {
    case M_LOG:
        on_log(in, *m);
        return true;
    case M_RESPONSE:
        return on_response(in, *m, why, why_cap);
    case M_CANCEL_QUERY:
        on_cancel_query(in, *m);
        return true;
    case M_BLS_CALL:
        if (!bls_start(in, *m, why, why_cap)) return false;
        *m = NULL; /* the call owns it now */
        return true;
    case M_API_CALL:
        api_call(in, m);
        return true;
    case M_BLS_CANCEL:
        return bls_cancel(in, *m, why, why_cap);
    case M_READY_ANSWER:
        return on_ready_answer(in, *m, why, why_cap);
    default:
        snprintf(why, why_cap, "unknown message type %u", (*m)->type);
        return false;
    }
}

/* Hands a reply (READY / DONE / FINALIZED) to the instance thread waiting
 * for it; false (*why) when nobody waits for one of its type. */
static bool deliver_reply(instance_t *in, msg_t **m, char *why, size_t why_cap)
{
    bool ok = true;
    pthread_mutex_lock(&in->mu);
    if (in->reply || (*m)->type != in->expect) {
        ok = false;
        snprintf(why, why_cap, "an unexpected reply");
    } else {
        in->expect = 0;
        in->reply = *m;
        *m = NULL;
        pthread_cond_broadcast(&in->cv);
    }
    pthread_mutex_unlock(&in->mu);
    return ok;
}

/* Whether a readiness check that read the socket (ready_pump) found it
 * broken: its reason in why. */
static bool pump_failed(instance_t *in, char *why, size_t why_cap)
{
    pthread_mutex_lock(&in->mu);
    char *f = in->pump_fail;
    in->pump_fail = NULL;
    pthread_mutex_unlock(&in->mu);
    if (!f) return false;
    snprintf(why, why_cap, "%s", f);
    free(f);
    return true;
}

/* Arming the reader. The reader thread's registration of the socket is
 * EPOLLONESHOT: armed, the worker's next message (or hang-up) wakes the
 * reader once and disarms it; disarmed, a message wakes nobody but a thread
 * blocked in recvmsg. Execute reads the socket itself, so the registration
 * must be disarmed while it does, or the worker's DONE would wake the
 * reader too (a second wake-up, on another CPU, per request). Disarming and
 * re-arming around every execute is two epoll_ctl calls per request (4 µs
 * here); instead an execute leaves the registration disarmed when it ends,
 * and the reader arms it once no execute has run for LAZY_ARM_NS: while
 * requests keep coming, no epoll_ctl at all. The price is that a message
 * the worker sends between executes (a thread's log line, a decoupled
 * response, a BLS call) waits up to LAZY_ARM_NS to be read (up to 16 ms
 * after a long run of executes: the reader's looks back off,
 * lazy_arm_wait_ms); so an execute
 * re-arms at once when it ends for decoupled models, when the reader has
 * read such a message since the last execute (the model sends between
 * executes), and while the server waits for an answer outside execute
 * (is_ready(), BLS and model control calls in flight). Every change of
 * `armed` is made under in->mu, and only while no execute reads.
 * LAZY_ARM_NS and the back-off of the reader's looks: python_internal.h. */

/* Arms the registration (in->mu held; no execute reads). */
void reader_arm_locked(instance_t *in)
{
    in->lazy_checks = 0;
    if (in->armed) return;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLONESHOT, .data.fd = in->chan->fd};
    if (epoll_ctl(in->epfd, EPOLL_CTL_MOD, in->chan->fd, &ev) != 0)
        abort(); /* our own registration: cannot fail */
    in->armed = true;
}

/* Arms the registration unless an execute reads (that execute re-arms when
 * it ends, if anyone still waits): for a thread about to wait for a
 * message outside execute. */
void reader_arm(instance_t *in)
{
    pthread_mutex_lock(&in->mu);
    if (!in->exec_reading) reader_arm_locked(in);
    pthread_mutex_unlock(&in->mu);
}

/* The reader thread: serves the worker's messages between executes (during
 * one, the instance thread reads the socket itself and this thread stays
 * parked, so an answer reaches execute without a thread hand-off). */
void *reader_main(void *arg)
{
    instance_t *in = arg;
    char why[512] = "";
    for (;;) {
        int timeout_ms = -1;
        pthread_mutex_lock(&in->mu);
        if (!in->armed) { /* an execute left it disarmed: arm it once they stop */
            uint64_t idle_ns = in->exec_reading ? 0 : nereid_now_ns() - in->exec_end_ns;
            if (!in->exec_reading && idle_ns >= LAZY_ARM_NS)
                reader_arm_locked(in);
            else
                timeout_ms = lazy_arm_wait_ms(idle_ns, &in->lazy_checks);
        }
        pthread_mutex_unlock(&in->mu);
        struct epoll_event evs[2];
        int n = epoll_wait(in->epfd, evs, 2, timeout_ms);
        if (n < 0 && errno != EINTR) {
            snprintf(why, sizeof why, "epoll_wait failed: %s", strerror(errno));
            break;
        }
        bool readable = false;
        for (int i = 0; i < n; i++) {
            if (evs[i].data.fd == in->kickfd) {
                eventfd_t v;
                eventfd_read(in->kickfd, &v);
            } else {
                readable = true;
            }
        }
        if (!readable) continue;
        pthread_mutex_lock(&in->mu);
        in->armed = false; /* it fired */
        while (in->exec_reading)
            pthread_cond_wait(&in->cv, &in->mu);
        if (in->reaped) { /* execute ended the worker: nothing more is read */
            pthread_mutex_unlock(&in->mu);
            why[0] = '\0';
            break;
        }
        in->bg_in_recv = true;
        pthread_mutex_unlock(&in->mu);
        msg_t *m;
        int rc = msg_recv_into(in->chan->fd, &in->rx, &m, why, sizeof why, MSG_DONTWAIT, in->rbuf);
        bool ok = rc == 1;
        in->msgs_in += ok;
        tls_reading = in;
        if (ok && (m->type == M_READY || m->type == M_DONE || m->type == M_FINALIZED))
            ok = deliver_reply(in, &m, why, sizeof why);
        else if (ok)
            ok = dispatch(in, &m, why, sizeof why);
        tls_reading = NULL;
        msg_free(m);
        ok = ok && !pump_failed(in, why, sizeof why);
        bool ended = rc != 2 && !ok;
        if (ended) worker_died(in, why); /* before execute may read ("Ending the worker") */
        /* Only now may execute read: a decoupled sender's responses are sent
         * in order and never from two threads at once. */
        pthread_mutex_lock(&in->mu);
        in->bg_in_recv = false;
        if (rc == 1) in->eager_arm = true;
        if (!in->exec_reading && !ended && (rc == 1 || rc == 2))
            reader_arm_locked(in); /* the next one */
        pthread_cond_broadcast(&in->cv);
        pthread_mutex_unlock(&in->mu);
        if (ended) return NULL;
        why[0] = '\0';
    }
    worker_died(in, why);
    return NULL;
}

/* Execute takes the socket from the reader thread: a receive the reader
 * already started is waited for, and an armed registration is disarmed
 * (so the worker's messages wake the executing thread only); the reader is
 * kicked to arm it again once executes stop. */
void exec_reading_begin(instance_t *in)
{
    pthread_mutex_lock(&in->mu);
    in->exec_reading = true;
    while (in->bg_in_recv)
        pthread_cond_wait(&in->cv, &in->mu);
    /* Kicked unless the end re-arms it for sure. */
    bool kick = in->armed && !in->decoupled && !in->eager_arm;
    if (in->armed) {
        struct epoll_event ev = {.events = 0, .data.fd = in->chan->fd};
        if (epoll_ctl(in->epfd, EPOLL_CTL_MOD, in->chan->fd, &ev) != 0) abort();
        in->armed = false;
    }
    pthread_mutex_unlock(&in->mu);
    if (kick) eventfd_write(in->kickfd, 1); /* it may wait with no timeout */
}

/* Gives the socket back to the reader thread: re-armed at once when
 * messages are expected between executes, else by the reader later
 * ("Arming the reader"). */
void exec_reading_end(instance_t *in)
{
    pthread_mutex_lock(&in->mu);
    in->exec_reading = false;
    in->exec_end_ns = nereid_now_ns();
    if (in->decoupled || in->eager_arm || in->rq_inflight || in->bls_inflight)
        reader_arm_locked(in);
    in->eager_arm = false;
    pthread_cond_broadcast(&in->cv);
    pthread_mutex_unlock(&in->mu);
}

/* Execute's side: takes the socket from the reader thread, reads until the
 * worker's DONE (serving everything else on the way), spinning first until
 * spin_until_ns (0: not at all; *spun: whether it did, *hit: and saw a
 * message come, *contended: or stopped for another thread). NULL when the worker died or misbehaved
 * (it is then ended). */
msg_t *execute_read_done(instance_t *in, uint64_t spin_until_ns, bool *spun, bool *hit,
                         bool *contended)
{
    char why[512] = "";
    msg_t *done = NULL;
    tls_reading = in;
    tls_exec_reading = true;
    *spun = *hit = *contended = false;
    for (;;) {
        if (spin_until_ns) { /* before each message, until a spin runs out */
            int r = spin_wait(in, spin_until_ns);
            *spun = true;
            *hit = r == 1;
            *contended = r < 0;
            if (r != 1) spin_until_ns = 0;
        }
        msg_t *m;
        int rc = msg_recv_into(in->chan->fd, &in->rx, &m, why, sizeof why, 0, in->rbuf);
        if (rc <= 0) break;
        in->msgs_in++;
        if (m->type == M_DONE) {
            done = m;
            break;
        }
        bool ok = m->type != M_READY && m->type != M_FINALIZED;
        if (!ok)
            snprintf(why, sizeof why, "an unexpected reply");
        else
            ok = dispatch(in, &m, why, sizeof why);
        msg_free(m);
        if (ok && pump_failed(in, why, sizeof why)) ok = false;
        if (ok && in->early_done) { /* a readiness check read it */
            done = in->early_done;
            in->early_done = NULL;
            break;
        }
        if (!ok) break;
        why[0] = '\0';
    }
    tls_reading = NULL;
    tls_exec_reading = false;
    if (!done) { /* ended before the reader thread may read ("Ending the worker") */
        pthread_mutex_lock(&in->mu);
        if (in->reaped) why[0] = '\0'; /* the reader ended it: this read what was left */
        pthread_mutex_unlock(&in->mu);
        worker_died(in, why);
    }
    exec_reading_end(in);
    return done;
}
