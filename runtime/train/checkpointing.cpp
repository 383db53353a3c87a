// A run's checkpoints (checkpointing.h).
#include "train/checkpointing.h"

#include <filesystem>
#include <vector>

#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/manifest.h"
#include "checkpoint/part_reader.h"
#include "checkpoint/shard_file.h"
#include "common/error.h"
#include "kernels/dispatch.h"

namespace ds::rt::train {

namespace ms = ds::model_spec;

namespace {

// n elements of a typed buffer on the model's device, as host bytes.
std::vector<char> to_host(TypedPtr src, int64_t n) {
  std::vector<char> h(src.bytes(n));
  kern::copy_to_host(h.data(), src.data, h.size());
  return h;
}

// What a checkpoint holds of a part: all of it, or a LoRA run's adapters (its frozen base is
// loaded from model.init_from at every start).
int64_t trained_numel(const Model& m) { return m.num_params() - (m.shape().lora.on() ? m.layout().adapter_begin : 0); }
TypedPtr trained_params(Model& m) { return m.params() + (m.shape().lora.on() ? m.layout().adapter_begin : 0); }

// Per rank: its dense partition (begin, count), its part's size, its expert partition (begin,
// count; 0 without experts).
constexpr size_t kRecords = 5;

ckpt::ShardLayout shard_layout(CheckpointedRun& run, const std::vector<int64_t>& records) {
  const auto& cfg = run.cfg;
  ckpt::ShardLayout l;
  l.world_size = cfg.world_size;
  l.data_parallel_size = cfg.data_parallel_size;
  l.tensor_parallel_size = cfg.tensor_parallel.size;
  l.context_parallel_size = cfg.context_parallel.size;
  l.pipeline_stages = cfg.pipeline.stages;
  l.pipeline_partition = layout::stage_split_name(cfg.pipeline.partition);
  l.zero_stage = cfg.zero.stage;
  l.num_params = ms::param_count(run.engine.model().shape());
  for (size_t q = 0; q < static_cast<size_t>(cfg.world_size); ++q) {
    l.partitions.emplace_back(records[kRecords * q], records[kRecords * q + 1]);
    l.part_num_params.push_back(records[kRecords * q + 2]);
    if (run.expert_state != nullptr) l.expert_partitions.emplace_back(records[kRecords * q + 3], records[kRecords * q + 4]);
  }
  l.expert_parallel_size = cfg.expert_parallel.size;
  return l;
}

}  // namespace

std::vector<ShardTensor> shard_tensors(CheckpointedRun& run) {
  std::vector<ShardTensor> out;
  // The dense region's partition, and the expert region's under "expert_" names.
  auto add_state = [&](OptimizerState& s, const std::string& prefix) {
    const int64_t n = s.part_count();
    out.push_back({prefix + "params", s.partition_params(), n});
    if (s.precision() != layout::Precision::kFp32) out.push_back({prefix + "master", s.partition_of(s.master()), n});
    for (const auto& [name, buf] : s.moments()) out.push_back({prefix + name, s.partition_of(buf), n});
  };
  add_state(run.state, "");
  if (run.expert_state != nullptr) add_state(*run.expert_state, "expert_");
  return out;
}

std::vector<int64_t> gather_partition_records(CheckpointedRun& run) {
  OptimizerState& st = run.state;
  OptimizerState* es = run.expert_state;
  return run.engine.host_world().gather_int64({st.part_begin(), st.part_count(), trained_numel(run.engine.model()),
                                               es ? es->part_begin() : 0, es ? es->part_count() : 0});
}

nlohmann::json checkpoint_manifest(CheckpointedRun& run, int64_t step, const std::vector<int64_t>& records) {
  ckpt::ManifestContent m;
  m.step = step;
  m.adam_steps = run.state.adam_steps();
  m.seed = run.cfg.training.seed;
  m.config = run.cfg.to_json();
  m.layout = shard_layout(run, records);
  m.data = run.loader.state_json();
  m.lr_schedule = run.schedule.state();
  m.loss_scaler = run.scaler.state();
  m.optimizer_state = run.state.scalar_state();
  if (run.spikes != nullptr) m.spike_guard = run.spikes->state();
  return ckpt::manifest_json(m);
}

void save_checkpoint(CheckpointedRun& run, int64_t step) {
  auto& world = run.engine.host_world();
  const auto& root = run.cfg.training.checkpoint_dir;
  const auto records = gather_partition_records(run);
  auto write_shard = [&] {
    const std::string tmp = (std::filesystem::path(root) / (".tmp-" + ckpt::step_dir_name(step))).string();
    ckpt::ShardWriter w;
    // On a GPU, host copies of the partition's tensors; on the CPU the writer reads them where
    // they lie (a copy would first-touch the shard's size of fresh memory at every checkpoint).
    std::vector<std::vector<char>> host;
    const auto tensors = shard_tensors(run);
    host.reserve(tensors.size());
    for (const ShardTensor& t : tensors) {
      const void* data = t.src.data;
      if (kern::on_cuda()) {
        host.push_back(to_host(t.src, t.n));
        data = host.back().data();
      }
      w.add(t.name, ckpt::shard_dtype_name(t.src.dtype), {t.n}, data, t.src.bytes(t.n));
    }
    w.write(tmp + "/" + ckpt::shard_file_name(world.rank()));
  };
  auto commit = [&] {
    const std::string dir =
        ckpt::commit_checkpoint(root, step, checkpoint_manifest(run, step, records), run.cfg.training.keep_last);
    spdlog::info("saved checkpoint {}", dir);
  };
  world.in_phases([&] { ckpt::begin_checkpoint(root, step); }, write_shard, commit);
}

namespace {

// Every tensor of this rank's state from the reader, onto the model's device.
void read_state(CheckpointedRun& run, ckpt::PartReader& reader, const std::string& where) {
  auto read = [&](const std::string& name, int64_t lo, int64_t hi, TypedPtr dst) {
    std::vector<char> h(dst.bytes(hi - lo));
    reader.read(name, dst.dtype, lo, hi, h.data());
    kern::copy_from_host(dst.data, h.data(), h.size());
  };
  const std::string stored = reader.dtype_of("params");
  const std::string wanted = ckpt::shard_dtype_name(run.engine.model().dtype());
  if (!stored.empty() && stored != wanted) {
    throw invalid_argument("{}: the checkpoint stores the parameters as {} but this run stores them as {}; resume "
                           "it with the same bf16/fp16 settings",
                           where, stored, wanted);
  }
  Model& model = run.engine.model();
  if (run.engine.zero().stage() != 3) read("params", 0, trained_numel(model), trained_params(model));
  // Each region's state (the reader maps the expert region's offsets to the "expert_" tensors).
  auto read_region = [&](OptimizerState& st) {
    // The reader's offsets: a LoRA run's checkpoint covers its adapters' region only.
    const int64_t base = model.shape().lora.on() ? 0 : st.region_begin();
    if (st.zero().stage() == 3) {
      read("params", base + st.part_begin(), base + st.part_begin() + st.part_count(), st.zero().opt_params());
    }
    const int64_t ob = base + st.opt_begin(), oe = ob + st.opt_count();
    if (st.precision() != layout::Precision::kFp32) {
      if (!reader.has("master")) {
        throw invalid_argument("{}: the checkpoint was written without bf16/fp16 master weights; resume it with "
                               "the same precision settings",
                               where);
      }
      read("master", ob, oe, st.master());
    }
    for (const auto& [name, buf] : st.moments()) {
      if (!reader.has(name)) {
        throw invalid_argument("{}: the checkpoint holds no '{}' for optimizer {} (it was written by another "
                               "optimizer type)",
                               where, name, st.optimizer().type);
      }
      read(name, ob, oe, buf);
    }
  };
  read_region(run.state);
  if (run.expert_state != nullptr) read_region(*run.expert_state);
}

void log_layout_change(const ckpt::ShardLayout& old, CheckpointedRun& run, const std::string& dir, bool reshard) {
  const auto& cfg = run.cfg;
  if (reshard) {
    spdlog::info("resharding checkpoint {} (tensor-parallel {} x pipeline {}, partition '{}') for "
                 "tensor-parallel {} x pipeline {} (partition '{}')",
                 dir, old.tensor_parallel_size, old.pipeline_stages, old.pipeline_partition, cfg.tensor_parallel.size,
                 cfg.pipeline.stages, layout::stage_split_name(cfg.pipeline.partition));
  }
  const int dp = cfg.data_parallel_size, cp = cfg.context_parallel.size, stage = run.engine.zero().stage();
  if (old.data_parallel_size != dp || old.context_parallel_size != cp || old.zero_stage != stage) {
    spdlog::info("re-partitioning checkpoint {} (data-parallel {} x context-parallel {}, ZeRO stage {}) for "
                 "data-parallel {} x context-parallel {}, ZeRO stage {}",
                 dir, old.data_parallel_size, old.context_parallel_size, old.zero_stage, dp, cp, stage);
  }
  if (old.expert_parallel_size != cfg.expert_parallel.size) {
    spdlog::info("resharding checkpoint {}'s experts from expert-parallel {} to {}", dir, old.expert_parallel_size,
                 cfg.expert_parallel.size);
  }
}

}  // namespace

int64_t load_checkpoint(CheckpointedRun& run, const std::string& dir) {
  const auto m = ckpt::read_manifest(dir);
  const std::string where = dir + "/manifest.json";
  const auto& model = run.engine.model();
  const auto old = ckpt::read_shard_layout(m, where, layout::stage_split_name(run.cfg.pipeline.partition));
  if (old.expert_partitions.empty() != (run.expert_state == nullptr)) {
    throw invalid_argument("{}: the checkpoint {} a mixture of experts' expert region but this run's model {}", where,
                           old.expert_partitions.empty() ? "has no" : "holds", run.expert_state ? "has one" : "does not");
  }
  if (old.num_params != ms::param_count(model.shape())) {
    throw invalid_argument("{}: the checkpoint holds a model of {} parameters but the config's model has {}", where,
                           old.num_params, ms::param_count(model.shape()));
  }
  ckpt::PartTarget target{model.shape(), model.part(), run.cfg.pipeline.stages, run.engine.coord().pp,
                          layout::stage_split_name(run.cfg.pipeline.partition)};
  ckpt::PartReader reader(dir, old, target);
  log_layout_change(old, run, dir, reader.resharding());
  int64_t next_step = 0;
  try {
    read_state(run, reader, where);
    run.state.set_adam_steps(m.at("adam_steps").get<int64_t>());
    if (run.expert_state != nullptr) run.expert_state->set_adam_steps(m.at("adam_steps").get<int64_t>());
    next_step = m.at("step").get<int64_t>() + 1;
    run.loader.restore_json(m.at("data"), where + ": data");
    run.schedule.restore(m.at("lr_schedule"), where + ": lr_schedule");
    run.scaler.restore(m.at("loss_scaler"), where + ": loss_scaler");
    run.state.restore_scalar_state(m.value("optimizer_state", nlohmann::json()), where);
    if (run.spikes != nullptr) run.spikes->restore(m.value("spike_guard", nlohmann::json()), where);
  } catch (const nlohmann::json::exception& e) {
    throw invalid_argument("{}: corrupt checkpoint manifest: {}", where, e.what());
  }
  run.state.after_load();
  if (run.expert_state != nullptr) run.expert_state->after_load();
  spdlog::info("resumed from {} (continuing at step {})", dir, next_step);
  return next_step;
}

}  // namespace ds::rt::train
