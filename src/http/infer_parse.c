/*
 * This file contains the inference request parser: JSON header with jansson,
 * tensors from JSON "data" converted to their little-endian binary layout,
 * binary tensor data taken from the body tail without a copy, and the raw
 * binary request. Texts and codes follow Triton's HTTP frontend: JSON syntax
 * and member type errors are INTERNAL (HTTP 500), semantic errors INVALID_ARG.
 */
#include "http/infer_parse.h"

#include <inttypes.h>
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

/* A JSON integer that is >= 0 (jansson keeps integers as long long). */
static bool get_uint(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* ---- JSON "data" to the binary layout ------------------------------------ */

typedef struct data_fill {
    nereid_datatype_t datatype;
    const char *input;
    char *out;           /* NULL on the BYTES sizing pass */
    size_t element_size; /* 0 for BYTES */
    size_t n_expected;   /* elements the shape asks for */
    size_t n_seen;       /* leaves visited */
    size_t bytes_total;  /* BYTES: 4-byte prefixes + string bytes */
    size_t offset;       /* BYTES: write position */
} data_fill_t;

static nereid_error_t *fill_leaf(const json_t *v, data_fill_t *f)
{
    if (f->n_seen >= f->n_expected)
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "Unable to parse 'data': Shape does not match true shape of "
                                "'data' field");
    size_t i = f->n_seen++;
    char *dst = f->out ? f->out + i * f->element_size : NULL;
    switch (f->datatype) {
    case NEREID_TYPE_BOOL:
        if (!json_is_boolean(v)) return type_error("data", "boolean");
        dst[0] = json_is_true(v) ? 1 : 0;
        return NULL;
    case NEREID_TYPE_INT8:
    case NEREID_TYPE_INT16:
    case NEREID_TYPE_INT32:
    case NEREID_TYPE_INT64: {
        if (!json_is_integer(v)) return type_error("data", "signed-integer");
        int64_t x = json_integer_value(v);
        if (f->element_size == 1) {
            int8_t y = (int8_t)x;
            memcpy(dst, &y, 1);
        } else if (f->element_size == 2) {
            int16_t y = (int16_t)x;
            memcpy(dst, &y, 2);
        } else if (f->element_size == 4) {
            int32_t y = (int32_t)x;
            memcpy(dst, &y, 4);
        } else {
            memcpy(dst, &x, 8);
        }
        return NULL;
    }
    case NEREID_TYPE_UINT8:
    case NEREID_TYPE_UINT16:
    case NEREID_TYPE_UINT32:
    case NEREID_TYPE_UINT64: {
        uint64_t x;
        if (!get_uint(v, &x)) return type_error("data", "unsigned-integer");
        if (f->element_size == 1) {
            uint8_t y = (uint8_t)x;
            memcpy(dst, &y, 1);
        } else if (f->element_size == 2) {
            uint16_t y = (uint16_t)x;
            memcpy(dst, &y, 2);
        } else if (f->element_size == 4) {
            uint32_t y = (uint32_t)x;
            memcpy(dst, &y, 4);
        } else {
            memcpy(dst, &x, 8);
        }
        return NULL;
    }
    case NEREID_TYPE_FP32: {
        if (!json_is_number(v)) return type_error("data", "float");
        float y = (float)json_number_value(v);
        memcpy(dst, &y, 4);
        return NULL;
    }
    case NEREID_TYPE_FP64: {
        if (!json_is_number(v)) return type_error("data", "double");
        double y = json_number_value(v);
        memcpy(dst, &y, 8);
        return NULL;
    }
    case NEREID_TYPE_BYTES: {
        if (!json_is_string(v)) return type_error("data", "string");
        size_t n = json_string_length(v);
        if (n > UINT32_MAX)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG, "BYTES element too long");
        if (f->out) {
            uint32_t n32 = (uint32_t)n;
            memcpy(f->out + f->offset, &n32, 4);
            memcpy(f->out + f->offset + 4, json_string_value(v), n);
            f->offset += 4 + n;
        } else {
            f->bytes_total += 4 + n;
        }
        return NULL;
    }
    default:
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "invalid datatype for input '%s'",
                                f->input);
    }
}

