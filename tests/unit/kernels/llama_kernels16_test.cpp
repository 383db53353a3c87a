// The Llama kernels at 16-bit storage (bf16, fp16) against their fp32 twins, as kernels16_test.cpp
// holds GPT-2's: inputs rounded to the storage type first, so both paths see the same values; the
// 16-bit kernel computes in fp32 and rounds each output once, so the two agree within about one
// rounding of the storage type (sixteen.h). Statistics (RMSNorm's rstd, attention's lse) come out
// bit-identical, and fp32 parameter gradients under 16-bit storage equal the fp32 kernel's.
// Also: the TypedPtr wrappers of the op list (kernels/typed.h) run the same template and refuse a
// combination that is not instantiated.
#include <gtest/gtest.h>
#include <omp.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "core/dtype.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/kernels.h"
#include "kernels/typed.h"
#include "unit/kernels/grad_check.h"
#include "unit/kernels/sixteen.h"

using namespace ds::rt;
using namespace ds::rt::cpu;
using ds::test::randn;
using namespace ds::test::sixteen;

namespace {
template <typename S>
struct LlamaKernels16 : ::testing::Test {
  void SetUp() override { omp_set_num_threads(2); }
};
using StorageTypes = ::testing::Types<bf16, f16>;
TYPED_TEST_SUITE(LlamaKernels16, StorageTypes);
}  // namespace

TYPED_TEST(LlamaKernels16, RmsNormForwardAndBackward) {
  using S = TypeParam;
  const int N = 500, C = 72;  // N * C past the parallel threshold
  const float eps = 1e-5f;
  auto x = randn(N * C, 1, 2.0f), w = randn(C, 2), dy = randn(N * C, 3);
  round16<S>(x), round16<S>(w), round16<S>(dy);
  const auto x16 = to16<S>(x), w16 = to16<S>(w), dy16 = to16<S>(dy);
  std::vector<float> out(N * C), rstd(N), r16(N);
  std::vector<S> out16(out.size());
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  rmsnorm_forward(out16.data(), r16.data(), x16.data(), w16.data(), N, C, eps);
  expect_close<S>("rmsnorm out", out, tof(out16));
  EXPECT_EQ(rstd, r16);  // fp32 statistics from the same values
  // dinp accumulates onto 0.25 (one rounding of the sum); dweight onto 0 with 16-bit gradients.
  std::vector<float> dx(x.size(), 0.25f), dw(C, 0.0f);
  rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
  std::vector<S> dx16(x.size(), from_f32<S>(0.25f)), dw16(C, from_f32<S>(0.0f));
  rmsnorm_backward(dx16.data(), dw16.data(), dy16.data(), x16.data(), w16.data(), rstd.data(), N, C);
  expect_close<S>("rmsnorm dinp", dx, tof(dx16));
  expect_close<S>("rmsnorm dweight (16-bit)", dw, tof(dw16));
  std::vector<float> gw(C, 0.0f);
  std::vector<S> dx16b(x.size(), from_f32<S>(0.25f));
  rmsnorm_backward(dx16b.data(), gw.data(), dy16.data(), x16.data(), w16.data(), rstd.data(), N, C);
  EXPECT_EQ(gw, dw);  // fp32 parameter gradients: the same sums, exact
}

TYPED_TEST(LlamaKernels16, RopeForwardAndBackward) {
  using S = TypeParam;
  const int B = 2, T = 9, heads = 3, hd = 8, stride = 30, offset = 4;  // heads inside wider rows
  std::vector<float> cs(T * hd / 2), sn(T * hd / 2);
  rope_tables(cs.data(), sn.data(), T, hd, 10000.0);
  auto x = randn(B * T * stride, 4);
  round16<S>(x);
  auto y = x;
  auto y16 = to16<S>(x);
  rope_forward(y.data(), cs.data(), sn.data(), B, T, heads, hd, stride, offset);
  rope_forward(y16.data(), cs.data(), sn.data(), B, T, heads, hd, stride, offset);
  expect_close<S>("rope forward", y, tof(y16));
  for (int r = 0; r < B * T; r++) {  // columns outside the heads untouched, bit for bit
    for (int c = 0; c < offset; c++) EXPECT_EQ(y16[r * stride + c].bits, from_f32<S>(x[r * stride + c]).bits);
  }
  auto d = tof(y16);  // the same start for both
  auto d16 = y16;
  rope_backward(d.data(), cs.data(), sn.data(), B, T, heads, hd, stride, offset);
  rope_backward(d16.data(), cs.data(), sn.data(), B, T, heads, hd, stride, offset);
  expect_close<S>("rope backward", d, tof(d16));
}

TYPED_TEST(LlamaKernels16, SwiGluForwardAndBackward) {
  using S = TypeParam;
  const int N = 40, I = 1000;  // N * I past the parallel threshold
  auto gu = randn(N * 2 * I, 6, 2.0f), dy = randn(N * I, 7);
  round16<S>(gu), round16<S>(dy);
  const auto gu16 = to16<S>(gu), dy16 = to16<S>(dy);
  std::vector<float> out(N * I), dgu(gu.size());
  std::vector<S> out16(out.size()), dgu16(gu.size());
  swiglu_forward(out.data(), gu.data(), N, I);
  swiglu_forward(out16.data(), gu16.data(), N, I);
  expect_close<S>("swiglu out", out, tof(out16));
  swiglu_backward(dgu.data(), dy.data(), gu.data(), N, I);
  swiglu_backward(dgu16.data(), dy16.data(), gu16.data(), N, I);
  expect_close<S>("swiglu dgu", dgu, tof(dgu16));
}

