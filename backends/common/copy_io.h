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

#define COPY_IO_MAX_RANK 16 /* the core's limit on a tensor's rank */

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

/* Request r lacks optional input i but asks for output i: Triton's identity
 * backend answers zeros shaped like the input's config dims (-1 as 1),
 * behind the request's batch size for a batching model. */
static inline nereid_error_t *zeros_for_missing(const nereid_model_t *model, nereid_batch_t *batch,
                                                size_t r, size_t i, const char *out)
{
    nereid_datatype_t dt;
    const int64_t *dims;
    size_t rank;
    nereid_model_input(model, i, NULL, &dt, &dims, &rank);
    int64_t shape[COPY_IO_MAX_RANK];
    size_t n = 0;
    if (nereid_model_max_batch_size(model) > 0) {
        int64_t batch_size = 1;
        for (size_t k = 0; k < nereid_model_input_count(model); k++) {
            const char *name;
            const int64_t *s;
            size_t sr;
            nereid_model_input(model, k, &name, NULL, NULL, NULL);
            nereid_error_t *e =
                nereid_batch_request_input(batch, r, name, NULL, &s, &sr, NULL, NULL);
            if (!e && sr > 0) {
                batch_size = s[0];
                break;
            }
            nereid_error_free(e);
        }
        shape[n++] = batch_size;
    }
    size_t count = 1;
    for (size_t d = 0; d < rank && n < COPY_IO_MAX_RANK; d++) {
        shape[n] = dims[d] < 0 ? 1 : dims[d];
        count *= (size_t)shape[n++];
    }
    if (n > 0 && nereid_model_max_batch_size(model) > 0) count *= (size_t)shape[0];
    size_t size = count * nereid_datatype_byte_size(dt);
    void *buf;
    nereid_error_t *err = nereid_batch_request_output(batch, r, out, dt, shape, n, size, &buf);
    if (!err && size) memset(buf, 0, size);
    return err;
}

/* Copies input i to output i for i below min(#inputs, #outputs), skipping
 * outputs the batch did not request; returns the first error. Per request,
 * a missing (optional) input gives a zero output. */
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
            nereid_error_t *err;
            if (per_request && (err = nereid_batch_request_input(batch, r, in_name, NULL, NULL,
                                                                 NULL, NULL, NULL))) {
                nereid_error_free(err);
                err = zeros_for_missing(model, batch, r, i, out_name);
            } else {
                err = copy_one(batch, per_request, r, in_name, out_name);
            }
            if (err) return err;
        }
    }
    return NULL;
}

#endif
