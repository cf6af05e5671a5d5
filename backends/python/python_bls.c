/*
 * This file contains BLS, as Triton python_backend's request_executor
 * does it: a worker's BLS_CALL becomes a request into any model of the
 * server (its inputs read where the worker wrote them), and each response
 * goes back as a BLS_RESULT, in a persistent region or written in place by
 * the called model; ResponseIterator.cancel() cancels the request. The
 * message layouts are python_wire.h's; the regions and the by-reference
 * and in-place paths are described below.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "python_internal.h"

/* ---- BLS: a worker's request into any model of the server ----
 *
 * The layouts of BLS_CALL and BLS_RESULT are python_wire.h's ("BLS_CALL
 * and BLS_RESULT descriptions").
 *
 * BLS regions. A large BLS message (past INLINE_MAX, at most
 * BLS_REGION_MAX) travels in a persistent region, not in a memfd of its
 * own (a fresh memfd costs its page faults, and its unmapping a TLB
 * shootdown, on both sides: ~1.5 ms for 256 KiB each way on a
 * paravirtualized machine). Each side owns the regions it writes and
 * sends each one's memfd once, with the first message in it; a message
 * names its region by slot (0..BLS_SLOTS-1, the M_SLOT bits of its type).
 * The worker decides which slots are free, in both directions, because it
 * alone knows when its arrays die:
 *   - BLS_CALL: the worker writes the message (description and blob) at
 *     offset 0 of one of its regions no call in flight uses; the header
 *     alone travels (and the memfd, sealed against shrinking, when the
 *     region is new). The server maps it read-only, at most BLS_REGION_MAX
 *     bytes, keeps one mapping per slot (rx_regions_t, replaced when a
 *     memfd comes with the slot) and reads the inputs there as from a
 *     memfd. The slot is free again when the call's final BLS_RESULT
 *     arrived.
 *   - BLS_RESULT: the call names a reply slot: one of the server's
 *     regions that no array of the worker's still views and no call in
 *     flight writes. The server writes each response (description, then
 *     blob; or blob, then description: "BLS results in place") there, one
 *     after the other, and sends the header and two u64: the offsets of
 *     the blob and of the description in the region (with the region's memfd, its
 *     own, sealed against shrinking, when it made a new one: none yet in
 *     the slot, or too small). The worker's result arrays are views of the
 *     region; the slot stays taken while any of them lives (weak references
 *     to the array they all view), so kept results never change. A result
 *     larger than BLS_REGION_MAX, or a region past BLS_BUDGET for the
 *     worker, or a call without a reply slot (all taken), uses a memfd of
 *     its own as before.
 * A worker that lies about slots only garbles its own results: the server
 * checks every slot number, offset and length against the region it names
 * and never reads what it wrote into its BLS_RESULT regions.
 *
 * BLS tensors by reference. Two copies of a large tensor are skipped when
 * the model hands on what it was given:
 *   - a BLS input that is a view of the EXECUTE region of the execute in
 *     flight (the model's own input) is a where 1 record: the server
 *     accepts it only while its own execute is in flight (in->exec_rx,
 *     published before the EXECUTE is sent, dropped when DONE arrived),
 *     holds that region until the call's final response (tx_pick then
 *     takes another for the next EXECUTE), and ends a worker naming it
 *     with none in flight. The worker sends it only from the thread
 *     running execute, before DONE, so the socket's order makes it valid;
 *   - a DONE output that is a view of a BLS result is a where 2 + k record:
 *     the response holds the BLS_RESULT region k (a reference) until it is
 *     sent, and bls_send_result gives a new call's results a new region
 *     instead of one a response still holds, whatever slot the worker
 *     offers (it cannot know when the reply went).
 *
 * BLS results in place. A call with a reply slot to a model that is not
 * decoupled (one response) gives its request a response allocator
 * (bls_alloc): each numeric output of VIEW_MIN bytes or more is placed in
 * the reply region, one after the other from offset 0, so the called
 * model (ONNX Runtime's bound outputs, a C backend's memcpy, a Python
 * model's DONE) writes it where the worker will read it. The region is the
 * slot's when no response holds it and it has room, else a new one the
 * call keeps to itself (counted in bls_new_bytes) until its response takes
 * the slot. The response (bls_send_placed) then copies only what was not
 * placed (small, BYTES, no room left) after the placed outputs, writes the
 * description after those, and sends the header with the blob's and the
 * description's offsets. When the region is no longer the slot's (a worker
 * naming one slot for two calls) or the rest does not fit, the response
 * goes as before, without a region (the placed bytes are copied). A failed
 * call's placed bytes are garbage in a region no array of the worker views
 * (the slot is the call's), and a new region that never took the slot is
 * dropped. A decoupled model's several responses, and calls without a
 * reply slot, keep malloc'ed outputs and the copy. */

