// From a validated job config (lib/config/job_config.h) to the memory model's inputs: the model
// spec's shape and the layout. The only file of the plan that reads the config's fields
// (plan_inputs.h loads the file for `dstrain plan`).
// Pure; throws ds::Error (invalid argument) naming the config key when the config cannot be
// planned (no model section, an unknown schedule or partition).
//
// Also the trainer's view of the plan: predicted_rank_memory (what the plan says one world rank
// of this job allocates) and describe_prediction (the plan beside the allocator's measured peaks,
// tag by tag, for the trainer's log at its first logged step, as Megatron-LM logs its memory
// report). The trainer links ds_plan; ds_plan never links runtime/.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "config/job_config.h"
#include "model_spec/shape.h"
#include "plan/memory_model.h"

namespace ds::plan {

struct PlanInput {
  model_spec::ModelShape shape;
  Layout layout;
  // The gradients' type, what ZeRO's reductions move (JobConfig::gradient_dtype(): the storage
  // type, or fp32 by data_types.grad_accum_dtype / communication_data_type). The step-time model
  // counts their bytes by it.
  Precision grad_precision = Precision::kFp32;
};

PlanInput plan_input_from_config(const config::JobConfig& c);

// The plan's peak bytes per tag for world rank `world_rank` of the job `c` (validated for its
// world size, c.world_size ranks), whose ranks run `num_threads` CPU threads each (the runtime
// sizes attention scratch by omp_get_max_threads(): pass that). Throws what
// plan_input_from_config and plan_memory throw, and invalid_argument naming the rank when it lies
// outside [0, c.world_size) or num_threads < 1.
RankMemory predicted_rank_memory(const config::JobConfig& c, int world_rank, int num_threads);

// The allocator's tag names, as the trainer's metrics key them: "params", "grads", "optimizer",
// "activations", "comm", "workspace", "checkpoint" (an async checkpoint's staging), then "total", then "pinned_host" (what a GPU run offloads
// to pinned host memory, counted apart and not in "total").
inline constexpr const char* kTagNames[] = {"params",     "grads", "optimizer",  "activations", "comm",
                                            "workspace", "checkpoint", "total", "pinned_host"};
// `r`'s bytes under those names ("total" = the sum of the device tags, "pinned_host" = r.cpu).
std::map<std::string, int64_t> tag_bytes(const RankMemory& r);

// The relative difference of a measurement from the plan: (measured - planned) / planned; 0 when
// both are 0; +infinity when only the plan is 0.
double relative_difference(int64_t planned, int64_t measured);

// The plan beside the measured peaks, a header and one aligned line per tag and the total:
//   memory of rank 3 (stage 1, layers 4-7, tp rank 0, dp rank 1): plan vs measured peak
//     params             1.23 MiB     1.23 MiB    +0.00%
//     ...
//     total             12.00 MiB    12.10 MiB    +0.83%
// `measured` is keyed by kTagNames (the trainer's StepRecord::peak_bytes); a tag it lacks reads
// "?" on its line. Lines end in '\n'. Pure.
std::string describe_prediction(const RankMemory& planned,
                                const std::map<std::string, int64_t>& measured);

}  // namespace ds::plan
