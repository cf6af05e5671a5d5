/*
 * This file contains the inference request parser: JSON header with jansson,
 * tensors from JSON "data" converted to their little-endian binary layout,
 * binary tensor data taken from the body tail without a copy, and the raw
 * binary request. Texts and codes follow Triton's HTTP frontend: JSON syntax
 * and member type errors are INTERNAL (HTTP 500), semantic errors INVALID_ARG.
 */
#include "http/infer_parse.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DATA_DEPTH 100
#define RAW_PREFIX "[request id: <id_unknown>] "

static nereid_error_t *type_error(const char *field, const char *want)
{
    return nereid_error_new(NEREID_ERROR_INTERNAL,
                            "Unable to parse '%s': attempt to access JSON non-%s as %s", field,
                            want, want);
}

static nereid_error_t *missing_error(const char *field)
{
    return nereid_error_new(NEREID_ERROR_INTERNAL,
                            "Unable to parse '%s': attempt to find non-existing object member '%s'",
                            field, field);
}

static nereid_error_t *too_large_error(const char *input, size_t n, size_t max)
{
    return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                            "JSON input '%s' has a byte_size (%zu bytes) that exceeds the maximum "
                            "allowed value of %zu bytes. Use --http-max-input-size to increase "
                            "the limit.",
                            input, n, max);
}

static void *parsed_alloc(infer_parsed_t *p, size_t n)
{
    void *m = jarena_alloc(&p->arena, n ? n : 1);
    if (m) memset(m, 0, n);
    return m;
}

/* ---- JSON "data" to the binary layout ------------------------------------ */

/* Triton's checks of a JSON input's shape (GetElementCount) and byte size
 * before its data is read, with Triton's texts. */
static nereid_error_t *shape_error(const infer_input_t *in, const char *what)
{
    char *shape = malloc(in->rank * 21 + 3);
    if (!shape) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    size_t k = 0;
    shape[k++] = '[';
    for (size_t i = 0; i < in->rank; i++)
        k += (size_t)sprintf(shape + k, "%s%" PRId64, i ? "," : "", in->shape[i]);
    strcpy(shape + k, "]");
    nereid_error_t *err =
        nereid_error_new(NEREID_ERROR_INVALID_ARG, "invalid shape for input '%s': shape %s %s",
                         in->name, shape, what);
    free(shape);
    return err;
}

static nereid_error_t *json_shape_error(const infer_input_t *in)
{
    int64_t count = 0;
    for (size_t i = 0; i < in->rank; i++) {
        int64_t d = in->shape[i];
        if (d == 0) return NULL;
        if (d < 0) return shape_error(in, "contains one or more invalid dimensions");
        if (i > 0 && count > INT64_MAX / d)
            return shape_error(in, "causes total element count to exceed maximum size of "
                                   "9223372036854775807");
        count = i == 0 ? d : count * d;
    }
    int64_t size = (int64_t)nereid_datatype_byte_size(in->datatype);
    if (in->datatype != NEREID_TYPE_BYTES && size > 1 && count > INT64_MAX / size)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "byte size overflow for input '%s': element count (%" PRId64
                                ") * data type size (%" PRId64
                                ") exceeds maximum allowed size (%" PRId64 ")",
                                in->name, count, size, INT64_MAX);
    return NULL;
}

