// The optimizer state and its update (optimizer_state.h).
//
// The norm's ranges: every element of the model counts once in the global gradient norm.
// Replicated tensors (LayerNorms, row-parallel biases, wpe) hold the same gradient on every tp
// rank, so tp rank 0 counts them; the tied wte is on the first and the last stage, so the first
// stage counts it. The rest of this rank's partition is still checked for inf/nan.
#include "train/optimizer_state.h"

#include <fmt/format.h>

#include "common/error.h"
#include "kernels/dispatch.h"
#include "layout/partition.h"

namespace ds::rt::train {

namespace ms = ds::model_spec;

namespace {

// GPT-2 / llm.c practice: matrices and embeddings decay, biases and LayerNorm weights do not.
std::vector<optim::DecayRange> decay_ranges(const ms::Gpt2Shape& shape, const ms::ParamLayout& layout) {
  const auto all = ms::gpt2_params(shape);
  std::vector<optim::DecayRange> out;
  for (const auto& t : layout.tensors) {
    const bool decay = ms::find_param(all, t.id).shape.size() == 2;
    if (!out.empty() && out.back().decay == decay && out.back().offset + out.back().count == t.offset) {
      out.back().count += t.numel;
    } else {
      out.push_back({t.offset, t.numel, decay});
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
                               Gpt2& model, parallel::ZeroEngine& zero, int tp_rank, int pp, Allocator& alloc)
    : precision_(precision), device_(device), model_(model), zero_(zero) {
  if (cfg.zero.offload_param.device == "cpu" && device == Device::kCuda) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{}: $.zero_optimization.offload_param.device \"cpu\" with training.device "
                            "\"cuda\": offloading the ZeRO-3 parameter partitions is not built for GPU "
                            "runs (offload_optimizer is)",
                            cfg.path),
                "remove offload_param (keep offload_optimizer), or use more ranks (dstrain plan "
                "--recommend lists layouts that fit)");
  }
  offload_ = cfg.zero.offload_optimizer.device == "cpu" && device == Device::kCuda;
  const Device where = offload_ ? Device::kCudaHost : device;
  const size_t bytes = static_cast<size_t>(opt_count()) * sizeof(float);
  if (has_master()) master_ = alloc.allocate(bytes, MemTag::kOptimizer, "master weights", where);
  exp_avg_ = alloc.allocate(bytes, MemTag::kOptimizer, "adam exp_avg", where);
  exp_avg_sq_ = alloc.allocate(bytes, MemTag::kOptimizer, "adam exp_avg_sq", where);
  if (offload_) host_grads_ = alloc.allocate(bytes, MemTag::kGrads, "offloaded gradients", where);
  decay_ = decay_ranges(model.shape(), model.layout());
  compute_norm_ranges(model.shape(), tp_rank, pp);
}

float* OptimizerState::partition_params() {
  return zero_.stage() == 3 ? zero_.opt_params() : model_.params() + part_begin();
}

void OptimizerState::compute_norm_ranges(const ms::Gpt2Shape& shape, int tp_rank, int pp) {
  const auto all = ms::gpt2_params(shape);
  const int64_t lo = part_begin(), hi = lo + part_count(), ob = opt_begin();
  for (const auto& t : model_.layout().tensors) {
    const bool replicated_copy = ms::find_param(all, t.id).split == ms::TpSplit::kReplicated && tp_rank != 0;
    const bool tied_copy = t.id == ms::ParamId::kWte && pp > 1 && !model_.part().has_embedding;
    const auto r = layout::intersect(lo, hi, t.offset, t.offset + t.numel);
    if (r.size() <= 0) continue;
    append_range(replicated_copy || tied_copy ? uncounted_ranges_ : norm_ranges_, r.lo - ob, r.size());
  }
}

void OptimizerState::round_to_precision(float* x, int64_t n) const {
  if (precision_ == layout::Precision::kBf16) kern::round_to_bf16_in_place(x, n);
  if (precision_ == layout::Precision::kFp16) kern::round_to_f16_in_place(x, n);
}

void OptimizerState::init_master_from_model() {
  if (has_master()) {
    kern::copy(master_.as<float>(), zero_.opt_params(), static_cast<size_t>(opt_count()) * sizeof(float));
    if (zero_.stage() < 3) round_to_precision(model_.params(), model_.num_params());
  }
  sync_model_from_master();
}

void OptimizerState::after_load() {
  if (precision_ == layout::Precision::kFp32 && offload_) {  // the offloaded fp32 master is the params
    kern::copy(master_.as<float>(), zero_.opt_params(), static_cast<size_t>(opt_count()) * sizeof(float));
  }
  zero_.gather_params();  // stage 3: the persistent units from the loaded shard
}

void OptimizerState::sync_model_from_master() {
  if (has_master()) {
    kern::copy(zero_.opt_params(), master_.as<float>(), static_cast<size_t>(opt_count()) * sizeof(float));
    round_to_precision(zero_.opt_params(), opt_count());
  }
  zero_.gather_params();
}

void OptimizerState::update(const optim::AdamWConfig& adamw, double lr, double grad_scale, float* grads) {
  ++adam_steps_;
  const optim::AdamWStep step = optim::adamw_step_scalars(adamw, adam_steps_, lr, grad_scale);
  const int64_t n = opt_count();
  if (offload_) {
    // ZeRO-Offload: the gradients down (synchronous), AdamW on the CPU, the master weights back
    // up in sync_model_from_master.
    kern::copy_to_host(host_grads_.data(), grads, static_cast<size_t>(n) * sizeof(float));
    const kern::DeviceScope on_cpu(Device::kCpu);
    kern::adamw_update_partition(step, master_params(), host_grads_.as<float>(), exp_avg(), exp_avg_sq(),
                                 opt_begin(), n, decay_);
  } else {
    kern::adamw_update_partition(step, master_params(), grads, exp_avg(), exp_avg_sq(), opt_begin(), n, decay_);
  }
  sync_model_from_master();
}

}  // namespace ds::rt::train
