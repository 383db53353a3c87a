// The fp32-storage matrix products under MatmulMath::kBf16 (CUBLAS_COMPUTE_32F_FAST_16BF: bf16
// tensor-core multiplies, fp32 accumulation) against their CPU twins:
// - on unit-scale random inputs with K up to 768, within 2e-2 of the output's scale (its RMS; an
//   element-wise relative bound means nothing for outputs near zero) plus 2e-2 relative;
// - on inputs that are already bf16-representable, within fp32 accumulation error (1e-4 of the
//   scale): the bf16 conversion is then exact and the products are exact in fp32, so anything
//   more would mean cuBLAS lost precision it should not (or converted C, which stays fp32).
// The GPU tests skip themselves (reported as skipped) without a GPU; the thread-local setting
// itself needs no device and is tested everywhere.
// Not here: the fp32 math (cuda_kernels_test.cpp), bf16-storage gemm_bf16 (ditto).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "gpu/cuda_test_util.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kernels.h"

namespace ds::rt {
namespace {

using test::cu;

using test::close;
using test::DeviceArray;
using test::random_floats;

constexpr double kBf16Math = 2e-2;  // of the output's RMS, and relative
constexpr double kExact = 1e-4;     // bf16-representable inputs: fp32 accumulation only

double rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return v.empty() ? 0.0 : std::sqrt(s / static_cast<double>(v.size()));
}

// |gpu - ref| <= tol * (RMS(ref) + |ref|) element-wise.
::testing::AssertionResult close_to_scale(const std::vector<float>& gpu,
                                          const std::vector<float>& ref, double tol) {
  return close(gpu, ref, tol, tol * rms(ref));
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); i++) {
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return m;
}

// Values a bf16 buffer could hold exactly: the mantissa cut to 8 bits (round to nearest even, as
// core/dtype.h; here any rounding will do, the values only need to be representable).
std::vector<float> bf16_representable(std::vector<float> v) {
  std::vector<uint16_t> h(v.size());
  cpu::convert_f32_to_bf16(h.data(), v.data(), static_cast<int64_t>(v.size()));
  cpu::convert_bf16_to_f32(v.data(), h.data(), static_cast<int64_t>(v.size()));
  return v;
}

TEST(MatmulMath, DefaultIsFp32PerThreadAndScopedRestores) {
  EXPECT_EQ(cu().matmul_math(), cuda::MatmulMath::kFp32);
  {
    kern::ScopedCudaMatmulMath bf16(cuda::MatmulMath::kBf16);
    EXPECT_EQ(cu().matmul_math(), cuda::MatmulMath::kBf16);
    cuda::MatmulMath other = cuda::MatmulMath::kBf16;
    std::thread([&] { other = cu().matmul_math(); }).join();
    EXPECT_EQ(other, cuda::MatmulMath::kFp32) << "another thread must keep its own default";
    {
      kern::ScopedCudaMatmulMath fp32(cuda::MatmulMath::kFp32);
      EXPECT_EQ(cu().matmul_math(), cuda::MatmulMath::kFp32);
    }
    EXPECT_EQ(cu().matmul_math(), cuda::MatmulMath::kBf16);
  }
  EXPECT_EQ(cu().matmul_math(), cuda::MatmulMath::kFp32);
}

class CudaBf16Math : public test::CudaStreamTest {};

TEST_F(CudaBf16Math, GemmEveryTransposeAgainstTheCpu) {
  const int M = 64, N = 96, K = 768;
  for (int ta = 0; ta < 2; ta++) {
    for (int tb = 0; tb < 2; tb++) {
      SCOPED_TRACE(testing::Message() << "trans_a " << ta << " trans_b " << tb);
      const auto A = random_floats(size_t{M} * K, 1), B = random_floats(size_t{K} * N, 2);
      const auto C0 = random_floats(size_t{M} * N, 3);
      const int lda = ta ? M : K, ldb = tb ? K : N;
      auto ref = C0;
      cpu::gemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 2.0f, ref.data(), N);
      DeviceArray<float> dA(A), dB(B), dC(C0), dC32(C0);
      {
        kern::ScopedCudaMatmulMath bf16(cuda::MatmulMath::kBf16);
        cu().gemm(ta, tb, M, N, K, 0.5f, dA.get(), lda, dB.get(), ldb, 2.0f, dC.get(), N, stream_);
      }
      cu().gemm(ta, tb, M, N, K, 0.5f, dA.get(), lda, dB.get(), ldb, 2.0f, dC32.get(), N, stream_);
      const auto got = dC.download(), got32 = dC32.download();
      EXPECT_TRUE(close_to_scale(got, ref, kBf16Math));
      EXPECT_TRUE(close(got32, ref, 1e-4, 1e-5));  // the fp32 math is back after the scope
      // Not asserted (cuBLAS may keep fp32 for some shapes), but shown: how far bf16 moved it.
      std::printf("  bf16 math vs fp32 math: max |diff| %.3g (output RMS %.3g)\n",
                  max_abs_diff(got, got32), rms(ref));
    }
  }
}

