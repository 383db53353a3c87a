// The loss-spike guard (spike_guard.h).
#include "train/spike_guard.h"

#include <cmath>

#include <fmt/format.h>

#include "common/error.h"

namespace ds::rt::train {

double SpikeGuard::z(const std::deque<double>& w, double x) const {
  if (static_cast<int>(w.size()) < window_) return 0;
  double mean = 0;
  for (double v : w) mean += v;
  mean /= static_cast<double>(w.size());
  double var = 0;
  for (double v : w) var += (v - mean) * (v - mean);
  const double sd = std::sqrt(var / static_cast<double>(w.size()));
  return sd > 0 ? (x - mean) / sd : 0;
}

std::string SpikeGuard::judge(double loss, double grad_norm) {
  // Not finite: an fp16 overflow (its own skip) or divergence (an error), never a window value.
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) return {};
  const double zl = z(loss_, loss), zn = z(norm_, grad_norm);
  auto mean = [](const std::deque<double>& w) {
    double m = 0;
    for (double v : w) m += v;
    return m / static_cast<double>(w.size());
  };
  std::string why;
  if (zl > threshold_) {
    why = fmt::format("loss {:.4f} is {:.1f} standard deviations above the mean {:.4f} of the last {} steps", loss, zl,
                      mean(loss_), loss_.size());
  } else if (zn > threshold_) {
    why = fmt::format("gradient norm {:.4f} is {:.1f} standard deviations above the mean {:.4f} of the last {} steps",
                      grad_norm, zn, mean(norm_), norm_.size());
  }
  if (!why.empty()) {
    ++skipped_;
    return why;
  }
  loss_.push_back(loss);
  norm_.push_back(grad_norm);
  if (static_cast<int>(loss_.size()) > window_) {
    loss_.pop_front();
    norm_.pop_front();
  }
  return {};
}

nlohmann::json SpikeGuard::state() const {
  return {{"window", window_}, {"loss", loss_}, {"grad_norm", norm_}, {"skipped", skipped_}};
}

void SpikeGuard::restore(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return;  // a checkpoint written without the guard: the windows fill again
  try {
    if (j.at("window").get<int>() != window_) {
      throw invalid_argument("{}: spike_guard: the checkpoint's window is {} steps, this run's training.skip_spikes "
                             "window is {}",
                             where, j.at("window").get<int>(), window_);
    }
    const auto l = j.at("loss").get<std::deque<double>>(), n = j.at("grad_norm").get<std::deque<double>>();
    if (l.size() != n.size() || static_cast<int>(l.size()) > window_) {
      throw invalid_argument("{}: spike_guard: {} losses and {} norms for a window of {}", where, l.size(), n.size(),
                             window_);
    }
    loss_ = l;
    norm_ = n;
    skipped_ = j.at("skipped").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw invalid_argument("{}: spike_guard: {}", where, e.what());
  }
}

}  // namespace ds::rt::train
