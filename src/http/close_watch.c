/*
 * This file contains the close watcher (close_watch.h). Each watch is an
 * epoll registration keyed by a unique id (never by the fd, which the
 * system reuses once the connection is closed), one-shot, and an entry in a
 * list under the watcher's lock that holds the token; an event whose id is
 * no longer listed (removed meanwhile) is ignored.
 */
#include "http/close_watch.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

typedef struct watch {
    struct watch *next;
    uint64_t id;
    int fd;
    nereid_cancel_token_t *token;
} watch_t;

struct close_watch {
    int epfd, stopfd;
    pthread_t thread;
    pthread_mutex_t lock;
    watch_t *head;    /* lock */
    uint64_t next_id; /* lock */
};

#define STOP_ID UINT64_MAX

static void *watch_main(void *arg)
{
    close_watch_t *w = arg;
    for (;;) {
        struct epoll_event ev[16];
        int n = epoll_wait(w->epfd, ev, 16, -1);
        for (int i = 0; i < n; i++) {
            if (ev[i].data.u64 == STOP_ID) return NULL;
            pthread_mutex_lock(&w->lock);
            for (watch_t *x = w->head; x; x = x->next)
                if (x->id == ev[i].data.u64) nereid_request_cancel(x->token);
            pthread_mutex_unlock(&w->lock);
        }
    }
}

close_watch_t *close_watch_start(void)
{
    close_watch_t *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->epfd = epoll_create1(EPOLL_CLOEXEC);
    w->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = STOP_ID};
    if (w->epfd < 0 || w->stopfd < 0 || epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->stopfd, &ev) != 0) {
        if (w->epfd >= 0) close(w->epfd);
        if (w->stopfd >= 0) close(w->stopfd);
        free(w);
        return NULL;
    }
    pthread_mutex_init(&w->lock, NULL);
    w->next_id = 1;
    if (pthread_create(&w->thread, NULL, watch_main, w) != 0) {
        pthread_mutex_destroy(&w->lock);
        close(w->epfd);
        close(w->stopfd);
        free(w);
        return NULL;
    }
    return w;
}

void close_watch_stop(close_watch_t *w)
{
    if (!w) return;
    uint64_t one = 1;
    if (write(w->stopfd, &one, sizeof one) < 0) { /* the thread is then left running */
    }
    pthread_join(w->thread, NULL);
    while (w->head) {
        watch_t *x = w->head;
        w->head = x->next;
        free(x);
    }
    pthread_mutex_destroy(&w->lock);
    close(w->epfd);
    close(w->stopfd);
    free(w);
}

uint64_t close_watch_add(close_watch_t *w, int fd, nereid_cancel_token_t *token)
{
    if (!w || fd < 0 || !token) return 0;
    watch_t *x = calloc(1, sizeof *x);
    if (!x) return 0;
    x->fd = fd;
    x->token = token;
    pthread_mutex_lock(&w->lock);
    x->id = w->next_id++;
    /* The peer's close (FIN: RDHUP; RST: HUP/ERR, always reported), once. */
    struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLONESHOT, .data.u64 = x->id};
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        pthread_mutex_unlock(&w->lock);
        free(x);
        return 0;
    }
    x->next = w->head;
    w->head = x;
    uint64_t id = x->id;
    pthread_mutex_unlock(&w->lock);
    return id;
}

void close_watch_remove(close_watch_t *w, uint64_t id)
{
    if (!w || !id) return;
    pthread_mutex_lock(&w->lock);
    for (watch_t **p = &w->head; *p; p = &(*p)->next) {
        watch_t *x = *p;
        if (x->id != id) continue;
        *p = x->next;
        epoll_ctl(w->epfd, EPOLL_CTL_DEL, x->fd, NULL);
        free(x);
        break;
    }
    pthread_mutex_unlock(&w->lock);
}
