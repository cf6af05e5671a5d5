/*
 * This file contains the model configuration's JSON codec, generic over
 * protobuf-c descriptors. Output matches what Triton's GET .../config
 * returns: protobuf's JSON printer with original (snake_case) field names,
 * every primitive field printed, fields in .proto declaration order, enums
 * by name, unset sub-messages omitted, maps as objects, compact; 64-bit
 * integers are JSON strings except the fields Triton rewrites to numbers.
 * Input accepts that form and the proto3 JSON mapping (lowerCamel names,
 * enum names or numbers, integers as numbers or strings).
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "config/config_internal.h"

/* Declaration order of the messages whose fields are not declared in
 * field-number order (protobuf-c sorts descriptors by number; protobuf's
 * JSON printer follows the .proto). test_config_json checks this table
 * against proto/model_config.proto. */
static const struct {
    const char *message;
    const char *fields;
} k_decl_order[] = {
    {"inference.ModelInstanceGroup",
     "name kind count rate_limiter gpus secondary_devices profile passive host_policy"},
    {"inference.ModelOutput",
     "name data_type dims reshape label_filename is_shape_tensor is_non_linear_format_io"},
    {"inference.ModelSequenceBatching.Control",
     "kind int32_false_true fp32_false_true bool_false_true data_type"},
    {"inference.ModelSequenceBatching",
     "direct oldest max_sequence_idle_microseconds control_input state iterative_sequence"},
    {"inference.ModelConfig",
     "name platform backend runtime version_policy max_batch_size input output batch_input "
     "batch_output optimization dynamic_batching sequence_batching ensemble_scheduling "
     "instance_group default_model_filename cc_model_filenames metric_tags parameters "
     "model_warmup model_operations model_transaction_policy model_repository_agents "
     "response_cache model_metrics"},
};

/* 64-bit fields that Triton prints as JSON numbers (paths as Triton names
 * them; map values appear as "::value"). */
static const char *const k_int64_as_number[] = {
    "ModelConfig::input::dims",
    "ModelConfig::input::reshape::shape",
    "ModelConfig::output::dims",
    "ModelConfig::output::reshape::shape",
    "ModelConfig::version_policy::specific::versions",
    "ModelConfig::dynamic_batching::max_queue_delay_microseconds",
    "ModelConfig::dynamic_batching::priority_levels",
    "ModelConfig::dynamic_batching::default_priority_level",
    "ModelConfig::dynamic_batching::default_queue_policy::default_timeout_microseconds",
    "ModelConfig::dynamic_batching::priority_queue_policy::value::default_timeout_microseconds",
    "ModelConfig::sequence_batching::max_sequence_idle_microseconds",
    "ModelConfig::sequence_batching::direct::max_queue_delay_microseconds",
    "ModelConfig::sequence_batching::oldest::max_queue_delay_microseconds",
    "ModelConfig::sequence_batching::state::dims",
    "ModelConfig::ensemble_scheduling::step::model_version",
    "ModelConfig::model_warmup::inputs::value::dims",
    "ModelConfig::optimization::cuda::graph_spec::input::value::dim",
    "ModelConfig::optimization::cuda::graph_spec::graph_lower_bound::input::value::dim",
    "ModelConfig::instance_group::secondary_devices::device_id",
};

/* Fills order[] with d's fields in declaration order; returns the count. */
static unsigned field_order(const ProtobufCMessageDescriptor *d,
                            const ProtobufCFieldDescriptor **order)
{
    for (size_t i = 0; i < sizeof k_decl_order / sizeof k_decl_order[0]; i++) {
        if (strcmp(k_decl_order[i].message, d->name) != 0) continue;
        unsigned n = 0;
        const char *s = k_decl_order[i].fields;
        while (*s) {
            const char *e = strchr(s, ' ');
            size_t len = e ? (size_t)(e - s) : strlen(s);
            const ProtobufCFieldDescriptor *f = cfg_field_by_name(d, s, len);
            if (f && n < d->n_fields) order[n++] = f;
            s += len;
            while (*s == ' ')
                s++;
        }
        if (n == d->n_fields) return n;
        break; /* table out of date: fall back to number order */
    }
    for (unsigned i = 0; i < d->n_fields; i++)
        order[i] = &d->fields[i];
    return d->n_fields;
}

