/*
 * This file contains the slice of the ONNX Runtime C API that Nereid uses,
 * declared here because no headers ship with the runtime library. The C API
 * is a table of function pointers in a fixed, append-only order (OrtApi in
 * onnxruntime_c_api.h); each function below is listed with its slot index in
 * that table. Most slots used are inside the frozen "Version 1" block
 * (0-101); the shared (global) thread pool calls (119-149) were added after it,
 * GetResizedStringTensorElementBuffer (slot 252, binary-safe string input)
 * with API version 13 (ORT 1.13), so the table is requested with API
 * version 13.
 *
 * ort_api_load() dlopens the library, checks OrtGetApiBase and fills a
 * struct of typed function pointers. Shared by the onnxruntime backend and
 * bench/bench_ort.c.
 */
#ifndef NEREID_ORT_API_H
#define NEREID_ORT_API_H

#include <dlfcn.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct OrtEnv OrtEnv;
typedef struct OrtStatus OrtStatus;
typedef struct OrtMemoryInfo OrtMemoryInfo;
typedef struct OrtSession OrtSession;
typedef struct OrtValue OrtValue;
typedef struct OrtRunOptions OrtRunOptions;
typedef struct OrtTypeInfo OrtTypeInfo;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtAllocator OrtAllocator;
typedef struct OrtThreadingOptions OrtThreadingOptions;

/* ONNXTensorElementDataType (TensorProto.DataType numbering). */
enum {
    ORT_ELEM_UNDEFINED = 0,
    ORT_ELEM_FLOAT = 1,
    ORT_ELEM_UINT8 = 2,
    ORT_ELEM_INT8 = 3,
    ORT_ELEM_UINT16 = 4,
    ORT_ELEM_INT16 = 5,
    ORT_ELEM_INT32 = 6,
    ORT_ELEM_INT64 = 7,
    ORT_ELEM_STRING = 8,
    ORT_ELEM_BOOL = 9,
    ORT_ELEM_FLOAT16 = 10,
    ORT_ELEM_DOUBLE = 11,
    ORT_ELEM_UINT32 = 12,
    ORT_ELEM_UINT64 = 13,
    ORT_ELEM_BFLOAT16 = 16,
};

enum { ORT_TYPE_TENSOR = 1 };                    /* ONNXType */
enum { ORT_LOG_WARNING = 2, ORT_LOG_ERROR = 3 }; /* OrtLoggingLevel */
enum { ORT_ARENA_ALLOCATOR = 1 };                /* OrtAllocatorType */
enum { ORT_MEM_TYPE_DEFAULT = 0 };               /* OrtMemType */
enum { ORT_SEQUENTIAL = 0, ORT_PARALLEL = 1 };   /* ExecutionMode */
enum {                                           /* GraphOptimizationLevel */
       ORT_DISABLE_ALL = 0,
       ORT_ENABLE_BASIC = 1,
       ORT_ENABLE_EXTENDED = 2,
       ORT_ENABLE_ALL = 99
};

