/*
 * This file contains request bodies (backend ABI 1.10): the model's
 * pool of shared-memory regions the HTTP frontend receives inference
 * bodies into, so that execute references inputs where they lie instead of
 * copying them, and the bookkeeping of which body regions the worker
 * still holds. Described below.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "python_internal.h"

/* ---- Request bodies (backend ABI 1.10) ----
 *
 * The HTTP frontend receives an inference body for a Python model into one
 * of the model's body regions (nereid_backend_model_body_alloc), so the
 * inputs, which borrow the body, already lie in shared memory the workers
 * map: execute references them (where = BODY_WHERE + slot, offset in the
 * region) instead of copying them into the EXECUTE region, and an output
 * that is a view of such an input (an identity) comes back the same way and
 * goes to the reply as a view of the region.
 *
 * - Per model BODY_SLOTS regions, BODY_BUDGET bytes together; a body under
 *   BODY_MIN, over half the budget, for a decoupled model, or finding no
 *   free slot and no room gets none (the frontend uses its own memory,
 *   inputs are copied as before).
 * - A region is a memfd sealed F_SEAL_SHRINK | F_SEAL_GROW |
 *   F_SEAL_FUTURE_WRITE | F_SEAL_SEAL once the server mapped it writable:
 *   a worker can map it read-only only (and cannot write(), ftruncate() or
 *   mprotect() its way in), so the body the server parsed is the body the
 *   request reads (no TOCTOU through a hostile worker).
 * - Each worker gets a region's memfd once, in an M_BODY_MAP message (the
 *   slot in M_SLOT_SHIFT bits) sent just before the first EXECUTE that
 *   references it (instance_t.body_mapped: the region's id per slot,
 *   forgotten when the worker ends; a new worker gets them again).
 * - Lifetime: a region is free (taken by the next body) when the pool's
 *   reference is its only one. Others: the frontend's (the body, until the
 *   reply is sent and the connection's request state freed), the execute
 *   in flight's (instance_t.exec_body), a response output that views it
 *   (until the reply is sent), and the worker's holds: each DONE says in
 *   bits 16-23 of its kind which body slots the worker's arrays may still
 *   view (the execute's own always, earlier ones while an array of theirs
 *   lives: a model that keeps an input past execute); the server keeps a
 *   reference for each (instance_t.body_held) until a later DONE leaves
 *   the bit out or the worker ends. So a kept input never changes, as it
 *   cannot in Triton, where an input tensor lives as long as its object.
 *   (The EXECUTE region has no such rule: a model that keeps an input
 *   array from it past execute may see it overwritten by the next EXECUTE;
 *   only a response output viewing it keeps it.)
 * - The worker is untrusted: a DONE record naming a body slot this execute
 *   does not reference, or an offset and size outside the body in it, and
 *   a hold on a slot neither this execute nor an earlier hold names, end
 *   the worker. */

/* A new request body region of size bytes for slot: mapped writable here,
 * then sealed so that nobody maps it writable again. NULL when that fails. */
static region_t *body_region_new(size_t size, uint8_t slot)
{
    static _Atomic uint64_t next_id = 1;
    int fd = memfd_create("nereid-body", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    uint8_t *map = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, (off_t)size) == 0)
        map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED &&
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL)) {
        munmap(map, size);
        map = MAP_FAILED;
    }
    if (map == MAP_FAILED) {
        if (fd >= 0) close(fd);
        return NULL;
    }
    populate(map, size, MADV_POPULATE_WRITE);
    region_t *r = calloc(1, sizeof *r);
    if (!r) abort();
    r->map = map;
    r->size = size;
    r->fd = fd;
    r->slot = slot;
    r->id = atomic_fetch_add(&next_id, 1);
    atomic_init(&r->refs, 1);
    return r;
}

/* backend.h: memory for a request body of byte_size bytes, a region of the
 * model's pool (the handle is the region, with a reference), or NULL. */
