// AdamW (and Adam with L2) as PyTorch's torch.optim.AdamW and DeepSpeed's FusedAdam/CPUAdam
// define it, as one fused pass over flat fp32 buffers.
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
// Which parameters decay is the caller's choice, as a table of ranges (DecayRange). GPT-2 and
// llm.c practice: 2-D weight matrices (and embeddings) decay, biases and LayerNorm weights do
// not; DeepSpeed applies weight_decay to every parameter handed to the optimizer. Elements not
// covered by any range do not decay.
//
// Grad scaling: grad_scale multiplies every gradient as it is read, so unscaling a loss-scaled
// gradient and clipping fuse into this pass (grad_scale = clip_coefficient / loss_scale).
// Threads: OpenMP over elements (static schedule); results do not depend on the thread count.
// Not here: master-weight <-> bf16/fp16 copies (kernels), the optimizer state's allocation.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

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

// One parameter range of the flat buffer, in global element offsets, and whether it decays.
struct DecayRange {
  int64_t offset = 0;
  int64_t count = 0;
  bool decay = false;
};

// The per-step scalars, computed once per optimizer step.
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

// Validates t >= 1 and the config (lr >= 0, 0 <= beta < 1, eps > 0, weight_decay >= 0; throws
// ds::Error naming the field) and computes the step scalars.
AdamWStep adamw_step_scalars(const AdamWConfig& config, int64_t step, double lr,
                             double grad_scale = 1.0);

// Updates n elements in place: params, exp_avg (m) and exp_avg_sq (v) are read and written,
// grads only read. Buffers must not overlap each other. `decay` selects whether weight decay
// applies to these n elements.
void adamw_update(const AdamWStep& s, float* params, const float* grads, float* exp_avg,
                  float* exp_avg_sq, int64_t n, bool decay);

// The runs of the partition [begin, begin + count) that decay alike, in order and covering it:
// run(offset from begin, n, decay) for each. Validates the table as adamw_update_partition does.
// What adamw_update_partition and its device twin (kern::adamw_update_partition) share.
void for_each_decay_run(int64_t begin, int64_t count, std::span<const DecayRange> decay,
                        const std::function<void(int64_t, int64_t, bool)>& run);

// Updates the partition [begin, begin + count) of the flat buffers; the pointers point at the
// partition's first element (shard-local). Each element decays as the DecayRange covering its
// global offset says (ranges sorted by offset, non-overlapping; throws ds::Error otherwise).
void adamw_update_partition(const AdamWStep& s, float* params, const float* grads,
                            float* exp_avg, float* exp_avg_sq, int64_t begin, int64_t count,
                            std::span<const DecayRange> decay);

}  // namespace ds::rt::optim
