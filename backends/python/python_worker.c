/*
 * This file contains the start and the end of a model instance's
 * worker process, as Triton python_backend's stub_launcher does it: a
 * socketpair and a python3 running nereid_python_stub.py — spawned, or
 * forked by the zygote (one pre-started python3 with numpy and pb_utils
 * imported, below) — the spin page and the reader thread, INIT and its
 * READY (worker_start, worker_init), the one-slot mailbox the instance
 * thread waits on for a reply (expect_reply, wait_reply), and the worker's
 * end: worker_died when it died or misbehaved (its requests and decoupled
 * senders fail: "Stub process ... is not healthy"), worker_stop when the
 * server ends it, and its restart (worker_restart, "Restarts" below).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/pidfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "python_internal.h"

extern char **environ;

nereid_error_t *unhealthy(instance_t *in)
{
    pthread_mutex_lock(&in->mu);
    if (in->aborted) {
        pthread_mutex_unlock(&in->mu);
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "Stub process '%s' is not healthy: it was ended because its "
                                "execution made no progress (--model-progress-timeout-secs)",
                                in->name);
    }
    nereid_error_t *e =
        in->death ? nereid_error_new(NEREID_ERROR_INTERNAL,
                                     "Stub process '%s' is not healthy: it sent an invalid "
                                     "message: %s",
                                     in->name, in->death)
                  : nereid_error_new(NEREID_ERROR_INTERNAL, "Stub process '%s' is not healthy.",
                                     in->name);
    pthread_mutex_unlock(&in->mu);
    return e;
}

/* ---- Restarts ----
 *
 * A worker that dies (killed, crashed, ended by the progress watchdog, or
 * ended for a protocol error) leaves the instance not ready
 * (nereid_backend_instance_ready: dead, restarting or restart_failed), and
 * with it the model and, under --strict-readiness, the server, as Triton's
 * TRITONBACKEND_ModelInstanceReady ("Stub process '<instance>' is not
 * healthy."). When it is replaced is --backend-config=python,
 * restart-worker: eager (the default), as soon as its death is seen (the
 * reader thread's hang-up or execute); on-request, by the next execute;
 * never (Triton 25.x+: requests fail until the model is loaded again).
 * A worker the progress watchdog ended (aborted) is replaced at once
 * whatever the setting. An eager restart runs on a thread of its own that
 * takes life_mu (so it waits for an execute in flight to return) and
 * starts a new worker with the instance's INIT. A failed restart is logged
 * and keeps the instance not ready; the next execute tries again (unless
 * never). A worker ended on
 * purpose — at fini (closing), or a restart's own failed start
 * (restarting) — or one that never served (restartable false) is not
 * restarted. */

static void *restart_main(void *arg)
{
    instance_t *in = arg;
    pthread_mutex_lock(&in->life_mu);
    pthread_mutex_lock(&in->mu);
    bool go = !in->closing && (in->dead || !in->reader_running); /* execute did not already */
    pthread_mutex_unlock(&in->mu);
    if (go) nereid_error_free(worker_restart(in));
    pthread_mutex_unlock(&in->life_mu);
    pthread_mutex_lock(&in->mu);
    in->restart_queued = false;
    pthread_cond_broadcast(&in->cv);
    pthread_mutex_unlock(&in->mu);
    return NULL;
}

/* Queues a restart of in's dead worker unless one is queued or runs, or
 * the worker's end was meant. */
static void restart_soon(instance_t *in)
{
    pthread_mutex_lock(&in->mu);
    bool go = in->restartable && !in->closing && !in->restarting && !in->restart_queued &&
              (g_backend->restart == RESTART_EAGER || in->aborted);
    if (go) in->restart_queued = true;
    pthread_mutex_unlock(&in->mu);
    if (!go) return;
    plog('E', "python backend: the worker of '%s' ended; restarting it (not ready until then)",
         in->name);
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, restart_main, in);
    pthread_attr_destroy(&attr);
    if (rc != 0) { /* the next execute restarts it */
        pthread_mutex_lock(&in->mu);
        in->restart_queued = false;
        pthread_cond_broadcast(&in->cv);
        pthread_mutex_unlock(&in->mu);
    }
}

