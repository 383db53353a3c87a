// Llama's CPU kernels: RMSNorm, RoPE, SwiGLU and grouped-query attention. Every backward against
// central finite differences of L = sum(out * R) (grad_check.h), every forward against a naive
// double-precision reference; attention's against plain attention with k and v expanded to NH
// heads, for multi-head (KV = NH), grouped (KV = 2) and multi-query (KV = 1), with T past one
// 64-row block.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "unit/kernels/grad_check.h"

using namespace ds::rt::cpu;
using ds::test::check_grad;
using ds::test::dot;
using ds::test::randn;

namespace {
struct LlamaKernels : ::testing::Test {
  void SetUp() override { omp_set_num_threads(2); }
};
}  // namespace

TEST_F(LlamaKernels, RmsNormForwardAndBackward) {
  const int N = 5, C = 37;
  const float eps = 1e-5f;
  auto x = randn(N * C, 1), w = randn(C, 2), R = randn(N * C, 3);
  std::vector<float> out(N * C), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  for (int n = 0; n < N; n++) {
    double ss = 0;
    for (int c = 0; c < C; c++) ss += double(x[n * C + c]) * x[n * C + c];
    const double r = 1.0 / std::sqrt(ss / C + eps);
    EXPECT_NEAR(rstd[n], r, 1e-5 * r);
    for (int c = 0; c < C; c++) EXPECT_NEAR(out[n * C + c], x[n * C + c] * r * w[c], 1e-5);
  }
  std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f);
  rmsnorm_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
  auto loss = [&] {
    std::vector<float> o(N * C), r(N);
    rmsnorm_forward(o.data(), r.data(), x.data(), w.data(), N, C, eps);
    return dot(o.data(), R);
  };
  check_grad("rmsnorm dx", x, dx, loss);
  check_grad("rmsnorm dw", w, dw, loss);
  // dinp accumulates into what is there (the residual gradient).
  std::vector<float> dx2(N * C, 1.0f), dw2(C, 0.0f);
  rmsnorm_backward(dx2.data(), dw2.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
  for (int i = 0; i < N * C; i++) EXPECT_NEAR(dx2[i], dx[i] + 1.0f, 1e-6);
}

TEST_F(LlamaKernels, RopeRotatesHalvesAndBackwardIsItsTranspose) {
  const int B = 2, T = 5, heads = 3, hd = 8, stride = 30, offset = 4;  // heads inside wider rows
  std::vector<float> cs(T * hd / 2), sn(T * hd / 2);
  rope_tables(cs.data(), sn.data(), T, hd, 10000.0);
  auto x = randn(B * T * stride, 4), R = randn(B * T * stride, 5);
  auto y = x;
  rope_forward(y.data(), cs.data(), sn.data(), B, T, heads, hd, stride, offset);
  for (int r = 0; r < B * T; r++) {
    const int t = r % T;
    for (int c = 0; c < stride; c++) {
      const int rel = c - offset;
      double want = x[r * stride + c];
      if (rel >= 0 && rel < heads * hd) {
        const int i = rel % hd, h2 = hd / 2, base = r * stride + offset + (rel / hd) * hd;
        const int f = i % h2;
        const double a = t * std::pow(10000.0, -2.0 * f / hd);
        want = i < h2 ? x[base + i] * std::cos(a) - x[base + i + h2] * std::sin(a)
                      : x[base + i] * std::cos(a) + x[base + i - h2] * std::sin(a);
      }
      EXPECT_NEAR(y[r * stride + c], want, 1e-5) << r << " " << c;
    }
  }
  // Backward against finite differences, and as the inverse rotation.
  std::vector<float> dx = R;
  rope_backward(dx.data(), cs.data(), sn.data(), B, T, heads, hd, stride, offset);
  auto loss = [&] {
    auto o = x;
    rope_forward(o.data(), cs.data(), sn.data(), B, T, heads, hd, stride, offset);
    return dot(o.data(), R);
  };
  check_grad("rope dx", x, dx, loss);
  rope_backward(y.data(), cs.data(), sn.data(), B, T, heads, hd, stride, offset);
  for (size_t i = 0; i < x.size(); i++) EXPECT_NEAR(y[i], x[i], 1e-5);
}

TEST_F(LlamaKernels, SwiGluForwardAndBackward) {
  const int N = 4, I = 19;
  auto gu = randn(N * 2 * I, 6, 2.0f), R = randn(N * I, 7);
  std::vector<float> out(N * I), dgu(N * 2 * I);
  swiglu_forward(out.data(), gu.data(), N, I);
  for (int n = 0; n < N; n++) {
    for (int i = 0; i < I; i++) {
      const double g = gu[n * 2 * I + i], u = gu[n * 2 * I + I + i];
      EXPECT_NEAR(out[n * I + i], g / (1 + std::exp(-g)) * u, 1e-5 * (1 + std::fabs(g * u)));
    }
  }
  swiglu_backward(dgu.data(), R.data(), gu.data(), N, I);
  auto loss = [&] {
    std::vector<float> o(N * I);
    swiglu_forward(o.data(), gu.data(), N, I);
    return dot(o.data(), R);
  };
  check_grad("swiglu dgu", gu, dgu, loss);
}

