/*
 * This file contains the default scheduler: a FIFO shared by the model's
 * instances; each free instance takes the oldest request and runs it alone.
 */
#include <pthread.h>
#include <stdlib.h>

#include "core/util.h"
#include "sched/scheduler.h"

typedef struct default_scheduler {
    scheduler_t base;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    nereid_request_t *head, *tail;
    bool stopped;
} default_scheduler_t;

static nereid_error_t *default_enqueue(scheduler_t *s, nereid_request_t *req)
{
    default_scheduler_t *d = (default_scheduler_t *)s;
    pthread_mutex_lock(&d->lock);
    if (d->stopped) {
        pthread_mutex_unlock(&d->lock);
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready");
    }
    req->next = NULL;
    if (d->tail)
        d->tail->next = req;
    else
        d->head = req;
    d->tail = req;
    atomic_fetch_add(&s->model->stats.pending, 1);
    pthread_cond_signal(&d->cond);
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

static bool default_next_batch(scheduler_t *s, model_instance_t *inst, batch_t *batch)
{
    (void)inst;
    default_scheduler_t *d = (default_scheduler_t *)s;
    pthread_mutex_lock(&d->lock);
    while (!d->head && !d->stopped)
        pthread_cond_wait(&d->cond, &d->lock);
    nereid_request_t *req = d->head;
    if (req) {
        d->head = req->next;
        if (!d->head) d->tail = NULL;
        req->next = NULL;
        atomic_fetch_sub(&s->model->stats.pending, 1);
    }
    pthread_mutex_unlock(&d->lock);
    if (!req) return false;
    batch_add(batch, req);
    return true;
}

static void default_stop(scheduler_t *s)
{
    default_scheduler_t *d = (default_scheduler_t *)s;
    pthread_mutex_lock(&d->lock);
    d->stopped = true;
    pthread_cond_broadcast(&d->cond);
    pthread_mutex_unlock(&d->lock);
}

static void default_destroy(scheduler_t *s)
{
    default_scheduler_t *d = (default_scheduler_t *)s;
    /* Instances drained the queue before exiting; anything left failed. */
    while (d->head) {
        nereid_request_t *r = d->head;
        d->head = r->next;
        request_finish(r, nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready"),
                       FAILURE_OTHER);
    }
    pthread_mutex_destroy(&d->lock);
    pthread_cond_destroy(&d->cond);
    free(d);
}

static const scheduler_ops_t default_ops = {
    .name = "default",
    .enqueue = default_enqueue,
    .next_batch = default_next_batch,
    .stop = default_stop,
    .destroy = default_destroy,
};

nereid_error_t *default_scheduler_create(model_t *m, scheduler_t **out)
{
    default_scheduler_t *d = xcalloc(1, sizeof *d);
    d->base.ops = &default_ops;
    d->base.model = m;
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->cond, NULL);
    *out = &d->base;
    return NULL;
}
