// ZeRO data parallelism (DeepSpeed's stages 0-3) as the model's ParallelHooks plus the few calls
// the trainer makes around a step. The engine owns every collective of data parallelism; the
// trainer and the model call none.
//
// Buffers (N = data-parallel size, P = parameters, Partition: layout/partition.h):
//   stage 0  model: full params + full grads. Grads all-reduced in buckets of reduce_bucket_size
//            elements as the last micro-batch's backward reports units ready (grads_ready), async
//            when overlap_comm. Optimizer over all P on every rank (the trainer's buffers).
//   stage 1  as stage 0 for grads; the optimizer covers only this rank's partition; after the
//            update, parameters are all-gathered in chunks of allgather_bucket_size per rank.
//   stage 2  model: full params, NO grad buffer. grads_needed serves each unit a slice of a
//            bucket buffer (two buckets when overlap_comm) or, for the token embedding (needed
//            from the head to the end of backward), its own buffer; a full bucket is
//            reduce-scattered into the owners' partitions and added to this rank's gradient
//            partition (P/N). Every micro-batch reduces (DeepSpeed's ZeRO-2).
//   stage 3  as stage 2 for grads; parameters too are partitioned (P/N, tag params). A unit is
//            all-gathered into a pooled buffer when the model asks (params_needed) and released
//            at params_done; the next units of the expected order are prefetched within
//            stage3_prefetch_bucket_size elements; at most stage3_max_live_parameters elements of
//            gathered units exist at once (the unit being asked for is always gathered). Units
//            of at most stage3_param_persistence_threshold elements stay resident (gathered after
//            every update).
// Tags: partitions and gathered/persistent units are params/grads; bucket buffers are grads
// (they hold gradients the model accumulates into); receive and staging buffers are comm.
//
// Order: every rank must run the same pieces in the same order (the model's hooks are called in
// a fixed order), so every rank issues the same collectives; decisions depend only on sizes and
// the config, never on timing.
// Failures: collectives throw ds::Error naming the dead or late rank (comm.h); the engine lets
// them propagate (the Comm is then broken and the job must restart).
// dp size 1 (no Comm): the same code with local copies in place of collectives.
// Device: every buffer is on ZeroOptions::device; element work goes through kern:: on that
// device. On a GPU the Comm must be NCCL (it orders its stream after the model's, and Work::wait
// returns once the collective finished on the device), and opt_params()/opt_grads() are device
// pointers.
// Thread safety: one thread (the model's) drives the engine.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "core/allocator.h"
#include "core/typed_ptr.h"
#include "model/hooks.h"
#include "model_spec/shape.h"
#include "layout/partition.h"

namespace ds::rt::parallel {

struct ZeroOptions {
  int stage = 0;
  bool overlap_comm = false;
  int64_t reduce_bucket_size = 500000000;     // elements
  int64_t allgather_bucket_size = 500000000;  // elements, per rank per chunk
  int64_t prefetch_bucket_size = 50000000;    // stage 3
  int64_t param_persistence_threshold = 100000;
  int64_t max_live_parameters = 1000000000;
  // Where the model's parameters and gradients live, and so every buffer of the engine: kCpu, or
  // kCuda (the current device) with the Comm's backend taking device pointers (NCCL). The
  // engine's own element work (zeroing, copies, adding received partitions) runs through the
  // kernel dispatch (kernels/dispatch.h) on that device, in the order of `cuda_stream` (a
  // cudaStream_t; nullptr = the legacy default stream), the model's stream.
  Device device = Device::kCpu;
  void* cuda_stream = nullptr;
  // Element types: parameters (the model's storage type: shards, gathered and persistent units,
  // the all-gathers) and gradients (the model's gradient type: buckets, partitions, the
  // reductions). Collectives move these types: a bf16 model reduces and gathers 2 bytes per
  // element (the backends sum 16-bit values in fp32, comm.h).
  DType param_dtype = DType::kF32;
  DType grad_dtype = DType::kF32;
  // The head reads the token embedding (a tied head): stage 3 prefetches it again before
  // the final norm unit. An untied head lives in the final-norm unit alone.
  bool tied_head = true;
};

// What the engine allocated, in elements (for docs, logs and the memory tests).
struct ZeroFootprint {
  int64_t grad_partition = 0;   // stage 2/3
  int64_t grad_buckets = 0;     // stage 2/3: bucket buffers + token-embedding buffer
  int64_t param_partition = 0;  // stage 3
  int64_t persistent = 0;       // stage 3
  int64_t comm = 0;             // receive/staging buffers
};

class ZeroEngine final : public ParallelHooks {
 public:
  // `dp` is the data-parallel group (null: size 1). `layout` is the model's flat layout (the
  // whole model; pipeline parts come with issue 6). Throws invalid_argument for a stage outside
  // 0..3 or non-positive sizes.
  ZeroEngine(const ZeroOptions& options, comm::CommPtr dp, const model_spec::ParamLayout& layout,
             Allocator& alloc);
  ~ZeroEngine() override;

