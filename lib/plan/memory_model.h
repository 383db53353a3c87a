// The model-mode memory model: bytes per rank, per allocator tag, for a job laid out as
// pp x dp x cp x tp ranks with a ZeRO stage, counted from the tensors of the model spec
// (lib/model_spec/shape.h), the single source of truth the runtime allocates from. This file
// never restates a shape: parameter counts come from param_layout(), activation buffers from
// the family's activation list, ZeRO partitions and pipeline stage bounds from layout/partition.h.
//
// Tags match the runtime's allocator (runtime/core/allocator.h, MemTag): params, grads,
// optimizer, activations, comm, workspace, checkpoint. The runtime's measured per-tag peaks are held to
// these numbers in tests ("held to reality"), so every rule below is a statement about what the
// runtime allocates; when the two disagree, fix whichever is wrong, here or there.
//
// Not here: the paper formulas (model_state.h, activation_paper.h), the step-time model and the
// layout search (recommend.h), the --json shapes (plan_json.h), text printing
// (apps/dstrain/cmd_plan.cpp). Pure functions; no I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model_spec/shape.h"
#include "layout/choices.h"
#include "layout/context_parallel.h"
#include "layout/partition.h"

namespace ds::plan {

// The training choices, one enum each for the config, the plan and the runtime (layout/choices.h).
using layout::PipelineSchedule;
using layout::Precision;
using layout::StageSplit;
// Where the job runs (training.device): on CPU host memory is the device memory (offload moves
// nothing). The type of the stored buffers on each: layout::stored_precision.
enum class DeviceKind { kCpu, kCuda };


// Everything about a job's layout the memory model needs. Sizes in elements, like DeepSpeed's
// zero_optimization keys.
struct Layout {
  int tp = 1;  // tensor_parallel.size
  bool sequence_parallel = false;  // tensor_parallel.sequence_parallel: the residual stream's rows split over tp
  bool document_packing = false;   // data.packing "document": B x T int32 document starts per micro-batch in flight
  int pp = 1;  // pipeline.stages
  int dp = 1;  // data-parallel size: world_size / (tp * cp * pp)
  int cp = 1;  // context_parallel.size: each sequence split over cp ranks
  int ep = 1;  // expert_parallel.size: a mixture's experts split over ep of the dp x cp ranks
  layout::CpMethod cp_method = layout::CpMethod::kRing;
  int zero_stage = 0;
  bool offload_optimizer = false;  // zero_optimization.offload_optimizer.device == "cpu"
  bool offload_param = false;      // zero_optimization.offload_param.device == "cpu" (stage 3)
  int micro_batch = 1;             // train_micro_batch_size_per_gpu (B)
  int grad_accum = 1;              // gradient_accumulation_steps: micro-batches per step (m)
  bool checkpointing = false;      // activation_checkpointing enabled, mode "full": layers recomputed
  // Mode "selective": only attention's scores recomputed, which the runtime's attention always
  // does (it never stores them); the same bytes as no checkpointing, said in the notes.
  bool selective_recompute = false;
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  StageSplit partition = StageSplit::kParameters;
  Precision precision = Precision::kFp32;
  // The gradients' type (data_types.grad_accum_dtype / communication_data_type); nullopt: the
  // storage type (the config's default).
  std::optional<Precision> grad_precision;
  DeviceKind device = DeviceKind::kCpu;
  bool overlap_comm = false;  // zero_optimization.overlap_comm (resolved): two gradient buckets
  int64_t reduce_bucket_size = 500000000;
  int64_t allgather_bucket_size = 500000000;
  int64_t stage3_prefetch_bucket_size = 50000000;
  int64_t stage3_max_live_parameters = 1000000000;
  int64_t stage3_param_persistence_threshold = 100000;
  int num_threads = 1;  // CPU threads per rank (attention scratch is per thread)
  // optimizer.type: its state per element (optimizer_state_bytes) and, for the 1-bit ones at dp > 1,
  // the compressed all-reduce's error feedback (optimizer) and messages (comm), layout/onebit_sizes.h.
  std::string optimizer = "AdamW";
  // training.checkpoint_async with a checkpoint_dir: the trainer keeps a host staging buffer of
  // its checkpoint partition (tag checkpoint; pinned host memory, plan.cpu, on a GPU).
  bool checkpoint_staging = false;
  // training.cuda_graph (a GPU run): the trainer's token ids are pinned host memory (plan.cpu), one
  // slot per micro-batch of the step, which the graph's copies read at each replay.
  bool cuda_graph = false;

