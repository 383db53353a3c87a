#include "train/trainer.h"

#include <omp.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint_dir.h"
#include "comm/comm.h"
#include "checkpoint/llmc_format.h"
#include "checkpoint/shard_file.h"
#include "common/check.h"
#include "common/env.h"
#include "common/error.h"
#include "common/preemption.h"
#include "core/allocator.h"
#include "data/loader.h"
#include "data/token_file.h"
#include "kernels/dispatch.h"
#ifdef DSTRAIN_HAVE_CUDA
#include "kernels/cuda/memory.h"
#endif
#include "model/gpt2.h"
#include "model/init.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_stage.h"
#include "parallel/tensor_parallel.h"
#include "parallel/topology.h"
#include "parallel/zero.h"
#include "plan/from_config.h"
#include "store/prefix_store.h"
#include "store/tcp_store_client.h"
#include "train/metrics.h"

namespace ds::rt::train {

namespace ms = ds::model_spec;
using Clock = std::chrono::steady_clock;

namespace {

ms::Gpt2Shape shape_of(const config::ModelConfig& m) {
  ms::Gpt2Shape s;
  s.n_layer = m.n_layer;
  s.n_head = m.n_head;
  s.n_embd = m.n_embd;
  s.vocab_size = m.vocab_size;
  s.padded_vocab_size = m.padded_vocab_size;
  s.seq_len = m.seq_len;
  return s;
}

optim::LrScheduleConfig schedule_of(const config::JobConfig& c) {
  optim::LrScheduleConfig s;
  const auto& sc = c.scheduler;
  s.base_lr = c.optimizer.lr;
  if (sc.type.empty()) s.type = optim::LrScheduleType::kConstant;
  else if (sc.type == "WarmupLR") s.type = optim::LrScheduleType::kWarmupLR;
  else if (sc.type == "WarmupDecayLR") s.type = optim::LrScheduleType::kWarmupDecayLR;
  else if (sc.type == "WarmupCosineLR") s.type = optim::LrScheduleType::kWarmupCosineLR;
  else throw invalid_argument("{}: $.scheduler.type: unsupported scheduler '{}'", c.path, sc.type);
  s.warmup_min_lr = sc.warmup_min_lr;
  s.warmup_max_lr = sc.warmup_max_lr;
  s.warmup_num_steps = sc.warmup_num_steps;
  s.warmup_type = sc.warmup_type == "linear" ? optim::WarmupType::kLinear : optim::WarmupType::kLog;
  s.total_num_steps = sc.total_num_steps > 0 ? sc.total_num_steps : c.training.steps;
  s.warmup_min_ratio = sc.warmup_min_ratio;
  s.cos_min_ratio = sc.cos_min_ratio;
  return s;
}

// GPT-2 / llm.c practice: matrices and embeddings decay, biases and LayerNorm weights do not.
std::vector<optim::DecayRange> decay_ranges(const ms::Gpt2Shape& shape,
                                            const ms::ParamLayout& layout) {
  auto all = ms::gpt2_params(shape);
  std::vector<optim::DecayRange> out;
  for (const auto& t : layout.tensors) {
    bool decay = ms::find_param(all, t.id).shape.size() == 2;
    if (!out.empty() && out.back().decay == decay && out.back().offset + out.back().count == t.offset) {
      out.back().count += t.numel;
    } else {
      out.push_back({t.offset, t.numel, decay});
    }
  }
  return out;
}

enum class Precision { kFp32, kBf16, kFp16 };

}  // namespace

struct Trainer::Impl {
  config::JobConfig cfg;
  TrainOptions opt;
  ms::Gpt2Shape shape;
  Precision precision = Precision::kFp32;
  // Where the model, the engines' buffers and the optimizer state live: kCpu, or kCuda (device
  // LOCAL_RANK; kernels on the legacy default stream, which the NCCL groups order after).
  Device device = Device::kCpu;
  int B = 0, T = 0, G = 1;
  int rank = 0, world = 1;  // world rank / size
  int tp = 1, pp = 1, dp_size = 1;
  parallel::Coord coord;    // this rank's (pp, dp, tp) in the grid (parallel/topology.h)

  Allocator& alloc = Allocator::process();
  std::shared_ptr<store::Store> store;
  // The world and this rank's groups along each axis (null where the axis has size 1; dp_comm is
  // the world itself without tensor and pipeline parallelism), and the {first, last} stage group
  // for the tied token embedding (first and last stage of a pipeline only). On a GPU the axis
  // groups are NCCL groups of a second, NCCL world (data_world); world_comm stays a host group
  // (shm or Gloo) for the host bookkeeping (loss, norm, overflow, peaks, barriers).
  comm::CommPtr world_comm, data_world, tp_comm, dp_comm, pp_comm, tied_comm;
  comm::CommPtr pp_grad_comm;  // GPU pipelines: the backward direction's group (pipeline_stage.h)
  // Declaration order is destruction order reversed: the stage (which uses the model) goes first,
  // then the engine (waits its work), the hooks, and the model last.
  std::unique_ptr<Gpt2> model;
  std::unique_ptr<parallel::TiedEmbeddingHooks> tied_hooks;  // pp > 1, first and last stage
  std::unique_ptr<parallel::TensorParallelHooks> tp_hooks;   // tp > 1
  std::unique_ptr<parallel::ZeroEngine> zero;
  std::unique_ptr<parallel::PipelineStage> stage;  // pp > 1
  std::vector<parallel::Event> events;             // pp > 1: this stage's schedule for one step
  Gpt2Activations acts;                            // pp == 1 (the stage holds its own)
  // Ranges of opt_grads() (offsets from opt_begin) that count in the global gradient norm: this
  // rank's partition, less what another rank already counts (replicated tensors on tp ranks > 0,
  // the last stage's tied copy of wte).
  // uncounted_ranges: the rest of the partition (checked for inf/nan only).
  std::vector<std::pair<int64_t, int64_t>> norm_ranges, uncounted_ranges;
  // Optimizer state (fp32) over the engine's range [opt_begin, opt_begin + opt_count): the whole
  // model at stage 0, this rank's partition from stage 1. master only with bf16/fp16, or when
  // the state is offloaded.
  Buffer master, exp_avg, exp_avg_sq;
  // ZeRO-Offload of the optimizer on a GPU run (zero_optimization.offload_optimizer.device
  // "cpu"): master, exp_avg and exp_avg_sq live in pinned host memory and AdamW runs on the CPU;
  // each step the reduced gradients of the range come down into host_grads (pinned) and the
  // updated master weights go back up into the model. On a CPU run the state is host memory
  // anyway and nothing moves.
  bool offload = false;
  Buffer host_grads;
  Buffer tokens;                       // inputs and targets (B*T int32 each), workspace
  std::vector<optim::DecayRange> decay;

  std::unique_ptr<data::TokenFile> train_file, val_file;
  std::unique_ptr<data::DataLoader> loader;
  std::unique_ptr<data::ValidationLoader> val_loader;
  std::unique_ptr<optim::LrScheduler> schedule;
  std::unique_ptr<optim::LossScaler> scaler;
  int64_t adam_steps = 0;  // applied optimizer updates (AdamW's t)
  int64_t next_step = 1;   // the step the next run() executes

