// Vectorisable elementwise math for the CPU kernels: plain arithmetic the compiler turns into
// SIMD (SSE2 baseline, AVX2/AVX-512 in target_clones functions), where libm's expf/tanhf would
// stay scalar without -ffast-math. Internal to runtime/kernels/cpu.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace ds::rt::cpu {

// exp(x) with < 2 ulp error for x in [-87, 88] (Cephes' expf polynomial, Cody-Waite reduction);
// inputs beyond are clamped (exp(-inf) gives ~1e-38, not 0: harmless for softmax sums).
inline float vexp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // Round x / ln2 to the nearest integer with the 1.5 * 2^23 trick (no floor/round call).
  const float kMagic = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kMagic) - kMagic;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, 4);
  return y * scale;
}

// tanh(x) = 1 - 2 / (exp(2x) + 1): exact limits at +-inf, absolute error ~1e-7.
inline float vtanh(float x) { return 1.0f - 2.0f / (vexp(2.0f * x) + 1.0f); }

// Reductions with 16 independent partial sums: vectorisable without -ffast-math (the compiler may
// not reorder a single float accumulator), and the summation order is fixed, so results do not
// depend on the ISA the loader picked beyond the lane count.
constexpr int kLanes = 16;

// The reductions read any storage type (core/dtype.h's to_f32) and sum in fp32.
template <typename S>
inline float vsum(const S* x, int n) {
  float acc[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; j++) acc[j] += to_f32(x[i + j]);
  }
  for (; i < n; i++) acc[0] += to_f32(x[i]);
  float s = 0.0f;
  for (int j = 0; j < kLanes; j++) s += acc[j];
  return s;
}

template <typename A, typename B>
inline float vdot(const A* a, const B* b, int n) {
  float acc[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; j++) acc[j] += to_f32(a[i + j]) * to_f32(b[i + j]);
  }
  for (; i < n; i++) acc[0] += to_f32(a[i]) * to_f32(b[i]);
  float s = 0.0f;
  for (int j = 0; j < kLanes; j++) s += acc[j];
  return s;
}

// The maximum is exact in any order, so it is an OpenMP simd reduction (GCC does not vectorise
// the 16-accumulator form of a max, nor a plain max loop without -ffinite-math-only).
template <typename S>
inline float vmax(const S* x, int n) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int i = 0; i < n; i++) {
    const float v = to_f32(x[i]);
    m = v > m ? v : m;
  }
  return m;
}

// e[i] = exp(x[i] - shift) for x of any storage type; returns the sum of the e[i]. e may be x
// (fp32, in place).
template <typename S>
inline float vexp_into_sum(float* e, const S* x, float shift, int n) {
  float acc[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; j++) {
      e[i + j] = vexp(to_f32(x[i + j]) - shift);
      acc[j] += e[i + j];
    }
  }
  for (; i < n; i++) {
    e[i] = vexp(to_f32(x[i]) - shift);
    acc[0] += e[i];
  }
  float s = 0.0f;
  for (int j = 0; j < kLanes; j++) s += acc[j];
  return s;
}

// x[i] = exp(x[i] - shift) in place; returns the sum of the new values.
inline float vexp_inplace_sum(float* x, float shift, int n) { return vexp_into_sum(x, x, shift, n); }

// sum of exp(x[i] - shift), x unchanged.
template <typename S>
inline float vexp_sum(const S* x, float shift, int n) {
  float acc[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; j++) acc[j] += vexp(to_f32(x[i + j]) - shift);
  }
  for (; i < n; i++) acc[0] += vexp(to_f32(x[i]) - shift);
  float s = 0.0f;
  for (int j = 0; j < kLanes; j++) s += acc[j];
  return s;
}

}  // namespace ds::rt::cpu

// Multi-versioned hot loops: the loader picks the widest ISA the CPU has. GCC only: clang (14)
// refuses target_clones on the function templates these are, so a clang build runs them at the
// baseline ISA (as sanitizer builds do).
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__clang__)
#define DS_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DS_SIMD_CLONES
#endif
