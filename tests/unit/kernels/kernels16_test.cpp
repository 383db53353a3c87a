// The 16-bit kernels against their fp32 twins, and oneDNN's matmul against a reference GEMM.
// Each 16-bit test rounds its random inputs to the storage type first, so both paths see the
// same values; the fp32 twin then runs on those values in fp32 and the 16-bit kernel on the
// 16-bit buffers. The kernels compute in fp32 and round each output once, so they agree within
// about one rounding of the storage type: |got - want| <= k * eps_S * (|want| + scale), eps_S =
// 2^-8 (bf16) or 2^-11 (fp16), scale = 1% of the largest |want| (cancellation in sums), k = 2
// (4 where two rounded values meet, e.g. a 16-bit gradient accumulated onto a 16-bit gradient).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/onednn.h"
#include "unit/kernels/grad_check.h"
#include "unit/kernels/sixteen.h"

using namespace ds::rt;
using namespace ds::rt::cpu;
using ds::test::randn;
using namespace ds::test::sixteen;

namespace {
template <typename S>
struct Kernels16 : ::testing::Test {
  void SetUp() override { omp_set_num_threads(2); }
};
using StorageTypes = ::testing::Types<bf16, f16>;
TYPED_TEST_SUITE(Kernels16, StorageTypes);
}  // namespace

TYPED_TEST(Kernels16, EncoderForwardAndBackward) {
  using S = TypeParam;
  const int B = 2, T = 40, C = 48, V = 30;
  std::vector<int32_t> inp(B * T);
  for (int i = 0; i < B * T; i++) inp[i] = (i * 7) % V;
  auto wte = randn(V * C, 1), wpe = randn(T * C, 2), dout = randn(B * T * C, 3);
  round16<S>(wte), round16<S>(wpe), round16<S>(dout);
  std::vector<float> out(B * T * C);
  encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
  std::vector<S> out16(out.size());
  encoder_forward(out16.data(), inp.data(), to16<S>(wte).data(), to16<S>(wpe).data(), B, T, C);
  expect_close<S>("encoder out", out, tof(out16));
  std::vector<float> dwte(V * C, 0.5f), dwpe(T * C, 0.5f);
  encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), B, T, C);
  std::vector<float> gwte(V * C, 0.5f), gwpe(T * C, 0.5f);  // fp32 gradients under 16-bit storage
  encoder_backward(gwte.data(), gwpe.data(), to16<S>(dout).data(), inp.data(), B, T, C);
  EXPECT_EQ(gwte, dwte);  // same inputs, fp32 accumulation: exact
  EXPECT_EQ(gwpe, dwpe);
  // 16-bit gradients: each token's += rounds once, so a token seen r times has r roundings of
  // partial sums of up to ~r + 0.5 in magnitude (r <= 3 here): 4 roundings of 4.
  std::vector<S> swte(V * C, from_f32<S>(0.5f));
  encoder_backward(swte.data(), static_cast<S*>(nullptr), to16<S>(dout).data(), inp.data(), B, T, C);
  expect_close<S>("encoder dwte (16-bit)", dwte, tof(swte), 2, 4 * 4 * kEps<S>);
}

TYPED_TEST(Kernels16, LayernormForwardAndBackward) {
  using S = TypeParam;
  const int B = 2, T = 5, C = 72;
  auto x = randn(B * T * C, 1, 2.0f), w = randn(C, 2), b = randn(C, 3), dy = randn(B * T * C, 4);
  round16<S>(x), round16<S>(w), round16<S>(b), round16<S>(dy);
  std::vector<float> out(B * T * C), mean(B * T), rstd(B * T), m16(B * T), r16(B * T);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), B, T, C);
  std::vector<S> out16(out.size());
  const auto x16 = to16<S>(x), w16 = to16<S>(w), b16 = to16<S>(b), dy16 = to16<S>(dy);
  layernorm_forward(out16.data(), m16.data(), r16.data(), x16.data(), w16.data(), b16.data(), B, T, C);
  expect_close<S>("layernorm out", out, tof(out16));
  EXPECT_EQ(mean, m16);  // fp32 statistics from the same values
  EXPECT_EQ(rstd, r16);
  std::vector<float> dx(x.size(), 0.25f), dw(C, 0.0f), db(C, 0.0f);
  layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), B, T,
                     C);
  std::vector<S> dx16(x.size(), from_f32<S>(0.25f)), dw16(C, from_f32<S>(0.0f)), db16(C, from_f32<S>(0.0f));
  layernorm_backward(dx16.data(), dw16.data(), db16.data(), dy16.data(), x16.data(), w16.data(), mean.data(),
                     rstd.data(), B, T, C);
  expect_close<S>("layernorm dinp", dx, tof(dx16));
  expect_close<S>("layernorm dweight", dw, tof(dw16));
  expect_close<S>("layernorm dbias", db, tof(db16));
  std::vector<float> gw(C, 0.0f), gb(C, 0.0f);
  std::vector<S> dx16b(x.size(), from_f32<S>(0.25f));
  layernorm_backward(dx16b.data(), gw.data(), gb.data(), dy16.data(), x16.data(), w16.data(), mean.data(),
                     rstd.data(), B, T, C);
  EXPECT_EQ(gw, dw);  // fp32 parameter gradients: exact
  EXPECT_EQ(gb, db);
}

