/*
 * This file contains the sequence batcher. Every request names a sequence by
 * its correlation id (uint64 or string) and START/END flags. A live sequence
 * holds one position on one instance for its lifetime: a batch slot (direct
 * strategy: instances x max_batch_size slots) or a candidate place (oldest
 * strategy: max_candidate_sequences per instance); sequences that find no
 * free position wait in an ordered backlog and take the first position freed
 * by an ending or idle sequence.
 *
 * Direct: each execution covers slots 0..k where k is the highest slot with a
 * request ready; slots in between without a request, or whose request's
 * shapes differ from the first one's, get a filler request (zero inputs,
 * READY false) so that batch row i is always slot i. Fillers are removed
 * before the batch is finished; as in Triton they count in the execution's
 * batch size (batch_stats) but not in inference_count. Oldest: each
 * execution takes the oldest ready requests of the instance's candidates, at
 * most one per sequence, by the dynamic batcher's rule (preferred_batch_size,
 * max_queue_delay_microseconds; Triton feeds a dynamic batcher per
 * instance). As in Triton, queueing a request with END ends the id's
 * sequence at once: a START with the same id that follows starts a new
 * sequence (own position), a request without START is refused.
 *
 * Before execution the batcher adds the control tensors the model asks for
 * (shape [1,1] per request for batching models, [1] otherwise) and the
 * implicit state inputs, and asks the core to capture the output states;
 * after execution it keeps each output state as the sequence's next input
 * state. All bookkeeping is under one mutex; a request's inputs and its
 * sequence's state are touched only by the one instance thread executing it.
 *
 * iterative_sequence (Triton's iterative sequencer, for backends that run a
 * request step by step): a request without a correlation id gets one of the
 * scheduler's own and START; the backend may hand a request back
 * (seq_reschedule: Triton's TRITONSERVER_REQUEST_RELEASE_RESCHEDULE), which
 * then queues again on its sequence with START/END cleared; a request that
 * completes without that ends its sequence.
 */
#include "sched/scheduler.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/util.h"

#define N_BUCKETS 256
#define BACKLOG_IDLE_NS 50000000u /* Triton's reaper: a backlogged idle sequence, every 50 ms */
#define STOPPING_TEXT                                                                              \
    "Server is stopping, scheduler for model has stopped accepting new inference requests"

enum {
    CTL_START = INFERENCE__MODEL_SEQUENCE_BATCHING__CONTROL__KIND__CONTROL_SEQUENCE_START,
    CTL_READY = INFERENCE__MODEL_SEQUENCE_BATCHING__CONTROL__KIND__CONTROL_SEQUENCE_READY,
    CTL_END = INFERENCE__MODEL_SEQUENCE_BATCHING__CONTROL__KIND__CONTROL_SEQUENCE_END,
    CTL_CORRID = INFERENCE__MODEL_SEQUENCE_BATCHING__CONTROL__KIND__CONTROL_SEQUENCE_CORRID,
};

typedef struct seq_ctl {
    const char *name; /* borrowed from the model config */
    int kind;
    nereid_datatype_t datatype;
    int32_t i32[2]; /* false, true */
    float f32[2];
    uint8_t b[2];
} seq_ctl_t;

typedef struct seq_state_cfg {
    const char *input_name, *output_name; /* borrowed from the model config */
    nereid_datatype_t datatype;
    int64_t init_shape[NEREID_MAX_RANK]; /* shape of the start state, no batch dim */
    size_t init_rank;
    void *init_data; /* data_file contents, or NULL for zeros */
    size_t init_bytes;
    /* use_same_buffer_for_input_output: the request's input state borrows
     * the sequence's buffer, so a backend writing it in place (Triton's
     * TRITONBACKEND_StateBuffer of the same size) updates the state. */
    bool single_buffer;
} seq_state_cfg_t;

typedef struct state_buf {
    void *data;
    size_t byte_size;
    int64_t shape[NEREID_MAX_RANK]; /* no batch dim */
    size_t rank;
    bool valid;
} state_buf_t;

typedef struct seq {
    uint64_t id;
    char *sid; /* string correlation id, or NULL */
    size_t bucket;
    struct seq *hnext;
    int inst, slot; /* inst -1: in the backlog */
    struct seq *bnext;
    nereid_request_t *qhead, *qtail;
    int in_flight;            /* requests handed to the instance, not yet done */
    bool hashed;              /* found by its id; false once its END request is queued */
    uint64_t last_arrival_ns; /* the sequence's latest request arrived then */
    bool force_end;           /* idle too long: released once its queue drains */
    uint64_t expire_ns;       /* backlog only: earliest request timeout, 0 = none */
    state_buf_t *states;
} seq_t;

typedef struct seq_inst {
    seq_t **slots;
    size_t n_slots;
    nereid_request_t **rows; /* scratch: one per slot */
    seq_t **ready;           /* scratch */
    pthread_cond_t cond;
    size_t hold;      /* test hook: queued requests awaited before the first batch, 0 = none */
    size_t hold_seen; /* requests queued on this instance when it last looked (direct) */
    bool retired;     /* its model instance is leaving (seq_retire): no new sequence */
} seq_inst_t;

typedef struct seq_sched {
    scheduler_t base;
    pthread_mutex_t lock;
    bool oldest;
    bool batching;      /* max_batch_size > 0 */
    int64_t max_rows;   /* requests per execution */
    seq_inst_t **insts; /* by instance index; grows when an update adds instances */
    size_t n_insts;
    size_t per_inst; /* positions per instance */
    seq_t *buckets[N_BUCKETS];
    seq_t *detached; /* sequences whose END is queued, linked by hnext */
    seq_t *backlog_head, *backlog_tail;
    seq_ctl_t *ctls;
    size_t n_ctls;
    const seq_ctl_t *corrid;
    seq_state_cfg_t *states;
    size_t n_states;
    uint64_t idle_ns;
    uint64_t delay_ns;
    float min_util;           /* direct only */
    int64_t preferred_max;    /* oldest: largest preferred batch size */
    const int32_t *preferred; /* oldest: preferred batch sizes (borrowed from the config) */
    size_t n_preferred;
    bool stopped;
    bool iterative;                /* sequence_batching.iterative_sequence */
    _Atomic uint64_t next_iter_id; /* iterative: the next correlation id it gives */
    pthread_t reaper;
    bool reaper_started;
    pthread_cond_t reaper_cond;
    uint64_t reaper_wake_ns; /* when the reaper wakes next; UINT64_MAX: only when signalled */
    size_t backlog_hold;     /* test hook: backlogged requests awaited as well (direct) */
    bool hold_met;           /* direct: an instance saw the hold's counts reached */
} seq_sched_t;

/* ---- Helpers ---- */

static int64_t elem_count(const int64_t *shape, size_t rank)
{
    int64_t n = 1;
    for (size_t i = 0; i < rank; i++)
        n *= shape[i];
    return n;
}

/* Byte size of a zero-filled tensor (BYTES: empty strings). */
static size_t zero_bytes(nereid_datatype_t dt, const int64_t *shape, size_t rank)
{
    int64_t n = elem_count(shape, rank);
    size_t esize = dt == NEREID_TYPE_BYTES ? 4 : nereid_datatype_byte_size(dt);
    return (size_t)n * esize;
}

static void format_id(char *buf, size_t len, const char *sid, uint64_t id)
{
    if (sid)
        snprintf(buf, len, "%s", sid);
    else
        snprintf(buf, len, "%" PRIu64, id);
}

