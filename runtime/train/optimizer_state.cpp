// The optimizer state and its update (optimizer_state.h).
//
// The norm's ranges: every element of the model counts once in the global gradient norm.
// Replicated tensors (LayerNorms, row-parallel biases, wpe) hold the same gradient on every tp
// rank, so tp rank 0 counts them; the tied wte is on the first and the last stage, so the first
// stage counts it. The rest of this rank's partition is still checked for inf/nan.
#include "train/optimizer_state.h"

#include <fmt/format.h>

#include "common/error.h"
#include "common/check.h"
#include "kernels/dispatch.h"
#include "kernels/typed.h"
#include "layout/partition.h"

namespace ds::rt::train {

namespace ms = ds::model_spec;

namespace {

// llm.c's practice (and Megatron's): matrices and embeddings decay, biases and LayerNorm weights do not.
// The tensors of the region [begin, end) of the flat layout, in offsets from `begin`.
std::vector<optim::DecayRange> decay_ranges(const ms::ModelShape& shape, const ms::ParamLayout& layout, int64_t begin,
                                            int64_t end) {
  const auto all = ms::model_params(shape);
  std::vector<optim::DecayRange> out;
  for (const auto& t : layout.tensors) {
    if (t.offset < begin || t.offset >= end) continue;
    const bool decay = ms::find_param(all, t.id).shape.size() == 2;
    const int64_t off = t.offset - begin;
    if (!out.empty() && out.back().decay == decay && out.back().offset + out.back().count == off) {
      out.back().count += t.numel;
    } else {
      out.push_back({off, t.numel, decay});
    }
  }
  return out;
}

void append_range(RangeList& ranges, int64_t off, int64_t n) {
  if (!ranges.empty() && ranges.back().first + ranges.back().second == off) {
    ranges.back().second += n;
  } else {
    ranges.emplace_back(off, n);
  }
}

}  // namespace

OptimizerState::OptimizerState(const config::JobConfig& cfg, layout::Precision precision, Device device,
                               Model& model, parallel::ZeroEngine& zero, int tp_rank, int pp, Allocator& alloc,
                               int64_t region_begin, parallel::HostWorld* world, comm::Comm* onebit_host_dp)
    : precision_(precision), device_(device), model_(model), zero_(zero), region_(region_begin),
      opt_(cfg.optimizer), world_(world) {
  if (cfg.zero.offload_param.device == "cpu" && device == Device::kCuda) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{}: $.zero_optimization.offload_param.device \"cpu\" with training.device "
                            "\"cuda\": offloading the ZeRO-3 parameter partitions is not built for GPU "
                            "runs (offload_optimizer is)",
                            cfg.path),
                "remove offload_param (keep offload_optimizer), or use more ranks (dstrain plan "
                "--recommend lists layouts that fit)");
  }
  const std::string& t = opt_.type;
  // The optimizers beside AdamW run on the CPU: on a GPU run their state is offloaded as
  // ZeRO-Offload's (pinned host memory, the update on the CPU).
  offload_ = (cfg.zero.offload_optimizer.device == "cpu" || !opt_.adam()) && device == Device::kCuda;
  const Device where = offload_ ? Device::kCudaHost : device;
  const size_t bytes = static_cast<size_t>(opt_count()) * sizeof(float);
  if (has_master()) master_ = alloc.allocate(bytes, MemTag::kOptimizer, "master weights", where);
  if (t != "Adagrad") exp_avg_ = alloc.allocate(bytes, MemTag::kOptimizer, "exp_avg", where);
  if (t != "Lion") exp_avg_sq_ = alloc.allocate(bytes, MemTag::kOptimizer, "exp_avg_sq", where);
  if (t == "ZeroOneAdam") accum_ = alloc.allocate(bytes, MemTag::kOptimizer, "0/1 Adam momentum accumulator", where);
  if (t == "OneBitLamb") {
    exp_avg_sq_fresh_ = alloc.allocate(bytes, MemTag::kOptimizer, "1-bit LAMB exp_avg_sq_fresh", where);
    last_exp_avg_ = alloc.allocate(bytes, MemTag::kOptimizer, "1-bit LAMB last exp_avg", where);
  }
  // The 1-bit exchange moves host buffers: the dp group itself on a CPU run; on a GPU run (NCCL
  // moves device buffers) the host group the caller made, as DeepSpeed's MPI backend without
  // cuda_aware does.
  comm::Comm* onebit_group = device == Device::kCuda ? onebit_host_dp : zero.dp_comm();
  if (opt_.onebit() && zero.dp_size() > 1) {
    if (onebit_group == nullptr) throw invalid_usage("OptimizerState: {} at dp {} needs a host dp group", t, zero.dp_size());
    onebit_ = std::make_unique<parallel::OneBitAllReduce>(*onebit_group, opt_count(), alloc, where);
  }
  if ((t == "Lamb" || t == "OneBitLamb") && world_ == nullptr) {
    throw invalid_usage("OptimizerState: {} needs the host world for its per-tensor norms", t);
  }
  if (offload_) {
    host_grads_ = alloc.allocate(static_cast<size_t>(opt_count()) * dtype_size(model.grad_dtype()), MemTag::kGrads,
                                 "offloaded gradients", where);
  }
  decay_ = decay_ranges(model.shape(), model.layout(), region_, region_ + zero.partition().total());
  compute_norm_ranges(model.shape(), tp_rank, pp, part_begin(), part_begin() + part_count(), norm_ranges_,
                      uncounted_ranges_);
  compute_norm_ranges(model.shape(), tp_rank, pp, opt_begin(), opt_begin() + opt_count(), local_norm_ranges_,
                      local_uncounted_ranges_);
  build_segments(model.shape());
}

