// The calling thread's current CUDA stream, as an opaque pointer (a cudaStream_t; nullptr = the
// legacy default stream), so code that must order work against the model's kernels can find
// them without linking the kernels: kern::DeviceScope (runtime/kernels/dispatch.h) sets it while
// a CUDA scope is open, and the NCCL backend (runtime/comm/nccl_comm.cpp) makes its own stream
// wait for this one before every collective (PyTorch's c10d does the same with its
// getCurrentCUDAStream). Header-only and CUDA-free; meaningless in builds without CUDA.
#pragma once

namespace ds {

// One per thread; the inline function's static is one object program-wide.
inline void*& current_cuda_stream() {
  thread_local void* stream = nullptr;
  return stream;
}

}  // namespace ds