static size_t hash_id(const char *sid, uint64_t id)
{
    uint64_t h;
    if (sid) {
        h = 1469598103934665603ull;
        for (const unsigned char *p = (const unsigned char *)sid; *p; p++)
            h = (h ^ *p) * 1099511628211ull;
    } else {
        h = id * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
    }
    return (size_t)(h % N_BUCKETS);
}

static seq_t *seq_find(seq_sched_t *q, const char *sid, uint64_t id)
{
    for (seq_t *s = q->buckets[hash_id(sid, id)]; s; s = s->hnext) {
        if (sid ? s->sid && strcmp(s->sid, sid) == 0 : !s->sid && s->id == id) return s;
    }
    return NULL;
}

/* Whether the model's input name has allow_ragged_batch. */
static bool input_ragged(const model_t *m, const char *name)
{
    for (size_t i = 0; i < m->config->n_input; i++)
        if (strcmp(m->config->input[i]->name, name) == 0)
            return m->config->input[i]->allow_ragged_batch;
    return false;
}

/* Same inputs with the same shapes (ragged inputs: any shape, as Triton). */
static bool same_client_shapes(const model_t *m, const nereid_request_t *a,
                               const nereid_request_t *b)
{
    if (a->n_inputs != b->n_inputs) return false;
    for (size_t i = 0; i < a->n_inputs; i++) {
        const req_input_t *x = &a->inputs[i];
        const req_input_t *y = NULL;
        for (size_t j = 0; j < b->n_inputs && !y; j++)
            if (strcmp(b->inputs[j].name, x->name) == 0) y = &b->inputs[j];
        if (!y) return false;
        if ((x->rank != y->rank || memcmp(x->shape, y->shape, x->rank * sizeof *x->shape) != 0) &&
            !input_ragged(m, x->name))
            return false;
    }
    return true;
}

/* The shape request req of sequence s will get for state i. */
static void state_shape(const seq_sched_t *q, const seq_t *s, const nereid_request_t *req, size_t i,
                        const int64_t **shape, size_t *rank)
{
    const state_buf_t *b = &s->states[i];
    if (req->seq_start || !b->valid) {
        *shape = q->states[i].init_shape;
        *rank = q->states[i].init_rank;
    } else {
        *shape = b->shape;
        *rank = b->rank;
    }
}

/* True when b's head request can share a batch with request a of sequence
 * sa: same client input shapes and same state shapes (inputs are gathered
 * into one tensor per name). */
static bool batchable(const seq_sched_t *q, const seq_t *sa, const nereid_request_t *a,
                      const seq_t *sb)
{
    const nereid_request_t *b = sb->qhead;
    if (!same_client_shapes(q->base.model, a, b)) return false;
    for (size_t i = 0; i < q->n_states; i++) {
        const int64_t *x, *y;
        size_t rx, ry;
        state_shape(q, sa, a, i, &x, &rx);
        state_shape(q, sb, b, i, &y, &ry);
        if (rx != ry || memcmp(x, y, rx * sizeof *x) != 0) return false;
    }
    return true;
}

/* ---- Sequence lifetime (lock held) ---- */

/* Gives a free position (inst, slot) to the oldest backlogged sequence. */
static void give_position(seq_sched_t *q, int inst, int slot)
{
    seq_t *b = q->backlog_head;
    seq_inst_t *si = q->insts[inst];
    if (si->retired) pthread_cond_broadcast(&si->cond); /* not given: it may leave (seq_retire) */
    if (!b || si->retired) return;
    q->backlog_head = b->bnext;
    if (!q->backlog_head) q->backlog_tail = NULL;
    b->bnext = NULL;
    b->expire_ns = 0;
    b->inst = inst;
    b->slot = slot;
    q->insts[inst]->slots[slot] = b;
    pthread_cond_broadcast(&q->insts[inst]->cond);
}

static void free_states(seq_sched_t *q, seq_t *s)
{
    for (size_t i = 0; s->states && i < q->n_states; i++)
        free(s->states[i].data);
    free(s->states);
    s->states = NULL;
}

/* Forgets the sequence's id (its END request is queued, or it is ending):
 * later requests with the id start a new sequence or are refused. */
static void seq_unlink(seq_sched_t *q, seq_t *s)
{
    seq_t **pp = s->hashed ? &q->buckets[s->bucket] : &q->detached;
    while (*pp != s)
        pp = &(*pp)->hnext;
    *pp = s->hnext;
    s->hnext = NULL;
}

static void seq_unhash(seq_sched_t *q, seq_t *s)
{
    if (!s->hashed) return;
    seq_unlink(q, s);
    s->hashed = false;
    s->hnext = q->detached;
    q->detached = s;
}

/* Removes a sequence (nothing queued or in flight) and frees its position. */
static void seq_release(seq_sched_t *q, seq_t *s)
{
    seq_unlink(q, s);
    if (s->inst >= 0) {
        q->insts[s->inst]->slots[s->slot] = NULL;
        give_position(q, s->inst, s->slot);
    } else {
        seq_t **bp = &q->backlog_head, *prev = NULL;
        while (*bp && *bp != s) {
            prev = *bp;
            bp = &(*bp)->bnext;
        }
        if (*bp) {
            *bp = s->bnext;
            if (q->backlog_tail == s) q->backlog_tail = prev;
        }
    }
    free_states(q, s);
    free(s->sid);
    free(s);
}

static seq_inst_t *seq_inst_new(const seq_sched_t *q)
{
    seq_inst_t *si = xcalloc(1, sizeof *si);
    si->n_slots = q->per_inst;
    si->slots = xcalloc(q->per_inst ? q->per_inst : 1, sizeof *si->slots);
    si->rows = xcalloc(q->per_inst ? q->per_inst : 1, sizeof *si->rows);
    si->ready = xcalloc(q->per_inst ? q->per_inst : 1, sizeof *si->ready);
    util_cond_init_monotonic(&si->cond);
    return si;
}

/* A retired instance leaves once none of its positions holds a sequence. */
static bool inst_gone(const seq_inst_t *si)
{
    for (size_t k = 0; si->retired && k < si->n_slots; k++)
        if (si->slots[k]) return false;
    return si->retired;
}

/* Finds a free position, spreading sequences over instances first. */
static bool find_position(seq_sched_t *q, int *inst, int *slot)
{
    size_t max_slots = 0;
    for (size_t i = 0; i < q->n_insts; i++)
        if (q->insts[i]->n_slots > max_slots) max_slots = q->insts[i]->n_slots;
    for (size_t k = 0; k < max_slots; k++)
        for (size_t i = 0; i < q->n_insts; i++)
            if (k < q->insts[i]->n_slots && !q->insts[i]->slots[k] && !q->insts[i]->retired) {
                *inst = (int)i;
                *slot = (int)k;
                return true;
            }
    return false;
}

static seq_t *seq_create(seq_sched_t *q, const char *sid, uint64_t id)
{
    seq_t *s = xcalloc(1, sizeof *s);
    s->id = id;
    s->sid = sid ? xstrdup(sid) : NULL;
    s->bucket = hash_id(sid, id);
    s->hnext = q->buckets[s->bucket];
    q->buckets[s->bucket] = s;
    s->hashed = true;
    if (q->n_states) s->states = xcalloc(q->n_states, sizeof *s->states);
    int inst, slot;
    if (find_position(q, &inst, &slot)) {
        s->inst = inst;
        s->slot = slot;
        q->insts[inst]->slots[slot] = s;
    } else {
        s->inst = -1;
        if (q->backlog_tail)
            q->backlog_tail->bnext = s;
        else
            q->backlog_head = s;
        q->backlog_tail = s;
    }
    return s;
}

