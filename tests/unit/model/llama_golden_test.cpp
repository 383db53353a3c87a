// Golden test: a tiny Llama's loss and EVERY weight gradient against PyTorch float64
// (make_llama_golden.py, Hugging Face's LlamaForCausalLM in plain torch ops), from one weights
// file written by that script's own safetensors writer and read through the HF import
// (checkpoint/hf_safetensors.h). Also: activation checkpointing gives the same gradients bit for bit,
// and tensor parallelism (threads sharing an in-process group) gives the same loss and grads.
// Tolerance: fp32 against float64, |ours - torch| <= 1e-6 + 2e-3 |torch| per element, the loss to
// 1e-5 relative. At 16-bit storage (bf16, fp16, with 16-bit or fp32 gradients) the same within the
// storage type's precision.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "model_spec/llama_spec.h"
#include "checkpoint/hf_safetensors.h"
#include "checkpoint/safetensors.h"
#include "common/error.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "kernels/typed.h"
#include "model/llama.h"

using namespace ds::rt;
namespace ms = ds::model_spec;

namespace {

struct Golden {
  ms::ModelShape shape;
  int B = 0, T = 0;
  std::vector<int32_t> tokens, targets;
  double loss = 0;
};

std::string data(const std::string& f) { return std::string(DS_SOURCE_DIR) + "/tests/data/" + f; }

Golden read_golden() {
  std::ifstream in(data("llama_golden.json"));
  const auto j = nlohmann::json::parse(in);
  Golden g;
  g.shape = ms::ModelShape{j["n_layer"], j["n_head"], j["n_embd"], j["vocab_size"], j["vocab_size"], j["seq_len"]};
  g.shape.family = ms::ModelFamily::kLlama;
  g.shape.n_kv_head = j["n_kv_head"];
  g.shape.intermediate_size = j["intermediate_size"];
  g.shape.rope_theta = j["rope_theta"];
  g.shape.norm_eps = j["norm_eps"];
  g.B = j["B"];
  g.T = j["T"];
  g.tokens = j["tokens"].get<std::vector<int32_t>>();
  g.targets = j["targets"].get<std::vector<int32_t>>();
  g.loss = j["loss"];
  return g;
}

// Every gradient tensor of `m` against the PyTorch file (this tp rank's share of each).
void expect_grads_match(Llama& m, const ds::rt::ckpt::SafetensorsSet& want, const std::string& what) {
  const auto all = ms::model_params(m.shape());
  int checked = 0;
  double worst = 0.0;  // the largest |ours - torch| / (1e-6 + 2e-3 |torch|): 1 is the tolerance
  for (const auto& ts : m.layout().tensors) {
    const auto& t = ms::find_param(all, ts.id);
    const std::string name = ms::llama_hf_name(ts.id, ts.layer);
    std::vector<float> full(static_cast<size_t>(t.numel()));
    want.read_f32(name, t.shape, full.data());
    const float* g = m.grad(ts.id, ts.layer).f32();
    int bad = 0;
    for (int64_t i = 0; i < ts.numel && bad < 3; i++) {
      const double w = full[static_cast<size_t>(ms::full_index(t, m.part().tp, m.part().tp_rank, i))];
      worst = std::max(worst, std::fabs(g[i] - w) / (1e-6 + 2e-3 * std::fabs(w)));
      if (std::fabs(g[i] - w) > 1e-6 + 2e-3 * std::fabs(w)) {
        ADD_FAILURE() << what << " " << name << "[" << i << "]: ours " << g[i] << " torch " << w;
        bad++;
      }
    }
    checked++;
  }
  EXPECT_EQ(checked, static_cast<int>(m.layout().tensors.size()));
  std::printf("%s: %d tensors, worst error %.3f of the tolerance\n", what.c_str(), checked, worst);
}

}  // namespace