  int dp() const { return dp_size; }
  int micro_tokens() const { return B * T; }
  // Micro-batch g's inputs and targets in the token workspace (g < G with pipelines, else 0).
  int32_t* mb_inputs(int g) { return tokens.as<int32_t>() + static_cast<size_t>(g) * 2 * micro_tokens(); }
  int32_t* mb_targets(int g) { return mb_inputs(g) + micro_tokens(); }
  // The rank that holds this (dp, tp) position's loss: tp rank 0 of the last stage.
  bool loss_owner() const { return coord.tp == 0 && coord.pp == pp - 1; }

  // Over the whole world (comm.h): sums added in rank order, every rank's values rank-major.
  std::vector<double> world_sum(const std::vector<double>& mine) {
    return comm::sum_in_rank_order(world_comm.get(), mine);
  }
  std::vector<int64_t> world_gather(const std::vector<int64_t>& mine) {
    return comm::gather_int64(world_comm.get(), mine);
  }
  void world_barrier() {
    if (world_comm) world_comm->barrier();
  }
  int64_t n_params() const { return model->num_params(); }
  int64_t opt_begin() const { return zero->opt_begin(); }
  int64_t opt_count() const { return zero->opt_count(); }
  bool has_master() const { return precision != Precision::kFp32 || offload; }
  float* master_params() { return has_master() ? master.as<float>() : zero->opt_params(); }
  // This rank's checkpoint partition [part_begin, part_begin + part_count).
  int64_t part_begin() const { return zero->partition().begin(zero->dp_rank()); }
  int64_t part_count() const { return zero->partition().count(zero->dp_rank()); }

  // Rounds the model's parameters (or gradients) to the storage precision, in place, on the
  // model's device (every kern:: call of the trainer runs inside its DeviceScope).
  void round_to_precision(float* x, int64_t n) {
    if (precision == Precision::kBf16) kern::round_to_bf16_in_place(x, n);
    if (precision == Precision::kFp16) kern::round_to_f16_in_place(x, n);
  }

  // After an update of the master weights: the model's copy of the optimizer range (rounded),
  // then the engine's gathers (stage 1/2 parameters, stage 3 persistent units).
  void sync_model_from_master() {
    if (has_master()) {
      kern::copy(zero->opt_params(), master.as<float>(), static_cast<size_t>(opt_count()) * sizeof(float));
      round_to_precision(zero->opt_params(), opt_count());
    }
    zero->gather_params();
  }

  // Host <-> model-device transfers of whole ranges (checkpoints, initial values, exports). On
  // the CPU they go through a host copy too, which keeps one code path; the cost is a memcpy of
  // a partition per checkpoint.
  std::vector<float> to_host(const float* src, int64_t n) {
    std::vector<float> h(static_cast<size_t>(n));
    kern::copy_to_host(h.data(), src, h.size() * sizeof(float));
    return h;
  }
  void from_host(float* dst, const std::vector<float>& h) {
    kern::copy_from_host(dst, h.data(), h.size() * sizeof(float));
  }

  // The fp32 view of this rank's parameter partition (what a checkpoint stores as "params").
  float* partition_params() {
    return zero->stage() == 3 ? zero->opt_params() : model->params() + part_begin();
  }
  // An optimizer-range buffer's slice for this rank's partition.
  float* partition_of(const Buffer& b) { return b.as<float>() + (part_begin() - opt_begin()); }

  // `ranks`: every world rank's {partition begin, partition count, elements of its part}, rank-major
  // (world_gather of rank_record()).
  std::vector<int64_t> rank_record() const { return {part_begin(), part_count(), model->num_params()}; }
  nlohmann::json manifest(int64_t step, const std::vector<int64_t>& ranks) const {
    nlohmann::json m;
    m["format"] = "dstrain-checkpoint-1";
    m["step"] = step;
    m["adam_steps"] = adam_steps;
    m["config"] = cfg.to_json();
    // Shard q (world rank q) holds elements [begin, begin + count) of the flat layout of rank q's
    // part (its pipeline stage's layers, its tensor-parallel shard), which has part_num_params[q]
    // elements; rank q's grid position follows from the sizes (parallel/topology.h).
    nlohmann::json parts = nlohmann::json::array(), part_numel = nlohmann::json::array();
    for (int q = 0; q < world; ++q) {
      parts.push_back({ranks[3 * static_cast<size_t>(q)], ranks[3 * static_cast<size_t>(q) + 1]});
      part_numel.push_back(ranks[3 * static_cast<size_t>(q) + 2]);
    }
    m["layout"] = {{"world_size", cfg.world_size},
                   {"data_parallel_size", cfg.data_parallel_size},
                   {"tensor_parallel_size", cfg.tensor_parallel.size},
                   {"pipeline_stages", cfg.pipeline.stages},
                   {"pipeline_partition", cfg.pipeline.partition},
                   {"zero_stage", cfg.zero.stage},
                   {"num_params", ms::param_count(shape)},
                   {"part_num_params", part_numel},
                   {"partitions", parts}};
    m["data"] = loader->state().to_json();
    m["lr_schedule"] = schedule->state();
    m["loss_scaler"] = scaler->state();
    m["rng"] = {{"seed", cfg.training.seed}, {"note", "initial weights and data order derive from the seed alone"}};
    return m;
  }

  // Every rank writes its partition into the temporary step directory rank 0 created; rank 0
  // commits after everyone wrote.
  void save_checkpoint(int64_t step) {
    const auto& root = cfg.training.checkpoint_dir;
    const auto ranks = world_gather(rank_record());
    if (rank == 0) ckpt::begin_checkpoint(root, step);
    world_barrier();
    std::string tmp = (std::filesystem::path(root) / (".tmp-" + ckpt::step_dir_name(step))).string();
    ckpt::ShardWriter w;
    const int64_t n = part_count();
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    // Host copies of the partition's tensors (they are device memory on a GPU).
    std::vector<std::vector<float>> host;
    auto add = [&](const char* name, const float* src) {
      host.push_back(to_host(src, n));
      w.add(name, "f32", {n}, host.back().data(), bytes);
    };
    host.reserve(4);
    add("params", partition_params());
    if (precision != Precision::kFp32) add("master", partition_of(master));
    add("exp_avg", partition_of(exp_avg));
    add("exp_avg_sq", partition_of(exp_avg_sq));
    w.write(tmp + "/" + ckpt::shard_file_name(rank));
    world_barrier();
    if (rank == 0) {
      std::string dir = ckpt::commit_checkpoint(root, step, manifest(step, ranks), cfg.training.keep_last);
      spdlog::info("saved checkpoint {}", dir);
    }
    world_barrier();
  }

  // Reads elements [lo, hi) of one (stage, tp rank) part's tensor `name` from the shards of a
  // checkpoint that hold that part (the writing ranks at that pipeline stage and tensor-parallel
  // rank): one {shard (writing rank), begin, count} each, together covering the part.
  struct ShardPart {
    int shard;
    int64_t begin, count;
  };
  struct ShardSet {
    std::string dir, where;
    std::vector<ShardPart> parts;
    std::map<int, std::unique_ptr<ckpt::ShardReader>> readers;
    void read_host(const std::string& name, int64_t lo, int64_t hi, float* dst) {
      for (const auto& [q, b, c] : parts) {
        auto r = parallel::intersect(lo, hi, b, b + c);
        if (r.size() <= 0) continue;
        auto& rd = readers[q];
        if (!rd) rd = std::make_unique<ckpt::ShardReader>(dir + "/" + ckpt::shard_file_name(q));
        if (!rd->has(name)) {
          throw invalid_argument("{}: shard {} has no tensor '{}'", where, ckpt::shard_file_name(q), name);
        }
        std::vector<float> tmp(static_cast<size_t>(c));
        rd->read(name, "f32", {c}, tmp.data(), tmp.size() * sizeof(float));
        std::copy_n(tmp.data() + (r.lo - b), r.size(), dst + (r.lo - lo));
      }
    }
  };

