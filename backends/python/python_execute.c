/*
 * This file contains execute (nereid_backend_execute): a batch becomes
 * one EXECUTE message (a binary description; tensors in the instance's
 * EXECUTE region, or referenced in request body regions), execute's thread
 * reads the socket until the worker's DONE (python_reader.c's
 * execute_read_done, spinning first: python_spin.c), and the DONE is
 * checked whole (done_check) and applied to the batch's responses. A
 * decoupled model's responses come as RESPONSE messages (on_response)
 * through the senders execute registers. A worker that is dead when
 * execute begins is started again; one that dies or sends a malformed DONE
 * fails the batch and is ended.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "python_internal.h"

static nereid_error_t *error_from_json(json_t *e)
{
    const char *text = json_string_value(json_object_get(e, "message"));
    json_t *jc = json_object_get(e, "code");
    json_int_t code = json_is_integer(jc) ? json_integer_value(jc) : NEREID_ERROR_INTERNAL;
    if (code < NEREID_ERROR_UNKNOWN || code > NEREID_ERROR_CANCELLED) code = NEREID_ERROR_INTERNAL;
    return nereid_error_new((nereid_error_code_t)code, "%s", text ? text : "");
}

/* Removes and returns the sender with this id (NULL if unknown). */
static nereid_response_sender_t *sender_take(instance_t *in, uint64_t id, bool remove)
{
    pthread_mutex_lock(&in->mu);
    nereid_response_sender_t *s = NULL;
    for (sender_slot_t **p = &in->senders; *p; p = &(*p)->next) {
        if ((*p)->id != id) continue;
        s = (*p)->sender;
        if (remove) {
            sender_slot_t *dead = *p;
            *p = dead->next;
            free(dead);
        }
        break;
    }
    pthread_mutex_unlock(&in->mu);
    return s;
}

/* A decoupled response from the worker. */
bool on_response(instance_t *in, msg_t *m, char *why, size_t why_cap)
{
    json_t *js = json_object_get(m->json, "sender"), *jf = json_object_get(m->json, "flags");
    if (!json_is_integer(js) || !json_is_integer(jf) ||
        (json_integer_value(jf) & ~(json_int_t)NEREID_RESPONSE_FLAG_FINAL)) {
        snprintf(why, why_cap, "malformed response");
        return false;
    }
    uint32_t flags = (uint32_t)json_integer_value(jf);
    bool final = flags & NEREID_RESPONSE_FLAG_FINAL;
    nereid_response_sender_t *s = sender_take(in, (uint64_t)json_integer_value(js), final);
    if (!s) return true; /* already closed: the model is told nothing more is sent */
    json_t *err = json_object_get(m->json, "error");
    nereid_error_t *e = NULL;
    if (json_is_object(err)) {
        e = nereid_sender_send(s, flags, error_from_json(err));
    } else if (json_is_true(json_object_get(m->json, "empty"))) {
        e = nereid_sender_send_flags(s, flags);
    } else {
        nereid_error_t *bad =
            python_api_response_parameters(json_object_get(m->json, "parameters"), NULL, 0, s);
        json_t *ts = bad ? NULL : json_object_get(m->json, "tensors");
        size_t i;
        json_t *d;
        json_array_foreach(ts, i, d)
        {
            tview_t v;
            int64_t shape[MAX_RANK];
            char w[512];
            if (!parse_tensor(d, m->blob, m->blob_len, &v, shape, w, sizeof w)) {
                bad = nereid_error_new(NEREID_ERROR_INTERNAL, "Python model '%s': %s", in->name, w);
                break;
            }
            void *buf;
            bad = nereid_sender_output(s, v.name, v.datatype, v.shape, v.rank, v.size, &buf);
            if (bad) break;
            if (v.size) memcpy(buf, v.data, v.size);
            if (v.datatype == NEREID_TYPE_BYTES &&
                !bytes_ok(buf, v.size, elements(v.shape, v.rank))) {
                bad = nereid_error_new(NEREID_ERROR_INTERNAL,
                                       "Python model '%s': BYTES tensor '%s' changed while it "
                                       "was read",
                                       in->name, v.name);
                break;
            }
        }
        e = nereid_sender_send(s, flags, bad);
    }
    nereid_error_free(e);
    return true;
}