typedef struct bls_call {
    instance_t *in;
    chan_t *chan;
    msg_t *msg; /* holds the inputs' bytes until the final response */
    uint64_t id;
    nereid_cancel_token_t *cancel; /* the request's: cancelled by M_BLS_CANCEL */
    uint8_t *bytes;                /* private copies of BYTES inputs from a memfd */
    region_t *ex;                  /* the EXECUTE region inputs by reference read, or NULL */
    int reply_slot;                /* the worker's choice of our BLS_RESULT region, or -1 */
    size_t reply_used;             /* bytes of it this call's responses took so far */
    struct bls_call *next;         /* in->bls_calls */
    region_t *body[BODY_SLOTS];    /* request body regions inputs by reference read (a
                                      reference each), or NULL */
    /* Outputs placed in the reply region ("BLS results in place"), under
     * chan->bls_mu while the called model allocates (ensemble steps may
     * allocate from several threads), then read by the one response: */
    region_t *dst;   /* where they are (a reference), or NULL: none placed */
    size_t dst_used; /* bytes the placed outputs take, from offset 0 */
    bool dst_new;    /* dst is a new region not yet in bls_tx (counted in bls_new_bytes) */
    bool in_place;   /* the request has bls_alloc as its allocator */
    bool dst_closed; /* a response came: later outputs are malloc'ed (a model that turned
                        decoupled since the call began may send more than one) */
} bls_call_t;

#define BLS_DESC_ROOM 4096 /* what placing keeps free for the rest of a response */

/* Where output bytes go in the region: the next ALIGN boundary. */
static size_t bls_align(size_t n)
{
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}

/* A place for byte_size bytes in the call's reply region (chan->bls_mu
 * held), or NULL. The first output chooses the region: the slot's when no
 * response holds it and it has room, else a new one (within BLS_BUDGET). */
static uint8_t *bls_place(bls_call_t *call, size_t byte_size)
{
    chan_t *c = call->chan;
    if (!call->dst) {
        region_t *r = c->bls_tx[call->reply_slot];
        if (r && atomic_load(&r->refs) == 1 && r->size >= byte_size + BLS_DESC_ROOM) {
            atomic_fetch_add(&r->refs, 1);
        } else {
            /* Room for another output as large, and the description. */
            size_t size = (2 * byte_size + BLS_DESC_ROOM + 4095) & ~(size_t)4095;
            if (size < (1u << 20)) size = 1u << 20;
            if (size > BLS_REGION_MAX) size = BLS_REGION_MAX;
            if (size < byte_size + BLS_DESC_ROOM) return NULL;
            size_t old = r ? r->size : 0;
            if (c->bls_tx_bytes + c->bls_new_bytes - old + size > BLS_BUDGET) return NULL;
            r = region_new(size, (uint8_t)call->reply_slot);
            if (!r) return NULL;
            c->bls_new_bytes += size;
            call->dst_new = true;
        }
        call->dst = r;
        call->dst_used = 0;
    }
    region_t *r = call->dst;
    size_t off = bls_align(call->dst_used);
    if (off > r->size || r->size - off < byte_size + BLS_DESC_ROOM) return NULL;
    call->dst_used = off + byte_size;
    return r->map + off;
}

/* nereid_alloc_fn of a BLS call's request: large numeric outputs in the
 * reply region (each holds a reference to it, *buffer_userp), the others
 * malloc'ed (*buffer_userp NULL). Any thread. */
