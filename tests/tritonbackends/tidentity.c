/*
 * This file contains a Triton backend written against Nereid's copy of
 * Triton's headers, for tests/integration/test_triton_backend.py: it copies
 * every input INPUT<k> to output OUTPUT<k> (any datatype, BYTES included),
 * request by request, the way Triton's identity backend does. A request
 * parameter "mode" makes it break the backend contract on purpose:
 *   execute_error   Execute returns an error (the server answers every request)
 *   no_release      responds, never releases the request
 *   double_release  releases twice; answers with the second release's error
 *   double_send     sends two final responses
 *   no_final        sends its response without the FINAL flag
 *   two_responses   sends two responses, then the FINAL flag alone (Triton's
 *                   repeat backend on a model that is not decoupled)
 *   no_response     releases without responding
 *   error_response  sends an error response (INVALID_ARG "requested error")
 * Request parameter "trace_activity" = <name> reports that activity into the
 * request's trace (TRITONBACKEND_RequestTrace) and answers the trace's id,
 * parent id, model, version and request id as response parameters.
 * Model config parameter "fail" = "model_init" / "instance_init" fails that
 * entry point; "response_parameters" = "false" leaves out the four response
 * parameters param0..param3 it otherwise sets as Triton's identity does.
 * Custom metric: counter tidentity_input_bytes{model,version},
 * the input bytes each model received.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "triton/core/tritonbackend.h"

#define RETURN_IF_ERROR(x)                                                                         \
    do {                                                                                           \
        TRITONSERVER_Error *e_ = (x);                                                              \
        if (e_) return e_;                                                                         \
    } while (0)

static void log_error(TRITONSERVER_Error *err)
{
    if (!err) return;
    TRITONSERVER_LogMessage(TRITONSERVER_LOG_ERROR, __FILE__, __LINE__,
                            TRITONSERVER_ErrorMessage(err));
    TRITONSERVER_ErrorDelete(err);
}

static TRITONSERVER_MetricFamily *input_bytes;

TRITONSERVER_Error *TRITONBACKEND_Initialize(TRITONBACKEND_Backend *backend)
{
    uint32_t major, minor;
    RETURN_IF_ERROR(TRITONBACKEND_ApiVersion(&major, &minor));
    if (major != TRITONBACKEND_API_VERSION_MAJOR || minor < TRITONBACKEND_API_VERSION_MINOR)
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED,
                                     "triton backend API version does not support this backend");
    const char *name;
    TRITONSERVER_Message *config;
    const char *json;
    size_t size;
    RETURN_IF_ERROR(TRITONBACKEND_BackendName(backend, &name));
    RETURN_IF_ERROR(TRITONBACKEND_BackendConfig(backend, &config));
    RETURN_IF_ERROR(TRITONSERVER_MessageSerializeToJson(config, &json, &size));
    char msg[512];
    snprintf(msg, sizeof msg, "tidentity initialized: backend %s, API %u.%u, config %s", name,
             major, minor, json);
    RETURN_IF_ERROR(TRITONSERVER_MetricFamilyNew(&input_bytes, TRITONSERVER_METRIC_KIND_COUNTER,
                                                 "tidentity_input_bytes",
                                                 "Input bytes received by tidentity"));
    return TRITONSERVER_LogMessage(TRITONSERVER_LOG_INFO, __FILE__, __LINE__, msg);
}

TRITONSERVER_Error *TRITONBACKEND_Finalize(TRITONBACKEND_Backend *backend)
{
    (void)backend;
    RETURN_IF_ERROR(TRITONSERVER_MetricFamilyDelete(input_bytes));
    return TRITONSERVER_LogMessage(TRITONSERVER_LOG_INFO, __FILE__, __LINE__,
                                   "tidentity finalized");
}

typedef struct model_state {
    TRITONSERVER_Metric *metric;
    bool response_parameters; /* false with parameter response_parameters=false */
} model_state_t;

/* Whether config parameter key has string value what. */
static bool config_param(TRITONBACKEND_Model *model, const char *key, const char *what)
{
    TRITONSERVER_Message *config;
    if (TRITONBACKEND_ModelConfig(model, 1, &config)) return false;
    const char *json;
    size_t size;
    bool found = false;
    if (!TRITONSERVER_MessageSerializeToJson(config, &json, &size)) {
        char pattern[128];
        snprintf(pattern, sizeof pattern, "\"%s\":{\"string_value\":\"%s\"}", key, what);
        found = strstr(json, pattern) != NULL;
    }
    TRITONSERVER_MessageDelete(config);
    return found;
}

