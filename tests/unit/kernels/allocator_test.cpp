// The tagged allocator: alignment, zero fill, per-tag current and peak bytes, moves, release,
// thread safety, and the CUDA seam refusing clearly without CUDA.
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "common/error.h"
#include "core/allocator.h"
#include "core/device.h"

using namespace ds::rt;

TEST(Allocator, AlignedZeroedAndCountedPerTag) {
  Allocator a;
  Buffer p = a.allocate(1000, MemTag::kParams, "p");
  Buffer big = a.allocate(size_t{5} << 20, MemTag::kActivations, "big");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p.data()) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % 64, 0u);
  for (size_t i = 0; i < big.bytes(); i += 4093) ASSERT_EQ(big.as<char>()[i], 0);
  EXPECT_EQ(a.current(MemTag::kParams), 1000);
  EXPECT_EQ(a.current(MemTag::kActivations), 5 << 20);
  EXPECT_EQ(a.stats().current_total, 1000 + (5 << 20));
  EXPECT_STREQ(mem_tag_name(MemTag::kOptimizer), "optimizer");

  Buffer moved = std::move(big);
  EXPECT_TRUE(big.empty());
  EXPECT_EQ(a.current(MemTag::kActivations), 5 << 20);
  moved.reset();
  EXPECT_EQ(a.current(MemTag::kActivations), 0);
  EXPECT_EQ(a.peak(MemTag::kActivations), 5 << 20);  // the peak stays
  EXPECT_EQ(a.peak_total(), 1000 + (5 << 20));
  a.reset_peaks();
  EXPECT_EQ(a.peak(MemTag::kActivations), 0);
  EXPECT_EQ(a.peak_total(), 1000);
  EXPECT_TRUE(a.allocate(0, MemTag::kComm, "empty").empty());
}

TEST(Allocator, ThreadSafe) {
  Allocator a;
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; t++) {
    ts.emplace_back([&] {
      for (int i = 0; i < 200; i++) {
        Buffer b = a.allocate(4096, MemTag::kWorkspace, "w");
        b.as<char>()[0] = 1;
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(a.current(MemTag::kWorkspace), 0);
  EXPECT_GE(a.peak(MemTag::kWorkspace), 4096);
  EXPECT_LE(a.peak(MemTag::kWorkspace), 4 * 4096);
}

TEST(Allocator, CudaWithoutCudaIsAClearError) {
  if (gpu_count() > 0) GTEST_SKIP() << "a GPU is visible: kCuda allocates (tests/gpu/memory)";
  Allocator a;
  try {
    a.allocate(64, MemTag::kParams, "gpu params", Device::kCuda);
    FAIL();
  } catch (const ds::Error& e) {
    EXPECT_EQ(e.kind(), ds::ErrorKind::kInvalidUsage);
    EXPECT_NE(std::string(e.what()).find("gpu params"), std::string::npos);
  }
}