static nereid_error_t *fill_data(const json_t *v, int depth, data_fill_t *f)
{
    if (!json_is_array(v)) return fill_leaf(v, f);
    if (depth >= MAX_DATA_DEPTH)
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "Unable to parse 'data': nesting deeper than %d levels",
                                MAX_DATA_DEPTH);
    size_t i;
    const json_t *e;
    json_array_foreach(v, i, e)
    {
        nereid_error_t *err = fill_data(e, depth + 1, f);
        if (err) return err;
    }
    return NULL;
}

static nereid_error_t *parse_json_data(infer_input_t *in, const json_t *data, size_t n_elements,
                                       size_t max_input_size)
{
    if (in->datatype == NEREID_TYPE_FP16 || in->datatype == NEREID_TYPE_BF16)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "receiving %s data via JSON is not supported. Please use the "
                                "binary data format for input %s",
                                nereid_datatype_name(in->datatype), in->name);
    data_fill_t f = {.datatype = in->datatype,
                     .input = in->name,
                     .element_size = nereid_datatype_byte_size(in->datatype),
                     .n_expected = n_elements};
    size_t byte_size;
    if (in->datatype == NEREID_TYPE_BYTES) {
        nereid_error_t *err = fill_data(data, 0, &f);
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
    in->owned_data = malloc(byte_size ? byte_size : 1);
    if (!in->owned_data)
        return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory for input '%s'", in->name);
    f.out = in->owned_data;
    f.n_seen = 0;
    nereid_error_t *err = fill_data(data, 0, &f);
    if (err) return err;
    if (f.n_seen != n_elements)
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "Failed to parse 'data' field: shape does not match true shape");
    in->data = in->owned_data;
    in->byte_size = byte_size;
    return NULL;
}

/* ---- Inputs, outputs, parameters ----------------------------------------- */

static nereid_error_t *parse_shape(infer_input_t *in, const json_t *shape, size_t *n_elements)
{
    if (!shape) return missing_error("shape");
    if (!json_is_array(shape)) return type_error("shape", "array");
    in->rank = json_array_size(shape);
    in->shape = malloc((in->rank ? in->rank : 1) * sizeof(int64_t));
    if (!in->shape) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    size_t n = 1;
    bool overflow = false;
    for (size_t d = 0; d < in->rank; d++) {
        uint64_t dim;
        if (!get_uint(json_array_get(shape, d), &dim))
            return type_error("shape", "unsigned-integer");
        in->shape[d] = (int64_t)dim;
        if (dim != 0 && n > SIZE_MAX / dim)
            overflow = true;
        else
            n *= (size_t)dim;
    }
    *n_elements = overflow ? SIZE_MAX : n;
    return NULL;
}

static nereid_error_t *parse_input(const json_t *j, infer_input_t *in, const char *body, size_t len,
                                   size_t *offset, const char *model, size_t max_input_size)
{
    if (!json_is_object(j)) return type_error("inputs", "object");
    const json_t *name = json_object_get(j, "name");
    if (!name) return missing_error("name");
    if (!json_is_string(name)) return type_error("name", "string");
    in->name = json_string_value(name);
    const json_t *dt = json_object_get(j, "datatype");
    if (!dt) return missing_error("datatype");
    if (!json_is_string(dt)) return type_error("datatype", "string");
    in->datatype = nereid_datatype_from_name(json_string_value(dt));
    size_t n_elements = 0;
    nereid_error_t *err = parse_shape(in, json_object_get(j, "shape"), &n_elements);
    if (err) return err;
    if (in->datatype == NEREID_TYPE_INVALID)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "invalid datatype '%s' for input '%s' for model '%s'",
                                json_string_value(dt), in->name, model);

    const json_t *data = json_object_get(j, "data");
    const json_t *params = json_object_get(j, "parameters");
    if (params && !json_is_object(params)) return type_error("parameters", "object");
    const json_t *bds = params ? json_object_get(params, "binary_data_size") : NULL;
    const json_t *shm = params ? json_object_get(params, "shared_memory_region") : NULL;
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
        if (!json_is_string(shm)) return type_error("shared_memory_region", "string");
        return nereid_error_new(NEREID_ERROR_NOT_FOUND, "Unable to find shared memory region: '%s'",
                                json_string_value(shm));
    }
    if (data) return parse_json_data(in, data, n_elements, max_input_size);

    uint64_t size;
    if (!get_uint(bds, &size)) return type_error("binary_data_size", "unsigned-integer");
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

