// The bf16 dot-product path (kernels/cpu/bf16_dot.h, attention_bf16.cpp): its GEMM against a
// double-precision product of the same bf16 operands, and the bf16 attention against the
// fp32-compute 16-bit path on the same bf16 inputs. Skipped on processors without AVX512-BF16.
//
// Tolerances. The GEMM's products are exact and its sums fp32: |err| <= K * 2^-24 * sum |a b|.
// The attention rounds P and dS to bf16 where they enter a product (as autocast does), so an
// output differs from the fp32-compute path's by up to about eps/2 * sum_j |p_j| |v_j| per
// element (eps = 2^-8), with signs that mostly cancel: the test bounds the relative error in the
// 2-norm by eps and each element by 2 eps times the largest |output|.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/half.h"
#include "core/dtype.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/kernels.h"
#include "unit/kernels/grad_check.h"
#include "unit/kernels/sixteen.h"

using namespace ds::rt;
using namespace ds::rt::cpu;
using ds::test::randn;
using namespace ds::test::sixteen;

namespace {

struct Bf16Dot : ::testing::Test {
  void SetUp() override {
    omp_set_num_threads(2);
    if (!bf16_dot::available()) GTEST_SKIP() << "this processor has no AVX512-BF16";
  }
  void TearDown() override { bf16_dot::set_enabled(true); }
};

std::vector<uint16_t> bits_of(const std::vector<float>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); i++) b[i] = ds::f32_to_bf16(x[i]);
  return b;
}

// C = alpha A B + beta C0 through the packed operands, against double sums of the same values.
TEST_F(Bf16Dot, GemmMatchesADoubleProductOfTheSameOperands) {
  for (auto [M, N, K] : {std::tuple{1, 1, 2}, std::tuple{8, 32, 64}, std::tuple{13, 45, 38}, std::tuple{70, 17, 128}}) {
    auto a = randn(static_cast<size_t>(M) * K, 1), b = randn(static_cast<size_t>(K) * N, 2);
    round16<bf16>(a), round16<bf16>(b);
    const auto c0 = randn(static_cast<size_t>(M) * N, 3);
    const auto ab = bits_of(a), bb = bits_of(b);
    // B (K x N row-major) with rows paired; A read row-major (its own pair words), and A^T's
    // pairs: A given as At (K x M) with rows paired, read with sam 1.
    std::vector<uint32_t> Bw(static_cast<size_t>(K / 2) * N), Aw(static_cast<size_t>(M) * K / 2);
    bf16_dot::pairs_from_rows(Bw.data(), N, bb.data(), N, K, N);
    std::memcpy(Aw.data(), ab.data(), ab.size() * 2);
    std::vector<uint16_t> at(static_cast<size_t>(K) * M);
    for (int m = 0; m < M; m++) {
      for (int k = 0; k < K; k++) at[static_cast<size_t>(k) * M + m] = ab[static_cast<size_t>(m) * K + k];
    }
    std::vector<uint32_t> Atw(static_cast<size_t>(K / 2) * M);
    bf16_dot::pairs_from_rows(Atw.data(), M, at.data(), M, K, M);
    // B^T given (N x K row-major), transposed into B's words.
    std::vector<uint16_t> bt(static_cast<size_t>(N) * K);
    for (int k = 0; k < K; k++) {
      for (int n = 0; n < N; n++) bt[static_cast<size_t>(n) * K + k] = bb[static_cast<size_t>(k) * N + n];
    }
    std::vector<uint32_t> Btw(static_cast<size_t>(K / 2) * N);
    bf16_dot::pairs_transposed(Btw.data(), N, bt.data(), K, N, K);
    EXPECT_EQ(Btw, Bw);
    for (float beta : {0.0f, 0.5f}) {
      std::vector<float> c1 = c0, c2 = c0;
      bf16_dot::gemm(M, N, K / 2, Aw.data(), K / 2, 1, Bw.data(), N, 0.75f, beta, c1.data(), N);
      bf16_dot::gemm(M, N, K / 2, Atw.data(), 1, M, Btw.data(), N, 0.75f, beta, c2.data(), N);
      for (int m = 0; m < M; m++) {
        for (int n = 0; n < N; n++) {
          double s = 0, mag = 0;
          for (int k = 0; k < K; k++) {
            const double p = double{a[static_cast<size_t>(m) * K + k]} * b[static_cast<size_t>(k) * N + n];
            s += p;
            mag += std::fabs(p);
          }
          const size_t i = static_cast<size_t>(m) * N + n;
          const double want = 0.75 * s + beta * double{c0[i]};
          const double tol = (K + 2) * 6e-8 * (0.75 * mag + std::fabs(beta * c0[i])) + 1e-30;
          ASSERT_NEAR(c1[i], want, tol) << M << "x" << N << "x" << K << " beta " << beta << " at " << m << "," << n;
          ASSERT_NEAR(c2[i], want, tol) << "(A^T pairs) " << M << "x" << N << "x" << K << " at " << m << "," << n;
        }
      }
    }
  }
}

