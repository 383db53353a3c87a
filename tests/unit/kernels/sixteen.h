// Helpers of the 16-bit kernel tests (kernels16_test.cpp, llama_kernels16_test.cpp): rounding
// test inputs to a storage type S and comparing a 16-bit result with its fp32 twin's within
// about one rounding of S: |got - want| <= k * eps_S * (|want| + scale) + atol, eps_S = 2^-8
// (bf16) or 2^-11 (fp16), scale = 1% of the largest |want| (cancellation in sums).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/dtype.h"

namespace ds::test::sixteen {

using ds::rt::bf16;
using ds::rt::f16;
using ds::rt::from_f32;
using ds::rt::to_f32;

template <typename S>
constexpr double kEps = std::is_same_v<S, bf16> ? 1.0 / 256 : 1.0 / 2048;

template <typename S>
std::vector<S> to16(const std::vector<float>& x) {
  std::vector<S> y(x.size());
  for (size_t i = 0; i < x.size(); i++) y[i] = from_f32<S>(x[i]);
  return y;
}
template <typename S>
std::vector<float> tof(const std::vector<S>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); i++) y[i] = to_f32(x[i]);
  return y;
}
// x rounded to S, in place (the fp32 twin's input).
template <typename S>
std::vector<float>& round16(std::vector<float>& x) {
  for (auto& v : x) v = to_f32(from_f32<S>(v));
  return x;
}

template <typename S>
void expect_close(const char* what, const std::vector<float>& want, const std::vector<float>& got, double k = 2,
                  double atol = 0) {
  ASSERT_EQ(want.size(), got.size()) << what;
  double scale = 0;
  for (float w : want) scale = std::max(scale, 0.01 * std::fabs(w));
  int bad = 0;
  for (size_t i = 0; i < want.size() && bad < 5; i++) {
    const double tol = k * kEps<S> * (std::fabs(want[i]) + scale) + atol;
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      ADD_FAILURE() << what << "[" << i << "]: 16-bit " << got[i] << " fp32 " << want[i] << " tol " << tol;
      bad++;
    }
  }
}

}  // namespace ds::test::sixteen
