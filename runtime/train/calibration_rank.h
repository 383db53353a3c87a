// One launched rank of `dstrain plan --calibrate` (the CLI starts the ranks through `dstrain
// launch`: apps/dstrain/cmd_plan_calibrate.cpp). Measures what the step-time model
// (lib/plan/step_time.h) needs with the runtime's own pieces, for the config's model, any family
// (without a config, model_spec::kDefaultCalibrationShape):
//   compute      one layer's forward and backward, the embedding and the head (the one decoder,
//                model/decoder.h) at micro-batch 1, 2, 4, ... 16 (capped by the config's batch), for
//                each tp size the model splits by (its family's rules) that the node allows, while 1,
//                2, 4, ... of the node's ranks compute at once (the others wait);
//   collectives  all_reduce, reduce_scatter and all_gather at 64 KiB to 8 MiB for every group size
//                dividing the world, all groups of a size at once, and send/recv between
//                neighbours, each fitted to latency + bus bytes / bandwidth (plan/calibration.h);
//                across nodes too when there are several;
//   optimizer    the AdamW kernel's parameters/s with as many ranks at once as share the cores.
// Each figure is the fastest of a few repetitions (the least disturbed by other load on a shared
// machine), the slowest rank's. A config with training.device cuda measures one GPU: its compute
// (each piece timed to the end of its kernels), its AdamW and the pinned host -> GPU copy rate;
// more than one rank is refused (collectives over NCCL are not calibrated yet).
#pragma once

#include <string>

#include "config/job_config.h"

namespace ds::rt::train {

// Collective over the launched world (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and the
// store from the environment, as `dstrain launch` sets them). `config` may be "" (the named shape
// model_spec::kDefaultCalibrationShape, fp32); `parse` is how it is read (`dstrain plan`'s --set and
// --strict). Rank 0 writes the calibration file to `out_path`. ds::Error on bad input.
void run_calibration_rank(const std::string& config, const std::string& out_path,
                          const config::ParseOptions& parse = {});

}  // namespace ds::rt::train