namespace {
// Plain causal attention in double with k/v expanded: out (B,T,NH hd).
std::vector<double> naive_gqa(const std::vector<float>& qkv, int B, int T, int NH, int KV, int hd) {
  const int st = (NH + 2 * KV) * hd;
  std::vector<double> out(static_cast<size_t>(B) * T * NH * hd, 0.0);
  const double scale = 1.0 / std::sqrt(double(hd));
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const int g = h / (NH / KV);
      for (int t = 0; t < T; t++) {
        const float* q = &qkv[(b * T + t) * st + h * hd];
        std::vector<double> p(t + 1);
        double mx = -1e300, sum = 0;
        for (int j = 0; j <= t; j++) {
          const float* k = &qkv[(b * T + j) * st + (NH + g) * hd];
          double s = 0;
          for (int d = 0; d < hd; d++) s += double(q[d]) * k[d];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        for (int j = 0; j <= t; j++) sum += (p[j] = std::exp(p[j] - mx));
        for (int j = 0; j <= t; j++) {
          const float* v = &qkv[(b * T + j) * st + (NH + KV + g) * hd];
          for (int d = 0; d < hd; d++) out[((b * T + t) * NH + h) * hd + d] += p[j] / sum * v[d];
        }
      }
    }
  }
  return out;
}
}  // namespace

TEST_F(LlamaKernels, GroupedQueryAttentionMatchesExpandedAttention) {
  struct Case {
    int B, T, NH, KV, hd;
  };
  for (const Case c : {Case{2, 7, 4, 4, 8}, Case{2, 9, 4, 2, 8}, Case{1, 70, 4, 1, 4}, Case{2, 6, 6, 2, 4}}) {
    const int st = (c.NH + 2 * c.KV) * c.hd, os = c.NH * c.hd;
    auto qkv = randn(static_cast<size_t>(c.B) * c.T * st, 8);
    auto R = randn(static_cast<size_t>(c.B) * c.T * os, 9);
    std::vector<float> out(R.size()), lse(static_cast<size_t>(c.B) * c.NH * c.T), dqkv(qkv.size());
    std::vector<float> scratch(attention_scratch_floats(c.T));
    attention_gqa_forward(out.data(), lse.data(), qkv.data(), scratch.data(), c.B, c.T, c.NH, c.KV, c.hd);
    const auto want = naive_gqa(qkv, c.B, c.T, c.NH, c.KV, c.hd);
    for (size_t i = 0; i < out.size(); i++) ASSERT_NEAR(out[i], want[i], 1e-5) << "KV " << c.KV << " i " << i;
    attention_gqa_backward(dqkv.data(), R.data(), qkv.data(), out.data(), lse.data(), scratch.data(), c.B, c.T,
                           c.NH, c.KV, c.hd);
    auto loss = [&] {
      std::vector<float> o(R.size()), l(lse.size());
      attention_gqa_forward(o.data(), l.data(), qkv.data(), scratch.data(), c.B, c.T, c.NH, c.KV, c.hd);
      return dot(o.data(), R);
    };
    check_grad("gqa dqkv KV=" + std::to_string(c.KV), qkv, dqkv, loss, {}, 300);
  }
}

TEST_F(LlamaKernels, GqaWithKvEqualHeadsIsTheGpt2Attention) {
  // With KV == NH the qkv layout is GPT-2's (q | k | v, NH heads each): the two kernels agree.
  const int B = 2, T = 11, NH = 3, hd = 4, C = NH * hd;
  auto qkv = randn(static_cast<size_t>(B) * T * 3 * C, 10), dout = randn(static_cast<size_t>(B) * T * C, 11);
  std::vector<float> o1(B * T * C), o2(B * T * C), l1(B * NH * T), l2(B * NH * T), d1(qkv.size()), d2(qkv.size());
  std::vector<float> scratch(attention_scratch_floats(T));
  attention_forward(o1.data(), l1.data(), qkv.data(), scratch.data(), B, T, C, NH);
  attention_gqa_forward(o2.data(), l2.data(), qkv.data(), scratch.data(), B, T, NH, NH, hd);
  attention_backward(d1.data(), dout.data(), qkv.data(), o1.data(), l1.data(), scratch.data(), B, T, C, NH);
  attention_gqa_backward(d2.data(), dout.data(), qkv.data(), o2.data(), l2.data(), scratch.data(), B, T, NH, NH, hd);
  for (size_t i = 0; i < o1.size(); i++) EXPECT_EQ(o1[i], o2[i]);
  for (size_t i = 0; i < d1.size(); i++) EXPECT_NEAR(d1[i], d2[i], 1e-6);
}
