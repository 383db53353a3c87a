// Golden test: a tiny Mixtral's cross-entropy, load-balancing loss and EVERY weight gradient of the
// objective (cross-entropy + router_aux_loss_coef * aux loss) against PyTorch float64
// (make_mixtral_golden.py, Hugging Face's MixtralForCausalLM in plain torch ops), from one weights
// file in HF's names read through the HF import (checkpoint/hf_safetensors.h: the experts' w1, w3
// and w2 pieces into the stacked tensors). Also: activation checkpointing gives the same gradients
// bit for bit, and 16-bit storage follows within its precision.
// Tolerance: fp32 against float64, |ours - torch| <= 1e-6 + 2e-3 |torch| per element, the losses
// to 1e-5 relative.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/hf_safetensors.h"
#include "checkpoint/safetensors.h"
#include "common/error.h"
#include "core/allocator.h"
#include "core/dtype.h"
#include "kernels/typed.h"
#include "model/decoder.h"

using namespace ds::rt;
namespace ms = ds::model_spec;

namespace {

struct Golden {
  ms::ModelShape shape;
  int B = 0, T = 0;
  std::vector<int32_t> tokens, targets;
  double loss = 0, aux = 0;
};

std::string data(const std::string& f) { return std::string(DS_SOURCE_DIR) + "/tests/data/" + f; }

Golden read_golden() {
  std::ifstream in(data("mixtral_golden.json"));
  const auto j = nlohmann::json::parse(in);
  Golden g;
  g.shape = ms::ModelShape{j["n_layer"], j["n_head"], j["n_embd"], j["vocab_size"], j["vocab_size"], j["seq_len"]};
  g.shape.family = ms::ModelFamily::kMixtral;
  g.shape.n_kv_head = j["n_kv_head"];
  g.shape.intermediate_size = j["intermediate_size"];
  g.shape.num_local_experts = j["num_local_experts"];
  g.shape.num_experts_per_tok = j["num_experts_per_tok"];
  g.shape.router_aux_loss_coef = j["router_aux_loss_coef"];
  g.shape.rope_theta = j["rope_theta"];
  g.shape.norm_eps = j["norm_eps"];
  g.B = j["B"];
  g.T = j["T"];
  g.tokens = j["tokens"].get<std::vector<int32_t>>();
  g.targets = j["targets"].get<std::vector<int32_t>>();
  g.loss = j["loss"];
  g.aux = j["aux_loss"];
  return g;
}

ModelOptions options(const Golden& g, bool recompute, DType dtype = DType::kF32, DType grad_dtype = DType::kF32) {
  ModelOptions o;
  o.B = g.B;
  o.T = g.T;
  o.recompute = recompute;
  o.dtype = dtype;
  o.grad_dtype = grad_dtype;
  return o;
}

// The model's gradients as fp32 (whatever their type).
std::vector<float> grads_f32(Decoder& m) {
  std::vector<float> out(static_cast<size_t>(m.num_params()));
  kern::typed::to_host_f32(out.data(), m.grads(), m.num_params());
  return out;
}

}  // namespace

TEST(MixtralGolden, LossAuxLossAndEveryGradientMatchPyTorch) {
  omp_set_num_threads(2);
  const Golden g = read_golden();
  std::vector<std::vector<float>> runs;
  for (bool recompute : {false, true}) {
    Allocator alloc;
    Decoder m(g.shape, ms::ModelPart::whole(g.shape), options(g, recompute), alloc);
    ds::rt::ckpt::load_hf_safetensors(data("mixtral_golden.safetensors"), g.shape, m.part(), m.params().f32());
    std::vector<float> want(static_cast<size_t>(m.num_params()));
    ds::rt::ckpt::load_hf_safetensors(data("mixtral_golden_grads.safetensors"), g.shape, m.part(), want.data());
    m.zero_grads();
    auto a = m.make_activations();
    const float loss = m.forward_backward(a, g.tokens.data(), g.targets.data(), 1.0f);
    EXPECT_NEAR(loss, g.loss, 1e-5 * g.loss) << "recompute " << recompute;
    EXPECT_NEAR(a.router.load_balancing_loss(), g.aux, 1e-5 * g.aux) << "recompute " << recompute;
    EXPECT_EQ(a.router.rows, g.shape.n_layer * g.B * g.T);
    const auto all = ms::model_params(g.shape);
    double worst = 0.0;
    for (const auto& ts : m.layout().tensors) {
      int bad = 0;
      for (int64_t i = 0; i < ts.numel && bad < 3; i++) {
        const double w = want[static_cast<size_t>(ts.offset + i)], got = m.grads().f32()[ts.offset + i];
        worst = std::max(worst, std::fabs(got - w) / (1e-6 + 2e-3 * std::fabs(w)));
        if (std::fabs(got - w) > 1e-6 + 2e-3 * std::fabs(w)) {
          ADD_FAILURE() << ms::find_param(all, ts.id).name << " layer " << ts.layer << " [" << i << "]: ours " << got
                        << " torch " << w;
          bad++;
        }
      }
    }
    std::printf("recompute %d: loss %.7f (torch %.7f), aux %.7f (torch %.7f), worst gradient %.3f of the tolerance\n",
                recompute, loss, g.loss, a.router.load_balancing_loss(), g.aux, worst);
    // Forward only: the same loss and statistics.
    EXPECT_NEAR(m.forward(a, g.tokens.data(), g.targets.data()), g.loss, 1e-5 * g.loss);
    EXPECT_NEAR(a.router.load_balancing_loss(), g.aux, 1e-5 * g.aux);
    runs.push_back(grads_f32(m));
  }
  EXPECT_EQ(runs[0], runs[1]) << "recompute changed the gradients";
}

