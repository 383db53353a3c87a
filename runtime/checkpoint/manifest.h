// A checkpoint's manifest.json: what was saved (step, optimizer steps, the resolved config, the
// data position, the LR schedule, the loss scaler, the seed) and how the shards are laid out.
//
//   layout.partitions[q] = [begin, count]: shard q (written by world rank q) holds elements
//   [begin, begin + count) of the flat layout of rank q's part (its pipeline stage's layers, its
//   tensor-parallel shard), which has layout.part_num_params[q] elements; rank q's grid position
//   follows from the sizes (layout/topology.h).
//
// Reading validates the layout's shape (sizes, counts) and throws invalid_argument naming the
// manifest and the key; whether the shards cover each part is checked by the PartReader.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ds::rt::ckpt {

struct ShardLayout {
  int world_size = 1;
  int data_parallel_size = 1;
  int tensor_parallel_size = 1;
  int context_parallel_size = 1;  // the dp x cp ranks of a (stage, tp) part share its ZeRO partitions
  int pipeline_stages = 1;
  std::string pipeline_partition;  // the stage split's name (layout/choices.h)
  int zero_stage = 0;
  int64_t num_params = 0;                        // of the whole model
  std::vector<int64_t> part_num_params;          // per shard; empty in old manifests
  std::vector<std::pair<int64_t, int64_t>> partitions;  // per shard: begin, count
  // A mixture of experts: each part's flat layout has a dense region [0, expert_begin) (the
  // ranges above) and an expert region; its experts are split over expert_parallel_size ranks
  // and each shard holds a range of its part's expert region too (offsets from expert_begin),
  // stored under the tensor names prefixed "expert_". Empty for a dense model.
  int expert_parallel_size = 1;
  std::vector<std::pair<int64_t, int64_t>> expert_partitions;  // per shard: begin, count
};

struct ManifestContent {
  int64_t step = 0;
  int64_t adam_steps = 0;
  uint64_t seed = 0;
  nlohmann::json config;        // the resolved job config (JobConfig::to_json)
  ShardLayout layout;
  nlohmann::json data;          // data::LoaderState
  nlohmann::json lr_schedule;   // optim::LrScheduler::state
  nlohmann::json loss_scaler;   // optim::LossScaler::state
  // The optimizer's scalar state beside its tensors (train/optimizer_state.h; null: none).
  nlohmann::json optimizer_state;
  // training.skip_spikes' windows (train/spike_guard.h; null: off).
  nlohmann::json spike_guard;
};

nlohmann::json manifest_json(const ManifestContent& m);

// The layout of `manifest` (read from `where`, for messages). Keys missing in older manifests
// take the values a single-layout run had: tp 1, pp 1, dp 1, ZeRO 0, the pipeline partition
// `default_partition`.
ShardLayout read_shard_layout(const nlohmann::json& manifest, const std::string& where,
                              const std::string& default_partition);

}  // namespace ds::rt::ckpt
