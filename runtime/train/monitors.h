// DeepSpeed's monitors: the step's scalars written where TensorBoard (`tensorboard`) and
// spreadsheets (`csv_monitor`) read them, by rank 0, under output_path/job_name.
//
// Tags are DeepSpeed's (Train/Samples/train_loss, Train/Samples/lr, Train/Samples/loss_scale with
// fp16, and with wall_clock_breakdown Train/Samples/elapsed_time_ms_{forward, backward,
// backward_inner, backward_allreduce, step}) plus ours under the same prefix: grad_norm,
// tokens_per_s, tflops, mfu, val_loss (at evaluation steps) and peak_bytes_<tag>. The step of every
// value is the sample count, as DeepSpeed's: step x train_batch_size after that step. Each
// value is the same number --metrics writes (TensorBoard stores it as a float).
//
//   tensorboard   one event file per run, events.out.tfevents.<time>.<host>.<pid> (tfevents.h),
//                 one Event per step with every scalar, flushed each step
//   csv_monitor   DeepSpeed's layout: one file per tag, the tag with '/' and ' ' as '_' plus .csv
//                 (Train_Samples_train_loss.csv), a header "step,<last part of the tag>", then
//                 "samples,value" rows; truncated on a fresh run, appended to on resume
//
// Failures: a directory that cannot be created or a file that cannot be opened at start-up is an
// error naming the config key and the path (open_monitors throws), so a typo never trains for
// hours without its curves. A write that fails later (a full disk) makes that monitor warn once
// and stop (MetricsReporter); training continues.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/job_config.h"
#include "train/metrics.h"

namespace ds::rt::train {

struct Scalar {
  std::string tag;
  double value = 0;
};

// The scalars of one step's record, in a fixed order.
std::vector<Scalar> monitor_scalars(const StepRecord& r, bool fp16);

class Monitor {
 public:
  virtual ~Monitor() = default;
  // "tensorboard event file <path>", for messages.
  virtual std::string what() const = 0;
  // Writes one step's scalars at `samples`; throws ds::Error (kSystem) when the write fails.
  virtual void write(int64_t samples, const std::vector<Scalar>& scalars) = 0;
};

// The monitors the config enables (rank 0 calls it; others write nothing). `resume`: append to
// the CSV files. Throws ds::Error naming the config key and path when a directory or file cannot
// be created.
std::vector<std::unique_ptr<Monitor>> open_monitors(const config::JobConfig& cfg, bool resume);

}  // namespace ds::rt::train
