// DeepSpeed's LR schedules: config parsing with JSON paths, and the formulas of lr_schedule.h.
#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace ds::rt::optim {

const char* lr_schedule_name(LrScheduleType type) {
  switch (type) {
    case LrScheduleType::kConstant: return "constant";
    case LrScheduleType::kWarmupLR: return "WarmupLR";
    case LrScheduleType::kWarmupDecayLR: return "WarmupDecayLR";
    case LrScheduleType::kWarmupCosineLR: return "WarmupCosineLR";
  }
  return "?";
}

LrScheduleType lr_schedule_type_from_name(const std::string& name) {
  if (name.empty() || name == "constant") return LrScheduleType::kConstant;
  if (name == "WarmupLR") return LrScheduleType::kWarmupLR;
  if (name == "WarmupDecayLR") return LrScheduleType::kWarmupDecayLR;
  if (name == "WarmupCosineLR") return LrScheduleType::kWarmupCosineLR;
  throw invalid_argument("unknown lr schedule \"{}\" (supported: WarmupLR, WarmupDecayLR, "
                         "WarmupCosineLR, or none for a constant lr)",
                         name);
}

WarmupType warmup_type_from_name(const std::string& name) {
  if (name == "log") return WarmupType::kLog;
  if (name == "linear") return WarmupType::kLinear;
  throw invalid_argument("unknown warmup_type \"{}\" (supported: log, linear)", name);
}

double lr_at(const LrScheduleConfig& c, int64_t i) {
  if (c.type == LrScheduleType::kConstant) return c.base_lr;
  const int64_t warmup = std::max<int64_t>(2, c.warmup_num_steps);
  if (i < 0) {
    // Before the first scheduler.step(): DeepSpeed returns the minimum lr (0 for cosine).
    return c.type == LrScheduleType::kWarmupCosineLR ? 0.0 : c.warmup_min_lr;
  }
  const double x = static_cast<double>(i);
  const double w = static_cast<double>(warmup);
  auto warmup_gamma = [&] {
    return c.warmup_type == WarmupType::kLog ? std::log(x + 1.0) * (1.0 / std::log(w)) : x / w;
  };
  if (c.type == LrScheduleType::kWarmupCosineLR) {
    double ratio;
    if (i < warmup) {
      ratio = c.warmup_min_ratio + warmup_gamma() * (1.0 - c.warmup_min_ratio);
    } else {
      const double real_last = static_cast<double>(i - warmup + 1);
      const double real_total = static_cast<double>(std::max<int64_t>(1, c.total_num_steps - warmup));
      const double progress = std::min(1.0, real_last / real_total);
      const double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
      ratio = std::max(0.0, c.cos_min_ratio + (1.0 - c.cos_min_ratio) * cosine);
    }
    return c.base_lr * ratio;
  }
  double gamma = 1.0;
  if (i < warmup) {
    gamma = warmup_gamma();
  } else if (c.type == LrScheduleType::kWarmupDecayLR) {
    gamma = std::max(0.0, static_cast<double>(c.total_num_steps - i) /
                              std::max(1.0, static_cast<double>(c.total_num_steps - warmup)));
  }
  return c.warmup_min_lr + (c.warmup_max_lr - c.warmup_min_lr) * gamma;
}

nlohmann::json LrScheduler::state() const {
  return nlohmann::json{{"last_batch_iteration", last_batch_iteration_}};
}

void LrScheduler::restore(const nlohmann::json& state, const std::string& where) {
  auto it = state.is_object() ? state.find("last_batch_iteration") : state.end();
  if (!state.is_object() || it == state.end() || !it->is_number_integer() ||
      it->get<int64_t>() < -1) {
    throw invalid_argument("{}.last_batch_iteration: expected an integer >= -1", where);
  }
  last_batch_iteration_ = it->get<int64_t>();
}

}  // namespace ds::rt::optim