OptimizerState::~OptimizerState() = default;

std::vector<std::pair<std::string, float*>> OptimizerState::moments() {
  std::vector<std::pair<std::string, float*>> v;
  if (exp_avg()) v.emplace_back("exp_avg", exp_avg());
  if (exp_avg_sq()) v.emplace_back("exp_avg_sq", exp_avg_sq());
  if (exp_avg_sq_fresh_.data()) v.emplace_back("exp_avg_sq_fresh", exp_avg_sq_fresh_.as<float>());
  return v;
}

TypedPtr OptimizerState::partition_params() {
  return zero_.stage() == 3 ? zero_.opt_params() : model_.params() + region_ + part_begin();
}

void OptimizerState::compute_norm_ranges(const ms::ModelShape& shape, int tp_rank, int pp, int64_t lo, int64_t hi,
                                         RangeList& counted, RangeList& uncounted) {
  const auto all = ms::model_params(shape);
  const int64_t ob = opt_begin();
  for (const auto& t : model_.layout().tensors) {
    const bool replicated_copy = ms::find_param(all, t.id).split == ms::TpSplit::kReplicated && tp_rank != 0;
    const bool tied_copy = t.id == ms::ParamId::kWte && pp > 1 && !model_.part().has_embedding;
    const auto r = layout::intersect(lo, hi, t.offset - region_, t.offset - region_ + t.numel);
    if (r.size() <= 0) continue;
    append_range(replicated_copy || tied_copy ? uncounted : counted, r.lo - ob, r.size());
  }
}

void OptimizerState::init_from_f32(const float* values) {
  if (has_master()) {
    kern::copy(master_.as<float>(), values, static_cast<size_t>(opt_count()) * sizeof(float));
  } else {
    kern::typed::from_f32(zero_.opt_params(), values, opt_count());
  }
  sync_model_from_master();
}

void OptimizerState::after_load() {
  if (precision_ == layout::Precision::kFp32 && offload_) {  // the offloaded fp32 master is the params
    kern::copy(master_.as<float>(), zero_.opt_params().data, static_cast<size_t>(opt_count()) * sizeof(float));
  }
  zero_.gather_params();  // stage 3: the persistent units from the loaded shard
}

void OptimizerState::sync_model_from_master() {
  if (has_master()) {
    kern::typed::from_f32(zero_.opt_params(), master_.as<float>(), opt_count());
  }
  zero_.gather_params();
}

TypedPtr OptimizerState::host_readable(TypedPtr grads) {
  if (!offload_) return grads;
  kern::copy_to_host(host_grads_.data(), grads.data, grads.bytes(opt_count()));
  return {host_grads_.data(), grads.dtype};
}

void OptimizerState::update(const optim::AdamWConfig& adamw, double lr, double grad_scale, TypedPtr grads) {
  if (!opt_.adam()) {
    ++adam_steps_;
    // Local gradients are 1/dp of the rank's mean gradient (the loss was scaled for the global batch).
    const TypedPtr readable = host_readable(grads);  // a GPU run: down to the host, updated there
    {
      const kern::DeviceScope on_cpu(Device::kCpu);
      update_other(lr, grad_scale * norm_factor(), readable);
    }
    sync_model_from_master();
    return;
  }
  ++adam_steps_;
  const optim::AdamWStep step = optim::adamw_step_scalars(adamw, adam_steps_, lr, grad_scale);
  const int64_t n = opt_count();
  // AdamW writes the rounded weights into the model's 16-bit range in the same pass, or updates
  // its fp32 weights in place (no master).
  const TypedPtr params_out = zero_.opt_params();
  if (offload_) {
    // ZeRO-Offload: the gradients down (synchronous), AdamW on the CPU, the master weights back
    // up into the model.
    const TypedPtr readable = host_readable(grads);
    {
      const kern::DeviceScope on_cpu(Device::kCpu);
      kern::typed::adamw_update_partition(step, master_params(), readable, exp_avg(), exp_avg_sq(), opt_begin(), n,
                                          decay_, TypedPtr());
    }
    sync_model_from_master();
    return;
  }
  kern::typed::adamw_update_partition(step, master_params(), grads, exp_avg(), exp_avg_sq(), opt_begin(), n, decay_,
                                      params_out);
  zero_.gather_params();
}

}  // namespace ds::rt::train