static nereid_error_t *parse_json_data(infer_input_t *in, const jv_t *data, size_t n_elements,
                                       size_t max_input_size, const char *base)
{
    nereid_error_t *shape_err = json_shape_error(in);
    if (shape_err) return shape_err;
    if (in->datatype == NEREID_TYPE_FP16 || in->datatype == NEREID_TYPE_BF16)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "receiving %s data via JSON is not supported. Please use the "
                                "binary data format for input %s",
                                nereid_datatype_name(in->datatype), in->name);
    if (in->datatype == NEREID_TYPE_INVALID)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "invalid datatype for input '%s'",
                                in->name);
    jfill_t f = {.datatype = in->datatype,
                 .field = "data",
                 .input = in->name,
                 .base = base,
                 .element_size = nereid_datatype_byte_size(in->datatype),
                 .n_expected = n_elements};
    size_t byte_size;
    if (in->datatype == NEREID_TYPE_BYTES) {
        nereid_error_t *err = json_reader_fill_data(data, &f);
        if (err) return err;
        byte_size = f.bytes_total;
    } else {
        if (n_elements > max_input_size / (f.element_size ? f.element_size : 1))
            return too_large_error(
                in->name, n_elements > SIZE_MAX / 8 ? SIZE_MAX : n_elements * f.element_size,
                max_input_size);
        byte_size = n_elements * f.element_size;
    }
    if (byte_size > max_input_size) return too_large_error(in->name, byte_size, max_input_size);
    const jv_span_t *span = jv_span(data);
    if (span && span->data && span->datatype == in->datatype && span->count == n_elements) {
        /* Converted during the parse (json_reader_parse_infer). */
        in->data = span->data;
        in->byte_size = byte_size;
        return NULL;
    }
    in->owned_data = malloc(byte_size ? byte_size : 1);
    if (!in->owned_data)
        return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory for input '%s'", in->name);
    f.out = in->owned_data;
    f.n_seen = 0;
    nereid_error_t *err = json_reader_fill_data(data, &f);
    if (err) return err;
    if (f.n_seen != n_elements)
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "Failed to parse 'data' field: shape does not match true shape");
    in->data = in->owned_data;
    in->byte_size = byte_size;
    return NULL;
}

/* ---- Inputs, outputs, parameters ----------------------------------------- */

static bool is_string(const jv_t *v)
{
    return v->type == JV_STRING;
}

static bool is_bool(const jv_t *v)
{
    return v->type == JV_TRUE || v->type == JV_FALSE;
}

static nereid_error_t *parse_shape(infer_parsed_t *p, infer_input_t *in, const jv_t *shape,
                                   size_t *n_elements)
{
    if (!shape) return missing_error("shape");
    if (shape->type != JV_ARRAY) return type_error("shape", "array");
    in->rank = shape->len;
    in->shape = parsed_alloc(p, in->rank * sizeof(int64_t));
    if (!in->shape) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    size_t n = 1;
    bool overflow = false;
    size_t d = 0;
    for (const jv_t *e = shape->v.child; e; e = e->next, d++) {
        uint64_t dim;
        if (!jv_get_uint(e, &dim)) return type_error("shape", "unsigned-integer");
        in->shape[d] = (int64_t)dim;
        if (dim != 0 && n > SIZE_MAX / dim)
            overflow = true;
        else
            n *= (size_t)dim;
    }
    *n_elements = overflow ? SIZE_MAX : n;
    return NULL;
}

/* Triton's CheckSharedMemoryData: the region name and the optional offset
 * and byte size (0 when absent). */
static nereid_error_t *parse_shm(const jv_t *params, const char **region, uint64_t *offset,
                                 uint64_t *byte_size)
{
    const jv_t *r = jv_get(params, "shared_memory_region");
    if (!is_string(r)) return type_error("shared_memory_region", "string");
    *region = r->v.s;
    const jv_t *o = jv_get(params, "shared_memory_offset");
    if (o && !jv_get_uint(o, offset)) return type_error("shared_memory_offset", "unsigned-integer");
    const jv_t *b = jv_get(params, "shared_memory_byte_size");
    if (b && !jv_get_uint(b, byte_size))
        return type_error("shared_memory_byte_size", "unsigned-integer");
    return NULL;
}

