// Single-GPU training against the CPU run: the same GPT-2 (same init seed, same tokens) built with
// Gpt2Options::device = kCuda and kCpu; first losses, gradients and a few AdamW steps (CPU
// cpu::adamw_update vs the module's CUDA twin) agree within fp32 tolerances, with and without
// activation checkpointing; the allocator's per-tag bytes are the CPU model's. The same with bf16
// storage (bf16 gradients or fp32 ones) against the CPU's bf16 run: identical initial bf16
// weights, losses and gradients within bf16 tolerances through a few mixed-precision AdamW steps
// (kern::typed on either device), 2-byte buffers on both. Skips itself without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/allocator.h"
#include "gpu/cuda_test_util.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kernels.h"
#include "kernels/dispatch.h"
#include "kernels/typed.h"
#include "model/gpt2.h"
#include "optim/adamw.h"

namespace ds::rt {
namespace {

using test::cu;

namespace ms = model_spec;

// L=2, NH=4, C=64 (head size 16), V=97 padded to 128, maxT=32.
ms::ModelShape small() { return ms::ModelShape{2, 4, 64, 97, 128, 32}; }
constexpr int kB = 2, kT = 32;

std::vector<int32_t> ids(uint32_t seed, int n, int V) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  uint32_t x = seed;
  for (auto& t : v) {
    x = x * 1664525u + 1013904223u;
    t = static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(V));
  }
  return v;
}

std::vector<float> download(const float* p, int64_t n) {
  std::vector<float> h(static_cast<size_t>(n));
  if (cudaDeviceSynchronize() != cudaSuccess ||
      cudaMemcpy(h.data(), p, h.size() * 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
    ADD_FAILURE() << "device to host copy failed";
  }
  return h;
}

class Gpt2Cuda : public test::CudaTest {};

void train_and_compare(bool recompute) {
  const auto s = small();
  Allocator cpu_alloc, gpu_alloc;
  Gpt2Options o{kB, kT};
  o.recompute = recompute;
  Gpt2 cpu(s, ms::ModelPart::whole(s), o, cpu_alloc);
  Gpt2Options og = o;
  og.device = Device::kCuda;
  Gpt2 gpu(s, ms::ModelPart::whole(s), og, gpu_alloc);
  cpu.init_weights(42);
  gpu.init_weights(42);
  const int64_t n = cpu.num_params();
  ASSERT_EQ(download(gpu.params().f32(), n), std::vector<float>(cpu.params().f32(), cpu.params().f32() + n));

  auto ca = cpu.make_activations();
  auto ga = gpu.make_activations();
  for (int t = 0; t < kNumMemTags; t++) {
    const auto tag = static_cast<MemTag>(t);
    if (tag == MemTag::kWorkspace) continue;  // + the device token ids (2*B*T int32)
    EXPECT_EQ(gpu_alloc.current(tag), cpu_alloc.current(tag)) << mem_tag_name(tag);
  }
  // The GPU's workspace is model_spec's list without the CPU attention scratch (no threads: the
  // CUDA attention needs none), plus the device token ids (2*B*T int32): what the plan counts.
  ms::ActConfig gpu_cfg{kB, kT, recompute, 0, 0, 4};
  gpu_cfg.head_chunk_rows = ms::head_chunk_rows_default(s, kB, kT);
  const auto gpu_totals = ms::activation_totals(s, ms::ModelPart::whole(s), gpu_cfg);
  EXPECT_EQ(gpu_alloc.current(MemTag::kWorkspace), gpu_totals.shared_workspace_bytes + 2 * kB * kT * 4);

  // AdamW state: host vectors for the CPU, device buffers for the GPU.
  std::vector<float> m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  Buffer gm = gpu_alloc.allocate(static_cast<size_t>(n) * 4, MemTag::kOptimizer, "m", Device::kCuda);
  Buffer gv = gpu_alloc.allocate(static_cast<size_t>(n) * 4, MemTag::kOptimizer, "v", Device::kCuda);
  optim::AdamWConfig cfg;
  cfg.weight_decay = 0.1;
  for (int step = 1; step <= 5; step++) {
    const auto tok = ids(100u + static_cast<uint32_t>(step), kB * kT, s.vocab_size);
    const auto tgt = ids(200u + static_cast<uint32_t>(step), kB * kT, s.vocab_size);
    cpu.zero_grads();
    gpu.zero_grads();
    const float lc = cpu.forward_backward(ca, tok.data(), tgt.data(), 1.0f);
    const float lg = gpu.forward_backward(ga, tok.data(), tgt.data(), 1.0f);
    EXPECT_NEAR(lg, lc, 1e-4 * std::fabs(lc)) << "step " << step;
    if (step == 1) {
      EXPECT_TRUE(test::close(download(gpu.grads().f32(), n),
                              std::vector<float>(cpu.grads().f32(), cpu.grads().f32() + n), 1e-3, 1e-5));
      // Forward only gives the same loss.
      EXPECT_NEAR(gpu.forward(ga, tok.data(), tgt.data()), lc, 1e-4 * std::fabs(lc));
    }
    const auto st = optim::adamw_step_scalars(cfg, step, 1e-3);
    cpu::adamw_update(st, cpu.params().f32(), cpu.grads().f32(), m.data(), v.data(), n, true);
    cu().adamw_update(st, gpu.params().f32(), gpu.grads().f32(), gm.as<float>(),
                       gv.as<float>(), n, true, nullptr, nullptr);
  }
  // Adam normalises each update, so an element whose gradient is ~0 up to rounding may move by
  // up to 2 * lr per step in either direction on either side: params agree within 5 * 2 * lr.
  // The losses above are the real check.
  EXPECT_TRUE(test::close(download(gpu.params().f32(), n),
                          std::vector<float>(cpu.params().f32(), cpu.params().f32() + n), 1e-3, 1e-2));
}

TEST_F(Gpt2Cuda, FirstLossesGradientsAndAdamWStepsMatchTheCpu) { train_and_compare(false); }

TEST_F(Gpt2Cuda, SameWithActivationCheckpointing) { train_and_compare(true); }

// The values of a model buffer as fp32 host values (either device).
std::vector<float> host_values(TypedPtr p, int64_t n, Device device) {
  std::vector<float> h(static_cast<size_t>(n));
  const kern::DeviceScope scope(device);
  kern::typed::to_host_f32(h.data(), p, n);
  return h;
}

// ||a - b|| / ||b||.
double relative_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, r = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    r += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(d / r);
}

