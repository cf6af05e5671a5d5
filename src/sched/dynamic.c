/*
 * This file contains the dynamic batcher (config `dynamic_batching`): one
 * FIFO per priority level shared by all of the model's instances (a level
 * exists while it has a policy of its own or queued requests, as in Triton's
 * PriorityQueue, so priority_levels may be any uint64). A free
 * instance takes the "forming" slot and builds the next batch from the head
 * of the queues (level 1 first) by Triton's rule (plan_batch): the largest
 * preferred batch size that the queued requests can make, else everything
 * compatible up to max_batch_size once it reaches the largest preferred size
 * or max_queue_delay_microseconds has passed for the oldest request (at once
 * when the delay is 0). Requests never split; requests only batch with
 * requests whose non-batch input shapes agree (ragged inputs exempt). Queue
 * policies reject at enqueue when a level is full, and reject or delay
 * requests whose time in the queue passes their timeout, by Triton's rules;
 * a level without a queue policy (plain `dynamic_batching { }`) fails a
 * request once the client's timeout passes, as every queue does
 * (request_expired; Triton ignores it there). With
 * preserve_ordering, responses are delivered in dispatch order whatever the
 * order the instances finish in. NEREID_DELAY_SCHEDULER=N (test hook; Triton's
 * name TRITONSERVER_DELAY_SCHEDULER is read too) holds the first batch until
 * N requests are queued or the scheduler stops.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/util.h"
#include "sched/deadline.h"
#include "sched/scheduler.h"

/* A queued request; after dispatch with preserve_ordering, its slot in the
 * completion order. */
typedef struct dyn_node {
    nereid_request_t *req;
    struct dyn_node *next;
    uint64_t deadline_ns; /* queue timeout (monotonic), 0 = none */
    bool client_deadline; /* deadline_ns is the client's (rejected, never delayed) */
    int64_t batch_size;   /* elements of the batch dimension, >= 1 */
    bool done;            /* preserve_ordering: executed, response ready */
} dyn_node_t;

typedef struct dyn_queue {
    dyn_node_t *head, *tail;
} dyn_queue_t;

typedef struct dyn_level {
    uint64_t priority;       /* 1..priority_levels; 0 when priority_levels is 0 */
    bool permanent;          /* a policy of its own (or the only level): never removed */
    dyn_queue_t queue;       /* requests within their timeout, FIFO */
    dyn_queue_t delayed;     /* timed-out requests under timeout_action DELAY */
    size_t n_queued;         /* both queues */
    uint32_t max_queue_size; /* 0 = unbounded */
    uint64_t timeout_us;     /* default_timeout_microseconds, 0 = none */
    bool delay_on_timeout;   /* timeout_action DELAY (else REJECT) */
    bool allow_override;     /* a request timeout may shorten timeout_us */
    bool has_policy;         /* the config gives it a queue policy: Triton's rules alone */
} dyn_level_t;

typedef struct dynamic_batcher {
    scheduler_t base;
    pthread_mutex_t lock;
    pthread_cond_t work_cond; /* the forming instance: a request arrived, stop */
    pthread_cond_t slot_cond; /* free instances: the forming slot was released */
    dyn_level_t *levels; /* by priority, ascending: the permanent levels and any with requests */
    size_t n_levels, cap_levels;
    uint64_t priority_levels;   /* config; 0 = one level */
    uint64_t default_priority;  /* level of priority 0 and out-of-range priorities */
    dyn_level_t default_policy; /* policy fields for levels created on demand */
    size_t n_queued;            /* all levels */
    int64_t max_batch_size;
    int32_t *preferred; /* preferred batch sizes within [1, max_batch_size] */
    size_t n_preferred;
    uint64_t max_delay_ns;
    bool preserve_ordering;
    char **ragged; /* inputs with allow_ragged_batch */
    size_t n_ragged;
    size_t hold; /* NEREID_DELAY_SCHEDULER: queued requests awaited before the first batch */
    bool forming, stopped;
    /* Armed for the earliest deadline queued: fails REJECT requests on
     * time even while every instance is busy (deadline.h). */
    sched_timer_t timer;
    /* preserve_ordering: dispatched requests in dispatch order. */
    pthread_mutex_t order_lock;
    dyn_node_t *order_head, *order_tail;
    bool delivering; /* one thread delivers responses at a time */
} dynamic_batcher_t;

