// GPT-2 model: whole-model gradients against finite differences on a tiny config, activation
// checkpointing bit-identical to none, layer-range pieces (a two-stage split) equal to the whole,
// gradient accumulation, parameters served by hooks (ZeRO-3's path), layout-independent init,
// and the allocator's accounting against the model spec.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "model_spec/gpt2_spec.h"
#include "common/error.h"
#include "core/allocator.h"
#include "model/gpt2.h"
#include "model/init.h"
#include "unit/kernels/grad_check.h"

using namespace ds::rt;
namespace ms = ds::model_spec;

namespace {
// L=2, NH=2, C=8, V=13 (padded to 16), maxT=8.
ms::ModelShape tiny() { return ms::ModelShape{2, 2, 8, 13, 16, 8}; }
constexpr int kB = 2, kT = 5;

std::vector<int32_t> tokens(uint32_t seed, int n, int V) {
  std::vector<int32_t> v(n);
  uint32_t x = seed;
  for (auto& t : v) {
    x = x * 1664525u + 1013904223u;
    t = static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(V));
  }
  return v;
}

// Random parameters with enough signal for finite differences (LayerNorm weights near 1).
void randomize(Gpt2& m, uint32_t seed) {
  auto r = ds::test::randn(static_cast<size_t>(m.num_params()), seed, 0.3f);
  std::memcpy(m.params().f32(), r.data(), r.size() * 4);
  for (const auto& t : m.layout().tensors) {
    if (t.id == ms::ParamId::kLn1w || t.id == ms::ParamId::kLn2w || t.id == ms::ParamId::kLnfw) {
      for (int64_t i = 0; i < t.numel; i++) m.params().f32()[t.offset + i] += 1.0f;
    }
  }
}

struct ModelTest : ::testing::Test {
  void SetUp() override { omp_set_num_threads(2); }
};
}  // namespace

TEST_F(ModelTest, GradientsMatchFiniteDifferences) {
  const auto s = tiny();
  Allocator alloc;
  Gpt2 m(s, ms::ModelPart::whole(s), Gpt2Options{kB, kT}, alloc);
  randomize(m, 1);
  auto acts = m.make_activations();
  const auto in = tokens(7, kB * kT, s.vocab_size), tg = tokens(8, kB * kT, s.vocab_size);
  m.zero_grads();
  const float loss0 = m.forward_backward(acts, in.data(), tg.data(), 1.0f);
  EXPECT_NEAR(loss0, m.forward(acts, in.data(), tg.data()), 0.0f);
  std::vector<float> params(m.params().f32(), m.params().f32() + m.num_params());
  std::vector<float> grads(m.grads().f32(), m.grads().f32() + m.num_params());
  auto loss = [&] {
    std::memcpy(m.params().f32(), params.data(), params.size() * 4);
    return static_cast<double>(m.forward(acts, in.data(), tg.data()));
  };
  // The loss is an fp32 mean of ~2.6: its rounding noise over 2 eps bounds atol.
  ds::test::Tolerance tol{1e-3, 6e-4, 2e-2};
  ds::test::check_grad("all parameters", params, grads, loss, tol, 100000);
  // Padded vocabulary rows of wte get no gradient.
  const float* gwte = m.grad(ms::ParamId::kWte).f32();
  for (int v = s.vocab_size; v < s.padded_vocab_size; v++) {
    for (int c = 0; c < s.n_embd; c++) EXPECT_EQ(gwte[v * s.n_embd + c], 0.0f);
  }
}

