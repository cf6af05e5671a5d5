/*
 * This file contains request validation against the model config, with
 * Triton's error texts: input names and count, datatypes, shapes (batch
 * dimension, reshape), byte sizes and BYTES elements, batch size.
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
#include "core/request_internal.h"

/* ---- Validation ---- */

static void format_dims(char *buf, size_t cap, const int64_t *dims, size_t rank, bool batch)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    if (batch && n < cap) n += (size_t)snprintf(buf + n, cap - n, rank ? "-1," : "-1");
    for (size_t i = 0; i < rank && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ",%" PRId64 : "%" PRId64, dims[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static nereid_error_t *input_count_error(nereid_request_t *req, model_t *m)
{
    size_t required = 0;
    for (size_t i = 0; i < m->n_inputs; i++)
        required += !m->inputs[i].optional;
    char got[1024] = "", missing[1024] = "";
    size_t g = 0, mi = 0;
    for (size_t i = 0; i < req->n_inputs && g < sizeof got; i++)
        g += (size_t)snprintf(got + g, sizeof got - g, "%s'%s'", i ? "," : "", req->inputs[i].name);
    for (size_t i = 0; i < m->n_inputs && mi < sizeof missing; i++) {
        if (m->inputs[i].optional || request_find_input(req, m->inputs[i].name)) continue;
        mi += (size_t)snprintf(missing + mi, sizeof missing - mi, "%s'%s'", mi ? "," : "",
                               m->inputs[i].name);
    }
    if (required == m->n_inputs)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "[request id: %s] expected %zu inputs but got %zu inputs for model "
                                "'%s'. Got input(s) [%s], but missing required input(s) [%s]. "
                                "Please provide all required input(s).",
                                req_id(req), m->n_inputs, req->n_inputs, m->name, got, missing);
    return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                            "[request id: %s] expected number of inputs between %zu and %zu but "
                            "got %zu inputs for model '%s'. Got input(s) [%s], but missing "
                            "required input(s) [%s]. Please provide all required input(s).",
                            req_id(req), required, m->n_inputs, req->n_inputs, m->name, got,
                            missing);
}

static bool dims_match(const int64_t *want, size_t want_rank, const int64_t *got, size_t got_rank)
{
    if (want_rank != got_rank) return false;
    for (size_t i = 0; i < want_rank; i++)
        if (want[i] != -1 && want[i] != got[i]) return false;
    return true;
}

/* Checks a BYTES input holds exactly n length-prefixed elements, with
 * Triton's texts (InferenceRequest::ValidateBytesInputs); unlike Triton, a
 * last element cut short is an error too. */
static nereid_error_t *check_bytes_elements(const req_input_t *in, int64_t n, const model_t *m,
                                            const char *rid)
{
    const uint8_t *p = in->data;
    size_t size = in->byte_size, off = 0;
    int64_t seen = 0;
    while (off < size) {
        if (size - off < 4)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "[request id: %s] incomplete string length indicator for "
                                    "inference input '%s' for model '%s', expecting 4 bytes but "
                                    "only %zu bytes available. Please make sure the string length "
                                    "indicator is in one buffer.",
                                    rid, in->name, m->name, size - off);
        uint32_t len;
        memcpy(&len, p + off, 4);
        off += 4;
        if (++seen > n)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "[request id: %s] unexpected number of string elements %" PRId64
                                    " for inference input '%s' for model '%s', expecting %" PRId64,
                                    rid, seen, in->name, m->name, n);
        if (size - off < len)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "[request id: %s] incomplete string element %" PRId64
                                    " for inference input '%s' for model '%s': %" PRIu32
                                    " bytes announced, %zu available",
                                    rid, seen, in->name, m->name, len, size - off);
        off += len;
    }
    if (seen != n)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "[request id: %s] expected %" PRId64
                                " string elements for inference input '%s' for model '%s', got "
                                "%" PRId64,
                                rid, n, in->name, m->name, seen);
    return NULL;
}

static nereid_error_t *validate_inputs(nereid_request_t *req, model_t *m,
                                       const model_io_t *const *ios, const char *rid);

nereid_error_t *request_validate(nereid_request_t *req, model_t *m)
{
    const char *rid = req_id(req);
    /* Triton's Normalize checks the requested outputs before the inputs
     * (L0_output_name sends a wrong input name and a wrong output name). */
    for (size_t i = 0; i < req->n_out_names; i++)
        if (!find_io(m->outputs, m->n_outputs, req->out_names[i]))
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "unexpected inference output '%s' for model '%s'",
                                    req->out_names[i], m->name);
    size_t required = 0, required_given = 0;
    for (size_t i = 0; i < m->n_inputs; i++)
        required += !m->inputs[i].optional;
    /* Input names are unique in a request (add_input refuses duplicates), so
     * every required input is present when as many were matched. */
    const model_io_t *ios_small[8];
    const model_io_t **ios = req->n_inputs <= 8 ? ios_small : xmalloc(req->n_inputs * sizeof *ios);
    nereid_error_t *err = NULL;
    for (size_t i = 0; i < req->n_inputs && !err; i++) {
        /* Requests usually list inputs in config order: try that slot first. */
        const char *name = req->inputs[i].name;
        ios[i] = i < m->n_inputs && strcmp(m->inputs[i].name, name) == 0
                     ? &m->inputs[i]
                     : find_io(m->inputs, m->n_inputs, name);
        if (!ios[i])
            err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                   "unexpected inference input '%s' for model '%s'", name, m->name);
        else
            required_given += !ios[i]->optional;
    }
    if (!err &&
        (req->n_inputs < required || req->n_inputs > m->n_inputs || required_given != required))
        err = input_count_error(req, m);
    if (!err) err = validate_inputs(req, m, ios, rid);
    if (ios != ios_small) free(ios);
    return err;
}

