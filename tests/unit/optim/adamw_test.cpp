// AdamW: a hand-computed two-step example, PyTorch's torch.optim.AdamW / torch.optim.Adam
// values, decay tables over ZeRO-style partitions, grad_scale fusion, thread-count independence.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/kernels.h"
#include "optim/adamw.h"

namespace ds::rt::optim {
namespace {

// The element pass is the CPU kernel; the step scalars are the optimizer's.
using cpu::adamw_update;
using cpu::adamw_update_partition;

struct State {
  std::vector<float> p, m, v;
  explicit State(std::vector<float> p0) : p(std::move(p0)), m(p.size(), 0.f), v(p.size(), 0.f) {}
};

void step(State& s, const AdamWConfig& c, int64_t t, double lr, const std::vector<float>& g,
          bool decay, double grad_scale = 1.0) {
  adamw_update(adamw_step_scalars(c, t, lr, grad_scale), s.p.data(), g.data(), s.m.data(),
               s.v.data(), static_cast<int64_t>(s.p.size()), decay);
}

// By hand, beta1 = 0.9, beta2 = 0.999, lr = 0.1, eps negligible, p = 1:
// step 1, g = 0.5:   m = 0.05, v = 0.00025, m^ = 0.05/0.1 = 0.5, v^ = 0.00025/0.001 = 0.25,
//                    p -= 0.1 * 0.5 / 0.5  ->  p = 0.9 (Adam's first step is lr * sign(g))
// step 2, g = -0.25: m = 0.045 - 0.025 = 0.02, v = 0.00024975 + 0.0000625 = 0.00031225,
//                    m^ = 0.02/0.19 = 0.1052631579, v^ = 0.00031225/0.001999 = 0.1562031016,
//                    p -= 0.1 * 0.1052631579 / 0.3952253808 = 0.0266336183  ->  p = 0.8733663817
// With weight_decay = 0.1 (AdamW): p *= 1 - 0.1*0.1 before each update:
//                    step 1: 0.99 - 0.1 = 0.89; step 2: 0.89*0.99 - 0.0266336183 = 0.8544663817
TEST(AdamW, HandComputedTwoSteps) {
  AdamWConfig c;
  c.beta1 = 0.9;
  c.beta2 = 0.999;
  c.eps = 1e-12;
  c.weight_decay = 0.0;
  State s({1.0f});
  step(s, c, 1, 0.1, {0.5f}, true);
  EXPECT_NEAR(s.p[0], 0.9f, 1e-6);
  EXPECT_NEAR(s.m[0], 0.05f, 1e-8);
  EXPECT_NEAR(s.v[0], 0.00025f, 1e-10);
  step(s, c, 2, 0.1, {-0.25f}, true);
  EXPECT_NEAR(s.m[0], 0.02f, 1e-8);
  EXPECT_NEAR(s.v[0], 0.00031225f, 1e-10);
  EXPECT_NEAR(s.p[0], 0.8733663817f, 1e-6);

  c.weight_decay = 0.1;
  State d({1.0f});
  step(d, c, 1, 0.1, {0.5f}, true);
  EXPECT_NEAR(d.p[0], 0.89f, 1e-6);
  step(d, c, 2, 0.1, {-0.25f}, true);
  EXPECT_NEAR(d.p[0], 0.8544663817f, 1e-6);

  // The same parameter with decay off for its range ignores weight_decay.
  State n({1.0f});
  step(n, c, 1, 0.1, {0.5f}, false);
  step(n, c, 2, 0.1, {-0.25f}, false);
  EXPECT_NEAR(n.p[0], 0.8733663817f, 1e-6);
}

// Reference values from PyTorch 1.13 (Debian's python3-torch), computed once with
// /usr/bin/python3 tests/unit/optim/make_reference_values.py: torch.optim.AdamW (and torch.optim.Adam for adam_w_mode = false, whose
// weight_decay is L2 on the gradient) on a float32 parameter p0, betas (0.9, 0.95), eps 1e-8,
// three steps with the gradients below and lr set per step to 1e-2, 6e-3, 3e-3.
const std::vector<float> kP0 = {0.5f, -1.25f, 2.0f, 0.0f, -0.03125f, 3.5f};
const std::vector<std::vector<float>> kGrads = {{0.1f, -0.2f, 0.3f, -0.4f, 0.5f, 1e-3f},
                                                {-0.05f, 0.25f, 0.0f, 1.5f, -2.0f, 4e-3f},
                                                {0.2f, 0.2f, -0.1f, 0.0f, 0.75f, -0.5f}};
const double kLrs[3] = {1e-2, 6e-3, 3e-3};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float rel) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rel * std::max(1e-3f, std::fabs(want[i]))) << "element " << i;
  }
}