static nereid_error_t *bls_alloc(void *userp, const char *name, nereid_datatype_t datatype,
                                 const int64_t *shape, size_t rank, size_t byte_size, void **buffer,
                                 void **buffer_userp)
{
    (void)name;
    (void)shape;
    (void)rank;
    bls_call_t *call = userp;
    *buffer_userp = NULL;
    if (datatype != NEREID_TYPE_BYTES && byte_size >= VIEW_MIN) {
        pthread_mutex_lock(&call->chan->bls_mu);
        uint8_t *p = call->dst_closed ? NULL : bls_place(call, byte_size);
        if (p) atomic_fetch_add(&call->dst->refs, 1);
        region_t *r = call->dst;
        bool fresh = call->dst_new;
        pthread_mutex_unlock(&call->chan->bls_mu);
        if (p) {
            if (fresh) { /* its pages in one call, not one fault each as the model writes */
                size_t start = (size_t)(p - r->map) & ~(size_t)4095;
                populate(r->map + start, (size_t)(p - r->map) + byte_size - start,
                         MADV_POPULATE_WRITE);
            }
            *buffer = p;
            *buffer_userp = r;
            return NULL;
        }
    }
    /* the server's own memory (copied into the BLS_RESULT as before) */
    *buffer = NULL;
    *buffer_userp = NEREID_ALLOC_DECLINED;
    return NULL;
}

/* nereid_release_fn of bls_alloc's buffers: when the response is freed. */
static void bls_release(void *userp, void *buffer, void *buffer_userp, size_t byte_size)
{
    (void)userp;
    (void)buffer;
    (void)byte_size;
    region_unref(buffer_userp); /* placed outputs only: bls_alloc declines the others */
}

/* Sends a BLS_RESULT: its description in w (freed) and tensors in om. */
static void bls_send(chan_t *c, bwr_t *w, outmsg_t *om)
{
    om->raw = w->p;
    om->raw_len = w->n;
    outmsg_send(c, M_BLS_RESULT, om);
}

/* Sends a call's BLS_RESULT (as bls_send) in the reply region the worker
 * named, when it is large enough to leave the datagram: after the call's
 * earlier responses there, or at the start of a new region (its memfd sent
 * along) when they leave no room. Calls for one request never overlap, so
 * reply_used needs no lock; the slot's table entry does. */
static void bls_send_result(bls_call_t *call, bwr_t *w, outmsg_t *om)
{
    chan_t *c = call->chan;
    size_t total = w->n + om->blob_len;
    if (call->reply_slot < 0 || HDR_BYTES + total <= INLINE_MAX || total > BLS_REGION_MAX) {
        bls_send(c, w, om);
        return;
    }
    uint8_t k = (uint8_t)call->reply_slot;
    uint64_t off = (call->reply_used + ALIGN - 1) / ALIGN * ALIGN;
    int fd = -1;
    pthread_mutex_lock(&c->bls_mu);
    region_t *r = c->bls_tx[k];
    /* A new call's results never go where a response still reads (a DONE
     * output naming this region, kept until the reply is sent): a fresh
     * region takes the slot, the old one lives on in that response. */
    bool held = r && call->reply_used == 0 && atomic_load(&r->refs) > 1;
    if (!r || held || r->size < off || r->size - off < total) {
        size_t size = total < (1u << 19) ? (1u << 20) : 2 * total;
        if (size > BLS_REGION_MAX) size = BLS_REGION_MAX;
        if (held && size < r->size) size = r->size;
        size_t old = r ? r->size : 0;
        r = c->bls_tx_bytes - old + size <= BLS_BUDGET ? region_new(size, k) : NULL;
        if (r) {
            region_unref(c->bls_tx[k]);
            c->bls_tx[k] = r;
            c->bls_tx_bytes = c->bls_tx_bytes - old + size;
            fd = r->fd; /* sent once, with this message */
            r->fd = -1;
            off = 0;
            atomic_fetch_add(&call->in->bls_regions_made, 1);
            populate(r->map, total, MADV_POPULATE_WRITE);
        }
    }
    if (r) atomic_fetch_add(&r->refs, 1);
    pthread_mutex_unlock(&c->bls_mu);
    if (!r) { /* over the budget */
        bls_send(c, w, om);
        return;
    }
    outmsg_copy(om, r->map + off, (const char *)w->p, w->n);
    uint8_t d[HDR_BYTES + 16];
    uint64_t blob_off = off + w->n;
    hdr_pack(d, M_BLS_RESULT | M_REGION | (uint32_t)k << M_SLOT_SHIFT, (uint32_t)w->n,
             om->blob_len);
    memcpy(d + HDR_BYTES, &blob_off, 8);
    memcpy(d + HDR_BYTES + 8, &off, 8);
    region_unref(r); /* before the worker can answer: its next call finds the region free */
    send_bytes_with_fd(c, d, sizeof d, fd);
    if (fd >= 0) close(fd);
    call->reply_used = off + total;
    free(w->p);
    free(om->t);
    om->t = NULL;
}

