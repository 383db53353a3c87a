// Norms over flat buffers of any storage type (fp32 arithmetic, double sums). sum_of_squares gives each thread one contiguous block and adds
// the blocks' sums in thread order, so the result depends on the thread count but not on timing.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/kernels.h"

namespace ds::rt::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 15;
constexpr int kMaxThreads = 256;

// Sum of squares of x[0, n) in double with 8 independent accumulators (a fixed order, so still
// deterministic), which lets the compiler vectorise without reassociating.
template <typename S>
double block_sum_of_squares(const S* x, int64_t n) {
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      const double v = to_f32(x[i + j]);
      acc[j] += v * v;
    }
  }
  for (; i < n; ++i) acc[0] += static_cast<double>(to_f32(x[i])) * to_f32(x[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
}  // namespace

template <typename S>
double sum_of_squares(const S* x, int64_t n) {
  if (n < kParallelMin) return block_sum_of_squares(x, n);
  double partial[kMaxThreads] = {};
  const int threads = std::min(omp_get_max_threads(), kMaxThreads);
  int used = 1;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
#pragma omp single
    used = nt;
    const int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    partial[t] = block_sum_of_squares(x + lo, hi - lo);
  }
  double total = 0;
  for (int t = 0; t < used; ++t) total += partial[t];
  return total;
}

template <typename S>
void scale_in_place(S* x, int64_t n, float coef) {
  if (coef == 1.0f) return;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) x[i] = from_f32<S>(to_f32(x[i]) * coef);
}

template <typename S>
void columns_axpy(S* dst, int ld_dst, const S* src, int ld_src, float scale, int64_t N, int cols, bool accumulate) {
#pragma omp parallel for schedule(static) if (N * cols >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    S* d = dst + n * ld_dst;
    const S* s = src + n * ld_src;
    for (int j = 0; j < cols; ++j) d[j] = from_f32<S>((accumulate ? to_f32(d[j]) : 0.0f) + scale * to_f32(s[j]));
  }
}

namespace {
inline uint64_t dropout_mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

template <typename S>
void lora_dropout(S* out, const S* x, int64_t N, int cols, int64_t col0, int64_t full_cols, float p, uint64_t key) {
  const float keep_scale = 1.0f / (1.0f - p);
  const uint64_t k = dropout_mix(key);
#pragma omp parallel for schedule(static) if (N * cols >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    for (int j = 0; j < cols; ++j) {
      const uint64_t h = dropout_mix(k ^ static_cast<uint64_t>(n * full_cols + col0 + j));
      const float u = static_cast<float>(h >> 40) * 0x1.0p-24f;  // [0, 1)
      const int64_t i = n * cols + j;
      out[i] = from_f32<S>(u < p ? 0.0f : to_f32(x[i]) * keep_scale);
    }
  }
}

template <typename S>
bool all_finite(const S* x, int64_t n) {
  // Branch-free accumulation so the loop vectorises: x - x is 0 for finite x, nan otherwise.
  float acc = 0.0f;
#pragma omp parallel for schedule(static) reduction(+ : acc) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) acc += to_f32(x[i]) - to_f32(x[i]);
  return acc == 0.0f;
}

#define DS_INST_S(S)                                        \
  template double sum_of_squares<S>(const S*, int64_t);     \
  template void scale_in_place<S>(S*, int64_t, float);      \
  template void columns_axpy<S>(S*, int, const S*, int, float, int64_t, int, bool); \
  template void lora_dropout<S>(S*, const S*, int64_t, int, int64_t, int64_t, float, uint64_t); \
  template bool all_finite<S>(const S*, int64_t);
DS_FOR_EACH_STORAGE(DS_INST_S)

}  // namespace ds::rt::cpu
