/*
 * This file contains the TRITONSERVER_* half of libtritonserver.so that
 * Triton backends call: errors (Nereid's own error objects: same codes and
 * values), JSON messages, parameters, logging into Nereid's log, datatype
 * helpers, the memory manager, custom metrics, and in-process inference
 * (BLS) on top of server.h's nereid_request_* / nereid_server_infer_async.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tritonapi/tritonapi.h"

/* ---- Errors ---- */

TRITONSERVER_Error *TRITONSERVER_ErrorNew(TRITONSERVER_Error_Code code, const char *msg)
{
    if ((unsigned)code > TRITONSERVER_ERROR_CANCELLED) code = TRITONSERVER_ERROR_UNKNOWN;
    return (TRITONSERVER_Error *)nereid_error_new((nereid_error_code_t)code, "%s", msg ? msg : "");
}

void TRITONSERVER_ErrorDelete(TRITONSERVER_Error *error)
{
    nereid_error_free((nereid_error_t *)error);
}

TRITONSERVER_Error_Code TRITONSERVER_ErrorCode(TRITONSERVER_Error *error)
{
    return (TRITONSERVER_Error_Code)nereid_error_code((const nereid_error_t *)error);
}

const char *TRITONSERVER_ErrorCodeString(TRITONSERVER_Error *error)
{
    return nereid_error_code_name(nereid_error_code((const nereid_error_t *)error));
}

const char *TRITONSERVER_ErrorMessage(TRITONSERVER_Error *error)
{
    return nereid_error_message((const nereid_error_t *)error);
}

nereid_error_t *tritonapi_error_copy(const TRITONSERVER_Error *err)
{
    if (!err) return NULL;
    const nereid_error_t *e = (const nereid_error_t *)err;
    return nereid_error_new(nereid_error_code(e), "%s", nereid_error_message(e));
}

/* ---- Messages ---- */

void tritonapi_message_set(TRITONSERVER_Message *msg, const char *json)
{
    msg->byte_size = strlen(json);
    msg->json = malloc(msg->byte_size + 1);
    if (msg->json)
        memcpy(msg->json, json, msg->byte_size + 1);
    else
        msg->byte_size = 0;
}

TRITONSERVER_Error *TRITONSERVER_MessageNewFromSerializedJson(TRITONSERVER_Message **message,
                                                              const char *base, size_t byte_size)
{
    if (!message || (!base && byte_size))
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                     "message and base must not be NULL");
    TRITONSERVER_Message *m = malloc(sizeof *m);
    char *json = malloc(byte_size + 1);
    if (!m || !json) {
        free(m);
        free(json);
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    }
    if (byte_size) memcpy(json, base, byte_size);
    json[byte_size] = '\0';
    m->json = json;
    m->byte_size = byte_size;
    *message = m;
    return NULL;
}

TRITONSERVER_Error *TRITONSERVER_MessageDelete(TRITONSERVER_Message *message)
{
    if (message) free(message->json);
    free(message);
    return NULL;
}

TRITONSERVER_Error *TRITONSERVER_MessageSerializeToJson(TRITONSERVER_Message *message,
                                                        const char **base, size_t *byte_size)
{
    if (!message || !base || !byte_size)
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                     "message, base and byte_size must not be NULL");
    *base = message->json;
    *byte_size = message->byte_size;
    return NULL;
}

/* ---- Versions, datatypes, enums ---- */

TRITONSERVER_Error *TRITONSERVER_ApiVersion(uint32_t *major, uint32_t *minor)
{
    if (!major || !minor)
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                     "major and minor must not be NULL");
    *major = TRITONSERVER_API_VERSION_MAJOR;
    *minor = TRITONSERVER_API_VERSION_MINOR;
    return NULL;
}

const char *TRITONSERVER_DataTypeString(TRITONSERVER_DataType datatype)
{
    const char *s = nereid_datatype_name((nereid_datatype_t)datatype);
    return strcmp(s, "INVALID") == 0 ? "<invalid>" : s;
}

TRITONSERVER_DataType TRITONSERVER_StringToDataType(const char *dtype)
{
    return dtype ? (TRITONSERVER_DataType)nereid_datatype_from_name(dtype)
                 : TRITONSERVER_TYPE_INVALID;
}

uint32_t TRITONSERVER_DataTypeByteSize(TRITONSERVER_DataType datatype)
{
    return (uint32_t)nereid_datatype_byte_size((nereid_datatype_t)datatype);
}

