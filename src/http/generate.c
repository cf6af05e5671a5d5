/*
 * This file contains the JSON mapping of Triton's generate extension
 * (Triton's HTTPAPIServer::GenerateRequestClass, same texts): the request
 * body to an inference request, a response to its JSON object. The HTTP
 * exchange (one reply or server-sent events) is in http_infer.c.
 */
#include "http/generate.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/json_reader.h"

#define MAX_DATA_DEPTH 100 /* Triton's HTTP_MAX_JSON_NESTING_DEPTH */

void generate_buffers_free(generate_buffers_t *bufs)
{
    for (size_t i = 0; i < bufs->n; i++)
        free(bufs->bufs[i]);
    free(bufs->bufs);
    memset(bufs, 0, sizeof *bufs);
}

static void *buffers_alloc(generate_buffers_t *bufs, size_t n)
{
    if (bufs->n == bufs->cap) {
        size_t cap = bufs->cap ? 2 * bufs->cap : 4;
        void **grown = realloc(bufs->bufs, cap * sizeof *grown);
        if (!grown) return NULL;
        bufs->bufs = grown;
        bufs->cap = cap;
    }
    void *p = malloc(n ? n : 1);
    if (p) bufs->bufs[bufs->n++] = p;
    return p;
}

/* ---- Request -------------------------------------------------------------- */

typedef struct gen_ctx {
    nereid_request_t *req;
    json_t *inputs; /* the model metadata's "inputs" */
    generate_buffers_t *bufs;
    size_t consumed; /* input bytes so far */
    size_t max_input_size;
} gen_ctx_t;

static json_t *find_input(const gen_ctx_t *g, const char *name)
{
    size_t i;
    json_t *in;
    json_array_foreach(g->inputs, i, in)
    {
        json_t *n = json_object_get(in, "name");
        if (json_is_string(n) && !strcmp(json_string_value(n), name)) return in;
    }
    return NULL;
}

static nereid_error_t *access_error(const char *what)
{
    return nereid_error_new(NEREID_ERROR_INTERNAL,
                            "Unable to parse 'data': attempt to access JSON non-%s as %s", what,
                            what);
}

/* A member that is not an input: a request parameter (Triton's
 * SetTritonParameterFromJsonParameter). */
static nereid_error_t *set_parameter(nereid_request_t *req, const jv_t *v)
{
    switch (v->type) {
    case JV_STRING:
        return nereid_request_set_parameter_string(req, v->key, v->v.s);
    case JV_INT:
        return nereid_request_set_parameter_int(req, v->key, v->v.i);
    case JV_TRUE:
    case JV_FALSE:
        return nereid_request_set_parameter_bool(req, v->key, v->type == JV_TRUE);
    case JV_UINT:
        return nereid_request_set_parameter_double(req, v->key, (double)v->v.u);
    case JV_DOUBLE:
        return nereid_request_set_parameter_double(req, v->key, v->v.d);
    default:
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "parameter '%s' has invalid type. It should be either 'int', "
                                "'bool', or 'string'.",
                                v->key);
    }
}

/* BYTES: the serialized size of every string leaf. */
static nereid_error_t *bytes_size(const jv_t *v, int depth, size_t *size)
{
    if (depth >= MAX_DATA_DEPTH)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "JSON nesting depth exceeds maximum allowed limit (%d)",
                                MAX_DATA_DEPTH);
    if (v->type == JV_ARRAY) {
        for (const jv_t *e = v->v.child; e; e = e->next) {
            nereid_error_t *err = bytes_size(e, depth + 1, size);
            if (err) return err;
        }
        return NULL;
    }
    if (v->type != JV_STRING)
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "Unable to parse JSON bytes array: attempt to access JSON "
                                "non-string as string");
    *size += 4 + v->len;
    return NULL;
}

typedef struct fill {
    const char *input;
    nereid_datatype_t dt;
    char *out;
    size_t es;     /* element size; 0 for BYTES */
    size_t n_seen; /* leaves written */
    size_t n_max;  /* leaves expected (non-BYTES) */
    size_t offset; /* BYTES write position */
} fill_t;

static nereid_error_t *range_error(const fill_t *f, const jv_t *v, const char *range)
{
    char num[32];
    if (v->type == JV_UINT)
        snprintf(num, sizeof num, "%" PRIu64, v->v.u);
    else
        snprintf(num, sizeof num, "%" PRId64, v->v.i);
    return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                            "value %s of input '%s' is out of range for datatype %s (%s)", num,
                            f->input, nereid_datatype_name(f->dt), range);
}