/* ---- Enqueue ---- */

/* Appends req to its sequence's queue and wakes the sequence's instance.
 * Lock held. */
static void queue_push(seq_sched_t *q, seq_t *s, nereid_request_t *req)
{
    req->sched_data = s;
    req->next = NULL;
    if (s->qtail)
        s->qtail->next = req;
    else
        s->qhead = req;
    s->qtail = req;
    atomic_fetch_add(&q->base.model->stats.pending, 1);
    if (s->inst >= 0) pthread_cond_broadcast(&q->insts[s->inst]->cond);
}

static nereid_error_t *seq_enqueue(scheduler_t *base, nereid_request_t *req)
{
    seq_sched_t *q = (seq_sched_t *)base;
    model_t *m = base->model;
    if (req->batch_size != 1)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "inference request to model '%s' must specify batch-size 1 due to "
                                "requirements of sequence batcher",
                                m->name);
    if (q->iterative && !req->corr_id_str && req->corr_id == 0) {
        /* Triton's iterative sequencer: a request of its own is a sequence */
        req->corr_id = atomic_fetch_add(&q->next_iter_id, 1);
        req->seq_start = true;
    }
    const char *sid = req->corr_id_str;
    if (sid ? sid[0] == 0 : req->corr_id == 0)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "inference request to model '%s' must specify a non-zero or "
                                "non-empty correlation ID",
                                m->name);
    if (q->corrid && (sid != NULL) != (q->corrid->datatype == NEREID_TYPE_BYTES))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "[request id: %s] sequence batching control '%s' data-type is "
                                "'%s', but model '%s' expects '%s'",
                                req->id ? req->id : "<id_unknown>", q->corrid->name,
                                sid ? "BYTES" : "UINT64", m->name,
                                nereid_datatype_name(q->corrid->datatype));
    pthread_mutex_lock(&q->lock);
    if (q->stopped) {
        pthread_mutex_unlock(&q->lock);
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE, STOPPING_TEXT);
    }
    seq_t *s = seq_find(q, sid, req->corr_id);
    if (!req->seq_start && !s) {
        pthread_mutex_unlock(&q->lock);
        char idbuf[160];
        format_id(idbuf, sizeof idbuf, sid, req->corr_id);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "inference request for sequence %s to model '%s' must specify the "
                                "START flag on the first request of the sequence",
                                idbuf, m->name);
    }
    if (!s) {
        s = seq_create(q, sid, req->corr_id);
    } else if (req->seq_start) {
        char idbuf[160];
        format_id(idbuf, sizeof idbuf, sid, req->corr_id);
        LOG_WARN("sequence %s for model '%s' has a conflict. The previous sequence did not end "
                 "before this sequence start. Previous sequence will be terminated early.",
                 idbuf, m->name);
    }
    /* As in Triton, an END request ends the id's sequence now: a START with
     * the same id that follows is a new sequence with a position of its own. */
    if (req->seq_end) seq_unhash(q, s);
    s->last_arrival_ns = util_now_ns();
    /* deadlines only grow: wake the reaper only if it sleeps for good */
    if (q->reaper_wake_ns == UINT64_MAX) pthread_cond_signal(&q->reaper_cond);
    if (s->inst < 0 && req->deadline_ns) {
        /* Triton's rule: a request's timeout applies while its sequence
         * waits in the backlog; a sequence with a position never loses a
         * step to a timeout (L0_sequence_batcher test_request_timeout). */
        uint64_t exp = req->deadline_ns;
        if (!s->expire_ns || exp < s->expire_ns) s->expire_ns = exp;
        if (exp < q->reaper_wake_ns) pthread_cond_signal(&q->reaper_cond);
    }
    queue_push(q, s, req);
    pthread_mutex_unlock(&q->lock);
    return NULL;
}

/* ---- Controls and state ---- */

static void *control_value(const seq_ctl_t *c, bool flag, const char *sid, uint64_t id,
                           size_t *bytes)
{
    void *p;
    switch (c->datatype) {
    case NEREID_TYPE_INT32:
        if (c->kind == CTL_CORRID) {
            uint32_t v = (uint32_t)id;
            p = xmalloc(4);
            memcpy(p, &v, 4);
        } else {
            p = xmalloc(4);
            memcpy(p, &c->i32[flag], 4);
        }
        *bytes = 4;
        return p;
    case NEREID_TYPE_UINT32: {
        uint32_t v = (uint32_t)id;
        p = xmalloc(4);
        memcpy(p, &v, 4);
        *bytes = 4;
        return p;
    }
    case NEREID_TYPE_FP32:
        p = xmalloc(4);
        memcpy(p, &c->f32[flag], 4);
        *bytes = 4;
        return p;
    case NEREID_TYPE_BOOL:
        p = xmalloc(1);
        *(uint8_t *)p = c->b[flag];
        *bytes = 1;
        return p;
    case NEREID_TYPE_BYTES: {
        uint32_t len = sid ? (uint32_t)strlen(sid) : 0;
        p = xmalloc(4 + len);
        memcpy(p, &len, 4);
        if (len) memcpy((char *)p + 4, sid, len);
        *bytes = 4 + len;
        return p;
    }
    default: /* UINT64, INT64 */
        p = xmalloc(8);
        memcpy(p, &id, 8);
        *bytes = 8;
        return p;
    }
}

/* Adds every control tensor; filler requests get false/zero values. */
static void add_controls(seq_sched_t *q, nereid_request_t *req, const seq_t *s, bool filler)
{
    int64_t shape[2] = {1, 1};
    size_t rank = q->batching ? 2 : 1;
    for (size_t i = 0; i < q->n_ctls; i++) {
        const seq_ctl_t *c = &q->ctls[i];
        bool flag = false;
        if (!filler) {
            if (c->kind == CTL_START) flag = req->seq_start;
            if (c->kind == CTL_END) flag = req->seq_end;
            if (c->kind == CTL_READY) flag = true;
        }
        size_t bytes;
        void *data = control_value(c, flag, filler ? NULL : s->sid, filler ? 0 : s->id, &bytes);
        request_add_owned_input(req, c->name, c->datatype, shape, rank, data, bytes);
    }
}

static void add_state_input(seq_sched_t *q, nereid_request_t *req, size_t i, const void *src,
                            size_t bytes, const int64_t *shape, size_t rank)
{
    int64_t full[NEREID_MAX_RANK + 1];
    size_t r = 0;
    if (q->batching) full[r++] = 1;
    for (size_t d = 0; d < rank && r < NEREID_MAX_RANK; d++)
        full[r++] = shape[d];
    void *data = xmalloc(bytes ? bytes : 1);
    if (src)
        memcpy(data, src, bytes);
    else
        memset(data, 0, bytes ? bytes : 1);
    request_add_owned_input(req, q->states[i].input_name, q->states[i].datatype, full, r, data,
                            bytes);
}

/* A single-buffer state: the sequence's own buffer (the initial state at the
 * start) is lent to the request as its input state. Only the one request of
 * the sequence that is executing uses it. */
static void add_single_buffer_state(seq_sched_t *q, nereid_request_t *req, size_t i, state_buf_t *b)
{
    const seq_state_cfg_t *cfg = &q->states[i];
    if (req->seq_start || !b->valid) {
        free(b->data);
        b->byte_size = cfg->init_bytes;
        b->data = xmalloc(b->byte_size ? b->byte_size : 1);
        if (cfg->init_data)
            memcpy(b->data, cfg->init_data, b->byte_size);
        else
            memset(b->data, 0, b->byte_size ? b->byte_size : 1);
        b->rank = cfg->init_rank;
        memcpy(b->shape, cfg->init_shape, b->rank * sizeof *b->shape);
        b->valid = true;
    }
    int64_t full[NEREID_MAX_RANK + 1];
    size_t r = 0;
    if (q->batching) full[r++] = 1;
    for (size_t d = 0; d < b->rank && r < NEREID_MAX_RANK; d++)
        full[r++] = b->shape[d];
    request_add_borrowed_input(req, cfg->input_name, cfg->datatype, full, r, b->data, b->byte_size);
}

