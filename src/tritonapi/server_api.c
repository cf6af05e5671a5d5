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
 * A process-wide registry of families and their metrics (counters and
 * gauges), printed on Nereid's /metrics page after its own families. */

struct TRITONSERVER_MetricFamily {
    struct TRITONSERVER_MetricFamily *next;
    TRITONSERVER_MetricKind kind;
    char *name, *description;
    struct TRITONSERVER_Metric *metrics;
};

struct TRITONSERVER_Metric {
    struct TRITONSERVER_Metric *next;
    TRITONSERVER_MetricFamily *family;
    char *labels; /* {k="v",...} or "" */
    double value;
};

static pthread_mutex_t metrics_lock = PTHREAD_MUTEX_INITIALIZER;
static TRITONSERVER_MetricFamily *families;

static TRITONSERVER_Error *bad(const char *msg)
{
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, msg);
}

void tritonapi_metrics_text(FILE *out)
{
    pthread_mutex_lock(&metrics_lock);
    for (TRITONSERVER_MetricFamily *f = families; f; f = f->next) {
        fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->description, f->name,
                f->kind == TRITONSERVER_METRIC_KIND_COUNTER ? "counter" : "gauge");
        for (TRITONSERVER_Metric *m = f->metrics; m; m = m->next)
            fprintf(out, "%s%s %.17g\n", f->name, m->labels, m->value);
    }
    pthread_mutex_unlock(&metrics_lock);
}

static bool metric_name_ok(const char *name)
{
    if (!name[0] || (name[0] >= '0' && name[0] <= '9')) return false;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_' || *p == ':'))
            return false;
    return true;
}

TRITONSERVER_Error *TRITONSERVER_MetricFamilyNew(TRITONSERVER_MetricFamily **family,
                                                 const TRITONSERVER_MetricKind kind,
                                                 const char *name, const char *description)
{
    if (!family || !name) return bad("family and name must not be NULL");
    *family = NULL;
    if (kind != TRITONSERVER_METRIC_KIND_COUNTER && kind != TRITONSERVER_METRIC_KIND_GAUGE)
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED,
                                     "only COUNTER and GAUGE metric families are supported");
    if (!metric_name_ok(name)) return bad("invalid metric family name");
    TRITONSERVER_MetricFamily *f = calloc(1, sizeof *f);
    if (!f) return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    f->kind = kind;
    f->name = strdup(name);
    f->description = strdup(description ? description : "");
    for (char *p = f->description; p && *p; p++)
        if (*p == '\n') *p = ' ';
    pthread_mutex_lock(&metrics_lock);
    for (TRITONSERVER_MetricFamily *o = families; o; o = o->next)
        if (strcmp(o->name, name) == 0 && o->kind != kind) {
            pthread_mutex_unlock(&metrics_lock);
            free(f->name);
            free(f->description);
            free(f);
            return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                         "a metric family of this name and another kind exists");
        }
    f->next = families;
    families = f;
    pthread_mutex_unlock(&metrics_lock);
    *family = f;
    return NULL;
}

TRITONSERVER_Error *TRITONSERVER_MetricFamilyDelete(TRITONSERVER_MetricFamily *family)
{
    if (!family) return bad("family must not be NULL");
    pthread_mutex_lock(&metrics_lock);
    if (family->metrics) {
        pthread_mutex_unlock(&metrics_lock);
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL,
                                     "Must call MetricDelete on all dependent metrics before "
                                     "calling MetricFamilyDelete.");
    }
    for (TRITONSERVER_MetricFamily **p = &families; *p; p = &(*p)->next)
        if (*p == family) {
            *p = family->next;
            break;
        }
    pthread_mutex_unlock(&metrics_lock);
    free(family->name);
    free(family->description);
    free(family);
    return NULL;
}

