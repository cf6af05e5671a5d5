/*
 * This file contains the conversion between Triton's gRPC inference messages
 * and Nereid requests/responses. Requests borrow the unpacked message's
 * memory; responses are written as protobuf by hand around the output
 * tensors so a large output is handed to gRPC by reference, not copied.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/infer_codec.h"

/* Outputs larger than this are sent from the response's own buffer. */
#define INLINE_OUTPUT_MAX 4096

/* ---- Requests ----------------------------------------------------------- */

void infer_scratch_free(infer_scratch_t *s)
{
    nereid_shm_use_finish(s->shm_use);
    nereid_shm_use_free(s->shm_use);
    s->shm_use = NULL;
    for (size_t i = 0; i < s->n_bufs; i++)
        free(s->bufs[i]);
    free(s->bufs);
    s->bufs = NULL;
    s->n_bufs = 0;
}

static void *scratch_alloc(infer_scratch_t *s, size_t n)
{
    void **bufs = realloc(s->bufs, (s->n_bufs + 1) * sizeof(*bufs));
    if (bufs == NULL) return NULL;
    s->bufs = bufs;
    void *p = malloc(n > 0 ? n : 1);
    if (p != NULL) s->bufs[s->n_bufs++] = p;
    return p;
}

Inference__ModelInferRequest *infer_codec_parse(const uint8_t *data, size_t len,
                                                nereid_error_t **err)
{
    Inference__ModelInferRequest *msg = inference__model_infer_request__unpack(NULL, len, data);
    *err = msg == NULL ? nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                          "failed to parse the ModelInferRequest message")
                       : NULL;
    return msg;
}

nereid_error_t *infer_codec_version(const char *s, int64_t *out)
{
    *out = -1;
    if (s == NULL || s[0] == '\0') return NULL;
    const char *p = s;
    while (isspace((unsigned char)*p))
        p++;
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (end == p || errno == ERANGE)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "failed to get model version from specified version string "
                                "'%s' (details: stol), version should be an integral value > 0",
                                s);
    if (v < 0)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "invalid model version specified '%s' , version should be an "
                                "integral value > 0",
                                s);
    *out = v;
    return NULL;
}

static Inference__InferParameter__ParameterChoiceCase param_case(const Inference__InferParameter *p)
{
    return p == NULL ? INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE__NOT_SET
                     : p->parameter_choice_case;
}

static nereid_error_t *apply_parameter(nereid_request_t *req, const char *key,
                                       const Inference__InferParameter *p)
{
    Inference__InferParameter__ParameterChoiceCase c = param_case(p);
    if (strcmp(key, "sequence_id") == 0) {
        if (c == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM) {
            nereid_request_set_correlation_id(req, (uint64_t)p->int64_param);
            return NULL;
        }
        if (c == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM)
            return nereid_request_set_correlation_id_string(req, p->string_param);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "invalid value type for 'sequence_id' parameter, expected "
                                "int64_param or string_param.");
    }
    if (strcmp(key, "sequence_start") == 0 || strcmp(key, "sequence_end") == 0) {
        if (c != INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "invalid value type for '%s' parameter, expected bool_param.",
                                    key);
        return NULL; /* applied together after the loop */
    }
    if (strcmp(key, "priority") == 0) {
        if (c == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM) {
            if (p->int64_param < 0)
                return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                        "invalid value for 'priority', expected value >= 0.");
            nereid_request_set_priority(req, (uint64_t)p->int64_param);
            return NULL;
        }
        if (c == INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_UINT64_PARAM) {
            nereid_request_set_priority(req, p->uint64_param);
            return NULL;
        }
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "invalid value type for 'priority' parameter, expected "
                                "int64_param or uint64_param.");
    }
    if (strcmp(key, "timeout") == 0) {
        if (c != INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "invalid value type for 'timeout' parameter, expected "
                                    "int64_param.");
        nereid_request_set_timeout_us(req, p->int64_param > 0 ? (uint64_t)p->int64_param : 0);
        return NULL;
    }
    if (strncmp(key, "triton_", 7) == 0) {
        if (strcmp(key, "triton_enable_empty_final_response") != 0)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "parameter keys starting with 'triton_' are reserved for "
                                    "Triton usage. Only the following keys starting with "
                                    "'triton_' are allowed: triton_enable_empty_final_response");
        if (c != INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "invalid value type for '%s' parameter, expected bool_param.",
                                    key);
        return NULL;
    }
    switch (c) {
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM:
        return nereid_request_set_parameter_int(req, key, p->int64_param);
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM:
        return nereid_request_set_parameter_bool(req, key, p->bool_param != 0);
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM:
        return nereid_request_set_parameter_string(req, key, p->string_param);
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM:
        return nereid_request_set_parameter_double(req, key, p->double_param);
    default:
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "invalid value type for '%s' parameter, expected int64_param, "
                                "bool_param, or string_param.",
                                key);
    }
}