static nereid_error_t *validate_inputs(nereid_request_t *req, model_t *m,
                                       const model_io_t *const *ios, const char *rid)
{
    bool batching = m->max_batch_size > 0;
    int64_t batch = -1;
    for (size_t i = 0; i < req->n_inputs; i++) {
        req_input_t *in = &req->inputs[i];
        const model_io_t *io = ios[i];
        char want[512], got[512];
        if (in->datatype != io->datatype)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "[request id: %s] inference input '%s' data-type is '%s', but "
                                    "model '%s' expects '%s'",
                                    rid, in->name, nereid_datatype_name(in->datatype), m->name,
                                    nereid_datatype_name(io->datatype));
        for (size_t d = 0; d < in->rank; d++)
            if (in->shape[d] < 0) {
                format_dims(got, sizeof got, in->shape, in->rank, false);
                return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                        "[request id: %s] All input dimensions should be specified "
                                        "for input '%s' for model '%s', got %s",
                                        rid, in->name, m->name, got);
            }
        const int64_t *dims = in->shape;
        size_t rank = in->rank;
        if (batching) {
            if (rank == 0)
                return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                        "[request id: %s] input '%s' has no shape but model "
                                        "requires batch dimension for '%s'",
                                        rid, in->name, m->name);
            if (batch < 0)
                batch = in->shape[0];
            else if (batch != in->shape[0])
                return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                        "[request id: %s] input '%s' batch size does not match "
                                        "other inputs for '%s'",
                                        rid, in->name, m->name);
            dims++;
            rank--;
        }
        if (!dims_match(io->dims, io->rank, dims, rank)) {
            format_dims(want, sizeof want, io->dims, io->rank, batching);
            format_dims(got, sizeof got, in->shape, in->rank, false);
            return nereid_error_new(
                NEREID_ERROR_INVALID_ARG,
                "[request id: %s] unexpected shape for input '%s' for model '%s'. Expected %s, got "
                "%s. %s",
                rid, in->name, m->name, want, got,
                batching ? "NOTE: Setting a non-zero max_batch_size in the model config requires "
                           "a batch dimension to be prepended to each input shape. If you want to "
                           "specify the full shape including the batch dim in your input dims "
                           "config, try setting max_batch_size to zero. See the model "
                           "configuration docs for more info on max_batch_size."
                         : "");
        }
        int64_t count = 1;
        for (size_t d = 0; d < in->rank; d++) {
            if (in->shape[d] != 0 && count > INT64_MAX / in->shape[d])
                return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                        "[request id: %s] input '%s' shape is too large", rid,
                                        in->name);
            count *= in->shape[d];
        }
        size_t esize = nereid_datatype_byte_size(in->datatype);
        if (esize && count > INT64_MAX / (int64_t)esize)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "[request id: %s] input '%s' shape is too large", rid,
                                    in->name);
        if (esize) {
            if ((size_t)count * esize != in->byte_size)
                return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                        "[request id: %s] input byte size mismatch for input '%s' "
                                        "for model '%s'. Expected %" PRId64 ", got %zu",
                                        rid, in->name, m->name, count * (int64_t)esize,
                                        in->byte_size);
        }
        if (io->has_reshape) {
            /* The backend sees the reshape dims; a -1 takes the remaining count. */
            int64_t per_item = count / (batching && in->shape[0] ? in->shape[0] : 1);
            int64_t known = 1;
            int var = -1;
            for (size_t d = 0; d < io->reshape_rank; d++) {
                if (io->reshape[d] == -1)
                    var = (int)d;
                else
                    known *= io->reshape[d];
            }
            size_t r = 0;
            int64_t newshape[NEREID_MAX_RANK];
            if (batching) newshape[r++] = in->shape[0];
            for (size_t d = 0; d < io->reshape_rank && r < NEREID_MAX_RANK; d++)
                newshape[r++] = (int)d == var ? (known ? per_item / known : 0) : io->reshape[d];
            memcpy(in->shape, newshape, r * sizeof *newshape);
            in->rank = r;
        }
    }
    /* BYTES contents last, from the last input back: Triton keeps inputs in
     * a hash map that visits a few names newest first, and its QA
     * (L0_input_validation) names the second of two bad inputs. */
    for (size_t i = req->n_inputs; i-- > 0;) {
        const req_input_t *in = &req->inputs[i];
        if (nereid_datatype_byte_size(in->datatype) != 0) continue;
        int64_t count = 1; /* no overflow: checked above (a reshape keeps the count) */
        for (size_t d = 0; d < in->rank; d++)
            count *= in->shape[d];
        nereid_error_t *err = check_bytes_elements(in, count, m, rid);
        if (err) return err;
    }
    if (batching) {
        if (batch < 0) batch = 1; /* only optional inputs absent: treat as 1 */
        if (batch > m->max_batch_size)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "[request id: %s] inference request batch-size must be <= "
                                    "%" PRId64 " for '%s'",
                                    rid, m->max_batch_size, m->name);
        req->batch_size = batch;
    } else {
        req->batch_size = 1;
    }
    return NULL;
}