  // Elements [lo, hi) of THIS rank's part's tensor `name` from a checkpoint written with another
  // tensor-parallel size, pipeline split or partition method (a "universal" resume): each of this
  // part's tensors is rebuilt whole from the old parts that held it (every old tp rank's shard of
  // the old stage holding its layer; replicated tensors from tp rank 0; wte and wpe from the
  // first stage, lnf from the last), and this rank's shard cut out of it (model_spec::full_index
  // on both sides). Old parts are read whole once per tensor name and kept while that name is read.
  struct Reshard {
    ms::Gpt2Shape shape;
    ms::ModelPart part;                  // this rank's
    ms::ParamLayout layout;              // this rank's part's layout
    int old_tp = 1, old_pp = 1;
    std::vector<ms::ModelPart> old_parts;      // [stage * old_tp + tp_rank]
    std::vector<ms::ParamLayout> old_layouts;  // their layouts
    std::vector<ShardSet> old_sets;            // the shards holding each old part
    std::string cached_name;
    std::map<int, std::vector<float>> cache;   // old part index -> its values of cached_name

    const std::vector<float>& old_values(const std::string& name, int idx) {
      if (name != cached_name) {
        cache.clear();
        cached_name = name;
      }
      auto it = cache.find(idx);
      if (it != cache.end()) return it->second;
      const int64_t n = old_layouts[static_cast<size_t>(idx)].total;
      std::vector<float> v(static_cast<size_t>(n));
      old_sets[static_cast<size_t>(idx)].read_host(name, 0, n, v.data());
      return cache.emplace(idx, std::move(v)).first->second;
    }
    int old_stage_of(const ms::TensorSlice& ts) const {
      if (ts.layer < 0) {
        return ts.id == ms::ParamId::kLnfw || ts.id == ms::ParamId::kLnfb ? old_pp - 1 : 0;
      }
      for (int st = 0; st < old_pp; ++st) {
        const auto& op = old_parts[static_cast<size_t>(st * old_tp)];
        if (ts.layer >= op.layer_begin && ts.layer < op.layer_end) return st;
      }
      throw Error(ErrorKind::kInternal, fmt::format("resharding: layer {} is in no old pipeline stage", ts.layer));
    }
    void read_host(const std::string& name, int64_t lo, int64_t hi, float* dst) {
      const auto all = ms::gpt2_params(shape);
      std::vector<float> full;
      for (const auto& ts : layout.tensors) {
        const auto r = parallel::intersect(lo, hi, ts.offset, ts.offset + ts.numel);
        if (r.size() <= 0) continue;
        const ms::ParamTensor& t = ms::find_param(all, ts.id);
        full.assign(static_cast<size_t>(t.numel()), 0.0f);
        const int st = old_stage_of(ts);
        const int ranks = t.split == ms::TpSplit::kReplicated ? 1 : old_tp;
        for (int otp = 0; otp < ranks; ++otp) {
          const int idx = st * old_tp + otp;
          const ms::TensorSlice* os = old_layouts[static_cast<size_t>(idx)].find_tensor(ts.id, ts.layer);
          DS_CHECK(os != nullptr, "resharding: an old part lacks a tensor it should hold");
          const float* v = old_values(name, idx).data() + os->offset;
          for (int64_t j = 0; j < os->numel; ++j) full[static_cast<size_t>(ms::full_index(t, old_tp, otp, j))] = v[j];
        }
        for (int64_t i = r.lo; i < r.hi; ++i) {
          dst[i - lo] = full[static_cast<size_t>(ms::full_index(t, part.tp, part.tp_rank, i - ts.offset))];
        }
      }
    }
  };