/* X(slot, return type, name, parameter list) */
#define ORT_API_MAP(X)                                                                             \
    X(1, int, GetErrorCode, (const OrtStatus *status))                                             \
    X(2, const char *, GetErrorMessage, (const OrtStatus *status))                                 \
    X(3, OrtStatus *, CreateEnv, (int log_level, const char *logid, OrtEnv **out))                 \
    X(7, OrtStatus *, CreateSession,                                                               \
      (const OrtEnv *env, const char *path, const OrtSessionOptions *opts, OrtSession **out))      \
    X(8, OrtStatus *, CreateSessionFromArray,                                                      \
      (const OrtEnv *env, const void *data, size_t len, const OrtSessionOptions *opts,             \
       OrtSession **out))                                                                          \
    X(9, OrtStatus *, Run,                                                                         \
      (OrtSession * session, const OrtRunOptions *run_options, const char *const *input_names,     \
       const OrtValue *const *inputs, size_t n_inputs, const char *const *output_names,            \
       size_t n_outputs, OrtValue **outputs))                                                      \
    X(10, OrtStatus *, CreateSessionOptions, (OrtSessionOptions * *out))                           \
    X(13, OrtStatus *, SetSessionExecutionMode, (OrtSessionOptions * opts, int mode))              \
    X(16, OrtStatus *, EnableMemPattern, (OrtSessionOptions * opts))                               \
    X(17, OrtStatus *, DisableMemPattern, (OrtSessionOptions * opts))                              \
    X(18, OrtStatus *, EnableCpuMemArena, (OrtSessionOptions * opts))                              \
    X(19, OrtStatus *, DisableCpuMemArena, (OrtSessionOptions * opts))                             \
    X(23, OrtStatus *, SetSessionGraphOptimizationLevel, (OrtSessionOptions * opts, int level))    \
    X(24, OrtStatus *, SetIntraOpNumThreads, (OrtSessionOptions * opts, int n))                    \
    X(25, OrtStatus *, SetInterOpNumThreads, (OrtSessionOptions * opts, int n))                    \
    X(30, OrtStatus *, SessionGetInputCount, (const OrtSession *session, size_t *out))             \
    X(31, OrtStatus *, SessionGetOutputCount, (const OrtSession *session, size_t *out))            \
    X(32, OrtStatus *, SessionGetOverridableInitializerCount,                                      \
      (const OrtSession *session, size_t *out))                                                    \
    X(33, OrtStatus *, SessionGetInputTypeInfo,                                                    \
      (const OrtSession *session, size_t index, OrtTypeInfo **out))                                \
    X(34, OrtStatus *, SessionGetOutputTypeInfo,                                                   \
      (const OrtSession *session, size_t index, OrtTypeInfo **out))                                \
    X(35, OrtStatus *, SessionGetOverridableInitializerTypeInfo,                                   \
      (const OrtSession *session, size_t index, OrtTypeInfo **out))                                \
    X(36, OrtStatus *, SessionGetInputName,                                                        \
      (const OrtSession *session, size_t index, OrtAllocator *allocator, char **out))              \
    X(37, OrtStatus *, SessionGetOutputName,                                                       \
      (const OrtSession *session, size_t index, OrtAllocator *allocator, char **out))              \
    X(38, OrtStatus *, SessionGetOverridableInitializerName,                                       \
      (const OrtSession *session, size_t index, OrtAllocator *allocator, char **out))              \
    X(48, OrtStatus *, CreateTensorAsOrtValue,                                                     \
      (OrtAllocator * allocator, const int64_t *shape, size_t rank, int elem_type,                 \
       OrtValue **out))                                                                            \
    X(49, OrtStatus *, CreateTensorWithDataAsOrtValue,                                             \
      (const OrtMemoryInfo *info, void *data, size_t byte_size, const int64_t *shape, size_t rank, \
       int elem_type, OrtValue **out))                                                             \
    X(51, OrtStatus *, GetTensorMutableData, (OrtValue * value, void **out))                       \
    X(53, OrtStatus *, GetStringTensorDataLength, (const OrtValue *value, size_t *out))            \
    X(54, OrtStatus *, GetStringTensorContent,                                                     \
      (const OrtValue *value, void *s, size_t s_len, size_t *offsets, size_t n_offsets))           \
    X(55, OrtStatus *, CastTypeInfoToTensorInfo,                                                   \
      (const OrtTypeInfo *type_info, const OrtTensorTypeAndShapeInfo **out))                       \
    X(56, OrtStatus *, GetOnnxTypeFromTypeInfo, (const OrtTypeInfo *type_info, int *out))          \
    X(60, OrtStatus *, GetTensorElementType, (const OrtTensorTypeAndShapeInfo *info, int *out))    \
    X(61, OrtStatus *, GetDimensionsCount, (const OrtTensorTypeAndShapeInfo *info, size_t *out))   \
    X(62, OrtStatus *, GetDimensions,                                                              \
      (const OrtTensorTypeAndShapeInfo *info, int64_t *dims, size_t n_dims))                       \
    X(64, OrtStatus *, GetTensorShapeElementCount,                                                 \
      (const OrtTensorTypeAndShapeInfo *info, size_t *out))                                        \
    X(65, OrtStatus *, GetTensorTypeAndShape,                                                      \
      (const OrtValue *value, OrtTensorTypeAndShapeInfo **out))                                    \
    X(69, OrtStatus *, CreateCpuMemoryInfo,                                                        \
      (int allocator_type, int mem_type, OrtMemoryInfo **out))                                     \
    X(76, OrtStatus *, AllocatorFree, (OrtAllocator * allocator, void *p))                         \
    X(78, OrtStatus *, GetAllocatorWithDefaultOptions, (OrtAllocator * *out))                      \
    X(92, void, ReleaseEnv, (OrtEnv * env))                                                        \
    X(93, void, ReleaseStatus, (OrtStatus * status))                                               \
    X(94, void, ReleaseMemoryInfo, (OrtMemoryInfo * info))                                         \
    X(95, void, ReleaseSession, (OrtSession * session))                                            \
    X(96, void, ReleaseValue, (OrtValue * value))                                                  \
    X(98, void, ReleaseTypeInfo, (OrtTypeInfo * type_info))                                        \
    X(99, void, ReleaseTensorTypeAndShapeInfo, (OrtTensorTypeAndShapeInfo * info))                 \
    X(100, void, ReleaseSessionOptions, (OrtSessionOptions * opts))                                \
    X(119, OrtStatus *, CreateEnvWithGlobalThreadPools,                                            \
      (int log_level, const char *logid, const OrtThreadingOptions *tp_options, OrtEnv **out))     \
    X(120, OrtStatus *, DisablePerSessionThreads, (OrtSessionOptions * opts))                      \
    X(121, OrtStatus *, CreateThreadingOptions, (OrtThreadingOptions * *out))                      \
    X(122, void, ReleaseThreadingOptions, (OrtThreadingOptions * tp_options))                      \
    X(130, OrtStatus *, AddSessionConfigEntry,                                                     \
      (OrtSessionOptions * opts, const char *key, const char *value))                              \
    X(147, OrtStatus *, SetGlobalIntraOpNumThreads, (OrtThreadingOptions * tp_options, int n))     \
    X(148, OrtStatus *, SetGlobalInterOpNumThreads, (OrtThreadingOptions * tp_options, int n))     \
    X(149, OrtStatus *, SetGlobalSpinControl, (OrtThreadingOptions * tp_options, int allow_spin))  \
    X(252, OrtStatus *, GetResizedStringTensorElementBuffer,                                       \
      (OrtValue * value, size_t index, size_t length, char **buffer))