NEREID_EXPORT void *nereid_backend_model_body_alloc(nereid_model_t *model, size_t byte_size,
                                                    void **data)
{
    *data = NULL;
    model_state_t *ms = nereid_model_state(model);
    if (!ms || byte_size < BODY_MIN || byte_size > BODY_BUDGET / 2 || nereid_model_decoupled(model))
        return NULL;
    pthread_mutex_lock(&ms->body_mu);
    int best = -1, empty = -1, small = -1;
    for (int s = 0; s < BODY_SLOTS; s++) {
        region_t *r = ms->body[s];
        if (!r) {
            if (empty < 0) empty = s;
        } else if (atomic_load(&r->refs) != 1) {
            continue; /* in use */
        } else if (r->size >= byte_size) {
            if (best < 0 || r->size < ms->body[best]->size) best = s;
        } else if (small < 0 || r->size < ms->body[small]->size) {
            small = s;
        }
    }
    region_t *r = best >= 0 ? ms->body[best] : NULL;
    if (!r) {
        size_t size = BODY_REGION_MIN;
        while (size < byte_size)
            size *= 2;
        /* an empty slot, else a free region too small for this body */
        int s = empty >= 0 && ms->body_bytes + size <= BODY_BUDGET ? empty : small;
        size_t gone = s >= 0 && ms->body[s] ? ms->body[s]->size : 0;
        if (s >= 0 && ms->body_bytes - gone + size <= BODY_BUDGET &&
            (r = body_region_new(size, (uint8_t)s))) {
            region_unref(ms->body[s]);
            ms->body[s] = r;
            ms->body_bytes = ms->body_bytes - gone + size;
            ms->body_made++;
            atomic_store(&ms->body_any, true);
        }
    }
    if (r) {
        atomic_fetch_add(&r->refs, 1);
        r->used = byte_size;
        ms->body_taken++;
        *data = r->map;
    } else {
        ms->body_missed++;
    }
    pthread_mutex_unlock(&ms->body_mu);
    return r;
}

/* backend.h: the frontend is done with the body; the region is free again
 * once nothing else holds it. */
NEREID_EXPORT void nereid_backend_model_body_release(void *handle)
{
    region_unref(handle);
}

/* The body region input v lies in, referenced by this execute (its memfd
 * sent to the worker first when it has not got it), or NULL: v is copied. */
region_t *body_ref(instance_t *in, model_state_t *ms, const tview_t *v)
{
    if (in->decoupled || !ms || !v->size || nereid_datatype_byte_size(v->datatype) == 0 ||
        !atomic_load_explicit(&ms->body_any, memory_order_relaxed))
        return NULL;
    const uint8_t *d = v->data;
    region_t *r = NULL;
    pthread_mutex_lock(&ms->body_mu);
    for (int s = 0; s < BODY_SLOTS && !r; s++) {
        region_t *b = ms->body[s];
        if (b && d >= b->map && d < b->map + b->used && v->size <= b->used - (size_t)(d - b->map))
            r = b;
    }
    pthread_mutex_unlock(&ms->body_mu);
    if (!r) return NULL;
    /* The request's body holds r: it stays in its slot while this runs.
     * Published under in->mu: a BLS call of this execute may name it. */
    if (!in->body.exec[r->slot]) {
        atomic_fetch_add(&r->refs, 1);
        pthread_mutex_lock(&in->mu);
        in->body.exec[r->slot] = r;
        pthread_mutex_unlock(&in->mu);
    } else if (in->body.exec[r->slot] != r) {
        return NULL;
    }
    if (in->body.mapped[r->slot] != r->id) {
        uint8_t hdr[HDR_BYTES];
        hdr_pack(hdr, M_BODY_MAP | (uint32_t)r->slot << M_SLOT_SHIFT, 0, 0);
        if (send_with_fd(in->chan, hdr, r->fd) == 0) in->body.mapped[r->slot] = r->id;
    }
    in->body.inputs++;
    return r;
}

/* After execute's DONE: the worker's holds become held (a bit: the slot's
 * region is referenced until a later DONE clears it), and the execute's own
 * references go. held was checked by apply_done (0 when there was none). */
void body_settle(instance_t *in, uint32_t held)
{
    for (int s = 0; s < BODY_SLOTS; s++) {
        bool keep = held >> s & 1;
        region_t *now = in->body.exec[s];
        if (!now && !in->body.held[s]) continue;
        pthread_mutex_lock(&in->mu);
        in->body.exec[s] = NULL;
        pthread_mutex_unlock(&in->mu);
        if (keep && now && in->body.held[s] != now) {
            region_unref(in->body.held[s]);
            in->body.held[s] = now;
            now = NULL;
        } else if (!keep && in->body.held[s]) {
            region_unref(in->body.held[s]);
            in->body.held[s] = NULL;
        }
        region_unref(now);
    }
}

/* A worker's end (or start): its body-region holds and mappings are gone. */
void body_forget(instance_t *in)
{
    for (int s = 0; s < BODY_SLOTS; s++) {
        region_unref(in->body.held[s]);
        in->body.held[s] = NULL;
        in->body.mapped[s] = 0;
    }
}
