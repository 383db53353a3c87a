// Saving and resuming a run's checkpoints (runtime/checkpoint has the files; this is the run's
// side). A checkpoint is collective, in phases the host world orders (HostWorld::in_phases):
//   1. every rank's partition record (begin, count, its part's size) is gathered;
//   2. rank 0 creates the temporary step directory; barrier;
//   3. every rank writes its shard: params, master (bf16/fp16), exp_avg, exp_avg_sq of its
//      partition (host copies of device buffers); barrier;
//   4. rank 0 writes the manifest and commits (rename, `latest`, pruning); barrier.
// Resuming reads this rank's part through a PartReader (any data-parallel size and ZeRO stage,
// and, by resharding, any tensor-parallel size, pipeline split or partition method), then
// restores the optimizer step count, the data position, the LR schedule and the loss scaler.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/job_config.h"
#include "data/loader.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "parallel/engine.h"
#include "train/optimizer_state.h"
#include "train/spike_guard.h"

namespace ds::rt::train {

// What a checkpoint holds besides the files' layout.
struct CheckpointedRun {
  const config::JobConfig& cfg;
  parallel::Engine& engine;
  OptimizerState& state;
  OptimizerState* expert_state;  // a mixture of experts: the expert region's (null otherwise)
  data::BatchReader& loader;  // one corpus (data/loader.h) or a weighted blend (data/blend.h)
  optim::LrScheduler& schedule;
  optim::LossScaler& scaler;
  SpikeGuard* spikes = nullptr;  // training.skip_spikes (null: off)
};

// Collective: writes the checkpoint of `step` under training.checkpoint_dir.
void save_checkpoint(CheckpointedRun& run, int64_t step);

// The pieces a checkpoint is made of, shared by save_checkpoint and the async writer
// (async_checkpoint.h) so both write the same bytes.
// One tensor of this rank's shard, in file order: its name, its source (the model's device) and
// its element count.
struct ShardTensor {
  std::string name;
  TypedPtr src;
  int64_t n = 0;
};
std::vector<ShardTensor> shard_tensors(CheckpointedRun& run);
// Collective over the host world: every rank's partition records (the manifest's layout).
std::vector<int64_t> gather_partition_records(CheckpointedRun& run);
// The manifest of `step` as of now (data position, LR schedule, loss scaler, optimizer scalars,
// spike guard), before commit_checkpoint adds its checksum.
nlohmann::json checkpoint_manifest(CheckpointedRun& run, int64_t step, const std::vector<int64_t>& records);

// Loads checkpoint directory `dir` into the run; returns the step to continue at. Throws
// invalid_argument naming the manifest for a checkpoint of another model or precision.
int64_t load_checkpoint(CheckpointedRun& run, const std::string& dir);

}  // namespace ds::rt::train