const char *TRITONSERVER_MemoryTypeString(TRITONSERVER_MemoryType memtype)
{
    switch (memtype) {
    case TRITONSERVER_MEMORY_CPU:
        return "CPU";
    case TRITONSERVER_MEMORY_CPU_PINNED:
        return "CPU_PINNED";
    case TRITONSERVER_MEMORY_GPU:
        return "GPU";
    }
    return "<invalid>";
}

const char *TRITONSERVER_ParameterTypeString(TRITONSERVER_ParameterType paramtype)
{
    static const char *const names[] = {"STRING", "INT", "BOOL", "DOUBLE", "BYTES"};
    return (unsigned)paramtype < 5 ? names[paramtype] : "<invalid>";
}

const char *TRITONSERVER_InstanceGroupKindString(TRITONSERVER_InstanceGroupKind kind)
{
    static const char *const names[] = {"AUTO", "CPU", "GPU", "MODEL"};
    return (unsigned)kind < 4 ? names[kind] : "<invalid>";
}

/* ---- Buffer attributes ---- */

TRITONSERVER_Error *TRITONSERVER_BufferAttributesNew(TRITONSERVER_BufferAttributes **attrs)
{
    if (!attrs)
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                     "buffer_attributes must not be NULL");
    *attrs = calloc(1, sizeof **attrs);
    return *attrs ? NULL : TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "out of memory");
}

TRITONSERVER_Error *TRITONSERVER_BufferAttributesDelete(TRITONSERVER_BufferAttributes *attrs)
{
    free(attrs);
    return NULL;
}

#define ATTR_ACCESSORS(field, type, Name)                                                          \
    TRITONSERVER_Error *TRITONSERVER_BufferAttributesSet##Name(                                    \
        TRITONSERVER_BufferAttributes *attrs, type value)                                          \
    {                                                                                              \
        if (!attrs)                                                                                \
            return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,                           \
                                         "buffer_attributes must not be NULL");                    \
        attrs->field = value;                                                                      \
        return NULL;                                                                               \
    }                                                                                              \
    TRITONSERVER_Error *TRITONSERVER_BufferAttributes##Name(TRITONSERVER_BufferAttributes *attrs,  \
                                                            type *value)                           \
    {                                                                                              \
        if (!attrs || !value)                                                                      \
            return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,                           \
                                         "buffer_attributes and value must not be NULL");          \
        *value = attrs->field;                                                                     \
        return NULL;                                                                               \
    }
ATTR_ACCESSORS(memory_type_id, int64_t, MemoryTypeId)
ATTR_ACCESSORS(memory_type, TRITONSERVER_MemoryType, MemoryType)
ATTR_ACCESSORS(cuda_ipc_handle, void *, CudaIpcHandle)
ATTR_ACCESSORS(byte_size, size_t, ByteSize)
#undef ATTR_ACCESSORS

/* ---- Parameters ---- */

struct TRITONSERVER_Parameter {
    char *name;
    TRITONSERVER_ParameterType type;
    const void *value; /* points into the union, or to borrowed bytes */
    uint64_t byte_size;
    union {
        char *s;
        int64_t i;
        bool b;
        double d;
    } v;
};

TRITONSERVER_Parameter *TRITONSERVER_ParameterNew(const char *name,
                                                  const TRITONSERVER_ParameterType type,
                                                  const void *value)
{
    if (!name || !value || (unsigned)type >= TRITONSERVER_PARAMETER_BYTES) return NULL;
    TRITONSERVER_Parameter *p = calloc(1, sizeof *p);
    if (!p || !(p->name = strdup(name))) {
        free(p);
        return NULL;
    }
    p->type = type;
    switch (type) {
    case TRITONSERVER_PARAMETER_STRING:
        p->v.s = strdup(value);
        p->value = p->v.s;
        break;
    case TRITONSERVER_PARAMETER_INT:
        p->v.i = *(const int64_t *)value;
        p->value = &p->v.i;
        break;
    case TRITONSERVER_PARAMETER_BOOL:
        p->v.b = *(const bool *)value;
        p->value = &p->v.b;
        break;
    default:
        p->v.d = *(const double *)value;
        p->value = &p->v.d;
        break;
    }
    if (!p->value) {
        free(p->name);
        free(p);
        return NULL;
    }
    return p;
}

