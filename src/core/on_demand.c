/*
 * This file contains the on-demand load queue (on_demand.h). The workload
 * it assumes: first requests for models that are not loaded are rare
 * against requests for loaded ones, and a load takes milliseconds to
 * seconds. So a request waiting for a load costs one small node, the
 * queue is a mutex-guarded list, and the loader threads (at most
 * --model-load-thread-count) are started when a request finds none idle
 * and stay, blocked, until the server stops. Loads themselves are
 * serialized by the repository (s->on_demand_load); more than one loader thread
 * lets a request for a model that another request has just loaded go
 * ahead of a load that is still running.
 */
#include "core/on_demand.h"

#include <pthread.h>
#include <stdlib.h>

#include "core/repository.h"
#include "core/server_internal.h"
#include "core/request.h"
#include "core/util.h"

typedef struct deferred {
    struct deferred *next;
    nereid_request_t *req;
    nereid_response_allocator_t allocator;
    bool has_allocator;
    nereid_complete_fn done_fn;
    void *done_userp;
} deferred_t;

struct on_demand_queue {
    nereid_server_t *server;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    deferred_t *head, *tail;               /* lock */
    pthread_t *threads;                    /* [max_threads] */
    size_t n_threads, max_threads, n_idle; /* lock */
    bool stop;                             /* lock */
};

static pthread_once_t queue_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t queue_create_lock;

static void create_lock_init(void)
{
    pthread_mutex_init(&queue_create_lock, NULL);
}

/* The server's queue, made on first use. */
static struct on_demand_queue *queue_of(nereid_server_t *s)
{
    pthread_once(&queue_once, create_lock_init);
    pthread_mutex_lock(&queue_create_lock);
    struct on_demand_queue *q = s->on_demand;
    if (!q && !atomic_load(&s->stopping)) {
        q = xcalloc(1, sizeof *q);
        q->server = s;
        pthread_mutex_init(&q->lock, NULL);
        pthread_cond_init(&q->cond, NULL);
        int n = s->opts.model_load_thread_count;
        q->max_threads = n > 0 ? (size_t)n : 1;
        q->threads = xcalloc(q->max_threads, sizeof *q->threads);
        s->on_demand = q;
    }
    pthread_mutex_unlock(&queue_create_lock);
    return q;
}

static void run(nereid_server_t *s, deferred_t *d)
{
    nereid_error_t *err =
        atomic_load(&s->stopping)
            ? nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready")
            : server_infer_loaded(s, d->req, d->has_allocator ? &d->allocator : NULL, d->done_fn,
                                  d->done_userp);
    if (err) request_fail_unsubmitted(d->req, d->done_fn, d->done_userp, err);
    free(d);
}

static void *loader_main(void *arg)
{
    struct on_demand_queue *q = arg;
    pthread_mutex_lock(&q->lock);
    for (;;) {
        while (!q->head && !q->stop) {
            q->n_idle++;
            pthread_cond_wait(&q->cond, &q->lock);
            q->n_idle--;
        }
        deferred_t *d = q->head;
        if (!d) break; /* stopping, nothing left */
        q->head = d->next;
        if (!q->head) q->tail = NULL;
        pthread_mutex_unlock(&q->lock);
        run(q->server, d);
        pthread_mutex_lock(&q->lock);
    }
    pthread_mutex_unlock(&q->lock);
    return NULL;
}

bool on_demand_defer(nereid_server_t *s, nereid_request_t *req,
                     const nereid_response_allocator_t *allocator, nereid_complete_fn done_fn,
                     void *done_userp)
{
    if (repository_loading_on_demand() || !repository_has_model(s, req->model_name)) return false;
    struct on_demand_queue *q = queue_of(s);
    if (!q) return false; /* stopping */
    deferred_t *d = xcalloc(1, sizeof *d);
    d->req = req;
    if (allocator) {
        d->allocator = *allocator;
        d->has_allocator = true;
    }
    d->done_fn = done_fn;
    d->done_userp = done_userp;
    pthread_mutex_lock(&q->lock);
    if (q->stop) {
        pthread_mutex_unlock(&q->lock);
        free(d);
        return false;
    }
    if (q->tail)
        q->tail->next = d;
    else
        q->head = d;
    q->tail = d;
    if (q->n_idle == 0 && q->n_threads < q->max_threads &&
        pthread_create(&q->threads[q->n_threads], NULL, loader_main, q) == 0)
        q->n_threads++;
    bool ok = q->n_threads > 0;
    if (ok) {
        pthread_cond_signal(&q->cond);
    } else { /* no thread could start: the caller loads on its own thread */
        q->head = q->tail = NULL;
        free(d);
    }
    pthread_mutex_unlock(&q->lock);
    if (!ok) LOG_WARN("unable to start an on-demand load thread");
    return ok;
}

void on_demand_stop(nereid_server_t *s)
{
    pthread_once(&queue_once, create_lock_init);
    pthread_mutex_lock(&queue_create_lock);
    struct on_demand_queue *q = s->on_demand; /* no new one: s->stopping is set */
    pthread_mutex_unlock(&queue_create_lock);
    if (!q) return;
    pthread_mutex_lock(&q->lock);
    q->stop = true;
    size_t n = q->n_threads; /* no more start: q->stop */
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->lock);
    for (size_t i = 0; i < n; i++)
        pthread_join(q->threads[i], NULL);
    /* The loaders drained the queue (s->stopping fails what they took). The
     * queue stays until on_demand_free: a late on_demand_defer finds it
     * stopped. */
}

void on_demand_free(nereid_server_t *s)
{
    struct on_demand_queue *q = s->on_demand;
    if (!q) return;
    s->on_demand = NULL;
    pthread_cond_destroy(&q->cond);
    pthread_mutex_destroy(&q->lock);
    free(q->threads);
    free(q);
}
