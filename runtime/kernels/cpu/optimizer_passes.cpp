// The element passes of Lion, Adagrad, LAMB and the 1-bit compression (cpu/optimizer_passes.h).
#include "kernels/cpu/optimizer_passes.h"

#include <cmath>
#include <cstring>

#include "core/dtype.h"

namespace ds::rt::cpu {

template <typename G>
void lion_update(float* p, const G* g, float* m, int64_t n, float lr, float b1, float b2, float decay_factor,
                 float gs) {
  const float one_b1 = 1.0f - b1, one_b2 = 1.0f - b2;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = to_f32(g[i]) * gs;
    const float c = b1 * m[i] + one_b1 * gi;
    const float sign = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : 0.0f);
    p[i] = p[i] * decay_factor - lr * sign;
    m[i] = b2 * m[i] + one_b2 * gi;
  }
}

template <typename G>
void adagrad_update(float* p, const G* g, float* v, int64_t n, float lr, float eps, float wd, float gs) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = to_f32(g[i]) * gs + wd * p[i];
    v[i] += gi * gi;
    p[i] -= lr * gi / (std::sqrt(v[i]) + eps);
  }
}

template <typename G>
void adam_moments(const G* g, float* m, float* v, int64_t n, float b1, float b2, float gs) {
  const float one_b1 = 1.0f - b1, one_b2 = 1.0f - b2;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = to_f32(g[i]) * gs;
    m[i] = b1 * m[i] + one_b1 * gi;
    if (v != nullptr) v[i] = b2 * v[i] + one_b2 * (gi * gi);
  }
}

template <typename G>
void scaled_to_f32(float* dst, const G* g, int64_t n, float gs) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_f32(g[i]) * gs;
}

namespace {
inline float denom_of(float v, const AdamDirection& d) {
  return d.eps_inside_sqrt ? std::sqrt(v + d.eps) : std::sqrt(v) + d.eps;
}
}  // namespace

void adam_direction_norms(const float* p, const float* m, const float* v, int64_t n, const AdamDirection& d,
                          double* p_sq, double* u_sq, double* prelim_sq) {
  double ps = 0, us = 0, qs = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float q = m[i] / denom_of(v[i], d);
    const float u = q + d.wd * p[i];
    ps += static_cast<double>(p[i]) * p[i];
    us += static_cast<double>(u) * u;
    qs += static_cast<double>(q) * q;
  }
  *p_sq += ps;
  *u_sq += us;
  if (prelim_sq != nullptr) *prelim_sq += qs;
}

void adam_direction_apply(float* p, const float* m, const float* v, int64_t n, const AdamDirection& d, float step,
                          float* accum) {
  for (int64_t i = 0; i < n; ++i) {
    const float u = m[i] / denom_of(v[i], d) + d.wd * p[i];
    p[i] -= step * u;
    if (accum != nullptr) accum[i] -= step * u;
  }
}

double denom_ratio_max(const float* v, const float* v_fresh, int64_t n, float eps, double floor) {
  double best = floor;
  for (int64_t i = 0; i < n; ++i) {
    const double r = (std::sqrt(v[i]) + eps) / (std::sqrt(v_fresh[i]) + eps);
    if (r > best) best = r;
  }
  return best;
}

void onebit_compress(float* x, int64_t n, int64_t block, uint8_t* signs, float* scales) {
  std::memset(signs, 0, static_cast<size_t>(n / 8));
  for (int64_t b = 0; b * block < n; ++b) {
    float* xb = x + b * block;
    double sq = 0;
    for (int64_t i = 0; i < block; ++i) sq += static_cast<double>(xb[i]) * xb[i];
    const float s = static_cast<float>(std::sqrt(sq / static_cast<double>(block)));
    scales[b] = s;
    for (int64_t i = 0; i < block; ++i) {
      const int64_t e = b * block + i;
      const bool pos = xb[i] >= 0.0f;
      if (pos) signs[e >> 3] = static_cast<uint8_t>(signs[e >> 3] | (1u << (e & 7)));
      xb[i] -= pos ? s : -s;
    }
  }
}

void onebit_decompress(const uint8_t* signs, const float* scales, int64_t n, int64_t block, float weight,
                       float* out, bool accumulate) {
  for (int64_t e = 0; e < n; ++e) {
    const float s = weight * scales[e / block];
    const float val = (signs[e >> 3] >> (e & 7)) & 1u ? s : -s;
    out[e] = accumulate ? out[e] + val : val;
  }
}

#define DS_INST_OPT(G)                                                                                      \
  template void lion_update<G>(float*, const G*, float*, int64_t, float, float, float, float, float);       \
  template void adagrad_update<G>(float*, const G*, float*, int64_t, float, float, float, float);           \
  template void adam_moments<G>(const G*, float*, float*, int64_t, float, float, float);                     \
  template void scaled_to_f32<G>(float*, const G*, int64_t, float);
DS_INST_OPT(float)
DS_INST_OPT(::ds::rt::bf16)
DS_INST_OPT(::ds::rt::f16)
#undef DS_INST_OPT

}  // namespace ds::rt::cpu
