// What a run reports beside the step's own figures: the memory peaks per tag (every rank's, on
// request), the plan's prediction beside them after the first step, and the run's opening line.
#pragma once

#include <string>

#include "config/job_config.h"
#include "core/allocator.h"
#include "parallel/host_world.h"
#include "train/metrics.h"

namespace ds::rt::train {

// This rank's peaks per tag into r.peak_bytes; with `all_ranks` (collective over it) every rank's
// as r.extra["peak_bytes_<tag>_rank<q>"].
void record_memory_peaks(StepRecord& r, const MemStats& stats, parallel::HostWorld* all_ranks);
// The plan's prediction for this rank beside the measured peaks (rank 0 prints it, as Megatron-LM
// reports memory after its first iteration); planned_bytes_<tag> into r.extra.
void note_plan_beside_peaks(StepRecord& r, MetricsReporter& reporter, const config::JobConfig& cfg, int rank);
// "training <family> (L=... ): N parameters, micro-batch ..., data-parallel ... (ZeRO stage z) ...".
std::string describe_training(const config::JobConfig& cfg, int zero_stage);

}  // namespace ds::rt::train