TYPED_TEST(Kernels16, MatmulForwardAndBackwardAgainstFp32) {
  using S = TypeParam;
  for (auto backend : {onednn::Backend::kOneDnn, onednn::Backend::kOneDnnConvert}) {
    onednn::set_backend(backend);
    const int B = 2, T = 33, C = 64, OC = 96;
    auto x = randn(B * T * C, 1), w = randn(OC * C, 2, 0.3f), bias = randn(OC, 3), dy = randn(B * T * OC, 4);
    round16<S>(x), round16<S>(w), round16<S>(bias), round16<S>(dy);
    const auto x16 = to16<S>(x), w16 = to16<S>(w), b16 = to16<S>(bias), dy16 = to16<S>(dy);
    std::vector<float> out(B * T * OC);
    matmul_forward(out.data(), x.data(), w.data(), bias.data(), B, T, C, OC);
    std::vector<S> out16(out.size());
    matmul_forward(out16.data(), x16.data(), w16.data(), b16.data(), B, T, C, OC);
    expect_close<S>("matmul out", out, tof(out16));
    std::vector<float> dx(x.size()), dw(OC * C, 0.125f), db(OC, 0.125f);
    matmul_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), B, T, C, OC);
    std::vector<S> dx16(x.size()), dw16(OC * C, from_f32<S>(0.125f)), db16(OC, from_f32<S>(0.125f));
    matmul_backward(dx16.data(), dw16.data(), db16.data(), dy16.data(), x16.data(), w16.data(), B, T, C, OC);
    expect_close<S>("matmul dinp", dx, tof(dx16));
    expect_close<S>("matmul dweight (16-bit)", dw, tof(dw16), 4);
    expect_close<S>("matmul dbias (16-bit)", db, tof(db16), 4);
    std::vector<float> gw(OC * C, 0.125f), gb(OC, 0.125f);
    matmul_backward(static_cast<S*>(nullptr), gw.data(), gb.data(), dy16.data(), x16.data(), w16.data(), B, T, C,
                    OC);
    expect_close<S>("matmul dweight (fp32 grads)", dw, gw, 0.01);  // fp32 out: only the sum order differs
    EXPECT_EQ(gb, db);
  }
  onednn::set_backend(onednn::Backend::kOneDnn);
  EXPECT_NE(kernel_report().find(std::is_same_v<S, bf16> ? "bf16 matmul" : "fp16 matmul"), std::string::npos)
      << kernel_report();
}

TYPED_TEST(Kernels16, AttentionForwardAndBackward) {
  using S = TypeParam;
  // The fp32-compute path at bf16 too; the bf16 dot-product path (P and dS rounded to bf16) has
  // its own test against this one (attention_bf16_dot_test.cpp).
  bf16_dot::set_enabled(false);
  struct Restore {
    ~Restore() { bf16_dot::set_enabled(true); }
  } restore;
  for (auto [B, T, C, NH] : {std::tuple{2, 5, 8, 2}, std::tuple{1, 70, 12, 3}}) {
    const int hs = C / NH;
    auto qkv = randn(static_cast<size_t>(B) * T * 3 * C, 1), dy = randn(static_cast<size_t>(B) * T * C, 2);
    round16<S>(qkv), round16<S>(dy);
    std::vector<float> out(B * T * C), lse(B * NH * T), lse16(B * NH * T);
    std::vector<float> scratch(attention_scratch_floats(T)), scratch16(attention_scratch_floats(T, hs, 2));
    EXPECT_EQ(scratch16.size(), scratch.size() + 2u * 8 * T * hs);  // two threads
    attention_forward(out.data(), lse.data(), qkv.data(), scratch.data(), B, T, C, NH);
    const auto qkv16 = to16<S>(qkv), dy16 = to16<S>(dy);
    std::vector<S> out16(out.size());
    attention_forward(out16.data(), lse16.data(), qkv16.data(), scratch16.data(), B, T, C, NH);
    expect_close<S>("attention out", out, tof(out16));
    EXPECT_EQ(lse, lse16);  // fp32 from the same values
    // Backward from the same (rounded) output in both.
    auto outr = tof(out16);
    std::vector<float> dqkv(qkv.size());
    attention_backward(dqkv.data(), dy.data(), qkv.data(), outr.data(), lse.data(), scratch.data(), B, T, C, NH);
    std::vector<S> dqkv16(qkv.size());
    attention_backward(dqkv16.data(), dy16.data(), qkv16.data(), out16.data(), lse16.data(), scratch16.data(), B,
                       T, C, NH);
    expect_close<S>("attention dqkv", dqkv, tof(dqkv16));
  }
}