TRITONSERVER_Parameter *TRITONSERVER_ParameterBytesNew(const char *name, const void *byte_ptr,
                                                       const uint64_t size)
{
    if (!name) return NULL;
    TRITONSERVER_Parameter *p = calloc(1, sizeof *p);
    if (!p || !(p->name = strdup(name))) {
        free(p);
        return NULL;
    }
    p->type = TRITONSERVER_PARAMETER_BYTES;
    p->value = byte_ptr;
    p->byte_size = size;
    return p;
}

void TRITONSERVER_ParameterDelete(TRITONSERVER_Parameter *parameter)
{
    if (!parameter) return;
    if (parameter->type == TRITONSERVER_PARAMETER_STRING) free(parameter->v.s);
    free(parameter->name);
    free(parameter);
}

/* ---- Logging ---- */

bool TRITONSERVER_LogIsEnabled(TRITONSERVER_LogLevel level)
{
    nereid_log_settings_t s;
    nereid_server_log_settings(NULL, &s);
    switch (level) {
    case TRITONSERVER_LOG_INFO:
        return s.log_info;
    case TRITONSERVER_LOG_WARN:
        return s.log_warning;
    case TRITONSERVER_LOG_ERROR:
        return s.log_error;
    case TRITONSERVER_LOG_VERBOSE:
        return s.log_verbose_level > 0;
    }
    return false;
}

TRITONSERVER_Error *TRITONSERVER_LogMessage(TRITONSERVER_LogLevel level, const char *filename,
                                            const int line, const char *msg)
{
    if ((unsigned)level > TRITONSERVER_LOG_VERBOSE)
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, "unknown log level");
    /* TRITONSERVER_LOG_INFO..VERBOSE are NEREID_LOG_INFO..VERBOSE */
    const char *base = filename ? strrchr(filename, '/') : NULL;
    nereid_log_message((nereid_log_level_t)level, base ? base + 1 : filename, line, msg);
    return NULL;
}

/* ---- Memory manager ---- */

struct TRITONBACKEND_MemoryManager {
    int unused;
};

TRITONSERVER_Error *TRITONBACKEND_BackendMemoryManager(TRITONBACKEND_Backend *backend,
                                                       TRITONBACKEND_MemoryManager **manager)
{
    static TRITONBACKEND_MemoryManager the_manager;
    if (!backend || !manager)
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                     "backend and manager must not be NULL");
    *manager = &the_manager;
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_MemoryManagerAllocate(TRITONBACKEND_MemoryManager *manager,
                                                        void **buffer,
                                                        const TRITONSERVER_MemoryType memory_type,
                                                        const int64_t memory_type_id,
                                                        const uint64_t byte_size)
{
    (void)manager, (void)memory_type_id;
    if (!buffer)
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, "buffer must not be NULL");
    *buffer = NULL;
    if (memory_type != TRITONSERVER_MEMORY_CPU) {
        char msg[128];
        snprintf(msg, sizeof msg, "%s memory is not available: Nereid runs on CPU only",
                 TRITONSERVER_MemoryTypeString(memory_type));
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED, msg);
    }
    *buffer = malloc(byte_size ? byte_size : 1);
    return *buffer ? NULL
                   : TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNAVAILABLE,
                                           "CPU memory allocation failed");
}

TRITONSERVER_Error *TRITONBACKEND_MemoryManagerFree(TRITONBACKEND_MemoryManager *manager,
                                                    void *buffer,
                                                    const TRITONSERVER_MemoryType memory_type,
                                                    const int64_t memory_type_id)
{
    (void)manager, (void)memory_type_id;
    if (memory_type != TRITONSERVER_MEMORY_CPU)
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED,
                                     "only CPU memory is allocated by Nereid");
    free(buffer);
    return NULL;
}

/* ---- Tracing ---- */

/* A TRITONSERVER_InferenceTrace is a nereid_trace_t (TRITONBACKEND_RequestTrace). */

TRITONSERVER_Error *TRITONSERVER_InferenceTraceReportActivity(TRITONSERVER_InferenceTrace *trace,
                                                              uint64_t timestamp,
                                                              const char *activity_name)
{
    if (!activity_name)
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                     "activity_name must not be NULL");
    nereid_trace_activity((nereid_trace_t *)trace, activity_name, timestamp); /* NULL: nothing */
    return NULL;
}

