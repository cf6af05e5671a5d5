/*
 * This file contains a decoupled Triton backend written against Nereid's
 * copy of Triton's headers, for tests/integration/test_triton_backend.py:
 * for input IN (INT32 [n]) it releases the request inside Execute and then,
 * from its own thread, sends n responses OUT = [IN[i]] (response parameter
 * index = i) through a response
 * factory, then the FINAL flag alone (as Triton's repeat backend). It
 * reports each response's statistics as Triton's square backend does
 * (TRITONBACKEND_ModelInstanceReportResponseStatistics: a success per
 * response, then an empty response for the final flag). With
 * request parameter "mode" = "drop_final" it drops the factory without
 * the final flag.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "triton/core/tritonbackend.h"

typedef struct job {
    TRITONBACKEND_ModelInstance *instance;
    TRITONBACKEND_ResponseFactory *factory;
    int32_t *values;
    uint32_t n;
    bool drop_final;
} job_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t idle = PTHREAD_COND_INITIALIZER;
static int running;

static void log_error(TRITONSERVER_Error *err)
{
    if (!err) return;
    TRITONSERVER_LogMessage(TRITONSERVER_LOG_ERROR, __FILE__, __LINE__,
                            TRITONSERVER_ErrorMessage(err));
    TRITONSERVER_ErrorDelete(err);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void report(job_t *job, uint64_t start, uint64_t output_start)
{
    TRITONBACKEND_ModelInstanceResponseStatistics *rs;
    if (TRITONBACKEND_ModelInstanceResponseStatisticsNew(&rs)) return;
    log_error(TRITONBACKEND_ModelInstanceResponseStatisticsSetModelInstance(rs, job->instance));
    log_error(TRITONBACKEND_ModelInstanceResponseStatisticsSetResponseFactory(rs, job->factory));
    log_error(TRITONBACKEND_ModelInstanceResponseStatisticsSetResponseStart(rs, start));
    log_error(TRITONBACKEND_ModelInstanceResponseStatisticsSetComputeOutputStart(rs, output_start));
    log_error(TRITONBACKEND_ModelInstanceResponseStatisticsSetResponseEnd(rs, now_ns()));
    log_error(TRITONBACKEND_ModelInstanceReportResponseStatistics(rs));
    log_error(TRITONBACKEND_ModelInstanceResponseStatisticsDelete(rs));
}

static void *send_all(void *arg)
{
    job_t *job = arg;
    for (uint32_t i = 0; i < job->n; i++) {
        uint64_t start = now_ns();
        TRITONBACKEND_Response *response;
        TRITONSERVER_Error *err = TRITONBACKEND_ResponseNewFromFactory(&response, job->factory);
        if (err) {
            log_error(err);
            break;
        }
        TRITONBACKEND_Output *output;
        const int64_t shape[1] = {1};
        void *buffer;
        TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
        int64_t type_id = 0;
        err = TRITONBACKEND_ResponseOutput(response, &output, "OUT", TRITONSERVER_TYPE_INT32, shape,
                                           1);
        if (!err) err = TRITONBACKEND_OutputBuffer(output, &buffer, 4, &type, &type_id);
        if (!err) memcpy(buffer, &job->values[i], 4);
        if (!err) err = TRITONBACKEND_ResponseSetIntParameter(response, "index", (int64_t)i);
        uint64_t output_start = now_ns();
        log_error(TRITONBACKEND_ResponseSend(response, 0, err));
        TRITONSERVER_ErrorDelete(err);
        report(job, start, output_start);
    }
    if (!job->drop_final) {
        uint64_t start = now_ns();
        report(job, start, 0); /* the final flag: an empty response */
        log_error(TRITONBACKEND_ResponseFactorySendFlags(job->factory,
                                                         TRITONSERVER_RESPONSE_COMPLETE_FINAL));
    }
    TRITONBACKEND_ResponseFactoryDelete(job->factory);
    free(job->values);
    free(job);
    pthread_mutex_lock(&mu);
    if (--running == 0) pthread_cond_broadcast(&idle);
    pthread_mutex_unlock(&mu);
    return NULL;
}

static bool drop_final(TRITONBACKEND_Request *request)
{
    uint32_t n = 0;
    TRITONBACKEND_RequestParameterCount(request, &n);
    for (uint32_t i = 0; i < n; i++) {
        const char *key;
        TRITONSERVER_ParameterType type;
        const void *value;
        if (!TRITONBACKEND_RequestParameter(request, i, &key, &type, &value) &&
            !strcmp(key, "mode") && type == TRITONSERVER_PARAMETER_STRING &&
            !strcmp(value, "drop_final"))
            return true;
    }
    return false;
}

static TRITONSERVER_Error *start(TRITONBACKEND_ModelInstance *instance,
                                 TRITONBACKEND_Request *request)
{
    TRITONBACKEND_Input *input;
    TRITONSERVER_Error *err = TRITONBACKEND_RequestInput(request, "IN", &input);
    if (err) return err;
    TRITONSERVER_DataType datatype;
    uint64_t byte_size;
    uint32_t buffers;
    err = TRITONBACKEND_InputProperties(input, NULL, &datatype, NULL, NULL, &byte_size, &buffers);
    if (err) return err;
    if (datatype != TRITONSERVER_TYPE_INT32 || buffers != 1)
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, "IN must be INT32");
    const void *data;
    uint64_t size;
    TRITONSERVER_MemoryType type = TRITONSERVER_MEMORY_CPU;
    int64_t type_id = 0;
    err = TRITONBACKEND_InputBuffer(input, 0, &data, &size, &type, &type_id);
    if (err) return err;
    job_t *job = calloc(1, sizeof *job);
    job->n = (uint32_t)(size / 4);
    job->values = malloc(size ? size : 1);
    if (size) memcpy(job->values, data, size); /* the request is released before the thread reads */
    job->drop_final = drop_final(request);
    job->instance = instance;
    err = TRITONBACKEND_ResponseFactoryNew(&job->factory, request);
    if (err) {
        free(job->values);
        free(job);
        return err;
    }
    pthread_mutex_lock(&mu);
    running++;
    pthread_mutex_unlock(&mu);
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_create(&thread, &attr, send_all, job);
    pthread_attr_destroy(&attr);
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance *instance,
                                                       TRITONBACKEND_Request **requests,
                                                       const uint32_t count)
{
    for (uint32_t r = 0; r < count; r++) {
        TRITONSERVER_Error *err = start(instance, requests[r]);
        if (err) {
            TRITONBACKEND_Response *response;
            if (!TRITONBACKEND_ResponseNew(&response, requests[r])) {
                log_error(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                                                     err));
            }
            TRITONSERVER_ErrorDelete(err);
        }
        log_error(TRITONBACKEND_RequestRelease(requests[r], TRITONSERVER_REQUEST_RELEASE_ALL));
    }
    return NULL;
}

TRITONSERVER_Error *TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance *instance)
{
    (void)instance;
    pthread_mutex_lock(&mu);
    while (running > 0)
        pthread_cond_wait(&idle, &mu);
    pthread_mutex_unlock(&mu);
    return NULL;
}
