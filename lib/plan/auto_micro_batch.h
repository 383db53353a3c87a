// train_micro_batch_size_per_gpu "auto" (docs/configuration.md, "auto"; docs/planning.md): the
// micro-batch the planner picks when the run starts, for the layout the config gives (tp, pp, dp,
// cp, ZeRO, checkpointing, offload all fixed; only the micro-batch varies, and with it
// gradient_accumulation_steps or train_batch_size as the batch triad derives them).
//
// The candidates are config::auto_micro_batch_candidates(): the divisors of train_batch_size / dp
// when the file fixes train_batch_size, else the powers of two up to 1024. Each one's peak is the
// plan's (plan_memory over plan_input_from_config, the same as `dstrain plan --config` prints at
// that micro-batch), held to the memory the plan sees per rank. Among those that fit:
//   - with a calibration (`dstrain plan --calibrate`'s file): the fastest by the step-time model
//     (step_time.h) per sequence, i.e. per step when train_batch_size is fixed; ties go to the
//     smaller micro-batch;
//   - without one: the largest.
// Pure; no I/O (the caller reads the calibration file and finds the memory).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/job_config.h"
#include "plan/step_time.h"

namespace ds::plan {

struct AutoMicroBatchRequest {
  int64_t memory_bytes = 0;   // per rank; > 0
  std::string memory_source;  // for the reason: "--gpu-mem", "host memory / 2 ranks", ...
  const Calibration* calibration = nullptr;  // null: the largest that fits
  int threads = 1;            // CPU threads per rank (attention scratch is per thread)
};

// One candidate as the plan sees it.
struct MicroBatchTrial {
  int64_t micro_batch = 0, accumulation = 0;
  int64_t peak_bytes = 0;  // the plan's peak rank
  bool fits = false;
  double step_s = 0;       // predicted step time (calibrated requests only)
  double sequence_s = 0;   // step_s / sequences per step
};

struct AutoMicroBatchPick {
  int64_t micro_batch = 0;
  std::string reason;  // one line, e.g. "largest that fits: 8 (peak 10.2 GiB of 80.0 GiB, --gpu-mem); 16 needs 21.3 GiB"
  std::vector<MicroBatchTrial> trials;  // every candidate, ascending
};

// The config `c` (its micro-batch "auto" pending) at micro-batch `micro_batch`: a copy with the
// triad resolved by config::set_auto_micro_batch.
config::JobConfig config_at_micro_batch(const config::JobConfig& c, int64_t micro_batch);

// Picks as above. Throws config::ConfigError naming $.train_micro_batch_size_per_gpu, the smallest
// candidate's peak and the limit when none fits; ds::Error (invalid argument) when nothing is
// pending, the config has no model section, or memory_bytes <= 0.
AutoMicroBatchPick pick_micro_batch(const config::JobConfig& c, const AutoMicroBatchRequest& r);

// pick_micro_batch, then config::set_auto_micro_batch(c, pick, reason) (which adds the notes to
// c.warnings). Returns the pick.
AutoMicroBatchPick resolve_auto_micro_batch(config::JobConfig& c, const AutoMicroBatchRequest& r);

}  // namespace ds::plan
