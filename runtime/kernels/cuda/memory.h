// Device memory for the tagged allocator (core/allocator.h): a caching allocator over cudaMalloc
// per device (core/block_cache.h's policy; never managed memory) and pinned host buffers
// (cudaHostAlloc) for CPU offload and fast host<->device copies. Host-only header; the functions
// exist only inside the CUDA module (core/cuda_module.h); the rest of dstrain reaches them
// through core/cuda_memory_table.h.
//
// Most code never calls these directly: Allocator::allocate(bytes, tag, name, Device::kCuda or
// Device::kCudaHost) does, and counts the bytes per tag exactly as for CPU buffers (the requested
// bytes, not the cache's rounded block sizes; the cache's own figures are device_cache_stats()).
//
// Contract:
// - device_alloc allocates on the CURRENT device (cudaSetDevice) and returns zero-filled memory
//   (the fill is complete when it returns). device_free returns the block to that device's cache
//   (any current device); the memory must no longer be used by queued kernels (free after the
//   stream that used it is synchronised, or keep the buffer alive across steps, as the runtime
//   does: allocate once, reuse).
// - pinned_alloc returns zero-filled page-locked host memory (not cached); pinned_free frees it.
// - Thread safety: every function may be called from any thread.
// - Failure: out of device memory (even after emptying the cache) throws ds::Error (system)
//   naming `what`, the size, the device and its free/total memory; other CUDA errors throw
//   through DS_CUDA_CHECK. device_free/pinned_free never throw (errors are logged to stderr).
#pragma once

#include <cstddef>
#include <string_view>

#include "core/block_cache.h"
#include "core/device.h"

namespace ds::rt::cuda {

void* device_alloc(size_t bytes, std::string_view what);
void device_free(void* p) noexcept;
void* pinned_alloc(size_t bytes, std::string_view what);
void pinned_free(void* p) noexcept;

// Stream-ordered helpers for host code that must not include CUDA headers; `stream` is a
// cudaStream_t (nullptr = the legacy default stream). Errors throw through DS_CUDA_CHECK. The
// copies infer the direction from the pointers (cudaMemcpyDefault, unified addressing), so pinned
// host buffers (offloaded optimizer state) may stand on either side of any of them.
// memset_zero_async: bytes of device memory at p set to 0, in stream order.
void memset_zero_async(void* p, size_t bytes, void* stream);
// copy_to_device_async: host -> device in stream order; the host source may be reused as soon as
// the call returns (pageable sources are staged by CUDA; pinned ones are copied synchronously
// here to keep that promise).
void copy_to_device(void* dst, const void* src, size_t bytes, void* stream);
// copy_to_host: device -> host after the work queued on `stream`; returns when the data is there.
void copy_to_host(void* dst, const void* src, size_t bytes, void* stream);
// copy_on_device: device -> device (same device), in stream order; the ranges must not overlap.
void copy_on_device(void* dst, const void* src, size_t bytes, void* stream);
// copy_rows: `rows` rows of `width` bytes, row r from src + r * spitch to dst + r * dpitch
// (cudaMemcpy2DAsync, direction inferred), in stream order; the ranges must not overlap.
void copy_rows(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows, void* stream);
// Makes `device` current on the calling thread (cudaSetDevice), naming `who` in the error (e.g. a
// LOCAL_RANK beyond the visible GPUs).
void set_device(int device, std::string_view who);

// The cache of one device (zeros for a device never allocated on).
BlockCacheStats device_cache_stats(int device);
// Returns the cached (free) blocks of every device to CUDA.
void device_empty_cache();

}  // namespace ds::rt::cuda

namespace ds::rt {
// CUDA and NCCL facts (kernels/cuda/device_query.cu); never throws.
AcceleratorInfo cuda_query_accelerators();
}  // namespace ds::rt
