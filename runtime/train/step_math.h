// The math that ends a training step, after the last micro-batch's gradients are reduced:
//   1. the global batch's loss and the global gradient norm: each micro-batch loss once (from the
//      rank that owns it), each gradient element once (OptimizerState::norm_ranges), summed over
//      the world in rank order, so every rank holds the same bits and agrees on an overflow,
//      which any rank's partition may hold (the uncounted ranges are checked for inf/nan too);
//   2. fp16 loss scaling decides whether the step is skipped (an overflow lowers the scale); an
//      overflow without loss scaling is divergence, an error;
//   3. the clip coefficient (gradient_clipping) and 1/loss_scale fold into AdamW's grad_scale;
//      AdamW updates the state and the model gets the new weights; the LR schedule advances.
// Element work runs through the kernels on the model's device (the caller's DeviceScope); the
// sums go through the host world (parallel/host_world.h): collective, every rank calls both.
#pragma once

#include <cstdint>

#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "parallel/host_world.h"
#include "train/optimizer_state.h"

namespace ds::rt::train {

struct StepStats {
  double loss = 0;       // mean over the global batch's micro-batches
  double aux_loss = 0;   // the same of the load-balancing loss (mixture of experts; else 0)
  double grad_norm = 0;  // of the unscaled gradients
  bool overflow = false;
  bool preempt = false;  // some rank was asked to stop (preemption): every rank stops after this step
};

// One optimizer state and the reduced gradients of its range (ZeroEngine::opt_grads). A mixture
// of experts has two: the dense region's and the experts'.
struct OptimizerPart {
  OptimizerState* state;
  TypedPtr grads;
};

// `owned_loss_sum` (and `owned_aux_sum`, of the load-balancing losses): the sum of this rank's
// micro-batch losses when it owns them (tp rank 0 of the last stage), else 0. `parts`: every
// optimizer state of this rank with its gradients (the norm counts each once). `loss_tokens` > 0
// (loss masks): owned_loss_sum is a sum of token losses and the loss is the world's sum over
// loss_tokens instead of over micro_batches. `sync_norm_once` (training.sync_norm_once): every
// range's sum of squares comes back at once (one synchronisation on a GPU) instead of one by one;
// the same bits either way.
StepStats global_step_stats(parallel::HostWorld& world, double owned_loss_sum, const std::vector<OptimizerPart>& parts,
                            double micro_batches, double loss_scale, bool preempt_requested = false,
                            double owned_aux_sum = 0, double loss_tokens = 0, bool sync_norm_once = true);

struct UpdateSettings {
  optim::AdamWConfig adamw;
  double gradient_clipping = 0;  // max norm; <= 0: off
};

// Steps 2 and 3 above. `lr` is the schedule's rate for this step (read before the scaler's
// update). Returns true when the step was skipped. Throws ds::Error (remote) for an overflow
// without loss scaling, naming the step and the loss.
bool apply_update(int64_t step, const StepStats& stats, double loss_scale, double lr, const UpdateSettings& settings,
                  const std::vector<OptimizerPart>& parts, optim::LossScaler& scaler, optim::LrScheduler& schedule);

}  // namespace ds::rt::train
