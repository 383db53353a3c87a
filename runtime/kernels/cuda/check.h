// Error checks for CUDA and cuBLAS calls, for the .cu files and the host code that calls CUDA.
// Every call goes through DS_CUDA_CHECK / DS_CUBLAS_CHECK: a failure throws ds::Error (kind
// system) naming the call as written, file:line and CUDA's error string. The throwing function
// lives in check.cpp (compiled by the host compiler) so the .cu files never include the C++20
// headers of lib/common.
#pragma once

#include <cuda_runtime_api.h>

namespace ds::rt::cuda {

// Throws ds::Error("<api> call `<call>` failed at <file>:<line>: <message> (code <code>)").
[[noreturn]] void throw_cuda_error(const char* api, const char* call, const char* file, int line,
                                   int code, const char* message);

}  // namespace ds::rt::cuda

#define DS_CUDA_CHECK(call)                                                               \
  do {                                                                                    \
    const cudaError_t ds_err_ = (call);                                                   \
    if (ds_err_ != cudaSuccess) {                                                         \
      ::ds::rt::cuda::throw_cuda_error("CUDA", #call, __FILE__, __LINE__,                 \
                                       static_cast<int>(ds_err_), cudaGetErrorString(ds_err_)); \
    }                                                                                     \
  } while (0)

// After a kernel launch: launch-configuration errors (and earlier sticky errors) surface here.
#define DS_CUDA_CHECK_LAUNCH(what) DS_CUDA_CHECK(cudaGetLastError())

// cuBLAS / cuBLASLt: include cublas_v2.h before using it.
#define DS_CUBLAS_CHECK(call)                                                              \
  do {                                                                                     \
    const cublasStatus_t ds_st_ = (call);                                                  \
    if (ds_st_ != CUBLAS_STATUS_SUCCESS) {                                                 \
      ::ds::rt::cuda::throw_cuda_error("cuBLAS", #call, __FILE__, __LINE__,                \
                                       static_cast<int>(ds_st_), cublasGetStatusString(ds_st_)); \
    }                                                                                      \
  } while (0)