TRITONSERVER_Error *TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model *model)
{
    if (config_param(model, "fail", "model_init"))
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                     "tidentity: model initialization failed as configured");
    const char *name;
    uint64_t version;
    RETURN_IF_ERROR(TRITONBACKEND_ModelName(model, &name));
    RETURN_IF_ERROR(TRITONBACKEND_ModelVersion(model, &version));
    char v[32];
    snprintf(v, sizeof v, "%llu", (unsigned long long)version);
    const TRITONSERVER_Parameter *labels[2] = {
        TRITONSERVER_ParameterNew("model", TRITONSERVER_PARAMETER_STRING, name),
        TRITONSERVER_ParameterNew("version", TRITONSERVER_PARAMETER_STRING, v)};
    TRITONSERVER_Metric *metric = NULL;
    TRITONSERVER_Error *err = TRITONSERVER_MetricNew(&metric, input_bytes, labels, 2);
    TRITONSERVER_ParameterDelete((TRITONSERVER_Parameter *)labels[0]);
    TRITONSERVER_ParameterDelete((TRITONSERVER_Parameter *)labels[1]);
    if (err) return err;
    model_state_t *state = malloc(sizeof *state);
    if (!state) {
        TRITONSERVER_MetricDelete(metric);
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "out of memory");
    }
    state->metric = metric;
    state->response_parameters = !config_param(model, "response_parameters", "false");
    return TRITONBACKEND_ModelSetState(model, state);
}

TRITONSERVER_Error *TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model *model)
{
    void *vstate;
    RETURN_IF_ERROR(TRITONBACKEND_ModelState(model, &vstate));
    model_state_t *state = vstate;
    TRITONSERVER_Error *err = TRITONSERVER_MetricDelete(state->metric);
    free(state);
    return err;
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance *instance)
{
    TRITONBACKEND_Model *model;
    RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceModel(instance, &model));
    if (config_param(model, "fail", "instance_init"))
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG,
                                     "tidentity: instance initialization failed as configured");
    TRITONSERVER_InstanceGroupKind kind;
    RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceKind(instance, &kind));
    if (kind != TRITONSERVER_INSTANCEGROUPKIND_CPU && kind != TRITONSERVER_INSTANCEGROUPKIND_MODEL)
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, "tidentity runs on CPU only");
    /* A passive instance (instance_group passive: true) must never execute:
     * its state marks it, and execute fails on it. */
    bool passive = false;
    RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceIsPassive(instance, &passive));
    static int passive_mark;
    if (passive) {
        const char *name = "";
        RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceName(instance, &name));
        char line[256];
        snprintf(line, sizeof line, "tidentity: passive instance %s", name);
        TRITONSERVER_LogMessage(TRITONSERVER_LOG_INFO, __FILE__, __LINE__, line);
        RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceSetState(instance, &passive_mark));
    }
    return NULL;
}

/* Request parameter key's string value, or "". */
static const char *request_param(TRITONBACKEND_Request *request, const char *want)
{
    uint32_t n = 0;
    if (TRITONBACKEND_RequestParameterCount(request, &n)) return "";
    for (uint32_t i = 0; i < n; i++) {
        const char *key;
        TRITONSERVER_ParameterType type;
        const void *value;
        if (TRITONBACKEND_RequestParameter(request, i, &key, &type, &value) == NULL &&
            strcmp(key, want) == 0 && type == TRITONSERVER_PARAMETER_STRING)
            return value;
    }
    return "";
}

static const char *request_mode(TRITONBACKEND_Request *request)
{
    return request_param(request, "mode");
}

/* Request parameter "trace_activity": reports that activity into the
 * request's trace now, and answers what identifies the trace as response
 * parameters trace_id (0: not traced), trace_parent_id, trace_model,
 * trace_version, trace_request_id. */
static TRITONSERVER_Error *trace_activity(TRITONBACKEND_Request *request,
                                          TRITONBACKEND_Response *response)
{
    const char *activity = request_param(request, "trace_activity");
    if (!activity[0]) return NULL;
    TRITONSERVER_InferenceTrace *trace = NULL;
    RETURN_IF_ERROR(TRITONBACKEND_RequestTrace(request, &trace));
    if (!trace) return TRITONBACKEND_ResponseSetIntParameter(response, "trace_id", 0);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* Triton's steady clock */
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    RETURN_IF_ERROR(TRITONSERVER_InferenceTraceReportActivity(trace, now, activity));
    uint64_t id, parent_id;
    int64_t version;
    const char *model, *request_id;
    RETURN_IF_ERROR(TRITONSERVER_InferenceTraceId(trace, &id));
    RETURN_IF_ERROR(TRITONSERVER_InferenceTraceParentId(trace, &parent_id));
    RETURN_IF_ERROR(TRITONSERVER_InferenceTraceModelName(trace, &model));
    RETURN_IF_ERROR(TRITONSERVER_InferenceTraceModelVersion(trace, &version));
    RETURN_IF_ERROR(TRITONSERVER_InferenceTraceRequestId(trace, &request_id));
    RETURN_IF_ERROR(TRITONBACKEND_ResponseSetIntParameter(response, "trace_id", (int64_t)id));
    RETURN_IF_ERROR(
        TRITONBACKEND_ResponseSetIntParameter(response, "trace_parent_id", (int64_t)parent_id));
    RETURN_IF_ERROR(TRITONBACKEND_ResponseSetStringParameter(response, "trace_model", model));
    RETURN_IF_ERROR(TRITONBACKEND_ResponseSetIntParameter(response, "trace_version", version));
    return TRITONBACKEND_ResponseSetStringParameter(response, "trace_request_id", request_id);
}