/* ---- Execute ---- */

static json_t *request_parameters(nereid_batch_t *batch, size_t r)
{
    json_t *o = json_object();
    for (size_t i = 0; i < nereid_batch_request_parameter_count(batch, r); i++) {
        const char *name;
        nereid_parameter_type_t type;
        const void *value;
        if (nereid_batch_request_parameter(batch, r, i, &name, &type, &value)) continue;
        json_object_set_new(o, name, python_api_parameter_json((int)type, value));
    }
    return o;
}

static void fail_all(nereid_batch_t *batch, nereid_error_t *err)
{
    for (size_t r = 0; r < nereid_batch_request_count(batch); r++)
        nereid_batch_set_request_error(
            batch, r, nereid_error_new(nereid_error_code(err), "%s", nereid_error_message(err)));
    nereid_error_free(err);
}

/* The worker's answer to a non-decoupled execute. false: it is malformed. */
/* pb_utils' set_release_flags(RESCHEDULE): request r runs again in a later
 * batch; where the core refuses (no iterative_sequence), the request fails
 * with the core's (Triton's) text. */
static void reschedule(nereid_batch_t *batch, size_t r)
{
    nereid_error_t *err = nereid_batch_request_reschedule(batch, r);
    if (err) nereid_batch_set_request_error(batch, r, err);
}

/* A DONE's text (len bytes at t) as an error of code. */
static nereid_error_t *text_error(const uint8_t *t, uint32_t len, uint32_t code)
{
    if (code > NEREID_ERROR_CANCELLED) code = NEREID_ERROR_INTERNAL;
    return nereid_error_new((nereid_error_code_t)code, "%.*s", (int)(len > INT_MAX ? INT_MAX : len),
                            (const char *)t);
}

/* Response r of a DONE (kind 0): its status, outputs and parameters. A
 * tensor that does not add up fails request r; a description that cannot
 * be read is the worker's fault (false). */