/* Exposed for the unit test that checks k_decl_order against the .proto. */
unsigned cfg_json_field_order(const ProtobufCMessageDescriptor *d,
                              const ProtobufCFieldDescriptor **order);
unsigned cfg_json_field_order(const ProtobufCMessageDescriptor *d,
                              const ProtobufCFieldDescriptor **order)
{
    return field_order(d, order);
}

static bool int64_as_number(const char *path)
{
    for (size_t i = 0; i < sizeof k_int64_as_number / sizeof k_int64_as_number[0]; i++)
        if (strcmp(path, k_int64_as_number[i]) == 0) return true;
    return false;
}

/* ---- output ---- */

static void put_json_string(cfg_buf_t *b, const char *s)
{
    cfg_buf_puts(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"':
            cfg_buf_puts(b, "\\\"");
            break;
        case '\\':
            cfg_buf_puts(b, "\\\\");
            break;
        case '\b':
            cfg_buf_puts(b, "\\b");
            break;
        case '\f':
            cfg_buf_puts(b, "\\f");
            break;
        case '\n':
            cfg_buf_puts(b, "\\n");
            break;
        case '\r':
            cfg_buf_puts(b, "\\r");
            break;
        case '\t':
            cfg_buf_puts(b, "\\t");
            break;
        default:
            if (*p < 0x20)
                cfg_buf_printf(b, "\\u%04X", *p);
            else
                cfg_buf_append(b, (const char *)p, 1);
        }
    }
    cfg_buf_puts(b, "\"");
}

/* Prints a float or double the way protobuf prints it (shortest text that
 * reads back) after Triton's re-serialization: integral values print as
 * integers, NaN and infinities as strings. */
static void put_real(cfg_buf_t *b, double v, bool is_float)
{
    if (isnan(v)) {
        cfg_buf_puts(b, "\"NaN\"");
        return;
    }
    if (isinf(v)) {
        cfg_buf_puts(b, v > 0 ? "\"Infinity\"" : "\"-Infinity\"");
        return;
    }
    char tmp[64];
    int digits = is_float ? FLT_DIG : DBL_DIG;
    snprintf(tmp, sizeof tmp, "%.*g", digits, v);
    bool round_trips = is_float ? strtof(tmp, NULL) == (float)v : strtod(tmp, NULL) == v;
    if (!round_trips) snprintf(tmp, sizeof tmp, "%.*g", digits + (is_float ? 3 : 2), v);
    if (strchr(tmp, 'e')) {
        /* Triton re-parses protobuf's "1e+06" as a double and prints it in
         * plain form. */
        double d = strtod(tmp, NULL);
        if (fabs(d) < 1e21 && d == floor(d))
            snprintf(tmp, sizeof tmp, "%.0f.0", d);
        else
            snprintf(tmp, sizeof tmp, "%.17g", d);
    }
    cfg_buf_puts(b, tmp);
}

static void put_message(cfg_buf_t *b, const ProtobufCMessage *m, char *path, size_t path_len,
                        size_t path_cap);

static void put_value(cfg_buf_t *b, const ProtobufCFieldDescriptor *f, const void *val,
                      const char *path)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        cfg_buf_printf(b, "%d", *(const int32_t *)val);
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        cfg_buf_printf(b, "%u", *(const uint32_t *)val);
        break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        cfg_buf_printf(b, int64_as_number(path) ? "%lld" : "\"%lld\"",
                       (long long)*(const int64_t *)val);
        break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        cfg_buf_printf(b, int64_as_number(path) ? "%llu" : "\"%llu\"",
                       (unsigned long long)*(const uint64_t *)val);
        break;
    case PROTOBUF_C_TYPE_FLOAT:
        put_real(b, *(const float *)val, true);
        break;
    case PROTOBUF_C_TYPE_DOUBLE:
        put_real(b, *(const double *)val, false);
        break;
    case PROTOBUF_C_TYPE_BOOL:
        cfg_buf_puts(b, *(const protobuf_c_boolean *)val ? "true" : "false");
        break;
    case PROTOBUF_C_TYPE_ENUM: {
        int32_t v = *(const int32_t *)val;
        const ProtobufCEnumValue *ev =
            protobuf_c_enum_descriptor_get_value((const ProtobufCEnumDescriptor *)f->descriptor, v);
        if (ev)
            put_json_string(b, ev->name);
        else
            cfg_buf_printf(b, "%d", v);
        break;
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)val;
        put_json_string(b, s ? s : "");
        break;
    }
    case PROTOBUF_C_TYPE_BYTES:
        /* model_config.proto has no bytes fields */
        cfg_buf_puts(b, "\"\"");
        break;
    case PROTOBUF_C_TYPE_MESSAGE:
        break;
    }
}