/* One leaf into f: the element rules of the inference JSON (integers in
 * their type's range, no wrap). */
static nereid_error_t *fill_leaf(fill_t *f, const jv_t *v)
{
    if (f->dt == NEREID_TYPE_BYTES) {
        uint32_t n = (uint32_t)v->len;
        memcpy(f->out + f->offset, &n, 4);
        memcpy(f->out + f->offset + 4, v->v.s, v->len);
        f->offset += 4 + v->len;
        return NULL;
    }
    if (f->n_seen >= f->n_max)
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "Unable to parse 'data': Shape does not match true shape of "
                                "'data' field");
    char *dst = f->out + f->n_seen++ * f->es;
    int64_t lo = 0;
    uint64_t hi = 0;
    const char *range = NULL;
    switch (f->dt) {
    case NEREID_TYPE_BOOL:
        if (v->type != JV_TRUE && v->type != JV_FALSE) return access_error("boolean");
        dst[0] = v->type == JV_TRUE;
        return NULL;
    case NEREID_TYPE_FP32:
    case NEREID_TYPE_FP64: {
        double d;
        if (v->type == JV_INT)
            d = (double)v->v.i;
        else if (v->type == JV_UINT)
            d = (double)v->v.u;
        else if (v->type == JV_DOUBLE)
            d = v->v.d;
        else
            return access_error(f->dt == NEREID_TYPE_FP32 ? "float" : "double");
        if (f->dt == NEREID_TYPE_FP32) {
            float x = (float)d;
            memcpy(dst, &x, 4);
        } else {
            memcpy(dst, &d, 8);
        }
        return NULL;
    }
    default:
        if (!json_int_range(f->dt, &lo, &hi, &range))
            return nereid_error_new(NEREID_ERROR_INVALID_ARG, "invalid datatype for input %s",
                                    f->input);
    }
    uint64_t bits;
    if (lo < 0) { /* a signed datatype */
        if (v->type != JV_INT) return access_error("signed-integer");
        if (v->v.i < lo || (v->v.i > 0 && (uint64_t)v->v.i > hi)) return range_error(f, v, range);
        bits = (uint64_t)v->v.i;
    } else {
        if (v->type == JV_INT && v->v.i >= 0)
            bits = (uint64_t)v->v.i;
        else if (v->type == JV_UINT)
            bits = v->v.u;
        else
            return access_error("unsigned-integer");
        if (bits > hi) return range_error(f, v, range);
    }
    switch (f->es) { /* little-endian: the low bytes of the value */
    case 1: {
        uint8_t x = (uint8_t)bits;
        memcpy(dst, &x, 1);
        break;
    }
    case 2: {
        uint16_t x = (uint16_t)bits;
        memcpy(dst, &x, 2);
        break;
    }
    case 4: {
        uint32_t x = (uint32_t)bits;
        memcpy(dst, &x, 4);
        break;
    }
    default:
        memcpy(dst, &bits, 8);
    }
    return NULL;
}

static nereid_error_t *fill_value(fill_t *f, const jv_t *v, int depth)
{
    if (depth >= MAX_DATA_DEPTH)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "JSON nesting depth exceeds maximum allowed limit (%d)",
                                MAX_DATA_DEPTH);
    if (v->type != JV_ARRAY) return fill_leaf(f, v);
    for (const jv_t *e = v->v.child; e; e = e->next) {
        nereid_error_t *err = fill_value(f, e, depth + 1);
        if (err) return err;
    }
    return NULL;
}

/* Triton's two passes: fixed dimensions divide the element count; the
 * innermost variable one takes what remains, the others 1. */
static nereid_error_t *fit_shape(const char *name, const json_t *meta_shape, size_t n,
                                 int64_t *shape, size_t *rank)
{
    size_t r = json_array_size(meta_shape);
    if (r > 64)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "The schema can not convert input '%s' to tensor with proper "
                                "shape",
                                name);
    for (size_t i = 0; i < r; i++)
        shape[i] = json_integer_value(json_array_get(meta_shape, i));
    size_t left = n;
    for (size_t i = r; i-- > 0;) {
        if (shape[i] == -1) continue;
        if (shape[i] <= 0 || left % (size_t)shape[i])
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "The schema can not convert input '%s' to tensor with proper "
                                    "shape",
                                    name);
        left /= (size_t)shape[i];
    }
    for (size_t i = r; i-- > 0;) {
        if (shape[i] == -1) {
            shape[i] = (int64_t)left;
            left = 1;
        }
    }
    if (left != 1)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "The schema can not convert input '%s' to tensor with proper "
                                "shape",
                                name);
    *rank = r;
    return NULL;
}