TEST_F(Bf16Dot, InPlacePairsAndRoundingMatchTheScalarRounding) {
  const int rows = 6, cols = 37, ld = 40;
  auto x = randn(static_cast<size_t>(rows) * ld, 4);
  const auto want = bits_of(x);
  auto y = x;
  bf16_dot::pairs_from_rows_f32_inplace(y.data(), ld, 0, rows, cols);
  for (int kp = 0; kp < rows / 2; kp++) {
    for (int c = 0; c < cols; c++) {
      uint32_t w;
      std::memcpy(&w, y.data() + static_cast<size_t>(kp) * ld + c, 4);
      ASSERT_EQ(w & 0xffffu, want[static_cast<size_t>(2 * kp) * ld + c]) << kp << "," << c;
      ASSERT_EQ(w >> 16, want[static_cast<size_t>(2 * kp + 1) * ld + c]) << kp << "," << c;
    }
  }
  auto z = x;
  bf16_dot::round_row(reinterpret_cast<uint16_t*>(z.data()), z.data(), 37);
  for (int j = 0; j < 37; j++) {
    uint16_t h;
    std::memcpy(&h, reinterpret_cast<const char*>(z.data()) + 2 * j, 2);
    ASSERT_EQ(h, want[j]) << j;
  }
}

// got vs want: ||got - want|| / ||want|| <= eps and every |got - want| <= 2 eps max |want|.
void expect_near_in_norm(const char* what, const std::vector<float>& want, const std::vector<float>& got) {
  ASSERT_EQ(want.size(), got.size());
  double num = 0, den = 0, mx = 0;
  for (size_t i = 0; i < want.size(); i++) {
    num += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
    den += double{want[i]} * want[i];
    mx = std::max(mx, std::fabs(double{want[i]}));
  }
  EXPECT_LE(std::sqrt(num / den), kEps<bf16>) << what;
  int bad = 0;
  for (size_t i = 0; i < want.size() && bad < 5; i++) {
    if (!(std::fabs(double{got[i]} - want[i]) <= 2 * kEps<bf16> * mx)) {
      ADD_FAILURE() << what << "[" << i << "]: dot path " << got[i] << " fp32-compute path " << want[i];
      bad++;
    }
  }
}

