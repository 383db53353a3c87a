// dtype conversions: known values, round-to-nearest-even ties, overflow, subnormals, NaN, and
// fp16 against the compiler's own _Float16 conversion for many random values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/error.h"
#include "core/dtype.h"
#include "kernels/cpu/kernels.h"

using namespace ds::rt;

TEST(Dtype, Bf16KnownValuesAndTies) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even): rounds up.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(bf16_to_f32(0x3f81), 1.0078125f);
}

TEST(Dtype, Fp16KnownValues) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: 0
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f16_to_f32(0x7c00), INFINITY);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x3555), 0.333251953125f);
}

TEST(Dtype, Fp16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 65536; h++) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
}

#if defined(__FLT16_MAX__)
TEST(Dtype, Fp16AgreesWithCompiler) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 1000000; i++) {
    uint32_t u = bits(rng);
    // Bias towards fp16's range: exponents 2^-30 .. 2^17.
    u = (u & 0x807fffffu) | ((97u + (u >> 23) % 48u) << 23);
    float f;
    std::memcpy(&f, &u, 4);
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t hb;
    std::memcpy(&hb, &h, 2);
    ASSERT_EQ(f32_to_f16(f), hb) << f;
  }
}
#endif

TEST(Dtype, ArrayConversionsAndNames) {
  std::vector<float> x = {1.0f, -0.5f, 3.14159f, 65504.0f};
  std::vector<uint16_t> h(4);
  std::vector<float> y(4);
  cpu::convert_f32_to_bf16(h.data(), x.data(), 4);
  cpu::convert_bf16_to_f32(y.data(), h.data(), 4);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_NEAR(y[2], 3.14159f, 0.01f);
  cpu::convert_f32_to_f16(h.data(), x.data(), 4);
  cpu::convert_f16_to_f32(y.data(), h.data(), 4);
  EXPECT_EQ(y[3], 65504.0f);
  EXPECT_NEAR(y[2], 3.14159f, 0.002f);
  EXPECT_EQ(parse_dtype("bf16"), DType::kBF16);
  EXPECT_STREQ(dtype_name(DType::kF16), "fp16");
  EXPECT_THROW(parse_dtype("fp8"), ds::Error);
}