TYPED_TEST(Kernels16, GeluResidualAndAdd) {
  using S = TypeParam;
  const int64_t N = 70000;  // crosses the chunk and parallel thresholds
  auto x = randn(N, 1, 3.0f), y = randn(N, 2), dy = randn(N, 3);
  round16<S>(x), round16<S>(y), round16<S>(dy);
  const auto x16 = to16<S>(x), y16 = to16<S>(y), dy16 = to16<S>(dy);
  std::vector<float> out(N), dx(N);
  std::vector<S> out16(N), dx16(N);
  gelu_forward(out.data(), x.data(), N);
  gelu_forward(out16.data(), x16.data(), N);
  expect_close<S>("gelu out", out, tof(out16));
  gelu_backward(dx.data(), x.data(), dy.data(), N);
  gelu_backward(dx16.data(), x16.data(), dy16.data(), N);
  expect_close<S>("gelu dinp", dx, tof(dx16));
  residual_forward(out.data(), x.data(), y.data(), N);
  residual_forward(out16.data(), x16.data(), y16.data(), N);
  expect_close<S>("residual out", out, tof(out16));
  auto a = x, b = y;
  auto a16 = x16, b16 = y16;
  residual_backward(a.data(), b.data(), dy.data(), N);
  residual_backward(a16.data(), b16.data(), dy16.data(), N);
  expect_close<S>("residual dinp1", a, tof(a16));
  expect_close<S>("residual dinp2", b, tof(b16));
  a = tof(a16);  // the same start for both
  add_in_place(a.data(), y.data(), N);
  add_in_place(a16.data(), y16.data(), N);
  expect_close<S>("add_in_place", a, tof(a16));
}

TYPED_TEST(Kernels16, CrossEntropyAndVocabParallel) {
  using S = TypeParam;
  const int N = 6, V = 50, Vp = 64;
  auto logits = randn(N * Vp, 1, 2.0f);
  round16<S>(logits);
  std::vector<int32_t> tgt = {0, 49, 3, 3, 7, 1};
  const float dloss = 1.0f / N;
  std::vector<float> l32(N), l16(N);
  const auto lg16 = to16<S>(logits);
  EXPECT_EQ(crossentropy_forward(l32.data(), logits.data(), tgt.data(), N, V, Vp), 0);
  EXPECT_EQ(crossentropy_forward(l16.data(), lg16.data(), tgt.data(), N, V, Vp), 0);
  EXPECT_EQ(l32, l16);  // fp32 loss from the same values
  auto d32 = logits;
  auto d16 = lg16;
  crossentropy_softmax_backward(l32.data(), d32.data(), tgt.data(), dloss, N, V, Vp);
  crossentropy_softmax_backward(l16.data(), d16.data(), tgt.data(), dloss, N, V, Vp);
  expect_close<S>("dlogits", d32, tof(d16));
  // Vocabulary-parallel: one rank holding columns [16, 48) of V = 50.
  const int Vl = 32, v0 = 16;
  std::vector<float> part(N * Vl);
  for (int n = 0; n < N; n++) {
    for (int v = 0; v < Vl; v++) part[n * Vl + v] = logits[n * Vp + v0 + v];
  }
  const auto part16 = to16<S>(part);
  std::vector<float> mx(N), mx16(N), se(N), se16(N), tl(N), tl16(N), ls(N), ls16(N);
  vocab_ce_max(mx.data(), part.data(), N, Vl, v0, V);
  vocab_ce_max(mx16.data(), part16.data(), N, Vl, v0, V);
  EXPECT_EQ(mx, mx16);
  vocab_ce_sums(se.data(), tl.data(), part.data(), mx.data(), tgt.data(), N, Vl, v0, V);
  vocab_ce_sums(se16.data(), tl16.data(), part16.data(), mx.data(), tgt.data(), N, Vl, v0, V);
  EXPECT_EQ(se, se16);
  EXPECT_EQ(tl, tl16);
  auto pd = part;
  auto pd16 = part16;
  vocab_ce_finish(ls.data(), pd.data(), mx.data(), se.data(), tl.data(), tgt.data(), dloss, N, Vl, v0, V);
  vocab_ce_finish(ls16.data(), pd16.data(), mx.data(), se.data(), tl.data(), tgt.data(), dloss, N, Vl, v0, V);
  EXPECT_EQ(ls, ls16);
  expect_close<S>("vocab dlogits", pd, tof(pd16));
}

