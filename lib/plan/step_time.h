// The step-time model behind `dstrain plan --recommend`: how long one optimizer step of a layout
// takes, from what the machine was measured to do (a Calibration: `dstrain plan --calibrate`,
// calibration.h) or, without a measurement, from built-in constants (Hardware, recommend.h).
// It counts what the runtime does, piece by piece (runtime/model/decoder.cpp, runtime/parallel/):
//
//   per micro-batch of b sequences, on pipeline stage s with layers [l0, l1):
//     F_s = (l1 - l0) * (fwd(b) + 2 AR_tp(bTC)) + [first] (embed_fwd(b) + AR_tp(bTC))
//     B_s = (l1 - l0) * (bwd(b) + 2 AR_tp(bTC) + r * (fwd(b) + 2 AR_tp(bTC)))
//           + [last] (head(b) + AR_tp(bTC)) + [first] embed_bwd(b)
//     where fwd/bwd/embed/head are the calibrated seconds of one layer / piece at micro-batch b
//     for the layout's tp shard (interpolated in b between measured sizes: small micro-batches
//     run kernels less efficiently), r = 1 with activation checkpointing (the backward
//     recomputes the forward), AR_tp(x) one tensor-parallel all-reduce of x bytes (on the critical
//     path: the next kernel needs it).
//   pipeline (pp > 1), 1F1B and GPipe alike (same bubble, different memory), with the stages'
//     slots t_s = F_s + B_s + 2 P2P(bTC) (one activation forward, one gradient back):
//       schedule = sum_s t_s + (m - 1) * max_s t_s
//     so the bubble is sum_s t_s - max_s t_s: (pp - 1) / (m + pp - 1) of it for equal stages.
//   no pipeline: schedule = m * (F + B).
//   data parallelism over dp ranks (bytes: params in the storage type, grads in the config's
//     gradient / communication type; n = the largest part's parameters):
//     ZeRO-0/1  one all-reduce of n grads after the last micro-batch's backward, in buckets
//     ZeRO-2    a reduce-scatter of n grads every micro-batch, in buckets
//     ZeRO-3    per micro-batch all-gathers of n params in the forward, the backward and (r) the
//               recomputation, plus the reduce-scatter of the grads
//     ZeRO-1/2  after the update: an all-gather of the n params
//     With overlap_comm the gradient collectives run while the backward computes; only what
//     sticks out counts: exposed = max(last bucket, total - window * overlap), window = the
//     backward compute they can hide behind (the last micro-batch's for ZeRO-0/1, every one for
//     ZeRO-2/3). ZeRO-3's gathers are prefetched the same way behind the forward and backward.
//     overlap = 1 where a collective runs beside the compute (a GPU's copy engines, or a CPU with
//     a spare core per rank), else 0: on CPUs the shm/Gloo collectives are CPU work themselves.
//   optimizer = (n or n/dp elements) / optimizer rate; offload (CUDA): 2 n/dp bytes over the
//     host link + n/dp / CPU Adam rate.
//   overhead = the calibrated fixed cost of a step.
//   step = schedule + exposed dp + optimizer + offload + overhead.
//
// Shared cores (CPU runs): the pieces above are a rank's alone (concurrency 1), so a pipeline's
// fill and drain, when few stages compute, run at that speed. When all the node's R ranks
// compute at once they get what the node delivers: K(R) = c x t_1 / t_c ranks' worth, from the
// samples at the largest measured concurrency c <= R (R on a GPU node; min(R, cores) without
// samples together). The step is at least the node's compute through that capacity:
//   step = max(step above, sum over the node's ranks of m (F + B) / K(R) + tp all-reduces
//              + exposed dp + optimizer + offload + overhead)
// Data parallelism keeps every rank busy and pays that in full. A pipeline's stages compute at
// once only part of the time, so its schedule is also simulated on the shared cores
// (shared_core_pipeline: the runtime's event order, each event at min(1, K(k) / k) of its alone
// speed while k ranks compute, the send/recv on the edges), and
//   step = max(step above, the bound, simulated schedule - schedule + step above).
// The difference is reported as `shared_cores`. (4 stages of micro-batch 1 on 2 cores: the
// schedule alone said 218 ms and the bound less; simulated 245; measured 269.)
// Pure; no I/O.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "model_spec/shape.h"
#include "plan/memory_model.h"

