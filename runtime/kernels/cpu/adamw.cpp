// The fused AdamW pass (kernels/adamw_step.h gives the formula). One loop per element range;
// everything per-step was precomputed by optim::adamw_step_scalars, so the loop is multiply-adds
// and one sqrt and divide per element.
#include <algorithm>
#include <cmath>

#include <omp.h>

#include "common/error.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu {

namespace {
// Below this many elements the OpenMP fork/join costs more than it saves.
constexpr int64_t kParallelMin = 1 << 15;

// The one AdamW loop over [0, n): G gradients, and the updated fp32 value rounded into S
// (params_out null: none). fp32 training is G = S = float without params_out (adamw_update).
// Multi-versioned (vmath.h): the sqrt, divide and 16-bit conversions vectorise at AVX-512.
template <typename G, typename S>
DS_SIMD_CLONES void adamw_chunk(const kern::AdamWStep& s, float* __restrict params, const G* __restrict grads,
                                float* __restrict exp_avg, float* __restrict exp_avg_sq, int64_t n, bool decay,
                                S* __restrict params_out) {
  const float b1 = s.beta1, b2 = s.beta2, one_b1 = s.one_minus_beta1, one_b2 = s.one_minus_beta2;
  const float eps = s.eps, step_size = s.step_size, bc2_sqrt = s.bc2_sqrt;
  const float gs = s.grad_scale;
  const bool decoupled = decay && s.adam_w_mode && s.weight_decay != 0.0f;
  const bool l2 = decay && !s.adam_w_mode && s.weight_decay != 0.0f;
  const float decay_factor = decoupled ? s.decay_factor : 1.0f;
  const float wd = l2 ? s.weight_decay : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    float p = params[i];
    const float g = to_f32(grads[i]) * gs + wd * p;
    p *= decay_factor;
    const float m = b1 * exp_avg[i] + one_b1 * g;
    const float v = b2 * exp_avg_sq[i] + one_b2 * (g * g);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = std::sqrt(v) / bc2_sqrt + eps;
    p = p - step_size * (m / denom);
    params[i] = p;
    if (params_out != nullptr) params_out[i] = from_f32<S>(p);
  }
}

// adamw_chunk over [0, n), split into one contiguous range per thread.
template <typename G, typename S>
void adamw_update_mixed(const kern::AdamWStep& s, float* params, const G* grads, float* exp_avg,
                        float* exp_avg_sq, int64_t n, bool decay, S* params_out) {
  if (n < kParallelMin) {
    adamw_chunk(s, params, grads, exp_avg, exp_avg_sq, n, decay, params_out);
    return;
  }
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    // Ranges rounded to 16 elements, so every thread's vector loop starts aligned alike.
    const int64_t per = ((n + nt - 1) / nt + 15) / 16 * 16;
    const int64_t lo = std::min(n, t * per), hi = std::min(n, lo + per);
    if (hi > lo) {
      adamw_chunk(s, params + lo, grads + lo, exp_avg + lo, exp_avg_sq + lo, hi - lo, decay,
                  params_out != nullptr ? params_out + lo : nullptr);
    }
  }
}
}  // namespace

void adamw_update(const kern::AdamWStep& s, float* params, const float* grads, float* exp_avg,
                  float* exp_avg_sq, int64_t n, bool decay) {
  adamw_update_mixed<float, float>(s, params, grads, exp_avg, exp_avg_sq, n, decay, nullptr);
}

void for_each_decay_run(int64_t begin, int64_t count, std::span<const kern::DecayRange> decay,
                        const std::function<void(int64_t, int64_t, bool)>& run) {
  if (begin < 0 || count < 0) {
    throw invalid_argument("AdamW: partition [{}, {}+{}) is invalid", begin, begin, count);
  }
  const int64_t end = begin + count;
  int64_t cursor = begin;  // global offset of the next element to update
  auto emit = [&](int64_t from, int64_t to, bool d) {
    if (to > from) run(from - begin, to - from, d);
  };
  int64_t prev_end = 0;
  for (size_t i = 0; i < decay.size(); ++i) {
    const kern::DecayRange& r = decay[i];
    if (r.offset < prev_end || r.count < 0) {
      throw invalid_argument("AdamW: decay range {} [{}, {}) overlaps the previous one or is not "
                             "sorted by offset",
                             i, r.offset, r.offset + r.count);
    }
    prev_end = r.offset + r.count;
    if (cursor >= end) continue;  // keep validating the rest of the table
    const int64_t lo = std::max(r.offset, cursor), hi = std::min(prev_end, end);
    if (hi <= lo) continue;
    emit(cursor, lo, false);  // a gap before this range: no decay
    emit(lo, hi, r.decay);
    cursor = hi;
  }
  emit(cursor, end, false);
}

void adamw_update_partition(const kern::AdamWStep& s, float* params, const float* grads,
                            float* exp_avg, float* exp_avg_sq, int64_t begin, int64_t count,
                            std::span<const kern::DecayRange> decay) {
  for_each_decay_run(begin, count, decay, [&](int64_t o, int64_t n, bool d) {
    adamw_update(s, params + o, grads + o, exp_avg + o, exp_avg_sq + o, n, d);
  });
}


template <typename G, typename S>
void adamw_update_partition_mixed(const kern::AdamWStep& s, float* params, const G* grads, float* exp_avg,
                                  float* exp_avg_sq, int64_t begin, int64_t count,
                                  std::span<const kern::DecayRange> decay, S* params_out) {
  for_each_decay_run(begin, count, decay, [&](int64_t o, int64_t n, bool d) {
    adamw_update_mixed(s, params + o, grads + o, exp_avg + o, exp_avg_sq + o, n, d,
                       params_out != nullptr ? params_out + o : nullptr);
  });
}

#define DS_INST_GS(G, S)                                                                                  \
  template void adamw_update_partition_mixed<G, S>(const kern::AdamWStep&, float*, const G*, float*, float*, \
                                                   int64_t, int64_t, std::span<const kern::DecayRange>, S*);
#define DS_INST_G(G) DS_INST_GS(G, float) DS_INST_GS(G, ::ds::rt::bf16) DS_INST_GS(G, ::ds::rt::f16)
DS_FOR_EACH_STORAGE(DS_INST_G)

}  // namespace ds::rt::cpu