  int stage() const { return opt_.stage; }
  int dp_rank() const { return rank_; }
  int dp_size() const { return size_; }
  const layout::Partition& partition() const { return part_; }
  // The model must be built with these (ModelOptions own_params / own_grads).
  bool model_owns_params() const { return opt_.stage < 3; }
  bool model_owns_grads() const { return opt_.stage < 2; }
  // The model, built with this engine as its hooks. Must be called once before training.
  void attach(TypedPtr model_params, TypedPtr model_grads);

  // The global range the optimizer of this rank covers: everything at stage 0, the partition
  // from stage 1.
  int64_t opt_begin() const { return opt_.stage == 0 ? 0 : part_.begin(rank_); }
  int64_t opt_count() const { return opt_.stage == 0 ? part_.total() : part_.count(rank_); }
  // fp32 parameters of the optimizer's range (model storage at stages 0-2, the shard at 3) and
  // the reduced gradients of that range (valid after the last micro-batch's end_micro_batch).
  TypedPtr opt_params();
  TypedPtr opt_grads();

  // Stage 3 of an fp32 model: fills the parameter shard (and the persistent units) from full
  // initial values, given as a function writing `count` float values of global elements
  // [begin, begin + count).
  template <typename F>
  void fill_shard(F&& fill) {
    fill(opt_params().f32(), opt_begin(), opt_count());
    gather_params();
  }

  // ---- a step ----
  void begin_step();  // zeroes the gradients
  // Before each micro-batch's forward(+backward). `last`: the last accumulation micro-batch
  // (stages 0/1 reduce only then). `backward`: forward_backward (false: forward only, e.g. eval).
  void begin_micro_batch(bool last, bool backward);
  // The gradients served in this micro-batch are reduced (or, with dp 1, final) at its end: every
  // backward micro-batch at stages 2/3 (fresh buckets), the last one at 0/1 (the buffer accumulates).
  bool grads_final_this_micro_batch() const override { return grads_final_; }
  // After the micro-batch: flushes and waits for every reduction it started.
  void end_micro_batch();
  // Stage 0: this step's gradients stay local to the rank (no all-reduce over dp). The 1-bit
  // optimizers exchange their compressed momentum instead (train/optimizer_state.h).
  void set_local_gradients(bool local) { local_gradients_ = local; }
  // The data-parallel group (null at dp size 1).
  comm::Comm* dp_comm() const { return comm_.get(); }
  // After the optimizer updated opt_params(): stage 1/2 all-gather the parameters, stage 3
  // re-gathers the persistent units. Nothing at stage 0.
  void gather_params();

  // `full` (P elements) holds this rank's partition at its place; fills in every other rank's
  // (in place, collective). For exports and tests.
  // Any element type (fp32 master weights for an export, the parameters' type, ...).
  void all_gather_partitions(TypedPtr full);

  // Sums of per-rank values, identical bits on every rank (gathered, summed in rank order). Host
  // values: invalid_usage when the dp group is NCCL (a GPU run sums over a host group instead).
  std::vector<double> sum_over_ranks(const std::vector<double>& mine);
  // Every rank's values (int64), rank-major.
  std::vector<int64_t> gather_int64(const std::vector<int64_t>& mine);
  void barrier();

  const ZeroFootprint& footprint() const { return fp_; }

  // For the wall-clock breakdown, cumulative since construction. `*_wait_s`: seconds the model's
  // thread was blocked on the dp group (a synchronous collective, or waiting for an asynchronous
  // one), for the gradient reductions and for the parameter gathers; the exposed communication.
  // `*_busy_s`: seconds the dp group spent running them (its communication thread included;
  // negative where the backend does not measure it; 0 with dp 1).
  struct CommTimes {
    double reduce_wait_s = 0, gather_wait_s = 0;
    double reduce_busy_s = 0, gather_busy_s = 0;
  };
  CommTimes comm_times() const;