/* A member that names an input: a tensor (Triton's ExactMappingInput). */
static nereid_error_t *add_tensor(gen_ctx_t *g, const json_t *input, const jv_t *v)
{
    const char *name = v->key;
    const char *dt_name = json_string_value(json_object_get(input, "datatype"));
    nereid_datatype_t dt = nereid_datatype_from_name(dt_name ? dt_name : "");
    size_t n = v->type == JV_ARRAY ? v->len : 1, byte_size = 0;
    nereid_error_t *err;
    if (dt == NEREID_TYPE_BYTES) {
        if ((err = bytes_size(v, 0, &byte_size))) return err;
    } else {
        size_t es = nereid_datatype_byte_size(dt);
        if (es == 0)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "input '%s' has unsupported datatype %s", name,
                                    dt_name ? dt_name : "");
        if (n > SIZE_MAX / es)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "input '%s' has too many elements of datatype %s", name,
                                    dt_name);
        byte_size = n * es;
    }
    if (byte_size == 0) return nereid_request_add_input(g->req, name, dt, NULL, 0, NULL, 0);
    if (byte_size + g->consumed > g->max_input_size || byte_size + g->consumed < g->consumed)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "request size of %zu bytes with input '%s' of size %zu bytes "
                                "exceeds the maximum allowed input size of %zu. Use "
                                "--http-max-input-size to increase the limit.",
                                g->consumed, name, byte_size, g->max_input_size);
    g->consumed += byte_size;
    int64_t shape[64];
    size_t rank = 0;
    if ((err = fit_shape(name, json_object_get(input, "shape"), n, shape, &rank))) return err;
    if (dt == NEREID_TYPE_FP16 || dt == NEREID_TYPE_BF16)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "receiving %s data via JSON is not supported. Please use the "
                                "binary data format for input %s",
                                nereid_datatype_name(dt), name);
    char *out = buffers_alloc(g->bufs, byte_size);
    if (!out) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory for input '%s'", name);
    fill_t f = {.input = name,
                .dt = dt,
                .out = out,
                .es = dt == NEREID_TYPE_BYTES ? 0 : nereid_datatype_byte_size(dt),
                .n_max = n};
    if ((err = fill_value(&f, v, 0))) return err;
    if (dt != NEREID_TYPE_BYTES && f.n_seen != n)
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "Failed to parse 'data' field: shape does not match true shape");
    return nereid_request_add_input(g->req, name, dt, shape, rank, out, byte_size);
}

static nereid_error_t *convert_members(gen_ctx_t *g, const jv_t *obj, bool top)
{
    for (const jv_t *m = obj->v.child; m; m = m->next) {
        nereid_error_t *err;
        const json_t *input = find_input(g, m->key);
        if (top && !strcmp(m->key, "parameters")) {
            /* The reserved nested schema: its members map the same way. */
            if (input)
                return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                        "Keyword 'parameters' for nested schema also given as "
                                        "input tensor name");
            if (m->type != JV_OBJECT)
                return nereid_error_new(NEREID_ERROR_INTERNAL,
                                        "Expected JSON object for keyword: 'parameters': "
                                        "attempt to access JSON non-object as object");
            if ((err = convert_members(g, m, false))) {
                nereid_error_t *wrapped =
                    nereid_error_new(nereid_error_code(err), "Converting keyword: '%s': %s", m->key,
                                     nereid_error_message(err));
                nereid_error_free(err);
                return wrapped;
            }
            continue;
        }
        err = input ? add_tensor(g, input, m) : set_parameter(g->req, m);
        if (err) return err;
    }
    return NULL;
}

