/*
 * This file contains the copy loop shared by the identity and testing
 * backends: output i becomes a copy of input i (by config position), for
 * every requested output, over the whole batch (testing) or request by
 * request (identity, like Triton's identity backend: each request gets its
 * own input shapes back, so inputs marked allow_ragged_batch, which the core
 * gathers flat, need no batch_output). Backends are separate modules, so it
 * is a header.
 */
#ifndef NEREID_BACKENDS_COPY_IO_H
#define NEREID_BACKENDS_COPY_IO_H

#include <string.h>

#include "nereid/backend.h"

/* Copies input `in` to output `out` for the whole batch, or for request r
 * when per_request. */
static inline nereid_error_t *copy_one(nereid_batch_t *batch, bool per_request, size_t r,
                                       const char *in, const char *out)
{
    nereid_datatype_t dt;
    const int64_t *shape;
    size_t rank, size;
    const void *data;
    void *buf;
    nereid_error_t *err =
        per_request ? nereid_batch_request_input(batch, r, in, &dt, &shape, &rank, &data, &size)
                    : nereid_batch_input(batch, in, &dt, &shape, &rank, &data, &size);
    if (!err)
        err = per_request ? nereid_batch_request_output(batch, r, out, dt, shape, rank, size, &buf)
                          : nereid_batch_output(batch, out, dt, shape, rank, size, &buf);
    if (!err && size) memcpy(buf, data, size);
    return err;
}

/* Copies input i to output i for i below min(#inputs, #outputs), skipping
 * outputs the batch did not request; returns the first error. */
static inline nereid_error_t *copy_inputs_to_outputs(const nereid_model_t *model,
                                                     nereid_batch_t *batch, bool per_request)
{
    size_t n = nereid_model_input_count(model);
    if (nereid_model_output_count(model) < n) n = nereid_model_output_count(model);
    for (size_t i = 0; i < n; i++) {
        const char *in_name, *out_name;
        nereid_model_input(model, i, &in_name, NULL, NULL, NULL);
        nereid_model_output(model, i, &out_name, NULL, NULL, NULL);
        if (!nereid_batch_output_requested(batch, out_name)) continue;
        size_t reqs = per_request ? nereid_batch_request_count(batch) : 1;
        for (size_t r = 0; r < reqs; r++) {
            nereid_error_t *err = copy_one(batch, per_request, r, in_name, out_name);
            if (err) return err;
        }
    }
    return NULL;
}

#endif