/* Adds controls and input states to a request about to execute and asks
 * the core to capture its output states. */
static void prepare_request(seq_sched_t *q, nereid_request_t *req)
{
    seq_t *s = req->sched_data;
    add_controls(q, req, s, false);
    for (size_t i = 0; i < q->n_states; i++) {
        const seq_state_cfg_t *cfg = &q->states[i];
        state_buf_t *b = &s->states[i];
        if (cfg->single_buffer) {
            add_single_buffer_state(q, req, i, b);
        } else if (req->seq_start || !b->valid)
            add_state_input(q, req, i, cfg->init_data, cfg->init_bytes, cfg->init_shape,
                            cfg->init_rank);
        else
            add_state_input(q, req, i, b->data, b->byte_size, b->shape, b->rank);
        request_capture_output(req, cfg->output_name);
    }
}

/* A request standing for an empty slot: zero inputs shaped like tmpl's,
 * false controls. sched_data NULL marks it. */
static nereid_request_t *make_filler(seq_sched_t *q, const nereid_request_t *tmpl)
{
    nereid_request_t *f = request_new_filler(tmpl->server);
    for (size_t i = 0; i < tmpl->n_inputs; i++) {
        const req_input_t *in = &tmpl->inputs[i];
        bool is_ctl = false;
        for (size_t c = 0; c < q->n_ctls && !is_ctl; c++)
            is_ctl = strcmp(q->ctls[c].name, in->name) == 0;
        if (is_ctl) continue;
        size_t bytes = in->datatype == NEREID_TYPE_BYTES
                           ? zero_bytes(in->datatype, in->shape, in->rank)
                           : in->byte_size;
        void *data = xcalloc(1, bytes ? bytes : 1);
        request_add_owned_input(f, in->name, in->datatype, in->shape, in->rank, data, bytes);
    }
    add_controls(q, f, NULL, true);
    return f;
}

/* Keeps the request's output states as the sequence's next input states. */
static void save_states(seq_sched_t *q, seq_t *s, nereid_request_t *req)
{
    for (size_t i = 0; i < q->n_states; i++) {
        resp_output_t *o = request_find_output(req, q->states[i].output_name);
        if (!o || !request_output_filled(o) || !o->data) continue;
        state_buf_t *b = &s->states[i];
        if (q->states[i].single_buffer && b->data == o->data) continue; /* written in place */
        if (q->states[i].single_buffer && b->data && b->byte_size == o->byte_size) {
            memcpy(b->data, o->data, o->byte_size); /* the buffer the next request gets */
            continue;
        }
        free(b->data);
        b->data = request_output_take(o);
        if (!b->data) {
            b->data = xmalloc(o->byte_size ? o->byte_size : 1);
            memcpy(b->data, o->data, o->byte_size);
        }
        b->byte_size = o->byte_size;
        size_t skip = q->batching && o->rank > 0 ? 1 : 0;
        b->rank = o->rank - skip;
        memcpy(b->shape, o->shape + skip, b->rank * sizeof *b->shape);
        b->valid = true;
    }
}

/* ---- Batches ---- */

static uint64_t head_time(const seq_t *s)
{
    return s->qhead->t_queue_start_ns;
}

/* Takes the head request of s (lock held). */
static nereid_request_t *pop_head(seq_sched_t *q, seq_t *s)
{
    nereid_request_t *req = s->qhead;
    s->qhead = req->next;
    if (!s->qhead) s->qtail = NULL;
    req->next = NULL;
    s->in_flight++;
    atomic_fetch_sub(&q->base.model->stats.pending, 1);
    return req;
}

/* ---- Cancellation ----
 * As in Triton, a sequence whose next request was cancelled ends: that
 * request and every one queued behind it are completed as cancelled, and
 * the sequence's position is freed (later requests for its correlation id
 * need START again). Looked at when an instance forms a batch, for the
 * sequences of its positions with nothing in flight. Lock held; the caller
 * completes *out's requests (linked by next) without it. */
static bool sweep_cancelled(seq_sched_t *q, seq_inst_t *si, nereid_request_t **out)
{
    bool any = false;
    for (size_t k = 0; k < si->n_slots; k++) {
        seq_t *s = si->slots[k];
        if (!s || !s->qhead || s->in_flight || !request_cancelled(s->qhead)) continue;
        while (s->qhead) {
            nereid_request_t *r = s->qhead;
            s->qhead = r->next;
            r->next = *out;
            *out = r;
            atomic_fetch_sub(&q->base.model->stats.pending, 1);
        }
        s->qtail = NULL;
        seq_release(q, s);
        any = true;
    }
    return any;
}

static void finish_cancelled(seq_sched_t *q, nereid_request_t *list)
{
    pthread_mutex_unlock(&q->lock);
    while (list) {
        nereid_request_t *r = list;
        list = r->next;
        r->next = NULL;
        r->sched_data = NULL;
        request_finish_cancelled(r);
    }
    pthread_mutex_lock(&q->lock);
}

/* ---- Test hooks ----
 * NEREID_DELAY_SCHEDULER (or Triton's TRITONSERVER_DELAY_SCHEDULER) = N
 * holds each instance's first batch, as Triton's sequence batcher does:
 * direct, until the instances' queues together hold N requests (each
 * instance counts its own queue every 10 ms; the sum uses each instance's
 * last count) and, with NEREID_BACKLOG_DELAY_SCHEDULER (or
 * TRITONSERVER_BACKLOG_DELAY_SCHEDULER) = B, until the backlog holds B
 * requests; oldest, until the instance's candidate sequences have N
 * requests ready (Triton's dynamic batcher under it counts its own queue).
 * Once released an instance is not held again. Warmup requests are never
 * held. Lock held. */
#define HOLD_POLL_NS 10000000u

static bool warmup_queued(const seq_inst_t *si)
{
    for (size_t k = 0; k < si->n_slots; k++)
        if (si->slots[k] && si->slots[k]->qhead && si->slots[k]->qhead->warmup) return true;
    return false;
}

static size_t queue_length(const seq_t *s)
{
    size_t n = 0;
    for (const nereid_request_t *r = s->qhead; r; r = r->next)
        n++;
    return n;
}

/* Direct: true while inst must wait (then it looks again in 10 ms). */
static bool direct_held(seq_sched_t *q, seq_inst_t *si)
{
    if (!si->hold || q->stopped || warmup_queued(si)) return false;
    if (q->hold_met) {
        si->hold = 0;
        return false;
    }
    si->hold_seen = 0;
    for (size_t k = 0; k < si->n_slots; k++)
        if (si->slots[k]) si->hold_seen += queue_length(si->slots[k]);
    size_t seen = 0;
    for (size_t i = 0; i < q->n_insts; i++)
        seen += q->insts[i]->hold_seen;
    if (seen < si->hold) return true;
    if (q->backlog_hold) {
        size_t backlog = 0;
        for (const seq_t *b = q->backlog_head; b; b = b->bnext)
            backlog += queue_length(b);
        if (backlog < q->backlog_hold) return true;
    }
    /* Triton's instances each see this on their next look (every 10 ms),
     * before the first batches run; once seen it holds for all of them, so
     * an instance that looks late is not kept by a backlog that the first
     * ones have since emptied. */
    q->hold_met = true;
    si->hold = 0;
    for (size_t i = 0; i < q->n_insts; i++)
        pthread_cond_broadcast(&q->insts[i]->cond);
    return false;
}

