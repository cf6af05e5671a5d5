/*
 * This file contains the lingering close (linger.h): a fixed table of
 * LINGER_MAX_CONNS slots under one lock, an epoll set keyed by slot index,
 * and one thread that discards what arrives and closes each socket when its
 * peer closes or a bound is reached. An eventfd wakes the thread for a new
 * socket or to stop.
 */
#include "http/linger.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Discarded per wake-up of one socket before the others get their turn. */
#define LINGER_SLICE (8u << 20)
#define WAKE_ID UINT32_MAX

typedef struct slot {
    int fd; /* -1: free */
    uint64_t start_ns, last_ns;
    uint64_t discarded;
} slot_t;

struct lingerer {
    int epfd, wakefd;
    pthread_t thread;
    pthread_mutex_t lock;
    bool stop;    /* lock */
    size_t n_fds; /* lock: slots in use */
    slot_t slots[LINGER_MAX_CONNS];
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void slot_close(lingerer_t *l, slot_t *s)
{
    epoll_ctl(l->epfd, EPOLL_CTL_DEL, s->fd, NULL);
    close(s->fd);
    s->fd = -1;
    l->n_fds--;
}

/* Discards what s's socket holds. Returns false when it is to be closed:
 * the peer closed, the socket failed, or the byte bound is reached. */
static bool slot_drain(slot_t *s, uint64_t now)
{
    size_t slice = 0;
    while (slice < LINGER_SLICE) {
        uint64_t left = LINGER_MAX_BYTES - s->discarded;
        size_t want = left < LINGER_SLICE ? (size_t)left : LINGER_SLICE;
        if (want == 0) return false;
        /* MSG_TRUNC on TCP: the bytes are dropped, never copied (tcp(7)). */
        ssize_t n = recv(s->fd, NULL, want, MSG_TRUNC | MSG_DONTWAIT);
        if (n == 0) return false;
        if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
        s->discarded += (uint64_t)n;
        s->last_ns = now;
        slice += (size_t)n;
    }
    return true;
}

static bool slot_expired(const slot_t *s, uint64_t now)
{
    return now - s->last_ns >= (uint64_t)LINGER_IDLE_MS * 1000000u ||
           now - s->start_ns >= (uint64_t)LINGER_TOTAL_MS * 1000000u;
}

static void *linger_main(void *arg)
{
    lingerer_t *l = arg;
    for (;;) {
        pthread_mutex_lock(&l->lock);
        int timeout = l->n_fds ? 100 : -1; /* the idle and total bounds are checked each 100 ms */
        pthread_mutex_unlock(&l->lock);
        struct epoll_event ev[32];
        int n = epoll_wait(l->epfd, ev, 32, timeout);
        pthread_mutex_lock(&l->lock);
        uint64_t now = now_ns(); /* under the lock: never before a slot's own times */
        if (l->stop) {
            pthread_mutex_unlock(&l->lock);
            return NULL;
        }
        for (int i = 0; i < n; i++) {
            uint32_t id = ev[i].data.u32;
            if (id == WAKE_ID) {
                uint64_t v;
                if (read(l->wakefd, &v, sizeof v) < 0) { /* nothing to do: level-triggered */
                }
                continue;
            }
            slot_t *s = &l->slots[id];
            if (s->fd >= 0 && !slot_drain(s, now)) slot_close(l, s);
        }
        for (size_t i = 0; i < LINGER_MAX_CONNS; i++)
            if (l->slots[i].fd >= 0 && slot_expired(&l->slots[i], now)) slot_close(l, &l->slots[i]);
        pthread_mutex_unlock(&l->lock);
    }
}

lingerer_t *linger_start(void)
{
    lingerer_t *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    for (size_t i = 0; i < LINGER_MAX_CONNS; i++)
        l->slots[i].fd = -1;
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    l->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = WAKE_ID};
    if (l->epfd < 0 || l->wakefd < 0 || epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->wakefd, &ev) != 0) {
        if (l->epfd >= 0) close(l->epfd);
        if (l->wakefd >= 0) close(l->wakefd);
        free(l);
        return NULL;
    }
    pthread_mutex_init(&l->lock, NULL);
    if (pthread_create(&l->thread, NULL, linger_main, l) != 0) {
        pthread_mutex_destroy(&l->lock);
        close(l->epfd);
        close(l->wakefd);
        free(l);
        return NULL;
    }
    return l;
}

static void wake(lingerer_t *l)
{
    uint64_t one = 1;
    if (write(l->wakefd, &one, sizeof one) < 0) { /* already signalled (counter full) */
    }
}

void linger_stop(lingerer_t *l)
{
    if (!l) return;
    pthread_mutex_lock(&l->lock);
    l->stop = true;
    pthread_mutex_unlock(&l->lock);
    wake(l);
    pthread_join(l->thread, NULL);
    for (size_t i = 0; i < LINGER_MAX_CONNS; i++)
        if (l->slots[i].fd >= 0) slot_close(l, &l->slots[i]);
    pthread_mutex_destroy(&l->lock);
    close(l->epfd);
    close(l->wakefd);
    free(l);
}

void linger_add(lingerer_t *l, int fd)
{
    if (fd < 0) return;
    if (!l) {
        close(fd);
        return;
    }
    pthread_mutex_lock(&l->lock);
    slot_t *s = NULL;
    for (size_t i = 0; i < LINGER_MAX_CONNS && !s && !l->stop; i++)
        if (l->slots[i].fd < 0) s = &l->slots[i];
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP,
                             .data.u32 = s ? (uint32_t)(s - l->slots) : 0};
    if (!s || epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        pthread_mutex_unlock(&l->lock);
        close(fd); /* table full: closed at once, as without lingering */
        return;
    }
    uint64_t now = now_ns();
    *s = (slot_t){.fd = fd, .start_ns = now, .last_ns = now};
    l->n_fds++;
    pthread_mutex_unlock(&l->lock);
    wake(l);
}