/* Prints a map key as a JSON object key. */
static void put_map_key(cfg_buf_t *b, const ProtobufCFieldDescriptor *kf, const void *val)
{
    if (kf->type == PROTOBUF_C_TYPE_STRING) {
        const char *s = *(char *const *)val;
        put_json_string(b, s ? s : "");
        return;
    }
    char tmp[32];
    switch (kf->type) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        snprintf(tmp, sizeof tmp, "%lld", (long long)*(const int64_t *)val);
        break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)*(const uint64_t *)val);
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        snprintf(tmp, sizeof tmp, "%u", *(const uint32_t *)val);
        break;
    case PROTOBUF_C_TYPE_BOOL:
        snprintf(tmp, sizeof tmp, "%s", *(const protobuf_c_boolean *)val ? "true" : "false");
        break;
    default:
        snprintf(tmp, sizeof tmp, "%d", *(const int32_t *)val);
        break;
    }
    put_json_string(b, tmp);
}

static void put_message(cfg_buf_t *b, const ProtobufCMessage *m, char *path, size_t path_len,
                        size_t path_cap)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const ProtobufCFieldDescriptor *order[64];
    unsigned n = d->n_fields <= 64 ? field_order(d, order) : 0;
    bool first = true;
    cfg_buf_puts(b, "{");
    for (unsigned i = 0; i < n; i++) {
        const ProtobufCFieldDescriptor *f = order[i];
        const char *base = (const char *)m;
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            if (*(const uint32_t *)(base + f->quantifier_offset) != f->id) continue;
        }
        if (f->label != PROTOBUF_C_LABEL_REPEATED && f->type == PROTOBUF_C_TYPE_MESSAGE &&
            !*(ProtobufCMessage *const *)(base + f->offset))
            continue;
        /* extend the path with this field's name */
        size_t fl = strlen(f->name);
        size_t new_len = path_len;
        if (path_len + fl + 3 < path_cap) {
            memcpy(path + path_len, "::", 2);
            memcpy(path + path_len + 2, f->name, fl + 1);
            new_len = path_len + 2 + fl;
        }
        if (!first) cfg_buf_puts(b, ",");
        first = false;
        put_json_string(b, f->name);
        cfg_buf_puts(b, ":");
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t count = *(const size_t *)(base + f->quantifier_offset);
            const char *arr = *(char *const *)(base + f->offset);
            bool is_map = f->type == PROTOBUF_C_TYPE_MESSAGE && cfg_is_map_entry(f->descriptor);
            cfg_buf_puts(b, is_map ? "{" : "[");
            for (size_t k = 0; k < count; k++) {
                if (k) cfg_buf_puts(b, ",");
                if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
                    const ProtobufCMessage *sub = ((ProtobufCMessage *const *)arr)[k];
                    if (is_map) {
                        const ProtobufCMessageDescriptor *ed = f->descriptor;
                        const ProtobufCFieldDescriptor *kf = &ed->fields[0], *vf = &ed->fields[1];
                        put_map_key(b, kf, (const char *)sub + kf->offset);
                        cfg_buf_puts(b, ":");
                        if (vf->type == PROTOBUF_C_TYPE_MESSAGE) {
                            const ProtobufCMessage *v =
                                *(ProtobufCMessage *const *)((const char *)sub + vf->offset);
                            size_t l2 = new_len;
                            if (l2 + 8 < path_cap) {
                                memcpy(path + l2, "::value", 8);
                                l2 += 7;
                            }
                            if (v) {
                                put_message(b, v, path, l2, path_cap);
                            } else {
                                ProtobufCMessage *empty = cfg_message_new(vf->descriptor);
                                if (empty) {
                                    put_message(b, empty, path, l2, path_cap);
                                    protobuf_c_message_free_unpacked(empty, NULL);
                                } else {
                                    cfg_buf_puts(b, "{}");
                                }
                            }
                            path[new_len] = '\0';
                        } else {
                            put_value(b, vf, (const char *)sub + vf->offset, path);
                        }
                    } else {
                        put_message(b, sub, path, new_len, path_cap);
                    }
                } else {
                    put_value(b, f, arr + k * cfg_scalar_size(f->type), path);
                }
            }
            cfg_buf_puts(b, is_map ? "}" : "]");
        } else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            put_message(b, *(ProtobufCMessage *const *)(base + f->offset), path, new_len, path_cap);
        } else {
            put_value(b, f, base + f->offset, path);
        }
        path[path_len] = '\0';
    }
    cfg_buf_puts(b, "}");
}

