// Stage partitioning and the schedule driver (see pipeline_stage.h).
//
// The driver walks the event list. Sends are posted asynchronously and waited for only when their
// buffer is about to change: an activation send before that micro-batch's backward (the model's
// recompute may rewrite layer outputs), the gradient send (it reads d_stream()) before the next
// write of d_stream(). Receives block. With this rule 1F1B between neighbours cannot deadlock:
// a stage never waits for a receive that its neighbour would only post after a send of ours that
// we are waiting on.
#include "parallel/pipeline_stage.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>

#include "common/error.h"
#include "kernels/dispatch.h"
#include "kernels/typed.h"
#include "parallel/typed_comm.h"

namespace ds::rt::parallel {

namespace ms = ds::model_spec;

PipelineStage::PipelineStage(Model& model, comm::CommPtr pp, comm::CommPtr tied, comm::CommPtr pp_grads)
    : model_(model), pp_(std::move(pp)), tied_(std::move(tied)), grads_(pp_grads ? std::move(pp_grads) : pp_) {
  if (!pp_) throw invalid_argument("PipelineStage: the pipeline group's Comm is null");
  if (grads_->size() != pp_->size() || grads_->rank() != pp_->rank()) {
    throw invalid_argument("PipelineStage: the gradient group (rank {} of {}) is not over the pipeline "
                           "group's ranks (rank {} of {})",
                           grads_->rank(), grads_->size(), pp_->rank(), pp_->size());
  }
  const auto& part = model_.part();
  if (part.has_embedding != is_first() || part.has_head != is_last()) {
    throw invalid_argument(
        "PipelineStage: stage {} of {} holds a part with embedding={} head={} (layers [{}, {})); "
        "the embedding belongs to stage 0 and the head to stage {} (hint: build the parts with "
        "partition_stages)",
        stage(), stages(), part.has_embedding, part.has_head, part.layer_begin, part.layer_end,
        stages() - 1);
  }
  const bool needs_tied = stages() > 1 && (is_first() || is_last()) && model_.shape().tied();
  if (needs_tied != (tied_ != nullptr)) {
    throw invalid_argument(
        "PipelineStage: stage {} of {} {} a tied-embedding group (it is needed exactly on the "
        "first and last stage of a pipeline with more than one stage, when the embedding is tied)",
        stage(), stages(), needs_tied ? "needs" : "must not have");
  }
  if (tied_ && (tied_->size() != 2 || tied_->rank() != (is_first() ? 0 : 1))) {
    throw invalid_argument(
        "PipelineStage: the tied-embedding group '{}' must be {{first stage, last stage}}; stage "
        "{} is its rank {} of {}",
        tied_->name(), stage(), tied_->rank(), tied_->size());
  }
  btc_ = model_.stream_rows() * model_.shape().n_embd;
}

void PipelineStage::reduce_tied_grads(TypedPtr wte_grad) {
  if (!tied_) return;
  const TypedPtr g = wte_grad ? wte_grad : model_.grad(ms::ParamId::kWte);
  const auto all = ms::model_params(model_.shape());
  const int64_t n = ms::local_numel(ms::find_param(all, ms::ParamId::kWte), model_.part().tp);
  tied_->all_reduce(g.data, static_cast<size_t>(n), comm_dtype(g.dtype), comm::ReduceOp::kSum);
}

namespace {

// The events' micro-batches, peers and token pointers, checked before anything runs.
void check_schedule(const std::vector<Event>& events, std::span<const MicroBatch> mbs, int st, int stages) {
  const int m = static_cast<int>(mbs.size());
  const bool first = st == 0, last = st == stages - 1;
  for (const auto& e : events) {
    if (e.mb < 0 || e.mb >= m) {
      throw invalid_argument("run_schedule (stage {}): event {} of micro-batch {} but {} given", st,
                             event_name(e.kind), e.mb, m);
    }
    const bool needs_prev = e.kind == EventKind::kRecvActivation || e.kind == EventKind::kSendGrad;
    const bool needs_next = e.kind == EventKind::kSendActivation || e.kind == EventKind::kRecvGrad;
    if ((needs_prev && first) || (needs_next && last)) {
      throw invalid_argument("run_schedule: event {} on stage {} of {} has no peer", event_name(e.kind), st, stages);
    }
    if (first && e.kind != EventKind::kSendActivation && e.kind != EventKind::kRecvGrad && mbs[e.mb].tokens == nullptr) {
      throw invalid_argument("run_schedule: micro-batch {} has no tokens on the first stage", e.mb);
    }
    if (last && e.kind == EventKind::kBackward && mbs[e.mb].targets == nullptr) {
      throw invalid_argument("run_schedule: micro-batch {} has no targets on the last stage", e.mb);
    }
  }
}

// Which of the stage's activation sets holds each micro-batch in flight: a set is taken at the
// micro-batch's first event and given back after its backward.
class ActivationSlots {
 public:
  ActivationSlots(std::vector<std::unique_ptr<Activations>>& acts, int micro_batches, int stage)
      : acts_(acts), slot_(static_cast<size_t>(micro_batches), -1), stage_(stage) {
    for (int i = static_cast<int>(acts.size()) - 1; i >= 0; --i) free_.push_back(i);
  }
  bool holds(int mb) const { return slot_[static_cast<size_t>(mb)] >= 0; }
  Activations& of(int mb) {
    int& s = slot_[static_cast<size_t>(mb)];
    if (s < 0) {
      if (free_.empty()) {
        throw invalid_usage("run_schedule (stage {}): more micro-batches in flight than {}", stage_, acts_.size());
      }
      s = free_.back();
      free_.pop_back();
    }
    return *acts_[static_cast<size_t>(s)];
  }
  void release(int mb) {
    free_.push_back(slot_[static_cast<size_t>(mb)]);
    slot_[static_cast<size_t>(mb)] = -1;
  }

