// Pipeline parallelism's stage side: the driver that runs one step's schedule (pipeline_schedule.h)
// on a stage's Model (any family), passing activations (B,T,C) forward and their gradients (B,T,C) backward with
// the pipeline group's send/recv, and summing the tied token-embedding gradient between the first
// and the last stage. Which layers a stage holds is layout::partition_stages (layout/partition.h).
//
// Layout of a stage's work (the model's pieces, model/decoder.h):
//   forward(mb)   first stage: embed_forward + blocks_forward; others: recv into acts.input, then
//                 blocks_forward. The last stage stops before the head.
//   backward(mb)  last stage: head_forward_backward (the loss and the head's gradients, so the
//                 head's logits never wait in memory between forward and backward) then
//                 blocks_backward; others: recv into d_stream(), blocks_backward; first stage also
//                 embed_backward.
// Activation checkpointing (ModelOptions::recompute) works unchanged inside a stage: the model
// recomputes each layer in its backward from the layer outputs the micro-batch's activations keep.
//
// Deliberately not: the data-parallel / ZeRO reduction (the trainer runs it after run_schedule,
// or through `before_event`/`after_event`), interleaved stages, the optimizer.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "comm/comm.h"
#include "core/allocator.h"
#include "model/model.h"
#include "model_spec/shape.h"
#include "layout/pipeline_schedule.h"

namespace ds::rt::parallel {

// The schedules are lib/layout's (the plan simulates the same order).
using layout::Event;
using layout::EventKind;
using layout::PipelineSchedule;
using layout::event_name;
using layout::peak_in_flight;
using layout::stage_events;

// One micro-batch's tokens, (B,T) int32 each. `tokens` is read on the first stage (forward and
// backward), `targets` on the last; either may be null where not read. Caller-owned, valid for
// the run. Under document-aware packing (ModelOptions::document_token) every stage reads
// `tokens` in its forward: each finds the micro-batch's document starts from them (the trainer's
// loader gives every stage the same window), so nothing beyond the activations crosses stages.
struct MicroBatch {
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
};

struct RunOptions {
  // Gradient of grad_scale * (each micro-batch's mean loss) accumulates (model/decoder.h): pass 1/m (times
  // an fp16 loss scale) for the mean over the step's micro-batches.
  float grad_scale = 1.0f;
  // Sum the tied wte gradient over the first and last stage at the end of the run (pp > 1).
  // Off only for callers that reduce it themselves (after accumulating several runs).
  bool reduce_tied_grads = true;
  // Where the tied wte gradient lives (this tp rank's (Vp/tp, C) part); null: model.grad(kWte).
  // Needed when the model was built without its own gradients (own_grads = false).
  TypedPtr wte_grad;
  // Called around every compute event (kForward / kBackward) of the list, e.g. for ZeRO's
  // begin_micro_batch / end_micro_batch around each backward. May be empty.
  std::function<void(const Event&)> before_event;
  std::function<void(const Event&)> after_event;
};

struct RunResult {
  // Last stage: the mean loss of each micro-batch, indexed by mb; other stages: empty.
  std::vector<float> losses;
  // Last stage: each micro-batch's load-balancing loss (mixture of experts; 0 for a dense model).
  std::vector<double> aux_losses;
  // Last stage of evaluate(mbs, record_top = true): every micro-batch's per-token losses and
  // Activations::target_is_top, B*T each, in micro-batch order.
  std::vector<float> token_losses;
  std::vector<uint8_t> target_is_top;
  int activations_allocated = 0;  // Activations held (the schedule's peak in flight)
  // Wall time of the schedule (its events and the final waits, before the tied-gradient sum) and
  // the part of it spent in the model's forward and backward (without the hooks' before/after
  // calls). 1 - compute_seconds / seconds is the stage's measured bubble (idle, waiting for its
  // neighbours), comparable with the (pp - 1) / (m + pp - 1) of a balanced pipeline.
  double seconds = 0, compute_seconds = 0;
};

class PipelineStage {
 public:
  // `model` is this stage's part (its ModelPart says first/last stage and the layers); `pp` the
  // pipeline group of this (dp, tp) position, whose rank is the stage index (size 1: no
  // pipeline); `tied` the two-rank group {first stage, last stage} of the same position for the
  // tied wte gradient, required exactly when pp->size() > 1 and this stage has the embedding or
  // the head (null otherwise). The model must outlive this object. invalid_argument when the
  // part does not fit the stage index (embedding iff stage 0, head iff last stage).
  // `pp_grads`: optionally a second group over the same ranks for the gradients flowing
  // backwards (null: `pp` carries both directions). Stream-ordered backends need it: NCCL runs a
  // group's operations in issue order on one stream, so a gradient receive queued behind an
  // activation send would wait for the neighbour's matching receive, which that neighbour queues
  // behind its own gradient send; with one group per direction each stream's operations match the
  // neighbour's in order (Megatron batches the pair instead).
  PipelineStage(Model& model, comm::CommPtr pp, comm::CommPtr tied, comm::CommPtr pp_grads = nullptr);