  // ---- ParallelHooks ----
  TypedPtr params_needed(Unit unit, TypedPtr resident) override;
  void params_done(Unit unit) override;
  TypedPtr grads_needed(Unit unit, TypedPtr resident) override;
  void grads_ready(Unit unit) override;

 private:
  struct Pending {
    comm::WorkPtr work;
    Buffer out;              // receive buffer (reduce-scatter result for this rank)
    int64_t dst = 0;         // offset in the grad partition
    int64_t count = 0;
  };
  struct Gathered {
    Buffer buf;
    comm::WorkPtr work;
  };

  int unit_index(const Unit& u) const;
  void require_host_comm(const char* what) const;
  // Collectives with the dp-size-1 fallback.
  comm::WorkPtr all_reduce(TypedPtr buf, int64_t n, bool async);
  comm::WorkPtr reduce_scatter_range(TypedPtr in, int64_t lo, int64_t hi, TypedPtr out, bool async);
  comm::WorkPtr all_gather_range(int64_t lo, int64_t hi, TypedPtr shard, TypedPtr out, bool async);
  TypedPtr grads_of(const Buffer& b) const { return {b.data(), opt_.grad_dtype}; }
  TypedPtr params_of(const Buffer& b) const { return {b.data(), opt_.param_dtype}; }

  void flush_allreduce();
  void flush_bucket();
  void complete(Pending& p);
  void issue_gather(int idx);
  void prefetch();
  Buffer take_buffer(int64_t n);

  ZeroOptions opt_;
  comm::CommPtr comm_;
  int rank_ = 0, size_ = 1;
  model_spec::ParamLayout layout_;
  Allocator& alloc_;
  layout::Partition part_;
  ZeroFootprint fp_;
  TypedPtr model_params_;
  TypedPtr model_grads_;

  // stage 0/1 reduction
  bool reducing_ = false;
  bool local_gradients_ = false;
  bool grads_final_ = true;
  int64_t ar_lo_ = 0, ar_hi_ = 0;  // pending bucket range (empty when equal)
  std::vector<comm::WorkPtr> ar_works_;

  // stage 2/3 gradients
  Buffer grad_part_;
  Buffer wte_buf_;
  bool wte_fresh_ = false;  // wte_buf_ zeroed for this micro-batch
  int wte_idx_ = -1;
  Buffer buckets_[2];
  int64_t cap_ = 0;         // elements per bucket buffer
  int cur_ = 0;             // bucket being filled
  int64_t fill_ = 0;        // elements placed in the current bucket
  int64_t bucket_lo_ = 0;   // global offset of the current bucket's first element
  int64_t bucket_ready_ = 0;  // elements of the current bucket whose units are ready
  Pending pend_[3];         // buckets 0 and 1, the token embedding
  std::vector<TypedPtr> placed_;  // per unit: where grads_needed put it this micro-batch

  // stage 3 parameters
  Buffer shard_;
  std::vector<Buffer> persistent_;      // per unit (empty when not persistent)
  std::vector<Gathered> gathered_;      // per unit: live or in-flight gathered copy
  std::map<int64_t, std::vector<Buffer>> pool_;  // free gathered buffers by size
  int64_t live_ = 0;                    // elements of gathered_ buffers in use
  std::vector<int> seq_;                // expected params_needed order for this micro-batch
  size_t cursor_ = 0, pf_ = 0;          // next expected, next to prefetch
  bool seq_ok_ = false;
  int64_t inflight_prefetch_ = 0;       // prefetched elements not yet asked for
  std::vector<bool> prefetched_;
  Buffer stage_buf_;                    // stage 1/2 chunked all-gather staging

  // comm_times(): blocked seconds so far (the model's thread only writes them).
  double reduce_wait_s_ = 0, gather_wait_s_ = 0;
};

// The step calls of every ZeroEngine of a rank (a mixture of experts has two: the dense region's
// and the experts'), in order: what the trainer drives around a step.
class ZeroEngines {
 public:
  explicit ZeroEngines(std::vector<ZeroEngine*> engines) : engines_(std::move(engines)) {}
  void begin_step() {
    for (auto* z : engines_) z->begin_step();
  }
  void begin_micro_batch(bool last, bool backward) {
    for (auto* z : engines_) z->begin_micro_batch(last, backward);
  }
  void end_micro_batch() {
    for (auto* z : engines_) z->end_micro_batch();
  }
  void gather_params() {
    for (auto* z : engines_) z->gather_params();
  }
  ZeroEngine& dense() { return *engines_.front(); }

 private:
  std::vector<ZeroEngine*> engines_;
};

}  // namespace ds::rt::parallel
