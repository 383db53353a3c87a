// ZeRO stages 0-3 over the model's hooks. The algorithm per stage is in zero.h; here are the
// mechanics and the why.
//
// Gradient buckets. The model reports units ready in reverse layout order (final LayerNorm, the
// last layer ... the first layer, position embedding, token embedding), so consecutive ready units
// are adjacent in the flat layout and a bucket is always ONE contiguous global range [lo, hi):
// stage 0/1 all-reduce it in place in the model's gradient buffer; stage 2/3 fill a bucket
// buffer from its end towards its start (the units arrive highest offset first), so the buffer's
// used tail is exactly the range's gradients in layout order and reduce_scatter_v over the
// range's per-rank shares (Partition::counts_in) delivers each owner its slice.
//
// Stage 3 prefetch. The order in which the model asks for units is fixed by the piece it runs
// (embedding, layers, head, layers backwards), so the engine lays out that order at
// begin_micro_batch and, whenever the model asks for a unit, issues the gathers of the next
// units of that order (async, in order) within the prefetch and live budgets. If the model ever
// asks out of order, prefetching stops for the micro-batch (correct, only slower) -- on every
// rank alike, since all ranks run the same pieces.
#include "parallel/zero.h"

#include <algorithm>
#include <chrono>

#include "common/check.h"
#include "common/error.h"
#include "kernels/dispatch.h"
#include "kernels/typed.h"
#include "parallel/typed_comm.h"