TEST_F(ModelTest, CheckpointingGivesBitIdenticalGradients) {
  const ms::ModelShape s{3, 4, 32, 50, 64, 16};
  const int B = 2, T = 16;
  const auto in = tokens(1, B * T, s.vocab_size), tg = tokens(2, B * T, s.vocab_size);
  Allocator alloc;
  Gpt2 plain(s, ms::ModelPart::whole(s), Gpt2Options{B, T, false}, alloc);
  Gpt2 ckpt(s, ms::ModelPart::whole(s), Gpt2Options{B, T, true}, alloc);
  plain.init_weights(42);
  ckpt.init_weights(42);
  ASSERT_EQ(std::memcmp(plain.params().f32(), ckpt.params().f32(), plain.num_params() * 4), 0);
  auto a1 = plain.make_activations();
  auto a2 = ckpt.make_activations();
  plain.zero_grads();
  ckpt.zero_grads();
  const float l1 = plain.forward_backward(a1, in.data(), tg.data(), 1.0f);
  const float l2 = ckpt.forward_backward(a2, in.data(), tg.data(), 1.0f);
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(std::memcmp(plain.grads().f32(), ckpt.grads().f32(), plain.num_params() * 4), 0);
  EXPECT_LT(a2.buffer().bytes(), a1.buffer().bytes());
}

TEST_F(ModelTest, PipelinePiecesComposeToTheWholeModel) {
  const ms::ModelShape s{4, 2, 16, 40, 48, 8};
  const int B = 2, T = 8;
  const auto in = tokens(3, B * T, s.vocab_size), tg = tokens(4, B * T, s.vocab_size);
  Allocator alloc;
  Gpt2 whole(s, ms::ModelPart::whole(s), Gpt2Options{B, T}, alloc);
  whole.init_weights(5);
  // Stage 0: embedding + layers 0-1; stage 1: layers 2-3 + head (its own copy of the tied wte).
  Gpt2 st0(s, ms::ModelPart{0, 2, true, false, 1, 0}, Gpt2Options{B, T}, alloc);
  Gpt2 st1(s, ms::ModelPart{2, 4, false, true, 1, 0}, Gpt2Options{B, T}, alloc);
  st0.init_weights(5);
  st1.init_weights(5);
  for (auto* st : {&st0, &st1}) {  // the layout-independent init gives the same tensors
    for (const auto& t : st->layout().tensors) {
      ASSERT_EQ(std::memcmp(st->params().f32() + t.offset, whole.param(t.id, t.layer).f32(), t.numel * 4), 0);
    }
  }
  auto aw = whole.make_activations();
  auto a0 = st0.make_activations();
  auto a1 = st1.make_activations();
  whole.zero_grads();
  st0.zero_grads();
  st1.zero_grads();
  const float lw = whole.forward_backward(aw, in.data(), tg.data(), 1.0f);
  const int64_t BTC = int64_t{B} * T * s.n_embd;
  st0.embed_forward(a0, in.data());
  st0.blocks_forward(a0, 0, 1);  // ranges inside a stage compose too
  st0.blocks_forward(a0, 1, 2);
  std::memcpy(a1.input.f32(), st0.output(a0).f32(), BTC * 4);  // "send" the activations
  st1.blocks_forward(a1, 2, 4);
  const float lp = st1.head_forward_backward(a1, tg.data(), 1.0f);
  st1.blocks_backward(a1, 3, 4);
  st1.blocks_backward(a1, 2, 3);
  std::memcpy(st0.d_stream().f32(), st1.d_stream().f32(), BTC * 4);  // "send" the gradient back
  st0.blocks_backward(a0, 0, 2);
  st0.embed_backward(a0, in.data());
  EXPECT_EQ(lw, lp);
  for (auto* st : {&st0, &st1}) {
    for (const auto& t : st->layout().tensors) {
      if (t.id == ms::ParamId::kWte) continue;
      EXPECT_EQ(std::memcmp(st->grads().f32() + t.offset, whole.grad(t.id, t.layer).f32(), t.numel * 4), 0)
          << "tensor " << static_cast<int>(t.id) << " layer " << t.layer;
    }
  }
  // The tied wte: the two stages' gradients add up to the whole model's (sums in another order).
  const float* g0 = st0.grad(ms::ParamId::kWte).f32();
  const float* g1 = st1.grad(ms::ParamId::kWte).f32();
  const float* gw = whole.grad(ms::ParamId::kWte).f32();
  for (int64_t i = 0; i < int64_t{s.padded_vocab_size} * s.n_embd; i++) {
    ASSERT_NEAR(g0[i] + g1[i], gw[i], 1e-6f + 1e-5f * std::fabs(gw[i])) << i;
  }
}

