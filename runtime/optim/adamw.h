// AdamW (and Adam with L2) as PyTorch's torch.optim.AdamW and DeepSpeed's FusedAdam/CPUAdam
// define it: the per-step scalars here, the fused pass over flat fp32 buffers in the kernels
// (cpu::adamw_update_partition and its CUDA twin, through kern::adamw_update_partition).
//
// For each element, with g = grad * grad_scale and t = the step count (1 for the first update):
//   adam_w_mode (AdamW):  p *= 1 - lr * weight_decay           (decoupled, on the old p)
//   otherwise (Adam+L2):  g += weight_decay * p               (DeepSpeed adam_w_mode = false)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   with bias_correction: p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//   without:              p -= lr * m / (sqrt(v) + eps)
// The step count and the bias corrections are the caller's (one per optimizer, not per element),
// computed in double and applied in fp32, as PyTorch does.
//
// Sharding: every function works on any contiguous sub-span of the flat buffers. A ZeRO rank
// calls it on its own partition [begin, begin + count) with pointers to its shard-local
// buffers; `decay` ranges are given in global offsets of the full flat buffer, so the same table
// serves every rank and every partitioning.
//
// Which parameters decay is the caller's choice, as a table of ranges (DecayRange). llm.c's
// practice: 2-D weight matrices (and embeddings) decay, biases and LayerNorm weights do
// not; DeepSpeed applies weight_decay to every parameter handed to the optimizer. Elements not
// covered by any range do not decay.
//
// Grad scaling: grad_scale multiplies every gradient as it is read, so unscaling a loss-scaled
// gradient and clipping fuse into this pass (grad_scale = clip_coefficient / loss_scale).
// Threads: OpenMP over elements (static schedule); results do not depend on the thread count.
// Not here: the element pass (kernels), the optimizer state's allocation.
#pragma once

#include <cstdint>

#include "kernels/adamw_step.h"

namespace ds::rt::optim {

struct AdamWConfig {
  double lr = 1e-3;            // the base lr; the schedule's lr is passed to each step
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // PyTorch AdamW's default; DeepSpeed's "Adam" defaults to 0
  bool adam_w_mode = true;     // false: Adam with L2 (weight decay added to the gradient)
  bool bias_correction = true;
};

// The step's scalars and the decay table are the kernels' types (kernels/adamw_step.h): the
// optimizer computes them, the kernels (kern::adamw_update_partition) apply them.
using kern::AdamWStep;
using kern::DecayRange;

// Validates t >= 1 and the config (lr >= 0, 0 <= beta < 1, eps > 0, weight_decay >= 0; throws
// ds::Error naming the field) and computes the step scalars.
AdamWStep adamw_step_scalars(const AdamWConfig& config, int64_t step, double lr,
                             double grad_scale = 1.0);

}  // namespace ds::rt::optim
