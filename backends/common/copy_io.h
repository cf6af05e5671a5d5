/*
 * This file contains the copy loops shared by the identity and testing
 * backends: output i becomes a copy of input i (by config position), for
 * every requested output; over the whole batch (testing) or request by
 * request (identity, like Triton's). Backends are separate modules, so it is a header.
 */
#ifndef NEREID_BACKENDS_COPY_IO_H
#define NEREID_BACKENDS_COPY_IO_H

#include <string.h>

#include "nereid/backend.h"

/* Copies input i to output i for i below min(#inputs, #outputs), skipping
 * outputs the batch did not request; returns the first error. */
static inline nereid_error_t *copy_inputs_to_outputs(const nereid_model_t *model,
                                                     nereid_batch_t *batch)
{
    size_t n = nereid_model_input_count(model);
    if (nereid_model_output_count(model) < n) n = nereid_model_output_count(model);
    for (size_t i = 0; i < n; i++) {
        const char *in_name, *out_name;
        nereid_model_input(model, i, &in_name, NULL, NULL, NULL);
        nereid_model_output(model, i, &out_name, NULL, NULL, NULL);
        if (!nereid_batch_output_requested(batch, out_name)) continue;
        nereid_datatype_t dt;
        const int64_t *shape;
        size_t rank, size;
        const void *data;
        void *out;
        nereid_error_t *err = nereid_batch_input(batch, in_name, &dt, &shape, &rank, &data, &size);
        if (!err) err = nereid_batch_output(batch, out_name, dt, shape, rank, size, &out);
        if (err) return err;
        if (size) memcpy(out, data, size);
    }
    return NULL;
}

/* The same, request by request, as Triton's identity backend does: each
 * request's outputs have its own input shapes, so inputs marked
 * allow_ragged_batch (which the core gathers flat) come back per request. */
static inline nereid_error_t *copy_inputs_to_outputs_per_request(const nereid_model_t *model,
                                                                 nereid_batch_t *batch)
{
    size_t n = nereid_model_input_count(model);
    if (nereid_model_output_count(model) < n) n = nereid_model_output_count(model);
    for (size_t i = 0; i < n; i++) {
        const char *in_name, *out_name;
        nereid_model_input(model, i, &in_name, NULL, NULL, NULL);
        nereid_model_output(model, i, &out_name, NULL, NULL, NULL);
        if (!nereid_batch_output_requested(batch, out_name)) continue;
        for (size_t r = 0; r < nereid_batch_request_count(batch); r++) {
            nereid_datatype_t dt;
            const int64_t *shape;
            size_t rank, size;
            const void *data;
            void *out;
            nereid_error_t *err =
                nereid_batch_request_input(batch, r, in_name, &dt, &shape, &rank, &data, &size);
            if (!err)
                err = nereid_batch_request_output(batch, r, out_name, dt, shape, rank, size, &out);
            if (err) return err;
            if (size) memcpy(out, data, size);
        }
    }
    return NULL;
}

#endif