static void bls_reply_error(chan_t *c, uint64_t id, const char *text, nereid_error_code_t code)
{
    bwr_t w = {0};
    outmsg_t om = {0};
    bls_result_head(&w, id, BLS_ERROR, true, (uint32_t)code, text, 0, 0);
    bls_send(c, &w, &om);
}

static void bls_done(bls_call_t *call)
{
    instance_t *in = call->in;
    if (call->dst) { /* the call's reference (a new region that never took the slot: gone) */
        pthread_mutex_lock(&call->chan->bls_mu);
        if (call->dst_new) call->chan->bls_new_bytes -= call->dst->size;
        pthread_mutex_unlock(&call->chan->bls_mu);
        region_unref(call->dst);
        call->dst = NULL;
    }
    msg_free(call->msg);
    free(call->bytes);
    region_unref(call->ex);
    for (int s = 0; s < BODY_SLOTS; s++)
        region_unref(call->body[s]);
    chan_unref(call->chan);
    pthread_mutex_lock(&in->mu);
    for (bls_call_t **p = &in->bls_calls; *p; p = &(*p)->next)
        if (*p == call) {
            *p = call->next;
            break;
        }
    nereid_cancel_token_free(call->cancel);
    free(call);
    in->bls_inflight--;
    pthread_cond_broadcast(&in->cv);
    pthread_mutex_unlock(&in->mu);
}

/* The head of a BLS_RESULT with outputs: its fields, then the response's
 * parameters. */
static void bls_outputs_head(bwr_t *w, uint64_t id, nereid_response_t *resp, bool final)
{
    json_t *params = python_api_response_parameters_json(resp);
    char *ptext = params ? json_dumps(params, JSON_COMPACT) : NULL;
    json_decref(params);
    size_t plen = ptext ? strlen(ptext) : 0;
    bls_result_head(w, id, BLS_OUTPUTS, final, 0, NULL, plen, nereid_response_output_count(resp));
    bw_put(w, ptext, plen);
    free(ptext);
}

/* Output i of resp as *v; true when the called model wrote it within
 * [lo, hi), the placed part of the reply region. */
static bool bls_output(nereid_response_t *resp, size_t i, tview_t *v, uintptr_t lo, uintptr_t hi)
{
    void *unused;
    nereid_response_output(resp, i, &v->name, &v->datatype, &v->shape, &v->rank, &v->data, &v->size,
                           &unused);
    uintptr_t p = (uintptr_t)v->data;
    return v->size && p >= lo && p < hi && v->size <= hi - p;
}

/* Sends resp, whose outputs are (some of them) placed in call->dst: the
 * others copied after them, the description after those; the header names
 * the blob's offset (0) and the description's. Frees resp and drops dst
 * when it returns true; false, nothing sent: the region is not the slot's
 * (any more), or the rest does not fit. */
