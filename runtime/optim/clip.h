// Gradient clipping, split so that a sharded optimizer (ZeRO) can combine partial results across
// ranks between the steps:
//   1. each rank: partial = kern::sum_of_squares(its gradient spans)   (double; a kernel)
//   2. the caller all-reduces (sums) the partials across ranks        (not here)
//   3. norm = std::sqrt(total); coef = clip_coefficient(norm, max_norm)
//   4. each rank passes coef to AdamW's grad_scale (or kern::scale_in_place)
// A non-finite sum of squares means some gradient is inf or nan (squares of finite floats
// cannot overflow a double), so the same all-reduced number is the overflow check: DeepSpeed
// skips the step when the global norm is inf/nan.
//
// Clipping is PyTorch's clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied only when it
// is below 1. DeepSpeed's fp16 optimizer computes the same factor (it folds it into the loss
// scale). max_norm <= 0 disables clipping (DeepSpeed's gradient_clipping = 0).
#pragma once

#include <cstdint>

namespace ds::rt::optim {

// min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0 (clipping off) or the norm is not
// finite (an overflowed step is skipped, not clipped).
double clip_coefficient(double total_norm, double max_norm);

}  // namespace ds::rt::optim