TYPED_TEST(Kernels16, OptimizerPassesAndConversions) {
  using S = TypeParam;
  const int64_t n = 50000;
  auto g = randn(n, 1, 1e-2f), p = randn(n, 2), m = randn(n, 3, 1e-3f), v = randn(n, 4, 1e-3f);
  for (auto& x : v) x = std::fabs(x);
  round16<S>(g);
  kern::AdamWStep st;
  st.step_size = 1e-3f;
  const kern::DecayRange decay[] = {{0, n / 2, true}};
  auto p32 = p, m32 = m, v32 = v;
  adamw_update_partition(st, p32.data(), g.data(), m32.data(), v32.data(), 0, n, decay);
  auto pm = p, mm = m, vm = v;
  std::vector<S> out(n);
  adamw_update_partition_mixed(st, pm.data(), to16<S>(g).data(), mm.data(), vm.data(), 0, n, decay, out.data());
  EXPECT_EQ(pm, p32);  // the same formula on the same values
  EXPECT_EQ(mm, m32);
  EXPECT_EQ(vm, v32);
  for (int64_t i = 0; i < n; i++) ASSERT_EQ(out[i].bits, from_f32<S>(p32[i]).bits) << i;  // rounded once
  EXPECT_EQ(sum_of_squares(to16<S>(g).data(), n), sum_of_squares(g.data(), n));
  auto g16 = to16<S>(g);
  EXPECT_TRUE(all_finite(g16.data(), n));
  g16[n - 3] = from_f32<S>(INFINITY);
  EXPECT_FALSE(all_finite(g16.data(), n));
  std::vector<float> back(n);
  convert(back.data(), to16<S>(p).data(), n);
  EXPECT_EQ(back, round16<S>(p));
}

// oneDNN's matmul (both backends' types) against a naive double GEMM, for plain and transposed
// operands, with and without the bias and the accumulation.
TEST(OneDnnMatmul, MatchesReferenceGemm) {
  omp_set_num_threads(2);
  for (auto [M, N, K] : {std::tuple{5, 7, 3}, std::tuple{130, 70, 33}, std::tuple{64, 300, 128}}) {
    for (int trans = 0; trans < 4; trans++) {
      const bool ta = trans & 1, tb = trans & 2;
      auto A = randn(static_cast<size_t>(M) * K, 1), B = randn(static_cast<size_t>(K) * N, 2);
      auto bias = randn(N, 3), C0 = randn(static_cast<size_t>(M) * N, 4);
      const onednn::Operand a{A.data(), ta ? 1 : K, ta ? M : 1}, b{B.data(), tb ? 1 : N, tb ? K : 1};
      for (int mode = 0; mode < 2; mode++) {
        auto C = C0;
        onednn::matmul(DType::kF32, a, b, mode ? nullptr : bias.data(), DType::kF32, C.data(), N, M, N, K, mode == 1);
        for (int i = 0; i < M; i++) {
          for (int j = 0; j < N; j++) {
            double s = mode ? C0[i * N + j] : bias[j];
            for (int k = 0; k < K; k++) s += double(A[i * a.stride0 + k * a.stride1]) * B[k * b.stride0 + j * b.stride1];
            ASSERT_NEAR(C[i * N + j], s, 1e-4 * (1 + std::fabs(s))) << M << "x" << N << "x" << K << " t" << trans;
          }
        }
      }
    }
  }
  EXPECT_NE(kernel_report().find("fp32 matmul: "), std::string::npos) << kernel_report();
}
