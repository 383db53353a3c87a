// The optimizer state of one rank and the step's update over it: fp32 master weights (with
// bf16/fp16, or when offloaded), AdamW's exp_avg and exp_avg_sq, over the ZeRO engine's range
// [opt_begin, opt_begin + opt_count) (the whole model at stage 0, this rank's partition from
// stage 1); the decay table; which gradient elements this rank counts in the global norm.
//
// Precision: the model stores its parameters in its storage type (2-byte bf16/fp16 buffers, or
// fp32); with 16 bits the partition keeps the fp32 master copy plus m and v (12 bytes per
// element), AdamW updates the master and writes the weights rounded once into the model's
// 16-bit range in the same pass; ZeRO then gathers them. Gradients are read in the model's
// gradient type (kernels/typed.h).
// ZeRO-Offload (zero_optimization.offload_optimizer.device "cpu" on a GPU run): the state lives
// in pinned host memory and AdamW runs on the CPU; each update brings the reduced gradients down
// and sends the master weights back up. On a CPU run the state is host memory anyway.
// Every element operation goes through the kernels on the model's device (kernels/dispatch.h):
// callers run it inside that device's kern::DeviceScope.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "config/job_config.h"
#include "core/allocator.h"
#include "layout/choices.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "parallel/zero.h"

namespace ds::rt::train {

// Offsets from opt_begin and counts of ranges of the optimizer range.
using RangeList = std::vector<std::pair<int64_t, int64_t>>;

class OptimizerState {
 public:
  // Allocates the state (tag optimizer; pinned host memory when offloaded) for `zero`'s range of
  // `model`. `tp_rank` and `pp` decide which elements count in the norm. Throws invalid_argument
  // naming the config key for offload_param on a GPU run.
  // `region_begin`: where `zero`'s region starts in the model's flat layout (a mixture of experts
  // has two engines: the dense region from 0, the experts from ParamLayout::expert_begin); the
  // engine's ranges (opt_begin, part_begin) are relative to it.
  OptimizerState(const config::JobConfig& cfg, layout::Precision precision, Device device, Model& model,
                 parallel::ZeroEngine& zero, int tp_rank, int pp, Allocator& alloc, int64_t region_begin = 0);

  layout::Precision precision() const { return precision_; }
  bool has_master() const { return precision_ != layout::Precision::kFp32 || offload_; }
  int64_t opt_begin() const { return zero_.opt_begin(); }  // in the engine's region
  int64_t region_begin() const { return region_; }         // the region's offset in the model's layout
  parallel::ZeroEngine& zero() { return zero_; }
  int64_t opt_count() const { return zero_.opt_count(); }
  // This rank's checkpoint partition [part_begin, part_begin + part_count).
  int64_t part_begin() const { return zero_.partition().begin(zero_.dp_rank()); }
  int64_t part_count() const { return zero_.partition().count(zero_.dp_rank()); }

  // The fp32 weights AdamW updates: the master copy, or the model's (engine's) own fp32 ones.
  float* master_params() { return has_master() ? master_.as<float>() : zero_.opt_params().f32(); }
  float* master() { return master_.as<float>(); }  // null without a master copy
  float* exp_avg() { return exp_avg_.as<float>(); }
  float* exp_avg_sq() { return exp_avg_sq_.as<float>(); }
  // A range buffer's (master, exp_avg, exp_avg_sq) slice for this rank's partition.
  float* partition_of(float* range_buffer) const { return range_buffer + (part_begin() - opt_begin()); }
  // The model's values of this rank's partition, in its storage type (a checkpoint's "params").
  TypedPtr partition_params();

  // Ranges of the gradients (offsets from opt_begin) this rank counts in the global norm; the
  // rest of its range is checked for inf/nan only (uncounted).
  const RangeList& norm_ranges() const { return norm_ranges_; }
  const RangeList& uncounted_ranges() const { return uncounted_ranges_; }

  int64_t adam_steps() const { return adam_steps_; }
  void set_adam_steps(int64_t n) { adam_steps_ = n; }

  // A fresh run's initial weights given as the fp32 values of the optimizer range (on the model's
  // device): into the master copy (or the parameters), then the model's rounded copy and ZeRO's
  // gathers.
  void init_from_f32(const float* values);
  // After a load of the master (or, at fp32 offload, of the parameters): as the end of an update.
  void after_load();
  // One AdamW update (the next of adam_steps()) of the range with the engine's reduced gradients
  // `grads`, read times grad_scale, at learning rate `lr`; then sync_model_from_master().
  void update(const optim::AdamWConfig& adamw, double lr, double grad_scale, TypedPtr grads);
  // The model's copy of the range from the master (rounded), then ZeRO's gathers.
  void sync_model_from_master();

 private:
  void compute_norm_ranges(const model_spec::ModelShape& shape, int tp_rank, int pp);

  layout::Precision precision_;
  Device device_;
  Model& model_;
  parallel::ZeroEngine& zero_;
  int64_t region_ = 0;
  bool offload_ = false;
  Buffer master_, exp_avg_, exp_avg_sq_, host_grads_;
  std::vector<optim::DecayRange> decay_;
  RangeList norm_ranges_, uncounted_ranges_;
  int64_t adam_steps_ = 0;
};

}  // namespace ds::rt::train