TEST(LlamaGolden, LossAndEveryGradientMatchPyTorch) {
  omp_set_num_threads(2);
  const Golden g = read_golden();
  const ds::rt::ckpt::SafetensorsSet grads(data("llama_golden_grads.safetensors"));
  for (bool recompute : {false, true}) {
    Allocator alloc;
    ModelOptions o;
    o.B = g.B;
    o.T = g.T;
    o.recompute = recompute;
    Llama m(g.shape, ms::ModelPart::whole(g.shape), o, alloc);
    ds::rt::ckpt::load_hf_safetensors(data("llama_golden.safetensors"), g.shape, m.part(), m.params().f32());
    m.zero_grads();
    auto a = m.make_activations();
    const float loss = m.forward_backward(a, g.tokens.data(), g.targets.data(), 1.0f);
    EXPECT_NEAR(loss, g.loss, 1e-5 * g.loss) << "recompute " << recompute;
    EXPECT_NEAR(m.forward(a, g.tokens.data(), g.targets.data()), g.loss, 1e-5 * g.loss);
    expect_grads_match(m, grads, recompute ? "recompute" : "plain");
  }
}

TEST(LlamaGolden, RecomputeGivesBitIdenticalGradients) {
  omp_set_num_threads(2);
  const Golden g = read_golden();
  std::vector<std::vector<float>> out;
  for (bool recompute : {false, true}) {
    Allocator alloc;
    ModelOptions o;
    o.B = g.B;
    o.T = g.T;
    o.recompute = recompute;
    Llama m(g.shape, ms::ModelPart::whole(g.shape), o, alloc);
    m.init_weights(42);
    m.zero_grads();
    auto a = m.make_activations();
    m.forward_backward(a, g.tokens.data(), g.targets.data(), 0.5f);
    out.emplace_back(m.grads().f32(), m.grads().f32() + m.num_params());
  }
  EXPECT_EQ(out[0], out[1]);
}

namespace {
// The model's gradients as fp32 (whatever their type).
std::vector<float> grads_f32(Llama& m) {
  std::vector<float> g(static_cast<size_t>(m.num_params()));
  kern::typed::to_host_f32(g.data(), m.grads(), m.num_params());
  return g;
}
}  // namespace

// 16-bit storage (parameters, activations and, but with grad_accum_dtype fp32, the gradients in
// bf16 or fp16; rstd, lse, scratch, RoPE tables and losses fp32): the golden model's loss and
// gradients follow PyTorch's float64 within the storage type's precision. The weights are the
// golden file's rounded to 16 bits, so the error is that rounding plus one rounding per kernel
// output: loss within 20 roundings (2^-8 bf16, 2^-11 fp16) relative, each gradient tensor within
// 40 roundings relative in the L2 norm (|ours - torch| / |torch|). Recompute stays bit-identical.
TEST(LlamaGolden, SixteenBitStorageFollowsPyTorchWithinItsPrecision) {
  omp_set_num_threads(2);
  const Golden g = read_golden();
  const ds::rt::ckpt::SafetensorsSet want(data("llama_golden_grads.safetensors"));
  const auto all = ms::model_params(g.shape);
  struct Case {
    DType dtype, grad_dtype;
  };
  for (const Case c : {Case{DType::kBF16, DType::kBF16}, Case{DType::kBF16, DType::kF32},
                       Case{DType::kF16, DType::kF16}, Case{DType::kF16, DType::kF32}}) {
    const std::string what = std::string(dtype_name(c.dtype)) + " storage, " + dtype_name(c.grad_dtype) + " grads";
    const double eps = c.dtype == DType::kBF16 ? 1.0 / 256 : 1.0 / 2048;
    std::vector<std::vector<float>> runs;
    for (bool recompute : {false, true}) {
      Allocator alloc;
      ModelOptions o;
      o.B = g.B;
      o.T = g.T;
      o.recompute = recompute;
      o.dtype = c.dtype;
      o.grad_dtype = c.grad_dtype;
      Llama m(g.shape, ms::ModelPart::whole(g.shape), o, alloc);
      EXPECT_EQ(m.params().dtype, c.dtype);
      EXPECT_EQ(m.grads().dtype, c.grad_dtype);
      std::vector<float> w(static_cast<size_t>(m.num_params()));
      ds::rt::ckpt::load_hf_safetensors(data("llama_golden.safetensors"), g.shape, m.part(), w.data());
      kern::typed::from_host_f32(m.params(), w.data(), m.num_params());
      m.zero_grads();
      auto a = m.make_activations();
      const float loss = m.forward_backward(a, g.tokens.data(), g.targets.data(), 1.0f);
      EXPECT_NEAR(loss, g.loss, 20 * eps * g.loss) << what;
      runs.push_back(grads_f32(m));
      if (recompute) continue;
      double worst = 0;
      for (const auto& ts : m.layout().tensors) {
        const auto& t = ms::find_param(all, ts.id);
        std::vector<float> full(static_cast<size_t>(t.numel()));
        want.read_f32(ms::llama_hf_name(ts.id, ts.layer), t.shape, full.data());
        double num = 0, den = 0;
        for (int64_t i = 0; i < ts.numel; i++) {
          const double d = runs.back()[static_cast<size_t>(ts.offset + i)] - full[static_cast<size_t>(i)];
          num += d * d;
          den += double(full[static_cast<size_t>(i)]) * full[static_cast<size_t>(i)];
        }
        const double rel = std::sqrt(num / den);
        worst = std::max(worst, rel / eps);
        EXPECT_LE(rel, 40 * eps) << what << " " << ms::llama_hf_name(ts.id, ts.layer);
      }
      std::printf("%s: loss %.6f (torch %.6f), worst gradient tensor %.1f roundings off in L2\n", what.c_str(), loss,
                  g.loss, worst);
    }
    EXPECT_EQ(runs[0], runs[1]) << what << ": recompute";
  }
}