static bool bls_send_placed(bls_call_t *call, region_t *r, size_t used, nereid_response_t *resp,
                            bool final)
{
    chan_t *c = call->chan;
    uint8_t k = (uint8_t)call->reply_slot;
    size_t n = nereid_response_output_count(resp);
    bwr_t w = {0};
    bls_outputs_head(&w, call->id, resp, final);
    uintptr_t lo = (uintptr_t)r->map, hi = lo + used;
    size_t end = bls_align(used); /* the blob: placed outputs, then the others */
    uint64_t placed_n = 0, placed_bytes = 0, copied_n = 0, copied_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        tview_t v;
        if (bls_output(resp, i, &v, lo, hi)) {
            bw_tensor(&w, &v, (uintptr_t)v.data - lo);
            placed_n++;
            placed_bytes += v.size;
        } else {
            bw_tensor(&w, &v, end);
            end = bls_align(end + v.size);
            copied_n++;
            copied_bytes += v.size;
        }
    }
    size_t meta_off = end;
    int fd = -1;
    bool ok = meta_off <= r->size && r->size - meta_off >= w.n;
    pthread_mutex_lock(&c->bls_mu);
    if (ok && call->dst_new) { /* the new region takes the slot; its memfd goes along */
        region_t *old = c->bls_tx[k];
        size_t old_size = old ? old->size : 0;
        c->bls_new_bytes -= r->size;
        call->dst_new = false;
        ok = c->bls_tx_bytes + c->bls_new_bytes - old_size + r->size <= BLS_BUDGET;
        if (ok) {
            region_unref(old);
            atomic_fetch_add(&r->refs, 1);
            c->bls_tx[k] = r;
            c->bls_tx_bytes = c->bls_tx_bytes - old_size + r->size;
            fd = r->fd;
            r->fd = -1;
            atomic_fetch_add(&call->in->bls_regions_made, 1);
        }
    } else if (ok) {
        ok = c->bls_tx[k] == r;
    }
    pthread_mutex_unlock(&c->bls_mu);
    if (!ok) {
        free(w.p);
        return false;
    }
    size_t off = bls_align(used);
    for (size_t i = 0; i < n; i++) {
        tview_t v;
        if (bls_output(resp, i, &v, lo, hi)) continue;
        if (v.size) memcpy(r->map + off, v.data, v.size);
        off = bls_align(off + v.size);
    }
    memcpy(r->map + meta_off, w.p, w.n);
    uint8_t d[HDR_BYTES + 16];
    uint64_t blob_off = 0, desc_off = meta_off;
    hdr_pack(d, M_BLS_RESULT | M_REGION | (uint32_t)k << M_SLOT_SHIFT, (uint32_t)w.n, end);
    memcpy(d + HDR_BYTES, &blob_off, 8);
    memcpy(d + HDR_BYTES + 8, &desc_off, 8);
    call->reply_used = meta_off + w.n;
    free(w.p);
    instance_t *in = call->in;
    atomic_fetch_add(&in->bls_placed_n, placed_n);
    atomic_fetch_add(&in->bls_placed_bytes, placed_bytes);
    atomic_fetch_add(&in->bls_copied_n, copied_n);
    atomic_fetch_add(&in->bls_copied_bytes, copied_bytes);
    /* The response's and the call's references go before the worker can
     * answer: its next call finds the region free, not held. */
    nereid_response_free(resp);
    pthread_mutex_lock(&c->bls_mu);
    call->dst = NULL;
    pthread_mutex_unlock(&c->bls_mu);
    region_unref(r);
    send_bytes_with_fd(c, d, sizeof d, fd);
    if (fd >= 0) close(fd);
    return true;
}

static void bls_on_response(nereid_response_t *resp, uint32_t flags, void *userp)
{
    bls_call_t *call = userp;
    bool final = flags & NEREID_RESPONSE_FINAL;
    bwr_t w = {0};
    outmsg_t om = {0};
    region_t *dst = NULL;
    size_t dst_used = 0;
    if (call->in_place) { /* what the allocations placed, and no more */
        pthread_mutex_lock(&call->chan->bls_mu);
        call->dst_closed = true;
        dst = call->dst;
        dst_used = call->dst_used;
        pthread_mutex_unlock(&call->chan->bls_mu);
    }
    if (resp && dst && call->reply_used == 0 && !nereid_response_error(resp)) {
        if (bls_send_placed(call, dst, dst_used, resp, final)) { /* resp freed */
            if (final) bls_done(call);
            return;
        }
        /* Sent as before, without a region: outputs in dst are copied. */
        call->reply_slot = -1;
    }
    if (!resp) {
        bls_result_head(&w, call->id, BLS_EMPTY, true, 0, NULL, 0, 0);
    } else if (nereid_response_error(resp)) {
        const nereid_error_t *e = nereid_response_error(resp);
        bls_result_head(&w, call->id, BLS_ERROR, final, (uint32_t)nereid_error_code(e),
                        nereid_error_message(e), 0, 0);
    } else {
        bls_outputs_head(&w, call->id, resp, final);
        for (size_t i = 0; i < nereid_response_output_count(resp); i++) {
            tview_t v;
            bls_output(resp, i, &v, 0, 0);
            bw_tensor(&w, &v, outmsg_add_view(&om, &v));
            atomic_fetch_add(&call->in->bls_copied_n, 1);
            atomic_fetch_add(&call->in->bls_copied_bytes, v.size);
        }
    }
    bls_send_result(call, &w, &om);
    if (resp) nereid_response_free(resp);
    if (final) bls_done(call);
}