  void load_checkpoint(const std::string& dir) {
    auto m = ckpt::read_manifest(dir);
    std::string where = dir + "/manifest.json";
    try {
      const int64_t n = model->num_params();
      const auto& lay = m.at("layout");
      if (lay.at("num_params").get<int64_t>() != ms::param_count(shape)) {
        throw invalid_argument("{}: the checkpoint holds a model of {} parameters but the config's model has {}",
                               where, lay["num_params"].get<int64_t>(), ms::param_count(shape));
      }
      // Each shard holds its writer's [begin, count) of its (stage, tp rank) part. With the same
      // tensor and pipeline layout this rank's part is the union of the old shards at its
      // (stage, tp rank), re-partitioned for the new data-parallel size and ZeRO stage; with
      // another layout every tensor is resharded from the old parts (Reshard).
      const int old_tp = lay.value("tensor_parallel_size", 1), old_pp = lay.value("pipeline_stages", 1);
      const std::string old_method = lay.value("pipeline_partition", cfg.pipeline.partition);
      const bool same_layout = old_tp == tp && old_pp == pp && (pp == 1 || old_method == cfg.pipeline.partition);
      const auto& parts = lay.at("partitions");
      const int old_world = static_cast<int>(parts.size());
      if (old_world % (old_tp * old_pp) != 0) {
        throw invalid_argument("{}: layout.partitions has {} entries, not a multiple of tp x pp = {}", where,
                               old_world, old_tp * old_pp);
      }
      const parallel::Topology old_topo(old_world, old_tp, old_world / (old_tp * old_pp), old_pp);
      const auto old_split = parallel::parse_partition_method(old_method, where + ": layout.pipeline_partition");
      // The shards of the old (stage, tp rank) part `stage * old_tp + otp`, checked to cover it.
      auto shard_set = [&](int stage, int otp, int64_t part_numel) {
        ShardSet set;
        set.dir = dir;
        set.where = where;
        for (int q = 0; q < old_world; ++q) {
          const auto c = old_topo.coord_of(q);
          if (c.pp != stage || c.tp != otp) continue;
          const auto& p = parts.at(static_cast<size_t>(q));
          if (lay.contains("part_num_params") &&
              lay["part_num_params"].at(static_cast<size_t>(q)).get<int64_t>() != part_numel) {
            throw invalid_argument("{}: shard {} holds a part of {} parameters but the layout gives that part {}",
                                   where, ckpt::shard_file_name(q),
                                   lay["part_num_params"][static_cast<size_t>(q)].get<int64_t>(), part_numel);
          }
          set.parts.push_back({q, p.at(0).get<int64_t>(), p.at(1).get<int64_t>()});
        }
        int64_t covered = 0;
        for (const auto& sp : set.parts) covered += sp.count;
        if (covered != part_numel) {
          throw invalid_argument("{}: layout.partitions cover {} of the {} parameters of stage {}, tp rank {}", where,
                                 covered, part_numel, stage, otp);
        }
        return set;
      };
      std::optional<ShardSet> same;
      std::optional<Reshard> reshard;
      if (same_layout) {
        same = shard_set(coord.pp, coord.tp, n);
      } else {
        reshard.emplace();
        reshard->shape = shape;
        reshard->part = model->part();
        reshard->layout = model->layout();
        reshard->old_tp = old_tp;
        reshard->old_pp = old_pp;
        for (int st = 0; st < old_pp; ++st) {
          for (int otp = 0; otp < old_tp; ++otp) {
            const auto op = parallel::partition_stages(shape, old_pp, old_split, old_tp, otp)[static_cast<size_t>(st)];
            reshard->old_parts.push_back(op);
            reshard->old_layouts.push_back(ms::param_layout(shape, op));
            reshard->old_sets.push_back(shard_set(st, otp, reshard->old_layouts.back().total));
          }
        }
        spdlog::info("resharding checkpoint {} (tensor-parallel {} x pipeline {}, partition '{}') for "
                     "tensor-parallel {} x pipeline {} (partition '{}')",
                     dir, old_tp, old_pp, old_method, tp, pp, cfg.pipeline.partition);
      }
      // Elements [lo, hi) of this part's tensor `name` into dst on the model's device.
      auto read = [&](const std::string& name, int64_t lo, int64_t hi, float* dst) {
        std::vector<float> h(static_cast<size_t>(hi - lo));
        if (same) same->read_host(name, lo, hi, h.data());
        else reshard->read_host(name, lo, hi, h.data());
        kern::copy_from_host(dst, h.data(), h.size() * sizeof(float));
      };
      const int old_dp = lay.value("data_parallel_size", 1);
      if (old_dp != dp() || lay.value("zero_stage", 0) != zero->stage()) {
        spdlog::info("re-partitioning checkpoint {} (data-parallel {}, ZeRO stage {}) for data-parallel {}, "
                     "ZeRO stage {}",
                     dir, old_dp, lay.value("zero_stage", 0), dp(), zero->stage());
      }
      if (zero->stage() == 3) {
        read("params", part_begin(), part_begin() + part_count(), zero->opt_params());
      } else {
        read("params", 0, n, model->params());
      }
      const int64_t ob = opt_begin(), oe = opt_begin() + opt_count();
      if (precision != Precision::kFp32) {
        const ShardSet& any = same ? *same : reshard->old_sets.front();
        if (!any.parts.empty() && any.parts[0].count > 0) {
          ckpt::ShardReader r0(dir + "/" + ckpt::shard_file_name(any.parts[0].shard));
          if (!r0.has("master")) {
            throw invalid_argument("{}: the checkpoint was written without bf16/fp16 master weights; "
                                   "resume it with the same precision settings", where);
          }
        }
        read("master", ob, oe, master.as<float>());
      }
      read("exp_avg", ob, oe, exp_avg.as<float>());
      read("exp_avg_sq", ob, oe, exp_avg_sq.as<float>());
      if (precision == Precision::kFp32 && offload) {  // the offloaded fp32 master is the params
        kern::copy(master.as<float>(), zero->opt_params(), static_cast<size_t>(opt_count()) * sizeof(float));
      }
      adam_steps = m.at("adam_steps").get<int64_t>();
      next_step = m.at("step").get<int64_t>() + 1;
      loader->restore(data::LoaderState::from_json(m.at("data"), where + ": data"));
      schedule->restore(m.at("lr_schedule"), where + ": lr_schedule");
      scaler->restore(m.at("loss_scaler"), where + ": loss_scaler");
    } catch (const nlohmann::json::exception& e) {
      throw invalid_argument("{}: corrupt checkpoint manifest: {}", where, e.what());
    }
    zero->gather_params();  // stage 3: the persistent units from the loaded shard
    spdlog::info("resumed from {} (continuing at step {})", dir, next_step);
  }

  // The mean validation loss over every data-parallel rank's eval_steps micro-batches. With a
  // pipeline the micro-batches go through the stages G at a time (the token workspace's room).
  double evaluate() {
    val_loader->begin();
    const int64_t steps = val_loader->eval_steps();
    double sum = 0;
    if (pp == 1) {
      for (int64_t i = 0; i < steps; ++i) {
        val_loader->next(mb_inputs(0), mb_targets(0));
        zero->begin_micro_batch(false, false);
        sum += model->forward(acts, mb_inputs(0), mb_targets(0));
        zero->end_micro_batch();
      }
    } else {
      for (int64_t i = 0; i < steps; i += G) {
        const int k = static_cast<int>(std::min<int64_t>(G, steps - i));
        std::vector<parallel::MicroBatch> mbs;
        for (int g = 0; g < k; ++g) {
          val_loader->next(mb_inputs(g), mb_targets(g));
          mbs.push_back({mb_inputs(g), mb_targets(g)});
        }
        zero->begin_micro_batch(false, false);
        for (float l : stage->evaluate(mbs).losses) sum += l;
        zero->end_micro_batch();
      }
    }
    const double total = world_sum({loss_owner() ? sum : 0.0})[0];
    return total / static_cast<double>(steps * dp());
  }

  // Initial weights of global elements [begin, begin + count) of the flat layout into dst.
  void init_values(float* dst, int64_t begin, int64_t count) {
    auto all = ms::gpt2_params(shape);
    for (const auto& t : model->layout().tensors) {
      auto r = parallel::intersect(begin, begin + count, t.offset, t.offset + t.numel);
      if (r.size() <= 0) continue;
      init_tensor_values(dst + (r.lo - begin), ms::find_param(all, t.id), t.layer, shape.n_layer,
                         model->part().tp, model->part().tp_rank, cfg.training.seed, r.lo - t.offset,
                         r.size());
    }
  }