static TRITONSERVER_Error *trace_info(TRITONSERVER_InferenceTrace *trace, const void *out,
                                      uint64_t *id, uint64_t *parent_id, const char **model_name,
                                      int64_t *model_version, const char **request_id)
{
    if (!trace || !out)
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                     "trace and its out-parameter must not be NULL");
    nereid_trace_info((const nereid_trace_t *)trace, id, parent_id, model_name, model_version,
                      request_id);
    if (model_name && !*model_name) *model_name = "";
    return NULL;
}

TRITONSERVER_Error *TRITONSERVER_InferenceTraceId(TRITONSERVER_InferenceTrace *trace, uint64_t *id)
{
    return trace_info(trace, id, id, NULL, NULL, NULL, NULL);
}

TRITONSERVER_Error *TRITONSERVER_InferenceTraceParentId(TRITONSERVER_InferenceTrace *trace,
                                                        uint64_t *parent_id)
{
    return trace_info(trace, parent_id, NULL, parent_id, NULL, NULL, NULL);
}

TRITONSERVER_Error *TRITONSERVER_InferenceTraceModelName(TRITONSERVER_InferenceTrace *trace,
                                                         const char **model_name)
{
    return trace_info(trace, model_name, NULL, NULL, model_name, NULL, NULL);
}

TRITONSERVER_Error *TRITONSERVER_InferenceTraceModelVersion(TRITONSERVER_InferenceTrace *trace,
                                                            int64_t *model_version)
{
    return trace_info(trace, model_version, NULL, NULL, NULL, model_version, NULL);
}

TRITONSERVER_Error *TRITONSERVER_InferenceTraceRequestId(TRITONSERVER_InferenceTrace *trace,
                                                         const char **request_id)
{
    return trace_info(trace, request_id, NULL, NULL, NULL, NULL, request_id);
}

/* ---- Custom metrics ----
 * Thin wrappers over the core's registry (backend.h, nereid_metric_*), the
 * one Python models use too: the handles are the core's objects. */

struct TRITONSERVER_MetricArgs {
    TRITONSERVER_MetricKind kind;
    double *buckets;
    size_t n_buckets;
};

#define FAMILY(f) ((nereid_metric_family_t *)(f))
#define METRIC(m) ((nereid_metric_t *)(m))

static TRITONSERVER_Error *bad(const char *msg)
{
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, msg);
}

TRITONSERVER_Error *TRITONSERVER_MetricFamilyNew(TRITONSERVER_MetricFamily **family,
                                                 const TRITONSERVER_MetricKind kind,
                                                 const char *name, const char *description)
{
    if (!family) return bad("family must not be NULL");
    return (TRITONSERVER_Error *)nereid_metric_family_new(
        (nereid_metric_kind_t)kind, name, description, (nereid_metric_family_t **)family);
}

TRITONSERVER_Error *TRITONSERVER_MetricFamilyDelete(TRITONSERVER_MetricFamily *family)
{
    return (TRITONSERVER_Error *)nereid_metric_family_delete(FAMILY(family));
}

TRITONSERVER_Error *TRITONSERVER_GetMetricFamilyKind(TRITONSERVER_MetricFamily *family,
                                                     TRITONSERVER_MetricKind *kind)
{
    if (!family || !kind) return bad("family and kind must not be NULL");
    *kind = (TRITONSERVER_MetricKind)nereid_metric_family_kind(FAMILY(family));
    return NULL;
}

TRITONSERVER_Error *TRITONSERVER_MetricArgsNew(TRITONSERVER_MetricArgs **args)
{
    if (!args) return bad("args must not be NULL");
    *args = calloc(1, sizeof **args);
    if (!*args) return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    (*args)->kind = (TRITONSERVER_MetricKind)-1;
    return NULL;
}

TRITONSERVER_Error *TRITONSERVER_MetricArgsSetHistogram(TRITONSERVER_MetricArgs *args,
                                                        const double *buckets,
                                                        const uint64_t buckets_count)
{
    if (!args || (!buckets && buckets_count)) return bad("args and buckets must not be NULL");
    if (buckets_count > SIZE_MAX / sizeof(double)) return bad("too many buckets");
    double *copy = malloc(buckets_count ? buckets_count * sizeof *copy : 1);
    if (!copy) return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    if (buckets_count) memcpy(copy, buckets, buckets_count * sizeof *copy);
    free(args->buckets);
    args->kind = TRITONSERVER_METRIC_KIND_HISTOGRAM;
    args->buckets = copy;
    args->n_buckets = buckets_count;
    return NULL;
}