/* Triton's check that one typed-contents field fits the declared type. */
static nereid_error_t *check_typed(const char *in, const char *model, nereid_datatype_t field_dt,
                                   nereid_datatype_t dt, bool have_data)
{
    if (have_data)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "unexpected explicit tensor data for input tensor '%s' for "
                                "model '%s', binary data was already supplied.",
                                in, model);
    if (field_dt != dt)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "unexpected explicit tensor data for input tensor '%s' for "
                                "model '%s' of type '%s', expected datatype '%s'",
                                in, model, nereid_datatype_name(field_dt),
                                nereid_datatype_name(dt));
    return NULL;
}

/* Narrows n 32-bit elements to width bytes each (little-endian low bytes). */
static void *narrow(infer_scratch_t *s, const void *src, size_t n, size_t width)
{
    uint8_t *dst = scratch_alloc(s, n * width);
    if (dst == NULL) return NULL;
    const uint32_t *v = src;
    for (size_t i = 0; i < n; i++) {
        uint32_t x = v[i];
        memcpy(dst + i * width, &x, width);
    }
    return dst;
}

#define OOM() nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory")

/* Finds the typed-contents data of input in (Triton's field order). */
static nereid_error_t *typed_data(const Inference__ModelInferRequest__InferInputTensor *in,
                                  const char *model, infer_scratch_t *s, const void **data,
                                  size_t *size)
{
    const Inference__InferTensorContents *ct = in->contents;
    nereid_datatype_t dt = nereid_datatype_from_name(in->datatype);
    size_t elem = nereid_datatype_byte_size(dt);
    nereid_error_t *err;
    bool have = false;
    *data = NULL;
    *size = 0;
#define TAKE(field_dt, ptr, n_elems)                                                               \
    do {                                                                                           \
        if ((err = check_typed(in->name, model, field_dt, dt, have)) != NULL) return err;          \
        *data = (ptr);                                                                             \
        *size = (n_elems)*elem;                                                                    \
        have = *size != 0;                                                                         \
    } while (0)
    if (ct->n_bool_contents > 0) {
        uint8_t *b = scratch_alloc(s, ct->n_bool_contents);
        if (b == NULL) return OOM();
        for (size_t i = 0; i < ct->n_bool_contents; i++)
            b[i] = ct->bool_contents[i] ? 1 : 0;
        TAKE(NEREID_TYPE_BOOL, b, ct->n_bool_contents);
    }
    if (ct->n_int_contents > 0) {
        nereid_datatype_t f = dt == NEREID_TYPE_INT8    ? NEREID_TYPE_INT8
                              : dt == NEREID_TYPE_INT16 ? NEREID_TYPE_INT16
                                                        : NEREID_TYPE_INT32;
        const void *p = ct->int_contents;
        if ((err = check_typed(in->name, model, f, dt, have)) != NULL) return err;
        if (f != NEREID_TYPE_INT32 && (p = narrow(s, p, ct->n_int_contents, elem)) == NULL)
            return OOM();
        TAKE(f, p, ct->n_int_contents);
    }
    if (ct->n_int64_contents > 0) TAKE(NEREID_TYPE_INT64, ct->int64_contents, ct->n_int64_contents);
    if (ct->n_uint_contents > 0) {
        nereid_datatype_t f = dt == NEREID_TYPE_UINT8    ? NEREID_TYPE_UINT8
                              : dt == NEREID_TYPE_UINT16 ? NEREID_TYPE_UINT16
                                                         : NEREID_TYPE_UINT32;
        const void *p = ct->uint_contents;
        if ((err = check_typed(in->name, model, f, dt, have)) != NULL) return err;
        if (f != NEREID_TYPE_UINT32 && (p = narrow(s, p, ct->n_uint_contents, elem)) == NULL)
            return OOM();
        TAKE(f, p, ct->n_uint_contents);
    }
    if (ct->n_uint64_contents > 0)
        TAKE(NEREID_TYPE_UINT64, ct->uint64_contents, ct->n_uint64_contents);
    if (ct->n_fp32_contents > 0) TAKE(NEREID_TYPE_FP32, ct->fp32_contents, ct->n_fp32_contents);
    if (ct->n_fp64_contents > 0) TAKE(NEREID_TYPE_FP64, ct->fp64_contents, ct->n_fp64_contents);
    if (ct->n_bytes_contents > 0) {
        if ((err = check_typed(in->name, model, NEREID_TYPE_BYTES, dt, have)) != NULL) return err;
        size_t total = 0;
        for (size_t i = 0; i < ct->n_bytes_contents; i++)
            total += 4 + ct->bytes_contents[i].len;
        uint8_t *b = scratch_alloc(s, total);
        if (b == NULL) return OOM();
        size_t off = 0;
        for (size_t i = 0; i < ct->n_bytes_contents; i++) {
            uint32_t n = (uint32_t)ct->bytes_contents[i].len;
            memcpy(b + off, &n, 4);
            if (n > 0) memcpy(b + off + 4, ct->bytes_contents[i].data, n);
            off += 4 + n;
        }
        *data = b;
        *size = total;
    }
#undef TAKE
    return NULL;
}

