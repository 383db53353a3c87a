// The CUDA module's memory, device, stream and graph entry points (core/cuda_module.h), as one
// table of function pointers: what the tagged allocator (core/allocator.h), the device query
// (core/device.h), the kernel dispatch's copies (kernels/dispatch.h) and the trainer's CUDA graph
// (train/step_graph.h) call on a CUDA device. The module fills it from kernels/cuda/memory.h,
// kernels/cuda/graph.h and kernels/cuda/device_query.cu; each entry keeps that contract.
// CUDA-free: stream arguments are cudaStream_t passed as void* (nullptr = legacy default stream).
#pragma once

#include <cstddef>
#include <string_view>

#include "core/block_cache.h"
#include "core/device.h"

namespace ds::rt {

struct CudaMemoryTable {
  void* (*device_alloc)(size_t bytes, std::string_view what);
  void (*device_free)(void* p) noexcept;
  void* (*pinned_alloc)(size_t bytes, std::string_view what);
  void (*pinned_free)(void* p) noexcept;
  void (*memset_zero_async)(void* p, size_t bytes, void* stream);
  void (*copy_to_device)(void* dst, const void* src, size_t bytes, void* stream);
  void (*copy_to_host)(void* dst, const void* src, size_t bytes, void* stream);
  void (*copy_on_device)(void* dst, const void* src, size_t bytes, void* stream);
  void (*copy_rows)(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows, void* stream);
  void (*set_device)(int device, std::string_view who);
  BlockCacheStats (*device_cache_stats)(int device);
  void (*device_empty_cache)();
  AcceleratorInfo (*query_accelerators)();
  // Streams and CUDA graphs (kernels/cuda/graph.h).
  void* (*stream_create)();
  void (*stream_destroy)(void* stream) noexcept;
  void (*graph_begin_capture)(void* stream);
  void* (*graph_end_capture)(void* stream, size_t* nodes);
  void (*graph_abort_capture)(void* stream) noexcept;
  void (*graph_launch)(void* graph, void* stream);
  void (*graph_destroy)(void* graph) noexcept;
};

// The module's table (loading it on first use); throws as cuda_module_symbol does, with
// `purpose` naming what asked.
const CudaMemoryTable& cuda_memory(std::string_view purpose = "a CUDA device");

}  // namespace ds::rt

// Exported by the module.
extern "C" const ds::rt::CudaMemoryTable* ds_cuda_memory_table();