 private:
  std::vector<std::unique_ptr<Activations>>& acts_;
  std::vector<int> slot_;
  std::vector<int> free_;
  int stage_;
};

}  // namespace

RunResult PipelineStage::run_schedule(const std::vector<Event>& events,
                                      std::span<const MicroBatch> mbs, const RunOptions& opt) {
  const int m = static_cast<int>(mbs.size());
  const int st = stage();
  check_schedule(events, mbs, st, stages());

  const int need = peak_in_flight(events);
  while (static_cast<int>(acts_.size()) < need) acts_.push_back(model_.new_activations());
  ActivationSlots slots(acts_, m, st);
  auto acts_of = [&](int mb) -> Activations& { return slots.of(mb); };

  const auto act_type = comm_dtype(model_.dtype());  // activations and their gradients: the storage type
  const auto n = static_cast<size_t>(btc_);
  std::vector<comm::WorkPtr> act_sends(static_cast<size_t>(m)), router_sends(static_cast<size_t>(m));
  comm::WorkPtr grad_send, router_grad_send;
  // A mixture of experts' load-balancing statistics travel beside the activations and their
  // gradient (Model::pack_router): half 0 forward, half 1 backward.
  const auto wire = static_cast<size_t>(model_.router_wire_floats(*acts_.front()) / 2);
  auto wire_half = [&](Activations& a, int half) { return a.router_wire + half * wire; };
  float* backward_wire = nullptr;  // the last backward's half 1, which kSendGrad sends
  auto wait = [](comm::WorkPtr& w) {
    if (w) {
      w->wait();
      w.reset();
    }
  };
  const auto& part = model_.part();
  RunResult res;
  if (is_last()) res.losses.assign(static_cast<size_t>(m), 0.0f);
  if (is_last()) res.aux_losses.assign(static_cast<size_t>(m), 0.0);
  res.activations_allocated = static_cast<int>(acts_.size());
  using Clock = std::chrono::steady_clock;
  const auto t_start = Clock::now();
  auto since = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };

  for (const auto& e : events) {
    const MicroBatch& mb = mbs[e.mb];
    switch (e.kind) {
      case EventKind::kRecvActivation: {
        Activations& a = acts_of(e.mb);
        pp_->recv(a.input.data, n, act_type, st - 1, kActivationTag);
        if (wire > 0) {
          pp_->recv(wire_half(a, 0), wire, comm::DataType::kFloat32, st - 1, kRouterTag);
          model_.unpack_router(a, 0);
        }
        break;
      }
      case EventKind::kForward: {
        Activations& a = acts_of(e.mb);
        if (opt.before_event) opt.before_event(e);
        const auto t0 = Clock::now();
        if (is_first()) {
          model_.embed_forward(a, mb.tokens);
        } else {
          model_.find_documents(a, mb.tokens);  // packing: every stage reads its window's document starts
        }
        model_.blocks_forward(a, part.layer_begin, part.layer_end);
        if (wire > 0 && !is_last()) model_.pack_router(a, 0);
        res.compute_seconds += since(t0);
        if (opt.after_event) opt.after_event(e);
        break;
      }
      case EventKind::kSendActivation: {
        Activations& a = acts_of(e.mb);
        act_sends[e.mb] = pp_->send_async(model_.output(a).data, n, act_type, st + 1, kActivationTag);
        if (wire > 0) {
          router_sends[e.mb] = pp_->send_async(wire_half(a, 0), wire, comm::DataType::kFloat32, st + 1, kRouterTag);
        }
        break;
      }
      case EventKind::kRecvGrad: {
        wait(grad_send);
        wait(router_grad_send);
        grads_->recv(model_.d_stream().data, n, act_type, st + 1, kGradTag);
        if (wire > 0) {
          Activations& a = acts_of(e.mb);
          grads_->recv(wire_half(a, 1), wire, comm::DataType::kFloat32, st + 1, kRouterGradTag);
          model_.unpack_router(a, 1);
        }
        break;
      }
      case EventKind::kBackward: {
        if (!slots.holds(e.mb)) {
          throw invalid_argument("run_schedule (stage {}): backward of micro-batch {} before its forward", st, e.mb);
        }
        Activations& a = acts_of(e.mb);
        wait(grad_send);
        wait(router_grad_send);
        wait(act_sends[e.mb]);
        wait(router_sends[e.mb]);
        if (opt.before_event) opt.before_event(e);
        const auto t0 = Clock::now();
        if (is_last()) {
          res.losses[e.mb] = model_.head_forward_backward(a, mb.targets, opt.grad_scale);
          res.aux_losses[e.mb] = a.router.load_balancing_loss();
        }
        model_.blocks_backward(a, part.layer_begin, part.layer_end);
        if (is_first()) model_.embed_backward(a, mb.tokens);
        if (wire > 0 && !is_first()) {
          model_.pack_router(a, 1);
          backward_wire = wire_half(a, 1);
        }
        res.compute_seconds += since(t0);
        if (opt.after_event) opt.after_event(e);
        slots.release(e.mb);
        break;
      }
      case EventKind::kSendGrad:
        grad_send = grads_->send_async(model_.d_stream().data, n, act_type, st - 1, kGradTag);
        if (wire > 0) {
          // The slot is released, but its backward half is written only by a later backward,
          // which waits for this send first.
          router_grad_send = grads_->send_async(backward_wire, wire, comm::DataType::kFloat32, st - 1,
                                                kRouterGradTag);
        }
        break;
    }
  }
  wait(grad_send);
  wait(router_grad_send);
  for (auto& w : act_sends) wait(w);
  for (auto& w : router_sends) wait(w);
  res.seconds = since(t_start);
  if (opt.reduce_tied_grads) reduce_tied_grads(opt.wte_grad);
  return res;
}