static bool has_param(Inference__ModelInferRequest__InferInputTensor__ParametersEntry **params,
                      size_t n, const char *key, const Inference__InferParameter **value)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(params[i]->key, key) == 0) {
            *value = params[i]->value;
            return true;
        }
    return false;
}

/* Triton's ParseSharedMemoryParams: *region is NULL when the tensor is not
 * in shared memory. */
static nereid_error_t *
shm_params(const char *tensor, Inference__ModelInferRequest__InferInputTensor__ParametersEntry **p,
           size_t n, const char **region, int64_t *offset, int64_t *byte_size)
{
    const Inference__InferParameter *r = NULL, *o = NULL, *b = NULL;
    *region = NULL;
    *offset = *byte_size = 0;
    bool has_r = has_param(p, n, "shared_memory_region", &r);
    bool has_o = has_param(p, n, "shared_memory_offset", &o);
    bool has_b = has_param(p, n, "shared_memory_byte_size", &b);
    static const char *const keys[3] = {"shared_memory_region", "shared_memory_offset",
                                        "shared_memory_byte_size"};
    static const char *const want[3] = {"string_param", "int64_param", "int64_param"};
    const Inference__InferParameter *v[3] = {r, o, b};
    bool has[3] = {has_r, has_o, has_b};
    for (int k = 0; k < 3; k++) {
        if (!has[k]) continue;
        if (k > 0 && !has_r)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "'%s' can not be specified without 'shared_memory_region' "
                                    "parameter for tensor '%s'",
                                    keys[k], tensor);
        Inference__InferParameter__ParameterChoiceCase c =
            k == 0 ? INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM
                   : INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
        if (param_case(v[k]) != c)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "invalid value type for '%s' parameter for tensor '%s', "
                                    "expected %s.",
                                    keys[k], tensor, want[k]);
    }
    if (!has_r) return NULL;
    if (!has_b)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "'shared_memory_byte_size' must be specified along with "
                                "'shared_memory_region' parameter for tensor '%s'",
                                tensor);
    *region = r->string_param;
    *offset = has_o ? o->int64_param : 0;
    *byte_size = b->int64_param;
    return NULL;
}

/* buffer_userp of an output the allocator placed in shared memory. */
static char shm_output_marker;

static nereid_error_t *shm_alloc(void *userp, const char *name, nereid_datatype_t dt,
                                 const int64_t *shape, size_t rank, size_t byte_size, void **buffer,
                                 void **buffer_userp)
{
    (void)shape, (void)rank;
    infer_scratch_t *s = userp;
    nereid_error_t *err;
    *buffer_userp = &shm_output_marker;
    if (nereid_shm_use_alloc(s->shm_use, name, dt, byte_size, buffer, &err)) return err;
    *buffer_userp = NULL;
    *buffer = malloc(byte_size > 0 ? byte_size : 1);
    return *buffer != NULL ? NULL : OOM();
}

static void shm_release(void *userp, void *buffer, void *buffer_userp, size_t byte_size)
{
    (void)userp, (void)byte_size;
    if (buffer_userp != &shm_output_marker) free(buffer);
}