static bool apply_response(instance_t *in, nereid_batch_t *batch, size_t r, brd_t *rd, msg_t *m,
                           char *why, size_t why_cap)
{
    uint32_t status = br_u32(rd), n_out = br_u32(rd), params_len = br_u32(rd);
    uint32_t code = br_u32(rd), err_len = br_u32(rd);
    const uint8_t *err_text = br_take(rd, err_len), *params = br_take(rd, params_len);
    if (rd->bad || status > RESP_RESCHEDULE || (status != RESP_OUTPUTS && n_out)) {
        snprintf(why, why_cap, "malformed execute answer");
        return false;
    }
    if (status == RESP_ERROR) {
        nereid_batch_set_request_error(batch, r, text_error(err_text, err_len, code));
        return true;
    }
    if (status == RESP_RESCHEDULE) {
        reschedule(batch, r);
        return true;
    }
    nereid_error_t *bad = NULL;
    const uint8_t *ex = in->tx ? in->tx->map : NULL;
    size_t ex_len = in->tx ? in->tx->size : 0;
    char name[MAX_NAME + 1];
    for (uint32_t i = 0; i < n_out; i++) {
        tview_t v;
        int64_t shape[MAX_RANK];
        char w[512];
        /* where 2 + k: the BLS_RESULT region in slot k as it is now (a
         * reference: the response keeps it, bls_send_result writes no new
         * call's result into a region a response still reads). */
        uint32_t where = record_where(rd);
        if (where >= BODY_WHERE && where != UINT32_MAX) {
            /* An output in a request body region: it must be one this
             * execute references, and lie in its body. */
            region_t *br =
                where < BODY_WHERE + BODY_SLOTS ? in->body.exec[where - BODY_WHERE] : NULL;
            if (!br || !read_tensor(rd, m->blob, m->blob_len, br->map, br->used, &v, shape, name, w,
                                    sizeof w)) {
                snprintf(why, why_cap, "malformed execute answer: %s",
                         br ? w : "an output in a request body region the execute does not read");
                nereid_error_free(bad);
                return false;
            }
            if (bad) continue;
            if (v.size >= VIEW_MIN && nereid_datatype_byte_size(v.datatype) != 0) {
                atomic_fetch_add(&br->refs, 1);
                bad = nereid_batch_request_output_view(batch, r, v.name, v.datatype, v.shape,
                                                       v.rank, v.data, v.size, region_release, br);
                if (bad) region_unref(br);
                continue;
            }
            void *buf;
            bad = nereid_batch_request_output(batch, r, v.name, v.datatype, v.shape, v.rank, v.size,
                                              &buf);
            if (!bad && v.size) memcpy(buf, v.data, v.size);
            if (!bad && v.datatype == NEREID_TYPE_BYTES &&
                !bytes_ok(buf, v.size, elements(v.shape, v.rank)))
                bad = nereid_error_new(NEREID_ERROR_INTERNAL,
                                       "Python model '%s': BYTES tensor '%s' is malformed",
                                       in->name, v.name);
            continue;
        }
        region_t *res_region = NULL;
        if (where >= 2 && where < 2 + BLS_SLOTS) {
            pthread_mutex_lock(&in->chan->bls_mu);
            res_region = in->chan->bls_tx[where - 2];
            if (res_region) atomic_fetch_add(&res_region->refs, 1);
            pthread_mutex_unlock(&in->chan->bls_mu);
        }
        bool ok = res_region ? read_tensor(rd, m->blob, m->blob_len, res_region->map,
                                           res_region->size, &v, shape, name, w, sizeof w)
                             : read_tensor(rd, m->blob, m->blob_len, where == 1 ? ex : NULL, ex_len,
                                           &v, shape, name, w, sizeof w);
        if (!ok) {
            region_unref(res_region);
            if (rd->bad) {
                snprintf(why, why_cap, "malformed execute answer: %s", w);
                nereid_error_free(bad);
                return false;
            }
            if (!bad)
                bad = nereid_error_new(NEREID_ERROR_INTERNAL, "Python model '%s': %s", in->name, w);
            continue;
        }
        if (bad) {
            region_unref(res_region);
            continue;
        }
        if (res_region && nereid_datatype_byte_size(v.datatype) != 0) {
            bad = nereid_batch_request_output_view(batch, r, v.name, v.datatype, v.shape, v.rank,
                                                   v.data, v.size, region_release, res_region);
            if (bad) region_unref(res_region);
            continue;
        }
        const uint8_t *d = v.data;
        if (ex && d >= ex && d < ex + ex_len && v.size >= VIEW_MIN &&
            nereid_datatype_byte_size(v.datatype) != 0) {
            /* A view of an input (in our EXECUTE region): the response keeps
             * the region (tx_pick does not reuse it until released). */
            atomic_fetch_add(&in->tx->refs, 1);
            bad = nereid_batch_request_output_view(batch, r, v.name, v.datatype, v.shape, v.rank,
                                                   v.data, v.size, region_release, in->tx);
            if (bad) region_unref(in->tx);
            continue;
        }
        void *buf;
        bad = nereid_batch_request_output(batch, r, v.name, v.datatype, v.shape, v.rank, v.size,
                                          &buf);
        if (!bad && v.size) memcpy(buf, v.data, v.size);
        region_unref(res_region);
        if (!bad && v.datatype == NEREID_TYPE_BYTES &&
            !bytes_ok(buf, v.size, elements(v.shape, v.rank)))
            bad = nereid_error_new(NEREID_ERROR_INTERNAL,
                                   "Python model '%s': BYTES tensor '%s' changed while it "
                                   "was read",
                                   in->name, v.name);
    }
    if (!bad && params_len) {
        json_error_t jerr;
        json_t *jp = json_loadb((const char *)params, params_len, JSON_REJECT_DUPLICATES, &jerr);
        if (!json_is_object(jp)) {
            json_decref(jp);
            snprintf(why, why_cap, "malformed execute answer: response parameters");
            return false;
        }
        bad = python_api_response_parameters(jp, batch, r, NULL);
        json_decref(jp);
    }
    if (bad) nereid_batch_set_request_error(batch, r, bad);
    return true;
}

