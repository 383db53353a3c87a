// Tensor parallelism's communication: Megatron's named regions over the tensor-parallel group's
// Comm, as the model's ParallelHooks see them. The model (model/decoder.cpp) already computes with
// the Megatron layout (column-parallel qkv / MLP-up, row-parallel projections, vocabulary-parallel
// embedding and loss) and calls a hook exactly where the group must talk; this file decides what
// happens there:
//
//   reduce-from-TP  forward: all-reduce (sum) of a row-parallel matmul's partial output (attention
//                   projection, MLP down-projection) or of the vocabulary-parallel embedding;
//                   backward: identity (the model uses the gradient as is).
//   copy-to-TP      forward: identity (every rank reads the same replicated input);
//                   backward: all-reduce (sum) of the input gradient of a column-parallel matmul
//                   (qkv, MLP up-projection, the vocabulary-parallel lm_head).
//   vocab-parallel loss: per-row max of this rank's logits (all-reduce max), then per-row sums of
//                   exp and the target logit (all-reduce sum); no rank holds full logits.
//
// These are the only places tensor parallelism communicates. Replicated tensors (LayerNorms, row-
// parallel biases, wpe) get identical gradients on every tp rank without communication, because
// every rank computes them from the same (all-reduced) inputs and output gradients.
//
// Megatron's sequence parallelism (ModelOptions::sequence_parallel): outside the tp regions the
// residual stream is split by rows over the group; reduce-from-TP becomes a reduce-scatter,
// copy-to-TP an all-gather before the matmul (and the matching reduce-scatter / all-gather in
// backward: the same bytes as the all-reduces it replaces), and the norms' weight gradients,
// computed from a rank's rows only, are summed over tp (tp_sum_partial_grads).
//
// Deliberately not: async/overlapped tp collectives, data or pipeline parallelism (those compose
// through `inner`, see TensorParallelHooks).
#pragma once

#include <cstdint>

#include "comm/comm.h"
#include "model/hooks.h"

namespace ds::rt::parallel {

// The named regions over one tp group. Every rank of the group must call the same regions in the
// same order with the same counts (the model guarantees it: hooks come in a fixed order). Blocking
// calls bounded by the Comm's timeout; a failure throws the Comm's ds::Error (naming the group,
// rank and peer) and leaves the group broken. Thread safety: one thread at a time (the model's).
class TensorParallelRegions {
 public:
  // `tp` is the tensor-parallel group (size 1 is valid: every region is then a no-op). Non-null.
  explicit TensorParallelRegions(comm::CommPtr tp);

  int size() const { return tp_->size(); }
  int rank() const { return tp_->rank(); }
  comm::Comm& comm() { return *tp_; }

  // reduce-from-TP forward: buf[0..n) = sum over the group, in place.
  void reduce_from_tp_forward(TypedPtr buf, int64_t n);
  // copy-to-TP backward: buf[0..n) = sum over the group, in place.
  void copy_to_tp_backward(TypedPtr buf, int64_t n);
  // Vocabulary-parallel loss statistics, in place: elementwise max / sum over the group.
  void loss_max(float* buf, int64_t n);
  void loss_sum(float* buf, int64_t n);
  // Sequence parallelism: all-gather `local` (n) into `full` (tp x n); reduce-scatter `full`
  // (tp x n) into `local` (n, this rank's share, summed).
  void all_gather(TypedPtr full, TypedPtr local, int64_t n);
  void reduce_scatter(TypedPtr local, TypedPtr full, int64_t n);
  // In place: buf = sum over the group (a replicated parameter's partial gradient).
  void sum(TypedPtr buf, int64_t n);

  // Calls made so far (tests and metrics): forward all-reduces, backward all-reduces, loss ones.
  int64_t forward_calls() const { return forward_calls_; }
  int64_t backward_calls() const { return backward_calls_; }
  int64_t loss_calls() const { return loss_calls_; }
  int64_t bytes_reduced() const { return bytes_; }

 private:
  void reduce(TypedPtr buf, int64_t n, comm::ReduceOp op);
  comm::CommPtr tp_;
  int64_t forward_calls_ = 0, backward_calls_ = 0, loss_calls_ = 0, bytes_ = 0;
};

// ParallelHooks for a tensor-parallel rank: the tp_* hooks go to TensorParallelRegions, every
// other hook (parameters and gradients: ZeRO, data parallelism) to `inner` when given (else the
// defaults: the model's own storage, no reduction). So the trainer stacks its hooks as
//   model -> TensorParallelHooks -> ZeroEngine (or nothing).
// `inner` may be null; it must outlive this object.
class TensorParallelHooks final : public ForwardingHooks {
 public:
  explicit TensorParallelHooks(comm::CommPtr tp, ParallelHooks* inner = nullptr);

  TensorParallelRegions& regions() { return regions_; }

  void tp_reduce_forward(TypedPtr buf, int64_t n) override;
  void tp_reduce_backward(TypedPtr buf, int64_t n) override;
  void tp_loss_reduce_max(float* buf, int64_t n) override;
  void tp_loss_reduce_sum(float* buf, int64_t n) override;
  void tp_all_gather(TypedPtr full, TypedPtr local, int64_t n) override;
  void tp_reduce_scatter(TypedPtr local, TypedPtr full, int64_t n) override;
  void tp_sum_partial_grads(TypedPtr buf, int64_t n) override;

 private:
  TensorParallelRegions regions_;
};

}  // namespace ds::rt::parallel
