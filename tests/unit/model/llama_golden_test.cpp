// Golden test: a tiny Llama's loss and EVERY weight gradient against PyTorch float64
// (make_llama_golden.py, Hugging Face's LlamaForCausalLM in plain torch ops), from one weights
// file written by that script's own safetensors writer and read through the HF import
// (checkpoint/hf_llama.h). Also: activation checkpointing gives the same gradients bit for bit,
// and tensor parallelism (threads sharing an in-process group) gives the same loss and grads.
// Tolerance: fp32 against float64, |ours - torch| <= 1e-6 + 2e-3 |torch| per element, the loss to
// 1e-5 relative.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/hf_llama.h"
#include "checkpoint/safetensors.h"
#include "core/allocator.h"
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
    const std::string name = ms::hf_name(ts.id, ts.layer);
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
    ds::rt::ckpt::load_hf_llama(data("llama_golden.safetensors"), g.shape, m.part(), m.params().f32());
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