nereid_error_t *generate_request_build(nereid_server_t *core, const char *model, int64_t version,
                                       const char *text, size_t len, size_t max_input_size,
                                       nereid_request_t **req_out, generate_buffers_t *bufs)
{
    *req_out = NULL;
    char *meta_text = NULL;
    nereid_error_t *err = nereid_server_model_metadata(core, model, version, &meta_text);
    if (err) return err;
    json_t *meta = json_loads(meta_text, 0, NULL);
    free(meta_text);
    if (!meta) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    gen_ctx_t g = {
        .inputs = json_object_get(meta, "inputs"), .bufs = bufs, .max_input_size = max_input_size};
    jarena_t arena;
    jarena_init(&arena);
    jv_t *root = NULL;
    if ((err = nereid_request_new(core, model, version, &g.req))) goto done;
    /* An empty body is an empty request (Triton's EVRequestToJsonAllowsEmpty). */
    if (len > 0 && (err = json_reader_parse(text, len, &arena, &root))) goto done;
    if (root && root->type != JV_OBJECT) {
        err = nereid_error_new(NEREID_ERROR_INTERNAL,
                               "failed to parse the request JSON buffer: the generate request "
                               "must be a JSON object");
        goto done;
    }
    const jv_t *id = root ? jv_get(root, "id") : NULL;
    if (id && id->type != JV_STRING) {
        err = nereid_error_new(NEREID_ERROR_INTERNAL,
                               "Unable to parse 'id': attempt to access JSON non-string as string");
        goto done;
    }
    if (id && (err = nereid_request_set_id(g.req, id->v.s))) goto done;
    if (root) err = convert_members(&g, root, true);
done:
    jarena_free(&arena);
    json_decref(meta);
    if (err) {
        if (g.req) nereid_request_free(g.req);
        generate_buffers_free(bufs);
        return err;
    }
    *req_out = g.req;
    return NULL;
}

/* ---- Response ------------------------------------------------------------- */

typedef struct member {
    const char *key;
    const char *text; /* a string value (reserved members) */
    size_t output;    /* else this output */
} member_t;

static int member_cmp(const void *a, const void *b)
{
    return strcmp(((const member_t *)a)->key, ((const member_t *)b)->key);
}

int generate_error_json(const char *message, sbuf_t *out)
{
    return sbuf_append_str(out, "{\"error\":") ||
                   sbuf_append_json_string(out, message, strlen(message)) ||
                   sbuf_append_str(out, "}")
               ? -1
               : 0;
}

nereid_error_t *generate_response_json(const nereid_response_t *resp, sbuf_t *out)
{
    size_t n_outputs = nereid_response_output_count(resp);
    member_t *m = calloc(n_outputs + 3, sizeof *m);
    if (!m) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    char version[24];
    snprintf(version, sizeof version, "%" PRId64, nereid_response_model_version(resp));
    const char *id = nereid_response_id(resp), *model = nereid_response_model_name(resp);
    size_t n = 0;
    if (id && id[0]) m[n++] = (member_t){"id", id, 0};
    m[n++] = (member_t){"model_name", model ? model : "", 0};
    m[n++] = (member_t){"model_version", version, 0};
    size_t n_reserved = n;
    for (size_t i = 0; i < n_outputs; i++) {
        const char *name;
        nereid_datatype_t dt;
        const int64_t *shape;
        size_t rank, byte_size;
        const void *data;
        void *userp;
        nereid_response_output(resp, i, &name, &dt, &shape, &rank, &data, &byte_size, &userp);
        bool taken = false; /* Triton's map keeps the reserved member */
        for (size_t k = 0; k < n_reserved; k++)
            taken |= !strcmp(m[k].key, name);
        if (!taken) m[n++] = (member_t){name, NULL, i};
    }
    qsort(m, n, sizeof *m, member_cmp);
    size_t start = out->len;
    nereid_error_t *err = NULL;
    sbuf_t data = {0};
    if (sbuf_append_str(out, "{")) goto oom;
    for (size_t k = 0; k < n; k++) {
        if ((k && sbuf_append_str(out, ",")) ||
            sbuf_append_json_string(out, m[k].key, strlen(m[k].key)) || sbuf_append_str(out, ":"))
            goto oom;
        if (m[k].text) {
            if (sbuf_append_json_string(out, m[k].text, strlen(m[k].text))) goto oom;
            continue;
        }
        const char *name;
        nereid_datatype_t dt;
        const int64_t *shape;
        size_t rank, byte_size;
        const void *bytes;
        void *userp;
        nereid_response_output(resp, m[k].output, &name, &dt, &shape, &rank, &bytes, &byte_size,
                               &userp);
        size_t count = 1;
        for (size_t d = 0; d < rank; d++)
            count *= shape[d] > 0 ? (size_t)shape[d] : 0;
        data.len = 0;
        if ((err = infer_reply_write_data(&data, dt, bytes, byte_size, name))) goto fail;
        /* One element: the value itself, not a one-element array. */
        bool scalar = count == 1 && data.len >= 2;
        if (sbuf_append(out, data.data + scalar, data.len - 2 * scalar)) goto oom;
    }
    if (sbuf_append_str(out, "}")) goto oom;
    free(data.data);
    free(m);
    return NULL;
oom:
    err = nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory building the response");
fail:
    free(data.data);
    free(m);
    out->len = start;
    if (out->data) out->data[start] = '\0';
    return err;
}