TEST(AdamW, MatchesPyTorchAdamW) {
  AdamWConfig c;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-8;
  c.weight_decay = 0.1;
  State s(kP0);
  const std::vector<std::vector<float>> want = {
      {4.895000160e-01f, -1.238749981e+00f, 1.988000035e+00f, 1.000000071e-02f, -4.121875018e-02f,
       3.486500025e+00f},
      {4.875960946e-01f, -1.238980412e+00f, 1.982735395e+00f, 6.750356406e-03f, -3.787360713e-02f,
       3.479159832e+00f},
      {4.855035841e-01f, -1.239944696e+00f, 1.981255293e+00f, 5.478447769e-03f, -3.729924560e-02f,
       3.479969263e+00f}};
  for (int t = 0; t < 3; ++t) {
    step(s, c, t + 1, kLrs[t], kGrads[t], true);
    expect_close(s.p, want[t], 1e-6f);
  }
  expect_close(s.m, {2.360000089e-02f, 2.630000003e-02f, 1.429999899e-02f, 1.026000008e-01f,
                     -6.449998915e-02f, -4.955900088e-02f},
               1e-6f);
  expect_close(s.v, {2.570000244e-03f, 6.773750763e-03f, 4.561250098e-03f, 1.140950024e-01f,
                     2.294062525e-01f, 1.250080485e-02f},
               1e-6f);
}

TEST(AdamW, MatchesPyTorchAdamWithoutDecay) {
  AdamWConfig c;
  c.beta2 = 0.95;
  c.weight_decay = 0.0;
  State s(kP0);
  for (int t = 0; t < 3; ++t) step(s, c, t + 1, kLrs[t], kGrads[t], true);
  expect_close(s.p, {4.864435494e-01f, -1.242309690e+00f, 1.985042930e+00f, 5.486472510e-03f,
                     -3.736659139e-02f, 3.486604929e+00f},
               1e-6f);
}

TEST(AdamW, AdamModeIsL2LikeTorchAdam) {
  AdamWConfig c;
  c.beta2 = 0.95;
  c.weight_decay = 0.1;
  c.adam_w_mode = false;
  State s(kP0);
  for (int t = 0; t < 3; ++t) step(s, c, t + 1, kLrs[t], kGrads[t], true);
  expect_close(s.p, {4.835493863e-01f, -1.237442374e+00f, 1.982120514e+00f, 5.484497640e-03f,
                     -3.734873980e-02f, 3.482323885e+00f},
               1e-6f);
  expect_close(s.m, {3.691958264e-02f, -7.363461889e-03f, 6.825562567e-02f, 1.027575508e-01f,
                     -6.550358981e-02f, 4.504099488e-02f},
               1e-6f);
}

TEST(AdamW, GradScaleEqualsPrescaledGradients) {
  AdamWConfig c;
  State a(kP0), b(kP0);
  for (int t = 0; t < 3; ++t) {
    std::vector<float> scaled = kGrads[t];
    for (auto& g : scaled) g *= 1024.0f;  // a loss-scaled gradient
    step(a, c, t + 1, kLrs[t], scaled, true, 1.0 / 1024.0);
    step(b, c, t + 1, kLrs[t], kGrads[t], true);
  }
  EXPECT_EQ(a.p, b.p);  // power-of-two scaling is exact
  EXPECT_EQ(a.v, b.v);
}