const nereid_response_allocator_t *infer_codec_allocator(infer_scratch_t *s,
                                                         nereid_response_allocator_t *storage)
{
    if (!s->shm_outputs) return NULL;
    *storage = (nereid_response_allocator_t){shm_alloc, shm_release, s};
    return storage;
}

static nereid_error_t *build(nereid_request_t *req, const Inference__ModelInferRequest *m,
                             infer_scratch_t *scratch)
{
    nereid_error_t *err;
    if (m->id[0] != '\0' && (err = nereid_request_set_id(req, m->id)) != NULL) return err;
    bool start = false, end = false;
    for (size_t i = 0; i < m->n_parameters; i++) {
        const char *key = m->parameters[i]->key;
        const Inference__InferParameter *v = m->parameters[i]->value;
        if ((err = apply_parameter(req, key, v)) != NULL) return err;
        if (strcmp(key, "sequence_start") == 0)
            start = v->bool_param != 0;
        else if (strcmp(key, "sequence_end") == 0)
            end = v->bool_param != 0;
    }
    nereid_request_set_sequence_flags(req, start, end);

    size_t raw_index = 0;
    for (size_t i = 0; i < m->n_inputs; i++) {
        const Inference__ModelInferRequest__InferInputTensor *in = m->inputs[i];
        const char *region;
        int64_t offset, byte_size;
        const void *data = NULL;
        size_t size = 0;
        err = shm_params(in->name, in->parameters, in->n_parameters, &region, &offset, &byte_size);
        if (err != NULL) return err;
        if (region != NULL) {
            if (in->contents != NULL)
                return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                        "unexpected 'content' provided when using shared memory "
                                        "for input tensor '%s' for model '%s'",
                                        in->name, m->model_name);
            err = nereid_shm_use_input(&scratch->shm_use, scratch->shm, region, (uint64_t)offset,
                                       (uint64_t)byte_size, nereid_datatype_from_name(in->datatype),
                                       &data);
            if (err != NULL) return err;
            size = (size_t)byte_size;
        } else if (in->contents != NULL && m->n_raw_input_contents > 0) {
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "contents field must not be specified when using "
                                    "raw_input_contents for '%s' for model '%s'",
                                    in->name, m->model_name);
        } else if (in->contents != NULL) {
            if ((err = typed_data(in, m->model_name, scratch, &data, &size)) != NULL) return err;
        } else if (raw_index < m->n_raw_input_contents) {
            data = m->raw_input_contents[raw_index].data;
            size = m->raw_input_contents[raw_index].len;
            raw_index++;
        } else {
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "unable to find data for input tensor '%s' for model '%s' "
                                    "in request.",
                                    in->name, m->model_name);
        }
        err = nereid_request_add_input(req, in->name, nereid_datatype_from_name(in->datatype),
                                       in->shape, in->n_shape, data, size);
        if (err != NULL) return err;
    }
    /* Triton's HTTP frontend refuses leftover binary data with this text; its
     * gRPC frontend ignores leftover raw_input_contents. Refused here too, so
     * a client's misaligned raw buffers never pass silently. */
    if (raw_index != m->n_raw_input_contents)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "unexpected additional input data for model '%s'", m->model_name);

    for (size_t i = 0; i < m->n_outputs; i++) {
        const Inference__ModelInferRequest__InferRequestedOutputTensor *out = m->outputs[i];
        const Inference__InferParameter *v;
        uint32_t class_count = 0;
        /* same entry layout as the input parameters map */
        Inference__ModelInferRequest__InferInputTensor__ParametersEntry **params =
            (Inference__ModelInferRequest__InferInputTensor__ParametersEntry **)out->parameters;
        const char *region;
        int64_t offset, byte_size;
        err = shm_params(out->name, params, out->n_parameters, &region, &offset, &byte_size);
        if (err != NULL) return err;
        if (region != NULL && has_param(params, out->n_parameters, "classification", &v))
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "output can't set both 'shared_memory_region' and "
                                    "'classification'");
        if (region != NULL) {
            err = nereid_shm_use_output(&scratch->shm_use, scratch->shm, out->name, region,
                                        (uint64_t)offset, (uint64_t)byte_size);
            if (err != NULL) return err;
            scratch->shm_outputs = true;
        }
        if (has_param(params, out->n_parameters, "classification", &v)) {
            if (param_case(v) != INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM)
                return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                        "invalid value type for 'classification' parameter, "
                                        "expected int64_param.");
            if (v->int64_param <= 0 || v->int64_param > UINT32_MAX)
                return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                        "invalid value for 'classification' parameter, expected "
                                        "value > 0.");
            class_count = (uint32_t)v->int64_param;
        }
        if ((err = nereid_request_add_requested_output(req, out->name, class_count)) != NULL)
            return err;
    }
    return NULL;
}