TEST_F(ModelTest, GradientAccumulationWeightsMicroBatches) {
  const auto s = tiny();
  Allocator alloc;
  Gpt2 m(s, ms::ModelPart::whole(s), Gpt2Options{kB, kT}, alloc);
  m.init_weights(9);
  auto acts = m.make_activations();
  const auto in1 = tokens(1, kB * kT, s.vocab_size), tg1 = tokens(2, kB * kT, s.vocab_size);
  const auto in2 = tokens(3, kB * kT, s.vocab_size), tg2 = tokens(4, kB * kT, s.vocab_size);
  m.zero_grads();
  m.forward_backward(acts, in1.data(), tg1.data(), 1.0f);
  std::vector<float> g1(m.grads().f32(), m.grads().f32() + m.num_params());
  m.zero_grads();
  m.forward_backward(acts, in2.data(), tg2.data(), 1.0f);
  std::vector<float> g2(m.grads().f32(), m.grads().f32() + m.num_params());
  m.zero_grads();
  m.forward_backward(acts, in1.data(), tg1.data(), 0.5f);  // accumulate with weight 1/2 each
  m.forward_backward(acts, in2.data(), tg2.data(), 0.5f);
  for (int64_t i = 0; i < m.num_params(); i++) {
    const float want = 0.5f * (g1[i] + g2[i]);
    ASSERT_NEAR(m.grads().f32()[i], want, 1e-7f + 1e-5f * std::fabs(want)) << i;
  }
}

// training.sync_loss_once: the head's kept losses come back from take_losses with the bits the
// head returns, in order, and the gradients are the same.
TEST_F(ModelTest, KeptLossesEqualTheReturnedOnesBitForBit) {
  const auto s = tiny();
  Allocator alloc;
  Gpt2 m(s, ms::ModelPart::whole(s), Gpt2Options{kB, kT}, alloc);
  m.init_weights(9);
  auto acts = m.make_activations();
  std::vector<std::vector<int32_t>> in, tg;
  for (uint32_t k = 0; k < 3; ++k) {
    in.push_back(tokens(10 + 2 * k, kB * kT, s.vocab_size));
    tg.push_back(tokens(11 + 2 * k, kB * kT, s.vocab_size));
  }
  tg[1][3] = -1;  // an ignored target
  auto step = [&](bool keep) {
    m.zero_grads();
    std::vector<float> returned;
    for (size_t k = 0; k < in.size(); ++k) {
      m.embed_forward(acts, in[k].data());
      m.blocks_forward(acts, 0, s.n_layer);
      if (keep) m.head_forward_backward_deferred(acts, tg[k].data(), 0.5f);
      else returned.push_back(m.head_forward_backward(acts, tg[k].data(), 0.5f));
      m.blocks_backward(acts, 0, s.n_layer);
      m.embed_backward(acts, in[k].data());
    }
    return std::make_pair(keep ? m.take_losses() : returned,
                          std::vector<float>(m.grads().f32(), m.grads().f32() + m.num_params()));
  };
  const auto [returned, g_returned] = step(false);
  const auto [kept, g_kept] = step(true);
  ASSERT_EQ(kept.size(), 3u);
  for (size_t k = 0; k < kept.size(); ++k) EXPECT_EQ(kept[k], returned[k]) << "micro-batch " << k;
  EXPECT_EQ(g_kept, g_returned);
  EXPECT_TRUE(m.take_losses().empty());  // taken once
}