  // norm_ranges: every element of the model counts once in the global norm. Replicated tensors
  // (LayerNorms, row-parallel biases, wpe) hold the same gradient on every tp rank, so tp rank 0
  // counts them; the tied wte is on the first and the last stage, so the first stage counts it.
  void compute_norm_ranges() {
    const auto all = ms::gpt2_params(shape);
    const int64_t lo = part_begin(), hi = lo + part_count(), ob = opt_begin();
    for (const auto& t : model->layout().tensors) {
      const bool counted = !(ms::find_param(all, t.id).split == ms::TpSplit::kReplicated && coord.tp != 0) &&
                           !(t.id == ms::ParamId::kWte && pp > 1 && !model->part().has_embedding);
      auto r = parallel::intersect(lo, hi, t.offset, t.offset + t.numel);
      if (r.size() <= 0) continue;
      auto& ranges = counted ? norm_ranges : uncounted_ranges;
      if (!ranges.empty() && ranges.back().first + ranges.back().second == r.lo - ob) {
        ranges.back().second += r.size();
      } else {
        ranges.emplace_back(r.lo - ob, r.size());
      }
    }
  }
};

Trainer::Trainer(const config::JobConfig& config, const TrainOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.cfg = config;
  s.opt = options;
  config::require_training_sections(s.cfg);
  s.world = s.cfg.world_size;
  s.tp = s.cfg.tensor_parallel.size;
  s.pp = s.cfg.pipeline.stages;
  s.dp_size = s.cfg.data_parallel_size;
  s.rank = static_cast<int>(env::get_int("RANK"));
  if (s.rank < 0 || s.rank >= s.world) {
    throw invalid_argument("RANK={} is outside the config's world of {} rank(s) ({})", s.rank, s.world,
                           s.cfg.path);
  }
  const int local_rank = static_cast<int>(env::get_int("LOCAL_RANK"));
  if (s.cfg.training.device == "cuda") {
#ifdef DSTRAIN_HAVE_CUDA
    // One GPU per rank, the launcher's LOCAL_RANK (torchrun's and DeepSpeed's contract); made
    // current before anything allocates on it or an NCCL group binds to it.
    cuda::set_device(local_rank, fmt::format("{}: $.training.device \"cuda\" on rank {} (LOCAL_RANK {})",
                                             s.cfg.path, s.rank, local_rank));
    s.device = Device::kCuda;
#else
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{}: $.training.device: \"cuda\", but this dstrain was built without CUDA",
                            s.cfg.path),
                "build with -DDSTRAIN_CUDA=ON on a machine with the CUDA toolkit and NCCL, or set "
                "training.device to \"cpu\"");
#endif
  } else if (s.cfg.training.device != "cpu") {
    throw invalid_argument("{}: $.training.device: '{}' is not one of \"cpu\", \"cuda\"", s.cfg.path,
                           s.cfg.training.device);
  }
  // Every kern:: call of the constructor (initial values, master copies) runs on that device.
  const kern::DeviceScope device_scope(s.device);
  s.shape = shape_of(s.cfg.model);
  s.B = static_cast<int>(s.cfg.train_micro_batch_size_per_gpu);
  s.T = s.cfg.model.seq_len;
  s.G = static_cast<int>(s.cfg.gradient_accumulation_steps);
  if (s.cfg.bf16.enabled) s.precision = Precision::kBf16;
  if (s.cfg.fp16.enabled) s.precision = Precision::kFp16;
  // The grid (the config check guarantees tp x pp x dp = world and the model's divisibility).
  const parallel::Topology topo(s.world, s.tp, s.dp_size, s.pp);
  s.coord = topo.coord_of(s.rank);
  const auto partition_method = parallel::parse_partition_method(s.cfg.pipeline.partition, "$.pipeline.partition");
  const auto part = parallel::partition_stages(s.shape, s.pp, partition_method, s.tp, s.coord.tp)
      [static_cast<size_t>(s.coord.pp)];

  // Data first: a bad corpus should fail before we connect or allocate the model.
  s.train_file = std::make_unique<data::TokenFile>(s.cfg.data.train, s.cfg.model.vocab_size);
  data::LoaderOptions lo;
  lo.batch_size = s.B;
  lo.seq_len = s.T;
  lo.data_parallel_size = s.cfg.data_parallel_size;
  lo.data_parallel_rank = s.coord.dp;
  lo.grad_accum_steps = s.G;
  lo.shuffle = s.cfg.data.shuffle;
  lo.seed = s.cfg.training.seed;
  s.loader = std::make_unique<data::DataLoader>(*s.train_file, lo);
  if (!s.cfg.data.val.empty() && s.cfg.training.eval_interval > 0) {
    s.val_file = std::make_unique<data::TokenFile>(s.cfg.data.val, s.cfg.model.vocab_size);
    s.val_loader = std::make_unique<data::ValidationLoader>(
        *s.val_file, s.B, s.T, s.cfg.data_parallel_size, s.coord.dp, s.cfg.training.eval_steps);
  }

  if (s.world > 1) {
    // One store generation per launcher restart, so a restarted job never meets stale keys.
    auto client = store::connect_from_env();
    s.store = std::make_shared<store::PrefixStore>(
        fmt::format("train/gen{}/", env::get_int("DSTRAIN_RESTART_COUNT")), client);
    comm::CommOptions co;
    co.name = "world";
    // The world carries host vectors (loss, norm, peaks): it must be a host backend.
    if (auto b = env::get("DSTRAIN_COMM_BACKEND"); b && *b == "nccl") {
      throw Error(ErrorKind::kInvalidArgument,
                  "DSTRAIN_COMM_BACKEND=nccl: dstrain train keeps its bookkeeping group on the host "
                  "(shm or Gloo) and puts the model's groups on NCCL itself when training.device is "
                  "\"cuda\"",
                  "unset DSTRAIN_COMM_BACKEND (or set auto, shm or gloo)");
    }
    s.world_comm = comm::make_world_comm(s.store, s.rank, s.world, co);
    // The groups that move the model's buffers: on a GPU an NCCL world (device pointers) beside
    // the host world, on the CPU the host world itself.
    s.data_world = s.world_comm;
    if (s.device == Device::kCuda) {
      comm::CommOptions no;
      no.name = "world_nccl";
      no.backend = comm::Backend::kNccl;
      no.cuda_device = local_rank;
      s.data_world = comm::make_world_comm(s.store, s.rank, s.world, no);
    }
    if (s.tp == 1 && s.pp == 1) {
      s.dp_comm = s.data_world;
    } else {
      // Every member creates its groups in the same order: tp, dp, pp, then the tied pair.
      auto group = [&](parallel::Axis a) -> comm::CommPtr {
        if (topo.size(a) == 1) return nullptr;
        return s.data_world->new_group(topo.group_of(s.rank, a),
                                       fmt::format("{}{}", parallel::axis_name(a), topo.group_index(s.rank, a)));
      };
      s.tp_comm = group(parallel::Axis::kTp);
      s.dp_comm = group(parallel::Axis::kDp);
      s.pp_comm = group(parallel::Axis::kPp);
      if (s.pp > 1 && s.device == Device::kCuda) {
        // NCCL: the gradients flowing back get a group (a stream) of their own (pipeline_stage.h).
        s.pp_grad_comm = s.data_world->new_group(
            topo.group_of(s.rank, parallel::Axis::kPp),
            fmt::format("ppgrad{}", topo.group_index(s.rank, parallel::Axis::kPp)));
      }
      if (s.pp > 1 && (part.has_embedding || part.has_head)) {
        const auto pp_ranks = topo.group_of(s.rank, parallel::Axis::kPp);
        s.tied_comm = s.data_world->new_group({pp_ranks.front(), pp_ranks.back()},
                                              fmt::format("tied{}", topo.group_index(s.rank, parallel::Axis::kPp)));
      }
    }
  }
  parallel::ZeroOptions zo;
  zo.stage = s.cfg.zero.stage;
  zo.overlap_comm = s.cfg.zero.overlap_comm;
  zo.reduce_bucket_size = s.cfg.zero.reduce_bucket_size;
  zo.allgather_bucket_size = s.cfg.zero.allgather_bucket_size;
  zo.prefetch_bucket_size = s.cfg.zero.stage3_prefetch_bucket_size;
  zo.param_persistence_threshold = s.cfg.zero.stage3_param_persistence_threshold;
  zo.max_live_parameters = s.cfg.zero.stage3_max_live_parameters;
  zo.device = s.device;
  auto layout = ms::param_layout(s.shape, part);

  // The hook stack: model -> tensor-parallel regions -> the pipeline's tied-wte buffer -> ZeRO.
  s.zero = std::make_unique<parallel::ZeroEngine>(zo, s.dp_comm, layout, s.alloc);
  ParallelHooks* below_tp = s.zero.get();
  if (s.tied_comm) {
    const auto wte = ms::find_param(ms::gpt2_params(s.shape), ms::ParamId::kWte);
    s.tied_hooks = std::make_unique<parallel::TiedEmbeddingHooks>(s.zero.get(), ms::local_numel(wte, s.tp), s.alloc,
                                                                   s.device);
    below_tp = s.tied_hooks.get();
  }
  ParallelHooks* hooks = below_tp;
  if (s.tp_comm) {
    s.tp_hooks = std::make_unique<parallel::TensorParallelHooks>(s.tp_comm, below_tp);
    hooks = s.tp_hooks.get();
  }
  Gpt2Options mo;
  mo.B = s.B;
  mo.T = s.T;
  mo.recompute = s.cfg.activation_checkpointing.enabled;
  mo.own_params = s.zero->model_owns_params();
  mo.own_grads = s.zero->model_owns_grads();
  mo.device = s.device;
  s.model = std::make_unique<Gpt2>(s.shape, part, mo, s.alloc, hooks);
  s.zero->attach(s.model->params(), s.model->grads());
  if (s.pp > 1) {
    s.stage = std::make_unique<parallel::PipelineStage>(*s.model, s.pp_comm, s.tied_comm, s.pp_grad_comm);
    s.events = parallel::stage_events(parallel::parse_schedule(s.cfg.pipeline.schedule, "$.pipeline.schedule"),
                                      s.pp, s.coord.pp, s.G);
  } else {
    s.acts = s.model->make_activations();
  }
  const int64_t n = s.model->num_params();
  const size_t bytes = static_cast<size_t>(s.opt_count()) * sizeof(float);
  // offload_optimizer device "cpu": on a GPU run the optimizer state moves to pinned host memory
  // (counted apart from the GPU's tags); on a CPU run it lives in host memory anyway.
  if (s.cfg.zero.offload_param.device == "cpu" && s.device == Device::kCuda) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{}: $.zero_optimization.offload_param.device \"cpu\" with training.device "
                            "\"cuda\": offloading the ZeRO-3 parameter partitions is not built for GPU "
                            "runs (offload_optimizer is)",
                            s.cfg.path),
                "remove offload_param (keep offload_optimizer), or use more ranks (dstrain plan "
                "--recommend lists layouts that fit)");
  }
  s.offload = s.cfg.zero.offload_optimizer.device == "cpu" && s.device == Device::kCuda;
  const Device opt_device = s.offload ? Device::kCudaHost : s.device;
  if (s.has_master()) s.master = s.alloc.allocate(bytes, MemTag::kOptimizer, "master weights", opt_device);
  s.exp_avg = s.alloc.allocate(bytes, MemTag::kOptimizer, "adam exp_avg", opt_device);
  s.exp_avg_sq = s.alloc.allocate(bytes, MemTag::kOptimizer, "adam exp_avg_sq", opt_device);
  if (s.offload) s.host_grads = s.alloc.allocate(bytes, MemTag::kGrads, "offloaded gradients", opt_device);
  for (const auto* off : {&s.cfg.zero.offload_optimizer, &s.cfg.zero.offload_param}) {
    if (off->device == "cpu" && s.device == Device::kCpu && s.rank == 0) {
      spdlog::info("ZeRO {}: device cpu: {} already live in host memory on a CPU run (same tags)",
                   off == &s.cfg.zero.offload_optimizer ? "offload_optimizer" : "offload_param",
                   off == &s.cfg.zero.offload_optimizer ? "the optimizer states" : "the parameter partitions");
    }
  }
  // Inputs and targets of one micro-batch, or of all G with a pipeline (its schedule runs them
  // together: the first stage reads the inputs, the last the targets).
  s.tokens = s.alloc.allocate(2 * static_cast<size_t>(s.B) * s.T * (s.pp > 1 ? s.G : 1) * sizeof(int32_t),
                              MemTag::kWorkspace, "tokens");
  s.decay = decay_ranges(s.shape, s.model->layout());
  s.compute_norm_ranges();

  s.schedule = std::make_unique<optim::LrScheduler>(schedule_of(s.cfg));
  optim::LossScalerConfig lsc;
  lsc.enabled = s.cfg.fp16.enabled;
  lsc.loss_scale = s.cfg.fp16.loss_scale;
  lsc.initial_scale_power = s.cfg.fp16.initial_scale_power;
  lsc.loss_scale_window = s.cfg.fp16.loss_scale_window;
  lsc.hysteresis = s.cfg.fp16.hysteresis;
  lsc.min_loss_scale = s.cfg.fp16.min_loss_scale;
  s.scaler = std::make_unique<optim::LossScaler>(lsc);

  std::optional<std::string> resume_dir;
  if (s.opt.resume) {
    if (s.cfg.training.checkpoint_dir.empty()) {
      throw Error(ErrorKind::kInvalidArgument,
                  fmt::format("--resume needs training.checkpoint_dir in {}", s.cfg.path),
                  "set training.checkpoint_dir (and checkpoint_interval) in the config");
    }
    resume_dir = ckpt::latest_checkpoint(s.cfg.training.checkpoint_dir);
    if (!resume_dir) spdlog::info("--resume: no checkpoint in {} yet, starting fresh", s.cfg.training.checkpoint_dir);
  }
  std::string init_from = !s.opt.init_from.empty() ? s.opt.init_from : s.cfg.model.init_from;
  if (resume_dir) {
    s.load_checkpoint(*resume_dir);
  } else {
    if (!init_from.empty()) {
      if (s.zero->stage() == 3) {
        Buffer full = s.alloc.allocate(static_cast<size_t>(n) * sizeof(float), MemTag::kWorkspace,
                                       "llm.c import");
        ckpt::load_llmc(init_from, s.shape, s.model->part(), full.as<float>());
        kern::copy_from_host(s.zero->opt_params(), full.as<float>() + s.opt_begin(),
                             static_cast<size_t>(s.opt_count()) * sizeof(float));
      } else {
        std::vector<float> h(static_cast<size_t>(n));
        ckpt::load_llmc(init_from, s.shape, s.model->part(), h.data());
        s.from_host(s.model->params(), h);
      }
      spdlog::info("initialised weights from llm.c checkpoint {}", init_from);
    } else if (s.zero->stage() == 3) {
      std::vector<float> h(static_cast<size_t>(s.opt_count()));
      s.init_values(h.data(), s.opt_begin(), s.opt_count());
      s.from_host(s.zero->opt_params(), h);
    } else {
      s.model->init_weights(s.cfg.training.seed);
    }
    if (s.has_master()) {
      kern::copy(s.master.as<float>(), s.zero->opt_params(), static_cast<size_t>(s.opt_count()) * sizeof(float));
      if (s.zero->stage() < 3) s.round_to_precision(s.model->params(), n);
    }
    s.sync_model_from_master();
  }
}

