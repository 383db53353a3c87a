// Helpers for the CUDA tests: skip without a GPU, device arrays, random data, closeness checks.
// Every CUDA test fixture derives from CudaTest, whose SetUp skips (reported as skipped by ctest)
// when no device is visible, so `ctest -L cuda` passes on machines without a GPU. The kernels under
// test are the CUDA module's (cu(), kernels/cuda_kernel_table.h): the same copy dstrain runs.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "common/error.h"
#include "core/cuda_memory_table.h"
#include "core/device.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda_kernel_table.h"

namespace ds::test {

// The CUDA module's kernels (loaded on first use).
inline const ds::rt::kern::CudaKernelTable& cu() { return ds::rt::kern::cuda_kernels("the cuda tests"); }
using ds::rt::cuda_memory;

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto acc = ds::rt::query_accelerators();
    if (acc.gpus.empty()) {
      GTEST_SKIP() << "no CUDA device visible (" << acc.status << ")";
    }
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
};

#define DS_ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

// CudaTest with a stream of its own (stream_) for the kernels under test.
class CudaStreamTest : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    DS_ASSERT_CUDA(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

// A device copy of a host vector (or n zero elements); freed on destruction.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes() == 0 ? 1 : bytes()) != cudaSuccess) throw std::bad_alloc();
    p_ = static_cast<T*>(p);
    cudaMemset(p_, 0, bytes());
  }
  explicit DeviceArray(const std::vector<T>& h) : DeviceArray(h.size()) { upload(h); }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return p_; }
  // A DeviceArray<uint16_t> of bf16 bit patterns as core/dtype.h's bf16 (the typed kernels' type).
  ds::rt::bf16* bf() const {
    static_assert(std::is_same_v<T, uint16_t>, "bf() is for arrays of bf16 bit patterns");
    return reinterpret_cast<ds::rt::bf16*>(p_);
  }
  size_t bytes() const { return n_ * sizeof(T); }
  void upload(const std::vector<T>& h) {
    if (cudaMemcpy(p_, h.data(), bytes(), cudaMemcpyHostToDevice) != cudaSuccess) {
      throw std::runtime_error("cudaMemcpy H2D failed");
    }
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    if (cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpy(h.data(), p_, bytes(), cudaMemcpyDeviceToHost) != cudaSuccess) {
      throw std::runtime_error(std::string("CUDA D2H failed: ") +
                               cudaGetErrorString(cudaGetLastError()));
    }
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<int32_t> random_tokens(size_t n, uint32_t seed, int V) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// bf16 bits of fp32 values (rounded once, as core/dtype.h), and back.
inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  ds::rt::cpu::convert_f32_to_bf16(o.data(), v.data(), static_cast<int64_t>(v.size()));
  return o;
}
inline std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  ds::rt::cpu::convert_bf16_to_f32(o.data(), v.data(), static_cast<int64_t>(v.size()));
  return o;
}

// |gpu - cpu| <= atol + rtol * |cpu| elementwise (NaN only where both are NaN); reports the worst.
inline ::testing::AssertionResult close(const std::vector<float>& gpu, const std::vector<float>& cpu,
                                        double rtol, double atol) {
  if (gpu.size() != cpu.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << gpu.size() << " vs " << cpu.size();
  }
  size_t worst = 0, bad = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double g = gpu[i], c = cpu[i];
    if (std::isnan(g) || std::isnan(c)) {
      if (std::isnan(g) != std::isnan(c)) {
        ++bad;
        worst = i;
        worst_excess = 1e30;
      }
      continue;
    }
    const double excess = std::fabs(g - c) - (atol + rtol * std::fabs(c));
    if (excess > 0) ++bad;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << gpu.size() << " elements differ beyond atol " << atol << " + rtol "
         << rtol << "; worst at " << worst << ": gpu " << gpu[worst] << " cpu " << cpu[worst];
}

}  // namespace ds::test