TEST(AdamW, NoBiasCorrection) {
  AdamWConfig c;
  c.bias_correction = false;
  c.weight_decay = 0;
  c.eps = 1e-12;
  State s({1.0f});
  step(s, c, 1, 0.1, {0.5f}, true);
  // m = 0.05, v = 0.00025: p -= 0.1 * 0.05 / sqrt(0.00025) = 0.316227766
  EXPECT_NEAR(s.p[0], 1.0f - 0.316227766f, 1e-6);
}

// A ZeRO rank updates [begin, begin + count) of the flat buffer with shard-local pointers; the
// union of the partitions equals one update of the whole buffer, for any split, with the decay
// table in global offsets (gaps do not decay).
TEST(AdamW, PartitionsEqualTheWholeBuffer) {
  const int64_t n = 1000;
  std::vector<float> p0(n), g(n);
  for (int64_t i = 0; i < n; ++i) {
    p0[i] = std::sin(0.1f * static_cast<float>(i));
    g[i] = std::cos(0.37f * static_cast<float>(i));
  }
  const std::vector<DecayRange> table = {{0, 300, true}, {300, 10, false}, {310, 500, true},
                                         {900, 100, false}};  // [810, 900) uncovered
  AdamWConfig c;
  c.weight_decay = 0.5;
  const AdamWStep s = adamw_step_scalars(c, 3, 0.01);

  State whole(p0);
  adamw_update_partition(s, whole.p.data(), g.data(), whole.m.data(), whole.v.data(), 0, n,
                         table);
  // Reference from the primitive, range by range.
  State ref(p0);
  auto upd = [&](int64_t a, int64_t b, bool d) {
    adamw_update(s, ref.p.data() + a, g.data() + a, ref.m.data() + a, ref.v.data() + a, b - a, d);
  };
  upd(0, 300, true);
  upd(300, 310, false);
  upd(310, 810, true);
  upd(810, 900, false);
  upd(900, 1000, false);
  EXPECT_EQ(whole.p, ref.p);

  for (int64_t parts : {2, 3, 7}) {
    State sharded(p0);
    for (int64_t k = 0; k < parts; ++k) {
      const int64_t b = n * k / parts, e = n * (k + 1) / parts;
      // Shard-local copies, as a ZeRO rank holds them.
      std::vector<float> lp(sharded.p.begin() + b, sharded.p.begin() + e), lm(e - b, 0.f),
          lv(e - b, 0.f), lg(g.begin() + b, g.begin() + e);
      adamw_update_partition(s, lp.data(), lg.data(), lm.data(), lv.data(), b, e - b, table);
      std::copy(lp.begin(), lp.end(), sharded.p.begin() + b);
    }
    EXPECT_EQ(sharded.p, whole.p) << parts << " partitions";
  }
}

TEST(AdamW, ResultDoesNotDependOnThreads) {
  const int64_t n = 200000;  // above the parallel threshold
  std::vector<float> p0(n), g(n);
  for (int64_t i = 0; i < n; ++i) {
    p0[i] = 0.001f * static_cast<float>(i % 977);
    g[i] = 0.01f * static_cast<float>((i * 31) % 101) - 0.5f;
  }
  AdamWConfig c;
  State one(p0), many(p0);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  step(one, c, 1, 1e-3, g, true);
  omp_set_num_threads(4);
  step(many, c, 1, 1e-3, g, true);
  omp_set_num_threads(saved);
  EXPECT_EQ(one.p, many.p);
}

TEST(AdamW, RejectsBadArguments) {
  AdamWConfig c;
  try {
    adamw_step_scalars(c, 0, 1e-3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "AdamW: step count must be at least 1, got 0");
  }
  c.beta2 = 1.0;
  try {
    adamw_step_scalars(c, 1, 1e-3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "AdamW: beta2 = 1 is out of range (0 <= beta2 < 1)");
  }
  c = AdamWConfig{};
  const AdamWStep s = adamw_step_scalars(c, 1, 1e-3);
  float x = 0;
  const std::vector<DecayRange> unsorted = {{10, 5, true}, {0, 5, true}};
  EXPECT_THROW(adamw_update_partition(s, &x, &x, &x, &x, 0, 0, unsorted), Error);
}

}  // namespace
}  // namespace ds::rt::optim
