// A Llama on one GPU against the CPU model: the same shape, init seed and tokens built with
// ModelOptions::device = kCuda and kCpu; the initial parameters bit for bit, the losses of five
// AdamW steps (CPU cpu::adamw_update against the module's CUDA twin), every gradient of the first
// step and the parameters after the fifth within fp32 tolerances, as gpt2_cuda_test.cpp holds
// GPT-2. Cases: grouped-query (KV 2 of 4 heads), multi-query (KV 1), tied embeddings,
// activation checkpointing, the head in chunks. The allocator's per-tag bytes are the CPU
// model's, except the workspace: no attention scratch on CUDA, plus the device token ids
// (2*B*T int32), which is what the plan counts (model_spec::activation_totals with 0 threads).
// Skips itself without a GPU. NOT RUN YET: no GPU was available where this was written.
#include <gtest/gtest.h>
#include <omp.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "core/allocator.h"
#include "gpu/cuda_test_util.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kernels.h"
#include "model/llama.h"
#include "optim/adamw.h"

namespace ds::rt {
namespace {

using test::cu;

namespace ms = model_spec;

constexpr int kB = 2, kT = 32;

struct Case {
  const char* name;
  int kv_heads = 2;
  bool tied = false;
  bool recompute = false;
  int head_chunk_rows = 0;
};

// L=2, NH=4, C=64 (head size 16), I=96, V=97 (Llama does not pad), maxT=32.
ms::ModelShape small(const Case& c) {
  ms::ModelShape s{2, 4, 64, 97, 97, 32};
  s.family = ms::ModelFamily::kLlama;
  s.n_kv_head = c.kv_heads;
  s.intermediate_size = 96;
  s.tie_embeddings = c.tied;
  return s;
}

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

class LlamaCuda : public test::CudaTest {
 protected:
  void SetUp() override {
    test::CudaTest::SetUp();
    omp_set_num_threads(2);
  }
};

void train_and_compare(const Case& c) {
  SCOPED_TRACE(c.name);
  const auto s = small(c);
  Allocator cpu_alloc, gpu_alloc;
  ModelOptions o{kB, kT};
  o.recompute = c.recompute;
  o.head_chunk_rows = c.head_chunk_rows;
  Llama cpu(s, ms::ModelPart::whole(s), o, cpu_alloc);
  ModelOptions og = o;
  og.device = Device::kCuda;
  Llama gpu(s, ms::ModelPart::whole(s), og, gpu_alloc);
  cpu.init_weights(42);
  gpu.init_weights(42);
  const int64_t n = cpu.num_params();
  ASSERT_EQ(download(gpu.params().f32(), n),
            std::vector<float>(cpu.params().f32(), cpu.params().f32() + n));

  auto ca = cpu.make_activations();
  auto ga = gpu.make_activations();
  for (int t = 0; t < kNumMemTags; t++) {
    const auto tag = static_cast<MemTag>(t);
    if (tag == MemTag::kWorkspace) continue;
    EXPECT_EQ(gpu_alloc.current(tag), cpu_alloc.current(tag)) << mem_tag_name(tag);
  }
  ms::ActConfig cfg{kB, kT, c.recompute, 0, c.head_chunk_rows, 4};
  if (cfg.head_chunk_rows == 0)
    cfg.head_chunk_rows = std::min(ms::head_chunk_rows_default(s, kB, kT, 1), kB * kT);
  const auto totals = ms::activation_totals(s, ms::ModelPart::whole(s), cfg);
  EXPECT_EQ(gpu_alloc.current(MemTag::kWorkspace), totals.shared_workspace_bytes + 2 * kB * kT * 4);

  std::vector<float> m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  Buffer gm =
      gpu_alloc.allocate(static_cast<size_t>(n) * 4, MemTag::kOptimizer, "m", Device::kCuda);
  Buffer gv =
      gpu_alloc.allocate(static_cast<size_t>(n) * 4, MemTag::kOptimizer, "v", Device::kCuda);
  optim::AdamWConfig acfg;
  acfg.weight_decay = 0.1;
  for (int step = 1; step <= 5; step++) {
    const auto tok = ids(100u + static_cast<uint32_t>(step), kB * kT, s.vocab_size);
    const auto tgt = ids(200u + static_cast<uint32_t>(step), kB * kT, s.vocab_size);
    cpu.zero_grads();
    gpu.zero_grads();
    const float lc = cpu.forward_backward(ca, tok.data(), tgt.data(), 1.0f);
    const float lg = gpu.forward_backward(ga, tok.data(), tgt.data(), 1.0f);
    EXPECT_NEAR(lg, lc, 1e-4 * std::fabs(lc)) << "step " << step;
    if (step == 1) {
      EXPECT_NEAR(lc, std::log(static_cast<float>(s.vocab_size)), 0.1) << "init loss near ln V";
      EXPECT_TRUE(test::close(download(gpu.grads().f32(), n),
                              std::vector<float>(cpu.grads().f32(), cpu.grads().f32() + n), 1e-3,
                              1e-5));
      // The residual stream's gradient after the whole backward, d(embedding output).
      const int64_t btc = int64_t{kB} * kT * s.n_embd;
      EXPECT_TRUE(test::close(download(gpu.d_stream().f32(), btc),
                              std::vector<float>(cpu.d_stream().f32(), cpu.d_stream().f32() + btc),
                              1e-3, 1e-6));
      // Forward only gives the same loss.
      EXPECT_NEAR(gpu.forward(ga, tok.data(), tgt.data()), lc, 1e-4 * std::fabs(lc));
    }
    const auto st = optim::adamw_step_scalars(acfg, step, 1e-3);
    cpu::adamw_update(st, cpu.params().f32(), cpu.grads().f32(), m.data(), v.data(), n, true);
    cu().adamw_update(st, gpu.params().f32(), gpu.grads().f32(), gm.as<float>(), gv.as<float>(), n,
                      true, nullptr, nullptr);
  }
  // As gpt2_cuda_test.cpp: Adam normalises each update, so an element whose gradient is ~0 up to
  // rounding may move by up to 2 * lr per step either way; the losses above are the real check.
  EXPECT_TRUE(test::close(download(gpu.params().f32(), n),
                          std::vector<float>(cpu.params().f32(), cpu.params().f32() + n), 1e-3,
                          1e-2));
}

TEST_F(LlamaCuda, GroupedQueryMatchesTheCpu) {
  train_and_compare({"gqa KV 2"});
}
TEST_F(LlamaCuda, MultiQueryMatchesTheCpu) {
  train_and_compare({"mqa KV 1", 1});
}
TEST_F(LlamaCuda, TiedEmbeddingsMatchTheCpu) {
  train_and_compare({"tied", 2, true});
}
TEST_F(LlamaCuda, ActivationCheckpointingMatchesTheCpu) {
  train_and_compare({"recompute", 2, false, true});
}
TEST_F(LlamaCuda, HeadInChunksMatchesTheCpu) {
  train_and_compare({"head chunks of 24 rows", 2, false, false, 24});
}

TEST_F(LlamaCuda, BadTokensAreRejectedOnTheHostBeforeUpload) {
  const auto s = small({"bad tokens"});
  Allocator alloc;
  ModelOptions o{kB, kT};
  o.device = Device::kCuda;
  Llama gpu(s, ms::ModelPart::whole(s), o, alloc);
  auto a = gpu.make_activations();
  auto tok = ids(1, kB * kT, s.vocab_size);
  tok[5] = s.vocab_size;
  EXPECT_THROW(gpu.forward(a, tok.data(), tok.data()), ds::Error);
}

}  // namespace
}  // namespace ds::rt