char *config_to_json(const model_config_t *cfg)
{
    if (!cfg) return NULL;
    if (protobuf_c_message_get_packed_size(&cfg->base) == 0) return strdup("");
    cfg_buf_t b = {0};
    char path[512] = "ModelConfig";
    put_message(&b, &cfg->base, path, strlen(path), sizeof path);
    if (b.oom) {
        cfg_buf_free(&b);
        return NULL;
    }
    return cfg_buf_take(&b);
}

/* ---- input ---- */

typedef struct jctx {
    cfg_buf_t err;
    bool failed;
} jctx_t;

static void jfail(jctx_t *c, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void jfail(jctx_t *c, const char *path, const char *fmt, ...)
{
    if (c->failed) return;
    c->failed = true;
    cfg_buf_printf(&c->err, "%s: ", path);
    va_list ap;
    va_start(ap, fmt);
    cfg_buf_vprintf(&c->err, fmt, ap);
    va_end(ap);
    cfg_buf_puts(&c->err, "\n");
}

/* lowerCamel form of a snake_case name (protobuf's json_name). */
static void json_name(const char *name, char *out, size_t cap)
{
    size_t o = 0;
    bool up = false;
    for (const char *p = name; *p && o + 1 < cap; p++) {
        if (*p == '_') {
            up = true;
            continue;
        }
        out[o++] = (up && *p >= 'a' && *p <= 'z') ? (char)(*p - 'a' + 'A') : *p;
        up = false;
    }
    out[o] = '\0';
}

static const ProtobufCFieldDescriptor *find_json_field(const ProtobufCMessageDescriptor *d,
                                                       const char *key)
{
    const ProtobufCFieldDescriptor *f = cfg_field_by_name(d, key, strlen(key));
    if (f) return f;
    for (unsigned i = 0; i < d->n_fields; i++) {
        char jn[128];
        json_name(d->fields[i].name, jn, sizeof jn);
        if (strcmp(jn, key) == 0) return &d->fields[i];
    }
    return NULL;
}

static bool json_parse_message(jctx_t *c, json_t *obj, ProtobufCMessage *m, const char *path,
                               int depth);

/* Integer from a JSON number or string. */
static bool json_to_integer(json_t *v, bool is_unsigned, bool *neg, uint64_t *mag)
{
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        *neg = i < 0;
        *mag = i < 0 ? (uint64_t)0 - (uint64_t)i : (uint64_t)i;
        return true;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d != floor(d) || fabs(d) > 9007199254740992.0) return false;
        *neg = d < 0;
        *mag = (uint64_t)fabs(d);
        return true;
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        *neg = s[0] == '-';
        if (*neg) s++;
        if (!*s) return false;
        char *end;
        if (*s < '0' || *s > '9') return false;
        errno = 0;
        unsigned long long u = strtoull(s, &end, 10);
        if (*end || errno) return false;
        *mag = u;
        (void)is_unsigned;
        return true;
    }
    return false;
}