/* A NUL-terminated copy of n bytes at s (the description's strings). */
static char *bls_str(const uint8_t *s, size_t n)
{
    char *t = malloc(n + 1);
    if (!t) abort();
    if (n) memcpy(t, s, n);
    t[n] = '\0';
    return t;
}

/* The request's parameters: a JSON object of strings, booleans, integers
 * and numbers (other values are ignored, as before). */
static nereid_error_t *bls_parameters(nereid_request_t *req, const bls_req_t *q)
{
    if (!q->params_len) return NULL;
    json_error_t jerr;
    json_t *jp = json_loadb((const char *)q->params, q->params_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(jp)) {
        json_decref(jp);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "BLS request parameters must be a JSON object");
    }
    nereid_error_t *err = NULL;
    const char *key;
    json_t *val;
    json_object_foreach(jp, key, val)
    {
        if (err) break;
        if (json_is_string(val))
            err = nereid_request_set_parameter_string(req, key, json_string_value(val));
        else if (json_is_boolean(val))
            err = nereid_request_set_parameter_bool(req, key, json_is_true(val));
        else if (json_is_integer(val))
            err = nereid_request_set_parameter_int(req, key, json_integer_value(val));
        else if (json_is_real(val))
            err = nereid_request_set_parameter_double(req, key, json_real_value(val));
    }
    json_decref(jp);
    return err;
}

/* Adds the inputs (records checked here against the blob, or against ex,
 * the EXECUTE region in flight, for where 1, or against body[slot], a
 * request body region of the execute in flight, for where BODY_WHERE +
 * slot) to req. false: the worker described a tensor that does not add up
 * (*why). */
static bool bls_inputs(nereid_request_t *req, const bls_req_t *q, msg_t *m, const region_t *ex,
                       region_t *const *body, uint8_t *bytes, nereid_error_t **err, char *why,
                       size_t why_cap)
{
    brd_t rd = {q->ins, m->meta + m->meta_len - q->ins, 0, false};
    size_t used = 0;
    for (uint32_t i = 0; i < q->n_in && !*err; i++) {
        tview_t v;
        int64_t shape[MAX_RANK];
        char name[MAX_NAME + 1];
        uint32_t where = record_where(&rd);
        const region_t *in_region = where == 1 ? ex
                                    : where >= BODY_WHERE && where < BODY_WHERE + BODY_SLOTS
                                        ? body[where - BODY_WHERE]
                                        : NULL;
        size_t in_len = !in_region ? 0 : where == 1 ? in_region->size : in_region->used;
        if (!read_tensor(&rd, m->blob, m->blob_len, in_region ? in_region->map : NULL, in_len, &v,
                         shape, name, why, why_cap))
            return false;
        if (v.datatype == NEREID_TYPE_BYTES && bytes) {
            memcpy(bytes + used, v.data, v.size);
            v.data = bytes + used;
            used += v.size;
            if (!bytes_ok(v.data, v.size, elements(v.shape, v.rank))) {
                snprintf(why, why_cap, "BYTES tensor '%.256s' changed while it was read", name);
                return false;
            }
        }
        *err = nereid_request_add_input(req, v.name, v.datatype, v.shape, v.rank, v.data, v.size);
    }
    return true;
}

/* The BLS call's request: model and version, id, correlation id, sequence
 * flags, timeout and parameters. *req is set even on error (free it). */
