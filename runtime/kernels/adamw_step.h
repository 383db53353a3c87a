// What the fused AdamW kernels (CPU: kernels/cpu/kernels.h, CUDA: kernels/cuda/kernels.h) read
// once per optimizer step, and the decay table they apply it with. The optimizer
// (optim/adamw.h) computes an AdamWStep from its config and the step count; the kernels own the
// element math. Plain C++ with no dependencies, so nvcc compiles it too.
//
// For each element, with g = grad * grad_scale:
//   adam_w_mode (AdamW):  p *= decay_factor                    (1 - lr * weight_decay, on the old p)
//   otherwise (Adam+L2):  g += weight_decay * p
//   m = beta1 * m + one_minus_beta1 * g
//   v = beta2 * v + one_minus_beta2 * g * g
//   p -= step_size * m / (sqrt(v) / bc2_sqrt + eps)
// (step_size and bc2_sqrt carry the bias corrections, or lr and 1 without them.)
#pragma once

#include <cstdint>

namespace ds::rt::kern {

struct AdamWStep {
  float lr = 0;
  float decay_factor = 1;  // 1 - lr * weight_decay (AdamW mode), as PyTorch's param.mul_
  float beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  float one_minus_beta1 = 1, one_minus_beta2 = 1;  // computed in double, as PyTorch's 1 - beta
  float step_size = 0;   // lr / (1 - beta1^t), or lr without bias correction
  float bc2_sqrt = 1;    // sqrt(1 - beta2^t), or 1 without bias correction
  float grad_scale = 1;
  bool adam_w_mode = true;
};

// One parameter range of the flat buffer, in global element offsets, and whether it decays.
// Elements no range covers do not decay.
struct DecayRange {
  int64_t offset = 0;
  int64_t count = 0;
  bool decay = false;
};

}  // namespace ds::rt::kern