static void queue_push(dyn_queue_t *q, dyn_node_t *n)
{
    n->next = NULL;
    if (q->tail)
        q->tail->next = n;
    else
        q->head = n;
    q->tail = n;
}

static dyn_node_t *queue_pop(dyn_queue_t *q)
{
    dyn_node_t *n = q->head;
    if (n) {
        q->head = n->next;
        if (!q->head) q->tail = NULL;
        n->next = NULL;
    }
    return n;
}

/* Microseconds to nanoseconds, capped (~146 years) so that sums with
 * monotonic timestamps cannot overflow. */
static uint64_t us_to_ns(uint64_t us)
{
    const uint64_t cap_ns = UINT64_MAX / 4;
    return us > cap_ns / 1000 ? cap_ns : us * 1000;
}

static const char *req_id(const nereid_request_t *req)
{
    return req->id ? req->id : "<id_unknown>";
}

/* Priority 0, or above priority_levels, uses default_priority_level. */
static uint64_t pick_priority(const dynamic_batcher_t *d, uint64_t priority)
{
    if (d->priority_levels == 0) return 0;
    if (priority == 0 || priority > d->priority_levels) return d->default_priority;
    return priority;
}

/* Index of the first level whose priority is >= priority (lock held). */
static size_t level_index(const dynamic_batcher_t *d, uint64_t priority)
{
    size_t lo = 0, hi = d->n_levels;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (d->levels[mid].priority < priority)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The level of a priority, created with the default policy when absent
 * (lock held). The pointer is valid until the next level is created. */
static dyn_level_t *level_get(dynamic_batcher_t *d, uint64_t priority)
{
    size_t i = level_index(d, priority);
    if (i < d->n_levels && d->levels[i].priority == priority) return &d->levels[i];
    if (d->n_levels == d->cap_levels) {
        d->cap_levels = d->cap_levels ? 2 * d->cap_levels : 4;
        d->levels = xrealloc(d->levels, d->cap_levels * sizeof *d->levels);
    }
    memmove(&d->levels[i + 1], &d->levels[i], (d->n_levels - i) * sizeof *d->levels);
    d->n_levels++;
    d->levels[i] = d->default_policy;
    d->levels[i].priority = priority;
    return &d->levels[i];
}

/* Drops the empty levels that have no policy of their own (lock held), so
 * the levels kept are bounded by the policies and the queued requests. */
static void prune_levels(dynamic_batcher_t *d)
{
    size_t kept = 0;
    for (size_t l = 0; l < d->n_levels; l++)
        if (d->levels[l].permanent || d->levels[l].n_queued) d->levels[kept++] = d->levels[l];
    d->n_levels = kept;
}

/* The request's queue timeout: the level's default, shortened (never
 * lengthened) by the request's own when the policy allows it. */
static uint64_t timeout_us_for(const dyn_level_t *lv, const nereid_request_t *req)
{
    uint64_t t = lv->timeout_us;
    if (lv->allow_override && req->timeout_us != 0 && t != 0 && req->timeout_us < t)
        t = req->timeout_us;
    return t;
}

static nereid_error_t *dynamic_enqueue(scheduler_t *s, nereid_request_t *req)
{
    dynamic_batcher_t *d = (dynamic_batcher_t *)s;
    pthread_mutex_lock(&d->lock);
    if (d->stopped) {
        pthread_mutex_unlock(&d->lock);
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready");
    }
    dyn_level_t *lv = level_get(d, pick_priority(d, req->priority));
    if (lv->max_queue_size && lv->n_queued >= lv->max_queue_size) {
        pthread_mutex_unlock(&d->lock);
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                                "[request id: %s] Exceeds maximum queue size", req_id(req));
    }
    dyn_node_t *n = xcalloc(1, sizeof *n);
    n->req = req;
    n->batch_size = req->batch_size > 0 ? req->batch_size : 1;
    uint64_t timeout_us = timeout_us_for(lv, req);
    if (timeout_us) {
        n->deadline_ns = req->t_queue_start_ns + us_to_ns(timeout_us);
    } else if (!lv->has_policy && req->deadline_ns) {
        /* No queue policy: the client's timeout applies, as in every queue. */
        n->deadline_ns = req->deadline_ns;
        n->client_deadline = true;
    }
    sched_timer_arm(&d->timer, n->deadline_ns);
    queue_push(&lv->queue, n);
    lv->n_queued++;
    d->n_queued++;
    atomic_fetch_add(&s->model->stats.pending, 1);
    pthread_cond_signal(&d->work_cond);
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

/* Applies queue timeouts at now: REJECT requests move to *rejected, DELAY
 * requests move behind their level. Returns the earliest deadline still
 * pending (0 = none). Called with the lock held. */
static uint64_t expire_timeouts(dynamic_batcher_t *d, uint64_t now, dyn_queue_t *rejected)
{
    uint64_t next = 0;
    for (size_t l = 0; l < d->n_levels; l++) {
        dyn_level_t *lv = &d->levels[l];
        dyn_node_t **link = &lv->queue.head, *prev = NULL;
        while (*link) {
            dyn_node_t *n = *link;
            if (!n->deadline_ns || n->deadline_ns > now) {
                if (n->deadline_ns && (!next || n->deadline_ns < next)) next = n->deadline_ns;
                prev = n;
                link = &n->next;
                continue;
            }
            *link = n->next;
            if (lv->queue.tail == n) lv->queue.tail = prev;
            n->deadline_ns = 0;
            if (lv->delay_on_timeout && !n->client_deadline) {
                queue_push(&lv->delayed, n);
            } else {
                lv->n_queued--;
                d->n_queued--;
                atomic_fetch_sub(&d->base.model->stats.pending, 1);
                queue_push(rejected, n);
            }
        }
    }
    if (rejected->head) prune_levels(d);
    return next;
}

/* Moves cancelled requests out of q into *out (lock held). */
static size_t sweep_cancelled(dyn_queue_t *q, dyn_queue_t *out)
{
    size_t n_moved = 0;
    dyn_node_t **link = &q->head, *prev = NULL;
    while (*link) {
        dyn_node_t *n = *link;
        if (!request_cancelled(n->req)) {
            prev = n;
            link = &n->next;
            continue;
        }
        *link = n->next;
        if (q->tail == n) q->tail = prev;
        queue_push(out, n);
        n_moved++;
    }
    return n_moved;
}

/* Takes every cancelled request out of the queues, as Triton's queue does
 * while it forms a batch (lock held); the caller completes them. */
static void take_cancelled(dynamic_batcher_t *d, dyn_queue_t *cancelled)
{
    for (size_t l = 0; l < d->n_levels; l++) {
        dyn_level_t *lv = &d->levels[l];
        size_t n =
            sweep_cancelled(&lv->queue, cancelled) + sweep_cancelled(&lv->delayed, cancelled);
        lv->n_queued -= n;
        d->n_queued -= n;
        atomic_fetch_sub(&d->base.model->stats.pending, (int64_t)n);
    }
    if (cancelled->head) prune_levels(d);
}

static void finish_cancelled(dyn_queue_t *cancelled)
{
    dyn_node_t *n;
    while ((n = queue_pop(cancelled))) {
        request_finish_cancelled(n->req);
        free(n);
    }
}

static bool is_ragged(const dynamic_batcher_t *d, const char *name)
{
    for (size_t i = 0; i < d->n_ragged; i++)
        if (strcmp(d->ragged[i], name) == 0) return true;
    return false;
}

/* Requests batch together when they carry the same inputs with the same
 * shapes apart from the batch dimension (ragged inputs exempt). */
static bool compatible(const dynamic_batcher_t *d, nereid_request_t *a, nereid_request_t *b)
{
    if (a->n_inputs != b->n_inputs) return false;
    for (size_t i = 0; i < a->n_inputs; i++) {
        const req_input_t *x = &a->inputs[i];
        const req_input_t *y = request_find_input(b, x->name);
        if (!y || x->datatype != y->datatype) return false;
        if (is_ragged(d, x->name)) continue;
        if (x->rank != y->rank) return false;
        for (size_t k = 1; k < x->rank; k++)
            if (x->shape[k] != y->shape[k]) return false;
    }
    return true;
}

static bool is_preferred(const dynamic_batcher_t *d, int64_t size)
{
    for (size_t i = 0; i < d->n_preferred; i++)
        if (d->preferred[i] == size) return true;
    return false;
}

/* Decides the next batch from the queued requests, visited in dispatch
 * order (level 1 first; in a level, requests within their timeout, then the
 * delayed ones), by Triton's rule: the requests are added while they fit in
 * max_batch_size and share the first one's shapes; the last point where the
 * total is a preferred size is marked, and so is the point before the first
 * request that would take the total past the largest preferred size when no
 * preferred size was marked before it. Unless the oldest request has waited
 * max_queue_delay_microseconds, a marked point goes at once; otherwise
 * everything added goes at once when the batch cannot grow (the next request
 * does not fit or has other shapes), reaches the largest preferred size, the
 * delay has passed or is 0. Returns the number of requests (a prefix of the
 * order) to send now, or 0 with *wait_until set to when the delay expires.
 * Called with the lock held, n_queued > 0. */
static size_t plan_batch(dynamic_batcher_t *d, uint64_t now, uint64_t *wait_until)
{
    *wait_until = 0;
    if (d->max_batch_size <= 0) return 1; /* a non-batching model runs requests one by one */
    int64_t max_preferred = 0;
    for (size_t i = 0; i < d->n_preferred; i++)
        if (d->preferred[i] > max_preferred) max_preferred = d->preferred[i];
    nereid_request_t *first = NULL;
    int64_t total = 0;
    size_t count = 0, marked = 0;
    uint64_t oldest_ns = UINT64_MAX;
    bool send_now = false;
    for (size_t l = 0; l < d->n_levels; l++) {
        dyn_queue_t *queues[2] = {&d->levels[l].queue, &d->levels[l].delayed};
        for (int q = 0; q < 2; q++) {
            for (dyn_node_t *n = queues[q]->head; n; n = n->next) {
                if (n->req->t_queue_start_ns < oldest_ns) oldest_ns = n->req->t_queue_start_ns;
                if (send_now) continue; /* only the queue's oldest time is still wanted */
                if (first) {
                    if (total + n->batch_size > max_preferred && !marked) marked = count;
                    if (total + n->batch_size > d->max_batch_size ||
                        !compatible(d, first, n->req)) {
                        send_now = true;
                        continue;
                    }
                } else {
                    first = n->req;
                }
                total += n->batch_size;
                count++;
                if (is_preferred(d, total)) marked = count;
            }
        }
    }
    bool delay_passed = d->max_delay_ns && now - oldest_ns >= d->max_delay_ns;
    if (marked && !delay_passed) return marked;
    if (send_now || total >= max_preferred || delay_passed || !d->max_delay_ns || d->stopped)
        return count;
    *wait_until = oldest_ns + d->max_delay_ns;
    return 0;
}

/* Moves the first n queued requests (dispatch order) into batch. */
static void take_batch(dynamic_batcher_t *d, size_t n, batch_t *batch)
{
    if (d->preserve_ordering) pthread_mutex_lock(&d->order_lock);
    for (size_t l = 0; l < d->n_levels && n; l++) {
        dyn_level_t *lv = &d->levels[l];
        while (n && lv->n_queued) {
            dyn_node_t *node = queue_pop(&lv->queue);
            if (!node) node = queue_pop(&lv->delayed);
            lv->n_queued--;
            d->n_queued--;
            n--;
            atomic_fetch_sub(&d->base.model->stats.pending, 1);
            batch_add(batch, node->req);
            if (d->preserve_ordering) {
                node->req->sched_data = node;
                if (d->order_tail)
                    d->order_tail->next = node;
                else
                    d->order_head = node;
                d->order_tail = node;
            } else {
                free(node);
            }
        }
    }
    prune_levels(d);
    if (d->preserve_ordering) pthread_mutex_unlock(&d->order_lock);
}

/* Waits on cond until woken or until deadline_ns (monotonic; 0 = no limit). */
static void wait_until_ns(dynamic_batcher_t *d, pthread_cond_t *cond, uint64_t deadline_ns)
{
    if (!deadline_ns) {
        pthread_cond_wait(cond, &d->lock);
        return;
    }
    struct timespec ts = {(time_t)(deadline_ns / 1000000000ull),
                          (long)(deadline_ns % 1000000000ull)};
    pthread_cond_timedwait(cond, &d->lock, &ts);
}

static void fail_rejected(dyn_queue_t *rejected)
{
    dyn_node_t *n;
    while ((n = queue_pop(rejected))) {
        request_finish_expired(n->req, NULL);
        free(n);
    }
}

static uint64_t earliest(uint64_t a, uint64_t b)
{
    if (!a) return b;
    if (!b) return a;
    return a < b ? a : b;
}

/* Warmup runs before the model serves anyone, one sample at a time: the
 * NEREID_DELAY_SCHEDULER hold must not stop it. */
static bool warmup_queued(const dynamic_batcher_t *d)
{
    for (size_t l = 0; l < d->n_levels; l++) {
        const dyn_level_t *lv = &d->levels[l];
        if ((lv->queue.head && lv->queue.head->req->warmup) ||
            (lv->delayed.head && lv->delayed.head->req->warmup))
            return true;
    }
    return false;
}

/* The deadline timer: applies queue timeouts as they fall due. */
static void dynamic_fire(sched_timer_t *t)
{
    dynamic_batcher_t *d = (dynamic_batcher_t *)((char *)t - offsetof(dynamic_batcher_t, timer));
    dyn_queue_t rejected = {0};
    pthread_mutex_lock(&d->lock);
    if (!d->stopped) sched_timer_arm(&d->timer, expire_timeouts(d, util_now_ns(), &rejected));
    pthread_mutex_unlock(&d->lock);
    fail_rejected(&rejected);
}

static bool dynamic_next_batch(scheduler_t *s, model_instance_t *inst, batch_t *batch)
{
    dynamic_batcher_t *d = (dynamic_batcher_t *)s;
    pthread_mutex_lock(&d->lock);
    while (d->forming && !atomic_load(&inst->retired))
        pthread_cond_wait(&d->slot_cond, &d->lock);
    if (atomic_load(&inst->retired)) {
        /* Removed by an instance update: leave (the slot is not ours). */
        pthread_mutex_unlock(&d->lock);
        if (inst->turn_held) s->core->release_turn(inst);
        return false;
    }
    d->forming = true;
    bool got = false;
    for (;;) {
        if (atomic_load(&inst->retired)) break;
        dyn_queue_t rejected = {0};
        uint64_t now = util_now_ns();
        uint64_t wake = expire_timeouts(d, now, &rejected);
        dyn_queue_t cancelled = {0};
        take_cancelled(d, &cancelled);
        if (rejected.head || cancelled.head) {
            /* Fail outside the lock; the forming slot keeps the queue ours. */
            pthread_mutex_unlock(&d->lock);
            fail_rejected(&rejected);
            finish_cancelled(&cancelled);
            pthread_mutex_lock(&d->lock);
            continue;
        }
        if (d->n_queued == 0) {
            if (d->stopped) break;
            wait_until_ns(d, &d->work_cond, wake);
            continue;
        }
        if (d->hold && d->n_queued < d->hold && !d->stopped) {
            if (!warmup_queued(d)) {
                wait_until_ns(d, &d->work_cond, wake);
                continue;
            }
        } else {
            d->hold = 0;
        }
        uint64_t delay_end;
        size_t n = plan_batch(d, now, &delay_end);
        if (n && !inst->turn_held && inst->rate_limit) {
            /* Rate limited: wait for the turn first, then form the batch
             * from what is queued by then (the forming slot stays ours). */
            pthread_mutex_unlock(&d->lock);
            s->core->acquire_turn(inst);
            pthread_mutex_lock(&d->lock);
            continue;
        }
        if (n) {
            take_batch(d, n, batch);
            got = true;
            break;
        }
        wait_until_ns(d, &d->work_cond, earliest(wake, delay_end));
    }
    d->forming = false;
    pthread_cond_signal(&d->slot_cond);
    pthread_mutex_unlock(&d->lock);
    if (!got && inst->turn_held) s->core->release_turn(inst);
    return got;
}

/* preserve_ordering: marks the batch's requests done, then delivers every
 * done request at the head of the dispatch order. One thread delivers at a
 * time, so callbacks run in order. */
static void dynamic_batch_done(scheduler_t *s, model_instance_t *inst, batch_t *batch)
{
    (void)inst;
    dynamic_batcher_t *d = (dynamic_batcher_t *)s;
    if (!d->preserve_ordering) {
        s->core->complete(batch, true);
        return;
    }
    s->core->complete(batch, false);
    pthread_mutex_lock(&d->order_lock);
    for (size_t r = 0; r < batch->n_reqs; r++)
        ((dyn_node_t *)batch->reqs[r]->sched_data)->done = true;
    batch_reset(batch);
    if (!d->delivering) {
        d->delivering = true;
        while (d->order_head && d->order_head->done) {
            dyn_node_t *n = d->order_head;
            d->order_head = n->next;
            if (!d->order_head) d->order_tail = NULL;
            pthread_mutex_unlock(&d->order_lock);
            request_finish(n->req, NULL, FAILURE_BACKEND);
            free(n);
            pthread_mutex_lock(&d->order_lock);
        }
        d->delivering = false;
    }
    pthread_mutex_unlock(&d->order_lock);
}

/* Also disarms the timer and waits for its fire: its completions may drop
 * request references, so it must be done before the loader's reference is
 * (model.c, Ownership). */
static void dynamic_stop(scheduler_t *s)
{
    dynamic_batcher_t *d = (dynamic_batcher_t *)s;
    pthread_mutex_lock(&d->lock);
    d->stopped = true;
    pthread_cond_broadcast(&d->work_cond);
    pthread_cond_broadcast(&d->slot_cond);
    pthread_mutex_unlock(&d->lock);
    sched_timer_disarm(&d->timer);
}

static void dynamic_wake(scheduler_t *s)
{
    dynamic_batcher_t *d = (dynamic_batcher_t *)s;
    pthread_mutex_lock(&d->lock);
    pthread_cond_broadcast(&d->work_cond);
    pthread_cond_broadcast(&d->slot_cond);
    pthread_mutex_unlock(&d->lock);
}

static void dynamic_destroy(scheduler_t *s)
{
    dynamic_batcher_t *d = (dynamic_batcher_t *)s;
    dynamic_stop(s);
    /* Instances drained the queues before exiting; anything left fails. */
    for (size_t l = 0; l < d->n_levels; l++) {
        dyn_node_t *n;
        while ((n = queue_pop(&d->levels[l].queue)) || (n = queue_pop(&d->levels[l].delayed))) {
            atomic_fetch_sub(&s->model->stats.pending, 1);
            request_finish(n->req, nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready"),
                           FAILURE_OTHER);
            free(n);
        }
    }
    while (d->order_head) {
        dyn_node_t *n = d->order_head;
        d->order_head = n->next;
        request_finish(n->req, NULL, FAILURE_BACKEND);
        free(n);
    }
    for (size_t i = 0; i < d->n_ragged; i++)
        free(d->ragged[i]);
    free(d->ragged);
    free(d->preferred);
    free(d->levels);
    pthread_mutex_destroy(&d->lock);
    pthread_mutex_destroy(&d->order_lock);
    pthread_cond_destroy(&d->work_cond);
    pthread_cond_destroy(&d->slot_cond);
    free(d);
}

static const scheduler_ops_t dynamic_ops = {
    .name = "dynamic",
    .enqueue = dynamic_enqueue,
    .next_batch = dynamic_next_batch,
    .batch_done = dynamic_batch_done,
    .stop = dynamic_stop,
    .wake = dynamic_wake,
    .destroy = dynamic_destroy,
};

static void set_policy(dyn_level_t *lv, const Inference__ModelQueuePolicy *p)
{
    if (!p) return;
    lv->has_policy = true;
    lv->max_queue_size = p->max_queue_size;
    lv->timeout_us = p->default_timeout_microseconds;
    lv->delay_on_timeout =
        p->timeout_action == INFERENCE__MODEL_QUEUE_POLICY__TIMEOUT_ACTION__DELAY;
    lv->allow_override = p->allow_timeout_override;
}

nereid_error_t *dynamic_batcher_create(model_t *m, const sched_core_t *core, scheduler_t **out)
{
    const Inference__ModelDynamicBatching *db = m->config->dynamic_batching;
    dynamic_batcher_t *d = xcalloc(1, sizeof *d);
    d->base.ops = &dynamic_ops;
    d->base.model = m;
    d->base.core = core;
    d->max_batch_size = m->max_batch_size;
    d->max_delay_ns = us_to_ns(db->max_queue_delay_microseconds);
    d->preserve_ordering = db->preserve_ordering;
    d->preferred = xcalloc(db->n_preferred_batch_size + 1, sizeof *d->preferred);
    for (size_t i = 0; i < db->n_preferred_batch_size; i++) {
        int32_t size = db->preferred_batch_size[i];
        if (size >= 1 && size <= d->max_batch_size) d->preferred[d->n_preferred++] = size;
    }
    /* priority_levels 0: one queue under default_queue_policy; otherwise a
     * level per priority policy, the others created as requests come. */
    d->priority_levels = db->priority_levels;
    d->default_priority =
        db->default_priority_level >= 1 && db->default_priority_level <= db->priority_levels
            ? db->default_priority_level
            : db->priority_levels;
    set_policy(&d->default_policy, db->default_queue_policy);
    if (d->priority_levels == 0) level_get(d, 0)->permanent = true;
    for (size_t i = 0; d->priority_levels && i < db->n_priority_queue_policy; i++) {
        uint64_t key = db->priority_queue_policy[i]->key;
        if (key < 1 || key > d->priority_levels) continue; /* refused by validation */
        dyn_level_t *lv = level_get(d, key);
        set_policy(lv, db->priority_queue_policy[i]->value);
        lv->permanent = true;
    }
    for (size_t i = 0; i < m->config->n_input; i++) {
        if (!m->config->input[i]->allow_ragged_batch) continue;
        d->ragged = xrealloc(d->ragged, (d->n_ragged + 1) * sizeof *d->ragged);
        d->ragged[d->n_ragged++] = xstrdup(m->config->input[i]->name);
    }
    d->hold = scheduler_env_count("NEREID_DELAY_SCHEDULER", "TRITONSERVER_DELAY_SCHEDULER");
    /* Triton's text (L0_backend_config greps it to see dynamic batching on);
     * here the instances form the batches, no thread of its own. */
    LOG_VERBOSE("Starting dynamic-batcher thread for %s at nice 0...", m->name);
    pthread_mutex_init(&d->lock, NULL);
    pthread_mutex_init(&d->order_lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&d->work_cond, &attr);
    pthread_cond_init(&d->slot_cond, &attr);
    pthread_condattr_destroy(&attr);
    d->timer.fire = dynamic_fire;
    *out = &d->base;
    return NULL;
}
