// LoRA against an independent PyTorch LoRA (make_lora_golden.py: PEFT's LoraLayer in plain torch
// float64 over the Llama golden model): a PEFT-format adapter whose A and B are both non-zero,
// read by the PEFT reader (checkpoint/peft_adapter.h) onto the golden base (the HF import); the
// loss and every adapter gradient match, the base has no gradient buffer at all, recompute is
// bit-identical, tensor parallelism (threads sharing an in-process group) matches one process,
// and zero B gives the base model's own loss. Tolerances as llama_golden_test.cpp's: fp32 against
// float64, |ours - torch| <= 1e-6 + 2e-3 |torch| per element, the loss to 1e-5 relative.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "checkpoint/hf_safetensors.h"
#include "checkpoint/peft_adapter.h"
#include "checkpoint/safetensors.h"
#include "common/error.h"
#include "comm/comm.h"
#include "core/allocator.h"
#include "model/gpt2.h"
#include "model/llama.h"
#include "model_spec/lora_spec.h"
#include "model_spec/lora_targets.h"
#include "parallel/tensor_parallel.h"

using namespace ds::rt;
namespace ms = ds::model_spec;

namespace {

std::string data(const std::string& f) { return std::string(DS_SOURCE_DIR) + "/tests/data/" + f; }

struct Golden {
  ms::ModelShape shape;
  int B = 0, T = 0;
  std::vector<int32_t> tokens, targets;
  double base_loss = 0, loss = 0;
};

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
  g.base_loss = j["loss"];
  std::ifstream lin(data("lora_golden.json"));
  const auto l = nlohmann::json::parse(lin);
  g.loss = l["loss"];
  g.shape.lora.r = l["r"];
  g.shape.lora.alpha = l["lora_alpha"];
  for (const char* t : {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}) {
    for (ms::ParamId id : ms::lora_target_params(g.shape, t)) g.shape.lora.targets |= uint64_t{1} << ms::lora_target_index(id);
  }
  return g;
}

ms::ModelShape base_of(ms::ModelShape s) {
  s.lora = ms::LoraShape{};
  return s;
}

// The golden base (the HF import of the base model) and the PEFT adapter, this tp rank's share.
void load(Llama& m, bool zero_b = false) {
  const ms::ModelShape base = base_of(m.shape());
  ds::rt::ckpt::load_hf_safetensors(data("llama_golden.safetensors"), base, m.part(), m.params().f32());
  const auto adapter = ds::rt::ckpt::read_peft_adapter(data("lora_golden"));
  std::map<std::string, const ds::rt::ckpt::PeftModuleWeights*> by;
  for (const auto& mw : adapter.modules) by[mw.module] = &mw;
  const auto all = ms::model_params(m.shape());
  for (const auto& ts : m.layout().tensors) {
    const auto b = ms::lora_base_of(ts.id);
    if (!b) continue;
    const auto& mw = *by.at(ms::lora_module_path(m.shape(), *b, ts.layer));
    const bool a = ms::is_lora_a(ts.id);
    const auto& t = ms::find_param(all, ts.id);
    float* dst = m.params().f32() + ts.offset;
    for (int64_t i = 0; i < ts.numel; i++) {
      const float v = (a ? mw.a : mw.b)[static_cast<size_t>(ms::full_index(t, m.part().tp, m.part().tp_rank, i))];
      dst[i] = a || !zero_b ? v : 0.0f;
    }
  }
}

// Every adapter gradient of `m` against PyTorch's; the number of tensors checked.
int expect_adapter_grads_match(Llama& m, const std::string& what) {
  const ds::rt::ckpt::SafetensorsSet want(data("lora_golden_grads.safetensors"));
  const auto all = ms::model_params(m.shape());
  int checked = 0;
  double worst = 0;
  for (const auto& ts : m.layout().tensors) {
    const auto b = ms::lora_base_of(ts.id);
    if (!b) continue;
    const auto& t = ms::find_param(all, ts.id);
    const std::string name = "base_model.model." + ms::lora_module_path(m.shape(), *b, ts.layer) +
                             (ms::is_lora_a(ts.id) ? ".lora_A.weight" : ".lora_B.weight");
    std::vector<float> full(static_cast<size_t>(t.numel()));
    want.read_f32(name, t.shape, full.data());
    const float* gr = m.grad(ts.id, ts.layer).f32();
    int bad = 0;
    for (int64_t i = 0; i < ts.numel && bad < 3; i++) {
      const double w = full[static_cast<size_t>(ms::full_index(t, m.part().tp, m.part().tp_rank, i))];
      worst = std::max(worst, std::fabs(gr[i] - w) / (1e-6 + 2e-3 * std::fabs(w)));
      if (std::fabs(gr[i] - w) > 1e-6 + 2e-3 * std::fabs(w)) {
        ADD_FAILURE() << what << " " << name << "[" << i << "]: ours " << gr[i] << " torch " << w;
        bad++;
      }
    }
    checked++;
  }
  std::printf("%s: %d adapter tensors, worst error %.3f of the tolerance\n", what.c_str(), checked, worst);
  return checked;
}

}  // namespace