static bool json_scalar(jctx_t *c, json_t *v, const ProtobufCFieldDescriptor *f, void *dst,
                        const char *path)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: {
        bool is64 = cfg_scalar_size(f->type) == 8;
        bool is_unsigned = f->type == PROTOBUF_C_TYPE_UINT32 ||
                           f->type == PROTOBUF_C_TYPE_FIXED32 ||
                           f->type == PROTOBUF_C_TYPE_UINT64 || f->type == PROTOBUF_C_TYPE_FIXED64;
        bool neg;
        uint64_t mag;
        if (!json_to_integer(v, is_unsigned, &neg, &mag)) {
            jfail(c, path, "expected an integer for field \"%s\"", f->name);
            return false;
        }
        uint64_t max_pos = is_unsigned ? (is64 ? UINT64_MAX : UINT32_MAX)
                                       : (is64 ? (uint64_t)INT64_MAX : (uint64_t)INT32_MAX);
        uint64_t max_neg =
            is_unsigned ? 0 : (is64 ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT32_MAX + 1);
        if ((neg && mag > max_neg) || (!neg && mag > max_pos)) {
            jfail(c, path, "integer out of range for field \"%s\"", f->name);
            return false;
        }
        if (is64) {
            uint64_t x = neg ? (uint64_t)0 - mag : mag;
            memcpy(dst, &x, 8);
        } else {
            uint32_t x = neg ? (uint32_t)0 - (uint32_t)mag : (uint32_t)mag;
            memcpy(dst, &x, 4);
        }
        return true;
    }
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_DOUBLE: {
        double d;
        if (json_is_number(v)) {
            d = json_number_value(v);
        } else if (json_is_string(v) && strcmp(json_string_value(v), "NaN") == 0) {
            d = NAN;
        } else if (json_is_string(v) && strcmp(json_string_value(v), "Infinity") == 0) {
            d = INFINITY;
        } else if (json_is_string(v) && strcmp(json_string_value(v), "-Infinity") == 0) {
            d = -INFINITY;
        } else if (json_is_string(v)) {
            char *end;
            d = strtod(json_string_value(v), &end);
            if (*end || end == json_string_value(v)) {
                jfail(c, path, "expected a number for field \"%s\"", f->name);
                return false;
            }
        } else {
            jfail(c, path, "expected a number for field \"%s\"", f->name);
            return false;
        }
        if (f->type == PROTOBUF_C_TYPE_FLOAT) {
            float x = (float)d;
            memcpy(dst, &x, 4);
        } else {
            memcpy(dst, &d, 8);
        }
        return true;
    }
    case PROTOBUF_C_TYPE_BOOL: {
        if (!json_is_boolean(v)) {
            jfail(c, path, "expected true or false for field \"%s\"", f->name);
            return false;
        }
        protobuf_c_boolean x = json_is_true(v);
        memcpy(dst, &x, sizeof x);
        return true;
    }
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumDescriptor *ed = f->descriptor;
        int32_t x;
        if (json_is_string(v)) {
            const char *s = json_string_value(v);
            const ProtobufCEnumValue *ev = NULL;
            for (unsigned i = 0; i < ed->n_values && !ev; i++)
                if (strcasecmp(ed->values[i].name, s) == 0) ev = &ed->values[i];
            if (!ev) {
                jfail(c, path, "unknown enumeration value \"%s\" for field \"%s\"", s, f->name);
                return false;
            }
            x = ev->value;
        } else if (json_is_integer(v) && json_integer_value(v) >= INT32_MIN &&
                   json_integer_value(v) <= INT32_MAX) {
            x = (int32_t)json_integer_value(v);
        } else {
            jfail(c, path, "expected an enumeration name for field \"%s\"", f->name);
            return false;
        }
        memcpy(dst, &x, 4);
        return true;
    }
    case PROTOBUF_C_TYPE_STRING: {
        if (!json_is_string(v)) {
            jfail(c, path, "expected a string for field \"%s\"", f->name);
            return false;
        }
        size_t n = json_string_length(v);
        const char *s = json_string_value(v);
        if (memchr(s, '\0', n)) {
            jfail(c, path, "string field \"%s\" contains a NUL character", f->name);
            return false;
        }
        char **slot = dst;
        char *copy = strdup(s);
        if (!copy) {
            jfail(c, path, "out of memory");
            return false;
        }
        if (*slot && *slot != protobuf_c_empty_string && *slot != (const char *)f->default_value)
            free(*slot);
        *slot = copy;
        return true;
    }
    case PROTOBUF_C_TYPE_BYTES:
    case PROTOBUF_C_TYPE_MESSAGE:
        break;
    }
    jfail(c, path, "unsupported field \"%s\"", f->name);
    return false;
}

/* Converts a JSON object key to a map key of field kf. */
static bool json_map_key(jctx_t *c, const char *key, const ProtobufCFieldDescriptor *kf, void *dst,
                         const char *path)
{
    if (kf->type == PROTOBUF_C_TYPE_STRING) {
        json_t *s = json_string(key);
        bool ok = s && json_scalar(c, s, kf, dst, path);
        json_decref(s);
        return ok;
    }
    if (kf->type == PROTOBUF_C_TYPE_BOOL) {
        protobuf_c_boolean x;
        if (strcmp(key, "true") == 0)
            x = 1;
        else if (strcmp(key, "false") == 0)
            x = 0;
        else {
            jfail(c, path, "invalid map key \"%s\"", key);
            return false;
        }
        memcpy(dst, &x, sizeof x);
        return true;
    }
    json_t *s = json_string(key);
    bool ok = s && json_scalar(c, s, kf, dst, path);
    json_decref(s);
    return ok;
}

