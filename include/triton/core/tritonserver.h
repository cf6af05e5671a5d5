/*
 * This file contains Nereid's declarations of Triton's server API
 * (tritonserver.h): the names, enum values and signatures a backend written
 * for NVIDIA Triton compiles against, so the same backend source builds
 * against Nereid alone. Only the part Nereid's libtritonserver.so
 * implements is declared (errors, messages, parameters, logging, datatypes,
 * custom metrics, in-process inference for BLS, server queries);
 * docs/triton_backends.md lists what each function does in Nereid.
 *
 * Ownership follows Triton: an error a function returns belongs to the
 * caller (TRITONSERVER_ErrorDelete); "New" objects belong to the caller.
 */
#ifndef TRITON_CORE_TRITONSERVER_H
#define TRITON_CORE_TRITONSERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(TRITONSERVER_EXPORTING)
#define TRITONSERVER_DECLSPEC __attribute__((__visibility__("default")))
#else
#define TRITONSERVER_DECLSPEC
#endif

/* Server API version: Nereid implements the part of 1.34 declared here. */
#define TRITONSERVER_API_VERSION_MAJOR 1
#define TRITONSERVER_API_VERSION_MINOR 34

struct TRITONSERVER_BufferAttributes;
struct TRITONSERVER_Error;
struct TRITONSERVER_InferenceRequest;
struct TRITONSERVER_InferenceResponse;
struct TRITONSERVER_InferenceTrace;
struct TRITONSERVER_Message;
struct TRITONSERVER_Metrics;
struct TRITONSERVER_Parameter;
struct TRITONSERVER_ResponseAllocator;
struct TRITONSERVER_Server;
struct TRITONSERVER_ServerOptions;
struct TRITONSERVER_Metric;
struct TRITONSERVER_MetricFamily;
struct TRITONSERVER_MetricArgs;

typedef struct TRITONSERVER_Error TRITONSERVER_Error;
typedef struct TRITONSERVER_Message TRITONSERVER_Message;
typedef struct TRITONSERVER_Parameter TRITONSERVER_Parameter;
typedef struct TRITONSERVER_Server TRITONSERVER_Server;
typedef struct TRITONSERVER_InferenceRequest TRITONSERVER_InferenceRequest;
typedef struct TRITONSERVER_InferenceResponse TRITONSERVER_InferenceResponse;
typedef struct TRITONSERVER_InferenceTrace TRITONSERVER_InferenceTrace;
typedef struct TRITONSERVER_ResponseAllocator TRITONSERVER_ResponseAllocator;
typedef struct TRITONSERVER_BufferAttributes TRITONSERVER_BufferAttributes;
typedef struct TRITONSERVER_Metric TRITONSERVER_Metric;
typedef struct TRITONSERVER_MetricFamily TRITONSERVER_MetricFamily;
typedef struct TRITONSERVER_MetricArgs TRITONSERVER_MetricArgs;

/* ---- Enums (Triton's values) ---- */

typedef enum TRITONSERVER_datatype_enum {
    TRITONSERVER_TYPE_INVALID = 0,
    TRITONSERVER_TYPE_BOOL = 1,
    TRITONSERVER_TYPE_UINT8 = 2,
    TRITONSERVER_TYPE_UINT16 = 3,
    TRITONSERVER_TYPE_UINT32 = 4,
    TRITONSERVER_TYPE_UINT64 = 5,
    TRITONSERVER_TYPE_INT8 = 6,
    TRITONSERVER_TYPE_INT16 = 7,
    TRITONSERVER_TYPE_INT32 = 8,
    TRITONSERVER_TYPE_INT64 = 9,
    TRITONSERVER_TYPE_FP16 = 10,
    TRITONSERVER_TYPE_FP32 = 11,
    TRITONSERVER_TYPE_FP64 = 12,
    TRITONSERVER_TYPE_BYTES = 13,
    TRITONSERVER_TYPE_BF16 = 14
} TRITONSERVER_DataType;

typedef enum TRITONSERVER_memorytype_enum {
    TRITONSERVER_MEMORY_CPU = 0,
    TRITONSERVER_MEMORY_CPU_PINNED = 1,
    TRITONSERVER_MEMORY_GPU = 2
} TRITONSERVER_MemoryType;

typedef enum TRITONSERVER_parametertype_enum {
    TRITONSERVER_PARAMETER_STRING = 0,
    TRITONSERVER_PARAMETER_INT = 1,
    TRITONSERVER_PARAMETER_BOOL = 2,
    TRITONSERVER_PARAMETER_DOUBLE = 3,
    TRITONSERVER_PARAMETER_BYTES = 4
} TRITONSERVER_ParameterType;

