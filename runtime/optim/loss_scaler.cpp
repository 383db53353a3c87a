// DeepSpeed's dynamic loss scaling, step by step as loss_scaler.h describes it.
#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace ds::rt::optim {

LossScaler::LossScaler(const LossScalerConfig& config) : config_(config) {
  if (!config.enabled) {
    cur_scale_ = 1;
    return;
  }
  if (!(config.loss_scale >= 0) || !std::isfinite(config.loss_scale)) {
    throw invalid_argument("loss_scale must be 0 (dynamic) or a positive static scale, got {}",
                           config.loss_scale);
  }
  if (config.loss_scale > 0) {
    cur_scale_ = config.loss_scale;
    return;
  }
  if (config.loss_scale_window < 1) {
    throw invalid_argument("loss_scale_window must be at least 1, got {}",
                           config.loss_scale_window);
  }
  if (config.hysteresis < 1) {
    throw invalid_argument("hysteresis must be at least 1, got {}", config.hysteresis);
  }
  if (!(config.min_loss_scale > 0) || !std::isfinite(config.min_loss_scale)) {
    throw invalid_argument("min_loss_scale must be positive, got {}", config.min_loss_scale);
  }
  dynamic_ = true;
  cur_scale_ = std::ldexp(1.0, config.initial_scale_power);
  if (cur_scale_ < config.min_loss_scale) {
    throw invalid_argument("the initial scale 2^{} is below min_loss_scale {}",
                           config.initial_scale_power, config.min_loss_scale);
  }
  cur_hysteresis_ = config.hysteresis;
}

bool LossScaler::update(bool overflow) {
  if (!dynamic_) {
    ++cur_iter_;
    return config_.enabled && overflow;  // static: skip the step; disabled: the caller decides
  }
  if (overflow) {
    if (config_.hysteresis == 1 || cur_hysteresis_ == 1) {
      if (cur_scale_ == config_.min_loss_scale && config_.raise_error_at_min_scale) {
        throw Error(ErrorKind::kInvalidUsage,
                    fmt::format("fp16 loss scale is already at min_loss_scale {} and the "
                                "gradients still overflow at iteration {}",
                                config_.min_loss_scale, cur_iter_),
                    "the model diverged in fp16: lower the learning rate, use bf16, or lower "
                    "fp16.min_loss_scale");
      }
      cur_scale_ = std::max(cur_scale_ / 2.0, config_.min_loss_scale);
    } else {
      --cur_hysteresis_;
    }
    last_overflow_iter_ = cur_iter_;
  } else {
    if (config_.consecutive_hysteresis) cur_hysteresis_ = config_.hysteresis;
    const int64_t stable = cur_iter_ - last_overflow_iter_ - 1;
    if (stable > 0 && stable % config_.loss_scale_window == 0) {
      if (!config_.consecutive_hysteresis) cur_hysteresis_ = config_.hysteresis;
      cur_scale_ *= 2.0;
    }
  }
  ++cur_iter_;
  return overflow;
}

nlohmann::json LossScaler::state() const {
  return nlohmann::json{{"cur_scale", cur_scale_},
                        {"cur_iter", cur_iter_},
                        {"last_overflow_iter", last_overflow_iter_},
                        {"cur_hysteresis", cur_hysteresis_}};
}

void LossScaler::restore(const nlohmann::json& state, const std::string& where) {
  if (!state.is_object()) throw invalid_argument("{}: expected an object", where);
  auto get = [&](const char* key, bool integer) -> const nlohmann::json& {
    auto it = state.find(key);
    if (it == state.end() || !(integer ? it->is_number_integer() : it->is_number())) {
      throw invalid_argument("{}.{}: expected {}", where, key, integer ? "an integer" : "a number");
    }
    return *it;
  };
  const double scale = get("cur_scale", false).get<double>();
  if (!(scale > 0) || !std::isfinite(scale)) {
    throw invalid_argument("{}.cur_scale: expected a positive number, got {}", where, scale);
  }
  cur_scale_ = scale;
  cur_iter_ = get("cur_iter", true).get<int64_t>();
  last_overflow_iter_ = get("last_overflow_iter", true).get<int64_t>();
  cur_hysteresis_ = get("cur_hysteresis", true).get<int64_t>();
}

}  // namespace ds::rt::optim