  int world_size() const { return tp * pp * dp * cp; }
  // The ranks that hold the same parameters and share their ZeRO partitions: dp x cp.
  int zero_ranks() const { return dp * cp; }
};

// Bytes per element of the stored tensors.
int param_bytes(Precision p);       // params and grads: 4 (fp32) or 2 (bf16, fp16)
int master_bytes(Precision p);      // fp32 master copy beside 16-bit params: 4, or 0 for fp32
// The optimizer's fp32 state per element: Adam, AdamW, Lamb, OneBitAdam 8 (m, v); Lion 4 (m);
// Adagrad 4 (the sum of squares); ZeroOneAdam 12 (+ the momentum accumulator); OneBitLamb 16 (+ the
// fresh variance and the last momentum).
int optimizer_state_bytes(const std::string& type);
// Whether the optimizer's state is in host memory on this layout (plan.cpu): on a GPU with
// offload_optimizer, and for every optimizer beside Adam/AdamW.
bool optimizer_on_host(const Layout& l);
constexpr int kAdamStateBytes = 8;  // Adam m and v, fp32
constexpr int kTokenBufferBytes = 8; // the trainer's inputs and targets, int32, per token
// Bytes per stored parameter and activation element (the storage type): param_bytes of
// layout::stored_precision(precision, on a GPU): 2 for bf16 on either device and fp16 on the CPU;
// 4 for fp32, and for fp16 on a GPU (fp32 buffers: no fp16 CUDA kernels).
int storage_bytes(const Layout& l);
// Bytes per gradient element (grad_precision, else the storage type), stored as storage_bytes says.
int grad_bytes(const Layout& l);

// How ZeRO splits a flat buffer of `total` elements over dp ranks: layout::Partition
// (lib/layout/partition.h), the very class the runtime's ZeRO engine uses. stride =
// ceil(total / dp) rounded up to 16 elements; rank r owns [min(total, r * stride),
// + min(stride, total - begin)), so the last ranks may own less.
using ZeroPartition = layout::Partition;
inline constexpr int64_t kPartitionAlignElements = layout::kAlignElements;
inline ZeroPartition zero_partition(int64_t total, int dp) { return layout::Partition(total, dp); }

// Layers [begin, end) of every pipeline stage (pp + 1 bounds, bounds[0] = 0, bounds[pp] = L):
// model_spec::stage_layer_bounds, the function the runtime's partition_stages calls.
//   uniform:    L / pp layers each, the first L % pp stages one more;
//   parameters: contiguous split minimizing the largest stage's parameter count, where the first
//               stage also holds wte + wpe and the last lnf + the tied wte (as the runtime's
//               model parts do); ties go to the earliest boundary.
// Every stage gets at least one layer. Throws ds::Error naming the rule when pp > L.
std::vector<int> stage_bounds(const model_spec::ModelShape& s, int pp, StageSplit partition,
                              int tp = 1);

// Micro-batches whose activations a stage keeps at its peak: 1F1B keeps min(pp - stage, m) on
// stage `stage` (0-based), GPipe keeps all m; a single stage keeps 1.
int in_flight_micro_batches(const Layout& l, int stage);
// Micro-batches of token ids (inputs and targets) the trainer holds: 1 without a pipeline (it
// loads one micro-batch at a time); with pp > 1 all m of the step, on every stage (the schedule
// runs over all of them at once).
int token_micro_batches(const Layout& l);

// One rank's planned peak, per allocator tag, in bytes on the device.
struct RankMemory {
  int rank = 0;
  int stage = 0, dp_rank = 0, tp_rank = 0;
  int layer_begin = 0, layer_end = 0;
  int in_flight = 1;               // micro-batches of activations kept
  int64_t local_params = 0;        // elements of the model this rank's (stage, tp) part holds
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0, comm = 0, workspace = 0;
  int64_t checkpoint = 0;          // an async checkpoint's host staging buffer (CPU runs)
  int64_t cpu = 0;                 // bytes offloaded to host memory (optimizer, params; GPU staging)
  int64_t buffers() const { return comm + workspace; }
  int64_t total() const { return params + grads + optimizer + activations + comm + workspace + checkpoint; }
  bool same_bytes(const RankMemory& o) const;  // every tag and cpu equal
};

// One line per component, for the text output: "activations", "12 layers x 2 in flight x ...".
struct PlanNote {
  std::string tag;
  std::string text;
};

struct MemoryPlan {
  Layout layout;
  model_spec::ModelShape shape;
  std::vector<int> bounds;          // stage_bounds()
  std::vector<RankMemory> ranks;    // every world rank, in rank order
  std::vector<PlanNote> notes;      // how the first rank of each stage was counted
  const RankMemory& peak_rank() const;  // the rank with the largest total (lowest rank on ties)
  int64_t peak_total() const { return peak_rank().total(); }
};

// Checks the layout (tp divides heads, 4C and Vp; pp <= layers; stage in 0..3; no stage 3 with
// pp > 1, as the job config refuses it; offload_param only with stage 3; positive sizes) and
// throws ds::Error (invalid argument) naming the rule.
void validate_layout(const model_spec::ModelShape& s, const Layout& l);

// The plan. Rank grid as the architecture fixes it: rank = (stage * dp + dp_rank) * tp + tp_rank.
// Counting rules, as the runtime allocates (runtime/model/decoder.cpp, runtime/parallel/zero.cpp,
// runtime/parallel/pipeline_stage.cpp, runtime/train/trainer.cpp). Each rank builds one model of
// its (stage, tp_rank) part, hooked model -> TensorParallelHooks (allocate nothing) ->
// TiedEmbeddingHooks (pp > 1, first and last stage) -> ZeroEngine over its dp group with the
// part's param_layout; Adam's state over the engine's range. n = elements of the rank's part
// (param_layout), mine = its ZeRO partition count, sb = storage_bytes, gb = grad_bytes, units = the layout's
// units (wte, wpe, layers, lnf), m = gradient_accumulation_steps:
//   params      stages 0-2: n * sb (the model's flat buffer)
//               stage 3: (mine + persistent + gathered) * sb, where persistent = units of at most
//               stage3_param_persistence_threshold elements, gathered = the other non-layer
//               units once each + min(layers, 1 + prefetch / layer, max_live / layer) layer
//               buffers (pooled by size, never shrunk); into cpu instead with offload_param on CUDA
//   grads       stages 0-1: n * gb; stages 2-3: (mine + buckets x cap + wte) * gb, with
//               buckets = 2 when overlap_comm else 1, cap = max(largest unit but wte,
//               min(reduce_bucket_size, elements of the units but wte)), wte = the token
//               embedding's own gradient buffer when the part holds it; with pp > 1 the first
//               and last stages add the pipeline's tied-wte gradient buffer (wte elements)
//   optimizer   (8 + master_bytes) per element of n (stage 0) or of mine (stages 1-3); into cpu
//               instead with offload_optimizer on CUDA
//   activations (per micro-batch buffers x in-flight micro-batches + shared activation buffers),
//               in bytes (sb per element, 4 for the fp32 statistics), from
//               model_spec::activation_totals. In flight: pp == 1 the trainer's
//               one micro-batch's activations; pp > 1 no trainer-level one, the PipelineStage's one per
//               micro-batch at the schedule's peak (in_flight_micro_batches)
//   comm        stages 2-3: buckets x min(cap, mine) + min(wte, mine) reduce-scatter receive
//               buffers (x gb); stages 1-2 with dp > 1 and allgather_bucket_size < stride: an
//               all-gather staging buffer of allgather_bucket_size x dp (x sb)
//   workspace   model_spec's shared workspace buffers (bytes as above) + the token ids: 8 B per token
//               (int32 inputs and targets) x B x T x token_micro_batches (1, or m when pp > 1);
//               with cuda_graph into cpu instead (pinned), x m
//               + with document packing the model's document starts: 4 B per token x B x T x
//               the micro-batches in flight
//   checkpoint  with checkpoint_staging: the rank's checkpoint partition of each region (the
//               ZeRO partition `mine` at every stage, as the shards hold it) x (sb for the params
//               + master_bytes + optimizer_state_bytes); into cpu instead on CUDA (pinned)
// Throws what validate_layout throws.
MemoryPlan plan_memory(const model_spec::ModelShape& s, const Layout& l);

// Groups of ranks with identical bytes: each group's first rank and all its ranks ("0-3,8").
struct RankGroup {
  const RankMemory* first = nullptr;
  std::vector<int> ranks;
  std::string ranks_text;
};
std::vector<RankGroup> distinct_ranks(const MemoryPlan& p);

// The fit verdict against `device_bytes` per GPU.
struct Verdict {
  bool fits = false;
  int64_t device_bytes = 0;
  int64_t peak_bytes = 0;
  int peak_rank = 0;
  int64_t margin = 0;  // device - peak: headroom when it fits, the shortfall (negative) otherwise
  // Single changes to the layout that make it fit, each with its new peak: "enable activation
  // checkpointing (peak 21.3 GiB)". Empty when it fits or when no single change helps.
  std::vector<std::string> fixes;
};
Verdict verdict(const MemoryPlan& p, int64_t device_bytes);

}  // namespace ds::plan