static nereid_error_t *parse_input(infer_parsed_t *p, const jv_t *j, infer_input_t *in,
                                   const char *body, size_t len, size_t *offset, const char *model,
                                   size_t max_input_size)
{
    if (j->type != JV_OBJECT) return type_error("inputs", "object");
    const jv_t *name = jv_get(j, "name");
    if (!name) return missing_error("name");
    if (!is_string(name)) return type_error("name", "string");
    in->name = name->v.s;
    const jv_t *dt = jv_get(j, "datatype");
    if (!dt) return missing_error("datatype");
    if (!is_string(dt)) return type_error("datatype", "string");
    in->datatype = nereid_datatype_from_name(dt->v.s);
    size_t n_elements = 0;
    nereid_error_t *err = parse_shape(p, in, jv_get(j, "shape"), &n_elements);
    if (err) return err;
    if (in->datatype == NEREID_TYPE_INVALID)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "invalid datatype '%s' for input '%s' for model '%s'", dt->v.s,
                                in->name, model);

    const jv_t *data = jv_get(j, "data");
    const jv_t *params = jv_get(j, "parameters");
    if (params && params->type != JV_OBJECT) return type_error("parameters", "object");
    const jv_t *bds = jv_get(params, "binary_data_size");
    const jv_t *shm = jv_get(params, "shared_memory_region");
    int n_set = (data != NULL) + (bds != NULL) + (shm != NULL);
    if (n_set != 1) {
        char msg[320];
        int k = snprintf(msg, sizeof msg,
                         "Input must set only one of the following fields: 'data', "
                         "'binary_data_size' in 'parameters', 'shared_memory_region' in "
                         "'parameters'. But %s",
                         n_set == 0 ? "no field is set" : "set");
        if (data) k += snprintf(msg + k, sizeof msg - (size_t)k, " 'data'");
        if (bds) k += snprintf(msg + k, sizeof msg - (size_t)k, " 'binary_data_size'");
        if (shm) snprintf(msg + k, sizeof msg - (size_t)k, " 'shared_memory_region'");
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "%s", msg);
    }
    if (shm) {
        p->has_shm = true;
        return parse_shm(params, &in->shm_region, &in->shm_offset, &in->shm_byte_size);
    }
    if (data) return parse_json_data(in, data, n_elements, max_input_size, body);

    uint64_t size;
    if (!jv_get_uint(bds, &size)) return type_error("binary_data_size", "unsigned-integer");
    if (size > len - *offset)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "unexpected size for input '%s', expecting %" PRIu64
                                " additional bytes for model '%s'",
                                in->name, size, model);
    in->data = body + *offset;
    in->byte_size = (size_t)size;
    *offset += (size_t)size;
    /* Backends read typed elements in place: copy a misaligned tensor. */
    size_t align = nereid_datatype_byte_size(in->datatype);
    if (align > 1 && (uintptr_t)in->data % align) {
        in->owned_data = malloc(in->byte_size ? in->byte_size : 1);
        if (!in->owned_data)
            return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory for input '%s'",
                                    in->name);
        memcpy(in->owned_data, in->data, in->byte_size);
        in->data = in->owned_data;
    }
    return NULL;
}

static nereid_error_t *parse_output(const jv_t *j, infer_output_t *out, bool binary_default)
{
    if (j->type != JV_OBJECT) return type_error("outputs", "object");
    const jv_t *name = jv_get(j, "name");
    if (!name) return missing_error("name");
    if (!is_string(name)) return type_error("name", "string");
    out->name = name->v.s;
    out->binary = binary_default;
    const jv_t *params = jv_get(j, "parameters");
    if (!params) return NULL;
    if (params->type != JV_OBJECT) return type_error("parameters", "object");
    const jv_t *bin = jv_get(params, "binary_data");
    if (jv_get(params, "shared_memory_region")) {
        /* Triton's ValidateOutputParameter */
        if (jv_get(params, "classification"))
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "Output can't set both 'shared_memory_region' and "
                                    "'classification'");
        if (bin && !is_bool(bin))
            return nereid_error_new(NEREID_ERROR_INTERNAL,
                                    "Unable to set 'binary_data': attempt to access JSON "
                                    "non-boolean as boolean");
        if (bin && bin->type == JV_TRUE)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "Output can't set both 'shared_memory_region' and "
                                    "'binary_data'");
        return parse_shm(params, &out->shm_region, &out->shm_offset, &out->shm_byte_size);
    }
    if (bin) {
        if (!is_bool(bin)) return type_error("binary_data", "boolean");
        out->binary = bin->type == JV_TRUE;
    }
    const jv_t *cls = jv_get(params, "classification");
    if (cls) {
        uint64_t k;
        if (!jv_get_uint(cls, &k)) return type_error("classification", "unsigned-integer");
        out->class_count = k > UINT32_MAX ? UINT32_MAX : (uint32_t)k;
    }
    return NULL;
}