/* Replaces the dead worker (the caller holds life_mu: the restart thread
 * or execute). NULL when the new worker is ready. */
nereid_error_t *worker_restart(instance_t *in)
{
    pthread_mutex_lock(&in->mu);
    in->restarting = true;
    pthread_mutex_unlock(&in->mu);
    worker_stop(in);
    msg_t *ready = NULL;
    nereid_error_t *e = worker_start(in, in->init_json, &ready);
    msg_free(ready);
    pthread_mutex_lock(&in->mu);
    in->restarting = false;
    in->restart_failed = e != NULL;
    pthread_mutex_unlock(&in->mu);
    if (e)
        plog('E', "python backend: restarting the worker of '%s' failed: %s", in->name,
             nereid_error_message(e));
    else
        plog('I', "python backend: restarted the worker of '%s'", in->name);
    return e;
}

/* fini: no restart from now on; waits for a restart thread to end. */
void worker_closing(instance_t *in)
{
    pthread_mutex_lock(&in->mu);
    in->closing = true;
    while (in->restart_queued)
        pthread_cond_wait(&in->cv, &in->mu);
    pthread_mutex_unlock(&in->mu);
}

/* The worker is gone or misbehaved: end it (once) and everything it held. */
void worker_died(instance_t *in, const char *why)
{
    if (why[0]) plog('E', "python backend: worker of '%s': %s", in->name, why);
    pthread_mutex_lock(&in->mu);
    bool first = !in->reaped;
    in->reaped = true;
    /* The first reason wins: recorded before the kill, whose hang-up
     * another reading thread may report while this one waits. */
    if (why[0] && !in->death) in->death = strdup(why);
    pthread_mutex_unlock(&in->mu);
    if (first && in->pidfd >= 0) { /* the zygote reaps it; its end is seen here */
        pidfd_send_signal(in->pidfd, SIGKILL, NULL, 0);
        struct pollfd p = {in->pidfd, POLLIN, 0};
        while (poll(&p, 1, -1) < 0 && errno == EINTR) {
        }
    } else if (first) {
        kill(in->pid, SIGKILL);
        while (waitpid(in->pid, NULL, 0) < 0 && errno == EINTR) {
        }
    }
    python_api_reset(in->api); /* the worker's metric objects are gone */
    pthread_mutex_lock(&in->mu);
    in->dead = true;
    in->rq_inflight = false; /* its is_ready() answer will not come */
    sender_slot_t *senders = in->senders;
    in->senders = NULL;
    pthread_cond_broadcast(&in->cv);
    pthread_mutex_unlock(&in->mu);
    if (first) restart_soon(in);
    while (senders) {
        sender_slot_t *next = senders->next;
        nereid_error_free(
            nereid_sender_send(senders->sender, NEREID_RESPONSE_FLAG_FINAL, unhealthy(in)));
        free(senders);
        senders = next;
    }
}

/* The core's progress watchdog found this instance's execute stuck (ABI
 * 1.11): kill the worker. The reading thread sees it end (worker_died), the
 * execute and its requests fail with unhealthy()'s text, and the next
 * execute starts a new worker. */
NEREID_EXPORT nereid_error_t *nereid_backend_instance_abort(nereid_instance_t *instance)
{
    instance_t *in = nereid_instance_state(instance);
    if (!in) return NULL;
    pthread_mutex_lock(&in->mu);
    if (in->dead || in->reaped || (in->pidfd < 0 && in->pid <= 0)) { /* no worker to end */
        pthread_mutex_unlock(&in->mu);
        return NULL;
    }
    in->aborted = true;
    if (in->pidfd >= 0) /* a pidfd names its process even after it was reaped */
        pidfd_send_signal(in->pidfd, SIGKILL, NULL, 0);
    else
        kill(in->pid, SIGKILL); /* not reaped: the pid is still the worker's */
    pthread_mutex_unlock(&in->mu);
    plog('E', "python backend: worker of '%s' killed: its execution made no progress", in->name);
    return NULL;
}