void bf16_train_and_compare(DType grad_dtype, bool recompute) {
  const auto s = small();
  Allocator cpu_alloc, gpu_alloc;
  Gpt2Options o{kB, kT};
  o.recompute = recompute;
  o.dtype = DType::kBF16;
  o.grad_dtype = grad_dtype;
  Gpt2 cpu(s, ms::ModelPart::whole(s), o, cpu_alloc);
  Gpt2Options og = o;
  og.device = Device::kCuda;
  Gpt2 gpu(s, ms::ModelPart::whole(s), og, gpu_alloc);
  cpu.init_weights(42);
  gpu.init_weights(42);
  const int64_t n = cpu.num_params();
  const auto p0 = host_values(cpu.params(), n, Device::kCpu);
  ASSERT_EQ(host_values(gpu.params(), n, Device::kCuda), p0);  // rounded on the host either way

  auto ca = cpu.make_activations();
  auto ga = gpu.make_activations();
  EXPECT_EQ(gpu_alloc.current(MemTag::kParams), n * 2);
  EXPECT_EQ(gpu_alloc.current(MemTag::kGrads), n * static_cast<int64_t>(dtype_size(grad_dtype)));
  for (int t = 0; t < kNumMemTags; t++) {
    const auto tag = static_cast<MemTag>(t);
    if (tag == MemTag::kWorkspace) continue;  // + the device token ids; - the CPU attention scratch
    EXPECT_EQ(gpu_alloc.current(tag), cpu_alloc.current(tag)) << mem_tag_name(tag);
  }

  // fp32 master weights, m and v: host vectors for the CPU, device buffers for the GPU.
  auto master = p0;
  std::vector<float> m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  Buffer gmaster = gpu_alloc.allocate(static_cast<size_t>(n) * 4, MemTag::kOptimizer, "master", Device::kCuda);
  Buffer gm = gpu_alloc.allocate(static_cast<size_t>(n) * 4, MemTag::kOptimizer, "m", Device::kCuda);
  Buffer gv = gpu_alloc.allocate(static_cast<size_t>(n) * 4, MemTag::kOptimizer, "v", Device::kCuda);
  {
    const kern::DeviceScope scope(Device::kCuda);
    kern::copy_from_host(gmaster.data(), master.data(), master.size() * 4);
  }
  const std::vector<kern::DecayRange> decay = {{0, n, true}};
  optim::AdamWConfig cfg;
  cfg.weight_decay = 0.1;
  for (int step = 1; step <= 3; step++) {
    const auto tok = ids(100u + static_cast<uint32_t>(step), kB * kT, s.vocab_size);
    const auto tgt = ids(200u + static_cast<uint32_t>(step), kB * kT, s.vocab_size);
    cpu.zero_grads();
    gpu.zero_grads();
    const float lc = cpu.forward_backward(ca, tok.data(), tgt.data(), 1.0f);
    const float lg = gpu.forward_backward(ga, tok.data(), tgt.data(), 1.0f);
    EXPECT_NEAR(lg, lc, 1e-2 * std::fabs(lc)) << "step " << step;
    if (step == 1) {
      const auto gc = host_values(cpu.grads(), n, Device::kCpu);
      const auto gg = host_values(gpu.grads(), n, Device::kCuda);
      // Another summation order, then bf16 roundings of activation gradients layer after layer:
      // the gradient as a whole within a few percent, no element far off.
      EXPECT_LT(relative_l2(gg, gc), 3e-2);
      double mx = 0;
      for (float g : gc) mx = std::max(mx, static_cast<double>(std::fabs(g)));
      EXPECT_TRUE(test::close(gg, gc, 0.1, 0.02 * mx));
      EXPECT_NEAR(gpu.forward(ga, tok.data(), tgt.data()), lc, 1e-2 * std::fabs(lc));
    }
    const auto st = optim::adamw_step_scalars(cfg, step, 1e-3);
    kern::typed::adamw_update_partition(st, master.data(), cpu.grads(), m.data(), v.data(), 0, n, decay,
                                        cpu.params());
    const kern::DeviceScope scope(Device::kCuda);
    kern::typed::adamw_update_partition(st, gmaster.as<float>(), gpu.grads(), gm.as<float>(), gv.as<float>(), 0, n,
                                        decay, gpu.params());
  }
  // As in train_and_compare: elements with a ~0 gradient may move by 2 * lr per step either way.
  EXPECT_TRUE(test::close(host_values(gpu.params(), n, Device::kCuda), host_values(cpu.params(), n, Device::kCpu),
                          2e-2, 1e-2));
}

TEST_F(Gpt2Cuda, Bf16StorageMatchesTheCpuBf16Run) { bf16_train_and_compare(DType::kBF16, false); }

TEST_F(Gpt2Cuda, Bf16StorageWithFp32GradientsAndCheckpointing) { bf16_train_and_compare(DType::kF32, true); }

TEST_F(Gpt2Cuda, BadTokensAreRejectedOnTheHostBeforeUpload) {
  const auto s = small();
  Allocator alloc;
  Gpt2Options o{kB, kT};
  o.device = Device::kCuda;
  Gpt2 gpu(s, ms::ModelPart::whole(s), o, alloc);
  auto a = gpu.make_activations();
  auto tok = ids(1, kB * kT, s.vocab_size);
  tok[5] = s.vocab_size;
  EXPECT_THROW(gpu.forward(a, tok.data(), tok.data()), ds::Error);
}

}  // namespace
}  // namespace ds::rt
