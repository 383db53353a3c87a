// Writing and reading the manifest's content (manifest.h).
#include "checkpoint/manifest.h"

#include <limits>
#include <string>
#include <utility>

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
                 {"context_parallel_size", l.context_parallel_size},
                 {"pipeline_stages", l.pipeline_stages},
                 {"pipeline_partition", l.pipeline_partition},
                 {"zero_stage", l.zero_stage},
                 {"num_params", l.num_params},
                 {"part_num_params", l.part_num_params},
                 {"partitions", parts}};
  if (!l.expert_partitions.empty()) {
    nlohmann::json ep = nlohmann::json::array();
    for (const auto& [b, c] : l.expert_partitions) ep.push_back({b, c});
    j["layout"]["expert_parallel_size"] = l.expert_parallel_size;
    j["layout"]["expert_partitions"] = ep;
  }
  j["data"] = m.data;
  j["lr_schedule"] = m.lr_schedule;
  j["loss_scaler"] = m.loss_scaler;
  if (!m.optimizer_state.is_null()) j["optimizer_state"] = m.optimizer_state;
  if (!m.spike_guard.is_null()) j["spike_guard"] = m.spike_guard;
  j["rng"] = {{"seed", m.seed}, {"note", "initial weights and data order derive from the seed alone"}};
  return j;
}

namespace {

// The layout's own rules, each fault naming the manifest and the key: tp, pp, cp, dp >= 1 with
// dp * cp * tp * pp shards (dp, absent in old manifests, follows from the others; cp, absent in
// manifests from before context parallelism, is 1), a ZeRO stage of
// 0-3, and every partition a range inside its part's parameters.
void check_layout(ShardLayout& l, const std::string& where, bool has_dp) {
  l.world_size = static_cast<int>(l.partitions.size());
  if (l.tensor_parallel_size < 1 || l.pipeline_stages < 1 || l.context_parallel_size < 1) {
    throw invalid_argument("{}: layout.tensor_parallel_size {}, layout.context_parallel_size {} and "
                           "layout.pipeline_stages {} must be at least 1",
                           where, l.tensor_parallel_size, l.context_parallel_size, l.pipeline_stages);
  }
  const int64_t grid = static_cast<int64_t>(l.tensor_parallel_size) * l.pipeline_stages * l.context_parallel_size;
  if (l.world_size == 0 || l.world_size % grid != 0) {
    throw invalid_argument("{}: layout.partitions has {} entries, not a positive multiple of tp x cp x pp = {}", where,
                           l.world_size, grid);
  }
  if (!has_dp) l.data_parallel_size = static_cast<int>(l.world_size / grid);
  if (l.data_parallel_size < 1 || l.data_parallel_size * grid != l.world_size) {
    throw invalid_argument("{}: layout.data_parallel_size {} x tp x cp x pp {} is not the {} shards of "
                           "layout.partitions",
                           where, l.data_parallel_size, grid, l.world_size);
  }
  if (l.zero_stage < 0 || l.zero_stage > 3) {
    throw invalid_argument("{}: layout.zero_stage {} is not 0-3", where, l.zero_stage);
  }
  if (!l.part_num_params.empty() && l.part_num_params.size() != l.partitions.size()) {
    throw invalid_argument("{}: layout.part_num_params has {} entries but layout.partitions {}", where,
                           l.part_num_params.size(), l.partitions.size());
  }
  if (l.num_params < 0) throw invalid_argument("{}: layout.num_params {} is negative", where, l.num_params);
  if (!l.expert_partitions.empty() && l.expert_partitions.size() != l.partitions.size()) {
    throw invalid_argument("{}: layout.expert_partitions has {} entries but layout.partitions {}", where,
                           l.expert_partitions.size(), l.partitions.size());
  }
  const int64_t dpcp = static_cast<int64_t>(l.data_parallel_size) * l.context_parallel_size;
  if (l.expert_parallel_size < 1 || dpcp % l.expert_parallel_size != 0) {
    throw invalid_argument("{}: layout.expert_parallel_size {} does not divide the {} data-parallel x "
                           "context-parallel ranks",
                           where, l.expert_parallel_size, dpcp);
  }
  for (size_t q = 0; q < l.partitions.size(); ++q) {
    const int64_t part = l.part_num_params.empty() ? l.num_params : l.part_num_params[q];
    const auto [begin, count] = l.partitions[q];
    if (part < 0 || begin < 0 || count < 0 || begin > part || count > part - begin) {
      throw invalid_argument("{}: layout.partitions[{}] = [{}, {}] is not a range inside its part's {} parameters",
                             where, q, begin, count, part);
    }
  }
}

// An integer of the manifest: a JSON integer (not a float, which nlohmann would cast, undefined
// beyond the range) within [lo, hi], else invalid_argument naming `where` and the key.
int64_t as_int(const nlohmann::json& v, const std::string& where, const std::string& key, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) throw invalid_argument("{}: {} must be an integer, got {}", where, key, v.dump());
  const bool too_big = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi);
  if (too_big || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
    throw invalid_argument("{}: {} must lie in [{}, {}], got {}", where, key, lo, hi, v.dump());
  }
  return v.get<int64_t>();
}
int64_t int_field(const nlohmann::json& lay, const char* key, int64_t def, const std::string& where, int64_t lo,
                  int64_t hi) {
  return lay.contains(key) ? as_int(lay[key], where, std::string("layout.") + key, lo, hi) : def;
}
std::pair<int64_t, int64_t> range_of(const nlohmann::json& p, const std::string& where, const std::string& key) {
  if (!p.is_array() || p.size() != 2) throw invalid_argument("{}: {} must be [begin, count], got {}", where, key, p.dump());
  const int64_t big = std::numeric_limits<int64_t>::max() / 2;
  return {as_int(p[0], where, key, -big, big), as_int(p[1], where, key, -big, big)};
}

}  // namespace

