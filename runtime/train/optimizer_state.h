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
//
// The optimizer is optimizer.type (optimizer_update.cpp gives each one's formula): AdamW through
// the fused kernels on any device; Lamb, Adagrad, Lion and the 1-bit ones (OneBitAdam,
// ZeroOneAdam, OneBitLamb) on the CPU (optimizer_update.cpp), offloaded as above on a GPU run. The state holds only the moments
// the optimizer keeps: Adam's and Lamb's exp_avg and exp_avg_sq, Lion's exp_avg, Adagrad's sum of
// squares (as exp_avg_sq); 0/1 Adam's momentum accumulator, 1-bit LAMB's fresh variance and last
// momentum; the 1-bit ones' error-feedback buffers (parallel/onebit_allreduce.h) at dp > 1.
// LAMB's trust ratio is per tensor of the whole model (the squares summed over every rank that
// holds a piece, through the host world), so every layout computes the single process's ratio.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/job_config.h"
#include "core/allocator.h"
#include "layout/choices.h"
#include "model/model.h"
#include "kernels/cpu/optimizer_passes.h"
#include "optim/adamw.h"
#include "parallel/host_world.h"
#include "parallel/onebit_allreduce.h"
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
  // `world`: the host world, for LAMB's per-tensor norms (required by Lamb and OneBitLamb).
  // `onebit_host_dp`: on a GPU run, the dp group over host memory (Gloo/shm) the 1-bit
  // optimizers exchange their compressed momentum on (required there at dp > 1).
  OptimizerState(const config::JobConfig& cfg, layout::Precision precision, Device device, Model& model,
                 parallel::ZeroEngine& zero, int tp_rank, int pp, Allocator& alloc, int64_t region_begin = 0,
                 parallel::HostWorld* world = nullptr, comm::Comm* onebit_host_dp = nullptr);
  ~OptimizerState();

  const config::OptimizerConfig& optimizer() const { return opt_; }

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
  float* exp_avg() { return exp_avg_.as<float>(); }        // null where the optimizer keeps none (Adagrad)
  float* exp_avg_sq() { return exp_avg_sq_.as<float>(); }  // null for Lion
  // The moment tensors this optimizer keeps, by their checkpoint names, with their range buffers.
  std::vector<std::pair<std::string, float*>> moments();
  // A range buffer's (master, exp_avg, exp_avg_sq) slice for this rank's partition.
  float* partition_of(float* range_buffer) const { return range_buffer + (part_begin() - opt_begin()); }
  // The model's values of this rank's partition, in its storage type (a checkpoint's "params").
  TypedPtr partition_params();

  // Ranges of the gradients (offsets from opt_begin) this rank counts in the global norm; the
  // rest of its range is checked for inf/nan only (uncounted).
  // With local gradients (below) every dp rank counts its whole range: the sum is then over the
  // ranks' own gradients, and norm_factor() turns it into the ranks' RMS mean-gradient norm.
  const RangeList& norm_ranges() const { return local_ ? local_norm_ranges_ : norm_ranges_; }
  const RangeList& uncounted_ranges() const { return local_ ? local_uncounted_ranges_ : uncounted_ranges_; }
  double norm_factor() const { return local_ ? zero_.dp_size() : 1.0; }

  // Before the step's micro-batches (the step after adam_steps()): decides whether its gradients
  // stay local to the rank (the 1-bit optimizers after their warm-up, 0/1 Adam between its variance
  // updates) and tells the engine. Returns it.
  bool begin_step();
  bool local_gradients() const { return local_; }
  // The optimizer's scalar state (0/1 Adam's schedules, 1-bit LAMB's per-tensor coefficients) for
  // the manifest; null when it has none. restore_scalar_state takes it back (`where` for messages).
  nlohmann::json scalar_state() const;
  void restore_scalar_state(const nlohmann::json& j, const std::string& where);

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
  void compute_norm_ranges(const model_spec::ModelShape& shape, int tp_rank, int pp, int64_t lo, int64_t hi,
                           RangeList& counted, RangeList& uncounted);
  void build_segments(const model_spec::ModelShape& shape);
  // The element passes of the optimizers beside AdamW (optimizer_update.cpp), grad_scale applied.
  void update_other(double lr, double grad_scale, TypedPtr grads);
  void update_lamb(double lr, double gs, TypedPtr grads);
  void update_onebit_adam(double lr, double gs, TypedPtr grads);
  void update_zero_one_adam(double lr, double gs, TypedPtr grads);
  void update_onebit_lamb(double lr, double gs, TypedPtr grads);
  // The Adam direction's settings for a range that decays or not (optimizer_passes.h).
  cpu::AdamDirection direction(bool decay, bool eps_inside_sqrt) const;
  // LAMB's ||p||^2 (entries [0, tensors)) and ||u||^2 ([tensors, 2 tensors)) of every tensor of the
  // model, summed over the world.
  std::vector<double> weight_and_update_squares(const float* p, const float* m, const float* v, bool eps_inside_sqrt);
  // The reduced gradients as the CPU update reads them: on a GPU run (offloaded) copied down.
  TypedPtr host_readable(TypedPtr grads);
  // Per-tensor sums over the world (LAMB's norms): `v` has kinds x tensors entries.
  std::vector<double> world_sum(const std::vector<double>& v);
  std::vector<double> world_max(const std::vector<double>& v);

  layout::Precision precision_;
  Device device_;
  Model& model_;
  parallel::ZeroEngine& zero_;
  int64_t region_ = 0;
  bool offload_ = false;
  Buffer master_, exp_avg_, exp_avg_sq_, host_grads_;
  std::vector<optim::DecayRange> decay_;
  RangeList norm_ranges_, uncounted_ranges_;
  RangeList local_norm_ranges_, local_uncounted_ranges_;
  int64_t adam_steps_ = 0;

  config::OptimizerConfig opt_;
  parallel::HostWorld* world_ = nullptr;
  bool local_ = false;  // this step's gradients are the rank's own
  // One tensor's piece of the optimizer range: offset from opt_begin, count, the tensor's index in
  // the world's per-tensor vectors, whether this rank counts it in the norms, and its weight decay.
  struct Segment {
    int64_t off = 0, n = 0;
    int tensor = 0;
    bool counted = false, decay = false;
  };
  std::vector<Segment> segments_;
  int num_tensors_ = 0;
  Buffer accum_, exp_avg_sq_fresh_, last_exp_avg_;  // 0/1 Adam; 1-bit LAMB
  std::unique_ptr<parallel::OneBitAllReduce> onebit_;  // the 1-bit ones at dp > 1
  // The 1-bit optimizers' scalar state (DeepSpeed's names).
  bool frozen_ = false;       // past the warm-up (freeze_step, var_freeze_step)
  bool full_step_ = true;     // 0/1 Adam before its freeze: this step updates the variance
  int64_t var_interval_ = 1, var_counter_ = 0, local_step_interval_ = 1, local_step_counter_ = 0;
  double lrs_ = 0;
  std::vector<double> lamb_coeff_freeze_, last_factor_, scaling_coeff_;
};

}  // namespace ds::rt::train