TRITONSERVER_Error *TRITONSERVER_GetMetricFamilyKind(TRITONSERVER_MetricFamily *family,
                                                     TRITONSERVER_MetricKind *kind)
{
    if (!family || !kind) return bad("family and kind must not be NULL");
    *kind = family->kind;
    return NULL;
}

/* {k="v",...} with Prometheus escapes; NULL on a bad label. */
static char *format_labels(const TRITONSERVER_Parameter **labels, uint64_t n)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    if (!out) return NULL;
    bool ok = true;
    for (uint64_t i = 0; i < n && ok; i++) {
        const TRITONSERVER_Parameter *p = labels[i];
        ok = p && p->type == TRITONSERVER_PARAMETER_STRING && metric_name_ok(p->name);
        if (!ok) break;
        fprintf(out, "%s%s=\"", i ? "," : "{", p->name);
        for (const char *c = p->v.s; *c; c++)
            if (*c == '\\' || *c == '"')
                fprintf(out, "\\%c", *c);
            else if (*c == '\n')
                fputs("\\n", out);
            else
                fputc(*c, out);
        fputc('"', out);
    }
    if (ok && n) fputc('}', out);
    fclose(out);
    if (!ok) {
        free(buf);
        return NULL;
    }
    return buf;
}

TRITONSERVER_Error *TRITONSERVER_MetricNew(TRITONSERVER_Metric **metric,
                                           TRITONSERVER_MetricFamily *family,
                                           const TRITONSERVER_Parameter **labels,
                                           const uint64_t label_count)
{
    if (!metric || !family || (!labels && label_count))
        return bad("metric, family and labels must not be NULL");
    *metric = NULL;
    char *text = format_labels(labels, label_count);
    if (!text) return bad("metric labels must be STRING parameters with valid names");
    TRITONSERVER_Metric *m = calloc(1, sizeof *m);
    if (!m) {
        free(text);
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    }
    m->family = family;
    m->labels = text;
    pthread_mutex_lock(&metrics_lock);
    m->next = family->metrics;
    family->metrics = m;
    pthread_mutex_unlock(&metrics_lock);
    *metric = m;
    return NULL;
}

TRITONSERVER_Error *TRITONSERVER_MetricDelete(TRITONSERVER_Metric *metric)
{
    if (!metric) return bad("metric must not be NULL");
    pthread_mutex_lock(&metrics_lock);
    for (TRITONSERVER_Metric **p = &metric->family->metrics; *p; p = &(*p)->next)
        if (*p == metric) {
            *p = metric->next;
            break;
        }
    pthread_mutex_unlock(&metrics_lock);
    free(metric->labels);
    free(metric);
    return NULL;
}

TRITONSERVER_Error *TRITONSERVER_MetricValue(TRITONSERVER_Metric *metric, double *value)
{
    if (!metric || !value) return bad("metric and value must not be NULL");
    pthread_mutex_lock(&metrics_lock);
    *value = metric->value;
    pthread_mutex_unlock(&metrics_lock);
    return NULL;
}

TRITONSERVER_Error *TRITONSERVER_MetricIncrement(TRITONSERVER_Metric *metric, double value)
{
    if (!metric) return bad("metric must not be NULL");
    if (metric->family->kind == TRITONSERVER_METRIC_KIND_COUNTER && value < 0)
        return bad("value must be >= 0 when incrementing a counter");
    pthread_mutex_lock(&metrics_lock);
    metric->value += value;
    pthread_mutex_unlock(&metrics_lock);
    return NULL;
}

TRITONSERVER_Error *TRITONSERVER_MetricSet(TRITONSERVER_Metric *metric, double value)
{
    if (!metric) return bad("metric must not be NULL");
    if (metric->family->kind != TRITONSERVER_METRIC_KIND_GAUGE)
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED,
                                     "metric kind does not support Set");
    pthread_mutex_lock(&metrics_lock);
    metric->value = value;
    pthread_mutex_unlock(&metrics_lock);
    return NULL;
}