RunResult PipelineStage::evaluate(std::span<const MicroBatch> mbs, bool record_top) {
  const int m = static_cast<int>(mbs.size());
  for (int i = 0; i < m; ++i) {
    if (is_first() && mbs[i].tokens == nullptr) {
      throw invalid_argument("evaluate: micro-batch {} has no tokens on the first stage", i);
    }
    if (is_last() && mbs[i].targets == nullptr) {
      throw invalid_argument("evaluate: micro-batch {} has no targets on the last stage", i);
    }
  }
  if (acts_.empty()) acts_.push_back(model_.new_activations());
  Activations& a = *acts_.front();
  const auto& part = model_.part();
  const auto n = static_cast<size_t>(btc_);
  a.record_top = record_top;
  RunResult res;
  res.activations_allocated = static_cast<int>(acts_.size());
  for (int i = 0; i < m; ++i) {
    if (is_first()) {
      model_.embed_forward(a, mbs[i].tokens);
    } else {
      pp_->recv(a.input.data, n, comm_dtype(model_.dtype()), stage() - 1, kActivationTag);
      model_.find_documents(a, mbs[i].tokens);
    }
    model_.blocks_forward(a, part.layer_begin, part.layer_end);
    if (is_last()) {
      res.losses.push_back(model_.head_forward(a, mbs[i].targets));
      if (record_top) {
        res.token_losses.insert(res.token_losses.end(), a.host_losses.begin(), a.host_losses.end());
        res.target_is_top.insert(res.target_is_top.end(), a.target_is_top.begin(), a.target_is_top.end());
      }
    } else {
      pp_->send(model_.output(a).data, n, comm_dtype(model_.dtype()), stage() + 1, kActivationTag);
    }
  }
  a.record_top = false;
  return res;
}

TiedEmbeddingHooks::TiedEmbeddingHooks(ParallelHooks* inner, int64_t wte_numel, Allocator& alloc,
                                       Device device, void* cuda_stream, DType grad_dtype)
    : ForwardingHooks(inner),
      buf_(alloc.allocate(static_cast<size_t>(wte_numel) * dtype_size(grad_dtype), MemTag::kGrads,
                          "pipeline tied wte grad", device)),
      n_(wte_numel), device_(device), stream_(cuda_stream), grad_dtype_(grad_dtype) {}

void TiedEmbeddingHooks::zero() {
  const kern::DeviceScope scope(device_, stream_);
  kern::fill_zero(buf_.data(), buf_.bytes());
}

void TiedEmbeddingHooks::hand_over() {
  if (!seen_) {
    throw invalid_usage(
        "TiedEmbeddingHooks::hand_over before any backward asked for the token "
        "embedding's gradient (call it after run_schedule)");
  }
  const Unit wte{ms::UnitKind::kTokenEmbedding};
  const TypedPtr g = inner_->grads_needed(wte, resident_);
  if (!g) {
    throw invalid_usage(
        "TiedEmbeddingHooks::hand_over: the inner hooks serve no gradient for "
        "the token embedding and the model has none");
  }
  {
    const kern::DeviceScope scope(device_, stream_);
    kern::typed::add_in_place(g, wte_grad(), n_);
  }
  inner_->grads_ready(wte);
}

TypedPtr TiedEmbeddingHooks::grads_needed(Unit unit, TypedPtr resident) {
  if (unit.kind != ms::UnitKind::kTokenEmbedding) return inner_->grads_needed(unit, resident);
  resident_ = resident;
  seen_ = true;
  return wte_grad();
}
void TiedEmbeddingHooks::grads_ready(Unit unit) {
  if (unit.kind != ms::UnitKind::kTokenEmbedding) inner_->grads_ready(unit);
}

}  // namespace ds::rt::parallel
