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
  for (int64_t b = 0; b * block < n; ++b) {
    float* xb = x + b * block;
    double acc[4] = {0, 0, 0, 0};  // the block's sum of squares in double, four partial sums
    for (int64_t i = 0; i < block; i += 4) {
      for (int k = 0; k < 4; ++k) acc[k] += static_cast<double>(xb[i + k]) * xb[i + k];
    }
    const float s = static_cast<float>(std::sqrt((acc[0] + acc[1] + acc[2] + acc[3]) / static_cast<double>(block)));
    scales[b] = s;
    uint8_t* sb = signs + b * block / 8;
    for (int64_t j = 0; j < block / 8; ++j) {
      unsigned byte = 0;
      for (int k = 0; k < 8; ++k) {  // branch-free: the signs are random
        const float v = xb[8 * j + k];
        const unsigned pos = v >= 0.0f ? 1u : 0u;
        byte |= pos << k;
        xb[8 * j + k] = v - s * (static_cast<float>(2 * pos) - 1.0f);
      }
      sb[j] = static_cast<uint8_t>(byte);
    }
  }
}

void onebit_decompress(const uint8_t* signs, const float* scales, int64_t n, int64_t block, float weight,
                       float* out, bool accumulate) {
  for (int64_t b = 0; b * block < n; ++b) {
    const float s = weight * scales[b];
    const uint8_t* sb = signs + b * block / 8;
    float* ob = out + b * block;
    // Branch-free (the signs are random): the value is s * (2 bit - 1).
    if (accumulate) {
      for (int64_t j = 0; j < block / 8; ++j) {
        const unsigned byte = sb[j];
        for (int k = 0; k < 8; ++k) ob[8 * j + k] += s * (static_cast<float>(((byte >> k) & 1u) * 2) - 1.0f);
      }
    } else {
      for (int64_t j = 0; j < block / 8; ++j) {
        const unsigned byte = sb[j];
        for (int k = 0; k < 8; ++k) ob[8 * j + k] = s * (static_cast<float>(((byte >> k) & 1u) * 2) - 1.0f);
      }
    }
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