  int stage() const { return pp_->rank(); }
  int stages() const { return pp_->size(); }
  bool is_first() const { return stage() == 0; }
  bool is_last() const { return stage() == stages() - 1; }

  // Runs this stage's `events` (stage_events(kind, stages(), stage(), mbs.size())) over the
  // micro-batches: compute, sends and receives in list order, sends posted asynchronously (a
  // stage never waits for its neighbour to receive before it computes on), every transfer waited
  // for before run_schedule returns. Holds one Activations per micro-batch in flight
  // (allocated on first use, kept for later runs). Gradients accumulate into the model's (or the
  // hooks') gradient buffers; zeroing them is the caller's. Blocking calls are bounded by the
  // groups' Comm timeouts; a failure (a peer died, a timeout, bad tokens) throws ds::Error and
  // leaves the groups broken.
  RunResult run_schedule(const std::vector<Event>& events, std::span<const MicroBatch> mbs,
                         const RunOptions& options = {});

  // Forward only (evaluation): every micro-batch in order through the pipeline (recv, forward,
  // send; the last stage runs head_forward), one Activations, no gradients. Returns the mean
  // loss of each micro-batch on the last stage (empty elsewhere), and with record_top their
  // per-token losses and top-token flags (Activations::record_top). Same failure behaviour as
  // run_schedule.
  RunResult evaluate(std::span<const MicroBatch> mbs, bool record_top = false);

  // The tied wte gradient sum over the first and last stage, in place (no-op for pp == 1 or a
  // middle stage). run_schedule calls it unless options.reduce_tied_grads is false.
  void reduce_tied_grads(TypedPtr wte_grad = {});

  static constexpr int kActivationTag = 11;
  static constexpr int kGradTag = 12;
  static constexpr int kRouterTag = 13;      // a mixture of experts' statistics, forward
  static constexpr int kRouterGradTag = 14;  // and backward

 private:
  Model& model_;
  comm::CommPtr pp_, tied_;
  comm::CommPtr grads_;  // the backward direction's group: pp_grads, else pp_
  std::vector<std::unique_ptr<Activations>> acts_;
  int64_t btc_;
};

// Hooks for the first and last stage of a pipeline, between the model (or TensorParallelHooks)
// and the data-parallel hooks (ZeroEngine): they keep the tied token embedding's gradient out of
// the data-parallel reduction until the pipeline has summed it over the two stages.
//   grads_needed(wte)  returns this object's own buffer (this tp rank's (Vp/tp, C) part), which
//                      accumulates over every micro-batch of the step; inner never sees it.
//   grads_ready(wte)   swallowed (inner would reduce a half-sum).
//   everything else    forwarded to `inner` (null: the defaults).
// The step: zero() once; run_schedule with RunOptions::wte_grad = wte_grad() (sums it over the
// two stages at the end); then, inside one inner micro-batch (ZeroEngine::begin_micro_batch(true,
// true) ... end_micro_batch()), hand_over() adds the sum into inner's wte gradient
// (inner->grads_needed(wte, the model's own slot)) and reports it ready, so ZeRO 0-2 reduce it
// over dp like any other unit. Reduction is linear, so this equals summing over the tied stages
// after the dp reduction. Costs one wte-sized buffer (tag grads) on the first and last stage.
// Thread safety: the model's thread.
class TiedEmbeddingHooks final : public ForwardingHooks {
 public:
  // `wte_numel`: this tp rank's wte elements (model_spec::local_numel of wte). `inner` may be
  // null and must outlive this object. `device` (and `cuda_stream`): the model's, where the
  // buffer lives and the zeroing and adding run (kernels/dispatch.h).
  TiedEmbeddingHooks(ParallelHooks* inner, int64_t wte_numel, Allocator& alloc,
                     Device device = Device::kCpu, void* cuda_stream = nullptr,
                     DType grad_dtype = DType::kF32);

  TypedPtr wte_grad() { return {buf_.data(), grad_dtype_}; }
  void zero();  // before the step's first micro-batch
  // After run_schedule: wte gradient += the tied sum, through inner; see above. Before any
  // micro-batch asked for wte's gradient (hence before run_schedule) there is no model slot to
  // pass on: invalid_usage.
  void hand_over();

  // The token embedding's gradient goes to the buffer; every other hook on to inner.
  TypedPtr grads_needed(Unit unit, TypedPtr resident) override;
  void grads_ready(Unit unit) override;

 private:
  Buffer buf_;
  int64_t n_;
  Device device_;
  void* stream_;
  DType grad_dtype_;
  TypedPtr resident_;  // the model's own wte gradient slot (null without own_grads)
  bool seen_ = false;
};

}  // namespace ds::rt::parallel