static nereid_error_t *bls_request_new(instance_t *in, const char *model, const bls_req_t *q,
                                       nereid_request_t **req)
{
    *req = NULL;
    nereid_error_t *err = nereid_request_new(in->server, model, q->version, req);
    if (!err && q->id_len) {
        char *rid = bls_str(q->rid, q->id_len);
        err = nereid_request_set_id(*req, rid);
        free(rid);
    }
    if (!err && q->corr_len >= 0) {
        char *cs = bls_str(q->corr_s, (size_t)q->corr_len);
        err = nereid_request_set_correlation_id_string(*req, cs);
        free(cs);
    } else if (!err && q->corr) {
        nereid_request_set_correlation_id(*req, q->corr);
    }
    if (!err) {
        if (q->flags) nereid_request_set_sequence_flags(*req, q->flags & 1, q->flags & 2);
        if (q->timeout) nereid_request_set_timeout_us(*req, q->timeout);
        err = bls_parameters(*req, q);
    }
    return err;
}

/* Holds the regions the call's inputs by reference read: the execute in
 * flight's (*ex) and its request bodies'. False when a body region the
 * call names is not held by the execute in flight. */
static bool bls_hold_regions(instance_t *in, const bls_req_t *q, region_t **ex,
                             region_t *body[BODY_SLOTS])
{
    bool body_ok = true;
    if (q->by_ref || q->body_mask) {
        pthread_mutex_lock(&in->mu);
        if (q->by_ref) {
            *ex = in->exec_rx;
            if (*ex) atomic_fetch_add(&(*ex)->refs, 1);
        }
        for (int s = 0; s < BODY_SLOTS; s++) {
            if (!(q->body_mask >> s & 1)) continue;
            body[s] = in->body.exec[s];
            if (body[s])
                atomic_fetch_add(&body[s]->refs, 1);
            else
                body_ok = false;
        }
        pthread_mutex_unlock(&in->mu);
    }
    return body_ok;
}

/* Submits the call: its state (bls_call_t, which takes m, bytes, ex and
 * the body regions, zeroed here) and the request, streamed; a single
 * response of a model that is not decoupled may be written in place into
 * the reply region. On error the caller keeps m, bytes, ex and req. */
static nereid_error_t *bls_submit(instance_t *in, chan_t *c, msg_t *m, const bls_req_t *q,
                                  nereid_request_t *req, bool target_decoupled, uint8_t *bytes,
                                  region_t *ex, region_t *body[BODY_SLOTS])
{
    bls_call_t *call = calloc(1, sizeof *call);
    if (!call) abort();
    *call = (bls_call_t){.in = in,
                         .chan = c,
                         .msg = m,
                         .id = q->id,
                         .cancel = nereid_cancel_token_new(),
                         .bytes = bytes,
                         .ex = ex,
                         .reply_slot = q->reply_slot};
    memcpy(call->body, body, sizeof call->body);
    memset(body, 0, sizeof call->body);
    nereid_request_set_cancel_token(req, call->cancel);
    atomic_fetch_add(&c->refs, 1);
    pthread_mutex_lock(&in->mu);
    in->bls_inflight++;
    call->next = in->bls_calls;
    in->bls_calls = call;
    pthread_mutex_unlock(&in->mu);
    /* One response into a reply region: the called model writes large
     * outputs there itself ("BLS results in place"). */
    nereid_response_allocator_t place = {
        .alloc_fn = bls_alloc, .release_fn = bls_release, .userp = call};
    call->in_place = q->reply_slot >= 0 && !target_decoupled && BLS_IN_PLACE;
    /* The worker can write its messages' memfds and regions and the
     * EXECUTE region inputs by reference read (ex); not the request
     * bodies' (sealed) nor a datagram's (ours): what is computed from
     * those inputs is not cached. */
    unsigned foreign = m->map || m->region || ex ? NEREID_FOREIGN_INPUTS : 0;
    if (call->in_place) foreign |= NEREID_FOREIGN_OUTPUTS; /* our reply region */
    if (foreign) nereid_request_set_foreign_memory(req, foreign);
    nereid_error_t *err = nereid_server_infer_stream(
        in->server, req, call->in_place ? &place : NULL, bls_on_response, call);
    if (!err) return NULL;
    call->msg = NULL;
    call->bytes = NULL;
    call->ex = NULL;
    bls_done(call);
    return err;
}

