// The fused AdamW pass. One loop per element range; everything per-step is precomputed in
// adamw_step_scalars so the loop is multiply-adds and one sqrt and divide per element.
#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace ds::rt::optim {

namespace {
// Below this many elements the OpenMP fork/join costs more than it saves.
constexpr int64_t kParallelMin = 1 << 15;
}  // namespace

AdamWStep adamw_step_scalars(const AdamWConfig& c, int64_t step, double lr, double grad_scale) {
  if (step < 1) throw invalid_argument("AdamW: step count must be at least 1, got {}", step);
  auto check = [](bool ok, const char* name, double v, const char* range) {
    if (!ok) throw invalid_argument("AdamW: {} = {} is out of range ({})", name, v, range);
  };
  check(lr >= 0 && std::isfinite(lr), "lr", lr, ">= 0");
  check(c.beta1 >= 0 && c.beta1 < 1, "beta1", c.beta1, "0 <= beta1 < 1");
  check(c.beta2 >= 0 && c.beta2 < 1, "beta2", c.beta2, "0 <= beta2 < 1");
  check(c.eps > 0, "eps", c.eps, "> 0");
  check(c.weight_decay >= 0, "weight_decay", c.weight_decay, ">= 0");
  check(std::isfinite(grad_scale), "grad_scale", grad_scale, "finite");

  AdamWStep s;
  s.lr = static_cast<float>(lr);
  s.decay_factor = static_cast<float>(1.0 - lr * c.weight_decay);
  s.beta1 = static_cast<float>(c.beta1);
  s.beta2 = static_cast<float>(c.beta2);
  s.one_minus_beta1 = static_cast<float>(1.0 - c.beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  s.eps = static_cast<float>(c.eps);
  s.weight_decay = static_cast<float>(c.weight_decay);
  s.adam_w_mode = c.adam_w_mode;
  s.grad_scale = static_cast<float>(grad_scale);
  const double t = static_cast<double>(step);
  if (c.bias_correction) {
    s.step_size = static_cast<float>(lr / (1.0 - std::pow(c.beta1, t)));
    s.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(c.beta2, t)));
  } else {
    s.step_size = static_cast<float>(lr);
    s.bc2_sqrt = 1.0f;
  }
  return s;
}

void adamw_update(const AdamWStep& s, float* __restrict params, const float* __restrict grads,
                  float* __restrict exp_avg, float* __restrict exp_avg_sq, int64_t n,
                  bool decay) {
  const float b1 = s.beta1, b2 = s.beta2, one_b1 = s.one_minus_beta1, one_b2 = s.one_minus_beta2;
  const float eps = s.eps, step_size = s.step_size, bc2_sqrt = s.bc2_sqrt;
  const float gs = s.grad_scale;
  const bool decoupled = decay && s.adam_w_mode && s.weight_decay != 0.0f;
  const bool l2 = decay && !s.adam_w_mode && s.weight_decay != 0.0f;
  const float decay_factor = s.decay_factor, wd = s.weight_decay;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float p = params[i];
    float g = grads[i] * gs;
    if (l2) g += wd * p;
    if (decoupled) p *= decay_factor;
    const float m = b1 * exp_avg[i] + one_b1 * g;
    const float v = b2 * exp_avg_sq[i] + one_b2 * (g * g);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = std::sqrt(v) / bc2_sqrt + eps;
    params[i] = p - step_size * (m / denom);
  }
}

void for_each_decay_run(int64_t begin, int64_t count, std::span<const DecayRange> decay,
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
    const DecayRange& r = decay[i];
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

void adamw_update_partition(const AdamWStep& s, float* params, const float* grads,
                            float* exp_avg, float* exp_avg_sq, int64_t begin, int64_t count,
                            std::span<const DecayRange> decay) {
  for_each_decay_run(begin, count, decay, [&](int64_t o, int64_t n, bool d) {
    adamw_update(s, params + o, grads + o, exp_avg + o, exp_avg_sq + o, n, d);
  });
}

}  // namespace ds::rt::optim
