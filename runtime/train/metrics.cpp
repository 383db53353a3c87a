#include "train/metrics.h"

#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "common/error.h"
#include "common/strings.h"
#include "train/monitors.h"

namespace ds::rt::train {

MetricsReporter::MetricsReporter(bool enabled, const std::string& metrics_path, bool append,
                                 int log_interval)
    : enabled_(enabled), log_interval_(log_interval > 0 ? log_interval : 1),
      tty_(::isatty(STDOUT_FILENO) == 1) {
  path_ = metrics_path;
  if (enabled_ && !metrics_path.empty()) {
    file_ = std::fopen(metrics_path.c_str(), append ? "a" : "w");
    if (!file_) throw system_error("cannot open metrics file {}: {}", metrics_path, errno_string(errno));
  }
}

MetricsReporter::~MetricsReporter() {
  if (file_) std::fclose(file_);
  if (bar_shown_) std::fputs("\n", stdout);
}

void MetricsReporter::note(const std::string& line) {
  if (!enabled_) return;
  if (bar_shown_) {
    std::fputs("\r\033[K", stdout);
    bar_shown_ = false;
  }
  std::fprintf(stdout, "%s\n", line.c_str());
  std::fflush(stdout);
}

void MetricsReporter::add_monitors(std::vector<std::unique_ptr<Monitor>> monitors, int64_t samples_per_step,
                                   bool fp16) {
  if (!enabled_) return;
  for (auto& m : monitors) monitors_.push_back(std::move(m));
  samples_per_step_ = samples_per_step;
  fp16_ = fp16;
}

void MetricsReporter::write_monitors(const StepRecord& r) {
  if (monitors_.empty()) return;
  const auto scalars = monitor_scalars(r, fp16_);
  for (auto it = monitors_.begin(); it != monitors_.end();) {
    try {
      (*it)->write(r.step * samples_per_step_, scalars);
      ++it;
    } catch (const Error& e) {
      note(fmt::format("warning: {}; training continues without the {}", e.what(), (*it)->what()));
      it = monitors_.erase(it);
    }
  }
}

void MetricsReporter::report(const StepRecord& r) {
  if (!enabled_) return;
  write_monitors(r);
  if (file_) {
    nlohmann::ordered_json j;
    j["step"] = r.step;
    j["loss"] = r.loss;
    if (r.aux_loss) j["aux_loss"] = *r.aux_loss;
    j["lr"] = r.lr;
    j["grad_norm"] = r.grad_norm;
    j["loss_scale"] = r.loss_scale;
    j["skipped"] = r.skipped;
    j["tokens_per_s"] = r.tokens_per_s;
    j["ms_per_step"] = r.ms_per_step;
    j["tflops"] = r.tflops;
    if (r.mfu) j["mfu"] = *r.mfu;
    if (r.breakdown) breakdown_to_json(*r.breakdown, j);
    for (const auto& [tag, bytes] : r.peak_bytes) j["peak_bytes_" + tag] = bytes;
    if (r.val_loss) j["val_loss"] = *r.val_loss;
    for (const auto& [k, v] : r.extra.items()) j[k] = v;
    const std::string line = j.dump() + "\n";
    // A metrics file that cannot be written (a full disk) warns once; training goes on.
    const bool written = std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
    if (!written && !write_failed_) {
      write_failed_ = true;
      note(fmt::format("warning: cannot write the metrics file {}: {}; training continues without it", path_,
                       errno_string(errno)));
    }
  }
  bool line = r.step == 1 || r.step == r.total_steps || r.step % log_interval_ == 0 || r.val_loss;
  if (line) {
    auto peak = r.peak_bytes.find("total");
    std::string text = fmt::format(
        "step {:>{}}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.4f} | scale {:g}{} | {:.0f} tok/s | "
        "{:.1f} ms | {:.3g} TFLOP/s{} | peak {}",
        r.step, std::to_string(r.total_steps).size(), r.total_steps, r.loss, r.lr, r.grad_norm,
        r.loss_scale, r.skipped ? " (skipped)" : "", r.tokens_per_s, r.ms_per_step, r.tflops,
        r.mfu ? fmt::format(" | MFU {:.2f}%", *r.mfu * 100) : std::string(),
        peak == r.peak_bytes.end() ? std::string("-") : format_bytes(static_cast<double>(peak->second)));
    if (r.aux_loss) text.insert(text.find(" | lr "), fmt::format(" | aux loss {:.4f}", *r.aux_loss));
    if (r.val_loss) text += fmt::format(" | val loss {:.4f}", *r.val_loss);
    note(text);
    if (r.breakdown) note("  " + breakdown_line(*r.breakdown));
  }
  if (tty_ && r.step < r.total_steps) {
    const int width = 30;
    int filled = static_cast<int>(width * r.step / std::max<int64_t>(1, r.total_steps));
    double eta_s = r.ms_per_step * static_cast<double>(r.total_steps - r.step) / 1000.0;
    std::fprintf(stdout, "\r\033[K[%s%s] %lld/%lld  ETA %dm%02ds", std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), static_cast<long long>(r.step),
                 static_cast<long long>(r.total_steps), static_cast<int>(eta_s) / 60,
                 static_cast<int>(eta_s) % 60);
    std::fflush(stdout);
    bar_shown_ = true;
  }
}

}  // namespace ds::rt::train
