// Host-side bridge from the optimizer's per-step scalars (optim/adamw.h, C++20) to the CUDA
// kernel's copy of them (kernels/cuda/kernels.h, which nvcc compiles as C++17). Header-only,
// compiles without CUDA.
#pragma once

#include "kernels/cuda/kernels.h"
#include "optim/adamw.h"

namespace ds::rt::cuda {

inline AdamWScalars adamw_scalars(const optim::AdamWStep& s) {
  AdamWScalars c;
  c.decay_factor = s.decay_factor;
  c.beta1 = s.beta1;
  c.beta2 = s.beta2;
  c.eps = s.eps;
  c.weight_decay = s.weight_decay;
  c.one_minus_beta1 = s.one_minus_beta1;
  c.one_minus_beta2 = s.one_minus_beta2;
  c.step_size = s.step_size;
  c.bc2_sqrt = s.bc2_sqrt;
  c.grad_scale = s.grad_scale;
  c.adam_w_mode = s.adam_w_mode;
  return c;
}

}  // namespace ds::rt::cuda