Trainer::~Trainer() = default;

TrainResult Trainer::run() {
  Impl& s = *impl_;
  TrainResult result;
  result.first_step = s.next_step;
  const int64_t total = s.cfg.training.steps;
  int64_t stop = total;
  if (s.opt.max_steps >= 0) stop = std::min(stop, s.opt.max_steps);
  MetricsReporter reporter(s.rank == 0, s.opt.metrics_path, s.next_step > 1, s.cfg.training.log_interval);
  if (s.next_step == 1) {
    reporter.note(fmt::format(
        "training GPT-2 (L={} H={} C={} V={} T={}): {} parameters, micro-batch {} x {} tokens, "
        "{} accumulation step(s), data-parallel {} (ZeRO stage {}){}, {} steps, {} threads",
        s.shape.n_layer, s.shape.n_head, s.shape.n_embd, s.shape.vocab_size, s.shape.seq_len,
        ms::param_count(s.shape), s.B, s.T, s.G, s.dp(), s.zero->stage(),
        s.tp * s.pp == 1 ? std::string()
                         : fmt::format(" x tensor-parallel {} x pipeline {} ({}, {} partition)", s.tp, s.pp,
                                       s.cfg.pipeline.schedule, s.cfg.pipeline.partition),
        total, omp_get_max_threads()));
  }

  const int64_t oc = s.opt_count();
  const double micro_batches = static_cast<double>(s.G) * s.dp();  // in the global batch
  const double tokens_per_step = static_cast<double>(s.B) * s.T * micro_batches;
  optim::AdamWConfig ac;
  ac.lr = s.cfg.optimizer.lr;
  ac.beta1 = s.cfg.optimizer.beta1;
  ac.beta2 = s.cfg.optimizer.beta2;
  ac.eps = s.cfg.optimizer.eps;
  ac.weight_decay = s.cfg.optimizer.weight_decay;
  ac.adam_w_mode = s.cfg.optimizer.adam_w_mode;
  s.alloc.reset_peaks();
  const kern::DeviceScope device_scope(s.device);
#ifdef DSTRAIN_HAVE_CUDA
  // bf16 on a GPU: the matmuls multiply in bf16 on tensor cores (fp32 accumulate and storage).
  const cuda::ScopedMatmulMath math(s.device == Device::kCuda && s.precision == Precision::kBf16
                                        ? cuda::MatmulMath::kBf16
                                        : cuda::MatmulMath::kFp32);
#endif

  for (int64_t step = s.next_step; step <= stop; ++step) {
    auto t0 = Clock::now();
    s.zero->begin_step();
    if (s.tied_hooks) s.tied_hooks->zero();
    const double loss_scale = s.scaler->scale();
    const float grad_scale = static_cast<float>(loss_scale / micro_batches);
    const bool kill_here = step == s.opt.kill_at_step && s.rank == s.opt.kill_rank;
    double loss_sum = 0;  // this rank's micro-batch losses (the last stage's, with a pipeline)
    double bubble = -1;   // with a pipeline: the share of the schedule's time this stage idled
    if (s.pp == 1) {
      for (int g = 0; g < s.G; ++g) {
        s.loader->next(s.mb_inputs(0), s.mb_targets(0));
        s.zero->begin_micro_batch(g == s.G - 1, true);
        loss_sum += s.model->forward_backward(s.acts, s.mb_inputs(0), s.mb_targets(0), grad_scale);
        if (kill_here && g == 0) ::raise(SIGKILL);
        s.zero->end_micro_batch();
      }
    } else {
      // Every stage reads the step's G micro-batches (the first uses the inputs, the last the
      // targets); ZeRO sees each backward event as a micro-batch.
      std::vector<parallel::MicroBatch> mbs;
      for (int g = 0; g < s.G; ++g) {
        s.loader->next(s.mb_inputs(g), s.mb_targets(g));
        mbs.push_back({s.mb_inputs(g), s.mb_targets(g)});
      }
      parallel::RunOptions ro;
      ro.grad_scale = grad_scale;
      if (s.tied_hooks) ro.wte_grad = s.tied_hooks->wte_grad();
      ro.before_event = [&](const parallel::Event& e) {
        if (e.kind == parallel::EventKind::kBackward) s.zero->begin_micro_batch(e.mb == s.G - 1, true);
      };
      ro.after_event = [&](const parallel::Event& e) {
        if (e.kind != parallel::EventKind::kBackward) return;
        if (kill_here && e.mb == 0) ::raise(SIGKILL);
        s.zero->end_micro_batch();
      };
      const auto res = s.stage->run_schedule(s.events, mbs, ro);
      for (float l : res.losses) loss_sum += l;
      bubble = res.seconds > 0 ? 1.0 - res.compute_seconds / res.seconds : 0.0;
      if (s.tied_hooks) {  // the tied wte gradient, summed over both stages, joins ZeRO's reduction
        s.zero->begin_micro_batch(true, true);
        s.tied_hooks->hand_over();
        s.zero->end_micro_batch();
      }
    }
    float* grads = s.zero->opt_grads();
    if (step == s.opt.inject_inf_at_step && s.opt_begin() == 0 && oc > 0) {
      const float inf = std::numeric_limits<float>::infinity();
      kern::copy_from_host(grads, &inf, sizeof(float));
    }
    if (s.precision == Precision::kFp16) s.round_to_precision(grads, oc);

    // The global batch's loss and the global gradient norm: each loss once (from its owner),
    // each gradient element once (norm_ranges), summed over the world in rank order (the same
    // bits everywhere, so every rank agrees on an overflow, which any rank's partition may hold).
    double part_sumsq = 0, uncounted_sumsq = 0;
    for (const auto& [off, cnt] : s.norm_ranges) part_sumsq += kern::sum_of_squares(grads + off, cnt);
    for (const auto& [off, cnt] : s.uncounted_ranges) uncounted_sumsq += kern::sum_of_squares(grads + off, cnt);
    const double part_bad = std::isfinite(uncounted_sumsq) ? 0.0 : 1.0;
    // The 4th sum carries this rank's preemption flag, so every rank stops after the same step.
    const auto sums = s.world_sum({s.loss_owner() ? loss_sum : 0.0, part_sumsq, part_bad,
                                   preempt::requested() ? 1.0 : 0.0});
    const bool preempt_after_step = sums[3] > 0;
    const double loss = sums[0] / micro_batches;
    const double sumsq = sums[1];
    const bool overflow = !std::isfinite(sumsq) || sums[2] > 0;
    const double norm = std::sqrt(sumsq) / loss_scale;
    const double lr = s.schedule->lr();
    const bool skip = s.scaler->update(overflow);
    if (!skip) {
      if (overflow) {
        throw remote_error("step {}: the gradients hold inf or nan (loss {}) and fp16 loss scaling "
                           "is off: training diverged",
                           step, loss);
      }
      const double coef = optim::clip_coefficient(norm, s.cfg.gradient_clipping);
      ++s.adam_steps;
      auto st = optim::adamw_step_scalars(ac, s.adam_steps, lr, coef / loss_scale);
      if (s.offload) {
        // ZeRO-Offload: the gradients down (synchronous), AdamW on the CPU, the master weights
        // back up in sync_model_from_master.
        kern::copy_to_host(s.host_grads.data(), grads, static_cast<size_t>(oc) * sizeof(float));
        const kern::DeviceScope on_cpu(Device::kCpu);
        kern::adamw_update_partition(st, s.master_params(), s.host_grads.as<float>(), s.exp_avg.as<float>(),
                                     s.exp_avg_sq.as<float>(), s.opt_begin(), oc, s.decay);
      } else {
        kern::adamw_update_partition(st, s.master_params(), grads, s.exp_avg.as<float>(),
                                     s.exp_avg_sq.as<float>(), s.opt_begin(), oc, s.decay);
      }
      s.sync_model_from_master();
      s.schedule->step();
    }
    auto t1 = Clock::now();
    double ms_step = std::chrono::duration<double, std::milli>(t1 - t0).count();

    StepRecord r;
    r.step = step;
    r.total_steps = total;
    r.loss = loss;
    r.lr = lr;
    r.grad_norm = norm;
    r.loss_scale = loss_scale;
    r.skipped = skip;
    r.ms_per_step = ms_step;
    r.tokens_per_s = tokens_per_step / (ms_step / 1000.0);
    if (bubble >= 0) r.extra["pipeline_bubble"] = bubble;  // rank 0's: the first stage's
    auto stats = s.alloc.stats();
    std::vector<int64_t> mine;
    for (int t = 0; t < kNumMemTags; ++t) {
      r.peak_bytes[mem_tag_name(static_cast<MemTag>(t))] = stats.peak[t];
      mine.push_back(stats.peak[t]);
    }
    r.peak_bytes["total"] = stats.peak_total;
    mine.push_back(stats.peak_total);
    r.peak_bytes["pinned_host"] = stats.pinned_peak;  // offloaded state (GPU runs); not in total
    mine.push_back(stats.pinned_peak);
    if (s.opt.metrics_all_ranks) {
      constexpr int kFigures = kNumMemTags + 2;  // the tags, total, pinned_host
      auto all = s.world_gather(mine);
      for (int q = 0; q < s.world; ++q) {
        for (int t = 0; t < kFigures; ++t) {
          std::string tag = t < kNumMemTags ? mem_tag_name(static_cast<MemTag>(t)) : t == kNumMemTags ? "total" : "pinned_host";
          r.extra[fmt::format("peak_bytes_{}_rank{}", tag, q)] =
              all[static_cast<size_t>(q) * kFigures + static_cast<size_t>(t)];
        }
      }
    }
    if (s.val_loader && (step % s.cfg.training.eval_interval == 0 || step == total)) {
      r.val_loss = s.evaluate();
      result.last_val_loss = r.val_loss;
    }
    if (step == result.first_step) {
      // The plan's prediction for this rank beside what the allocator measured over the first
      // step (rank 0 prints it, as Megatron-LM reports memory after its first iteration).
      try {
        const auto planned = plan::predicted_rank_memory(s.cfg, s.rank, omp_get_max_threads());
        for (const auto& [tag, bytes] : plan::tag_bytes(planned)) r.extra["planned_bytes_" + tag] = bytes;
        std::string text = plan::describe_prediction(planned, r.peak_bytes);
        while (!text.empty() && text.back() == '\n') text.pop_back();
        reporter.note(text);
      } catch (const Error& e) {
        reporter.note(fmt::format("dstrain plan could not plan this run: {}", e.what()));
      }
    }
    reporter.report(r);
    result.losses.push_back(loss);
    result.last_step = step;
    s.next_step = step + 1;
    const bool has_ckpt_dir = !s.cfg.training.checkpoint_dir.empty();
    const bool saved = has_ckpt_dir && s.cfg.training.checkpoint_interval > 0 &&
                       (step % s.cfg.training.checkpoint_interval == 0 || step == total);
    if (saved) s.save_checkpoint(step);
    if (preempt_after_step && step < stop) {
      if (has_ckpt_dir && !saved) s.save_checkpoint(step);
      result.preempted = true;
      result.checkpoint_written = has_ckpt_dir;
      break;
    }
  }
  return result;
}