bool bls_start(instance_t *in, msg_t *m, char *why, size_t why_cap)
{
    bls_req_t q;
    if (!bls_check(m->meta, m->meta_len, &q)) {
        snprintf(why, why_cap, "malformed BLS request");
        return false;
    }
    char *model = bls_str(q.model, q.model_len), text[2048];
    chan_t *c = in->chan;
    bool target_decoupled = false;
    nereid_error_t *err =
        nereid_server_model_decoupled(in->server, model, q.version, &target_decoupled);
    if (err) { /* Triton's text: the lookup's error (unknown model, ...) as it is */
        snprintf(text, sizeof text, "Model %s - Error when running inference: %s", model,
                 nereid_error_message(err));
        bls_reply_error(c, q.id, text, nereid_error_code(err));
        nereid_error_free(err);
        free(model);
        msg_free(m);
        return true;
    }
    if (target_decoupled && !q.decoupled) {
        snprintf(text, sizeof text,
                 "Model %s - Error when running inference: Model %s is using the decoupled. The "
                 "current BLS request call doesn't support models using the decoupled "
                 "transaction policy. Please use 'decoupled=True' argument to the 'exec' or "
                 "'async_exec' calls for decoupled models.'",
                 model, model);
        bls_reply_error(c, q.id, text, NEREID_ERROR_INVALID_ARG);
        free(model);
        msg_free(m);
        return true;
    }
    nereid_request_t *req = NULL;
    err = bls_request_new(in, model, &q, &req);
    size_t nbytes = bls_bytes_total(&q, m);
    uint8_t *bytes = nbytes ? malloc(nbytes) : NULL;
    if (nbytes && !bytes) abort();
    /* Inputs by reference: only into the region of the execute in flight
     * and its request body regions (held until the call's final response,
     * so they are not reused). */
    region_t *ex = NULL, *body[BODY_SLOTS] = {0};
    bool body_ok = bls_hold_regions(in, &q, &ex, body);
    bool bad = !body_ok || (q.by_ref && !ex);
    if (bad)
        snprintf(why, why_cap, "%s",
                 !body_ok ? "BLS input in a request body region the execute in flight does not "
                            "read"
                          : "BLS input in the execute region while no execute is in flight");
    else if (!err)
        bad = !bls_inputs(req, &q, m, ex, body, bytes, &err, why, why_cap);
    if (bad) {
        region_unref(ex);
        for (int s = 0; s < BODY_SLOTS; s++)
            region_unref(body[s]);
        nereid_request_free(req);
        free(bytes);
        free(model);
        return false;
    }
    brd_t ro = {q.outs, q.ins - q.outs, 0, false};
    for (uint32_t i = 0; i < q.n_out && !err; i++) {
        uint32_t n = br_u32(&ro);
        char *name = bls_str(br_take(&ro, n), n);
        err = nereid_request_add_requested_output(req, name, 0);
        free(name);
    }
    if (!err) {
        err = bls_submit(in, c, m, &q, req, target_decoupled, bytes, ex, body);
        if (!err) {
            free(model);
            return true;
        }
    }
    region_unref(ex);
    for (int s = 0; s < BODY_SLOTS; s++)
        region_unref(body[s]);
    nereid_request_free(req);
    free(bytes);
    snprintf(text, sizeof text, "Model %s - Error when running inference: %s", model,
             nereid_error_message(err));
    bls_reply_error(c, q.id, text, nereid_error_code(err));
    nereid_error_free(err);
    free(model);
    msg_free(m);
    return true;
}

/* ResponseIterator.cancel(): cancels the request of the worker's BLS call
 * (the model it went to sees is_cancelled(), queued steps end CANCELLED).
 * An unknown or finished call is ignored, as Triton ignores a cancel after
 * the last response. */
bool bls_cancel(instance_t *in, msg_t *m, char *why, size_t why_cap)
{
    json_t *jc = json_object_get(m->json, "call");
    if (!json_is_integer(jc)) {
        snprintf(why, why_cap, "malformed BLS cancel");
        return false;
    }
    pthread_mutex_lock(&in->mu);
    for (bls_call_t *c = in->bls_calls; c; c = c->next)
        if (c->chan == in->chan && c->id == (uint64_t)json_integer_value(jc))
            nereid_request_cancel(c->cancel);
    pthread_mutex_unlock(&in->mu);
    return true;
}