/* Announces the reply the next message sent asks for: any other reply,
 * or one nobody waits for, is a protocol error. */
void expect_reply(instance_t *in, uint32_t type)
{
    pthread_mutex_lock(&in->mu);
    in->expect = type;
    pthread_mutex_unlock(&in->mu);
}

/* Waits for the worker's reply of type want (or its end). timeout_s 0 =
 * no limit. NULL when the worker died or the time ran out. */
msg_t *wait_reply(instance_t *in, uint32_t want, long timeout_s)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_s;
    pthread_mutex_lock(&in->mu);
    while (!in->reply && !in->dead) {
        if (timeout_s) {
            if (pthread_cond_timedwait(&in->cv, &in->mu, &dl) == ETIMEDOUT) break;
        } else {
            pthread_cond_wait(&in->cv, &in->mu);
        }
    }
    msg_t *m = in->reply;
    in->reply = NULL;
    in->expect = 0;
    pthread_mutex_unlock(&in->mu);
    if (m && m->type != want) {
        msg_free(m);
        m = NULL;
    }
    return m;
}

/* Ends the current worker (if any) and joins its reader. */

void worker_stop(instance_t *in)
{
    if (!in->reader_running) return;
    shutdown(in->chan->fd, SHUT_RDWR);
    pthread_mutex_lock(&in->mu);
    reader_arm_locked(in);    /* the hang-up wakes the reader (no execute reads now) */
    in->has_is_ready = false; /* readiness checks stop using in->chan */
    if (in->pidfd >= 0)       /* a pidfd names its process even after it was reaped */
        pidfd_send_signal(in->pidfd, SIGKILL, NULL, 0);
    else if (!in->reaped)
        kill(in->pid, SIGKILL); /* once reaped, the pid may be another's */
    pthread_mutex_unlock(&in->mu);
    pthread_join(in->reader, NULL);
    in->reader_running = false;
    close(in->epfd);
    in->epfd = -1;
    close(in->kickfd);
    in->kickfd = -1;
    spin_page_drop(in);
    body_forget(in);
    if (in->pidfd >= 0) close(in->pidfd);
    in->pidfd = -1;
    chan_unref(in->chan);
    in->chan = NULL;
    pthread_mutex_lock(&in->mu);
    msg_free(in->reply);
    in->reply = NULL;
    msg_free(in->early_done);
    in->early_done = NULL;
    free(in->pump_fail);
    in->pump_fail = NULL;
    pthread_mutex_unlock(&in->mu);
}

/* posix_spawn's argv[0] with sock as its fd 3 and no other fd above 2.
 * Returns posix_spawn's error number. */
static int spawn_with_socket(const char *exe, char *const argv[], int sock, pid_t *pid)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, sock, 3);
    posix_spawn_file_actions_addclosefrom_np(&fa, 4);
    int rc = posix_spawn(pid, exe, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    return rc;
}

/* ---- The zygote ----
 *
 * One pre-started python3 running nereid_python_stub.py as a zygote (numpy
 * and pb_utils already imported) forks the workers of models that use the
 * backend's interpreter: an instance then starts in a few milliseconds, not
 * an interpreter start and a numpy import. A FORK request is the instance
 * name with the worker's socket end (SCM_RIGHTS); the answer is the child's
 * pid (4 bytes) with a pidfd for it. The child is the zygote's, which lets
 * the kernel reap it, and dies with it (so killing the server's children
 * ends every worker, as Triton's QA expects of its stubs); the pidfd lets
 * this library kill it and see it end without the pid being reused. A zygote that ends is started
 * again on the next request; one that never forked a worker disables the
 * zygote, and workers are spawned as fresh interpreters, as they are for
 * an EXECUTION_ENV_PATH interpreter or with --backend-config=python,zygote=false. */