static nereid_error_t *parse_parameters(const jv_t *params, infer_parsed_t *p)
{
    if (params->type != JV_OBJECT) return type_error("parameters", "object");
    p->parameters = params;
    for (const jv_t *v = params->v.child; v; v = v->next) {
        const char *key = v->key;
        if (!strcmp(key, "sequence_id")) {
            if (is_string(v)) {
                p->sequence_id_string = v->v.s;
            } else if (!jv_get_uint(v, &p->sequence_id)) {
                return type_error("sequence_id", "unsigned-integer");
            }
            p->has_sequence_id = true;
        } else if (!strcmp(key, "sequence_start") || !strcmp(key, "sequence_end") ||
                   !strcmp(key, "binary_data_output")) {
            if (!is_bool(v)) return type_error(key, "boolean");
            bool b = v->type == JV_TRUE;
            if (key[0] == 'b')
                p->binary_data_output = b;
            else if (!strcmp(key, "sequence_start"))
                p->sequence_start = b;
            else
                p->sequence_end = b;
        } else if (!strcmp(key, "priority")) {
            if (!jv_get_uint(v, &p->priority)) return type_error("priority", "unsigned-integer");
            p->has_priority = true;
        } else if (!strcmp(key, "timeout")) {
            if (!jv_get_uint(v, &p->timeout_us)) return type_error("timeout", "unsigned-integer");
            p->has_timeout = true;
        } else if (!strcmp(key, "headers")) {
            continue;
        } else if (!strncmp(key, "triton_", 7)) {
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "parameter keys starting with 'triton_' are reserved for "
                                    "Triton usage and should not be specified.");
        } else if (!is_string(v) && !jv_is_number(v) && !is_bool(v)) {
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "parameter '%s' has invalid type. It should be either "
                                    "'int', 'bool', or 'string'.",
                                    key);
        }
    }
    return NULL;
}

static nereid_error_t *parse_root(const jv_t *root, const char *body, size_t len, size_t header_len,
                                  const char *model, size_t max_input_size, infer_parsed_t *p)
{
    if (root->type != JV_OBJECT)
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "Unable to parse the request JSON: expected an object");
    const jv_t *id = jv_get(root, "id");
    if (id) {
        if (!is_string(id)) return type_error("id", "string");
        p->id = id->v.s;
    }
    const jv_t *params = jv_get(root, "parameters");
    if (params) {
        nereid_error_t *err = parse_parameters(params, p);
        if (err) return err;
    }
    const jv_t *inputs = jv_get(root, "inputs");
    if (!inputs) return missing_error("inputs");
    if (inputs->type != JV_ARRAY) return type_error("inputs", "array");
    p->n_inputs = inputs->len;
    p->inputs = parsed_alloc(p, p->n_inputs * sizeof *p->inputs);
    if (!p->inputs) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    size_t offset = header_len, i = 0;
    for (const jv_t *e = inputs->v.child; e; e = e->next, i++) {
        nereid_error_t *err =
            parse_input(p, e, &p->inputs[i], body, len, &offset, model, max_input_size);
        if (err) return err;
    }
    if (offset != len)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "unexpected additional input data for model '%s'", model);

    const jv_t *outputs = jv_get(root, "outputs");
    if (outputs) {
        if (outputs->type != JV_ARRAY) return type_error("outputs", "array");
        p->n_outputs = outputs->len;
        p->outputs = parsed_alloc(p, p->n_outputs * sizeof *p->outputs);
        if (!p->outputs) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
        i = 0;
        for (const jv_t *e = outputs->v.child; e; e = e->next, i++) {
            nereid_error_t *err = parse_output(e, &p->outputs[i], p->binary_data_output);
            if (err) return err;
            if (p->outputs[i].shm_region) p->has_shm = true;
        }
    }
    return NULL;
}

