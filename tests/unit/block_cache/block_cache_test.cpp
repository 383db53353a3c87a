// The caching allocator's policy (core/block_cache.h) over a real host-memory backend with a
// capacity, so reuse, rounding, the cache limit and the out-of-memory retry are all exercised
// without a GPU. The same class runs over cudaMalloc in kernels/cuda/memory.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <set>
#include <thread>
#include <vector>

#include "common/error.h"
#include "core/block_cache.h"

namespace ds::rt {
namespace {

// malloc with a byte budget: returns nullptr past `capacity`, like cudaMalloc out of memory.
struct HostBackend {
  explicit HostBackend(size_t cap) : capacity(cap) {}
  size_t capacity;
  size_t used = 0;
  std::set<void*> live;
  BlockCache make(size_t max_cached = std::numeric_limits<size_t>::max()) {
    return BlockCache(
        [this](size_t n) -> void* {
          if (used + n > capacity) return nullptr;
          void* p = std::malloc(n);
          used += n;
          live.insert(p);
          return p;
        },
        [this](void* p, size_t n) {
          EXPECT_EQ(live.erase(p), 1u) << "backend freed a block it never gave out";
          used -= n;
          std::free(p);
        },
        max_cached);
  }
};

TEST(BlockCache, RoundsSizes) {
  EXPECT_EQ(BlockCache::round_size(0), 512u);
  EXPECT_EQ(BlockCache::round_size(1), 512u);
  EXPECT_EQ(BlockCache::round_size(512), 512u);
  EXPECT_EQ(BlockCache::round_size(513), 1024u);
  EXPECT_EQ(BlockCache::round_size((size_t{1} << 20) - 1), size_t{1} << 20);
  EXPECT_EQ(BlockCache::round_size(size_t{1} << 20), size_t{2} << 20);
  EXPECT_EQ(BlockCache::round_size((size_t{2} << 20) + 1), size_t{4} << 20);
}

TEST(BlockCache, ReusesFreedBlocksBestFitWithinTwice) {
  HostBackend be(size_t{64} << 20);
  {
    BlockCache c = be.make();
    size_t got = 0;
    void* a = c.allocate(1000, &got);
    EXPECT_EQ(got, 1024u);
    void* b = c.allocate(5000);
    c.release(a);
    c.release(b);
    auto s = c.stats();
    EXPECT_EQ(s.cached_bytes, 1024 + 5120);
    EXPECT_EQ(s.in_use_bytes, 0);
    EXPECT_EQ(s.reserved_bytes, 1024 + 5120);
    // 900 -> 1024: the 1024 block fits exactly (best fit, not the 5120 one).
    EXPECT_EQ(c.allocate(900), a);
    // 2000 -> 2048: the only free block is 5120 >= 2 * 2048: too wasteful, a new block.
    void* d = c.allocate(2000);
    EXPECT_NE(d, b);
    // 3000 -> 3072: 5120 < 6144, reused.
    EXPECT_EQ(c.allocate(3000), b);
    s = c.stats();
    EXPECT_EQ(s.hits, 2);
    EXPECT_EQ(s.misses, 3);
    EXPECT_EQ(s.backend_allocs, 3);
    EXPECT_EQ(s.cached_bytes, 0);
    EXPECT_EQ(s.in_use_bytes, 1024 + 2048 + 5120);
    EXPECT_EQ(s.peak_reserved_bytes, 1024 + 2048 + 5120);
    c.release(a);
    c.release(b);
    c.release(d);
  }
  // The destructor returned every cached block.
  EXPECT_EQ(be.used, 0u);
  EXPECT_TRUE(be.live.empty());
}

TEST(BlockCache, OutOfMemoryEmptiesTheCacheAndRetries) {
  HostBackend be(size_t{8} << 20);
  BlockCache c = be.make();
  void* a = c.allocate(size_t{3} << 20);  // 4 MiB block
  void* b = c.allocate(size_t{3} << 20);  // 4 MiB block: the backend is full
  c.release(a);
  c.release(b);
  // 6 MiB: no cached block fits (4 < 6) and the backend is full: the cache is emptied, retried.
  size_t got = 0;
  void* big = c.allocate(size_t{6} << 20, &got);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(got, size_t{6} << 20);
  auto s = c.stats();
  EXPECT_EQ(s.cached_bytes, 0);
  EXPECT_EQ(s.backend_frees, 2);
  EXPECT_EQ(s.reserved_bytes, int64_t{6} << 20);
  // Really out of memory: nullptr, nothing recorded.
  EXPECT_EQ(c.allocate(size_t{4} << 20), nullptr);
  EXPECT_EQ(c.stats().in_use_bytes, int64_t{6} << 20);
  c.release(big);
}

TEST(BlockCache, CacheLimitSendsBlocksBack) {
  HostBackend be(size_t{64} << 20);
  BlockCache c = be.make(/*max_cached=*/4096);
  void* a = c.allocate(3000);  // 3072
  void* b = c.allocate(3000);  // 3072
  c.release(a);                // cached: 3072
  c.release(b);                // 6144 > 4096: freed
  auto s = c.stats();
  EXPECT_EQ(s.cached_bytes, 3072);
  EXPECT_EQ(s.backend_frees, 1);
  EXPECT_EQ(s.reserved_bytes, 3072);
  c.empty();
  EXPECT_EQ(c.stats().reserved_bytes, 0);
  EXPECT_EQ(be.used, 0u);
}

TEST(BlockCache, UnknownPointerIsAnInternalError) {
  HostBackend be(size_t{1} << 20);
  BlockCache c = be.make();
  int x = 0;
  try {
    c.release(&x);
    FAIL();
  } catch (const ds::Error& e) {
    EXPECT_EQ(e.kind(), ds::ErrorKind::kInternal);
  }
  void* a = c.allocate(10);
  c.release(a);
  EXPECT_THROW(c.release(a), ds::Error);  // double free
  c.release(nullptr);                     // a no-op
}

TEST(BlockCache, ThreadsShareOneCache) {
  HostBackend be(size_t{256} << 20);
  BlockCache c = be.make();
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; t++) {
    ts.emplace_back([&c, t] {
      for (int i = 0; i < 500; i++) {
        void* p = c.allocate(static_cast<size_t>(512 * (1 + (i + t) % 7)));
        ASSERT_NE(p, nullptr);
        static_cast<char*>(p)[0] = 1;
        c.release(p);
      }
    });
  }
  for (auto& t : ts) t.join();
  const auto s = c.stats();
  EXPECT_EQ(s.in_use_bytes, 0);
  EXPECT_EQ(s.hits + s.misses, 2000);
  EXPECT_EQ(s.reserved_bytes, s.cached_bytes);
}

}  // namespace
}  // namespace ds::rt