static bool json_field(jctx_t *c, json_t *v, ProtobufCMessage *m, const ProtobufCFieldDescriptor *f,
                       const char *path, int depth)
{
    char *base = (char *)m;
    if (json_is_null(v)) return true;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        bool is_map = f->type == PROTOBUF_C_TYPE_MESSAGE && cfg_is_map_entry(f->descriptor);
        if (is_map) {
            if (!json_is_object(v)) {
                jfail(c, path, "expected an object for map field \"%s\"", f->name);
                return false;
            }
            const char *key;
            json_t *val;
            json_object_foreach(v, key, val)
            {
                ProtobufCMessage **slot = cfg_repeated_append(m, f);
                if (!slot) return false;
                *slot = cfg_message_new(f->descriptor);
                if (!*slot) {
                    (*(size_t *)(base + f->quantifier_offset))--;
                    return false;
                }
                const ProtobufCMessageDescriptor *ed = f->descriptor;
                const ProtobufCFieldDescriptor *kf = &ed->fields[0], *vf = &ed->fields[1];
                if (!json_map_key(c, key, kf, (char *)*slot + kf->offset, path)) return false;
                if (vf->type == PROTOBUF_C_TYPE_MESSAGE) {
                    ProtobufCMessage *sub = cfg_message_new(vf->descriptor);
                    if (!sub) return false;
                    *(ProtobufCMessage **)((char *)*slot + vf->offset) = sub;
                    if (!json_parse_message(c, val, sub, path, depth + 1)) return false;
                } else if (!json_scalar(c, val, vf, (char *)*slot + vf->offset, path)) {
                    return false;
                }
            }
            return true;
        }
        /* Triton's parser (protobuf's JsonStringToMessage, legacy syntax)
         * takes a single value for a repeated field as a list of one:
         * L0_lifecycle loads with "instance_group": {"kind": ..., "count": ...}. */
        json_t *one = NULL;
        if (!json_is_array(v)) {
            if (json_is_null(v)) {
                jfail(c, path, "expected an array for repeated field \"%s\"", f->name);
                return false;
            }
            one = json_array();
            json_array_append(one, v);
            v = one;
        }
        bool ok = true;
        size_t i;
        json_t *el;
        json_array_foreach(v, i, el)
        {
            void *slot = cfg_repeated_append(m, f);
            if (!slot) {
                ok = false;
                break;
            }
            if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
                ProtobufCMessage *sub = cfg_message_new(f->descriptor);
                if (!sub) {
                    (*(size_t *)(base + f->quantifier_offset))--;
                    ok = false;
                    break;
                }
                *(ProtobufCMessage **)slot = sub;
                if (!json_parse_message(c, el, sub, path, depth + 1)) {
                    ok = false;
                    break;
                }
            } else if (!json_scalar(c, el, f, slot, path)) {
                if (f->type == PROTOBUF_C_TYPE_STRING) *(char **)slot = NULL;
                ok = false;
                break;
            }
        }
        json_decref(one);
        return ok;
    }
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
        uint32_t *qc = (uint32_t *)(base + f->quantifier_offset);
        if (*qc != 0 && *qc != f->id) {
            jfail(c, path, "field \"%s\" is set along with another member of its oneof", f->name);
            return false;
        }
        *qc = f->id;
        if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_MESSAGE)
            *(void **)(base + f->offset) = NULL;
    }
    if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
        ProtobufCMessage **slot = (ProtobufCMessage **)(base + f->offset);
        if (!*slot) *slot = cfg_message_new(f->descriptor);
        if (!*slot) return false;
        return json_parse_message(c, v, *slot, path, depth + 1);
    }
    return json_scalar(c, v, f, base + f->offset, path);
}

