// Loss scaling for fp16 training with DeepSpeed's semantics (DynamicLossScaler in
// deepspeed/runtime/fp16/loss_scaler.py, configured from the "fp16" section).
//
// The loss is multiplied by scale() before backward; the optimizer step divides gradients by it
// (AdamW's grad_scale). After every step the caller reports whether any gradient was inf/nan
// (on any rank: the caller agrees on it first) through update(overflow):
//   overflow: the step is skipped. If hysteresis is used up (hysteresis == 1 or the remaining
//     count is 1) the scale is halved, but not below min_loss_scale; when it already equals
//     min_loss_scale and raise_error_at_min_scale, update() throws instead (DeepSpeed's "Current
//     loss scale already at minimum"). Otherwise only the remaining hysteresis drops by one.
//     The overflow's iteration is remembered.
//   no overflow: with consecutive_hysteresis the remaining hysteresis is refilled. If the
//     number of iterations since the last overflow, minus one, is a positive multiple of
//     loss_scale_window, the scale doubles (and without consecutive_hysteresis the hysteresis is
//     refilled then).
//   Either way the iteration counter advances.
// Static scaling (loss_scale > 0) keeps the scale fixed; an overflow still skips the step.
// A disabled scaler (bf16 / fp32 training) has scale 1 and update() always returns false: without
// loss scaling an overflow is divergence, not a reason to skip, and what to do is the caller's
// decision (dstrain's trainer stops with an error).
//
// Note: DeepSpeed's non-ZeRO fused FP16_Optimizer ignores hysteresis; its ZeRO optimizers use
// DynamicLossScaler as here. dstrain applies this one rule at every ZeRO stage.
// Not thread-safe; one per rank, updated with the same overflow flag on every rank.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace ds::rt::optim {

// DeepSpeed's "fp16" keys and defaults (deepspeed/runtime/constants.py). The job config
// (lib/config) parses the section; the trainer copies it here.
struct LossScalerConfig {
  bool enabled = false;              // fp16.enabled; false: scale 1, nothing to adjust
  double loss_scale = 0;             // 0: dynamic; > 0: this static scale
  int initial_scale_power = 16;      // dynamic scaling starts at 2^initial_scale_power
  int64_t loss_scale_window = 1000;  // good iterations before the scale doubles
  int64_t hysteresis = 2;            // overflows tolerated before the scale halves
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;
  bool raise_error_at_min_scale = true;
};

class LossScaler {
 public:
  // Throws ds::Error (invalid argument) for loss_scale < 0, loss_scale_window < 1,
  // hysteresis < 1, min_loss_scale <= 0 or an initial scale below min_loss_scale.
  explicit LossScaler(const LossScalerConfig& config);

  double scale() const { return cur_scale_; }
  bool dynamic() const { return dynamic_; }

  // Reports the step's overflow flag and adjusts the scale as described above. Returns true when
  // the step must be skipped (= overflow, when enabled; always false when disabled). Throws
  // ds::Error at the minimum scale (see above).
  bool update(bool overflow);

  int64_t iteration() const { return cur_iter_; }
  int64_t last_overflow_iteration() const { return last_overflow_iter_; }
  int64_t remaining_hysteresis() const { return cur_hysteresis_; }

  // {"cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis"} for checkpoints.
  nlohmann::json state() const;
  void restore(const nlohmann::json& state, const std::string& where);

 private:
  LossScalerConfig config_;
  bool dynamic_ = false;
  double cur_scale_ = 1;
  int64_t cur_iter_ = 0;
  int64_t last_overflow_iter_ = -1;
  int64_t cur_hysteresis_ = 0;
};

}  // namespace ds::rt::optim