nereid_error_t *infer_codec_request(nereid_server_t *server,
                                    const Inference__ModelInferRequest *msg,
                                    infer_scratch_t *scratch, nereid_request_t **out)
{
    *out = NULL;
    int64_t version;
    nereid_error_t *err = infer_codec_version(msg->model_version, &version);
    if (err != NULL) return err;
    nereid_request_t *req;
    if ((err = nereid_request_new(server, msg->model_name, version, &req)) != NULL) return err;
    if ((err = build(req, msg, scratch)) != NULL) {
        nereid_request_free(req);
        return err;
    }
    *out = req;
    return NULL;
}

/* ---- Responses ---------------------------------------------------------- */

/* Keeps a response (and classification buffers) alive while gRPC still
 * holds slices that point into it. */
typedef struct response_hold {
    atomic_int refs;
    nereid_response_t *resp;
    char **extra;
    size_t n_extra;
} response_hold_t;

static void hold_release(void *p)
{
    response_hold_t *h = p;
    if (atomic_fetch_sub(&h->refs, 1) != 1) return;
    for (size_t i = 0; i < h->n_extra; i++)
        free(h->extra[i]);
    free(h->extra);
    nereid_response_free(h->resp);
    free(h);
}

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

typedef struct out_view {
    const void *data;
    size_t size;
} out_view_t;

/* What the message points into while it is packed. */
typedef struct codec_scratch {
    Inference__ModelInferResponse__InferOutputTensor *outs, **out_ptrs;
    out_view_t *views;
    int64_t *class_shapes; /* 2 per output: a classification's shape */
    Inference__InferParameter *param_values;
    Inference__ModelInferResponse__ParametersEntry *param_entries, **param_ptrs;
} codec_scratch_t;

static void scratch_free(codec_scratch_t *s)
{
    free(s->param_values);
    free(s->param_entries);
    free(s->param_ptrs);
    free(s->outs);
    free(s->out_ptrs);
    free(s->views);
    free(s->class_shapes);
}

static void fill_parameter(Inference__InferParameter *pv, int ptype, const void *value)
{
    if (ptype == 0) {
        pv->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM;
        pv->string_param = (char *)value;
    } else if (ptype == 1) {
        pv->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
        memcpy(&pv->int64_param, value, sizeof(pv->int64_param));
    } else if (ptype == 2) {
        pv->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
        pv->bool_param = *(const bool *)value;
    } else {
        pv->parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM;
        memcpy(&pv->double_param, value, sizeof(pv->double_param));
    }
}

/* The backend's response parameters, then the stream's final flag
 * (final_entry, NULL outside a stream). */
static nereid_error_t *fill_parameters(Inference__ModelInferResponse *msg, nereid_response_t *resp,
                                       Inference__ModelInferResponse__ParametersEntry *final_entry,
                                       codec_scratch_t *s)
{
    size_t n_params = nereid_response_parameter_count(resp);
    s->param_values = calloc(n_params + 1, sizeof(*s->param_values));
    s->param_entries = calloc(n_params + 1, sizeof(*s->param_entries));
    s->param_ptrs = calloc(n_params + 1, sizeof(*s->param_ptrs));
    if (s->param_values == NULL || s->param_entries == NULL || s->param_ptrs == NULL) return OOM();
    for (size_t i = 0; i < n_params; i++) {
        Inference__InferParameter pv = INFERENCE__INFER_PARAMETER__INIT;
        Inference__ModelInferResponse__ParametersEntry pe =
            INFERENCE__MODEL_INFER_RESPONSE__PARAMETERS_ENTRY__INIT;
        const char *pname;
        int ptype;
        const void *value;
        nereid_response_parameter(resp, i, &pname, &ptype, &value);
        fill_parameter(&pv, ptype, value);
        s->param_values[i] = pv;
        pe.key = (char *)pname;
        pe.value = &s->param_values[i];
        s->param_entries[i] = pe;
        s->param_ptrs[i] = &s->param_entries[i];
    }
    if (final_entry != NULL) s->param_ptrs[n_params++] = final_entry;
    msg->n_parameters = n_params;
    msg->parameters = n_params ? s->param_ptrs : NULL;
    return NULL;
}

