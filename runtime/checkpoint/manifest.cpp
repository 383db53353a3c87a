// Writing and reading the manifest's content (manifest.h).
#include "checkpoint/manifest.h"

#include "common/error.h"

namespace ds::rt::ckpt {

nlohmann::json manifest_json(const ManifestContent& m) {
  nlohmann::json j;
  j["format"] = "dstrain-checkpoint-1";
  j["step"] = m.step;
  j["adam_steps"] = m.adam_steps;
  j["config"] = m.config;
  nlohmann::json parts = nlohmann::json::array();
  for (const auto& [b, c] : m.layout.partitions) parts.push_back({b, c});
  const auto& l = m.layout;
  j["layout"] = {{"world_size", l.world_size},
                 {"data_parallel_size", l.data_parallel_size},
                 {"tensor_parallel_size", l.tensor_parallel_size},
                 {"pipeline_stages", l.pipeline_stages},
                 {"pipeline_partition", l.pipeline_partition},
                 {"zero_stage", l.zero_stage},
                 {"num_params", l.num_params},
                 {"part_num_params", l.part_num_params},
                 {"partitions", parts}};
  j["data"] = m.data;
  j["lr_schedule"] = m.lr_schedule;
  j["loss_scaler"] = m.loss_scaler;
  j["rng"] = {{"seed", m.seed}, {"note", "initial weights and data order derive from the seed alone"}};
  return j;
}

ShardLayout read_shard_layout(const nlohmann::json& manifest, const std::string& where,
                              const std::string& default_partition) {
  ShardLayout l;
  try {
    const auto& lay = manifest.at("layout");
    l.num_params = lay.at("num_params").get<int64_t>();
    l.tensor_parallel_size = lay.value("tensor_parallel_size", 1);
    l.pipeline_stages = lay.value("pipeline_stages", 1);
    l.data_parallel_size = lay.value("data_parallel_size", 1);
    l.pipeline_partition = lay.value("pipeline_partition", default_partition);
    l.zero_stage = lay.value("zero_stage", 0);
    for (const auto& p : lay.at("partitions")) l.partitions.emplace_back(p.at(0).get<int64_t>(), p.at(1).get<int64_t>());
    if (lay.contains("part_num_params")) l.part_num_params = lay["part_num_params"].get<std::vector<int64_t>>();
  } catch (const nlohmann::json::exception& e) {
    throw invalid_argument("{}: corrupt checkpoint manifest: {}", where, e.what());
  }
  l.world_size = static_cast<int>(l.partitions.size());
  const int grid = l.tensor_parallel_size * l.pipeline_stages;
  if (l.tensor_parallel_size < 1 || l.pipeline_stages < 1 || l.world_size % grid != 0) {
    throw invalid_argument("{}: layout.partitions has {} entries, not a multiple of tp x pp = {}", where,
                           l.world_size, grid);
  }
  if (!l.part_num_params.empty() && l.part_num_params.size() != l.partitions.size()) {
    throw invalid_argument("{}: layout.part_num_params has {} entries but layout.partitions {}", where,
                           l.part_num_params.size(), l.partitions.size());
  }
  return l;
}

}  // namespace ds::rt::ckpt