static nereid_error_t *parse_output(const json_t *j, infer_output_t *out, bool binary_default)
{
    if (!json_is_object(j)) return type_error("outputs", "object");
    const json_t *name = json_object_get(j, "name");
    if (!name) return missing_error("name");
    if (!json_is_string(name)) return type_error("name", "string");
    out->name = json_string_value(name);
    out->binary = binary_default;
    const json_t *params = json_object_get(j, "parameters");
    if (!params) return NULL;
    if (!json_is_object(params)) return type_error("parameters", "object");
    const json_t *shm = json_object_get(params, "shared_memory_region");
    if (shm) {
        if (!json_is_string(shm)) return type_error("shared_memory_region", "string");
        return nereid_error_new(NEREID_ERROR_NOT_FOUND, "Unable to find shared memory region: '%s'",
                                json_string_value(shm));
    }
    const json_t *bin = json_object_get(params, "binary_data");
    if (bin) {
        if (!json_is_boolean(bin)) return type_error("binary_data", "boolean");
        out->binary = json_is_true(bin);
    }
    const json_t *cls = json_object_get(params, "classification");
    if (cls) {
        uint64_t k;
        if (!get_uint(cls, &k)) return type_error("classification", "unsigned-integer");
        out->class_count = k > UINT32_MAX ? UINT32_MAX : (uint32_t)k;
    }
    return NULL;
}

static nereid_error_t *parse_parameters(const json_t *params, infer_parsed_t *p)
{
    if (!json_is_object(params)) return type_error("parameters", "object");
    p->parameters = (json_t *)params;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)params, key, v)
    {
        if (!strcmp(key, "sequence_id")) {
            if (json_is_string(v)) {
                p->sequence_id_string = json_string_value(v);
            } else if (!get_uint(v, &p->sequence_id)) {
                return type_error("sequence_id", "unsigned-integer");
            }
            p->has_sequence_id = true;
        } else if (!strcmp(key, "sequence_start") || !strcmp(key, "sequence_end") ||
                   !strcmp(key, "binary_data_output")) {
            if (!json_is_boolean(v)) return type_error(key, "boolean");
            bool b = json_is_true(v);
            if (key[0] == 'b')
                p->binary_data_output = b;
            else if (!strcmp(key, "sequence_start"))
                p->sequence_start = b;
            else
                p->sequence_end = b;
        } else if (!strcmp(key, "priority")) {
            if (!get_uint(v, &p->priority)) return type_error("priority", "unsigned-integer");
            p->has_priority = true;
        } else if (!strcmp(key, "timeout")) {
            if (!get_uint(v, &p->timeout_us)) return type_error("timeout", "unsigned-integer");
            p->has_timeout = true;
        } else if (!strcmp(key, "headers")) {
            continue;
        } else if (!strncmp(key, "triton_", 7)) {
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "parameter keys starting with 'triton_' are reserved for "
                                    "Triton usage and should not be specified.");
        } else if (!json_is_string(v) && !json_is_integer(v) && !json_is_boolean(v) &&
                   !json_is_real(v)) {
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "parameter '%s' has invalid type. It should be either "
                                    "'int', 'bool', or 'string'.",
                                    key);
        }
    }
    return NULL;
}