namespace {
// ZeRO-3's path: the model owns no parameters; the hooks serve each unit from elsewhere and record
// the order of the named points.
struct ServingHooks : ParallelHooks {
  const Gpt2* source = nullptr;
  std::vector<std::string> events;
  TypedPtr params_needed(Unit u, TypedPtr resident) override {
    EXPECT_FALSE(resident);
    events.push_back("need " + std::to_string(static_cast<int>(u.kind)) + ":" +
                     std::to_string(u.layer));
    const auto* s = source->layout().find_unit(u.kind, u.layer);
    return const_cast<Gpt2*>(source)->params().f32() + s->offset;
  }
  void grads_ready(Unit u) override {
    events.push_back("ready " + std::to_string(static_cast<int>(u.kind)) + ":" +
                     std::to_string(u.layer));
  }
};
}  // namespace

TEST_F(ModelTest, HooksCanServeParametersAndSeeEveryLayer) {
  const auto s = tiny();
  Allocator alloc;
  Gpt2 ref(s, ms::ModelPart::whole(s), Gpt2Options{kB, kT}, alloc);
  ref.init_weights(3);
  ServingHooks hooks;
  hooks.source = &ref;
  Gpt2Options opt{kB, kT};
  opt.own_params = false;
  Gpt2 m(s, ms::ModelPart::whole(s), opt, alloc, &hooks);
  EXPECT_EQ(m.params().f32(), nullptr);
  auto a = m.make_activations();
  auto ar = ref.make_activations();
  const auto in = tokens(1, kB * kT, s.vocab_size), tg = tokens(2, kB * kT, s.vocab_size);
  m.zero_grads();
  ref.zero_grads();
  EXPECT_EQ(m.forward_backward(a, in.data(), tg.data(), 1.0f),
            ref.forward_backward(ar, in.data(), tg.data(), 1.0f));
  EXPECT_EQ(std::memcmp(m.grads().f32(), ref.grads().f32(), m.num_params() * 4), 0);
  const std::vector<std::string> want = {
      "need 0:-1", "need 1:-1", "need 2:0", "need 2:1", "need 0:-1", "need 3:-1",  // forward
      "ready 3:-1", "need 2:1", "ready 2:1", "need 2:0", "ready 2:0",  // head, layers backward
      "ready 1:-1", "ready 0:-1"};                                      // embedding
  EXPECT_EQ(hooks.events, want);
}

TEST_F(ModelTest, InitIsLayoutIndependentAndHasGpt2Statistics) {
  const ms::ModelShape s{4, 4, 64, 100, 128, 32};
  const auto all = ms::gpt2_params(s);
  // A tp=2 shard generated alone equals the matching elements of the full tensor.
  for (auto id : {ms::ParamId::kQkvw, ms::ParamId::kFcprojw, ms::ParamId::kWte}) {
    const auto& t = all[static_cast<size_t>(id)];
    std::vector<float> full(t.numel()), shard(ms::local_numel(t, 2));
    init_tensor_values(full.data(), t, 1, s.n_layer, 1, 0, 77, 0, t.numel());
    init_tensor_values(shard.data(), t, 1, s.n_layer, 2, 1, 77, 0, ms::local_numel(t, 2));
    for (int64_t i = 0; i < ms::local_numel(t, 2); i++) {
      ASSERT_EQ(shard[i], full[ms::full_index(t, 2, 1, i)]) << t.name << " " << i;
    }
    // ... and a slice of the shard generated alone (a ZeRO partition) equals the shard's slice.
    std::vector<float> part(10);
    init_tensor_values(part.data(), t, 1, s.n_layer, 2, 1, 77, 5, 10);
    for (int i = 0; i < 10; i++) ASSERT_EQ(part[i], shard[5 + i]);
  }
  Allocator alloc;
  Gpt2 m(s, ms::ModelPart::whole(s), Gpt2Options{1, 8}, alloc);
  m.init_weights(1);
  auto stddev = [&](ms::ParamId id, int layer) {
    const auto* t = m.layout().find_tensor(id, layer);
    double s2 = 0;
    for (int64_t i = 0; i < t->numel; i++) s2 += double(m.params().f32()[t->offset + i]) * m.params().f32()[t->offset + i];
    return std::sqrt(s2 / t->numel);
  };
  EXPECT_NEAR(stddev(ms::ParamId::kWte, -1), 0.02, 0.001);
  EXPECT_NEAR(stddev(ms::ParamId::kFcw, 2), 0.02, 0.001);
  EXPECT_NEAR(stddev(ms::ParamId::kFcprojw, 2), 0.02 / std::sqrt(8.0), 0.0005);
  EXPECT_EQ(m.param(ms::ParamId::kLn1w, 3).f32()[5], 1.0f);
  EXPECT_EQ(m.param(ms::ParamId::kQkvb, 0).f32()[5], 0.0f);
  // Different layers differ; the same seed repeats.
  EXPECT_NE(m.param(ms::ParamId::kQkvw, 0).f32()[0], m.param(ms::ParamId::kQkvw, 1).f32()[0]);
  Gpt2 m2(s, ms::ModelPart::whole(s), Gpt2Options{1, 8}, alloc);
  m2.init_weights(1);
  EXPECT_EQ(std::memcmp(m.params().f32(), m2.params().f32(), m.num_params() * 4), 0);
}