static bool direct_next_batch(seq_sched_t *q, seq_inst_t *si, batch_t *batch)
{
    pthread_mutex_lock(&q->lock);
    size_t n_ready;
    for (;;) {
        if (inst_gone(si)) { /* seq_retire: its last sequence ended */
            pthread_mutex_unlock(&q->lock);
            return false;
        }
        nereid_request_t *cancelled = NULL;
        if (sweep_cancelled(q, si, &cancelled)) {
            finish_cancelled(q, cancelled);
            continue;
        }
        if (direct_held(q, si)) {
            util_cond_wait_until(&si->cond, &q->lock, util_now_ns() + HOLD_POLL_NS);
            continue;
        }
        n_ready = 0;
        uint64_t oldest = UINT64_MAX;
        for (size_t k = 0; k < si->n_slots; k++) {
            seq_t *s = si->slots[k];
            if (s && s->qhead && !s->in_flight) {
                n_ready++;
                if (head_time(s) < oldest) oldest = head_time(s);
            }
        }
        if (n_ready > 0) {
            if (q->stopped || q->min_util <= 0.0f || q->delay_ns == 0 ||
                (float)n_ready >= q->min_util * (float)si->n_slots)
                break;
            uint64_t deadline = oldest + q->delay_ns;
            if (util_now_ns() >= deadline) break;
            util_cond_wait_until(&si->cond, &q->lock, deadline);
            continue;
        }
        if (q->stopped) {
            pthread_mutex_unlock(&q->lock);
            return false;
        }
        pthread_cond_wait(&si->cond, &q->lock);
    }
    const nereid_request_t *first = NULL;
    const seq_t *first_seq = NULL;
    size_t rows = 0;
    for (size_t k = 0; k < si->n_slots; k++) {
        si->rows[k] = NULL;
        seq_t *s = si->slots[k];
        if (!s || !s->qhead || s->in_flight) continue;
        /* As in Triton the batch spans every slot up to the last one with a
         * request ready, even when that request cannot join this batch. */
        rows = k + 1;
        if (first && !batchable(q, first_seq, first, s)) continue;
        if (!first) first_seq = s;
        si->rows[k] = pop_head(q, s);
        if (!first) first = si->rows[k];
    }
    pthread_mutex_unlock(&q->lock);
    nereid_request_t *tmpl = NULL;
    for (size_t k = 0; k < rows; k++)
        if (si->rows[k]) {
            prepare_request(q, si->rows[k]);
            if (!tmpl) tmpl = si->rows[k];
        }
    for (size_t k = 0; k < rows; k++)
        batch_add(batch, si->rows[k] ? si->rows[k] : make_filler(q, tmpl));
    return true;
}

static bool oldest_preferred(const seq_sched_t *q, size_t size)
{
    for (size_t i = 0; i < q->n_preferred; i++)
        if ((size_t)q->preferred[i] == size) return true;
    return false;
}

/* Oldest: how many of the n ready sequences (oldest first) run now, by the
 * rule of Triton's dynamic batcher that the oldest strategy feeds (see
 * plan_batch in dynamic.c; every sequence adds one row); 0 with
 * *wait_until set when the batch should wait for the queue delay. */
static size_t oldest_plan(seq_sched_t *q, seq_inst_t *si, size_t n, uint64_t now,
                          uint64_t *wait_until)
{
    size_t max_pref = q->preferred_max > 0 ? (size_t)q->preferred_max : (size_t)q->max_rows;
    size_t count = 0, marked = 0;
    bool send_now = false;
    for (size_t j = 0; j < n; j++) {
        if (j > 0) {
            if (count + 1 > max_pref && !marked) marked = count;
            if (count + 1 > (size_t)q->max_rows ||
                !batchable(q, si->ready[0], si->ready[0]->qhead, si->ready[j])) {
                send_now = true;
                break;
            }
        }
        count++;
        if (oldest_preferred(q, count)) marked = count;
    }
    uint64_t oldest = head_time(si->ready[0]);
    bool delay_passed = q->delay_ns && now - oldest >= q->delay_ns;
    *wait_until = 0;
    if (marked && !delay_passed) return marked;
    if (send_now || count >= max_pref || delay_passed || !q->delay_ns || q->stopped) return count;
    *wait_until = oldest + q->delay_ns;
    return 0;
}

static bool oldest_next_batch(seq_sched_t *q, seq_inst_t *si, batch_t *batch)
{
    pthread_mutex_lock(&q->lock);
    size_t n, take;
    for (;;) {
        if (inst_gone(si)) { /* seq_retire: its last sequence ended */
            pthread_mutex_unlock(&q->lock);
            return false;
        }
        nereid_request_t *cancelled = NULL;
        if (sweep_cancelled(q, si, &cancelled)) {
            finish_cancelled(q, cancelled);
            continue;
        }
        n = 0;
        for (size_t k = 0; k < si->n_slots; k++) {
            seq_t *s = si->slots[k];
            if (!s || !s->qhead || s->in_flight) continue;
            /* insertion sort by the head request's queue time */
            size_t j = n++;
            while (j > 0 && head_time(si->ready[j - 1]) > head_time(s)) {
                si->ready[j] = si->ready[j - 1];
                j--;
            }
            si->ready[j] = s;
        }
        if (si->hold && !q->stopped && !warmup_queued(si)) {
            if (n < si->hold) {
                pthread_cond_wait(&si->cond, &q->lock);
                continue;
            }
            si->hold = 0;
        }
        if (n > 0) {
            uint64_t deadline;
            take = oldest_plan(q, si, n, util_now_ns(), &deadline);
            if (take) break;
            util_cond_wait_until(&si->cond, &q->lock, deadline);
            continue;
        }
        if (q->stopped) {
            pthread_mutex_unlock(&q->lock);
            return false;
        }
        pthread_cond_wait(&si->cond, &q->lock);
    }
    for (size_t j = 0; j < take; j++)
        si->rows[j] = pop_head(q, si->ready[j]);
    pthread_mutex_unlock(&q->lock);
    for (size_t j = 0; j < take; j++) {
        prepare_request(q, si->rows[j]);
        batch_add(batch, si->rows[j]);
    }
    return true;
}

/* Adds the positions of the next instance index, which backlogged sequences
 * take unless it is retired (by the core, or in v[0..n)). Lock held. */
static void add_inst(seq_sched_t *q, model_instance_t *const *v, size_t n)
{
    size_t j = q->n_insts;
    const model_t *m = q->base.model;
    seq_inst_t *si = seq_inst_new(q);
    si->retired = j < m->n_instances && atomic_load(&m->instances[j]->retired);
    for (size_t o = 0; o < n; o++)
        si->retired |= v[o]->index == j;
    q->insts = xrealloc(q->insts, (j + 1) * sizeof *q->insts);
    q->insts[q->n_insts++] = si;
    for (size_t k = 0; k < si->n_slots; k++)
        give_position(q, (int)j, (int)k);
}

