/* CPU stand-ins for the few CUDA runtime names Triton's QA test backends
 * (server repository src/test/) call unconditionally. Nereid hands a backend
 * host memory only (every buffer is TRITONSERVER_MEMORY_CPU, even when the
 * backend asks for GPU memory), so any pointer that reaches these is a host
 * pointer: the copies and sets are done on the host, synchronously.
 * Force-included (-include) by scripts/build_triton_qa_backends.sh. */
#pragma once
#include <cstddef>
#include <cstring>

typedef int cudaError_t;
typedef void *cudaStream_t;
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};
static const cudaError_t cudaSuccess = 0;

inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind)
{
    std::memmove(dst, src, n);
    return cudaSuccess;
}
inline cudaError_t cudaMemset(void *dst, int value, size_t n)
{
    std::memset(dst, value, n);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                                   cudaStream_t)
{
    return cudaMemcpy(dst, src, n, kind);
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t)
{
    return cudaSuccess;
}
inline const char *cudaGetErrorString(cudaError_t)
{
    return "no error";
}

/* backend_common.h defines this only with TRITON_ENABLE_GPU. */
#define LOG_IF_CUDA_ERROR(X, MSG) ((void)(X), (void)(MSG))
