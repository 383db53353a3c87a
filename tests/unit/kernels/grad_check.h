// Finite-difference helpers for the kernel and model gradient tests: central differences of a
// scalar loss computed in double from fp32 kernels, compared with the analytic gradient.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace ds::test {

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// sum_i a[i] * w[i] in double: the scalar loss whose gradient w.r.t. a is w.
inline double dot(const float* a, const std::vector<float>& w) {
  double s = 0.0;
  for (size_t i = 0; i < w.size(); i++) s += static_cast<double>(a[i]) * w[i];
  return s;
}

struct Tolerance {
  double eps = 1e-3;   // perturbation
  double atol = 2e-3;  // |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-2;
};

// Compares analytic[i] with the central difference of loss() in x[i], for up to max_checks
// indices spread over x (all when x is small). x is restored afterwards.
inline void check_grad(const std::string& what, std::vector<float>& x,
                       const std::vector<float>& analytic, const std::function<double()>& loss,
                       Tolerance tol = {}, size_t max_checks = 200) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  const size_t n = x.size();
  const size_t stride = n <= max_checks ? 1 : n / max_checks;
  int failures = 0;
  for (size_t i = 0; i < n && failures < 5; i += stride) {
    const float orig = x[i];
    x[i] = static_cast<float>(orig + tol.eps);
    const double lp = loss();
    x[i] = static_cast<float>(orig - tol.eps);
    const double lm = loss();
    x[i] = orig;
    const double num = (lp - lm) / (2.0 * tol.eps);
    const double err = std::fabs(analytic[i] - num);
    if (err > tol.atol + tol.rtol * std::fabs(num)) {
      ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << " numeric " << num;
      failures++;
    }
  }
}

}  // namespace ds::test
