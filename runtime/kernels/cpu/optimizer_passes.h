// The element passes of the optimizers beside AdamW (cpu/adamw.cpp has AdamW's): Lion, Adagrad,
// LAMB's two passes, and the 1-bit compression of the 1-bit optimizers. Each reads gradients of
// type G (fp32, bf16 or fp16) times grad_scale `gs` and updates fp32 master weights and state in
// place; the rounded copy into the model's storage type is the caller's (a convert after the
// update). The formulas, with g = grad * gs (optim/optimizers.h says whose they are):
//   lion_update      p *= decay_factor; c = b1 m + (1 - b1) g; p -= lr sign(c); m = b2 m + (1 - b2) g
//   adagrad_update   g += wd p; v += g^2; p -= lr g / (sqrt(v) + eps)
//   adam_moments     m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2 (v null: m only)
//   adam_direction   u = m / d + wd p with d = sqrt(v) + eps, or sqrt(v + eps) (eps_inside_sqrt)
//   onebit_compress  per block of `block` elements: s = ||x_b|| / sqrt(|b|); bit = x >= 0;
//                    x becomes the error x - s (bit ? 1 : -1)
// Sums are in double. Single-threaded loops: the optimizers that use them run beside a
// multi-rank job on a few cores (the AdamW pass is the threaded one).
#pragma once

#include <cstdint>

namespace ds::rt::cpu {

template <typename G>
void lion_update(float* p, const G* g, float* m, int64_t n, float lr, float b1, float b2, float decay_factor,
                 float gs);
template <typename G>
void adagrad_update(float* p, const G* g, float* v, int64_t n, float lr, float eps, float wd, float gs);
template <typename G>
void adam_moments(const G* g, float* m, float* v, int64_t n, float b1, float b2, float gs);
// dst = grad * gs in fp32.
template <typename G>
void scaled_to_f32(float* dst, const G* g, int64_t n, float gs);

struct AdamDirection {
  float eps = 1e-8f;
  bool eps_inside_sqrt = false;
  float wd = 0;  // 0 where the range does not decay
};
// Adds ||p||^2, ||u||^2 and ||m / d||^2 (u without the decay term) over n elements.
void adam_direction_norms(const float* p, const float* m, const float* v, int64_t n, const AdamDirection& d,
                          double* p_sq, double* u_sq, double* prelim_sq);
// p -= step * u; accum (when not null) -= step * u as well.
void adam_direction_apply(float* p, const float* m, const float* v, int64_t n, const AdamDirection& d, float step,
                          float* accum);
// max over n of (sqrt(v) + eps) / (sqrt(v_fresh) + eps) (1-bit LAMB's factor), at least `floor`.
double denom_ratio_max(const float* v, const float* v_fresh, int64_t n, float eps, double floor);

// 1-bit compression of x (n elements, a multiple of `block`, itself a multiple of 8) in place:
// signs (n / 8 bytes, bit i of byte j is element 8 j + i, set for x >= 0), scales (n / block), and x
// left holding the compression error.
void onebit_compress(float* x, int64_t n, int64_t block, uint8_t* signs, float* scales);
// out[i] (+)= weight * scale_b * (bit ? 1 : -1) over n elements; `accumulate` false overwrites.
void onebit_decompress(const uint8_t* signs, const float* scales, int64_t n, int64_t block, float weight,
                       float* out, bool accumulate);

}  // namespace ds::rt::cpu