nereid_error_t *infer_parse(const char *body, size_t len, size_t header_len, const char *model,
                            size_t max_input_size, infer_parsed_t *out)
{
    memset(out, 0, offsetof(infer_parsed_t, arena));
    jarena_init(&out->arena);
    if (header_len == INFER_HEADER_LENGTH_NONE) header_len = len;
    if (header_len > len)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "Inference-Header-Content-Length (%zu) exceeds the request body "
                                "size (%zu) for model '%s'",
                                header_len, len, model);
    if (header_len > max_input_size)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "request JSON size of %zu bytes exceeds the maximum allowed input "
                                "size of %zu bytes. Use --http-max-input-size to increase the "
                                "limit.",
                                header_len, max_input_size);
    jv_t *root;
    nereid_error_t *err =
        json_reader_parse_infer(body, header_len, &out->arena, max_input_size, &root);
    if (!err) err = parse_root(root, body, len, header_len, model, max_input_size, out);
    if (err) infer_parsed_free(out);
    return err;
}

nereid_error_t *infer_parse_raw(const char *body, size_t len, const infer_raw_model_t *info,
                                infer_parsed_t *out)
{
    memset(out, 0, offsetof(infer_parsed_t, arena));
    jarena_init(&out->arena);
    if (info->n_inputs != 1)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                RAW_PREFIX "Raw request must only have 1 input (found 1) to be "
                                           "deduced but got %zu inputs in '%s' model "
                                           "configuration",
                                info->n_inputs, info->model);
    size_t rank = info->n_dims + (info->batching ? 1 : 0);
    int64_t *shape = parsed_alloc(out, rank * sizeof(int64_t));
    out->inputs = parsed_alloc(out, sizeof *out->inputs);
    if (!shape || !out->inputs) {
        infer_parsed_free(out);
        return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    }
    out->n_inputs = 1;
    out->raw = true;
    infer_input_t *in = &out->inputs[0];
    in->name = info->input_name;
    in->datatype = info->datatype;
    in->shape = shape;
    in->rank = rank;
    in->data = body;
    in->byte_size = len;
    int64_t *dims = shape;
    if (info->batching) *dims++ = 1;
    if (info->datatype == NEREID_TYPE_BYTES) {
        /* Triton: one element (no wildcard, product 1), and the whole body
         * is that element: its 4-byte length is prepended here. */
        bool one = true;
        for (size_t d = 0; d < info->n_dims; d++) {
            dims[d] = info->dims[d];
            if (info->dims[d] != 1) one = false;
        }
        if (!one || len > UINT32_MAX) {
            infer_parsed_free(out);
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    RAW_PREFIX "For BYTE datatype raw input '%s', the model must "
                                               "have input shape [1]",
                                    info->input_name);
        }
        unsigned char *buf = malloc(len + 4);
        if (!buf) {
            infer_parsed_free(out);
            return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
        }
        uint32_t n = (uint32_t)len;
        for (int b = 0; b < 4; b++)
            buf[b] = (unsigned char)(n >> (8 * b));
        memcpy(buf + 4, body, len);
        in->owned_data = buf;
        in->data = buf;
        in->byte_size = len + 4;
        return NULL;
    }
    size_t n_variable = 0, known = nereid_datatype_byte_size(info->datatype);
    for (size_t d = 0; d < info->n_dims; d++) {
        dims[d] = info->dims[d];
        if (info->dims[d] < 0)
            n_variable++;
        else if (info->dims[d] > 0 && known <= SIZE_MAX / (size_t)info->dims[d])
            known *= (size_t)info->dims[d];
        else
            known = 0;
    }
    if (n_variable > 1) {
        infer_parsed_free(out);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                RAW_PREFIX "The shape of the raw input '%s' can not be deduced "
                                           "because there are more than one variable-sized "
                                           "dimension",
                                info->input_name);
    }
    for (size_t d = 0; d < info->n_dims; d++)
        if (dims[d] < 0) dims[d] = known ? (int64_t)(len / known) : 0;
    return NULL;
}