namespace ds::rt::parallel {

namespace ms = ds::model_spec;
namespace tk = kern::typed;
using comm::DataType;
using comm::ReduceOp;

namespace {

// Runs f() and adds the seconds it took to `acc` (the exposed-communication counters).
template <typename F>
void timed(double& acc, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  acc += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void wait_timed(double& acc, comm::WorkPtr& w) {
  if (!w) return;
  timed(acc, [&] { w->wait(); });
  w.reset();
}

}  // namespace


ZeroEngine::ZeroEngine(const ZeroOptions& options, comm::CommPtr dp, const ms::ParamLayout& layout,
                       Allocator& alloc)
    : opt_(options), comm_(std::move(dp)), layout_(layout), alloc_(alloc),
      part_(layout.total, comm_ ? comm_->size() : 1) {
  if (opt_.stage < 0 || opt_.stage > 3) {
    throw invalid_argument("zero_optimization.stage {} is not one of 0, 1, 2, 3", opt_.stage);
  }
  if (opt_.reduce_bucket_size < 1 || opt_.allgather_bucket_size < 1 ||
      opt_.prefetch_bucket_size < 0 || opt_.max_live_parameters < 0) {
    throw invalid_argument("zero_optimization: bucket sizes must be positive (reduce {}, allgather "
                           "{}, prefetch {}, max live {})",
                           opt_.reduce_bucket_size, opt_.allgather_bucket_size,
                           opt_.prefetch_bucket_size, opt_.max_live_parameters);
  }
  if (comm_) {
    rank_ = comm_->rank();
    size_ = comm_->size();
  }
  const size_t nu = layout_.units.size();
  placed_.assign(nu, TypedPtr());
  const size_t gb = dtype_size(opt_.grad_dtype), pb = dtype_size(opt_.param_dtype);
  const int64_t mine = part_.count(rank_);
  for (size_t i = 0; i < nu; ++i) {
    if (layout_.units[i].kind == ms::UnitKind::kTokenEmbedding) wte_idx_ = static_cast<int>(i);
  }

  if (opt_.stage >= 2) {
    grad_part_ = alloc_.allocate(static_cast<size_t>(mine) * gb, MemTag::kGrads,
                                 "zero gradient partition", opt_.device);
    fp_.grad_partition = mine;
    const auto sizes = layout::zero_gradient_buffers(layout_, opt_.reduce_bucket_size);  // as the plan counts
    const int64_t wte_n = sizes.token_embedding;
    cap_ = sizes.bucket;
    const int nb = opt_.overlap_comm ? 2 : 1;
    for (int b = 0; b < nb; ++b) {
      buckets_[b] = alloc_.allocate(static_cast<size_t>(cap_) * gb, MemTag::kGrads,
                                    "zero gradient bucket", opt_.device);
      pend_[b].out = alloc_.allocate(static_cast<size_t>(std::min(cap_, mine)) * gb,
                                     MemTag::kComm, "zero reduce-scatter receive", opt_.device);
      fp_.grad_buckets += cap_;
      fp_.comm += std::min(cap_, mine);
    }
    if (wte_n > 0) {
      wte_buf_ = alloc_.allocate(static_cast<size_t>(wte_n) * gb, MemTag::kGrads,
                                 "zero token-embedding gradient", opt_.device);
      pend_[2].out = alloc_.allocate(static_cast<size_t>(std::min(wte_n, mine)) * gb,
                                     MemTag::kComm, "zero reduce-scatter receive", opt_.device);
      fp_.grad_buckets += wte_n;
      fp_.comm += std::min(wte_n, mine);
    }
  }
  if (opt_.stage == 3) {
    shard_ = alloc_.allocate(static_cast<size_t>(mine) * pb, MemTag::kParams,
                             "zero parameter shard", opt_.device);
    fp_.param_partition = mine;
    persistent_.resize(nu);
    gathered_.resize(nu);
    prefetched_.assign(nu, false);
    for (size_t i = 0; i < nu; ++i) {
      const int64_t n = layout_.units[i].numel;
      if (n <= opt_.param_persistence_threshold) {
        persistent_[i] = alloc_.allocate(static_cast<size_t>(n) * pb, MemTag::kParams,
                                         "zero persistent unit", opt_.device);
        fp_.persistent += n;
      }
    }
  }
  if ((opt_.stage == 1 || opt_.stage == 2) && comm_ && opt_.allgather_bucket_size < part_.stride()) {
    const int64_t n = opt_.allgather_bucket_size * size_;
    stage_buf_ = alloc_.allocate(static_cast<size_t>(n) * pb, MemTag::kComm,
                                 "zero all-gather staging", opt_.device);
    fp_.comm += n;
  }
}

ZeroEngine::~ZeroEngine() {
  // Never free a buffer the communication thread may still read or write.
  auto quiet = [](const comm::WorkPtr& w) {
    if (!w) return;
    try {
      w->wait();
    } catch (...) {
    }
  };
  for (auto& w : ar_works_) quiet(w);
  for (auto& p : pend_) quiet(p.work);
  for (auto& g : gathered_) quiet(g.work);
}

void ZeroEngine::attach(TypedPtr model_params, TypedPtr model_grads) {
  if (model_owns_params() && !model_params) {
    throw invalid_usage("ZeRO stage {}: the model must own its parameters", opt_.stage);
  }
  if (model_owns_grads() && !model_grads) {
    throw invalid_usage("ZeRO stage {}: the model must own its gradients", opt_.stage);
  }
  if ((model_params && model_params.dtype != opt_.param_dtype) ||
      (model_grads && model_grads.dtype != opt_.grad_dtype)) {
    throw invalid_usage("ZeRO: the model stores parameters as {} and gradients as {}, the engine was built for {} "
                        "and {}",
                        dtype_name(model_params.dtype), dtype_name(model_grads.dtype), dtype_name(opt_.param_dtype),
                        dtype_name(opt_.grad_dtype));
  }
  model_params_ = model_params;
  model_grads_ = model_grads;
}

TypedPtr ZeroEngine::opt_params() {
  return opt_.stage == 3 ? params_of(shard_) : model_params_ + opt_begin();
}

TypedPtr ZeroEngine::opt_grads() {
  return opt_.stage >= 2 ? grads_of(grad_part_) : model_grads_ + opt_begin();
}

int ZeroEngine::unit_index(const Unit& u) const {
  const auto* s = layout_.find_unit(u.kind, u.layer);
  DS_CHECK(s != nullptr, "unit not in the layout");
  return static_cast<int>(s - layout_.units.data());
}

// ---- collectives (with the size-1 fallback) ---------------------------------------------------

comm::WorkPtr ZeroEngine::all_reduce(TypedPtr buf, int64_t n, bool async) {
  if (!comm_) return nullptr;
  const DataType t = comm_dtype(buf.dtype);
  if (async) return comm_->all_reduce_async(buf.data, static_cast<size_t>(n), t, ReduceOp::kSum);
  timed(reduce_wait_s_, [&] { comm_->all_reduce(buf.data, static_cast<size_t>(n), t, ReduceOp::kSum); });
  return nullptr;
}

comm::WorkPtr ZeroEngine::reduce_scatter_range(TypedPtr in, int64_t lo, int64_t hi, TypedPtr out, bool async) {
  auto counts = part_.counts_in(lo, hi);
  if (!comm_) {
    tk::copy(out, in, static_cast<int64_t>(counts[0]));
    return nullptr;
  }
  const DataType t = comm_dtype(in.dtype);
  if (async) return comm_->reduce_scatter_v_async(in.data, out.data, counts, t, ReduceOp::kSum);
  timed(reduce_wait_s_, [&] { comm_->reduce_scatter_v(in.data, out.data, counts, t, ReduceOp::kSum); });
  return nullptr;
}

comm::WorkPtr ZeroEngine::all_gather_range(int64_t lo, int64_t hi, TypedPtr shard, TypedPtr out, bool async) {
  const int64_t b = part_.begin(rank_);
  layout::Range r = layout::intersect(lo, hi, b, part_.end(rank_));
  // An empty share may sit past a null shard: no pointer arithmetic on it.
  const TypedPtr in = r.size() > 0 ? shard + (r.lo - b) : shard;
  if (!comm_) {
    if (r.size() == 0) return nullptr;
    tk::copy(out + (r.lo - lo), in, r.size());
    return nullptr;
  }
  auto counts = part_.counts_in(lo, hi);
  const DataType t = comm_dtype(out.dtype);
  if (async) return comm_->all_gather_v_async(in.data, out.data, counts, t);
  timed(gather_wait_s_, [&] { comm_->all_gather_v(in.data, out.data, counts, t); });
  return nullptr;
}

// ---- steps -------------------------------------------------------------------------------------

void ZeroEngine::begin_step() {
  const kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  if (opt_.stage >= 2) {
    if (!grad_part_.empty()) kern::fill_zero(grad_part_.data(), grad_part_.bytes());
  } else {
    tk::fill_zero(model_grads_, part_.total());
  }
}

void ZeroEngine::begin_micro_batch(bool last, bool backward) {
  const kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  reducing_ = opt_.stage < 2 && last && backward && !local_gradients_;
  grads_final_ = backward && (opt_.stage >= 2 || last);
  ar_lo_ = ar_hi_ = 0;
  std::fill(placed_.begin(), placed_.end(), TypedPtr());
  wte_fresh_ = false;
  fill_ = bucket_ready_ = 0;
  if (opt_.stage == 3) {
    // The order Model::forward / forward_backward ask for units (whole model).
    seq_.clear();
    std::vector<int> layers;
    int wpe = -1, lnf = -1;
    for (size_t i = 0; i < layout_.units.size(); ++i) {
      switch (layout_.units[i].kind) {
        case ms::UnitKind::kPositionEmbedding: wpe = static_cast<int>(i); break;
        case ms::UnitKind::kFinalNorm: lnf = static_cast<int>(i); break;
        case ms::UnitKind::kLayer:
        case ms::UnitKind::kExperts:
        case ms::UnitKind::kAdapters: layers.push_back(static_cast<int>(i)); break;  // an engine holds one kind
        default: break;
      }
    }
    if (wte_idx_ >= 0) seq_.push_back(wte_idx_);
    if (wpe >= 0) seq_.push_back(wpe);
    seq_.insert(seq_.end(), layers.begin(), layers.end());
    if (wte_idx_ >= 0 && lnf >= 0 && opt_.tied_head) seq_.push_back(wte_idx_);
    if (lnf >= 0) seq_.push_back(lnf);
    if (backward) seq_.insert(seq_.end(), layers.rbegin(), layers.rend());
    cursor_ = pf_ = 0;
    seq_ok_ = true;
    inflight_prefetch_ = 0;
    std::fill(prefetched_.begin(), prefetched_.end(), false);
    prefetch();
  }
}

void ZeroEngine::end_micro_batch() {
  const kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  if (opt_.stage < 2) {
    if (reducing_) {
      flush_allreduce();
      for (auto& w : ar_works_) wait_timed(reduce_wait_s_, w);
      ar_works_.clear();
    }
    reducing_ = false;
  } else {
    flush_bucket();
    for (auto& p : pend_) complete(p);
  }
  if (opt_.stage == 3) {
    // Prefetched units the model did not ask for (out-of-order use): wait and release.
    for (size_t i = 0; i < gathered_.size(); ++i) {
      auto& g = gathered_[i];
      if (g.buf.empty()) continue;
      wait_timed(gather_wait_s_, g.work);
      live_ -= layout_.units[i].numel;
      pool_[layout_.units[i].numel].push_back(std::move(g.buf));
    }
  }
}

void ZeroEngine::gather_params() {
  const kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  if (opt_.stage == 0) return;
  if (opt_.stage == 3) {
    for (size_t i = 0; i < persistent_.size(); ++i) {
      if (persistent_[i].empty()) continue;
      const auto& s = layout_.units[i];
      all_gather_range(s.offset, s.offset + s.numel, params_of(shard_), params_of(persistent_[i]), false);
    }
    return;
  }
  if (!comm_) return;  // one rank: the parameters were updated in place
  const int64_t k = opt_.allgather_bucket_size;
  if (k >= part_.stride()) {
    all_gather_range(0, part_.total(), model_params_ + part_.begin(rank_), model_params_, false);
    return;
  }
  // Chunked: chunk j carries elements [j*k, (j+1)*k) of every rank's partition through the
  // staging buffer, then each rank's piece is copied to its place.
  const int64_t chunks = (part_.stride() + k - 1) / k;
  std::vector<size_t> counts(static_cast<size_t>(size_));
  for (int64_t j = 0; j < chunks; ++j) {
    for (int q = 0; q < size_; ++q) {
      counts[static_cast<size_t>(q)] =
          static_cast<size_t>(std::clamp<int64_t>(part_.count(q) - j * k, 0, k));
    }
    const TypedPtr in = model_params_ + part_.begin(rank_) + std::min(j * k, part_.count(rank_));
    timed(gather_wait_s_, [&] { comm_->all_gather_v(in.data, stage_buf_.data(), counts, comm_dtype(opt_.param_dtype)); });
    size_t off = 0;
    for (int q = 0; q < size_; ++q) {
      const size_t c = counts[static_cast<size_t>(q)];
      if (q != rank_ && c > 0) {
        tk::copy(model_params_ + part_.begin(q) + j * k, params_of(stage_buf_) + static_cast<int64_t>(off),
                 static_cast<int64_t>(c));
      }
      off += c;
    }
  }
}

void ZeroEngine::all_gather_partitions(TypedPtr full) {
  const kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  all_gather_range(0, part_.total(), full + part_.begin(rank_), full, false);
}

ZeroEngine::CommTimes ZeroEngine::comm_times() const {
  CommTimes t;
  t.reduce_wait_s = reduce_wait_s_;
  t.gather_wait_s = gather_wait_s_;
  if (comm_) {
    using K = comm::Comm::OpKind;
    const double ar = comm_->busy_seconds(K::kAllReduce), rs = comm_->busy_seconds(K::kReduceScatter);
    t.reduce_busy_s = ar < 0 || rs < 0 ? -1.0 : ar + rs;
    t.gather_busy_s = comm_->busy_seconds(K::kAllGather);
  }
  return t;
}

void ZeroEngine::require_host_comm(const char* what) const {
  if (comm_ && comm_->backend() == comm::Backend::kNccl) {
    throw invalid_usage("ZeroEngine::{}: the dp group is NCCL (device buffers only); sum host values "
                        "over a host group (the trainer uses its world group)",
                        what);
  }
}

std::vector<double> ZeroEngine::sum_over_ranks(const std::vector<double>& mine) {
  require_host_comm("sum_over_ranks");
  return comm::sum_in_rank_order(comm_.get(), mine);
}

std::vector<int64_t> ZeroEngine::gather_int64(const std::vector<int64_t>& mine) {
  require_host_comm("gather_int64");
  return comm::gather_int64(comm_.get(), mine);
}

void ZeroEngine::barrier() {
  if (comm_) comm_->barrier();
}

// ---- gradients ---------------------------------------------------------------------------------

void ZeroEngine::flush_allreduce() {
  if (ar_hi_ <= ar_lo_) return;
  auto w = all_reduce(model_grads_ + ar_lo_, ar_hi_ - ar_lo_, opt_.overlap_comm);
  if (w) ar_works_.push_back(std::move(w));
  ar_lo_ = ar_hi_ = 0;
}

void ZeroEngine::complete(Pending& p) {
  wait_timed(reduce_wait_s_, p.work);
  if (p.count > 0) tk::add_in_place(grads_of(grad_part_) + p.dst, grads_of(p.out), p.count);
  p.count = 0;
}

void ZeroEngine::flush_bucket() {
  if (fill_ == 0) return;
  DS_CHECK(bucket_ready_ == fill_, "a gradient bucket was flushed before all its units were ready");
  const int64_t lo = bucket_lo_, hi = lo + fill_;
  const TypedPtr in = grads_of(buckets_[cur_]) + (cap_ - fill_);
  Pending& p = pend_[cur_];
  const int64_t b = part_.begin(rank_);
  layout::Range r = layout::intersect(lo, hi, b, part_.end(rank_));
  p.dst = r.lo - b;
  p.count = r.size();
  p.work = reduce_scatter_range(in, lo, hi, grads_of(p.out), opt_.overlap_comm);
  if (!opt_.overlap_comm) complete(p);
  fill_ = bucket_ready_ = 0;
  if (opt_.overlap_comm) {
    cur_ = 1 - cur_;
    complete(pend_[cur_]);  // the buffer we fill next must be free
  }
}

TypedPtr ZeroEngine::grads_needed(Unit unit, TypedPtr resident) {
  if (opt_.stage < 2) return resident;
  const kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  const int idx = unit_index(unit);
  if (idx == wte_idx_) {
    if (!wte_fresh_) {
      kern::fill_zero(wte_buf_.data(), wte_buf_.bytes());
      wte_fresh_ = true;
    }
    return grads_of(wte_buf_);
  }
  if (placed_[static_cast<size_t>(idx)]) return placed_[static_cast<size_t>(idx)];
  const auto& s = layout_.units[static_cast<size_t>(idx)];
  if (fill_ > 0 && (fill_ + s.numel > cap_ || s.offset + s.numel != bucket_lo_)) flush_bucket();
  const TypedPtr p = grads_of(buckets_[cur_]) + (cap_ - fill_ - s.numel);
  tk::fill_zero(p, s.numel);
  placed_[static_cast<size_t>(idx)] = p;
  fill_ += s.numel;
  bucket_lo_ = s.offset;
  return p;
}

void ZeroEngine::grads_ready(Unit unit) {
  const kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  const int idx = unit_index(unit);
  const auto& s = layout_.units[static_cast<size_t>(idx)];
  if (opt_.stage < 2) {
    if (!reducing_) return;
    if (ar_hi_ > ar_lo_ && s.offset + s.numel != ar_lo_) flush_allreduce();
    if (ar_hi_ <= ar_lo_) ar_hi_ = s.offset + s.numel;
    ar_lo_ = s.offset;
    if (ar_hi_ - ar_lo_ >= opt_.reduce_bucket_size) flush_allreduce();
    return;
  }
  if (idx == wte_idx_) {
    DS_CHECK(wte_fresh_, "token-embedding gradient reported ready before it was requested");
    flush_bucket();
    Pending& p = pend_[2];
    complete(p);
    const int64_t b = part_.begin(rank_);
    layout::Range r = layout::intersect(s.offset, s.offset + s.numel, b, part_.end(rank_));
    p.dst = r.lo - b;
    p.count = r.size();
    p.work = reduce_scatter_range(grads_of(wte_buf_), s.offset, s.offset + s.numel, grads_of(p.out),
                                  opt_.overlap_comm);
    if (!opt_.overlap_comm) complete(p);
    return;
  }
  DS_CHECK(static_cast<bool>(placed_[static_cast<size_t>(idx)]), "unit reported ready without a gradient buffer");
  bucket_ready_ += s.numel;
  if (bucket_ready_ >= opt_.reduce_bucket_size) flush_bucket();
}

// ---- stage 3 parameters ------------------------------------------------------------------------

Buffer ZeroEngine::take_buffer(int64_t n) {
  auto& free = pool_[n];
  if (!free.empty()) {
    Buffer b = std::move(free.back());
    free.pop_back();
    return b;
  }
  return alloc_.allocate(static_cast<size_t>(n) * dtype_size(opt_.param_dtype), MemTag::kParams,
                         "zero gathered unit", opt_.device);
}

void ZeroEngine::issue_gather(int idx) {
  const auto& s = layout_.units[static_cast<size_t>(idx)];
  Gathered& g = gathered_[static_cast<size_t>(idx)];
  g.buf = take_buffer(s.numel);
  live_ += s.numel;
  g.work = all_gather_range(s.offset, s.offset + s.numel, params_of(shard_), params_of(g.buf), comm_ != nullptr);
}

void ZeroEngine::prefetch() {
  if (!seq_ok_) return;
  pf_ = std::max(pf_, cursor_);
  while (pf_ < seq_.size()) {
    const int idx = seq_[pf_];
    const auto i = static_cast<size_t>(idx);
    if (!persistent_[i].empty()) {
      ++pf_;
      continue;
    }
    const int64_t n = layout_.units[i].numel;
    if (!gathered_[i].buf.empty()) break;  // still live from an earlier use: wait for its release
    if (inflight_prefetch_ + n > opt_.prefetch_bucket_size) break;
    if (live_ + n > opt_.max_live_parameters) break;
    issue_gather(idx);
    prefetched_[i] = true;
    inflight_prefetch_ += n;
    ++pf_;
  }
}

TypedPtr ZeroEngine::params_needed(Unit unit, TypedPtr resident) {
  if (opt_.stage < 3) return resident;
  const kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  const int idx = unit_index(unit);
  const auto i = static_cast<size_t>(idx);
  if (seq_ok_ && cursor_ < seq_.size() && seq_[cursor_] == idx) {
    ++cursor_;
  } else {
    seq_ok_ = false;
  }
  if (!persistent_[i].empty()) {
    prefetch();
    return params_of(persistent_[i]);
  }
  Gathered& g = gathered_[i];
  if (g.buf.empty()) issue_gather(idx);
  if (prefetched_[i]) {
    prefetched_[i] = false;
    inflight_prefetch_ -= layout_.units[i].numel;
  }
  wait_timed(gather_wait_s_, g.work);
  prefetch();
  return params_of(g.buf);
}

void ZeroEngine::params_done(Unit unit) {
  if (opt_.stage < 3) return;
  const int idx = unit_index(unit);
  const auto i = static_cast<size_t>(idx);
  if (!persistent_[i].empty()) return;
  Gathered& g = gathered_[i];
  DS_CHECK(!g.buf.empty(), "params_done for a unit that was not gathered");
  DS_CHECK(!g.work, "params_done before the unit's gather completed");
  live_ -= layout_.units[i].numel;
  pool_[layout_.units[i].numel].push_back(std::move(g.buf));
  prefetch();
}

}  // namespace ds::rt::parallel
