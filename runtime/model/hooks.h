// The named points where parallelism plugs into the model. The model never calls a collective:
// at each of these points it calls the hook, and the parallel layer (runtime/parallel: ZeRO, tensor,
// context and pipeline parallelism) decides what happens there. The defaults do nothing, which is the
// single-process model.
//
// Contract: hooks are called on the thread that runs the model piece, outside any OpenMP region,
// in a fixed order for a given piece (so every rank of a group reaches the same point in the same
// order). A hook that fails throws ds::Error; the model lets it propagate.
#pragma once

#include <cstdint>
#include <vector>

#include "core/typed_ptr.h"
#include "model_spec/shape.h"

namespace ds::rt {

// A unit of the flat parameter layout (model_spec::ParamLayout): what ZeRO-3 gathers.
struct Unit {
  model_spec::UnitKind kind;
  int layer = -1;  // for kLayer
};

class ParallelHooks {
 public:
  virtual ~ParallelHooks() = default;

  // ---- ZeRO-3 / parameter offload ----
  // The model is about to read `unit`'s parameters (forward, the recompute of a checkpointed
  // layer, or backward). Returns where they are: this tp rank's part of the unit, laid out as
  // model_spec::param_layout says, valid until params_done(unit). `resident` is the model's own
  // storage for the unit (null when the model was built without its own parameters).
  // Buffers are in the model's storage type (gradients: its gradient type), TypedPtr says which.
  virtual TypedPtr params_needed(Unit unit, TypedPtr resident) { return resident; }
  // The model is done reading what params_needed returned (it may be released or reused).
  virtual void params_done(Unit unit) {}

  // ---- gradients (data parallelism, ZeRO-2/3 buckets) ----
  // Where to ACCUMULATE `unit`'s gradients (same layout as the parameters). `resident` is the
  // model's own gradient storage (null when built without it).
  virtual TypedPtr grads_needed(Unit unit, TypedPtr resident) { return resident; }
  // `unit`'s gradient contributions of this backward are all in: reduce or bucket them now.
  // The token embedding is reported once per backward: after the encoder's backward, or after the
  // head's when the part has no encoder (a last pipeline stage).
  virtual void grads_ready(Unit unit) {}

  // ---- tensor parallelism (Megatron's named regions) ----
  // reduce-from-TP, forward: `buf` (n elements of the storage type) holds this rank's partial output of a row-parallel
  // matmul (attention projection, MLP down-projection) or of the vocabulary-parallel embedding;
  // sum it over the tp group in place.
  virtual void tp_reduce_forward(TypedPtr buf, int64_t n) {}
  // copy-to-TP, backward: `buf` holds this rank's part of the input gradient of a column-parallel
  // matmul (qkv, MLP up-projection, the vocabulary-parallel lm_head); sum it over the tp group.
  virtual void tp_reduce_backward(TypedPtr buf, int64_t n) {}
  // Vocabulary-parallel loss: per-row statistics of this rank's logits, reduced in place over the
  // tp group (elementwise max, then sums; fp32 statistics). Called once per head chunk, in that
  // order.
  virtual void tp_loss_reduce_max(float* buf, int64_t n) {}
  virtual void tp_loss_reduce_sum(float* buf, int64_t n) {}

  // ---- Megatron's sequence parallelism (ModelOptions::sequence_parallel, tp > 1 only) ----
  // all-gather before a column-parallel matmul: `full` (tp x n elements, in tp-rank order) from
  // every rank's `local` (n elements; this rank's rows of the residual stream).
  virtual void tp_all_gather(TypedPtr full, TypedPtr local, int64_t n) {}
  // reduce-scatter after a row-parallel matmul (or of a column-parallel input gradient): `local`
  // (n) = the sum over the group of this rank's share of every rank's `full` (tp x n).
  virtual void tp_reduce_scatter(TypedPtr local, TypedPtr full, int64_t n) {}
  // A replicated parameter's gradient that this rank computed from its own rows only (the norms'
  // weights): summed over tp when the hooks below reduce this micro-batch's gradients (at once
  // for ZeRO-2/3, after the last micro-batch for 0/1, whose buffers accumulate), so every tp
  // rank ends with the whole sum.
  virtual void tp_sum_partial_grads(TypedPtr buf, int64_t n) {}
  // Whether the gradients served in this micro-batch are reduced (or final) at its end.
  virtual bool grads_final_this_micro_batch() const { return true; }

