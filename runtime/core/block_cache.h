// BlockCache: the bookkeeping of a caching allocator, separate from the memory it caches, so the
// policy is tested on the host (tests/unit/block_cache) and used over cudaMalloc on the device
// (kernels/cuda/memory.cpp). Header-only: both the runtime and the CUDA library use it.
//
// Policy (deliberately simple, PyTorch's caching allocator without block splitting):
// - Sizes are rounded up: to a multiple of 512 bytes below 1 MiB, to a multiple of 2 MiB above.
// - allocate() reuses the smallest cached block that is at least the rounded size and less than
//   twice it (best fit, bounded waste); otherwise it asks the backend for the rounded size.
// - When the backend is out of memory (returns nullptr), every cached block is returned to it and
//   the request is retried once; still out of memory -> allocate() returns nullptr (the caller
//   turns that into an error naming what it allocated).
// - release() keeps the block for reuse unless that would put more than max_cached_bytes in the
//   cache; then the block goes straight back to the backend.
// - Blocks are never split or merged; empty() returns every cached block to the backend.
//
// Thread safety: every member may be called from any thread (one mutex; backend calls run under
// it). The backend functions must not call back into the cache.
// Failure: release() of a pointer the cache did not hand out throws ds::Error (internal). Backend
// exceptions propagate (the cache stays consistent: nothing is recorded for a failed call).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "common/error.h"

namespace ds::rt {

struct BlockCacheStats {
  int64_t reserved_bytes = 0;  // held from the backend: in use + cached
  int64_t in_use_bytes = 0;    // rounded sizes of blocks handed out and not released
  int64_t cached_bytes = 0;    // free blocks kept for reuse
  int64_t peak_reserved_bytes = 0;
  int64_t backend_allocs = 0;  // successful backend allocations
  int64_t backend_frees = 0;
  int64_t hits = 0;            // allocate() served from the cache
  int64_t misses = 0;          // allocate() that went to the backend
};

class BlockCache {
 public:
  // Returns nullptr when out of memory; throws on other failures.
  using AllocFn = std::function<void*(size_t bytes)>;
  using FreeFn = std::function<void(void* p, size_t bytes)>;

  static constexpr size_t kSmallAlign = 512;
  static constexpr size_t kLargeAlign = size_t{2} << 20;
  static constexpr size_t kLargeFrom = size_t{1} << 20;

  BlockCache(AllocFn alloc, FreeFn free,
             size_t max_cached_bytes = std::numeric_limits<size_t>::max())
      : alloc_(std::move(alloc)), free_(std::move(free)), max_cached_(max_cached_bytes) {}
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;
  // Returns the cached blocks to the backend. Blocks still in use are the owner's bug; they are
  // left alone (their memory is not freed twice).
  ~BlockCache() { empty(); }

  static size_t round_size(size_t bytes) {
    const size_t a = bytes < kLargeFrom ? kSmallAlign : kLargeAlign;
    return bytes == 0 ? a : (bytes + a - 1) / a * a;
  }

  // A block of at least `bytes`; *block_bytes (when given) receives its real size.
  void* allocate(size_t bytes, size_t* block_bytes = nullptr) {
    const size_t want = round_size(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_blocks_.lower_bound(want);
    if (it != free_blocks_.end() && it->first / 2 < want) {  // size < 2 * want, no overflow
      const size_t size = it->first;
      void* p = it->second;
      free_blocks_.erase(it);
      stats_.cached_bytes -= static_cast<int64_t>(size);
      stats_.in_use_bytes += static_cast<int64_t>(size);
      stats_.hits++;
      in_use_.emplace(p, size);
      if (block_bytes != nullptr) *block_bytes = size;
      return p;
    }
    stats_.misses++;
    void* p = alloc_(want);
    if (p == nullptr && !free_blocks_.empty()) {
      empty_locked();
      p = alloc_(want);
    }
    if (p == nullptr) return nullptr;
    stats_.backend_allocs++;
    stats_.reserved_bytes += static_cast<int64_t>(want);
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    stats_.in_use_bytes += static_cast<int64_t>(want);
    in_use_.emplace(p, want);
    if (block_bytes != nullptr) *block_bytes = want;
    return p;
  }

  void release(void* p) {
    if (p == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = in_use_.find(p);
    if (it == in_use_.end()) {
      throw Error(ErrorKind::kInternal,
                  fmt::format("BlockCache::release: pointer {} was not handed out by this cache "
                              "(double free, or memory from another allocator)",
                              p));
    }
    const size_t size = it->second;
    in_use_.erase(it);
    stats_.in_use_bytes -= static_cast<int64_t>(size);
    if (static_cast<size_t>(stats_.cached_bytes) + size > max_cached_) {
      backend_free(p, size);
      return;
    }
    free_blocks_.emplace(size, p);
    stats_.cached_bytes += static_cast<int64_t>(size);
  }

  // Returns every cached block to the backend.
  void empty() {
    std::lock_guard<std::mutex> lock(mu_);
    empty_locked();
  }

  BlockCacheStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  void backend_free(void* p, size_t size) {
    free_(p, size);
    stats_.backend_frees++;
    stats_.reserved_bytes -= static_cast<int64_t>(size);
  }
  void empty_locked() {
    while (!free_blocks_.empty()) {
      auto it = free_blocks_.begin();
      const auto [size, p] = *it;
      free_blocks_.erase(it);
      stats_.cached_bytes -= static_cast<int64_t>(size);
      backend_free(p, size);
    }
  }

  AllocFn alloc_;
  FreeFn free_;
  size_t max_cached_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_blocks_;   // size -> block
  std::unordered_map<void*, size_t> in_use_;   // block -> size
  BlockCacheStats stats_;
};

}  // namespace ds::rt
