/*
 * This file contains the accumulator backend, a stateful toy model for the
 * sequence batcher. Config parameters:
 *   mode              "controls" (default): keeps a running sum per sequence
 *                     inside the backend, driven by the START / END / READY /
 *                     CORRID control inputs (any of them optional; a control
 *                     is true when its value is non-zero);
 *                     "state": keeps no state, uses implicit state instead
 *                     (INPUT_STATE in, OUTPUT_STATE out).
 *   key               controls mode: "slot" (default) keys the sum by batch
 *                     row (direct strategy), "corrid" by the CORRID value
 *                     (oldest strategy; a batch with one sequence twice fails).
 *   state_op          state mode: "add" (default) OUTPUT = OUTPUT_STATE =
 *                     INPUT + INPUT_STATE (state broadcast when it has one
 *                     element); "append" OUTPUT_STATE = INPUT_STATE ++ INPUT
 *                     (the state grows) and OUTPUT = [sum of OUTPUT_STATE].
 *   execute_delay_ms  sleep this long in every execute.
 * Controls mode tensors: INPUT int32 [1] -> OUTPUT int32 [1]; optional
 * outputs CONTROLS fp32 [4] (START, END, READY, CORRID as received) and
 * BATCH int32 [1] (rows in this execution, fillers included).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nereid/backend.h"

#define NEREID_MAX_RANK_ACC 16

NEREID_EXPORT uint32_t nereid_backend_abi_version(void)
{
    return NEREID_BACKEND_ABI_VERSION;
}

typedef struct acc_entry {
    char key[160];
    int64_t sum;
} acc_entry_t;

typedef struct acc_instance {
    bool by_corrid;
    bool state_mode;
    bool append;
    long delay_ms;
    int64_t *slot_sum; /* by row */
    size_t n_slots;
    acc_entry_t *entries; /* by corrid */
    size_t n_entries;
} acc_instance_t;

static bool param_is(const nereid_model_t *m, const char *key, const char *value)
{
    const char *v = nereid_model_parameter(m, key);
    return v && strcmp(v, value) == 0;
}

NEREID_EXPORT nereid_error_t *nereid_backend_instance_init(nereid_instance_t *instance)
{
    const nereid_model_t *m = nereid_instance_model(instance);
    acc_instance_t *a = calloc(1, sizeof *a);
    if (!a) return nereid_error_new(NEREID_ERROR_INTERNAL, "accumulator: out of memory");
    a->state_mode = param_is(m, "mode", "state");
    a->by_corrid = param_is(m, "key", "corrid");
    a->append = param_is(m, "state_op", "append");
    const char *d = nereid_model_parameter(m, "execute_delay_ms");
    a->delay_ms = d ? strtol(d, NULL, 10) : 0;
    int64_t mbs = nereid_model_max_batch_size(m);
    a->n_slots = mbs > 0 ? (size_t)mbs : 1;
    a->slot_sum = calloc(a->n_slots, sizeof *a->slot_sum);
    nereid_instance_set_state(instance, a);
    return NULL;
}

NEREID_EXPORT nereid_error_t *nereid_backend_instance_fini(nereid_instance_t *instance)
{
    acc_instance_t *a = nereid_instance_state(instance);
    if (a) {
        free(a->slot_sum);
        free(a->entries);
        free(a);
    }
    return NULL;
}

/* Element i of a control tensor as a double (0 when absent). */
/* Element i of an int32 tensor (backend inputs may be unaligned). */
static int32_t i32_at(const void *data, size_t i)
{
    int32_t v;
    memcpy(&v, (const char *)data + i * 4, 4);
    return v;
}

static double ctl_value(nereid_datatype_t dt, const void *data, size_t bytes, int64_t i)
{
    if (!data) return 0;
    switch (dt) {
    case NEREID_TYPE_INT32: {
        int32_t v;
        if ((size_t)(i + 1) * 4 > bytes) return 0;
        memcpy(&v, (const char *)data + i * 4, 4);
        return v;
    }
    case NEREID_TYPE_UINT32: {
        uint32_t v;
        if ((size_t)(i + 1) * 4 > bytes) return 0;
        memcpy(&v, (const char *)data + i * 4, 4);
        return v;
    }
    case NEREID_TYPE_FP32: {
        float v;
        if ((size_t)(i + 1) * 4 > bytes) return 0;
        memcpy(&v, (const char *)data + i * 4, 4);
        return v;
    }
    case NEREID_TYPE_BOOL:
        return (size_t)i < bytes ? ((const uint8_t *)data)[i] : 0;
    case NEREID_TYPE_INT64: {
        int64_t v;
        if ((size_t)(i + 1) * 8 > bytes) return 0;
        memcpy(&v, (const char *)data + i * 8, 8);
        return (double)v;
    }
    case NEREID_TYPE_UINT64: {
        uint64_t v;
        if ((size_t)(i + 1) * 8 > bytes) return 0;
        memcpy(&v, (const char *)data + i * 8, 8);
        return (double)v;
    }
    default:
        return 0;
    }
}

