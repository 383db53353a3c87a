// train_micro_batch_size_per_gpu "auto" on the command line: the flags that feed the pick
// (--gpu-mem, --calibration) for `train` and `config check`, and the resolution every command that
// reads a job config runs before the rest (`plan` passes its own flags of the same names). The pick
// itself is the planner's (lib/plan/auto_micro_batch.h); this file finds what it needs on this
// machine: the memory per rank and the calibration file.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "config/job_config.h"

namespace ds::cli {

struct AutoBatchFlags {
  std::string gpu_mem;      // --gpu-mem SIZE ("" = the GPUs found, or host memory on a CPU run)
  std::string calibration;  // --calibration FILE ("" = the largest micro-batch that fits)
};

// Binds --gpu-mem and --calibration on `sub`.
void add_auto_batch_flags(CLI::App* sub, AutoBatchFlags& f);

// Resolves a pending micro-batch "auto" of `cfg` (nothing else when none is pending): the memory
// per rank is --gpu-mem, else on a "cuda" run the smallest GPU found, else this machine's physical
// memory divided by `ranks_per_node` (the ranks sharing it); `ranks_per_node` is also the
// calibrated machine's node size; `threads` the CPU threads per rank. The pick's notes land in
// cfg.warnings. Throws what plan::resolve_auto_micro_batch and the calibration reader throw.
void resolve_auto_batch(config::JobConfig& cfg, const AutoBatchFlags& f, int ranks_per_node, int threads);

}  // namespace ds::cli
