// What a training run reports: one record per step, printed as a console line (and a progress
// bar with ETA when stdout is a terminal) and appended as one JSON object per line to --metrics.
// Only the reporting rank (rank 0) writes; other ranks construct a silent reporter. A metrics file
// that stops accepting writes (a full disk) is warned about once; training continues. The
// reporter also feeds DeepSpeed's monitors (monitors.h: TensorBoard, CSV).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/step_clock.h"

namespace ds::rt::train {

struct StepRecord {
  int64_t step = 0;           // 1-based step number
  int64_t total_steps = 0;
  double loss = 0;            // mean loss of this step's forward passes (before the update)
  // A mixture of experts' load-balancing loss (the mean over the micro-batches, each over its
  // layers' routers), reported beside the cross-entropy `loss`; none for a dense model.
  std::optional<double> aux_loss;
  double lr = 0;
  double grad_norm = 0;       // global norm before clipping
  double loss_scale = 1;      // 1 without fp16
  bool skipped = false;       // fp16 overflow: the update was skipped
  double tokens_per_s = 0;
  double ms_per_step = 0;
  double tflops = 0;           // achieved model TFLOP/s per rank (throughput.h)
  std::optional<double> mfu;   // tflops over the peak per rank; none when the peak is unknown
  std::optional<StepBreakdown> breakdown;  // with wall_clock_breakdown
  std::map<std::string, int64_t> peak_bytes;  // tag -> bytes ("params", ..., "total")
  std::optional<double> val_loss;
  nlohmann::ordered_json extra;  // more fields for the metrics file (e.g. planned bytes)
};

class Monitor;  // monitors.h

class MetricsReporter {
 public:
  // `metrics_path` empty: no file. `enabled` false: prints and writes nothing (non-zero ranks).
  // The file is opened for append when resuming, truncated otherwise.
  MetricsReporter(bool enabled, const std::string& metrics_path, bool append, int log_interval);
  ~MetricsReporter();
  MetricsReporter(const MetricsReporter&) = delete;
  MetricsReporter& operator=(const MetricsReporter&) = delete;

  // Records one step: always to the metrics file; to the console every log_interval steps, at the
  // first and the last step, and whenever there is a validation loss.
  void report(const StepRecord& r);
  // A free-form line to the console (rank 0 only), e.g. the plan beside the measured peak.
  void note(const std::string& line);
  // Monitors (monitors.h) that get every reported step's scalars at step x samples_per_step; one
  // whose write fails warns once and is dropped, and training continues.
  void add_monitors(std::vector<std::unique_ptr<Monitor>> monitors, int64_t samples_per_step, bool fp16);

 private:
  bool enabled_;
  std::string path_;
  FILE* file_ = nullptr;
  bool write_failed_ = false;  // warned once
  int log_interval_;
  bool tty_;
  bool bar_shown_ = false;
  std::vector<std::unique_ptr<Monitor>> monitors_;
  int64_t samples_per_step_ = 0;
  bool fp16_ = false;
  void write_monitors(const StepRecord& r);
};

}  // namespace ds::rt::train