#define ZYGOTE_WAIT_MS 60000 /* the first answer waits for python3 and numpy to start */

/* Ends the zygote (and with it the workers it forked, which have
 * PR_SET_PDEATHSIG). Called with zy_mu held or at fini. */
void zygote_end(backend_state_t *st)
{
    if (st->zy_fd < 0) return;
    close(st->zy_fd);
    st->zy_fd = -1;
    kill(st->zy_pid, SIGKILL); /* our child, not reaped yet: the pid is still its */
    while (waitpid(st->zy_pid, NULL, 0) < 0 && errno == EINTR) {
    }
}

static int zygote_start(backend_state_t *st)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return -1;
    /* The blank argument makes room for a child's command line
     * ("triton_python_backend_stub <instance>", set by the child). */
    char room[256];
    memset(room, ' ', sizeof room - 1);
    room[sizeof room - 1] = '\0';
    char *argv[] = {st->python, "-u", st->stub, "nereid_python_zygote", room, NULL};
    int rc = spawn_with_socket(st->python, argv, sv[1], &st->zy_pid);
    close(sv[1]);
    if (rc != 0) {
        close(sv[0]);
        return -1;
    }
    st->zy_fd = sv[0];
    st->zy_served = false;
    return 0;
}

/* One FORK exchange with the running zygote. 1: forked; 0: the zygote
 * answered but has no worker (it ended at once); -1: the zygote failed. */