static bool seq_next_batch(scheduler_t *base, model_instance_t *inst, batch_t *batch)
{
    seq_sched_t *q = (seq_sched_t *)base;
    pthread_mutex_lock(&q->lock);
    /* Instances an in-place update added get their positions with their
     * thread's first look (or an update's retire, whichever comes first). */
    while (q->n_insts <= inst->index && !q->stopped)
        add_inst(q, NULL, 0);
    seq_inst_t *si = inst->index < q->n_insts ? q->insts[inst->index] : NULL;
    bool leave = !si || inst_gone(si);
    pthread_mutex_unlock(&q->lock);
    if (leave) return false;
    return q->oldest ? oldest_next_batch(q, si, batch) : direct_next_batch(q, si, batch);
}

/* ---- In-place instance updates ---- */

/* Triton's SequenceBatchScheduler::Update: a removed instance gets no new
 * sequence; one with live sequences serves them (lingering) and leaves
 * when the last ends, its positions not given to the backlog. */
static void seq_retire(scheduler_t *base, model_instance_t *const *v, size_t n)
{
    seq_sched_t *q = (seq_sched_t *)base;
    pthread_mutex_lock(&q->lock);
    for (size_t i = 0; i < n; i++) {
        while (q->n_insts <= v[i]->index) /* its thread has not looked yet */
            add_inst(q, v, n);
        seq_inst_t *si = q->insts[v[i]->index];
        si->retired = true;
        if (!inst_gone(si)) atomic_store(&v[i]->lingering, true);
    }
    pthread_mutex_unlock(&q->lock);
}

/* A warmup run on one instance directly: prepare_request's controls, states. */
static void seq_prepare_direct(scheduler_t *base, nereid_request_t *req)
{
    seq_sched_t *q = (seq_sched_t *)base;
    seq_t s = {.id = req->corr_id, .sid = req->corr_id_str};
    add_controls(q, req, &s, false);
    for (size_t i = 0; i < q->n_states; i++)
        add_state_input(q, req, i, q->states[i].init_data, q->states[i].init_bytes,
                        q->states[i].init_shape, q->states[i].init_rank);
}

static void seq_wake(scheduler_t *base)
{
    seq_sched_t *q = (seq_sched_t *)base;
    pthread_mutex_lock(&q->lock);
    for (size_t i = 0; i < q->n_insts; i++)
        pthread_cond_broadcast(&q->insts[i]->cond);
    pthread_mutex_unlock(&q->lock);
}

/* ---- Rescheduling (iterative_sequence) ---- */

static nereid_error_t *seq_reschedule(scheduler_t *base, nereid_request_t *req)
{
    seq_sched_t *q = (seq_sched_t *)base;
    if (!q->iterative)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, "
                                "while the model is not configured to handle such a flag.");
    seq_t *s = req->sched_data;
    pthread_mutex_lock(&q->lock);
    bool stopped = q->stopped, ended = !s->hashed || s->force_end;
    pthread_mutex_unlock(&q->lock);
    if (stopped) return nereid_error_new(NEREID_ERROR_UNAVAILABLE, STOPPING_TEXT);
    if (ended) {
        /* As Triton: queued again without START, the sequence is unknown. */
        char idbuf[160];
        format_id(idbuf, sizeof idbuf, s->sid, s->id);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "inference request for sequence %s to model '%s' must specify the "
                                "START flag on the first request of the sequence",
                                idbuf, base->model->name);
    }
    req->reschedule = true;
    return NULL;
}

/* Queues a rescheduled request again at the end of its sequence's queue,
 * without START/END and with a fresh response. Lock held. */
static void requeue(seq_sched_t *q, seq_t *s, nereid_request_t *req)
{
    req->reschedule = false;
    req->seq_start = req->seq_end = false;
    nereid_response_free(req->response);
    req->response = request_new_response(req);
    s->last_arrival_ns = util_now_ns();
    queue_push(q, s, req);
}

static void seq_batch_done(scheduler_t *base, model_instance_t *inst, batch_t *batch)
{
    (void)inst;
    seq_sched_t *q = (seq_sched_t *)base;
    size_t w = 0;
    for (size_t r = 0; r < batch->n_reqs; r++) {
        nereid_request_t *req = batch->reqs[r];
        if (!req->sched_data) {
            batch->total_batch -= req->batch_size;
            batch->filler_rows += req->batch_size;
            request_free(req);
            continue;
        }
        if (!request_failed(req)) save_states(q, req->sched_data, req);
        batch->reqs[w++] = req;
    }
    batch->n_reqs = w;
    pthread_mutex_lock(&q->lock);
    w = 0;
    for (size_t r = 0; r < batch->n_reqs; r++) {
        nereid_request_t *req = batch->reqs[r];
        seq_t *s = req->sched_data;
        req->sched_data = NULL;
        s->in_flight--;
        if (req->reschedule && !request_failed(req)) {
            requeue(q, s, req);
            continue;
        }
        req->reschedule = false;
        batch->reqs[w++] = req;
        if (q->iterative) {
            seq_unhash(q, s); /* its request is done: the sequence ends */
            s->force_end = true;
        }
        if (s->qhead) {
            if (s->inst >= 0) pthread_cond_broadcast(&q->insts[s->inst]->cond);
        } else if (s->in_flight == 0 && (req->seq_end || s->force_end)) {
            seq_release(q, s);
        }
    }
    batch->n_reqs = w;
    pthread_mutex_unlock(&q->lock);
    base->core->complete(batch, true);
}

/* ---- Idle sequences ----
 * As in Triton, a sequence is idle when its latest request arrived
 * max_sequence_idle_microseconds ago, whether or not that request has run:
 * the reaper then ends it (later requests need START); requests already
 * queued still run, and its position is freed once they have. */

/* Fails every queued request of backlogged sequences whose request timeout
 * expired (Triton's backlog timeout); returns the next expiry. Lock held;
 * the failed requests are appended to *failed for finishing unlocked. */
static uint64_t expire_backlog(seq_sched_t *q, uint64_t now, nereid_request_t ***failed_tail)
{
    uint64_t next = UINT64_MAX;
    seq_t *s = q->backlog_head;
    while (s) {
        seq_t *after = s->bnext;
        if (s->expire_ns && s->expire_ns <= now) {
            for (nereid_request_t *r = s->qhead; r; r = r->next) {
                r->sched_data = NULL;
                atomic_fetch_sub(&q->base.model->stats.pending, 1);
            }
            **failed_tail = s->qhead;
            if (s->qtail) *failed_tail = &s->qtail->next;
            s->qhead = s->qtail = NULL;
            seq_release(q, s);
        } else if (s->expire_ns && s->expire_ns < next) {
            next = s->expire_ns;
        }
        s = after;
    }
    return next;
}

static void finish_all(nereid_request_t *list, nereid_error_code_t code, const char *msg,
                       failure_reason_t reason)
{
    while (list) {
        nereid_request_t *r = list;
        list = r->next;
        r->next = NULL;
        request_finish(r, nereid_error_new(code, "%s", msg), reason);
    }
}