TEST_F(ModelTest, AllocatorCountsExactlyWhatTheSpecSays) {
  const ms::ModelShape s{3, 4, 32, 50, 64, 16};
  const int B = 2, T = 16;
  for (bool recompute : {false, true}) {
    Allocator alloc;
    {
      Gpt2 m(s, ms::ModelPart::whole(s), Gpt2Options{B, T, recompute}, alloc);
      auto a1 = m.make_activations();
      auto a2 = m.make_activations();  // two micro-batches in flight
      const ms::ActConfig cfg{B, T, recompute, omp_get_max_threads(), 0};
      const auto tot = ms::activation_totals(s, ms::ModelPart::whole(s), cfg);
      EXPECT_EQ(alloc.current(MemTag::kParams), ms::param_count(s) * 4);
      EXPECT_EQ(alloc.current(MemTag::kGrads), ms::param_count(s) * 4);
      EXPECT_EQ(alloc.current(MemTag::kActivations),
                (2 * tot.per_micro_batch + tot.shared_activations) * 4);
      EXPECT_EQ(alloc.current(MemTag::kWorkspace), tot.shared_workspace * 4);
    }
    EXPECT_EQ(alloc.stats().current_total, 0);
    EXPECT_GT(alloc.peak(MemTag::kActivations), 0);
    alloc.reset_peaks();
    EXPECT_EQ(alloc.peak_total(), 0);
  }
}

TEST_F(ModelTest, BadInputsAreClearErrors) {
  const auto s = tiny();
  Allocator alloc;
  Gpt2 m(s, ms::ModelPart::whole(s), Gpt2Options{kB, kT}, alloc);
  auto a = m.make_activations();
  auto in = tokens(1, kB * kT, s.vocab_size), tg = tokens(2, kB * kT, s.vocab_size);
  in[3] = s.vocab_size;
  try {
    m.forward(a, in.data(), tg.data());
    FAIL();
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("position 3"), std::string::npos) << e.what();
  }
  in[3] = 0;
  tg[6] = -2;
  EXPECT_THROW(m.forward(a, in.data(), tg.data()), ds::Error);
  tg[6] = -1;  // kIgnoreTarget: a masked-out target (SFT loss masks), not an error
  EXPECT_NO_THROW(m.forward(a, in.data(), tg.data()));
  EXPECT_THROW(Gpt2(s, ms::ModelPart::whole(s), Gpt2Options{kB, 9}, alloc), ds::Error);
  EXPECT_THROW(m.blocks_forward(a, 1, 3), ds::Error);
}