/* CORRID element i as a string key. */
static void corrid_key(nereid_datatype_t dt, const void *data, size_t bytes, int64_t i, char *out,
                       size_t len)
{
    out[0] = 0;
    if (!data) return;
    if (dt == NEREID_TYPE_BYTES) {
        size_t off = 0;
        for (int64_t k = 0; off + 4 <= bytes; k++) {
            uint32_t l;
            memcpy(&l, (const char *)data + off, 4);
            if (off + 4 + l > bytes) return;
            if (k == i) {
                snprintf(out, len, "s:%.*s", (int)l, (const char *)data + off + 4);
                return;
            }
            off += 4 + l;
        }
        return;
    }
    if (dt == NEREID_TYPE_UINT64 || dt == NEREID_TYPE_INT64) {
        uint64_t v;
        if ((size_t)(i + 1) * 8 > bytes) return;
        memcpy(&v, (const char *)data + i * 8, 8);
        snprintf(out, len, "u:%" PRIu64, v);
        return;
    }
    uint32_t v;
    if ((size_t)(i + 1) * 4 > bytes) return;
    memcpy(&v, (const char *)data + i * 4, 4);
    snprintf(out, len, "u:%" PRIu32, v);
}

typedef struct ctl_tensor {
    nereid_datatype_t dt;
    const void *data;
    size_t bytes;
} ctl_tensor_t;

static void get_ctl(nereid_batch_t *batch, const char *name, ctl_tensor_t *t)
{
    memset(t, 0, sizeof *t);
    nereid_error_t *err = nereid_batch_input(batch, name, &t->dt, NULL, NULL, &t->data, &t->bytes);
    if (err) {
        nereid_error_free(err);
        t->data = NULL;
    }
}

static int64_t *entry_sum(acc_instance_t *a, const char *key, bool create)
{
    for (size_t i = 0; i < a->n_entries; i++)
        if (strcmp(a->entries[i].key, key) == 0) return &a->entries[i].sum;
    if (!create) return NULL;
    acc_entry_t *e = realloc(a->entries, (a->n_entries + 1) * sizeof *e);
    if (!e) return NULL;
    a->entries = e;
    e = &a->entries[a->n_entries++];
    snprintf(e->key, sizeof e->key, "%s", key);
    e->sum = 0;
    return &e->sum;
}

static void entry_remove(acc_instance_t *a, const char *key)
{
    for (size_t i = 0; i < a->n_entries; i++)
        if (strcmp(a->entries[i].key, key) == 0) {
            a->entries[i] = a->entries[--a->n_entries];
            return;
        }
}