// Without the load-balancing loss's weight the router's gradient comes from the routing weights
// alone, and the gradients of everything else are unchanged by the coefficient: the difference
// of the two runs' router gradients is the aux term's (not zero), the experts' the same.
TEST(MixtralGolden, AuxCoefficientMovesOnlyTheRouterAndWhatFeedsIt) {
  omp_set_num_threads(2);
  Golden g = read_golden();
  std::vector<std::vector<float>> runs;
  for (double coef : {g.shape.router_aux_loss_coef, 0.0}) {
    g.shape.router_aux_loss_coef = coef;
    Allocator alloc;
    Decoder m(g.shape, ms::ModelPart::whole(g.shape), options(g, false), alloc);
    ds::rt::ckpt::load_hf_safetensors(data("mixtral_golden.safetensors"), g.shape, m.part(), m.params().f32());
    m.zero_grads();
    auto a = m.make_activations();
    m.forward_backward(a, g.tokens.data(), g.targets.data(), 1.0f);
    runs.push_back(grads_f32(m));
    if (coef == 0.0) {
      const auto* last_w2 = m.layout().find_tensor(ms::ParamId::kExpertW2, g.shape.n_layer - 1);
      const auto* router = m.layout().find_tensor(ms::ParamId::kRouter, 0);
      double dw2 = 0, drouter = 0;
      for (int64_t i = 0; i < last_w2->numel; i++) {
        dw2 = std::max(dw2, double(std::fabs(runs[0][last_w2->offset + i] - runs[1][last_w2->offset + i])));
      }
      for (int64_t i = 0; i < router->numel; i++) {
        drouter = std::max(drouter, double(std::fabs(runs[0][router->offset + i] - runs[1][router->offset + i])));
      }
      EXPECT_EQ(dw2, 0.0) << "the last layer's experts do not see the aux loss";
      EXPECT_GT(drouter, 1e-6) << "the first router does";
    }
  }
}

// 16-bit storage: the loss within 20 roundings, each gradient tensor within 40 roundings in L2.
TEST(MixtralGolden, SixteenBitStorageFollowsPyTorchWithinItsPrecision) {
  omp_set_num_threads(2);
  const Golden g = read_golden();
  const auto all = ms::model_params(g.shape);
  for (const DType dt : {DType::kBF16, DType::kF16}) {
    const double eps = dt == DType::kBF16 ? 1.0 / 256 : 1.0 / 2048;
    Allocator alloc;
    Decoder m(g.shape, ms::ModelPart::whole(g.shape), options(g, false, dt, DType::kF32), alloc);
    std::vector<float> w(static_cast<size_t>(m.num_params())), want(w.size());
    ds::rt::ckpt::load_hf_safetensors(data("mixtral_golden.safetensors"), g.shape, m.part(), w.data());
    ds::rt::ckpt::load_hf_safetensors(data("mixtral_golden_grads.safetensors"), g.shape, m.part(), want.data());
    kern::typed::from_host_f32(m.params(), w.data(), m.num_params());
    m.zero_grads();
    auto a = m.make_activations();
    const float loss = m.forward_backward(a, g.tokens.data(), g.targets.data(), 1.0f);
    EXPECT_NEAR(loss, g.loss, 20 * eps * g.loss) << dtype_name(dt);
    EXPECT_NEAR(a.router.load_balancing_loss(), g.aux, 20 * eps * g.aux) << dtype_name(dt);
    const auto got = grads_f32(m);
    double worst = 0;
    for (const auto& ts : m.layout().tensors) {
      double num = 0, den = 0;
      for (int64_t i = 0; i < ts.numel; i++) {
        const double d = got[static_cast<size_t>(ts.offset + i)] - want[static_cast<size_t>(ts.offset + i)];
        num += d * d;
        den += double(want[static_cast<size_t>(ts.offset + i)]) * want[static_cast<size_t>(ts.offset + i)];
      }
      const double rel = std::sqrt(num / den);
      worst = std::max(worst, rel / eps);
      EXPECT_LE(rel, 40 * eps) << dtype_name(dt) << " " << ms::find_param(all, ts.id).name << " layer " << ts.layer;
    }
    std::printf("%s: loss %.6f (torch %.6f), worst gradient tensor %.1f roundings off in L2\n", dtype_name(dt), loss,
                g.loss, worst);
  }
}

// A Hugging Face file without one expert's tensor is refused, naming the file and the tensor.
TEST(MixtralGolden, MissingExpertTensorIsNamed) {
  const Golden g = read_golden();
  // Rewrite the golden file without layer 1's expert 3 w3.
  const ds::rt::ckpt::SafetensorsSet in(data("mixtral_golden.safetensors"));
  std::vector<ds::rt::ckpt::StTensorOut> out;
  for (const auto& n : in.names()) {
    if (n == "model.layers.1.block_sparse_moe.experts.3.w3.weight") continue;
    const auto* t = in.find(n);
    ds::rt::ckpt::StTensorOut o{n, ds::rt::ckpt::StDtype::kF32, t->shape, {}};
    int64_t count = 1;
    for (int64_t d : t->shape) count *= d;
    o.values.resize(static_cast<size_t>(count));
    in.read_f32(n, t->shape, o.values.data());
    out.push_back(std::move(o));
  }
  const std::string dir = ::testing::TempDir() + "mixtral_missing_expert";
  ds::rt::ckpt::write_safetensors_dir(dir, out, uint64_t{1} << 30);
  std::vector<float> w(static_cast<size_t>(ms::param_count(g.shape)));
  try {
    ds::rt::ckpt::load_hf_safetensors(dir, g.shape, ms::ModelPart::whole(g.shape), w.data());
    FAIL() << "no error";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tensor 'model.layers.1.block_sparse_moe.experts.3.w3.weight'"),
              std::string::npos)
        << e.what();
  }
}