TRITONSERVER_Error *TRITONSERVER_MetricArgsDelete(TRITONSERVER_MetricArgs *args)
{
    if (args) free(args->buckets);
    free(args);
    return NULL;
}

TRITONSERVER_Error *TRITONSERVER_MetricNewWithArgs(TRITONSERVER_Metric **metric,
                                                   TRITONSERVER_MetricFamily *family,
                                                   const TRITONSERVER_Parameter **labels,
                                                   const uint64_t label_count,
                                                   const TRITONSERVER_MetricArgs *args)
{
    if (!metric || !family || (!labels && label_count))
        return bad("metric, family and labels must not be NULL");
    *metric = NULL;
    TRITONSERVER_MetricKind kind =
        (TRITONSERVER_MetricKind)nereid_metric_family_kind(FAMILY(family));
    if (kind == TRITONSERVER_METRIC_KIND_HISTOGRAM) {
        if (!args) return bad("Bucket boundaries not found in Metric args.");
        if (args->kind != TRITONSERVER_METRIC_KIND_HISTOGRAM)
            return bad("Metric args not set to histogram kind.");
    } else if (args) {
        return bad(kind == TRITONSERVER_METRIC_KIND_COUNTER
                       ? "Unexpected args found in counter Metric constructor."
                       : "Unexpected args found in gauge Metric constructor.");
    }
    if (label_count > SIZE_MAX / (2 * sizeof(char *))) return bad("too many metric labels");
    const char **names = calloc(label_count ? 2 * label_count : 1, sizeof *names);
    if (!names) return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    const char **values = names + label_count;
    for (uint64_t i = 0; i < label_count; i++) {
        const TRITONSERVER_Parameter *p = labels[i];
        if (!p || p->type != TRITONSERVER_PARAMETER_STRING) {
            char msg[512];
            snprintf(msg, sizeof msg,
                     "Parameter [%.400s] must have a type of TRITONSERVER_PARAMETER_STRING to be "
                     "added as a label.",
                     p ? p->name : "");
            free(names);
            return bad(msg);
        }
        names[i] = p->name;
        values[i] = p->v.s;
    }
    double none = 0;
    const double *buckets = args ? (args->buckets ? args->buckets : &none) : NULL;
    nereid_error_t *err = nereid_metric_new(FAMILY(family), names, values, label_count, buckets,
                                            args ? args->n_buckets : 0, (nereid_metric_t **)metric);
    free(names);
    return (TRITONSERVER_Error *)err;
}

TRITONSERVER_Error *TRITONSERVER_MetricNew(TRITONSERVER_Metric **metric,
                                           TRITONSERVER_MetricFamily *family,
                                           const TRITONSERVER_Parameter **labels,
                                           const uint64_t label_count)
{
    return TRITONSERVER_MetricNewWithArgs(metric, family, labels, label_count, NULL);
}

TRITONSERVER_Error *TRITONSERVER_MetricDelete(TRITONSERVER_Metric *metric)
{
    return (TRITONSERVER_Error *)nereid_metric_delete(METRIC(metric));
}

TRITONSERVER_Error *TRITONSERVER_MetricValue(TRITONSERVER_Metric *metric, double *value)
{
    return (TRITONSERVER_Error *)nereid_metric_value(METRIC(metric), value);
}

TRITONSERVER_Error *TRITONSERVER_MetricIncrement(TRITONSERVER_Metric *metric, double value)
{
    return (TRITONSERVER_Error *)nereid_metric_increment(METRIC(metric), value);
}

TRITONSERVER_Error *TRITONSERVER_MetricSet(TRITONSERVER_Metric *metric, double value)
{
    return (TRITONSERVER_Error *)nereid_metric_set(METRIC(metric), value);
}

TRITONSERVER_Error *TRITONSERVER_MetricObserve(TRITONSERVER_Metric *metric, double value)
{
    return (TRITONSERVER_Error *)nereid_metric_observe(METRIC(metric), value);
}

TRITONSERVER_Error *TRITONSERVER_GetMetricKind(TRITONSERVER_Metric *metric,
                                               TRITONSERVER_MetricKind *kind)
{
    if (!metric || !kind) return bad("metric and kind must not be NULL");
    *kind = (TRITONSERVER_MetricKind)nereid_metric_kind(METRIC(metric));
    return NULL;
}
