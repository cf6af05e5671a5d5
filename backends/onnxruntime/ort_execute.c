/*
 * This file contains the onnxruntime backend's execute: a batch's inputs
 * wrapped around the core's buffers (STRING tensors built), outputs bound
 * or copied back, one Run per batch.
 */
#include "onnxruntime.h"

/* ---- execute -------------------------------------------------------------- */

/* Builds a STRING tensor from a BYTES buffer (4-byte LE length per element).
 * Each element is copied with its length (GetResizedStringTensorElementBuffer),
 * so elements holding NUL bytes arrive whole; FillStringTensor would stop at
 * the first NUL. */
static nereid_error_t *string_input(ort_instance_t *s, const char *name, const int64_t *shape,
                                    size_t rank, const uint8_t *data, size_t byte_size,
                                    OrtValue **out)
{
    const ort_api_t *api = &s->model->backend->api;
    size_t count = 1;
    for (size_t i = 0; i < rank; i++)
        count *= (size_t)(shape[i] < 0 ? 0 : shape[i]);
    size_t pos = 0;
    for (size_t i = 0; i < count; i++) {
        uint32_t len;
        if (byte_size - pos < 4) goto malformed;
        memcpy(&len, data + pos, 4); /* little-endian hosts only (x86_64, aarch64) */
        pos += 4;
        if (byte_size - pos < len) goto malformed;
        pos += len;
    }
    if (pos != byte_size) goto malformed;
    ORT_TRY(api, api->CreateTensorAsOrtValue(s->model->backend->allocator, shape, rank,
                                             ORT_ELEM_STRING, out));
    pos = 0;
    for (size_t i = 0; i < count; i++) {
        uint32_t len;
        memcpy(&len, data + pos, 4);
        pos += 4;
        char *dst = NULL;
        nereid_error_t *err =
            ort_error(api, api->GetResizedStringTensorElementBuffer(*out, i, len, &dst));
        if (err) {
            api->ReleaseValue(*out);
            *out = NULL;
            return err;
        }
        if (len > 0) memcpy(dst, data + pos, len);
        pos += len;
    }
    return NULL;
malformed:
    return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                            "input '%s': malformed BYTES data for %zu elements in %zu bytes", name,
                            count, byte_size);
}

/* Copies ORT's STRING output into the core's buffer, length-prefixed. */
static nereid_error_t *string_output(ort_instance_t *s, nereid_batch_t *batch, const char *name,
                                     OrtValue *value, const int64_t *shape, size_t rank,
                                     size_t count)
{
    const ort_api_t *api = &s->model->backend->api;
    size_t data_len = 0;
    ORT_TRY(api, api->GetStringTensorDataLength(value, &data_len));
    char *strings = grow(s->strings, &s->strings_cap, data_len + 1, 1);
    size_t *offsets = grow(s->offsets, &s->offsets_cap, count + 1, sizeof(size_t));
    if (strings) s->strings = strings;
    if (offsets) s->offsets = offsets;
    if (!strings || !offsets) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    if (count > 0)
        ORT_TRY(api, api->GetStringTensorContent(value, strings, data_len, offsets, count));
    void *buf = NULL;
    nereid_error_t *err = nereid_batch_output(batch, name, NEREID_TYPE_BYTES, shape, rank,
                                              data_len + 4 * count, &buf);
    if (err) return err;
    uint8_t *p = buf;
    for (size_t i = 0; i < count; i++) {
        size_t end = i + 1 < count ? offsets[i + 1] : data_len;
        uint32_t len = (uint32_t)(end - offsets[i]);
        memcpy(p, &len, 4);
        memcpy(p + 4, strings + offsets[i], len);
        p += 4 + len;
    }
    return NULL;
}

/* Copies an ORT-allocated output into the core's buffer. */
static nereid_error_t *read_output(ort_instance_t *s, nereid_batch_t *batch, const ort_output_t *o,
                                   OrtValue *value)
{
    const ort_api_t *api = &s->model->backend->api;
    OrtTensorTypeAndShapeInfo *info = NULL;
    ORT_TRY(api, api->GetTensorTypeAndShape(value, &info));
    int elem = 0;
    size_t rank = 0, count = 0;
    int64_t shape[64];
    nereid_error_t *err = ort_error(api, api->GetTensorElementType(info, &elem));
    if (!err) err = ort_error(api, api->GetDimensionsCount(info, &rank));
    if (!err && rank > 64)
        err = nereid_error_new(NEREID_ERROR_UNSUPPORTED, "output '%s' has rank %zu", o->name, rank);
    if (!err) err = ort_error(api, api->GetDimensions(info, shape, rank));
    if (!err) err = ort_error(api, api->GetTensorShapeElementCount(info, &count));
    api->ReleaseTensorTypeAndShapeInfo(info);
    if (err) return err;
    if (elem != o->elem_type)
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "output '%s': model produced %s, configuration expects %s", o->name,
                                config_type_name(elem), config_type_name(o->elem_type));
    const int64_t *out_shape = shape;
    if (rank == 0) { /* scalar model output: report the config's dims ([1]) */
        out_shape = o->config_dims;
        rank = o->config_rank;
    }
    if (elem == ORT_ELEM_STRING)
        return string_output(s, batch, o->name, value, out_shape, rank, count);
    size_t byte_size = count * nereid_datatype_byte_size(o->datatype);
    void *src = NULL, *dst = NULL;
    ORT_TRY(api, api->GetTensorMutableData(value, &src));
    err = nereid_batch_output(batch, o->name, o->datatype, out_shape, rank, byte_size, &dst);
    if (err) return err;
    if (byte_size) memcpy(dst, src, byte_size);
    return NULL;
}