/* The outputs' metadata into the message and their bytes into s->views;
 * a classification's strings are kept alive by the hold. */
static nereid_error_t *fill_outputs(Inference__ModelInferResponse *msg, response_hold_t *hold,
                                    size_t n_out, codec_scratch_t *s)
{
    for (size_t i = 0; i < n_out; i++) {
        Inference__ModelInferResponse__InferOutputTensor init =
            INFERENCE__MODEL_INFER_RESPONSE__INFER_OUTPUT_TENSOR__INIT;
        const char *oname;
        nereid_datatype_t dt;
        const int64_t *shape;
        size_t rank;
        const void *data;
        size_t size;
        void *buffer_userp;
        nereid_response_output(hold->resp, i, &oname, &dt, &shape, &rank, &data, &size,
                               &buffer_userp);
        Inference__ModelInferResponse__InferOutputTensor *out = &s->outs[i];
        *out = init;
        out->name = (char *)oname;
        out->datatype = (char *)nereid_datatype_name(dt);
        out->shape = (int64_t *)shape;
        out->n_shape = rank;
        uint32_t k = nereid_response_output_class_count(hold->resp, i);
        if (k > 0) {
            char *bytes;
            size_t n_bytes, class_rank;
            nereid_error_t *err = nereid_response_classify(hold->resp, i, k, &bytes, &n_bytes,
                                                           &s->class_shapes[2 * i], &class_rank);
            if (err != NULL) return err;
            hold->extra[hold->n_extra++] = bytes;
            out->datatype = (char *)nereid_datatype_name(NEREID_TYPE_BYTES);
            out->shape = &s->class_shapes[2 * i];
            out->n_shape = class_rank;
            data = bytes;
            size = n_bytes;
        }
        s->views[i].data = data;
        s->views[i].size = buffer_userp == &shm_output_marker ? 0 : size; /* in shared memory */
        s->out_ptrs[i] = out;
    }
    msg->n_outputs = n_out;
    msg->outputs = s->out_ptrs;
    return NULL;
}

/* Layout: [stream prefix][header][tag len data]...; small outputs are
 * copied into one block, large ones sent by reference (the hold keeps the
 * response alive until gRPC lets go of their slices). */
static grpc_byte_buffer *pack_response(const Inference__ModelInferResponse *msg,
                                       const out_view_t *views, size_t n_out, response_hold_t *hold,
                                       bool stream, nereid_error_t **err)
{
    size_t head_len = inference__model_infer_response__get_packed_size(msg);
    size_t inner_len = head_len, max_inline = head_len + 11;
    for (size_t i = 0; i < n_out; i++) {
        size_t entry = 1 + varint_len(views[i].size);
        inner_len += entry + views[i].size;
        max_inline += entry + (views[i].size <= INLINE_OUTPUT_MAX ? views[i].size : 0);
    }
    grpc_slice *slices = calloc(2 * n_out + 1, sizeof(*slices));
    if (slices == NULL) {
        *err = OOM();
        return NULL;
    }
    size_t n_slices = 0;
    grpc_slice block = grpc_slice_malloc(max_inline);
    uint8_t *base = GRPC_SLICE_START_PTR(block);
    size_t pos = 0, seg = 0;
    if (stream) {
        base[pos++] = 0x12; /* ModelStreamInferResponse.infer_response */
        pos += put_varint(base + pos, inner_len);
    }
    pos += inference__model_infer_response__pack(msg, base + pos);
    for (size_t i = 0; i < n_out; i++) {
        base[pos++] = 0x32; /* ModelInferResponse.raw_output_contents */
        pos += put_varint(base + pos, views[i].size);
        if (views[i].size <= INLINE_OUTPUT_MAX) {
            if (views[i].size > 0) memcpy(base + pos, views[i].data, views[i].size);
            pos += views[i].size;
            continue;
        }
        slices[n_slices++] = grpc_slice_sub(block, seg, pos);
        seg = pos;
        atomic_fetch_add(&hold->refs, 1);
        slices[n_slices++] =
            grpc_slice_new_with_user_data((void *)views[i].data, views[i].size, hold_release, hold);
    }
    if (pos > seg || n_slices == 0) slices[n_slices++] = grpc_slice_sub(block, seg, pos);
    grpc_slice_unref(block);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(slices, n_slices);
    for (size_t i = 0; i < n_slices; i++)
        grpc_slice_unref(slices[i]);
    free(slices);
    return bb;
}

