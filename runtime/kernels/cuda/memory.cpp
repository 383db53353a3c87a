// Caching device allocator and pinned host buffers over the CUDA runtime (see memory.h).
// One BlockCache per device, created on first use; a map from block to device routes frees.
#include "kernels/cuda/memory.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "common/error.h"
#include "common/strings.h"
#include "kernels/cuda/check.h"

namespace ds::rt::cuda {

namespace {

// Runs `fn` with `device` current, restoring the previous device after.
template <typename Fn>
void on_device(int device, Fn&& fn) {
  int prev = 0;
  DS_CUDA_CHECK(cudaGetDevice(&prev));
  if (prev != device) DS_CUDA_CHECK(cudaSetDevice(device));
  try {
    fn();
  } catch (...) {
    if (prev != device) cudaSetDevice(prev);
    throw;
  }
  if (prev != device) DS_CUDA_CHECK(cudaSetDevice(prev));
}

std::unique_ptr<BlockCache> make_cache(int device) {
  auto alloc = [device](size_t bytes) -> void* {
    void* p = nullptr;
    on_device(device, [&] {
      const cudaError_t e = cudaMalloc(&p, bytes);
      if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();  // clear it; the cache empties itself and retries
        p = nullptr;
        return;
      }
      DS_CUDA_CHECK(e);
    });
    return p;
  };
  auto release = [device](void* p, size_t) {
    try {
      on_device(device, [&] { DS_CUDA_CHECK(cudaFree(p)); });
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dstrain: freeing device memory failed: %s\n", e.what());
    }
  };
  return std::make_unique<BlockCache>(alloc, release);
}

struct Registry {
  std::mutex mu;
  std::map<int, std::unique_ptr<BlockCache>> caches;
  std::unordered_map<void*, int> owner;  // block -> device
};

Registry& registry() {
  // Leaked on purpose: frees may arrive from static destructors after main returns.
  static Registry* r = new Registry;
  return *r;
}

BlockCache& cache_for(Registry& r, int device) {
  auto& c = r.caches[device];
  if (!c) c = make_cache(device);
  return *c;
}

// A process without a visible GPU gets the same clear error as a build without CUDA.
void require_gpu(std::string_view what, size_t bytes, const char* kind) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (e != cudaSuccess) cudaGetLastError();
    throw invalid_usage("allocating {} ({} bytes) as {}: no CUDA device is visible ({})", what,
                        bytes, kind, e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  }
}

}  // namespace

void* device_alloc(size_t bytes, std::string_view what) {
  if (bytes == 0) return nullptr;
  require_gpu(what, bytes, "device memory");
  int device = 0;
  DS_CUDA_CHECK(cudaGetDevice(&device));
  Registry& r = registry();
  BlockCache* cache = nullptr;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    cache = &cache_for(r, device);
  }
  void* p = cache->allocate(bytes);
  if (p == nullptr) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    const auto st = cache->stats();
    throw system_error("out of GPU memory allocating {} ({}) on device {}: {} free of {}, this "
                       "process holds {} in its cache",
                       what, format_bytes(static_cast<double>(bytes)), device,
                       format_bytes(static_cast<double>(free_b)),
                       format_bytes(static_cast<double>(total_b)),
                       format_bytes(static_cast<double>(st.reserved_bytes)));
  }
  try {
    DS_CUDA_CHECK(cudaMemset(p, 0, bytes));
    DS_CUDA_CHECK(cudaDeviceSynchronize());  // zero-filled means finished, as on the CPU
  } catch (...) {
    cache->release(p);
    throw;
  }
  std::lock_guard<std::mutex> lock(r.mu);
  r.owner[p] = device;
  return p;
}

void device_free(void* p) noexcept {
  if (p == nullptr) return;
  Registry& r = registry();
  BlockCache* cache = nullptr;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.owner.find(p);
    if (it == r.owner.end()) {
      std::fprintf(stderr, "dstrain: device_free(%p): not a block of the device cache\n", p);
      return;
    }
    cache = &cache_for(r, it->second);
    r.owner.erase(it);
  }
  try {
    cache->release(p);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dstrain: device_free: %s\n", e.what());
  }
}

void* pinned_alloc(size_t bytes, std::string_view what) {
  if (bytes == 0) return nullptr;
  require_gpu(what, bytes, "pinned host memory");
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw system_error("out of pinned host memory allocating {} ({})", what,
                       format_bytes(static_cast<double>(bytes)));
  }
  DS_CUDA_CHECK(e);
  std::memset(p, 0, bytes);
  return p;
}

void pinned_free(void* p) noexcept {
  if (p == nullptr) return;
  const cudaError_t e = cudaFreeHost(p);
  if (e != cudaSuccess) {
    std::fprintf(stderr, "dstrain: cudaFreeHost failed: %s\n", cudaGetErrorString(e));
  }
}

void memset_zero_async(void* p, size_t bytes, void* stream) {
  if (bytes == 0) return;
  DS_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, static_cast<cudaStream_t>(stream)));
}

void copy_to_device(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  DS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  cudaPointerAttributes attr{};
  DS_CUDA_CHECK(cudaPointerGetAttributes(&attr, src));
  // A pinned source is read by the DMA later: wait so the caller may reuse it at once. While the
  // stream is being captured into a CUDA graph the copy is a node of the graph, which reads the
  // pinned buffer at every replay: no wait (the caller fills the buffer before each replay).
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  DS_CUDA_CHECK(cudaStreamIsCapturing(s, &capturing));
  if (attr.type == cudaMemoryTypeHost && capturing == cudaStreamCaptureStatusNone) {
    DS_CUDA_CHECK(cudaStreamSynchronize(s));
  }
}

void copy_to_host(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  DS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  DS_CUDA_CHECK(cudaStreamSynchronize(s));
}

void copy_on_device(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0 || dst == src) return;
  DS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
}

void copy_rows(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows, void* stream) {
  if (width == 0 || rows == 0) return;
  DS_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault,
                                  static_cast<cudaStream_t>(stream)));
}

void set_device(int device, std::string_view who) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    throw system_error("{}: no CUDA device is usable: {}", who, cudaGetErrorString(e));
  }
  if (device < 0 || device >= count) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{}: CUDA device {} does not exist; {} GPU(s) are visible", who, device,
                            count),
                "start at most as many ranks per node as the node has GPUs (the hostfile's "
                "slots), or check CUDA_VISIBLE_DEVICES");
  }
  DS_CUDA_CHECK(cudaSetDevice(device));
}

BlockCacheStats device_cache_stats(int device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.caches.find(device);
  return it == r.caches.end() ? BlockCacheStats{} : it->second->stats();
}

void device_empty_cache() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& [dev, c] : r.caches) c->empty();
}

}  // namespace ds::rt::cuda