static void release_values(const ort_api_t *api, OrtValue **v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (v[i]) api->ReleaseValue(v[i]);
        v[i] = NULL;
    }
}

static const uint8_t empty_buffer[8];

/* Runs the session; outputs with a known shape are bound to the core's
 * buffers first (unless bind is false). */
static nereid_error_t *run(ort_instance_t *s, nereid_batch_t *batch, size_t n_in, size_t n_out,
                           bool bind)
{
    ort_model_t *m = s->model;
    const ort_backend_t *b = m->backend;
    const ort_api_t *api = &b->api;
    int64_t batch_size = nereid_batch_size(batch);
    for (size_t k = 0; k < n_out; k++) {
        const ort_output_t *o = &m->outputs[s->out_index[k]];
        s->out_bound[k] = false;
        if (!bind || !o->shape_known) continue;
        int64_t shape[64];
        size_t rank = o->rank < 64 ? o->rank : 64;
        size_t count = 1;
        for (size_t d = 0; d < rank; d++) {
            shape[d] = (d == 0 && m->max_batch_size > 0) ? batch_size : o->dims[d];
            count *= (size_t)shape[d];
        }
        size_t byte_size = count * nereid_datatype_byte_size(o->datatype);
        void *buf = NULL;
        nereid_error_t *err =
            nereid_batch_output(batch, o->name, o->datatype, shape, rank, byte_size, &buf);
        if (err) return err;
        ORT_TRY(api, api->CreateTensorWithDataAsOrtValue(
                         b->cpu_info, buf ? buf : (void *)empty_buffer, byte_size, shape, rank,
                         o->elem_type, &s->out_values[k]));
        s->out_bound[k] = true;
    }
    return ort_error(api,
                     api->Run(s->session, NULL, s->in_names, (const OrtValue *const *)s->in_values,
                              n_in, s->out_names, n_out, s->out_values));
}

static bool batch_request_has_input(nereid_batch_t *batch, const char *name)
{
    nereid_error_t *err = nereid_batch_request_input(batch, 0, name, NULL, NULL, NULL, NULL, NULL);
    bool found = err == NULL;
    nereid_error_free(err);
    return found;
}

NEREID_EXPORT nereid_error_t *nereid_backend_execute(nereid_instance_t *instance,
                                                     nereid_batch_t *batch)
{
    ort_instance_t *s = nereid_instance_state(instance);
    ort_model_t *m = s->model;
    const ort_backend_t *b = m->backend;
    const ort_api_t *api = &b->api;
    nereid_error_t *err = NULL;
    size_t n_out = 0;

    size_t n_in = 0; /* inputs fed: an optional input the requests lack is left out */
    for (size_t i = 0; i < m->n_inputs && !err; i++) {
        nereid_datatype_t dt;
        const int64_t *shape;
        size_t rank, byte_size;
        const void *data;
        /* An optional config input the requests lack (the core batches only
         * requests with the same inputs); injected inputs are always there. */
        if (i < m->n_cfg_inputs && nereid_batch_request_count(batch) > 0 &&
            !batch_request_has_input(batch, m->input_names[i]))
            continue;
        err = nereid_batch_input(batch, m->input_names[i], &dt, &shape, &rank, &data, &byte_size);
        if (err) break;
        s->in_names[n_in] = m->input_names[i];
        if (dt == NEREID_TYPE_BYTES) {
            err = string_input(s, m->input_names[i], shape, rank, data, byte_size,
                               &s->in_values[n_in]);
        } else {
            err = ort_error(api,
                            api->CreateTensorWithDataAsOrtValue(
                                b->cpu_info, data ? (void *)data : (void *)empty_buffer, byte_size,
                                shape, rank, m->input_elem_types[i], &s->in_values[n_in]));
        }
        n_in++;
    }
    if (err) goto done;
    uint64_t input_end_ns = nereid_now_ns();

    for (size_t o = 0; o < m->n_outputs; o++) {
        if (!nereid_batch_output_requested(batch, m->outputs[o].name)) continue;
        s->out_names[n_out] = m->outputs[o].name;
        s->out_index[n_out++] = o;
    }
    if (n_out == 0) { /* nothing requested: still run (statistics, side effects) */
        for (size_t o = 0; o < m->n_outputs; o++) {
            s->out_names[n_out] = m->outputs[o].name;
            s->out_index[n_out++] = o;
        }
    }
    err = run(s, batch, n_in, n_out, !s->no_prebind);
    if (err) {
        /* A bound output whose real shape differs from the model's declared
         * one fails the run; later runs let ORT allocate such outputs. */
        for (size_t k = 0; k < n_out; k++)
            if (s->out_bound[k]) s->no_prebind = true;
    }
    if (err) goto done;
    uint64_t infer_end_ns = nereid_now_ns();

    for (size_t k = 0; k < n_out && !err; k++)
        if (!s->out_bound[k])
            err = read_output(s, batch, &m->outputs[s->out_index[k]], s->out_values[k]);
    if (!err) nereid_batch_report_compute(batch, input_end_ns, infer_end_ns);
done:
    release_values(api, s->in_values, m->n_inputs);
    release_values(api, s->out_values, n_out);
    return err;
}
