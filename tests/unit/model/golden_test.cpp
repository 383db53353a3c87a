// Golden test: the loss and selected gradients of a tiny GPT-2 against values PyTorch computed
// once, independently of dstrain's kernels (float64 autograd). How they were produced:
//   /usr/bin/python3 tests/unit/model/make_golden.py   (Debian's python3-torch 1.13)
// which writes tests/data/gpt2_golden.json. The weights are not stored: both sides compute them
// from the same integer hash of (tensor index in llm.c's order, layer, element index), below.
// Tolerance: fp32 against float64, |ours - torch| <= 2e-6 + 1e-3 |torch| for gradients, 1e-5
// relative for the loss.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "model_spec/gpt2_spec.h"
#include "core/allocator.h"
#include "model/gpt2.h"

using namespace ds::rt;
namespace ms = ds::model_spec;

namespace {
double hash_value(uint32_t tid, int layer, int64_t i) {
  uint32_t x = tid * 1000003u + static_cast<uint32_t>(layer + 1) * 7919u +
               static_cast<uint32_t>(i) * 2654435761u;
  x ^= x >> 16;
  x *= 0x45D9F3Bu;
  x ^= x >> 16;
  x *= 0x45D9F3Bu;
  x ^= x >> 16;
  return (x / 4294967296.0 - 0.5) * 0.4;
}
}  // namespace

class Golden : public ::testing::TestWithParam<bool> {};

TEST_P(Golden, MatchesPyTorch) {
  omp_set_num_threads(2);
  const std::string path = std::string(DS_SOURCE_DIR) + "/tests/data/gpt2_golden.json";
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << path;
  const auto j = nlohmann::json::parse(f);
  const auto& js = j["shape"];
  const ms::ModelShape s{js["n_layer"], js["n_head"], js["n_embd"], js["vocab_size"],
                        js["padded_vocab_size"], js["seq_len"]};
  const int B = j["B"], T = j["T"];
  const std::vector<int32_t> in = j["tokens"].get<std::vector<int32_t>>();
  const std::vector<int32_t> tg = j["targets"].get<std::vector<int32_t>>();

  Allocator alloc;
  Gpt2Options opt{B, T};
  opt.recompute = GetParam();
  opt.head_chunk_rows = 5;  // several head chunks, one partial
  Gpt2 m(s, ms::ModelPart::whole(s), opt, alloc);
  const auto all = ms::gpt2_params(s);
  for (const auto& t : m.layout().tensors) {
    float* p = m.params().f32() + t.offset;
    for (int64_t i = 0; i < t.numel; i++) {
      double v = hash_value(static_cast<uint32_t>(t.id), t.layer, i);
      if (t.id == ms::ParamId::kLn1w || t.id == ms::ParamId::kLn2w || t.id == ms::ParamId::kLnfw) {
        v += 1.0;
      }
      p[i] = static_cast<float>(static_cast<float>(v));
    }
  }
  auto acts = m.make_activations();
  m.zero_grads();
  const float loss = m.forward_backward(acts, in.data(), tg.data(), 1.0f);
  const double want_loss = j["loss"];
  EXPECT_NEAR(loss, want_loss, 1e-5 * want_loss);
  int checked = 0;
  for (const auto& g : j["grads"]) {
    const std::string name = g["tensor"];
    int id = -1;
    for (const auto& t : all) {
      if (t.name == name) id = static_cast<int>(t.id);
    }
    ASSERT_GE(id, 0) << name;
    const float got = m.grad(static_cast<ms::ParamId>(id), g["layer"]).f32()[g["index"].get<int64_t>()];
    const double want = g["value"];
    EXPECT_NEAR(got, want, 2e-6 + 1e-3 * std::fabs(want))
        << name << " layer " << g["layer"] << " index " << g["index"];
    checked++;
  }
  EXPECT_GT(checked, 100);
}

INSTANTIATE_TEST_SUITE_P(Recompute, Golden, ::testing::Values(false, true));