static nereid_error_t *execute_controls(acc_instance_t *a, nereid_batch_t *batch)
{
    nereid_datatype_t dt;
    const int64_t *shape;
    size_t rank, bytes;
    const void *data;
    nereid_error_t *err = nereid_batch_input(batch, "INPUT", &dt, &shape, &rank, &data, &bytes);
    if (err) return err;
    int64_t rows = nereid_batch_size(batch);
    if (dt != NEREID_TYPE_INT32 || bytes != (size_t)rows * 4 || rank == 0)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "accumulator: INPUT must be int32 with one element per row");
    if (!a->by_corrid && (size_t)rows > a->n_slots)
        return nereid_error_new(NEREID_ERROR_INTERNAL, "accumulator: more rows than slots");
    /* shape points into the batch's tensor table, which later
     * nereid_batch_input calls may move: copy it first. */
    int64_t oshape[NEREID_MAX_RANK_ACC];
    if (rank > NEREID_MAX_RANK_ACC) rank = NEREID_MAX_RANK_ACC;
    memcpy(oshape, shape, rank * sizeof *shape);
    const void *in = data;
    ctl_tensor_t start, end, ready, corrid;
    get_ctl(batch, "START", &start);
    get_ctl(batch, "END", &end);
    get_ctl(batch, "READY", &ready);
    get_ctl(batch, "CORRID", &corrid);
    int32_t *out;
    err = nereid_batch_output(batch, "OUTPUT", NEREID_TYPE_INT32, oshape, rank, (size_t)rows * 4,
                              (void **)&out);
    if (err) return err;
    /* One sequence twice in a batch is a scheduler bug: fail loudly. */
    if (a->by_corrid) {
        for (int64_t i = 0; i < rows; i++) {
            char ki[160], kj[160];
            if (ready.data && ctl_value(ready.dt, ready.data, ready.bytes, i) == 0) continue;
            corrid_key(corrid.dt, corrid.data, corrid.bytes, i, ki, sizeof ki);
            for (int64_t j = i + 1; j < rows; j++) {
                corrid_key(corrid.dt, corrid.data, corrid.bytes, j, kj, sizeof kj);
                if (strcmp(ki, kj) == 0)
                    return nereid_error_new(NEREID_ERROR_INTERNAL,
                                            "accumulator: sequence %s twice in one batch", ki);
            }
        }
    }
    for (int64_t i = 0; i < rows; i++) {
        out[i] = 0;
        if (ready.data && ctl_value(ready.dt, ready.data, ready.bytes, i) == 0) continue;
        bool is_start = ctl_value(start.dt, start.data, start.bytes, i) != 0;
        bool is_end = ctl_value(end.dt, end.data, end.bytes, i) != 0;
        int64_t *sum;
        char key[160];
        if (a->by_corrid) {
            corrid_key(corrid.dt, corrid.data, corrid.bytes, i, key, sizeof key);
            sum = entry_sum(a, key, true);
            if (!sum) return nereid_error_new(NEREID_ERROR_INTERNAL, "accumulator: out of memory");
        } else {
            sum = &a->slot_sum[i];
        }
        if (is_start) *sum = 0;
        *sum += i32_at(in, (size_t)i);
        out[i] = (int32_t)*sum;
        if (is_end && a->by_corrid) entry_remove(a, key);
    }
    if (nereid_batch_output_requested(batch, "CONTROLS")) {
        int64_t cshape[2] = {rows, 4};
        size_t crank = 2;
        if (rank == 1) {
            cshape[0] = 4;
            crank = 1;
        }
        float *c;
        err = nereid_batch_output(batch, "CONTROLS", NEREID_TYPE_FP32, cshape, crank,
                                  (size_t)rows * 16, (void **)&c);
        if (err) return err;
        for (int64_t i = 0; i < rows; i++) {
            c[4 * i + 0] = (float)ctl_value(start.dt, start.data, start.bytes, i);
            c[4 * i + 1] = (float)ctl_value(end.dt, end.data, end.bytes, i);
            c[4 * i + 2] = (float)ctl_value(ready.dt, ready.data, ready.bytes, i);
            c[4 * i + 3] = (float)ctl_value(corrid.dt, corrid.data, corrid.bytes, i);
        }
    }
    if (nereid_batch_output_requested(batch, "BATCH")) {
        int32_t *b;
        err = nereid_batch_output(batch, "BATCH", NEREID_TYPE_INT32, oshape, rank, (size_t)rows * 4,
                                  (void **)&b);
        if (err) return err;
        for (int64_t i = 0; i < rows; i++)
            b[i] = (int32_t)rows;
    }
    return NULL;
}