TEST_F(CudaBf16Math, GemmOnBf16RepresentableInputsIsExactUpToFp32Sums) {
  const int M = 48, N = 80, K = 768;
  const auto A = bf16_representable(random_floats(size_t{M} * K, 4));
  const auto B = bf16_representable(random_floats(size_t{N} * K, 5));
  const auto C0 = random_floats(size_t{M} * N, 6);  // NOT bf16-representable: C stays fp32
  auto ref = C0;
  cpu::gemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 1.0f, ref.data(), N);
  DeviceArray<float> dA(A), dB(B), dC(C0);
  kern::ScopedCudaMatmulMath bf16(cuda::MatmulMath::kBf16);
  cu().gemm(false, true, M, N, K, 1.0f, dA.get(), K, dB.get(), K, 1.0f, dC.get(), N, stream_);
  EXPECT_TRUE(close_to_scale(dC.download(), ref, kExact));
}

// matmul_forward with an aligned bias (cuBLASLt epilogue), a misaligned bias (the gemm fallback +
// add_bias) and none, then matmul_backward (dinp over K = OC, dweight accumulating over K = B*T).
TEST_F(CudaBf16Math, MatmulForwardBackwardAgainstTheCpu) {
  const int B = 2, T = 64, C = 768, OC = 256;
  const auto inp = random_floats(size_t{B} * T * C, 11), w = random_floats(size_t{OC} * C, 12);
  const auto bias = random_floats(OC + 1, 13), dout = random_floats(size_t{B} * T * OC, 14);
  kern::ScopedCudaMatmulMath bf16(cuda::MatmulMath::kBf16);
  for (int bias_case = 0; bias_case < 3; bias_case++) {  // 0 aligned, 1 misaligned, 2 none
    SCOPED_TRACE(testing::Message() << "bias case " << bias_case);
    const float* hb = bias_case == 2 ? nullptr : bias.data() + bias_case;
    std::vector<float> ref(size_t{B} * T * OC);
    cpu::matmul_forward(ref.data(), inp.data(), w.data(), hb, B, T, C, OC);
    DeviceArray<float> di(inp), dw(w), dbias(bias), out(ref.size());
    const float* db = bias_case == 2 ? nullptr : dbias.get() + bias_case;
    cu().f32.matmul_forward(out.get(), di.get(), dw.get(), db, B, T, C, OC, stream_);
    EXPECT_TRUE(close_to_scale(out.download(), ref, kBf16Math));
  }
  auto dw_ref = random_floats(size_t{OC} * C, 15), db_ref = random_floats(OC, 16);
  DeviceArray<float> di(inp), dw(w), ddout(dout), gdinp(inp.size()), gdw(dw_ref), gdb(db_ref);
  cu().f32.matmul_backward(gdinp.get(), gdw.get(), gdb.get(), ddout.get(), di.get(), dw.get(), B, T, C,
                        OC, stream_);
  std::vector<float> dinp_ref(inp.size());
  cpu::matmul_backward(dinp_ref.data(), dw_ref.data(), db_ref.data(), dout.data(), inp.data(),
                       w.data(), B, T, C, OC);
  EXPECT_TRUE(close_to_scale(gdinp.download(), dinp_ref, kBf16Math));
  EXPECT_TRUE(close_to_scale(gdw.download(), dw_ref, kBf16Math));
  EXPECT_TRUE(close(gdb.download(), db_ref, 1e-4, 1e-5));  // the column sum has no matmul
}

// Views into flat parameter/activation buffers are only 4-byte aligned: the bf16 math must give
// the same answer there (cuBLASLt told the real alignment, or the GemmEx fallback).
TEST_F(CudaBf16Math, MatmulOnMisalignedViews) {
  const int B = 1, T = 19, C = 72, OC = 40;
  const auto inp = random_floats(size_t{B} * T * C + 1, 21);
  const auto w = random_floats(size_t{OC} * C + 1, 22), bias = random_floats(OC + 4, 23);
  const auto dout = random_floats(size_t{B} * T * OC + 1, 24);
  std::vector<float> ref(size_t{B} * T * OC);
  cpu::matmul_forward(ref.data(), inp.data() + 1, w.data() + 1, bias.data() + 4, B, T, C, OC);
  auto dw_ref = random_floats(size_t{OC} * C + 1, 25);
  std::vector<float> dinp_ref(size_t{B} * T * C);
  DeviceArray<float> di(inp), dw(w), dbias(bias), ddout(dout), out(ref.size() + 1),
      gdinp(dinp_ref.size() + 1), gdw(dw_ref);
  cpu::matmul_backward(dinp_ref.data(), dw_ref.data() + 1, nullptr, dout.data() + 1, inp.data() + 1,
                       w.data() + 1, B, T, C, OC);
  kern::ScopedCudaMatmulMath bf16(cuda::MatmulMath::kBf16);
  // The bias at a 16-byte offset: the cuBLASLt epilogue with 4-byte aligned matrices.
  cu().f32.matmul_forward(out.get() + 1, di.get() + 1, dw.get() + 1, dbias.get() + 4, B, T, C, OC,
                       stream_);
  auto got = out.download();
  EXPECT_TRUE(close_to_scale(std::vector<float>(got.begin() + 1, got.end()), ref, kBf16Math));
  cu().f32.matmul_backward(gdinp.get() + 1, gdw.get() + 1, nullptr, ddout.get() + 1, di.get() + 1,
                        dw.get() + 1, B, T, C, OC, stream_);
  got = gdinp.download();
  EXPECT_TRUE(close_to_scale(std::vector<float>(got.begin() + 1, got.end()), dinp_ref, kBf16Math));
  got = gdw.download();
  EXPECT_TRUE(close_to_scale(std::vector<float>(got.begin() + 1, got.end()),
                             std::vector<float>(dw_ref.begin() + 1, dw_ref.end()), kBf16Math));
}

}  // namespace
}  // namespace ds::rt