static grpc_byte_buffer *codec_response(nereid_response_t *resp, bool stream, bool final,
                                        nereid_error_t **err)
{
    *err = NULL;
    size_t n_out = nereid_response_output_count(resp);
    response_hold_t *hold = calloc(1, sizeof(*hold));
    if (hold == NULL) {
        nereid_response_free(resp);
        *err = OOM();
        return NULL;
    }
    atomic_init(&hold->refs, 1);
    hold->resp = resp;
    hold->extra = calloc(n_out + 1, sizeof(char *));
    codec_scratch_t s = {
        .outs = calloc(n_out + 1, sizeof(*s.outs)),
        .out_ptrs = calloc(n_out + 1, sizeof(*s.out_ptrs)),
        .views = calloc(n_out + 1, sizeof(*s.views)),
        .class_shapes = calloc(2 * (n_out + 1), sizeof(*s.class_shapes)),
    };
    grpc_byte_buffer *bb = NULL;
    if (hold->extra == NULL || s.outs == NULL || s.out_ptrs == NULL || s.views == NULL ||
        s.class_shapes == NULL) {
        *err = OOM();
        goto done;
    }

    Inference__ModelInferResponse msg = INFERENCE__MODEL_INFER_RESPONSE__INIT;
    char version[32];
    snprintf(version, sizeof(version), "%" PRId64, nereid_response_model_version(hold->resp));
    const char *name = nereid_response_model_name(hold->resp);
    const char *id = nereid_response_id(hold->resp);
    msg.model_name = (char *)(name != NULL ? name : "");
    msg.model_version = version;
    msg.id = (char *)(id != NULL ? id : "");

    Inference__InferParameter final_value = INFERENCE__INFER_PARAMETER__INIT;
    final_value.parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
    final_value.bool_param = final;
    Inference__ModelInferResponse__ParametersEntry final_entry =
        INFERENCE__MODEL_INFER_RESPONSE__PARAMETERS_ENTRY__INIT;
    final_entry.key = "triton_final_response";
    final_entry.value = &final_value;
    if ((*err = fill_parameters(&msg, hold->resp, stream ? &final_entry : NULL, &s)) != NULL ||
        (*err = fill_outputs(&msg, hold, n_out, &s)) != NULL)
        goto done;
    bb = pack_response(&msg, s.views, n_out, hold, stream, err);

done:
    hold_release(hold);
    scratch_free(&s);
    return bb;
}

grpc_byte_buffer *infer_codec_response(nereid_response_t *resp, bool stream, nereid_error_t **err)
{
    return codec_response(resp, stream, true, err);
}

grpc_byte_buffer *infer_codec_stream_response(nereid_response_t *resp, bool final,
                                              nereid_error_t **err)
{
    return codec_response(resp, true, final, err);
}

grpc_byte_buffer *infer_codec_stream_error(const char *message, const char *id, const char *model,
                                           const char *version, int final)
{
    Inference__ModelStreamInferResponse msg = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
    Inference__ModelInferResponse inner = INFERENCE__MODEL_INFER_RESPONSE__INIT;
    Inference__InferParameter final_value = INFERENCE__INFER_PARAMETER__INIT;
    Inference__ModelInferResponse__ParametersEntry final_entry =
        INFERENCE__MODEL_INFER_RESPONSE__PARAMETERS_ENTRY__INIT;
    Inference__ModelInferResponse__ParametersEntry *entries[1] = {&final_entry};
    msg.error_message = (char *)(message != NULL ? message : "");
    inner.id = (char *)(id != NULL ? id : "");
    inner.model_name = (char *)(model != NULL ? model : "");
    inner.model_version = (char *)(version != NULL ? version : "");
    if (final >= 0) {
        final_value.parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
        final_value.bool_param = final > 0;
        final_entry.key = "triton_final_response";
        final_entry.value = &final_value;
        inner.n_parameters = 1;
        inner.parameters = entries;
    }
    msg.infer_response = &inner;
    size_t n = inference__model_stream_infer_response__get_packed_size(&msg);
    grpc_slice s = grpc_slice_malloc(n);
    inference__model_stream_infer_response__pack(&msg, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}