/* Makes in->tx a region no response output still reads (an output view
 * holds a reference until the frontend sent its reply): the current one
 * when free, else a free spare (the worker has it mapped in its slot),
 * else none (outmsg_send_region makes a new one, in the slot tx_free_slot
 * gives). The busy one becomes a spare while there is room. */
static void tx_pick(instance_t *in)
{
    if (!in->tx || atomic_load(&in->tx->refs) == 1) return;
    region_t *busy = in->tx;
    in->tx = NULL;
    in->tx_switches++;
    for (int i = 0; i < TX_SPARES && !in->tx; i++) {
        region_t *r = in->tx_spare[i];
        if (r && atomic_load(&r->refs) == 1) {
            in->tx = r;
            in->tx_spare[i] = NULL;
        }
    }
    for (int i = 0; i < TX_SPARES && busy; i++) {
        if (!in->tx_spare[i]) {
            in->tx_spare[i] = busy;
            busy = NULL;
        }
    }
    region_unref(busy);
}

/* The lowest slot no spare region uses (there is always one: TX_SPARES
 * spares, TX_SPARES + 1 slots); a new EXECUTE region takes it, replacing
 * in->tx, whose slot is then free too. */
static uint8_t tx_free_slot(const instance_t *in)
{
    unsigned used = 0;
    for (int i = 0; i < TX_SPARES; i++)
        if (in->tx_spare[i]) used |= 1u << in->tx_spare[i]->slot;
    uint8_t s = 0;
    while (used & 1u << s)
        s++;
    return s;
}

/* The name of the model's o-th output. */
static const char *model_output_name(const instance_t *in, size_t o)
{
    const char *name;
    nereid_datatype_t dt;
    const int64_t *dims;
    size_t rank;
    nereid_model_output(in->model, o, &name, &dt, &dims, &rank);
    return name;
}

/* The worker's answer to an execute (DONE). false: it is malformed.
 * *held: the body slots the worker holds (see "Request bodies"). */
static bool apply_done(instance_t *in, nereid_batch_t *batch, msg_t *m, uint32_t *held, char *why,
                       size_t why_cap)
{
    size_t n = nereid_batch_request_count(batch);
    *held = 0;
    if (!done_check(m->meta, m->meta_len, n, in->decoupled)) {
        snprintf(why, why_cap, "malformed execute answer");
        return false;
    }
    brd_t rd = {m->meta, m->meta_len, 0, false};
    uint32_t kind = br_u32(&rd);
    uint32_t holds = kind >> 16, may = 0;
    kind &= 0xFFFF;
    for (int s = 0; s < BODY_SLOTS; s++)
        if (in->body.exec[s] || in->body.held[s]) may |= 1u << s;
    if (holds & ~may) {
        snprintf(why, why_cap,
                 "malformed execute answer: a hold on a request body region it "
                 "was not given");
        return false;
    }
    if (kind == DONE_ERROR) {
        uint32_t len = br_u32(&rd);
        fail_all(batch, text_error(br_take(&rd, len), len, NEREID_ERROR_INTERNAL));
    } else if (kind == DONE_DECOUPLED) {
        /* Requests released with RESCHEDULE (before execute returned, as
         * Triton requires of decoupled models). */
        uint32_t k = br_u32(&rd);
        for (uint32_t i = 0; i < k; i++)
            reschedule(batch, br_u32(&rd));
    } else {
        br_u32(&rd); /* n, checked */
        for (size_t r = 0; r < n; r++)
            if (!apply_response(in, batch, r, &rd, m, why, why_cap)) return false;
    }
    *held = holds;
    return true;
}