TEST_F(Bf16Dot, AttentionMatchesTheFp32ComputePath) {
  for (auto [B, T, C, NH] : {std::tuple{2, 128, 256, 4}, std::tuple{1, 96, 96, 3}, std::tuple{1, 70, 12, 3}}) {
    SCOPED_TRACE(testing::Message() << "B " << B << " T " << T << " C " << C << " NH " << NH);
    const int hs = C / NH;
    auto qkv = randn(static_cast<size_t>(B) * T * 3 * C, 5), dy = randn(static_cast<size_t>(B) * T * C, 6);
    const auto qkv16 = to16<bf16>(qkv), dy16 = to16<bf16>(dy);
    std::vector<float> scratch(attention_scratch_floats(T, hs, 2));
    std::vector<float> lse_ref(B * NH * T), lse(B * NH * T);
    std::vector<bf16> out_ref(static_cast<size_t>(B) * T * C), out(out_ref.size());
    bf16_dot::set_enabled(false);
    attention_forward(out_ref.data(), lse_ref.data(), qkv16.data(), scratch.data(), B, T, C, NH);
    bf16_dot::set_enabled(true);
    attention_forward(out.data(), lse.data(), qkv16.data(), scratch.data(), B, T, C, NH);
    expect_near_in_norm("attention out", tof(out_ref), tof(out));
    for (size_t i = 0; i < lse.size(); i++) ASSERT_NEAR(lse[i], lse_ref[i], 1e-5 * (1 + std::fabs(lse_ref[i]))) << i;
    // Backward from the same forward results in both paths.
    std::vector<bf16> dqkv_ref(qkv16.size()), dqkv(qkv16.size());
    bf16_dot::set_enabled(false);
    attention_backward(dqkv_ref.data(), dy16.data(), qkv16.data(), out.data(), lse.data(), scratch.data(), B, T, C,
                       NH);
    bf16_dot::set_enabled(true);
    attention_backward(dqkv.data(), dy16.data(), qkv16.data(), out.data(), lse.data(), scratch.data(), B, T, C, NH);
    expect_near_in_norm("attention dqkv", tof(dqkv_ref), tof(dqkv));
  }
  // The run's kernel line names the path the last bf16 attention took.
  EXPECT_NE(kernel_report().find("bf16 attention: avx512_bf16 dot products"), std::string::npos) << kernel_report();
  bf16_dot::set_enabled(false);
  std::vector<bf16> qkv(64 * 3 * 8, from_f32<bf16>(0.5f)), out(64 * 8);
  std::vector<float> lse(64), scratch(attention_scratch_floats(64, 8, 2));
  attention_forward(out.data(), lse.data(), qkv.data(), scratch.data(), 1, 64, 8, 1);
  EXPECT_NE(kernel_report().find("bf16 attention: fp32 compute"), std::string::npos) << kernel_report();
}

// Grouped-query attention (Llama): the same comparison, the group's dK and dV summed in fp32.
TEST_F(Bf16Dot, GroupedQueryAttentionMatchesTheFp32ComputePath) {
  struct Case {
    int B, T, NH, KV, hd;
  };
  for (const Case c : {Case{2, 128, 4, 2, 64}, Case{1, 70, 6, 2, 8}, Case{2, 96, 4, 1, 32}}) {
    SCOPED_TRACE(testing::Message() << "B " << c.B << " T " << c.T << " NH " << c.NH << " KV " << c.KV);
    const int st = (c.NH + 2 * c.KV) * c.hd, os = c.NH * c.hd;
    auto qkv = randn(static_cast<size_t>(c.B) * c.T * st, 7), dy = randn(static_cast<size_t>(c.B) * c.T * os, 8);
    const auto qkv16 = to16<bf16>(qkv), dy16 = to16<bf16>(dy);
    std::vector<float> scratch(attention_scratch_floats(c.T, c.hd, 2));
    std::vector<float> lse_ref(static_cast<size_t>(c.B) * c.NH * c.T), lse(lse_ref.size());
    std::vector<bf16> out_ref(dy16.size()), out(dy16.size());
    bf16_dot::set_enabled(false);
    attention_gqa_forward(out_ref.data(), lse_ref.data(), qkv16.data(), scratch.data(), c.B, c.T, c.NH, c.KV, c.hd);
    bf16_dot::set_enabled(true);
    attention_gqa_forward(out.data(), lse.data(), qkv16.data(), scratch.data(), c.B, c.T, c.NH, c.KV, c.hd);
    expect_near_in_norm("gqa out", tof(out_ref), tof(out));
    for (size_t i = 0; i < lse.size(); i++) ASSERT_NEAR(lse[i], lse_ref[i], 1e-5 * (1 + std::fabs(lse_ref[i]))) << i;
    std::vector<bf16> dqkv_ref(qkv16.size()), dqkv(qkv16.size());
    bf16_dot::set_enabled(false);
    attention_gqa_backward(dqkv_ref.data(), dy16.data(), qkv16.data(), out.data(), lse.data(), scratch.data(), c.B,
                           c.T, c.NH, c.KV, c.hd);
    bf16_dot::set_enabled(true);
    attention_gqa_backward(dqkv.data(), dy16.data(), qkv16.data(), out.data(), lse.data(), scratch.data(), c.B, c.T,
                           c.NH, c.KV, c.hd);
    expect_near_in_norm("gqa dqkv", tof(dqkv_ref), tof(dqkv));
  }
}

}  // namespace