// init_weights at 16 bits writes the fp32 initial values rounded once.
TEST(LlamaGolden, SixteenBitInitialWeightsAreTheFp32OnesRounded) {
  omp_set_num_threads(2);
  const Golden g = read_golden();
  Allocator alloc;
  ModelOptions o;
  o.B = g.B;
  o.T = g.T;
  Llama m32(g.shape, ms::ModelPart::whole(g.shape), o, alloc);
  m32.init_weights(42);
  o.dtype = o.grad_dtype = DType::kBF16;
  Llama m16(g.shape, ms::ModelPart::whole(g.shape), o, alloc);
  m16.init_weights(42);
  const auto* p16 = static_cast<const bf16*>(m16.params().data);
  for (int64_t i = 0; i < m32.num_params(); i++) {
    ASSERT_EQ(p16[i].bits, from_f32<bf16>(m32.params().f32()[i]).bits) << i;
  }
  o.grad_dtype = DType::kF16;  // bf16 storage with fp16 gradients is not a combination
  EXPECT_THROW(Llama(g.shape, ms::ModelPart::whole(g.shape), o, alloc), ds::Error);
}

// A Llama on Device::kCuda is built as GPT-2's (no "CPU only" refusal any more): without a usable
// GPU the first device allocation is the error, naming the buffer; pinned host memory is not a
// model device. With a GPU, tests/gpu/model/llama_cuda_test.cpp runs it against the CPU.
TEST(LlamaGolden, OnCudaWithoutAGpuTheAllocatorNamesTheBuffer) {
  const Golden g = read_golden();
  Allocator alloc;
  ModelOptions o;
  o.B = g.B;
  o.T = g.T;
  o.device = Device::kCudaHost;
  EXPECT_THROW(Llama(g.shape, ms::ModelPart::whole(g.shape), o, alloc), ds::Error);
  if (gpu_count() > 0) GTEST_SKIP() << "a GPU is visible: the cuda tests cover a Llama on it";
  o.device = Device::kCuda;
  try {
    Llama m(g.shape, ms::ModelPart::whole(g.shape), o, alloc);
    FAIL() << "a CUDA Llama was built without a GPU";
  } catch (const ds::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("llama parameters"), std::string::npos) << what;
    EXPECT_EQ(what.find("CPU only"), std::string::npos) << what;
  }
}
