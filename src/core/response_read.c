/*
 * This file contains what a frontend reads from a response (server.h):
 * error, id, model, outputs, and the classification extension (top-k
 * labels of an output).
 */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/core.h"
#include "core/trace.h"
#include "core/decoupled.h"
#include "core/util.h"

/* ---- Response accessors ---- */

const nereid_error_t *nereid_response_error(const nereid_response_t *resp)
{
    return resp->error;
}

const char *nereid_response_id(const nereid_response_t *resp)
{
    return resp->id ? resp->id : "";
}

const char *nereid_response_model_name(const nereid_response_t *resp)
{
    return resp->model_name;
}

int64_t nereid_response_model_version(const nereid_response_t *resp)
{
    return resp->model_version;
}

size_t nereid_response_output_count(const nereid_response_t *resp)
{
    return resp->n_outputs;
}

void nereid_response_output(const nereid_response_t *resp, size_t index, const char **name,
                            nereid_datatype_t *datatype, const int64_t **shape, size_t *rank,
                            const void **data, size_t *byte_size, void **buffer_userp)
{
    const resp_output_t *o = &resp->outputs[index];
    if (name) *name = o->name;
    if (datatype) *datatype = o->datatype;
    if (shape) *shape = o->shape;
    if (rank) *rank = o->rank;
    if (data) *data = o->data;
    if (byte_size) *byte_size = o->byte_size;
    if (buffer_userp) *buffer_userp = o->view_release ? NULL : o->buffer_userp;
}

uint32_t nereid_response_output_class_count(const nereid_response_t *resp, size_t index)
{
    return index < resp->n_outputs ? resp->outputs[index].class_count : 0;
}

/* ---- Classification ---- */

typedef struct class_entry {
    double value;
    size_t index;
    bool is_int;
    int64_t ivalue;
    uint64_t uvalue;
    bool is_unsigned;
} class_entry_t;

static int cmp_class(const void *a, const void *b)
{
    const class_entry_t *x = a, *y = b;
    if (x->value > y->value) return -1;
    if (x->value < y->value) return 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

static bool read_element(nereid_datatype_t dt, const void *data, size_t i, class_entry_t *e)
{
    const uint8_t *p = data;
    e->is_int = true;
    e->is_unsigned = false;
    switch (dt) {
#define INT_CASE(T, ctype, uns)                                                                    \
    case NEREID_TYPE_##T: {                                                                        \
        ctype v;                                                                                   \
        memcpy(&v, p + i * sizeof v, sizeof v);                                                    \
        e->value = (double)v;                                                                      \
        e->is_unsigned = uns;                                                                      \
        if (uns)                                                                                   \
            e->uvalue = (uint64_t)v;                                                               \
        else                                                                                       \
            e->ivalue = (int64_t)v;                                                                \
        return true;                                                                               \
    }
        INT_CASE(UINT8, uint8_t, true)
        INT_CASE(UINT16, uint16_t, true)
        INT_CASE(UINT32, uint32_t, true)
        INT_CASE(UINT64, uint64_t, true)
        INT_CASE(INT8, int8_t, false)
        INT_CASE(INT16, int16_t, false)
        INT_CASE(INT32, int32_t, false)
        INT_CASE(INT64, int64_t, false)
#undef INT_CASE
    case NEREID_TYPE_FP32: {
        float v;
        memcpy(&v, p + i * 4, 4);
        e->value = v;
        e->is_int = false;
        return true;
    }
    case NEREID_TYPE_FP64: {
        double v;
        memcpy(&v, p + i * 8, 8);
        e->value = v;
        e->is_int = false;
        return true;
    }
    default:
        return false;
    }
}

/* The most elements of one batch item that classification ranks. */
#define CLASSIFY_MAX_ELEMENTS 1000000

nereid_error_t *nereid_response_classify(const nereid_response_t *resp, size_t index, uint32_t k,
                                         char **bytes_out, size_t *byte_size_out,
                                         int64_t *shape_out, size_t *rank_out)
{
    *bytes_out = NULL;
    *byte_size_out = 0;
    *rank_out = 0;
    const resp_output_t *o = &resp->outputs[index];
    class_entry_t probe;
    if (!read_element(o->datatype, &(uint64_t){0}, 0, &probe))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "class result not available for output due to unsupported type "
                                "'%s'",
                                nereid_datatype_name(o->datatype));
    bool batching = resp->model && resp->model->max_batch_size > 0 && o->rank > 0;
    size_t esize = nereid_datatype_byte_size(o->datatype);
    size_t total = o->byte_size / esize;
    size_t n_batch = batching ? (size_t)o->shape[0] : 1;
    size_t per = n_batch ? total / n_batch : 0;
    /* Triton bounds the elements ranked per batch item (1,000,000). */
    if (per > CLASSIFY_MAX_ELEMENTS)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "classification output tensor too large");
    size_t kk = k < per ? k : per;
    class_entry_t *entries = xmalloc((per ? per : 1) * sizeof *entries);
    size_t cap = 256, len = 0;
    char *out = xmalloc(cap);
    const model_io_t *io = o->io;
    for (size_t b = 0; b < n_batch; b++) {
        for (size_t i = 0; i < per; i++) {
            read_element(o->datatype, o->data, b * per + i, &entries[i]);
            entries[i].index = i;
        }
        qsort(entries, per, sizeof *entries, cmp_class);
        for (size_t i = 0; i < kk; i++) {
            char val[64], item[1024];
            const class_entry_t *e = &entries[i];
            if (e->is_int && e->is_unsigned)
                snprintf(val, sizeof val, "%" PRIu64, e->uvalue);
            else if (e->is_int)
                snprintf(val, sizeof val, "%" PRId64, e->ivalue);
            else
                snprintf(val, sizeof val, "%f", e->value);
            int n;
            if (io && io->labels && e->index < io->n_labels)
                n = snprintf(item, sizeof item, "%s:%zu:%s", val, e->index, io->labels[e->index]);
            else
                n = snprintf(item, sizeof item, "%s:%zu", val, e->index);
            uint32_t l = (uint32_t)((size_t)n < sizeof item ? (size_t)n : sizeof item - 1);
            while (len + 4 + l > cap)
                cap *= 2;
            out = xrealloc(out, cap);
            memcpy(out + len, &l, 4);
            memcpy(out + len + 4, item, l);
            len += 4 + l;
        }
    }
    free(entries);
    if (batching) {
        shape_out[0] = (int64_t)n_batch;
        shape_out[1] = (int64_t)kk;
        *rank_out = 2;
    } else {
        shape_out[0] = (int64_t)kk;
        *rank_out = 1;
    }
    *bytes_out = out;
    *byte_size_out = len;
    return NULL;
}