static bool json_parse_message(jctx_t *c, json_t *obj, ProtobufCMessage *m, const char *path,
                               int depth)
{
    if (depth > 64) {
        jfail(c, path, "message nesting is too deep");
        return false;
    }
    if (!json_is_object(obj)) {
        jfail(c, path, "expected an object for message \"%s\"", m->descriptor->name);
        return false;
    }
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v)
    {
        const ProtobufCFieldDescriptor *f = find_json_field(m->descriptor, key);
        char sub[512];
        snprintf(sub, sizeof sub, "%s.%s", path, key);
        if (!f) {
            jfail(c, sub, "message type \"%s\" has no field named \"%s\"", m->descriptor->name,
                  key);
            return false;
        }
        if (!json_field(c, v, m, f, sub, depth)) {
            jfail(c, sub, "invalid value");
            return false;
        }
    }
    return true;
}

/* A copy of json with object keys written bare (identifiers, as protobuf's
 * JSON parser accepts for backward compatibility: Triton parses a config
 * override with it, and its QA writes `direct: {...}`) quoted; NULL when
 * there are none (*out_len: its length). Strings are copied as they are. */
static char *quote_bare_keys(const char *json, size_t len, size_t *out_len)
{
    char stack[64]; /* '{' or '[' of the open containers; deeper is left alone */
    size_t depth = 0, n_bare = 0;
    char prev = 0; /* last significant character outside strings */
    cfg_buf_t out = {0};
    for (size_t i = 0; i < len; i++) {
        char ch = json[i];
        if (ch == '"') { /* copy the string through its closing quote */
            size_t j = i + 1;
            while (j < len && json[j] != '"')
                j += json[j] == '\\' ? 2 : 1;
            size_t end = j < len ? j + 1 : len;
            cfg_buf_append(&out, json + i, end - i);
            i = end - 1;
            prev = '"';
            continue;
        }
        bool ident = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
        if (ident && depth > 0 && depth <= sizeof stack && stack[depth - 1] == '{' &&
            (prev == '{' || prev == ',')) {
            size_t j = i;
            while (j < len &&
                   ((json[j] >= 'a' && json[j] <= 'z') || (json[j] >= 'A' && json[j] <= 'Z') ||
                    (json[j] >= '0' && json[j] <= '9') || json[j] == '_'))
                j++;
            cfg_buf_append(&out, "\"", 1);
            cfg_buf_append(&out, json + i, j - i);
            cfg_buf_append(&out, "\"", 1);
            n_bare++;
            i = j - 1;
            prev = '"';
            continue;
        }
        if (ch == '{' || ch == '[') {
            if (depth < sizeof stack) stack[depth] = ch;
            depth++;
        } else if ((ch == '}' || ch == ']') && depth > 0) {
            depth--;
        }
        if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r') prev = ch;
        cfg_buf_append(&out, &ch, 1);
    }
    if (!n_bare || out.oom) {
        cfg_buf_free(&out);
        return NULL;
    }
    *out_len = out.len;
    return cfg_buf_take(&out);
}

model_config_t *config_from_json(const char *json, size_t len, char **errors)
{
    if (errors) *errors = NULL;
    jctx_t c = {0};
    json_error_t jerr;
    json_t *root = json_loadb(json ? json : "", json ? len : 0, JSON_ALLOW_NUL, &jerr);
    size_t bare_len = 0;
    char *bare = root || !json ? NULL : quote_bare_keys(json, len, &bare_len);
    if (bare) {
        root = json_loadb(bare, bare_len, JSON_ALLOW_NUL, NULL);
        free(bare);
    }
    if (!root) {
        cfg_buf_printf(&c.err, "<json>:%d:%d: %s\n", jerr.line, jerr.column, jerr.text);
        if (errors)
            *errors = cfg_buf_take(&c.err);
        else
            cfg_buf_free(&c.err);
        return NULL;
    }
    model_config_t *cfg = (model_config_t *)cfg_message_new(&inference__model_config__descriptor);
    bool ok = cfg && json_parse_message(&c, root, &cfg->base, "<json>", 0);
    json_decref(root);
    if (!ok) {
        if (cfg) protobuf_c_message_free_unpacked(&cfg->base, NULL);
        if (!c.failed) cfg_buf_puts(&c.err, "<json>: out of memory\n");
        if (errors)
            *errors = cfg_buf_take(&c.err);
        else
            cfg_buf_free(&c.err);
        return NULL;
    }
    cfg_buf_free(&c.err);
    return cfg;
}