static void *reaper_main(void *arg)
{
    seq_sched_t *q = arg;
    pthread_mutex_lock(&q->lock);
    while (!q->stopped) {
        uint64_t now = util_now_ns();
        nereid_request_t *failed = NULL, **tail = &failed;
        uint64_t next = expire_backlog(q, now, &tail);
        if (failed) {
            pthread_mutex_unlock(&q->lock);
            finish_all(failed, NEREID_ERROR_UNAVAILABLE,
                       "timeout of the corresponding sequence has been expired", FAILURE_REJECTED);
            pthread_mutex_lock(&q->lock);
            continue;
        }
        for (size_t b = 0; b < N_BUCKETS; b++) {
            seq_t *s = q->buckets[b];
            while (s) {
                seq_t *after = s->hnext;
                uint64_t deadline = s->last_arrival_ns + q->idle_ns;
                if (deadline > now) {
                    if (deadline < next) next = deadline;
                } else if (s->inst < 0) {
                    /* backlogged: looked at again once it has a position */
                    if (now + BACKLOG_IDLE_NS < next) next = now + BACKLOG_IDLE_NS;
                } else {
                    char idbuf[160];
                    format_id(idbuf, sizeof idbuf, s->sid, s->id);
                    LOG_VERBOSE("sequence %s for model '%s' idle, aborted", idbuf,
                                q->base.model->name);
                    seq_unhash(q, s);
                    if (!s->qhead && !s->in_flight)
                        seq_release(q, s);
                    else
                        s->force_end = true;
                }
                s = after;
            }
        }
        q->reaper_wake_ns = next;
        if (next == UINT64_MAX)
            pthread_cond_wait(&q->reaper_cond, &q->lock);
        else
            util_cond_wait_until(&q->reaper_cond, &q->lock, next);
    }
    pthread_mutex_unlock(&q->lock);
    return NULL;
}

/* ---- Stop and destroy ---- */

/* Instances drain the requests of sequences that hold a position; requests
 * of backlogged sequences would never run (and would keep the model
 * referenced), so they fail now. The reaper is joined here: its completions
 * may drop request references, so it must be gone before the loader's
 * reference is (model.c, Ownership). */
static void seq_stop(scheduler_t *base)
{
    seq_sched_t *q = (seq_sched_t *)base;
    nereid_request_t *failed = NULL, **tail = &failed;
    pthread_mutex_lock(&q->lock);
    q->stopped = true;
    while (q->backlog_head) {
        seq_t *s = q->backlog_head;
        for (nereid_request_t *r = s->qhead; r; r = r->next) {
            r->sched_data = NULL;
            atomic_fetch_sub(&base->model->stats.pending, 1);
        }
        *tail = s->qhead;
        if (s->qtail) tail = &s->qtail->next;
        s->qhead = s->qtail = NULL;
        seq_release(q, s);
    }
    for (size_t i = 0; i < q->n_insts; i++)
        pthread_cond_broadcast(&q->insts[i]->cond);
    pthread_cond_broadcast(&q->reaper_cond);
    pthread_mutex_unlock(&q->lock);
    finish_all(failed, NEREID_ERROR_UNAVAILABLE, STOPPING_TEXT, FAILURE_OTHER);
    if (q->reaper_started) {
        pthread_join(q->reaper, NULL);
        q->reaper_started = false;
    }
}

/* Live sequences holding a position (Triton counts its sequence-to-slot
 * map): the server's exit waits for them to end or go idle. */
static size_t seq_inflight(scheduler_t *base)
{
    seq_sched_t *q = (seq_sched_t *)base;
    size_t n = 0;
    pthread_mutex_lock(&q->lock);
    for (size_t i = 0; i < q->n_insts; i++)
        for (size_t k = 0; k < q->insts[i]->n_slots; k++)
            n += q->insts[i]->slots[k] != NULL;
    pthread_mutex_unlock(&q->lock);
    return n;
}

static void free_config(seq_sched_t *q)
{
    for (size_t i = 0; i < q->n_states; i++)
        free(q->states[i].init_data);
    free(q->states);
    free(q->ctls);
    for (size_t i = 0; i < q->n_insts; i++) {
        free(q->insts[i]->slots);
        free(q->insts[i]->rows);
        free(q->insts[i]->ready);
        pthread_cond_destroy(&q->insts[i]->cond);
        free(q->insts[i]);
    }
    free(q->insts);
}

static void seq_destroy(scheduler_t *base)
{
    seq_sched_t *q = (seq_sched_t *)base;
    seq_stop(base);
    /* Instances drained what they could; fail what is left. */
    for (size_t b = 0; b <= N_BUCKETS; b++) {
        seq_t **head = b < N_BUCKETS ? &q->buckets[b] : &q->detached;
        while (*head) {
            seq_t *s = *head;
            while (s->qhead) {
                nereid_request_t *r = s->qhead;
                s->qhead = r->next;
                atomic_fetch_sub(&base->model->stats.pending, 1);
                r->sched_data = NULL;
                request_finish(r, nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready"),
                               FAILURE_OTHER);
            }
            s->qtail = NULL;
            seq_release(q, s);
        }
    }
    free_config(q);
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->reaper_cond);
    free(q);
}

/* A warmup sample becomes a one-request sequence (START and END) with a
 * correlation id of the model's CORRID type. */
static void seq_prepare_warmup(scheduler_t *base, nereid_request_t *req)
{
    const model_config_t *c = base->model->config;
    const Inference__ModelSequenceBatching *sb = c->sequence_batching;
    bool string_id = false;
    for (size_t i = 0; i < sb->n_control_input; i++)
        for (size_t k = 0; k < sb->control_input[i]->n_control; k++) {
            const Inference__ModelSequenceBatching__Control *ctl = sb->control_input[i]->control[k];
            if ((int)ctl->kind == CTL_CORRID && ctl->data_type == INFERENCE__DATA_TYPE__TYPE_STRING)
                string_id = true;
        }
    free(req->corr_id_str);
    req->corr_id_str = string_id ? xstrdup("<warmup>") : NULL;
    req->corr_id = string_id ? 0 : UINT64_MAX;
    req->seq_start = req->seq_end = true;
}

static const scheduler_ops_t sequence_ops = {
    .name = "sequence",
    .enqueue = seq_enqueue,
    .next_batch = seq_next_batch,
    .batch_done = seq_batch_done,
    .reschedule = seq_reschedule,
    .prepare_warmup = seq_prepare_warmup,
    .prepare_direct = seq_prepare_direct,
    .stop = seq_stop,
    .retire = seq_retire,
    .wake = seq_wake,
    .inflight = seq_inflight,
    .destroy = seq_destroy,
};

/* ---- Creation ---- */

static size_t instance_count(const model_config_t *c)
{
    size_t total = 0;
    for (size_t g = 0; g < c->n_instance_group; g++)
        total += c->instance_group[g]->count > 0 ? (size_t)c->instance_group[g]->count : 1;
    return total ? total : 1;
}

/* Triton's GenerateInitialStateData checks. */
static nereid_error_t *check_initial_state(const Inference__ModelSequenceBatching__State *st)
{
    if (st->n_initial_state > 1)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "initial_state field for state input '%s' must contain exactly one "
                                "or zero element. Found '%zu' elements.",
                                st->input_name, st->n_initial_state);
    const Inference__ModelSequenceBatching__InitialState *is = st->initial_state[0];
    if (is->data_type != st->data_type)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "The data type used for 'initial_state' field of state '%s' does "
                                "not match the state data type.",
                                st->input_name);
    if (is->n_dims != st->n_dims)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "Number of dimensions in 'initial_state' doesn't match the size of "
                                "'state' dimensions for state input '%s'. %zu != %zu",
                                st->input_name, is->n_dims, st->n_dims);
    for (size_t d = 0; d < is->n_dims; d++) {
        if (is->dims[d] == -1)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "'initial_state' field for state input name '%s' contains "
                                    "variable dimensions.",
                                    st->input_name);
        if (st->dims[d] != -1 && is->dims[d] != st->dims[d])
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "'initial_state' dim for input name '%s' doesn't match 'state' "
                                    "dim description. %lld != %lld",
                                    st->input_name, (long long)is->dims[d], (long long)st->dims[d]);
    }
    return NULL;
}