static nereid_error_t *parse_root(const json_t *root, const char *body, size_t len,
                                  size_t header_len, const char *model, size_t max_input_size,
                                  infer_parsed_t *p)
{
    if (!json_is_object(root))
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "Unable to parse the request JSON: expected an object");
    const json_t *id = json_object_get(root, "id");
    if (id) {
        if (!json_is_string(id)) return type_error("id", "string");
        p->id = json_string_value(id);
    }
    const json_t *params = json_object_get(root, "parameters");
    if (params) {
        nereid_error_t *err = parse_parameters(params, p);
        if (err) return err;
    }
    const json_t *inputs = json_object_get(root, "inputs");
    if (!inputs) return missing_error("inputs");
    if (!json_is_array(inputs)) return type_error("inputs", "array");
    p->n_inputs = json_array_size(inputs);
    p->inputs = calloc(p->n_inputs ? p->n_inputs : 1, sizeof *p->inputs);
    if (!p->inputs) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    size_t offset = header_len;
    for (size_t i = 0; i < p->n_inputs; i++) {
        nereid_error_t *err = parse_input(json_array_get(inputs, i), &p->inputs[i], body, len,
                                          &offset, model, max_input_size);
        if (err) return err;
    }
    if (offset != len)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "unexpected additional input data for model '%s'", model);

    const json_t *outputs = json_object_get(root, "outputs");
    if (outputs) {
        if (!json_is_array(outputs)) return type_error("outputs", "array");
        p->n_outputs = json_array_size(outputs);
        p->outputs = calloc(p->n_outputs ? p->n_outputs : 1, sizeof *p->outputs);
        if (!p->outputs) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
        for (size_t i = 0; i < p->n_outputs; i++) {
            nereid_error_t *err =
                parse_output(json_array_get(outputs, i), &p->outputs[i], p->binary_data_output);
            if (err) return err;
        }
    }
    return NULL;
}

nereid_error_t *infer_parse(const char *body, size_t len, size_t header_len, const char *model,
                            size_t max_input_size, infer_parsed_t *out)
{
    memset(out, 0, sizeof *out);
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
    json_error_t jerr;
    out->root = json_loadb(body, header_len, JSON_ALLOW_NUL, &jerr);
    if (!out->root)
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "failed to parse the request JSON buffer: %s at %d", jerr.text,
                                jerr.position);
    nereid_error_t *err = parse_root(out->root, body, len, header_len, model, max_input_size, out);
    if (err) infer_parsed_free(out);
    return err;
}

nereid_error_t *infer_parse_raw(const char *body, size_t len, const infer_raw_model_t *info,
                                infer_parsed_t *out)
{
    memset(out, 0, sizeof *out);
    if (info->n_inputs != 1)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                RAW_PREFIX "Raw request must only have 1 input (found 1) to be "
                                           "deduced but got %zu inputs in '%s' model "
                                           "configuration",
                                info->n_inputs, info->model);
    size_t rank = info->n_dims + (info->batching ? 1 : 0);
    int64_t *shape = malloc((rank ? rank : 1) * sizeof(int64_t));
    out->inputs = calloc(1, sizeof *out->inputs);
    if (!shape || !out->inputs) {
        free(shape);
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
        if (info->n_dims != 1 || info->dims[0] != 1) {
            infer_parsed_free(out);
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    RAW_PREFIX "For BYTE datatype raw input '%s', the model must "
                                               "have input shape [1]",
                                    info->input_name);
        }
        dims[0] = 1;
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
        const char *key;
        json_t *v;
        json_object_foreach(p->parameters, key, v)
        {
            if (!strcmp(key, "sequence_id") || !strcmp(key, "sequence_start") ||
                !strcmp(key, "sequence_end") || !strcmp(key, "priority") ||
                !strcmp(key, "timeout") || !strcmp(key, "binary_data_output") ||
                !strcmp(key, "headers"))
                continue;
            if (json_is_string(v))
                err = nereid_request_set_parameter_string(req, key, json_string_value(v));
            else if (json_is_integer(v))
                err = nereid_request_set_parameter_int(req, key, json_integer_value(v));
            else if (json_is_boolean(v))
                err = nereid_request_set_parameter_bool(req, key, json_is_true(v));
            else
                err = nereid_request_set_parameter_double(req, key, json_real_value(v));
            if (err) goto fail;
        }
    }
    *out = req;
    return NULL;
fail:
    nereid_request_free(req);
    return err;
}

void infer_parsed_free(infer_parsed_t *p)
{
    for (size_t i = 0; i < p->n_inputs && p->inputs; i++) {
        free(p->inputs[i].shape);
        free(p->inputs[i].owned_data);
    }
    free(p->inputs);
    free(p->outputs);
    if (p->root) json_decref(p->root);
    memset(p, 0, sizeof *p);
}