/* Fills response with OUTPUT<k> = INPUT<k> for every input. */
static TRITONSERVER_Error *copy_inputs(TRITONBACKEND_Request *request,
                                       TRITONBACKEND_Response *response,
                                       TRITONSERVER_Metric *metric)
{
    uint32_t n;
    RETURN_IF_ERROR(TRITONBACKEND_RequestInputCount(request, &n));
    for (uint32_t i = 0; i < n; i++) {
        TRITONBACKEND_Input *input;
        const char *name;
        TRITONSERVER_DataType datatype;
        const int64_t *shape;
        uint32_t dims, buffers;
        uint64_t byte_size;
        RETURN_IF_ERROR(TRITONBACKEND_RequestInputByIndex(request, i, &input));
        RETURN_IF_ERROR(TRITONBACKEND_InputProperties(input, &name, &datatype, &shape, &dims,
                                                      &byte_size, &buffers));
        if (metric) RETURN_IF_ERROR(TRITONSERVER_MetricIncrement(metric, (double)byte_size));
        if (strncmp(name, "INPUT", 5) != 0) continue;
        char out_name[64];
        snprintf(out_name, sizeof out_name, "OUTPUT%s", name + 5);
        TRITONBACKEND_Output *output;
        RETURN_IF_ERROR(
            TRITONBACKEND_ResponseOutput(response, &output, out_name, datatype, shape, dims));
        void *out;
        TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
        int64_t type_id = 0;
        RETURN_IF_ERROR(TRITONBACKEND_OutputBuffer(output, &out, byte_size, &type, &type_id));
        if (type == TRITONSERVER_MEMORY_GPU)
            return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED, "GPU output buffer");
        uint64_t done = 0;
        for (uint32_t b = 0; b < buffers; b++) {
            const void *in;
            uint64_t size;
            TRITONSERVER_MemoryType in_type = TRITONSERVER_MEMORY_CPU;
            int64_t in_id = 0;
            RETURN_IF_ERROR(TRITONBACKEND_InputBuffer(input, b, &in, &size, &in_type, &in_id));
            if (done + size > byte_size)
                return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "input buffers overflow");
            memcpy((char *)out + done, in, size);
            done += size;
        }
    }
    return NULL;
}

/* Outputs CORRID (UINT64 [1]) and FLAGS (UINT32 [1]), when the client asks
 * for them: the request's sequence id and flags. */
static TRITONSERVER_Error *sequence_outputs(TRITONBACKEND_Request *request,
                                            TRITONBACKEND_Response *response)
{
    uint32_t n;
    RETURN_IF_ERROR(TRITONBACKEND_RequestOutputCount(request, &n));
    for (uint32_t i = 0; i < n; i++) {
        const char *name;
        RETURN_IF_ERROR(TRITONBACKEND_RequestOutputName(request, i, &name));
        uint64_t id = 0;
        uint32_t flags = 0;
        bool is_id = strcmp(name, "CORRID") == 0;
        if (is_id)
            RETURN_IF_ERROR(TRITONBACKEND_RequestCorrelationId(request, &id));
        else if (strcmp(name, "FLAGS") == 0)
            RETURN_IF_ERROR(TRITONBACKEND_RequestFlags(request, &flags));
        else
            continue;
        const int64_t shape[1] = {1};
        TRITONBACKEND_Output *output;
        RETURN_IF_ERROR(TRITONBACKEND_ResponseOutput(
            response, &output, name, is_id ? TRITONSERVER_TYPE_UINT64 : TRITONSERVER_TYPE_UINT32,
            shape, 1));
        void *out;
        TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
        int64_t type_id = 0;
        RETURN_IF_ERROR(TRITONBACKEND_OutputBuffer(output, &out, is_id ? 8 : 4, &type, &type_id));
        if (is_id)
            memcpy(out, &id, 8);
        else
            memcpy(out, &flags, 4);
    }
    return NULL;
}