  // ---- context parallelism (the sequence split over a cp group: ModelOptions::cp) ----
  // Attention of this rank's rows over the whole sequence (runtime/parallel/context_parallel.h):
  // out (B,T,NHl hd) and the lse the backward wants, from this rank's qkv (B,T,(NHl+2KVl) hd),
  // q and k already at their global positions. Returns false where there is no cp group (the
  // model then runs its own attention; a model with cp > 1 treats that as a bug). Collective.
  virtual bool cp_attention_forward(TypedPtr out, float* lse, TypedPtr qkv) { return false; }
  // dqkv (B,T,(NHl+2KVl) hd) overwritten from dout, qkv, and the forward's out and lse.
  virtual bool cp_attention_backward(TypedPtr dqkv, TypedPtr dout, TypedPtr qkv, TypedPtr out, const float* lse) {
    return false;
  }

  // ---- expert parallelism (a mixture of experts' experts split over an ep group) ----
  // All-to-all over the ep group: send[q] elements of elem_bytes each from `in` (packed by
  // destination) to ep rank q, recv[q] from q into `out` (packed by source); recv[q] is q's
  // send[this rank]. Buffers on the model's device. Returns false where there is no ep group
  // (the model then holds every expert). Collective: every ep rank calls it in the same order.
  virtual bool ep_all_to_all(const void* in, const std::vector<int64_t>& send, void* out,
                             const std::vector<int64_t>& recv, size_t elem_bytes) {
    return false;
  }
};

// A layer of the hook stack (runtime/parallel: context, tensor and pipeline parallelism above
// ZeRO): every hook goes on to `inner` (null: the defaults above), and a layer overrides only
// the hooks it answers. `inner` must outlive this object.
class ForwardingHooks : public ParallelHooks {
 public:
  explicit ForwardingHooks(ParallelHooks* inner) : inner_(inner != nullptr ? inner : &defaults_) {}
  ForwardingHooks(const ForwardingHooks&) = delete;  // inner_ may point at defaults_
  ForwardingHooks& operator=(const ForwardingHooks&) = delete;

  TypedPtr params_needed(Unit unit, TypedPtr resident) override { return inner_->params_needed(unit, resident); }
  void params_done(Unit unit) override { inner_->params_done(unit); }
  TypedPtr grads_needed(Unit unit, TypedPtr resident) override { return inner_->grads_needed(unit, resident); }
  void grads_ready(Unit unit) override { inner_->grads_ready(unit); }
  void tp_reduce_forward(TypedPtr buf, int64_t n) override { inner_->tp_reduce_forward(buf, n); }
  void tp_reduce_backward(TypedPtr buf, int64_t n) override { inner_->tp_reduce_backward(buf, n); }
  void tp_loss_reduce_max(float* buf, int64_t n) override { inner_->tp_loss_reduce_max(buf, n); }
  void tp_loss_reduce_sum(float* buf, int64_t n) override { inner_->tp_loss_reduce_sum(buf, n); }
  void tp_all_gather(TypedPtr full, TypedPtr local, int64_t n) override { inner_->tp_all_gather(full, local, n); }
  void tp_reduce_scatter(TypedPtr local, TypedPtr full, int64_t n) override {
    inner_->tp_reduce_scatter(local, full, n);
  }
  void tp_sum_partial_grads(TypedPtr buf, int64_t n) override { inner_->tp_sum_partial_grads(buf, n); }
  bool grads_final_this_micro_batch() const override { return inner_->grads_final_this_micro_batch(); }
  bool cp_attention_forward(TypedPtr out, float* lse, TypedPtr qkv) override {
    return inner_->cp_attention_forward(out, lse, qkv);
  }
  bool cp_attention_backward(TypedPtr dqkv, TypedPtr dout, TypedPtr qkv, TypedPtr out, const float* lse) override {
    return inner_->cp_attention_backward(dqkv, dout, qkv, out, lse);
  }
  bool ep_all_to_all(const void* in, const std::vector<int64_t>& send, void* out, const std::vector<int64_t>& recv,
                     size_t elem_bytes) override {
    return inner_->ep_all_to_all(in, send, out, recv, elem_bytes);
  }

 protected:
  ParallelHooks* inner_;

 private:
  ParallelHooks defaults_;
};

}  // namespace ds::rt
