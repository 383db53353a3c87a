// Rotary position embeddings in Hugging Face's rotate_half convention (the first half of a head
// pairs with the second), from precomputed cos/sin tables. The rotation is orthogonal, so the
// backward is the same rotation by -angle. Any storage type (kernels.h: S): each pair is read in
// fp32, rotated with the fp32 tables and rounded once.
#include <cmath>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu {

namespace {

// One head's pairs (i, i + h2) rotated; multi-versioned (vmath.h) so the 16-bit conversions
// vectorise.
template <typename S>
DS_SIMD_CLONES void rope_head(S* v, const float* c, const float* s, int h2, float sign) {
  for (int i = 0; i < h2; i++) {
    const float a = to_f32(v[i]), b = to_f32(v[i + h2]);
    const float sn = sign * s[i];
    v[i] = from_f32<S>(a * c[i] - b * sn);
    v[i + h2] = from_f32<S>(b * c[i] + a * sn);
  }
}

// sign +1: forward rotation; -1: its transpose.
template <typename S>
void rope_apply(S* x, const float* cos, const float* sin, int B, int T, int heads, int hd, int stride, int offset,
                float sign) {
  const int h2 = hd / 2;
  const int64_t rows = static_cast<int64_t>(B) * T;
#pragma omp parallel for schedule(static) if (rows * heads * hd >= kParallelWork)
  for (int64_t r = 0; r < rows; r++) {
    const int t = static_cast<int>(r % T);
    const float* c = cos + static_cast<int64_t>(t) * h2;
    const float* s = sin + static_cast<int64_t>(t) * h2;
    for (int h = 0; h < heads; h++) rope_head(x + r * stride + offset + static_cast<int64_t>(h) * hd, c, s, h2, sign);
  }
}

}  // namespace

void rope_tables(float* cos, float* sin, int T, int hd, double theta) {
  const int h2 = hd / 2;
  for (int i = 0; i < h2; i++) {
    const double inv_freq = 1.0 / std::pow(theta, static_cast<double>(2 * i) / hd);
    for (int t = 0; t < T; t++) {
      const double a = t * inv_freq;
      cos[static_cast<int64_t>(t) * h2 + i] = static_cast<float>(std::cos(a));
      sin[static_cast<int64_t>(t) * h2 + i] = static_cast<float>(std::sin(a));
    }
  }
}

template <typename S>
void rope_forward(S* x, const float* cos, const float* sin, int B, int T, int heads, int hd, int stride,
                  int offset) {
  rope_apply(x, cos, sin, B, T, heads, hd, stride, offset, 1.0f);
}

template <typename S>
void rope_backward(S* dx, const float* cos, const float* sin, int B, int T, int heads, int hd, int stride,
                   int offset) {
  rope_apply(dx, cos, sin, B, T, heads, hd, stride, offset, -1.0f);
}

#define DS_INST_S(S)                                                                                         \
  template void rope_forward<S>(S*, const float*, const float*, int, int, int, int, int, int);             \
  template void rope_backward<S>(S*, const float*, const float*, int, int, int, int, int, int);
DS_FOR_EACH_STORAGE(DS_INST_S)

}  // namespace ds::rt::cpu