/* State mode: each request on its own (state shapes may differ). */
static nereid_error_t *execute_state(acc_instance_t *a, nereid_batch_t *batch)
{
    size_t n = nereid_batch_request_count(batch);
    /* The scheduler must only batch states of one shape: check the gathered
     * tensor is consistent, as a batched backend would need. */
    nereid_datatype_t gdt;
    const int64_t *gshape;
    size_t grank, gbytes;
    const void *gdata;
    nereid_error_t *gerr =
        nereid_batch_input(batch, "INPUT_STATE", &gdt, &gshape, &grank, &gdata, &gbytes);
    if (gerr) return gerr;
    int64_t gcount = 1;
    for (size_t d = 0; d < grank; d++)
        gcount *= gshape[d];
    if (gdt == NEREID_TYPE_INT32 && (size_t)gcount * 4 != gbytes)
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "accumulator: batched INPUT_STATE of mixed shapes");
    for (size_t r = 0; r < n; r++) {
        nereid_datatype_t dt, sdt;
        const int64_t *shape, *sshape;
        size_t rank, srank, bytes, sbytes;
        const void *data, *sdata;
        ctl_tensor_t ready;
        memset(&ready, 0, sizeof ready);
        nereid_error_t *err = nereid_batch_request_input(batch, r, "READY", &ready.dt, NULL, NULL,
                                                         &ready.data, &ready.bytes);
        if (err) {
            nereid_error_free(err);
        } else if (ctl_value(ready.dt, ready.data, ready.bytes, 0) == 0) {
            continue; /* an empty slot */
        }
        err = nereid_batch_request_input(batch, r, "INPUT", &dt, &shape, &rank, &data, &bytes);
        if (!err)
            err = nereid_batch_request_input(batch, r, "INPUT_STATE", &sdt, &sshape, &srank, &sdata,
                                             &sbytes);
        if (err) {
            nereid_batch_set_request_error(batch, r, err);
            continue;
        }
        if (dt != NEREID_TYPE_INT32 || sdt != NEREID_TYPE_INT32 || rank == 0 || srank == 0 ||
            rank >= NEREID_MAX_RANK_ACC) {
            nereid_batch_set_request_error(
                batch, r,
                nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                 "accumulator: INPUT and INPUT_STATE must be int32 tensors"));
            continue;
        }
        size_t n_in = bytes / 4, n_st = sbytes / 4;
        const void *in = data, *st = sdata;
        int64_t oshape[NEREID_MAX_RANK_ACC];
        int32_t *out, *ost;
        if (!a->append) {
            if (n_st != n_in && n_st != 1) {
                nereid_batch_set_request_error(
                    batch, r,
                    nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                     "accumulator: state has %zu elements, input %zu", n_st, n_in));
                continue;
            }
            memcpy(oshape, shape, rank * sizeof *shape);
            err = nereid_batch_request_output(batch, r, "OUTPUT", NEREID_TYPE_INT32, oshape, rank,
                                              n_in * 4, (void **)&out);
            if (!err)
                err = nereid_batch_request_output(batch, r, "OUTPUT_STATE", NEREID_TYPE_INT32,
                                                  oshape, rank, n_in * 4, (void **)&ost);
            if (err) {
                nereid_batch_set_request_error(batch, r, err);
                continue;
            }
            for (size_t i = 0; i < n_in; i++) {
                out[i] = i32_at(in, i) + i32_at(st, n_st == 1 ? 0 : i);
                ost[i] = out[i];
            }
            continue;
        }
        /* append: state [.., n_st] ++ input -> [.., n_st + n_in]; OUTPUT [.., 1] */
        memcpy(oshape, sshape, srank * sizeof *sshape);
        oshape[srank - 1] = (int64_t)(n_st + n_in);
        err = nereid_batch_request_output(batch, r, "OUTPUT_STATE", NEREID_TYPE_INT32, oshape,
                                          srank, (n_st + n_in) * 4, (void **)&ost);
        if (err) {
            nereid_batch_set_request_error(batch, r, err);
            continue;
        }
        int64_t total = 0;
        for (size_t i = 0; i < n_st; i++)
            total += (ost[i] = i32_at(st, i));
        for (size_t i = 0; i < n_in; i++)
            total += (ost[n_st + i] = i32_at(in, i));
        memcpy(oshape, shape, rank * sizeof *shape);
        oshape[rank - 1] = 1;
        err = nereid_batch_request_output(batch, r, "OUTPUT", NEREID_TYPE_INT32, oshape, rank, 4,
                                          (void **)&out);
        if (err) {
            nereid_batch_set_request_error(batch, r, err);
            continue;
        }
        out[0] = (int32_t)total;
    }
    return NULL;
}

NEREID_EXPORT nereid_error_t *nereid_backend_execute(nereid_instance_t *instance,
                                                     nereid_batch_t *batch)
{
    acc_instance_t *a = nereid_instance_state(instance);
    if (a->delay_ms > 0) {
        struct timespec ts = {a->delay_ms / 1000, (a->delay_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    return a->state_mode ? execute_state(a, batch) : execute_controls(a, batch);
}
