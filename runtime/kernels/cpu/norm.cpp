// Norms over flat fp32 buffers. sum_of_squares gives each thread one contiguous block and adds
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
double block_sum_of_squares(const float* x, int64_t n) {
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += static_cast<double>(x[i + j]) * x[i + j];
  }
  for (; i < n; ++i) acc[0] += static_cast<double>(x[i]) * x[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
}  // namespace

double sum_of_squares(const float* x, int64_t n) {
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

void scale_in_place(float* x, int64_t n, float coef) {
  if (coef == 1.0f) return;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) x[i] *= coef;
}

bool all_finite(const float* x, int64_t n) {
  // Branch-free accumulation so the loop vectorises: x - x is 0 for finite x, nan otherwise.
  float acc = 0.0f;
#pragma omp parallel for schedule(static) reduction(+ : acc) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) acc += x[i] - x[i];
  return acc == 0.0f;
}

}  // namespace ds::rt::cpu