/* The id of request r's response sender in the worker (a slot per sender),
 * -1 when it has none (the request fails with the reason). */
static int64_t request_sender_id(instance_t *in, nereid_batch_t *batch, size_t r)
{
    nereid_response_sender_t *s;
    nereid_error_t *e = nereid_batch_request_sender(batch, r, &s);
    if (e) {
        nereid_batch_set_request_error(batch, r, e);
        return -1;
    }
    /* A rescheduled request comes back with the sender it had:
     * it keeps its slot (one slot per sender). */
    pthread_mutex_lock(&in->mu);
    sender_slot_t *slot = in->senders;
    while (slot && slot->sender != s)
        slot = slot->next;
    if (!slot) {
        slot = calloc(1, sizeof *slot);
        if (!slot) abort();
        slot->id = ++in->next_sender;
        slot->sender = s;
        slot->next = in->senders;
        in->senders = slot;
    }
    int64_t id = (int64_t)slot->id;
    pthread_mutex_unlock(&in->mu);
    return id;
}

/* Writes request r of the batch into the EXECUTE message: its header (id,
 * correlation, flags, parameters, sender), requested outputs and input
 * tensors (by reference into a request body region, else as views). ins
 * has room for the batch's n_in inputs. */
static void encode_request(instance_t *in, model_state_t *ms, nereid_batch_t *batch, size_t r,
                           tview_t *ins, size_t n_in, bwr_t *w, outmsg_t *om)
{
    size_t k = 0;
    for (size_t i = 0; i < n_in; i++) {
        tview_t *v = &ins[k];
        v->name = nereid_batch_input_name(batch, i);
        nereid_error_t *e = nereid_batch_request_input(batch, r, v->name, &v->datatype, &v->shape,
                                                       &v->rank, &v->data, &v->size);
        if (e) {
            nereid_error_free(e);
            continue;
        }
        k++;
    }
    uint32_t n_out = 0;
    for (size_t o = 0; o < nereid_model_output_count(in->model); o++)
        n_out += nereid_batch_request_output_requested(batch, r, model_output_name(in, o));
    const char *id = nereid_batch_request_id(batch, r);
    uint64_t corr, timeout_us;
    const char *corr_str;
    uint32_t flags;
    nereid_batch_request_sequence(batch, r, &corr, &corr_str, &flags, &timeout_us);
    char *params = NULL;
    if (nereid_batch_request_parameter_count(batch, r)) {
        json_t *jp = request_parameters(batch, r);
        params = json_dumps(jp, JSON_COMPACT);
        json_decref(jp);
    }
    int64_t sender_id = in->decoupled ? request_sender_id(in, batch, r) : -1;
    size_t id_len = id ? strlen(id) : 0, corr_len = corr_str ? strlen(corr_str) : 0;
    size_t params_len = params ? strlen(params) : 0;
    bw_exec_request(w, (uint32_t)k, n_out, flags, (uint32_t)id_len,
                    corr_str ? (uint32_t)corr_len : UINT32_MAX, (uint32_t)params_len, corr,
                    timeout_us, sender_id);
    bw_put(w, id, id_len);
    bw_put(w, corr_str, corr_len);
    bw_put(w, params, params_len);
    free(params);
    for (size_t o = 0; o < nereid_model_output_count(in->model); o++) {
        const char *name = model_output_name(in, o);
        if (!nereid_batch_request_output_requested(batch, r, name)) continue;
        bw_u32(w, (uint32_t)strlen(name));
        bw_put(w, name, strlen(name));
    }
    for (size_t i = 0; i < k; i++) {
        region_t *br = body_ref(in, ms, &ins[i]);
        if (br)
            bw_tensor_where(w, &ins[i], BODY_WHERE + br->slot,
                            (uint64_t)((const uint8_t *)ins[i].data - br->map));
        else
            bw_tensor(w, &ins[i], outmsg_add_view(om, &ins[i]));
    }
}