typedef enum TRITONSERVER_instancegroupkind_enum {
    TRITONSERVER_INSTANCEGROUPKIND_AUTO = 0,
    TRITONSERVER_INSTANCEGROUPKIND_CPU = 1,
    TRITONSERVER_INSTANCEGROUPKIND_GPU = 2,
    TRITONSERVER_INSTANCEGROUPKIND_MODEL = 3
} TRITONSERVER_InstanceGroupKind;

typedef enum TRITONSERVER_loglevel_enum {
    TRITONSERVER_LOG_INFO = 0,
    TRITONSERVER_LOG_WARN = 1,
    TRITONSERVER_LOG_ERROR = 2,
    TRITONSERVER_LOG_VERBOSE = 3
} TRITONSERVER_LogLevel;

typedef enum TRITONSERVER_errorcode_enum {
    TRITONSERVER_ERROR_UNKNOWN = 0,
    TRITONSERVER_ERROR_INTERNAL = 1,
    TRITONSERVER_ERROR_NOT_FOUND = 2,
    TRITONSERVER_ERROR_INVALID_ARG = 3,
    TRITONSERVER_ERROR_UNAVAILABLE = 4,
    TRITONSERVER_ERROR_UNSUPPORTED = 5,
    TRITONSERVER_ERROR_ALREADY_EXISTS = 6,
    TRITONSERVER_ERROR_CANCELLED = 7
} TRITONSERVER_Error_Code;

typedef enum tritonserver_traceactivity_enum {
    TRITONSERVER_TRACE_REQUEST_START = 0,
    TRITONSERVER_TRACE_QUEUE_START = 1,
    TRITONSERVER_TRACE_COMPUTE_START = 2,
    TRITONSERVER_TRACE_COMPUTE_INPUT_END = 3,
    TRITONSERVER_TRACE_COMPUTE_OUTPUT_START = 4,
    TRITONSERVER_TRACE_COMPUTE_END = 5,
    TRITONSERVER_TRACE_REQUEST_END = 6,
    TRITONSERVER_TRACE_TENSOR_QUEUE_INPUT = 7,
    TRITONSERVER_TRACE_TENSOR_BACKEND_INPUT = 8,
    TRITONSERVER_TRACE_TENSOR_BACKEND_OUTPUT = 9,
    TRITONSERVER_TRACE_CUSTOM_ACTIVITY = 10
} TRITONSERVER_InferenceTraceActivity;

typedef enum tritonserver_requestflag_enum {
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
} TRITONSERVER_RequestFlag;

typedef enum tritonserver_requestreleaseflag_enum {
    TRITONSERVER_REQUEST_RELEASE_ALL = 1,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
} TRITONSERVER_RequestReleaseFlag;

typedef enum tritonserver_responsecompleteflag_enum {
    TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
} TRITONSERVER_ResponseCompleteFlag;

typedef enum tritonserver_batchflag_enum {
    TRITONSERVER_BATCH_UNKNOWN = 1,
    TRITONSERVER_BATCH_FIRST_DIM = 2
} TRITONSERVER_ModelBatchFlag;

typedef enum tritonserver_txn_property_flag_enum {
    TRITONSERVER_TXN_ONE_TO_ONE = 1,
    TRITONSERVER_TXN_DECOUPLED = 2
} TRITONSERVER_ModelTxnPropertyFlag;

typedef enum TRITONSERVER_metrickind_enum {
    TRITONSERVER_METRIC_KIND_COUNTER = 0,
    TRITONSERVER_METRIC_KIND_GAUGE = 1,
    TRITONSERVER_METRIC_KIND_HISTOGRAM = 2
} TRITONSERVER_MetricKind;

/* ---- Callbacks of the in-process inference API ---- */

typedef TRITONSERVER_Error *(*TRITONSERVER_ResponseAllocatorAllocFn_t)(
    TRITONSERVER_ResponseAllocator *allocator, const char *tensor_name, size_t byte_size,
    TRITONSERVER_MemoryType memory_type, int64_t memory_type_id, void *userp, void **buffer,
    void **buffer_userp, TRITONSERVER_MemoryType *actual_memory_type,
    int64_t *actual_memory_type_id);
