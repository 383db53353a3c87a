// AdamW's per-step scalars (the element pass is the kernels': kernels/cpu/adamw.cpp).
#include "optim/adamw.h"

#include <cmath>

#include "common/error.h"

namespace ds::rt::optim {

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

}  // namespace ds::rt::optim