nereid_error_t *infer_parsed_to_request(nereid_server_t *server, const char *model, int64_t version,
                                        const infer_parsed_t *p, nereid_request_t **out)
{
    *out = NULL;
    nereid_request_t *req;
    nereid_error_t *err = nereid_request_new(server, model, version, &req);
    if (err) return err;
    if (p->id && p->id[0] && (err = nereid_request_set_id(req, p->id))) goto fail;
    for (size_t i = 0; i < p->n_inputs; i++) {
        const infer_input_t *in = &p->inputs[i];
        err = nereid_request_add_input(req, in->name, in->datatype, in->shape, in->rank, in->data,
                                       in->byte_size);
        if (err) goto fail;
    }
    for (size_t i = 0; i < p->n_outputs; i++) {
        err =
            nereid_request_add_requested_output(req, p->outputs[i].name, p->outputs[i].class_count);
        if (err) goto fail;
    }
    if (p->has_priority) nereid_request_set_priority(req, p->priority);
    if (p->has_timeout) nereid_request_set_timeout_us(req, p->timeout_us);
    if (p->sequence_id_string) {
        if ((err = nereid_request_set_correlation_id_string(req, p->sequence_id_string))) goto fail;
    } else if (p->has_sequence_id) {
        nereid_request_set_correlation_id(req, p->sequence_id);
    }
    if (p->sequence_start || p->sequence_end)
        nereid_request_set_sequence_flags(req, p->sequence_start, p->sequence_end);
    if (p->parameters) {
        for (const jv_t *v = p->parameters->v.child; v; v = v->next) {
            const char *key = v->key;
            if (!strcmp(key, "sequence_id") || !strcmp(key, "sequence_start") ||
                !strcmp(key, "sequence_end") || !strcmp(key, "priority") ||
                !strcmp(key, "timeout") || !strcmp(key, "binary_data_output") ||
                !strcmp(key, "headers"))
                continue;
            if (v->type == JV_STRING)
                err = nereid_request_set_parameter_string(req, key, v->v.s);
            else if (v->type == JV_INT)
                err = nereid_request_set_parameter_int(req, key, v->v.i);
            else if (v->type == JV_TRUE || v->type == JV_FALSE)
                err = nereid_request_set_parameter_bool(req, key, v->type == JV_TRUE);
            else
                err = nereid_request_set_parameter_double(
                    req, key, v->type == JV_UINT ? (double)v->v.u : v->v.d);
            if (err) goto fail;
        }
    }
    *out = req;
    return NULL;
fail:
    nereid_request_free(req);
    return err;
}

nereid_error_t *infer_parsed_shm(infer_parsed_t *p, nereid_shm_registry_t *reg,
                                 nereid_shm_use_t **use)
{
    nereid_error_t *err = NULL;
    for (size_t i = 0; !err && p->has_shm && i < p->n_inputs; i++) {
        infer_input_t *in = &p->inputs[i];
        if (!in->shm_region) continue;
        err = nereid_shm_use_input(use, reg, in->shm_region, in->shm_offset, in->shm_byte_size,
                                   in->datatype, &in->data);
        in->byte_size = (size_t)in->shm_byte_size;
    }
    for (size_t i = 0; !err && p->has_shm && i < p->n_outputs; i++) {
        const infer_output_t *out = &p->outputs[i];
        if (out->shm_region)
            err = nereid_shm_use_output(use, reg, out->name, out->shm_region, out->shm_offset,
                                        out->shm_byte_size);
    }
    return err;
}

void infer_parsed_free(infer_parsed_t *p)
{
    for (size_t i = 0; i < p->n_inputs && p->inputs; i++) {
        free(p->inputs[i].owned_data);
    }
    jarena_free(&p->arena);
    memset(p, 0, offsetof(infer_parsed_t, arena));
}
