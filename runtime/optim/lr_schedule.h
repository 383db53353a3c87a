// Learning-rate schedules with DeepSpeed's names, parameters and formulas
// (deepspeed/runtime/lr_schedules.py): WarmupLR, WarmupDecayLR, WarmupCosineLR, and a constant
// lr when the config has no scheduler. Not here: LRRangeTest and OneCycle (rejected by name).
//
// DeepSpeed counts with last_batch_iteration, which starts at -1 and is advanced by
// scheduler.step() after every optimizer step that was applied (not after a step skipped for an
// fp16 overflow). The lr in force while optimizer step number s (1-based, counting applied
// steps) runs is therefore lr_at(s - 2): the first step uses lr_at(-1), which is warmup_min_lr
// for WarmupLR/WarmupDecayLR and 0 for WarmupCosineLR. LrScheduler reproduces that.
//
// With W = max(2, warmup_num_steps) and i = last_batch_iteration >= 0:
//   warmup gamma (i < W):  log: ln(i + 1) / ln(W)       linear: i / W
//   WarmupLR:        lr = warmup_min_lr + (warmup_max_lr - warmup_min_lr) * gamma, gamma = 1 after
//   WarmupDecayLR:   after warmup gamma = max(0, (total_num_steps - i) / max(1, total_num_steps - W))
//   WarmupCosineLR:  lr = base_lr * ratio; in warmup ratio = warmup_min_ratio
//                    + gamma * (1 - warmup_min_ratio); after it, with
//                    p = min(1, (i - W + 1) / max(1, total_num_steps - W)),
//                    ratio = max(0, cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi p)) / 2)
//   (the clamp of p at 1 is current DeepSpeed; older releases let the cosine rise again past
//   total_num_steps.)
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace ds::rt::optim {

enum class LrScheduleType { kConstant, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };
enum class WarmupType { kLog, kLinear };

const char* lr_schedule_name(LrScheduleType type);  // "constant", "WarmupLR", ...

// Defaults are DeepSpeed's constructor defaults.
struct LrScheduleConfig {
  LrScheduleType type = LrScheduleType::kConstant;
  double base_lr = 1e-3;          // the optimizer's lr: constant's lr, WarmupCosineLR's peak
  double warmup_min_lr = 0.0;     // WarmupLR, WarmupDecayLR
  double warmup_max_lr = 1e-3;    // WarmupLR (DeepSpeed default: the optimizer's lr), WarmupDecayLR
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::kLog;
  int64_t total_num_steps = 0;    // WarmupDecayLR, WarmupCosineLR (required there)
  double warmup_min_ratio = 0.0;  // WarmupCosineLR
  double cos_min_ratio = 1e-4;    // WarmupCosineLR
};

// "WarmupLR" etc. (and "" or "constant" for kConstant) to the type; "log"/"linear" to the warmup
// type. Throw ds::Error (invalid argument) for any other name, listing the valid ones. The job
// config (lib/config) parses and validates the "scheduler" section; the trainer maps it here.
LrScheduleType lr_schedule_type_from_name(const std::string& name);
WarmupType warmup_type_from_name(const std::string& name);

// DeepSpeed's get_lr() at last_batch_iteration `i` (i >= -1). Pure.
double lr_at(const LrScheduleConfig& config, int64_t i);

// DeepSpeed's scheduler object: starts at last_batch_iteration = -1; lr() is the lr for the next
// optimizer step; step() after each applied optimizer step. Checkpointed as
// {"last_batch_iteration": i}, DeepSpeed's state_dict.
class LrScheduler {
 public:
  explicit LrScheduler(LrScheduleConfig config) : config_(config) {}
  double lr() const { return lr_at(config_, last_batch_iteration_); }
  void step() { ++last_batch_iteration_; }
  int64_t last_batch_iteration() const { return last_batch_iteration_; }
  const LrScheduleConfig& config() const { return config_; }

  nlohmann::json state() const;
  // Throws ds::Error naming `where` when the key is missing, not an integer, or < -1.
  void restore(const nlohmann::json& state, const std::string& where);

 private:
  LrScheduleConfig config_;
  int64_t last_batch_iteration_ = -1;
};

}  // namespace ds::rt::optim