namespace ds::plan {

// One measured compute point: seconds for ONE micro-batch of `micro_batch` sequences (seq_len
// tokens each) through the pieces of a `tp`-way shard, while `concurrency` ranks of the node
// computed at once, in `precision`.
struct ComputeSample {
  int tp = 1;
  int concurrency = 1;
  int micro_batch = 1;
  Precision precision = Precision::kFp32;
  double layer_fwd = 0, layer_bwd = 0;  // one transformer layer (bwd without recomputation)
  double embed_fwd = 0, embed_bwd = 0;  // token + position embedding
  double head = 0;                      // lnf + lm_head + loss, forward and backward
};

// send_recv: one rank of a pair sends, the other receives. all_to_all: every rank of the group
// sends a piece to every other (Ulysses, expert parallelism). ring_exchange: every rank sends one
// message to the next rank of the group and receives one from the previous, at once (a step of
// the context-parallel ring).
enum class CollectiveOp { kAllReduce, kReduceScatter, kAllGather, kSendRecv, kAllToAll, kRingExchange };
const char* collective_name(CollectiveOp op);  // "all_reduce", ..., "send_recv", "all_to_all", "ring_exchange"

// A collective's cost as latency + bus bytes / bus bandwidth, fitted to measurements.
// Bus bytes (nccl-tests' convention) of a call on a buffer of `bytes` (all_reduce: the buffer;
// reduce_scatter: the input; all_gather: the output; all_to_all: a rank's whole send buffer, its
// own piece included; send_recv and ring_exchange: the message): all_reduce 2 (n-1)/n bytes,
// reduce_scatter, all_gather and all_to_all (n-1)/n bytes, send_recv and ring_exchange bytes.
struct CollectiveFit {
  CollectiveOp op = CollectiveOp::kAllReduce;
  int group_size = 2;
  int concurrent_groups = 1;  // groups that ran at once while measured (world / group_size)
  bool across_nodes = false;
  double latency = 0;  // seconds per call
  double bus_bw = 0;   // bytes/s
  std::vector<std::pair<double, double>> points;  // (bytes, seconds) measured, for the record
};
double bus_bytes(CollectiveOp op, int group_size, double bytes);
double collective_seconds(const CollectiveFit& f, double bytes);

// What the machine does, measured or assumed.
struct Calibration {
  std::string source = "built-in constants";  // or the calibration file's path
  bool measured = false;
  bool cpu = false;           // ranks compute on CPU cores (shared-cores rule applies)
  int cores = 0;              // cores of a node (CPU runs); 0 = unknown / not shared
  int threads_per_rank = 1;
  int ranks_per_node = 8;     // a node's ranks (GPUs per node)
  model_spec::ModelShape shape;  // the model measured (compute rescales by FLOPs for another)
  std::vector<ComputeSample> compute;
  std::vector<CollectiveFit> collectives;
  double optimizer_rate = 1e9;  // parameters/s of the AdamW update on one rank
  double host_link_bw = 16e9;   // bytes/s host <-> device (offload)
  double cpu_adam_rate = 1e9;   // parameters/s of the CPU optimizer (offload)
  double step_overhead = 0;     // seconds per step outside the pieces above
  // Built-in constants only (no samples): FLOP/s and seconds per layer per micro-batch.
  double flops = 125e12;
  double layer_overhead = 50e-6;
  double intra_node_bw = 150e9, inter_node_bw = 12.5e9;
};

// Seconds of one micro-batch through the pieces, at micro-batch b, for the layout's tp, while
// `concurrency` ranks compute at once (what `compute_for` read, interpolated). `scaled` says the calibration was
// of another model shape (rescaled by FLOPs).
struct PieceTimes {
  double layer_fwd = 0, layer_bwd = 0, embed_fwd = 0, embed_bwd = 0, head = 0;
  bool scaled = false;
};
// Samples of (tp, precision, concurrency) nearest the request: tp and precision exact when
// measured, else tp 1 scaled by 1/tp and fp32; concurrency the largest measured <= the request
// (else the smallest). Time is linear in b between measured sizes, and per sequence beyond them.
PieceTimes compute_for(const Calibration& cal, const model_spec::ModelShape& s, int tp, int b,
                       Precision precision, int concurrency);

// Seconds of one collective of `bytes` over a group of `group_size` ranks, `concurrent_groups`
// of them at once: the fit with that op, size and placement (nearest size and concurrency when
// not measured exactly), or the built-in bandwidths. A calibration that measured send/recv but not
// all_to_all or ring_exchange (files written before those were measured) prices them as its
// send/recv: all_to_all as the (n-1)/n of the buffer that leaves the rank, ring_exchange as one
// message; both with every rank of the world in a pair.
double collective_time(const Calibration& cal, CollectiveOp op, int group_size, bool across_nodes,
                       int concurrent_groups, double bytes);

struct StepTime {
  double compute = 0;       // the slowest stage's forward + backward pieces, m micro-batches
  double recompute = 0;     // of which activation recomputation
  double tp_comm = 0;       // tensor-parallel all-reduces on the critical path
  double bubble = 0;        // pipeline fill and drain
  double pp_comm = 0;       // pipeline send/recv
  double cp_comm = 0;       // context parallelism: the ring's exposed transfers, Ulysses' all-to-alls
  double cp_comm_total = 0; // all of the ring's, hidden or not (not in total())
  double ep_comm = 0;       // expert parallelism: the token all-to-alls (nothing hides them)
  double dp_comm = 0;       // exposed data-parallel traffic (ZeRO reduce/gather)
  double dp_comm_total = 0; // all of it, hidden or not (not in total())
  double optimizer = 0;     // the update of this rank's optimizer partition
  double offload = 0;       // host link and CPU optimizer
  double overhead = 0;      // fixed per-step cost (calibrated) + per-layer launch overhead
  double shared_cores = 0;  // extra time because the node's ranks share too few cores
  double total() const {
    return compute + tp_comm + bubble + pp_comm + cp_comm + ep_comm + dp_comm + optimizer + offload + overhead +
           shared_cores;
  }
};

// Bytes per element a collective moves: params in the storage type, grads in `grad_type`, each
// as the run stores it (layout::stored_precision: on a GPU (cuda) fp16 travels in fp32 buffers).
struct CommTypes {
  int param_bytes = 4;
  int grad_bytes = 4;
};
CommTypes comm_types(Precision storage, Precision grad_type, bool cuda = false);

// The step of layout `l` on the calibrated machine. Throws what stage_bounds throws.
StepTime step_time(const model_spec::ModelShape& s, const Layout& l, const Calibration& cal,
                   const CommTypes& types);

// The pipeline's schedule length for the stages' slot times and m micro-batches (see above).
double pipeline_schedule(const std::vector<double>& slots, int m);

// One stage's work per micro-batch for the shared-core simulation: seconds of its forward and
// its backward at the speed of a rank alone.
struct StageWork {
  double fwd = 0, bwd = 0;
};
// The schedule's length when the stages share the node's cores: the runtime's event order
// (layout/pipeline_schedule.h: 1F1B or GPipe, the runtime's own lists), each forward waiting for the previous
// stage's and each backward for the next stage's, `handoff` seconds after it ends (the send/recv);
// while k ranks compute at once each runs at min(1, capacity(k) / k) of its alone speed, where
// `ranks_per_stage` ranks of the node run each stage (tp x dp of them) and capacity(k) is what
// the node delivers with k ranks computing (node_capacity; k on a GPU). Processor sharing, event
// by event. With capacity(k) = k it is the plain schedule with handoffs on its edges.
double shared_core_pipeline(const std::vector<StageWork>& stages, int m, PipelineSchedule schedule,
                            double handoff, int ranks_per_stage,
                            const std::function<double(int)>& capacity);
// Exposed seconds of `total` communication issued in `buckets` equal buckets behind a compute
// `window`, with overlap factor `overlap` (0 or 1): max(total / buckets, total - window *
// overlap), and all of it without overlap.
double exposed_comm(double total, int buckets, double window, double overlap);

}  // namespace ds::plan