static void respond(TRITONBACKEND_ModelInstance *instance, TRITONBACKEND_Request *request,
                    uint32_t flags)
{
    TRITONBACKEND_Model *model;
    void *vstate = NULL;
    log_error(TRITONBACKEND_ModelInstanceModel(instance, &model));
    log_error(TRITONBACKEND_ModelState(model, &vstate));
    const model_state_t *state = vstate;
    TRITONBACKEND_Response *response;
    TRITONSERVER_Error *err = TRITONBACKEND_ResponseNew(&response, request);
    if (err) return log_error(err);
    err = copy_inputs(request, response, state->metric);
    if (!err) err = sequence_outputs(request, response);
    if (!err) err = trace_activity(request, response);
    /* as Triton's identity backend does */
    if (!err && !state->response_parameters) goto send;
    if (!err) err = TRITONBACKEND_ResponseSetStringParameter(response, "param0", "an example");
    if (!err) err = TRITONBACKEND_ResponseSetIntParameter(response, "param1", 42);
    if (!err) err = TRITONBACKEND_ResponseSetBoolParameter(response, "param2", false);
    if (!err) err = TRITONBACKEND_ResponseSetDoubleParameter(response, "param3", 0.5);
send:
    log_error(TRITONBACKEND_ResponseSend(response, flags, err));
    TRITONSERVER_ErrorDelete(err);
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance *instance,
                                                       TRITONBACKEND_Request **requests,
                                                       const uint32_t count)
{
    uint64_t start = 0;
    void *mark = NULL;
    RETURN_IF_ERROR(TRITONBACKEND_ModelInstanceState(instance, &mark));
    if (mark)
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL,
                                     "tidentity: a passive instance was given requests");
    for (uint32_t r = 0; r < count; r++)
        if (strcmp(request_mode(requests[r]), "execute_error") == 0)
            return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNAVAILABLE,
                                         "tidentity: execute failed as requested");
    for (uint32_t r = 0; r < count; r++) {
        TRITONBACKEND_Request *request = requests[r];
        const char *mode = request_mode(request);
        bool release = true;
        if (strcmp(mode, "no_release") == 0) {
            respond(instance, request, TRITONSERVER_RESPONSE_COMPLETE_FINAL);
            release = false;
        } else if (strcmp(mode, "double_release") == 0) {
            TRITONBACKEND_ResponseFactory *factory;
            log_error(TRITONBACKEND_ResponseFactoryNew(&factory, request));
            log_error(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL));
            TRITONSERVER_Error *second =
                TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL);
            TRITONBACKEND_Response *response;
            if (!TRITONBACKEND_ResponseNewFromFactory(&response, factory)) {
                TRITONSERVER_Error *err = second
                                              ? second
                                              : TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL,
                                                                      "second release succeeded");
                log_error(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                                                     err));
                TRITONSERVER_ErrorDelete(err);
            }
            TRITONBACKEND_ResponseFactoryDelete(factory);
            continue;
        } else if (strcmp(mode, "double_send") == 0) {
            respond(instance, request, TRITONSERVER_RESPONSE_COMPLETE_FINAL);
            respond(instance, request, TRITONSERVER_RESPONSE_COMPLETE_FINAL);
        } else if (strcmp(mode, "no_final") == 0) {
            respond(instance, request, 0);
        } else if (strcmp(mode, "two_responses") == 0) {
            TRITONBACKEND_ResponseFactory *factory;
            if (!TRITONBACKEND_ResponseFactoryNew(&factory, request)) {
                respond(instance, request, 0);
                respond(instance, request, 0);
                log_error(TRITONBACKEND_ResponseFactorySendFlags(
                    factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL));
                TRITONBACKEND_ResponseFactoryDelete(factory);
            }
        } else if (strcmp(mode, "error_response") == 0) {
            TRITONBACKEND_Response *response;
            if (!TRITONBACKEND_ResponseNew(&response, request)) {
                TRITONSERVER_Error *err =
                    TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, "requested error");
                log_error(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                                                     err));
                TRITONSERVER_ErrorDelete(err);
            }
        } else if (strcmp(mode, "no_response") != 0) {
            respond(instance, request, TRITONSERVER_RESPONSE_COMPLETE_FINAL);
        }
        log_error(TRITONBACKEND_ModelInstanceReportStatistics(instance, request, true, start, start,
                                                              start, start));
        if (release)
            log_error(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL));
    }
    return TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, count, start, start, start,
                                                            start);
}
