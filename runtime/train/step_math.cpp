// The end of a training step (step_math.h).
#include "train/step_math.h"

#include <cmath>

#include "common/error.h"
#include "kernels/dispatch.h"
#include "kernels/typed.h"
#include "optim/clip.h"

namespace ds::rt::train {

StepStats global_step_stats(parallel::HostWorld& world, double owned_loss_sum, const std::vector<OptimizerPart>& parts,
                            double micro_batches, double loss_scale, bool preempt_requested, double owned_aux_sum,
                            double loss_tokens, bool sync_norm_once) {
  double counted = 0, uncounted = 0;
  if (sync_norm_once) {
    // Every range's sum at once (one synchronisation on a GPU), added in the same order as below.
    std::vector<std::pair<TypedPtr, int64_t>> spans;
    for (const OptimizerPart& p : parts) {
      for (const auto& [off, n] : p.state->norm_ranges()) spans.emplace_back(p.grads + off, n);
    }
    const size_t n_counted = spans.size();
    for (const OptimizerPart& p : parts) {
      for (const auto& [off, n] : p.state->uncounted_ranges()) spans.emplace_back(p.grads + off, n);
    }
    const std::vector<double> sums = kern::typed::sums_of_squares(spans);
    for (size_t i = 0; i < sums.size(); ++i) (i < n_counted ? counted : uncounted) += sums[i];
  } else {
    for (const OptimizerPart& p : parts) {
      for (const auto& [off, n] : p.state->norm_ranges()) counted += kern::typed::sum_of_squares(p.grads + off, n);
      for (const auto& [off, n] : p.state->uncounted_ranges()) {
        uncounted += kern::typed::sum_of_squares(p.grads + off, n);
      }
    }
  }
  const double bad = std::isfinite(uncounted) ? 0.0 : 1.0;
  // The 4th sum carries this rank's preemption flag, so every rank stops after the same step.
  const auto sums =
      world.sum_in_rank_order({owned_loss_sum, counted, bad, preempt_requested ? 1.0 : 0.0, owned_aux_sum});
  StepStats s;
  s.loss = sums[0] / (loss_tokens > 0 ? loss_tokens : micro_batches);
  s.aux_loss = sums[4] / micro_batches;
  s.overflow = !std::isfinite(sums[1]) || sums[2] > 0;
  // With local gradients (the 1-bit optimizers) the sum is over every dp rank's own gradient; the
  // norm reported and clipped is the ranks' RMS norm of their mean gradients (norm_factor() = dp).
  const double factor = parts.empty() ? 1.0 : parts.front().state->norm_factor();
  s.grad_norm = std::sqrt(sums[1] * factor) / loss_scale;
  s.preempt = sums[3] > 0;
  return s;
}

bool apply_update(int64_t step, const StepStats& stats, double loss_scale, double lr, const UpdateSettings& settings,
                  const std::vector<OptimizerPart>& parts, optim::LossScaler& scaler, optim::LrScheduler& schedule) {
  if (scaler.update(stats.overflow)) return true;
  if (stats.overflow) {
    throw remote_error("step {}: the gradients hold inf or nan (loss {}) and fp16 loss scaling is off: "
                       "training diverged",
                       step, stats.loss);
  }
  const double coef = optim::clip_coefficient(stats.grad_norm, settings.gradient_clipping);
  for (const OptimizerPart& p : parts) p.state->update(settings.adamw, lr, coef / loss_scale, p.grads);
  schedule.step();
  return false;
}

}  // namespace ds::rt::train
