// Expert parallelism and the two regions of a mixture of experts' parameters.
//
// The flat layout of a mixture of experts (model_spec::param_layout) puts every layer's experts in
// units of their own (UnitKind::kExperts) after the dense units: the dense region is partitioned
// and reduced by a ZeroEngine over the gradient group (dp x cp ranks), the expert region by a
// second ZeroEngine over the expert-data-parallel group (the ranks holding the same experts:
// layout::Topology::expert_data_group), as DeepSpeed's and Megatron's separate expert parameter
// groups. RegionHooks is the bottom of the hook stack that sends each unit's hooks to its region's
// engine. ExpertParallelHooks answers the model's token all-to-all over the ep group
// (hooks.h, ep_all_to_all).
//
// Thread safety: the model's thread.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/comm.h"
#include "model/hooks.h"
#include "parallel/zero.h"

namespace ds::rt::parallel {

class RegionHooks final : public ParallelHooks {
 public:
  // Both engines must outlive this object.
  RegionHooks(ZeroEngine* dense, ZeroEngine* experts) : dense_(dense), experts_(experts) {}

  TypedPtr params_needed(Unit unit, TypedPtr resident) override { return of(unit).params_needed(unit, resident); }
  void params_done(Unit unit) override { of(unit).params_done(unit); }
  TypedPtr grads_needed(Unit unit, TypedPtr resident) override { return of(unit).grads_needed(unit, resident); }
  void grads_ready(Unit unit) override { of(unit).grads_ready(unit); }
  bool grads_final_this_micro_batch() const override { return dense_->grads_final_this_micro_batch(); }

 private:
  ZeroEngine& of(const Unit& u) { return u.kind == model_spec::UnitKind::kExperts ? *experts_ : *dense_; }
  ZeroEngine* dense_;
  ZeroEngine* experts_;
};

class ExpertParallelHooks final : public ForwardingHooks {
 public:
  // `ep`: the ep group (this rank's run of the gradient group). `inner` must outlive this object.
  ExpertParallelHooks(comm::CommPtr ep, ParallelHooks* inner) : ForwardingHooks(inner), ep_(std::move(ep)) {}

  bool ep_all_to_all(const void* in, const std::vector<int64_t>& send, void* out, const std::vector<int64_t>& recv,
                     size_t elem_bytes) override;
  // Seconds the model's thread spent in the all-to-alls so far (the wall-clock breakdown).
  double blocked_seconds() const { return blocked_s_; }

 private:
  comm::CommPtr ep_;
  double blocked_s_ = 0;
};

}  // namespace ds::rt::parallel