ShardLayout read_shard_layout(const nlohmann::json& manifest, const std::string& where,
                              const std::string& default_partition) {
  ShardLayout l;
  bool lay_has_dp = false;
  try {
    const auto& lay = manifest.at("layout");
    // Ranges only where a cast could overflow; check_layout below states the rules.
    const int64_t big = std::numeric_limits<int64_t>::max() / 2, imax = std::numeric_limits<int>::max();
    l.num_params = as_int(lay.at("num_params"), where, "layout.num_params", -big, big);
    l.tensor_parallel_size = static_cast<int>(int_field(lay, "tensor_parallel_size", 1, where, -imax, imax));
    l.pipeline_stages = static_cast<int>(int_field(lay, "pipeline_stages", 1, where, -imax, imax));
    l.context_parallel_size = static_cast<int>(int_field(lay, "context_parallel_size", 1, where, -imax, imax));
    lay_has_dp = lay.contains("data_parallel_size");
    l.data_parallel_size = static_cast<int>(int_field(lay, "data_parallel_size", 1, where, -imax, imax));
    l.pipeline_partition = lay.value("pipeline_partition", default_partition);
    l.zero_stage = static_cast<int>(int_field(lay, "zero_stage", 0, where, -imax, imax));
    for (const auto& p : lay.at("partitions")) l.partitions.push_back(range_of(p, where, "layout.partitions"));
    if (lay.contains("part_num_params")) {
      for (const auto& n : lay["part_num_params"]) {
        l.part_num_params.push_back(as_int(n, where, "layout.part_num_params", -big, big));
      }
    }
    l.expert_parallel_size = static_cast<int>(int_field(lay, "expert_parallel_size", 1, where, -imax, imax));
    if (lay.contains("expert_partitions")) {
      for (const auto& p : lay.at("expert_partitions")) {
        l.expert_partitions.push_back(range_of(p, where, "layout.expert_partitions"));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw invalid_argument("{}: corrupt checkpoint manifest: {}", where, e.what());
  }
  check_layout(l, where, lay_has_dp);
  return l;
}

}  // namespace ds::rt::ckpt