TEST(LoraGolden, LossAndEveryAdapterGradientMatchPyTorch) {
  omp_set_num_threads(2);
  const Golden g = read_golden();
  std::vector<std::vector<float>> runs;
  for (bool recompute : {false, true}) {
    Allocator alloc;
    ModelOptions o;
    o.B = g.B;
    o.T = g.T;
    o.recompute = recompute;
    Llama m(g.shape, ms::ModelPart::whole(g.shape), o, alloc);
    load(m);
    const std::vector<float> before(m.params().f32(), m.params().f32() + m.num_params());
    m.zero_grads();
    auto a = m.make_activations();
    const float loss = m.forward_backward(a, g.tokens.data(), g.targets.data(), 1.0f);
    EXPECT_NEAR(loss, g.loss, 1e-5 * g.loss) << "recompute " << recompute;
    EXPECT_EQ(expect_adapter_grads_match(m, recompute ? "recompute" : "plain"), 2 * 7 * g.shape.n_layer);
    // The base is frozen for real: no gradient buffer, and the parameters untouched.
    const int64_t base = m.layout().adapter_begin;
    EXPECT_EQ(static_cast<int64_t>(m.num_params() - base), static_cast<int64_t>(ms::param_count(g.shape) -
                                                                                  ms::param_count(base_of(g.shape))));
    EXPECT_THROW(m.grad(ms::ParamId::kWq, 0), ds::Error);
    EXPECT_THROW(m.grad(ms::ParamId::kWte), ds::Error);
    EXPECT_EQ(std::vector<float>(m.params().f32(), m.params().f32() + m.num_params()), before);
    runs.emplace_back(m.grads().f32(), m.grads().f32() + (m.num_params() - base));
  }
  EXPECT_EQ(runs[0], runs[1]) << "recompute";
}

// PEFT starts B at zero: the adapted model is then exactly the base model.
TEST(LoraGolden, ZeroBGivesTheBaseModelsLoss) {
  omp_set_num_threads(2);
  const Golden g = read_golden();
  Allocator alloc;
  ModelOptions o;
  o.B = g.B;
  o.T = g.T;
  Llama m(g.shape, ms::ModelPart::whole(g.shape), o, alloc);
  load(m, /*zero_b=*/true);
  auto a = m.make_activations();
  EXPECT_NEAR(m.forward(a, g.tokens.data(), g.targets.data()), g.base_loss, 1e-5 * g.base_loss);
}

