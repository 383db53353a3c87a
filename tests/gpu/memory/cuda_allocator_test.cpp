// The tagged allocator on a GPU: Device::kCuda through the caching allocator (zero-filled, counted
// per tag exactly as CPU buffers, blocks reused after release) and Device::kCudaHost pinned host
// buffers. Skips itself without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <vector>

#include "core/allocator.h"
#include "gpu/cuda_test_util.h"
#include "kernels/cuda/kernels.h"
#include "core/cuda_memory_table.h"

namespace ds::rt {
namespace {

using test::cu;

class CudaAllocator : public test::CudaTest {};

TEST_F(CudaAllocator, DeviceBuffersAreZeroedAndCountedPerTag) {
  Allocator a;
  int dev = 0;
  DS_ASSERT_CUDA(cudaGetDevice(&dev));
  const auto before = cuda_memory().device_cache_stats(dev);
  {
    Buffer p = a.allocate(1000, MemTag::kParams, "gpu params", Device::kCuda);
    Buffer g = a.allocate(size_t{3} << 20, MemTag::kGrads, "gpu grads", Device::kCuda);
    EXPECT_EQ(p.device(), Device::kCuda);
    EXPECT_EQ(a.current(MemTag::kParams), 1000);
    EXPECT_EQ(a.current(MemTag::kGrads), int64_t{3} << 20);
    EXPECT_EQ(a.stats().current_total, 1000 + (int64_t{3} << 20));
    cudaPointerAttributes attr{};
    DS_ASSERT_CUDA(cudaPointerGetAttributes(&attr, g.data()));
    EXPECT_EQ(attr.type, cudaMemoryTypeDevice);  // never managed memory
    std::vector<float> h(g.bytes() / sizeof(float), 1.0f);
    DS_ASSERT_CUDA(cudaMemcpy(h.data(), g.data(), g.bytes(), cudaMemcpyDeviceToHost));
    for (float x : h) ASSERT_EQ(x, 0.0f);
    // A kernel writes into it.
    cu().f32.residual_forward(g.as<float>(), g.as<float>(), g.as<float>(), 16, nullptr);
    DS_ASSERT_CUDA(cudaDeviceSynchronize());
    const auto mid = cuda_memory().device_cache_stats(dev);
    EXPECT_GE(mid.in_use_bytes - before.in_use_bytes, 1000 + (int64_t{3} << 20));
  }
  EXPECT_EQ(a.current(MemTag::kParams), 0);
  EXPECT_EQ(a.current(MemTag::kGrads), 0);
  EXPECT_EQ(a.peak(MemTag::kGrads), int64_t{3} << 20);
  EXPECT_EQ(a.peak_total(), 1000 + (int64_t{3} << 20));
  // Freed blocks stay cached and serve the next request of the same size.
  const auto after = cuda_memory().device_cache_stats(dev);
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
  Buffer again = a.allocate(size_t{3} << 20, MemTag::kActivations, "again", Device::kCuda);
  EXPECT_EQ(cuda_memory().device_cache_stats(dev).hits, after.hits + 1);
  // Reused blocks are zero-filled again.
  std::vector<float> h(again.bytes() / sizeof(float), 1.0f);
  DS_ASSERT_CUDA(cudaMemcpy(h.data(), again.data(), again.bytes(), cudaMemcpyDeviceToHost));
  for (float x : h) ASSERT_EQ(x, 0.0f);
}

TEST_F(CudaAllocator, PinnedHostBuffers) {
  Allocator a;
  Buffer b = a.allocate(size_t{1} << 20, MemTag::kOptimizer, "offload", Device::kCudaHost);
  EXPECT_EQ(b.device(), Device::kCudaHost);
  // Pinned host memory is counted apart (MemStats::pinned_*, the trainer's
  // peak_bytes_pinned_host), whatever its tag: the per-tag figures stay the GPU's.
  EXPECT_EQ(a.current(MemTag::kOptimizer), 0);
  EXPECT_EQ(a.stats().pinned_current, int64_t{1} << 20);
  for (size_t i = 0; i < b.bytes(); i += 4096) ASSERT_EQ(b.as<char>()[i], 0);
  cudaPointerAttributes attr{};
  DS_ASSERT_CUDA(cudaPointerGetAttributes(&attr, b.data()));
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  b.as<float>()[0] = 3.0f;
  Buffer d = a.allocate(b.bytes(), MemTag::kOptimizer, "device copy", Device::kCuda);
  DS_ASSERT_CUDA(cudaMemcpy(d.data(), b.data(), b.bytes(), cudaMemcpyHostToDevice));
  float x = 0;
  DS_ASSERT_CUDA(cudaMemcpy(&x, d.data(), sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(x, 3.0f);
  b.reset();
  EXPECT_EQ(a.current(MemTag::kOptimizer), static_cast<int64_t>(d.bytes()));
  EXPECT_EQ(a.stats().pinned_current, 0);
  EXPECT_EQ(a.stats().pinned_peak, int64_t{1} << 20);
}

TEST_F(CudaAllocator, OutOfMemoryNamesTheBuffer) {
  Allocator a;
  size_t free_b = 0, total_b = 0;
  DS_ASSERT_CUDA(cudaMemGetInfo(&free_b, &total_b));
  try {
    a.allocate(total_b * 2, MemTag::kActivations, "too big", Device::kCuda);
    FAIL();
  } catch (const ds::Error& e) {
    EXPECT_EQ(e.kind(), ds::ErrorKind::kSystem);
    EXPECT_NE(std::string(e.what()).find("too big"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a.current(MemTag::kActivations), 0);
}

}  // namespace
}  // namespace ds::rt