void Trainer::export_llmc(const std::string& path) {
  Impl& s = *impl_;
  const int64_t n = s.model->num_params();
  const bool full_on_rank = s.zero->stage() == 0 || (s.zero->stage() < 3 && s.precision == Precision::kFp32);
  const kern::DeviceScope scope(s.device);
  // 1. This rank's part (its stage's layers, its tp shard) as fp32 weights on the host: the
  // master weights with mixed precision, assembled from the dp group's partitions where ZeRO
  // splits them (collective over the dp group).
  std::vector<float> part;
  if (full_on_rank && s.dp() == 1) {
    part = s.to_host(s.precision == Precision::kFp32 ? s.model->params() : s.master.as<float>(), n);
  } else {
    Buffer full = s.alloc.allocate(static_cast<size_t>(n) * sizeof(float), MemTag::kWorkspace, "export", s.device);
    float* src = s.precision == Precision::kFp32 ? s.partition_params() : s.partition_of(s.master);
    kern::copy(full.as<float>() + s.part_begin(), src, static_cast<size_t>(s.part_count()) * sizeof(float));
    s.zero->all_gather_partitions(full.as<float>());
    part = s.to_host(full.as<float>(), n);
  }
  if (s.tp * s.pp == 1) {
    if (s.rank == 0) ckpt::save_llmc(path, s.shape, part.data());
    return;
  }
  // 2. Tensor and pipeline parts: dp rank 0 of every (stage, tp rank) sends its part to world rank
  // 0 over the host world, which places every tensor element at its index in the whole model's
  // layout (model_spec::full_index undoes the tp split) and writes the file. The tied wte comes
  // from both the first and the last stage, which hold the same values.
  const parallel::Topology topo(s.world, s.tp, s.dp_size, s.pp);
  const auto sizes = s.world_gather({n});
  constexpr int kExportTag = 21;
  if (s.rank != 0) {
    if (s.coord.dp == 0) {
      s.world_comm->send(part.data(), static_cast<size_t>(n), comm::DataType::kFloat32, 0, kExportTag);
    }
    s.world_barrier();  // the file exists when every rank returns
    return;
  }
  const auto method = parallel::parse_partition_method(s.cfg.pipeline.partition, "$.pipeline.partition");
  const auto all = ms::gpt2_params(s.shape);
  const ms::ParamLayout whole = ms::param_layout(s.shape, ms::ModelPart::whole(s.shape));
  std::vector<float> model(static_cast<size_t>(whole.total));
  std::vector<float> buf;
  for (int q = 0; q < s.world; ++q) {
    const parallel::Coord c = topo.coord_of(q);
    if (c.dp != 0) continue;
    const int64_t nq = sizes[static_cast<size_t>(q)];
    const float* src = part.data();
    if (q != 0) {
      buf.resize(static_cast<size_t>(nq));
      s.world_comm->recv(buf.data(), static_cast<size_t>(nq), comm::DataType::kFloat32, q, kExportTag);
      src = buf.data();
    }
    const auto mp = parallel::partition_stages(s.shape, s.pp, method, s.tp, c.tp)[static_cast<size_t>(c.pp)];
    const ms::ParamLayout layout = ms::param_layout(s.shape, mp);
    DS_CHECK(layout.total == nq, "export: a part's size differs from its layout");
    for (const auto& ts : layout.tensors) {
      const ms::ParamTensor& t = ms::find_param(all, ts.id);
      const ms::TensorSlice* dst = whole.find_tensor(ts.id, ts.layer);
      DS_CHECK(dst != nullptr, "export: a part's tensor is not in the whole model");
      for (int64_t i = 0; i < ts.numel; ++i) {
        model[static_cast<size_t>(dst->offset + ms::full_index(t, s.tp, c.tp, i))] = src[ts.offset + i];
      }
    }
  }
  ckpt::save_llmc(path, s.shape, model.data());
  s.world_barrier();
}

}  // namespace ds::rt::train