TYPED_TEST(LlamaKernels16, GroupedQueryAttentionForwardAndBackward) {
  using S = TypeParam;
  // The fp32-compute path at bf16 too (the bf16 dot-product path: attention_bf16_dot_test.cpp).
  bf16_dot::set_enabled(false);
  struct Restore {
    ~Restore() { bf16_dot::set_enabled(true); }
  } restore;
  struct Case {
    int B, T, NH, KV, hd;
  };
  // Multi-head, grouped and multi-query; T = 70 crosses a 64-row block.
  for (const Case c : {Case{2, 7, 4, 4, 8}, Case{2, 9, 4, 2, 8}, Case{1, 70, 4, 1, 4}, Case{2, 70, 6, 2, 8}}) {
    const std::string what = "KV=" + std::to_string(c.KV) + " T=" + std::to_string(c.T);
    const int st = (c.NH + 2 * c.KV) * c.hd, os = c.NH * c.hd;
    auto qkv = randn(static_cast<size_t>(c.B) * c.T * st, 8), dy = randn(static_cast<size_t>(c.B) * c.T * os, 9);
    round16<S>(qkv), round16<S>(dy);
    const auto qkv16 = to16<S>(qkv), dy16 = to16<S>(dy);
    std::vector<float> out(dy.size()), lse(static_cast<size_t>(c.B) * c.NH * c.T), lse16(lse.size());
    std::vector<float> scratch(attention_scratch_floats(c.T)), scratch16(attention_scratch_floats(c.T, c.hd, 2));
    EXPECT_EQ(scratch16.size(), scratch.size() + 2u * 8 * c.T * c.hd);  // two threads
    std::vector<S> out16(out.size());
    attention_gqa_forward(out.data(), lse.data(), qkv.data(), scratch.data(), c.B, c.T, c.NH, c.KV, c.hd);
    attention_gqa_forward(out16.data(), lse16.data(), qkv16.data(), scratch16.data(), c.B, c.T, c.NH, c.KV, c.hd);
    expect_close<S>(("gqa out " + what).c_str(), out, tof(out16));
    EXPECT_EQ(lse, lse16) << what;  // fp32 from the same values
    // Backward from the same (rounded) output in both; dk and dv sum the group in fp32.
    const auto outr = tof(out16);
    std::vector<float> dqkv(qkv.size());
    std::vector<S> dqkv16(qkv.size());
    attention_gqa_backward(dqkv.data(), dy.data(), qkv.data(), outr.data(), lse.data(), scratch.data(), c.B, c.T,
                           c.NH, c.KV, c.hd);
    attention_gqa_backward(dqkv16.data(), dy16.data(), qkv16.data(), out16.data(), lse16.data(), scratch16.data(),
                           c.B, c.T, c.NH, c.KV, c.hd);
    expect_close<S>(("gqa dqkv " + what).c_str(), dqkv, tof(dqkv16));
  }
}

TYPED_TEST(LlamaKernels16, TypedDispatchRunsTheTemplateAndRefusesMixedTypes) {
  using S = TypeParam;
  constexpr DType kS = dtype_of<S>;
  const int N = 3, C = 16;
  auto x = randn(N * C, 1), w = randn(C, 2), dy = randn(N * C, 3);
  auto x16 = to16<S>(x), w16 = to16<S>(w), dy16 = to16<S>(dy);
  std::vector<S> o1(N * C), o2(N * C), dx1(N * C, from_f32<S>(0.0f)), dx2(N * C, from_f32<S>(0.0f));
  std::vector<float> r1(N), r2(N), g1(C, 0.0f), g2(C, 0.0f);
  rmsnorm_forward(o1.data(), r1.data(), x16.data(), w16.data(), N, C, 1e-5f);
  kern::typed::rmsnorm_forward(TypedPtr(o2.data(), kS), r2.data(), TypedPtr(x16.data(), kS),
                               TypedPtr(w16.data(), kS), N, C, 1e-5f);
  for (int i = 0; i < N * C; i++) EXPECT_EQ(o1[i].bits, o2[i].bits);
  rmsnorm_backward(dx1.data(), g1.data(), dy16.data(), x16.data(), w16.data(), r1.data(), N, C);
  kern::typed::rmsnorm_backward(TypedPtr(dx2.data(), kS), TypedPtr(g2.data()), TypedPtr(dy16.data(), kS),
                                TypedPtr(x16.data(), kS), TypedPtr(w16.data(), kS), r1.data(), N, C);  // fp32 grads
  EXPECT_EQ(g1, g2);
  // bf16 storage with fp16 gradients (or the reverse) is not a combination.
  constexpr DType kOther = kS == DType::kBF16 ? DType::kF16 : DType::kBF16;
  std::vector<uint16_t> other(C);
  EXPECT_THROW(kern::typed::rmsnorm_backward(TypedPtr(dx2.data(), kS), TypedPtr(other.data(), kOther),
                                             TypedPtr(dy16.data(), kS), TypedPtr(x16.data(), kS),
                                             TypedPtr(w16.data(), kS), r1.data(), N, C),
               ds::Error);
  // The kernel and the buffers' types are named.
  try {
    kern::typed::swiglu_forward(TypedPtr(o2.data(), kS), TypedPtr(x.data()), 1, 8);
    ADD_FAILURE() << "an fp32 input under 16-bit storage was accepted";
  } catch (const ds::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("swiglu_forward"), std::string::npos) << m;
    EXPECT_NE(m.find(std::string(dtype_name(kS)) + ", " + dtype_name(DType::kF32)), std::string::npos) << m;
  }
}