static nereid_error_t *read_initial_state(model_t *m, seq_state_cfg_t *st,
                                          const Inference__ModelSequenceBatching__InitialState *is)
{
    st->init_rank = is->n_dims < NEREID_MAX_RANK ? is->n_dims : NEREID_MAX_RANK;
    for (size_t d = 0; d < st->init_rank; d++)
        st->init_shape[d] = is->dims[d] < 1 ? 1 : is->dims[d];
    size_t want = zero_bytes(st->datatype, st->init_shape, st->init_rank);
    if (is->state_data_case !=
        INFERENCE__MODEL_SEQUENCE_BATCHING__INITIAL_STATE__STATE_DATA_DATA_FILE) {
        st->init_bytes = want;
        return NULL;
    }
    bool bytes = st->datatype == NEREID_TYPE_BYTES;
    char *subject =
        xasprintf("initial_state data_file '%s/initial_state/%s' for state '%s' in model '%s'",
                  m->dir, is->data_file, st->input_name, m->name);
    char *buf;
    size_t len;
    nereid_error_t *err = util_read_tensor_file(m->dir, "initial_state", is->data_file, want, bytes,
                                                subject, &buf, &len);
    free(subject);
    if (err) return err;
    if (!bytes && len < want) {
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "initial_state setting expects %zu bytes, but the data provided "
                               "from %sonly has %zu bytes.",
                               want, is->data_file, len);
        free(buf);
    } else {
        st->init_data = buf;
        st->init_bytes = bytes ? len : want;
    }
    return err;
}

nereid_error_t *sequence_batcher_create(model_t *m, const sched_core_t *core, scheduler_t **out)
{
    *out = NULL;
    const model_config_t *c = m->config;
    const Inference__ModelSequenceBatching *sb = c->sequence_batching;
    seq_sched_t *q = xcalloc(1, sizeof *q);
    q->base.ops = &sequence_ops;
    q->base.model = m;
    q->base.core = core;
    pthread_mutex_init(&q->lock, NULL);
    util_cond_init_monotonic(&q->reaper_cond);
    q->reaper_wake_ns = UINT64_MAX;
    q->batching = c->max_batch_size > 0;
    q->max_rows = q->batching ? c->max_batch_size : 1;
    q->idle_ns =
        (sb->max_sequence_idle_microseconds ? sb->max_sequence_idle_microseconds : 1000000u) *
        1000u;
    q->iterative = sb->iterative_sequence;
    atomic_init(&q->next_iter_id, 1);
    q->oldest =
        sb->strategy_choice_case == INFERENCE__MODEL_SEQUENCE_BATCHING__STRATEGY_CHOICE_OLDEST &&
        sb->oldest;
    size_t per_inst = (size_t)q->max_rows;
    if (q->oldest) {
        q->delay_ns = sb->oldest->max_queue_delay_microseconds * 1000u;
        if (sb->oldest->max_candidate_sequences > 0)
            per_inst = (size_t)sb->oldest->max_candidate_sequences;
        q->preferred = sb->oldest->preferred_batch_size;
        q->n_preferred = sb->oldest->n_preferred_batch_size;
        for (size_t i = 0; i < sb->oldest->n_preferred_batch_size; i++)
            if (sb->oldest->preferred_batch_size[i] > q->preferred_max)
                q->preferred_max = sb->oldest->preferred_batch_size[i];
        if (q->preferred_max > q->max_rows) q->preferred_max = q->max_rows;
    } else if (sb->strategy_choice_case ==
                   INFERENCE__MODEL_SEQUENCE_BATCHING__STRATEGY_CHOICE_DIRECT &&
               sb->direct) {
        q->delay_ns = sb->direct->max_queue_delay_microseconds * 1000u;
        q->min_util = sb->direct->minimum_slot_utilization;
    }
    size_t hold = scheduler_env_count("NEREID_DELAY_SCHEDULER", "TRITONSERVER_DELAY_SCHEDULER");
    q->backlog_hold = scheduler_env_count("NEREID_BACKLOG_DELAY_SCHEDULER",
                                          "TRITONSERVER_BACKLOG_DELAY_SCHEDULER");
    q->n_insts = instance_count(c);
    q->per_inst = per_inst;
    q->insts = xcalloc(q->n_insts, sizeof *q->insts);
    for (size_t i = 0; i < q->n_insts; i++) {
        q->insts[i] = seq_inst_new(q);
        q->insts[i]->hold = hold;
    }
    for (size_t i = 0; i < sb->n_control_input; i++)
        q->n_ctls += sb->control_input[i]->n_control ? 1 : 0;
    q->ctls = xcalloc(q->n_ctls ? q->n_ctls : 1, sizeof *q->ctls);
    size_t k = 0;
    for (size_t i = 0; i < sb->n_control_input; i++) {
        const Inference__ModelSequenceBatching__ControlInput *ci = sb->control_input[i];
        if (!ci->n_control) continue;
        const Inference__ModelSequenceBatching__Control *ctl = ci->control[0];
        seq_ctl_t *sc = &q->ctls[k++];
        sc->name = ci->name;
        sc->kind = (int)ctl->kind;
        if (sc->kind == CTL_CORRID) {
            sc->datatype = (nereid_datatype_t)ctl->data_type;
            q->corrid = sc;
        } else if (ctl->n_int32_false_true == 2) {
            sc->datatype = NEREID_TYPE_INT32;
            memcpy(sc->i32, ctl->int32_false_true, sizeof sc->i32);
        } else if (ctl->n_fp32_false_true == 2) {
            sc->datatype = NEREID_TYPE_FP32;
            memcpy(sc->f32, ctl->fp32_false_true, sizeof sc->f32);
        } else {
            sc->datatype = NEREID_TYPE_BOOL;
            for (size_t b = 0; b < 2 && b < ctl->n_bool_false_true; b++)
                sc->b[b] = ctl->bool_false_true[b] ? 1 : 0;
        }
    }
    q->n_states = sb->n_state;
    q->states = xcalloc(q->n_states ? q->n_states : 1, sizeof *q->states);
    for (size_t i = 0; i < sb->n_state; i++) {
        const Inference__ModelSequenceBatching__State *st = sb->state[i];
        seq_state_cfg_t *sc = &q->states[i];
        sc->input_name = st->input_name;
        sc->output_name = st->output_name;
        sc->datatype = (nereid_datatype_t)st->data_type;
        sc->single_buffer = st->use_same_buffer_for_input_output;
        if (st->use_growable_memory) /* Triton logs this for every sequence, and goes on */
            LOG_ERROR("Failed to initialize sequence state: 'use_growable_memory' can only work "
                      "with KIND_GPU model instances right now. Please either change the "
                      "instance type to KIND_GPU or set 'use_growable_memory' to false for state "
                      "input '%s'.",
                      st->input_name);
        if (st->n_initial_state > 0) {
            nereid_error_t *err = check_initial_state(st);
            if (!err) err = read_initial_state(m, sc, st->initial_state[0]);
            if (err) {
                q->n_states = i + 1;
                free_config(q);
                pthread_mutex_destroy(&q->lock);
                pthread_cond_destroy(&q->reaper_cond);
                free(q);
                return err;
            }
        } else {
            sc->init_rank = st->n_dims < NEREID_MAX_RANK ? st->n_dims : NEREID_MAX_RANK;
            for (size_t d = 0; d < sc->init_rank; d++)
                sc->init_shape[d] = st->dims[d] < 1 ? 1 : st->dims[d];
            sc->init_bytes = zero_bytes(sc->datatype, sc->init_shape, sc->init_rank);
        }
    }
    if (pthread_create(&q->reaper, NULL, reaper_main, q) == 0) q->reaper_started = true;
    *out = &q->base;
    return NULL;
}