// Tensor parallelism (2 ranks as threads over an in-process group, the real tp hooks): each rank's
// adapter shard (A replicated and B split for column-parallel q/k/v/gate/up, A split and B
// replicated for row-parallel o/down) gives the same loss and, after the tp sums, PyTorch's gradients.
TEST(LoraGolden, TensorParallelMatchesPyTorch) {
  omp_set_num_threads(1);
  const Golden g = read_golden();
  const int tp = 2;
  auto comms = ds::rt::comm::make_thread_comms(tp);
  std::vector<float> losses(tp);
  std::vector<int> checked(tp);
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; r++) {
    threads.emplace_back([&, r] {
      Allocator alloc;
      ModelOptions o;
      o.B = g.B;
      o.T = g.T;
      ds::rt::parallel::TensorParallelHooks hooks(comms[static_cast<size_t>(r)], nullptr);
      ms::ModelPart part = ms::ModelPart::whole(g.shape);
      part.tp = tp;
      part.tp_rank = r;
      Llama m(g.shape, part, o, alloc, &hooks);
      load(m);
      m.zero_grads();
      auto a = m.make_activations();
      losses[static_cast<size_t>(r)] = m.forward_backward(a, g.tokens.data(), g.targets.data(), 1.0f);
      checked[static_cast<size_t>(r)] = expect_adapter_grads_match(m, "tp rank " + std::to_string(r));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < tp; r++) {
    EXPECT_NEAR(losses[static_cast<size_t>(r)], g.loss, 1e-5 * g.loss) << r;
    EXPECT_EQ(checked[static_cast<size_t>(r)], 2 * 7 * g.shape.n_layer);
  }
}

// LoRA's dropout: evaluation (set_training(false)) is the model without dropout, bit for bit; in
// training the masks of a micro-batch are drawn again by its backward and by a recompute (the
// gradients with and without recompute are identical), and the gradient is the dropped-out loss's:
// against central finite differences on fresh models, whose first micro-batch draws the same masks.
TEST(LoraGolden, DropoutGradientsMatchFiniteDifferences) {
  omp_set_num_threads(2);
  Golden g = read_golden();
  ms::ModelShape with_dropout = g.shape;
  with_dropout.lora.dropout = 0.3;
  ModelOptions o;
  o.B = g.B;
  o.T = g.T;
  Allocator alloc;
  auto loss_of = [&](const ms::ModelShape& s, bool training, const std::function<void(Llama&)>& edit) {
    Llama m(s, ms::ModelPart::whole(s), o, alloc);
    load(m);
    if (edit) edit(m);
    m.set_training(training);
    auto a = m.make_activations();
    m.zero_grads();
    return static_cast<double>(m.forward_backward(a, g.tokens.data(), g.targets.data(), 1.0f));
  };
  EXPECT_EQ(loss_of(with_dropout, false, nullptr), loss_of(g.shape, true, nullptr));
  const double dropped = loss_of(with_dropout, true, nullptr);
  EXPECT_GT(std::fabs(dropped - g.loss), 1e-3) << "dropout changed nothing";
  // The analytic gradients, with and without recompute.
  std::vector<std::vector<float>> grads;
  for (bool recompute : {false, true}) {
    ModelOptions ro = o;
    ro.recompute = recompute;
    Llama m(with_dropout, ms::ModelPart::whole(with_dropout), ro, alloc);
    load(m);
    auto a = m.make_activations();
    m.zero_grads();
    EXPECT_EQ(m.forward_backward(a, g.tokens.data(), g.targets.data(), 1.0f), dropped);
    const int64_t n = m.num_params() - m.layout().adapter_begin;
    grads.emplace_back(m.grads().f32(), m.grads().f32() + n);
  }
  EXPECT_EQ(grads[0], grads[1]) << "recompute drew other masks";
  // Central differences on the largest-gradient elements of four adapter tensors.
  Llama probe(with_dropout, ms::ModelPart::whole(with_dropout), o, alloc);
  const int64_t first = probe.layout().adapter_begin;
  int checked = 0;
  for (const auto& [id, layer] : std::vector<std::pair<ms::ParamId, int>>{
           {ms::ParamId::kLoraAWq, 0}, {ms::ParamId::kLoraBWv, 1}, {ms::ParamId::kLoraAWdown, 1}, {ms::ParamId::kLoraBWup, 0}}) {
    const auto* ts = probe.layout().find_tensor(id, layer);
    ASSERT_NE(ts, nullptr);
    int64_t best = ts->offset;
    for (int64_t i = ts->offset; i < ts->offset + ts->numel; i++) {
      if (std::fabs(grads[0][static_cast<size_t>(i - first)]) > std::fabs(grads[0][static_cast<size_t>(best - first)])) best = i;
    }
    const double eps = 1e-2;
    auto at = [&](double d) {
      return loss_of(with_dropout, true, [&](Llama& m) { m.params().f32()[best] += static_cast<float>(d); });
    };
    const double fd = (at(eps) - at(-eps)) / (2 * eps), an = grads[0][static_cast<size_t>(best - first)];
    EXPECT_NEAR(an, fd, 0.03 * std::fabs(fd) + 1e-5) << "tensor " << static_cast<int>(id) << " layer " << layer;
    std::printf("dropout: d loss / d %s[%ld] analytic %.6g, finite differences %.6g\n",
                ms::is_lora_a(id) ? "A" : "B", static_cast<long>(best - ts->offset), an, fd);
    checked++;
  }
  EXPECT_EQ(checked, 4);
}

// GPT-2 with LoRA on every linear layer (c_attn's fused q|k|v, both c_proj's, c_fc), tensor-parallel
// 2 against one process: the fused qkv's B is split by q, k and v rows as the weight is. Random base
// and adapters (B non-zero), the loss and every adapter gradient within fp32 rounding.
TEST(LoraGolden, Gpt2TensorParallelMatchesOneProcess) {
  omp_set_num_threads(1);
  ms::ModelShape s{2, 4, 32, 50, 64, 16};
  s.family = ms::ModelFamily::kGpt2;
  s.lora.r = 4;
  s.lora.alpha = 8;
  for (const char* t : {"c_attn", "c_proj", "c_fc"}) {
    for (ms::ParamId id : ms::lora_target_params(s, t)) s.lora.targets |= uint64_t{1} << ms::lora_target_index(id);
  }
  const int B = 2, T = 8;
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int i = 0; i < B * T; i++) {
    tokens[static_cast<size_t>(i)] = (i * 7 + 3) % 50;
    targets[static_cast<size_t>(i)] = (i * 11 + 5) % 50;
  }
  // Every B gets values too (PEFT starts it at zero): element i of the full tensor is a function of i.
  auto fill_b = [&](Gpt2& m) {
    const auto all = ms::model_params(s);
    for (const auto& ts : m.layout().tensors) {
      if (!ms::lora_base_of(ts.id) || ms::is_lora_a(ts.id)) continue;
      const auto& t = ms::find_param(all, ts.id);
      for (int64_t i = 0; i < ts.numel; i++) {
        const int64_t f = ms::full_index(t, m.part().tp, m.part().tp_rank, i);
        m.params().f32()[ts.offset + i] = 0.05f * static_cast<float>(std::sin(0.7 * static_cast<double>(f) + ts.layer));
      }
    }
  };
  auto run = [&](Gpt2& m, std::vector<float>* grads_full) {
    m.init_weights(5);
    fill_b(m);
    m.zero_grads();
    auto a = m.make_activations();
    const float loss = m.forward_backward(a, tokens.data(), targets.data(), 1.0f);
    const auto all = ms::model_params(s);
    const int64_t first = m.layout().adapter_begin;
    const ms::ParamLayout whole = ms::param_layout(s, ms::ModelPart::whole(s));
    for (const auto& ts : m.layout().tensors) {
      if (!ms::lora_base_of(ts.id)) continue;
      const auto& t = ms::find_param(all, ts.id);
      const int64_t dst = whole.find_tensor(ts.id, ts.layer)->offset - whole.adapter_begin;
      for (int64_t i = 0; i < ts.numel; i++) {
        (*grads_full)[static_cast<size_t>(dst + ms::full_index(t, m.part().tp, m.part().tp_rank, i))] =
            m.grads().f32()[ts.offset - first + i];
      }
    }
    return loss;
  };
  const ms::ParamLayout whole = ms::param_layout(s, ms::ModelPart::whole(s));
  const size_t n = static_cast<size_t>(whole.total - whole.adapter_begin);
  std::vector<float> one(n), split(n);
  Allocator alloc;
  ModelOptions o;
  o.B = B;
  o.T = T;
  Gpt2 m1(s, ms::ModelPart::whole(s), o, alloc);
  const float loss1 = run(m1, &one);
  auto comms = ds::rt::comm::make_thread_comms(2);
  std::vector<float> losses(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; r++) {
    threads.emplace_back([&, r] {
      Allocator a;
      ds::rt::parallel::TensorParallelHooks hooks(comms[static_cast<size_t>(r)], nullptr);
      ms::ModelPart part = ms::ModelPart::whole(s);
      part.tp = 2;
      part.tp_rank = r;
      Gpt2 m(s, part, o, a, &hooks);
      losses[static_cast<size_t>(r)] = run(m, &split);  // each rank writes its own shard's elements
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_NEAR(losses[0], loss1, 1e-5 * loss1);
  EXPECT_NEAR(losses[1], loss1, 1e-5 * loss1);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < n; i++) {
    worst = std::max(worst, std::fabs(double(one[i]) - split[i]));
    scale = std::max(scale, std::fabs(double(one[i])));
  }
  EXPECT_GT(scale, 0.0);
  EXPECT_LE(worst, 1e-5 * scale + 1e-7) << "adapter gradients, tp 2 against one process";
  std::printf("GPT-2 LoRA tp 2: loss %.6f vs %.6f, adapter gradients worst %.3g of max %.3g\n", losses[0], loss1, worst,
              scale);
}