#define ORT_API_VERSION_USED 13u

typedef struct ort_api {
    void *dl;            /* dlopen handle of libonnxruntime.so.1 */
    const char *version; /* ORT's version string, e.g. "1.30.0" */
#define X(slot, ret, name, params) ret(*name) params;
    ORT_API_MAP(X)
#undef X
} ort_api_t;

/* OrtApiBase: { const OrtApi *(*GetApi)(uint32_t); const char *(*GetVersionString)(void); } */
typedef void (*ort_any_fn)(void);
typedef struct ort_api_base {
    const ort_any_fn *(*get_api)(uint32_t version);
    const char *(*get_version_string)(void);
} ort_api_base_t;

/* Loads the library at path and fills api. Returns 0, or -1 with a message
 * in err (err_size bytes). On failure nothing stays loaded. */
static inline int ort_api_load(ort_api_t *api, const char *path, char *err, size_t err_size)
{
    memset(api, 0, sizeof(*api));
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        if (snprintf(err, err_size, "cannot load ONNX Runtime library '%s': %s", path, dlerror()) <
            0)
            err[0] = '\0';
        return -1;
    }
    const ort_api_base_t *(*get_base)(void);
    *(void **)&get_base = dlsym(dl, "OrtGetApiBase");
    const ort_api_base_t *base = get_base ? get_base() : NULL;
    const ort_any_fn *table = base ? base->get_api(ORT_API_VERSION_USED) : NULL;
    if (!table) {
        if (snprintf(err, err_size,
                     "'%s' is not a usable ONNX Runtime library (no OrtGetApiBase or API v%u)",
                     path, ORT_API_VERSION_USED) < 0)
            err[0] = '\0';
        dlclose(dl);
        return -1;
    }
    api->dl = dl;
    api->version = base->get_version_string();
#define X(slot, ret, name, params) api->name = (ret(*) params)table[slot];
    ORT_API_MAP(X)
#undef X
    return 0;
}

static inline void ort_api_unload(ort_api_t *api)
{
    if (api->dl) dlclose(api->dl);
    memset(api, 0, sizeof(*api));
}

#endif