static nereid_error_t *execute_locked(instance_t *in, nereid_batch_t *batch)
{
    size_t n = nereid_batch_request_count(batch);
    pthread_mutex_lock(&in->mu);
    bool dead = in->dead, aborted = in->aborted;
    pthread_mutex_unlock(&in->mu);
    if ((dead || !in->reader_running) && g_backend->restart == RESTART_NEVER && !aborted)
        return unhealthy(in); /* Triton: until the model is loaded again */
    if (dead || !in->reader_running) {
        /* The worker died and its restart (python_worker.c, "Restarts")
         * is due, failed or has not run yet: start a new one now. */
        nereid_error_t *e = worker_restart(in);
        if (e) return e;
    }
    outmsg_t om = {0};
    bwr_t w = {0};
    model_state_t *ms = nereid_model_state(in->model);
    bw_u32(&w, (uint32_t)n);
    size_t n_in = nereid_batch_input_count(batch);
    tview_t *ins = calloc(n_in ? n_in : 1, sizeof *ins);
    if (!ins) abort();
    for (size_t r = 0; r < n; r++)
        encode_request(in, ms, batch, r, ins, n_in, &w, &om);
    free(ins);
    om.raw = w.p;
    om.raw_len = w.n;
    pthread_mutex_lock(&in->mu);
    in->batch = batch;
    pthread_mutex_unlock(&in->mu);
    /* The only python execute in flight, with one request (a batch of
     * several already means requests queue). */
    bool alone = atomic_fetch_add_explicit(&g_executing, 1, memory_order_relaxed) == 0 && n == 1;
    spin_hint_set(in, alone);
    uint64_t spin_ns = spin_budget_ns(in, nereid_now_ns(), alone);
    exec_reading_begin(in);
    tx_pick(in);
    om.publish = &in->exec_rx;
    om.publish_mu = &in->mu;
    int rc = outmsg_send_region(in->chan, M_EXECUTE, &om, &in->tx, tx_free_slot(in));
    if (in->tx && in->tx->fresh) {
        in->tx->fresh = false;
        in->tx_made++;
    }
    uint64_t input_end = nereid_now_ns();
    msg_t *m = NULL;
    bool spun = false, hit = false, contended = false;
    if (rc == 0) {
        m = execute_read_done(in, spin_ns ? input_end + spin_ns : 0, &spun, &hit, &contended);
    } else {
        exec_reading_end(in);
    }
    uint64_t infer_end = nereid_now_ns();
    atomic_fetch_sub_explicit(&g_executing, 1, memory_order_relaxed);
    if (spun && m) spin_record(in, infer_end - input_end, hit, contended);
    pthread_mutex_lock(&in->mu);
    in->batch = NULL;
    region_t *ex_done = in->exec_rx;
    in->exec_rx = NULL;
    pthread_mutex_unlock(&in->mu);
    region_unref(ex_done);
    if (!m) {
        body_settle(in, 0);
        worker_stop(in);
        if (!in->decoupled) fail_all(batch, unhealthy(in));
        return NULL;
    }
    char why[512];
    uint32_t held = 0;
    bool done_ok = apply_done(in, batch, m, &held, why, sizeof why);
    body_settle(in, held);
    if (!done_ok) {
        plog('E', "python backend: worker of '%s': %s", in->name, why);
        pthread_mutex_lock(&in->mu);
        if (!in->death) in->death = strdup(why);
        pthread_mutex_unlock(&in->mu);
        fail_all(batch, unhealthy(in));
        worker_stop(in);
    }
    msg_free(m);
    nereid_batch_report_compute(batch, input_end, infer_end);
    return NULL;
}

/* One execute at a time with a restart of the worker (life_mu). */
NEREID_EXPORT nereid_error_t *nereid_backend_execute(nereid_instance_t *instance,
                                                     nereid_batch_t *batch)
{
    instance_t *in = nereid_instance_state(instance);
    pthread_mutex_lock(&in->life_mu);
    nereid_error_t *e = execute_locked(in, batch);
    pthread_mutex_unlock(&in->life_mu);
    return e;
}