typedef TRITONSERVER_Error *(*TRITONSERVER_ResponseAllocatorQueryFn_t)(
    TRITONSERVER_ResponseAllocator *allocator, void *userp, const char *tensor_name,
    size_t *byte_size, TRITONSERVER_MemoryType *memory_type, int64_t *memory_type_id);
typedef TRITONSERVER_Error *(*TRITONSERVER_ResponseAllocatorReleaseFn_t)(
    TRITONSERVER_ResponseAllocator *allocator, void *buffer, void *buffer_userp, size_t byte_size,
    TRITONSERVER_MemoryType memory_type, int64_t memory_type_id);
typedef TRITONSERVER_Error *(*TRITONSERVER_ResponseAllocatorStartFn_t)(
    TRITONSERVER_ResponseAllocator *allocator, void *userp);
typedef void (*TRITONSERVER_InferenceRequestReleaseFn_t)(TRITONSERVER_InferenceRequest *request,
                                                         const uint32_t flags, void *userp);
typedef void (*TRITONSERVER_InferenceResponseCompleteFn_t)(TRITONSERVER_InferenceResponse *response,
                                                           const uint32_t flags, void *userp);

/* ---- Versions, datatypes, enums as text ---- */

TRITONSERVER_DECLSPEC TRITONSERVER_Error *TRITONSERVER_ApiVersion(uint32_t *major, uint32_t *minor);
TRITONSERVER_DECLSPEC const char *TRITONSERVER_DataTypeString(TRITONSERVER_DataType datatype);
TRITONSERVER_DECLSPEC TRITONSERVER_DataType TRITONSERVER_StringToDataType(const char *dtype);
TRITONSERVER_DECLSPEC uint32_t TRITONSERVER_DataTypeByteSize(TRITONSERVER_DataType datatype);
TRITONSERVER_DECLSPEC const char *TRITONSERVER_MemoryTypeString(TRITONSERVER_MemoryType memtype);
TRITONSERVER_DECLSPEC const char *
TRITONSERVER_ParameterTypeString(TRITONSERVER_ParameterType paramtype);
TRITONSERVER_DECLSPEC const char *
TRITONSERVER_InstanceGroupKindString(TRITONSERVER_InstanceGroupKind kind);

/* ---- Buffer attributes: memory type, type id, byte size, CUDA IPC handle ---- */

TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_BufferAttributesNew(TRITONSERVER_BufferAttributes **buffer_attributes);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_BufferAttributesDelete(TRITONSERVER_BufferAttributes *buffer_attributes);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_BufferAttributesSetMemoryTypeId(TRITONSERVER_BufferAttributes *buffer_attributes,
                                             int64_t memory_type_id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_BufferAttributesSetMemoryType(TRITONSERVER_BufferAttributes *buffer_attributes,
                                           TRITONSERVER_MemoryType memory_type);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_BufferAttributesSetCudaIpcHandle(TRITONSERVER_BufferAttributes *buffer_attributes,
                                              void *cuda_ipc_handle);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_BufferAttributesSetByteSize(TRITONSERVER_BufferAttributes *buffer_attributes,
                                         size_t byte_size);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_BufferAttributesMemoryTypeId(TRITONSERVER_BufferAttributes *buffer_attributes,
                                          int64_t *memory_type_id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_BufferAttributesMemoryType(TRITONSERVER_BufferAttributes *buffer_attributes,
                                        TRITONSERVER_MemoryType *memory_type);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_BufferAttributesCudaIpcHandle(TRITONSERVER_BufferAttributes *buffer_attributes,
                                           void **cuda_ipc_handle);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_BufferAttributesByteSize(TRITONSERVER_BufferAttributes *buffer_attributes,
                                      size_t *byte_size);

/* ---- Parameters ---- */

/* value points to a NUL-terminated string, int64_t, bool or double by type
 * (copied); NULL for BYTES. Caller frees with TRITONSERVER_ParameterDelete. */
TRITONSERVER_DECLSPEC TRITONSERVER_Parameter *
TRITONSERVER_ParameterNew(const char *name, const TRITONSERVER_ParameterType type,
                          const void *value);
/* The bytes are borrowed, not copied. */
TRITONSERVER_DECLSPEC TRITONSERVER_Parameter *
TRITONSERVER_ParameterBytesNew(const char *name, const void *byte_ptr, const uint64_t size);
TRITONSERVER_DECLSPEC void TRITONSERVER_ParameterDelete(TRITONSERVER_Parameter *parameter);

/* ---- Logging (into Nereid's log) ---- */

TRITONSERVER_DECLSPEC bool TRITONSERVER_LogIsEnabled(TRITONSERVER_LogLevel level);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *TRITONSERVER_LogMessage(TRITONSERVER_LogLevel level,
                                                                  const char *filename,
                                                                  const int line, const char *msg);

/* ---- Errors ---- */

TRITONSERVER_DECLSPEC TRITONSERVER_Error *TRITONSERVER_ErrorNew(TRITONSERVER_Error_Code code,
                                                                const char *msg);
TRITONSERVER_DECLSPEC void TRITONSERVER_ErrorDelete(TRITONSERVER_Error *error);
TRITONSERVER_DECLSPEC TRITONSERVER_Error_Code TRITONSERVER_ErrorCode(TRITONSERVER_Error *error);
TRITONSERVER_DECLSPEC const char *TRITONSERVER_ErrorCodeString(TRITONSERVER_Error *error);
TRITONSERVER_DECLSPEC const char *TRITONSERVER_ErrorMessage(TRITONSERVER_Error *error);

/* ---- Messages (JSON text) ---- */

TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_MessageNewFromSerializedJson(TRITONSERVER_Message **message, const char *base,
                                          size_t byte_size);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *TRITONSERVER_MessageDelete(TRITONSERVER_Message *message);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_MessageSerializeToJson(TRITONSERVER_Message *message, const char **base,
                                    size_t *byte_size);

/* ---- Tracing: a sampled request's trace (TRITONBACKEND_RequestTrace),
 * valid while the backend holds the request ---- */

TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_InferenceTraceReportActivity(TRITONSERVER_InferenceTrace *trace, uint64_t timestamp,
                                          const char *activity_name);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_InferenceTraceId(TRITONSERVER_InferenceTrace *trace, uint64_t *id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_InferenceTraceParentId(TRITONSERVER_InferenceTrace *trace, uint64_t *parent_id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_InferenceTraceModelName(TRITONSERVER_InferenceTrace *trace, const char **model_name);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_InferenceTraceModelVersion(TRITONSERVER_InferenceTrace *trace, int64_t *model_version);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_InferenceTraceRequestId(TRITONSERVER_InferenceTrace *trace, const char **request_id);

/* ---- Response allocator (in-process inference) ---- */

TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_ResponseAllocatorNew(TRITONSERVER_ResponseAllocator **allocator,
                                  TRITONSERVER_ResponseAllocatorAllocFn_t alloc_fn,
                                  TRITONSERVER_ResponseAllocatorReleaseFn_t release_fn,
                                  TRITONSERVER_ResponseAllocatorStartFn_t start_fn);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_ResponseAllocatorSetQueryFunction(TRITONSERVER_ResponseAllocator *allocator,
                                               TRITONSERVER_ResponseAllocatorQueryFn_t query_fn);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_ResponseAllocatorDelete(TRITONSERVER_ResponseAllocator *allocator);

/* ---- In-process inference requests (BLS) ---- */

TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_InferenceRequestNew(TRITONSERVER_InferenceRequest **inference_request,
                                 TRITONSERVER_Server *server, const char *model_name,
                                 const int64_t model_version);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_InferenceRequestDelete(TRITONSERVER_InferenceRequest *inference_request);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_InferenceRequestSetId(TRITONSERVER_InferenceRequest *inference_request,
                                   const char *id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_InferenceRequestSetFlags(TRITONSERVER_InferenceRequest *inference_request,
                                      uint32_t flags);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_InferenceRequestSetCorrelationId(TRITONSERVER_InferenceRequest *inference_request,
                                              uint64_t correlation_id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *TRITONSERVER_InferenceRequestSetTimeoutMicroseconds(
    TRITONSERVER_InferenceRequest *inference_request, uint64_t timeout_us);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_InferenceRequestAddInput(TRITONSERVER_InferenceRequest *inference_request,
                                      const char *name, const TRITONSERVER_DataType datatype,
                                      const int64_t *shape, uint64_t dim_count);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *TRITONSERVER_InferenceRequestAppendInputData(
    TRITONSERVER_InferenceRequest *inference_request, const char *name, const void *base,
    size_t byte_size, TRITONSERVER_MemoryType memory_type, int64_t memory_type_id);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_InferenceRequestAddRequestedOutput(TRITONSERVER_InferenceRequest *inference_request,
                                                const char *name);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *TRITONSERVER_InferenceRequestSetReleaseCallback(
    TRITONSERVER_InferenceRequest *inference_request,
    TRITONSERVER_InferenceRequestReleaseFn_t request_release_fn, void *request_release_userp);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *TRITONSERVER_InferenceRequestSetResponseCallback(
    TRITONSERVER_InferenceRequest *inference_request,
    TRITONSERVER_ResponseAllocator *response_allocator, void *response_allocator_userp,
    TRITONSERVER_InferenceResponseCompleteFn_t response_fn, void *response_userp);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_InferenceRequestSetStringParameter(TRITONSERVER_InferenceRequest *request,
                                                const char *key, const char *value);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_InferenceRequestSetIntParameter(TRITONSERVER_InferenceRequest *request,
                                             const char *key, const int64_t value);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_InferenceRequestSetBoolParameter(TRITONSERVER_InferenceRequest *request,
                                              const char *key, const bool value);

/* ---- In-process inference responses ---- */

TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_InferenceResponseDelete(TRITONSERVER_InferenceResponse *inference_response);
/* Borrowed: owned by the response. */
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_InferenceResponseError(TRITONSERVER_InferenceResponse *inference_response);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_InferenceResponseOutputCount(TRITONSERVER_InferenceResponse *inference_response,
                                          uint32_t *count);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *TRITONSERVER_InferenceResponseOutput(
    TRITONSERVER_InferenceResponse *inference_response, const uint32_t index, const char **name,
    TRITONSERVER_DataType *datatype, const int64_t **shape, uint64_t *dim_count, const void **base,
    size_t *byte_size, TRITONSERVER_MemoryType *memory_type, int64_t *memory_type_id, void **userp);

/* ---- Server queries a backend makes (TRITONBACKEND_ModelServer) ---- */

/* Ownership of inference_request moves to the server on success only. */
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_ServerInferAsync(TRITONSERVER_Server *server,
                              TRITONSERVER_InferenceRequest *inference_request,
                              TRITONSERVER_InferenceTrace *trace);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_ServerModelIsReady(TRITONSERVER_Server *server, const char *model_name,
                                const int64_t model_version, bool *ready);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_ServerModelTransactionProperties(TRITONSERVER_Server *server, const char *model_name,
                                              const int64_t model_version, uint32_t *txn_flags,
                                              void **voidp);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_ServerModelBatchProperties(TRITONSERVER_Server *server, const char *model_name,
                                        const int64_t model_version, uint32_t *flags, void **voidp);

/* ---- Custom metrics (shown on /metrics) ---- */

TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_MetricFamilyNew(TRITONSERVER_MetricFamily **family, const TRITONSERVER_MetricKind kind,
                             const char *name, const char *description);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_MetricFamilyDelete(TRITONSERVER_MetricFamily *family);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_GetMetricFamilyKind(TRITONSERVER_MetricFamily *family, TRITONSERVER_MetricKind *kind);
/* labels: STRING parameters, copied. */
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_MetricNew(TRITONSERVER_Metric **metric, TRITONSERVER_MetricFamily *family,
                       const TRITONSERVER_Parameter **labels, const uint64_t label_count);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *TRITONSERVER_MetricDelete(TRITONSERVER_Metric *metric);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *TRITONSERVER_MetricValue(TRITONSERVER_Metric *metric,
                                                                   double *value);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *TRITONSERVER_MetricIncrement(TRITONSERVER_Metric *metric,
                                                                       double value);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *TRITONSERVER_MetricSet(TRITONSERVER_Metric *metric,
                                                                 double value);
/* Histograms: the bucket boundaries travel in a TRITONSERVER_MetricArgs. */
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_MetricArgsNew(TRITONSERVER_MetricArgs **args);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_MetricArgsSetHistogram(TRITONSERVER_MetricArgs *args, const double *buckets,
                                    const uint64_t buckets_count);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_MetricArgsDelete(TRITONSERVER_MetricArgs *args);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *
TRITONSERVER_MetricNewWithArgs(TRITONSERVER_Metric **metric, TRITONSERVER_MetricFamily *family,
                               const TRITONSERVER_Parameter **labels, const uint64_t label_count,
                               const TRITONSERVER_MetricArgs *args);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *TRITONSERVER_MetricObserve(TRITONSERVER_Metric *metric,
                                                                     double value);
TRITONSERVER_DECLSPEC TRITONSERVER_Error *TRITONSERVER_GetMetricKind(TRITONSERVER_Metric *metric,
                                                                     TRITONSERVER_MetricKind *kind);

#ifdef __cplusplus
}
#endif
#endif