static int zygote_ask(backend_state_t *st, const char *name, int sock, pid_t *pid, int *pidfd)
{
    fd_cmsg_t u;
    struct iovec iov = {(void *)name, strlen(name)};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    attach_fd(&mh, &u, sock);
    if (sendmsg(st->zy_fd, &mh, MSG_NOSIGNAL) != (ssize_t)iov.iov_len) return -1;
    struct pollfd p = {st->zy_fd, POLLIN, 0};
    int pr;
    while ((pr = poll(&p, 1, ZYGOTE_WAIT_MS)) < 0 && errno == EINTR) {
    }
    if (pr <= 0) return -1;
    int32_t answer;
    iov = (struct iovec){&answer, sizeof answer};
    memset(&u, 0, sizeof u);
    mh = (struct msghdr){
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    ssize_t n = recvmsg(st->zy_fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    int fd = -1;
    struct cmsghdr *cm = n > 0 ? CMSG_FIRSTHDR(&mh) : NULL;
    if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
        cm->cmsg_len == CMSG_LEN(sizeof(int)))
        memcpy(&fd, CMSG_DATA(cm), sizeof fd);
    if (n != sizeof answer || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
        if (fd >= 0) close(fd);
        return -1;
    }
    if (answer <= 0 || fd < 0) {
        if (fd >= 0) close(fd);
        return 0;
    }
    *pid = answer;
    *pidfd = fd;
    return 1;
}

/* Forks a worker for instance `name` around its socket end sock. 0 with
 * *pid and *pidfd; -1 when no zygote can do it (the caller spawns one). */
static int zygote_fork(backend_state_t *st, const char *name, int sock, pid_t *pid, int *pidfd)
{
    int rc = -1;
    pthread_mutex_lock(&st->zy_mu);
    for (int attempt = 0; attempt < 2 && !st->zy_off; attempt++) {
        if (st->zy_fd < 0 && zygote_start(st) != 0) {
            st->zy_off = true;
            break;
        }
        int r = zygote_ask(st, name, sock, pid, pidfd);
        if (r == 1) {
            st->zy_served = true;
            rc = 0;
            break;
        }
        if (r == 0) break;
        bool served = st->zy_served;
        zygote_end(st);
        if (!served) {
            plog('W', "python backend: the zygote process failed to start; workers are "
                      "started as fresh interpreters");
            st->zy_off = true;
        }
    }
    pthread_mutex_unlock(&st->zy_mu);
    return rc;
}

/* Starts a worker and sends it init_json (INIT). On success the worker's
 * READY message is returned (caller frees). */
nereid_error_t *worker_start(instance_t *in, const char *init_json, msg_t **ready)
{
    *ready = NULL;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return nereid_error_new(NEREID_ERROR_INTERNAL, "python backend: socketpair: %s",
                                strerror(errno));
    int epfd = epoll_create1(EPOLL_CLOEXEC);
    int kickfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (epfd < 0 || kickfd < 0) {
        nereid_error_t *e =
            nereid_error_new(NEREID_ERROR_INTERNAL, "python backend: %s: %s",
                             epfd < 0 ? "epoll_create1" : "eventfd", strerror(errno));
        if (epfd >= 0) close(epfd);
        if (kickfd >= 0) close(kickfd);
        close(sv[0]);
        close(sv[1]);
        return e;
    }
    char *python = (char *)(in->python ? in->python : g_backend->python);
    pid_t pid = -1;
    int rc = 0, pidfd = -1;
    if (in->python || zygote_fork(g_backend, in->name, sv[1], &pid, &pidfd) != 0) {
        char *argv[] = {python,   "-u", g_backend->stub, "triton_python_backend_stub",
                        in->name, NULL};
        rc = spawn_with_socket(python, argv, sv[1], &pid);
    }
    close(sv[1]);
    if (rc != 0) {
        close(sv[0]);
        close(epfd);
        close(kickfd);
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "python backend: cannot start '%s' for '%s': %s", python, in->name,
                                strerror(rc));
    }
    in->pid = pid;
    in->pidfd = pidfd;
    body_forget(in);
    region_unref(in->tx);
    rx_regions_clear(&in->rx);
    in->tx = NULL;
    for (int i = 0; i < TX_SPARES; i++) {
        region_unref(in->tx_spare[i]);
        in->tx_spare[i] = NULL;
    }
    in->chan = chan_new(sv[0]);
    if (!in->chan) abort();
    in->epfd = epfd;
    in->kickfd = kickfd;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLONESHOT, .data.fd = sv[0]};
    struct epoll_event kev = {.events = EPOLLIN, .data.fd = kickfd};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, sv[0], &ev) != 0 ||
        epoll_ctl(epfd, EPOLL_CTL_ADD, kickfd, &kev) != 0)
        abort(); /* only ENOMEM */
    pthread_mutex_lock(&in->mu);
    in->armed = true;
    in->eager_arm = false;
    in->lazy_checks = 0;
    in->dead = false;
    in->reaped = false;
    in->aborted = false;
    free(in->death);
    in->death = NULL;
    pthread_mutex_unlock(&in->mu);
    in->msgs_in = 0;
    spin_page_send(in);
    if (pthread_create(&in->reader, NULL, reader_main, in) != 0) abort();
    in->reader_running = true;
    return worker_init(in, init_json, ready);
}

/* Sends INIT (init_json) to the running worker and waits for READY. On
 * failure the worker is stopped. */
nereid_error_t *worker_init(instance_t *in, const char *init_json, msg_t **ready)
{
    *ready = NULL;
    json_error_t jerr;
    expect_reply(in, M_READY);
    reader_arm(in);
    send_json(in->chan, M_INIT, json_loads(init_json, 0, &jerr));
    msg_t *m = wait_reply(in, M_READY, 0);
    if (!m) {
        nereid_error_t *e = unhealthy(in);
        worker_stop(in);
        return e;
    }
    json_t *e = json_object_get(m->json, "error");
    if (json_is_string(e)) {
        nereid_error_t *err = nereid_error_new(NEREID_ERROR_INTERNAL, "%s", json_string_value(e));
        msg_free(m);
        worker_stop(in);
        return err;
    }
    pthread_mutex_lock(&in->mu);
    in->has_is_ready = json_is_true(json_object_get(m->json, "is_ready"));
    pthread_mutex_unlock(&in->mu);
    *ready = m;
    return NULL;
}
