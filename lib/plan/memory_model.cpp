// The model-mode memory model. Rules in memory_model.h; shapes from model_spec.
#include "plan/memory_model.h"

#include "layout/onebit_sizes.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "common/strings.h"
#include "config/job_config.h"
#include "model_spec/family.h"

namespace ds::plan {

namespace ms = ds::model_spec;

int param_bytes(Precision p) { return p == Precision::kFp32 ? 4 : 2; }
int master_bytes(Precision p) { return p == Precision::kFp32 ? 0 : 4; }

int optimizer_state_bytes(const std::string& type) {
  if (type == "Lion" || type == "Adagrad") return 4;
  if (type == "ZeroOneAdam") return 12;
  if (type == "OneBitLamb") return 16;
  return kAdamStateBytes;
}

// On a GPU the optimizer state lives in pinned host memory with offload_optimizer, and always
// for the optimizers beside Adam/AdamW (they run on the CPU).
bool optimizer_on_host(const Layout& l) {
  return (l.offload_optimizer || !config::OptimizerConfig::is_adam(l.optimizer)) && l.device == DeviceKind::kCuda;
}

namespace {

ms::ModelPart part_for(const ms::ModelShape& s, const std::vector<int>& bounds, int stage, int tp,
                       int tp_rank, int ep = 1) {
  const int pp = static_cast<int>(bounds.size()) - 1;
  ms::ModelPart part;
  part.layer_begin = bounds[static_cast<size_t>(stage)];
  part.layer_end = bounds[static_cast<size_t>(stage) + 1];
  part.has_embedding = stage == 0;
  part.has_head = stage == pp - 1;
  part.tp = tp;
  part.tp_rank = tp_rank;
  part.ep = ep;  // every ep rank holds E/ep experts: the sizes are ep rank 0's
  return part;
}

}  // namespace

void validate_layout(const ms::ModelShape& s, const Layout& l) {
  s.validate();
  if (l.tp < 1 || l.pp < 1 || l.dp < 1 || l.cp < 1) {
    throw invalid_argument("tensor-parallel ({}), pipeline ({}), data-parallel ({}) and context-parallel ({}) sizes "
                           "must be at least 1",
                           l.tp, l.pp, l.dp, l.cp);
  }
  s.validate_tp(l.tp);
  if (l.sequence_parallel && l.tp > 1 && (static_cast<int64_t>(l.micro_batch) * (s.seq_len / l.cp)) % l.tp != 0) {
    throw invalid_argument("sequence parallelism: a rank's micro-batch of {} x {} tokens is not divisible by "
                           "tensor_parallel.size {}",
                           l.micro_batch, s.seq_len / l.cp, l.tp);
  }
  if (auto why = layout::cp_sequence_rule(s.seq_len, l.cp, l.cp_method)) throw invalid_argument("{}", *why);
  if (l.ep < 1 || (l.ep > 1 && (ms::family_of(s).mlp != ms::MlpKind::kMoe || s.num_local_experts % l.ep != 0 ||
                                (l.dp * l.cp) % l.ep != 0))) {
    throw invalid_argument("expert_parallel.size {} must divide a mixture of experts' num_local_experts ({}) and the "
                           "data-parallel x context-parallel ranks ({} x {})",
                           l.ep, s.num_local_experts, l.dp, l.cp);
  }
  if (auto why = layout::cp_heads_rule(s.n_head, ms::kv_heads(s), l.tp, l.cp, l.cp_method)) {
    throw invalid_argument("{}", *why);
  }
  if (l.pp > s.n_layer) {
    throw invalid_argument("pipeline.stages ({}) must not exceed model.n_layer ({}): every stage "
                           "needs at least one layer",
                           l.pp, s.n_layer);
  }
  if (l.zero_stage < 0 || l.zero_stage > 3) {
    throw invalid_argument("zero_optimization.stage must be 0, 1, 2 or 3, got {}", l.zero_stage);
  }
  if (l.zero_stage == 3 && l.pp > 1) {
    // The config refuses it (lib/config/job_config.cpp), so the runtime never allocates it.
    throw invalid_argument("ZeRO stage 3 cannot be combined with pipeline parallelism "
                           "(pipeline.stages = {}), as in DeepSpeed; use stage 0-2 or "
                           "pipeline.stages 1",
                           l.pp);
  }
  if (l.offload_param && l.device == DeviceKind::kCuda) {
    // The runtime refuses it (runtime/train/trainer.cpp), so the plan never counts it.
    throw invalid_argument("zero_optimization.offload_param on a GPU run: dstrain offloads the "
                           "optimizer (offload_optimizer) but not the ZeRO-3 parameter partitions");
  }
  if (l.offload_param && l.zero_stage != 3) {
    throw invalid_argument("zero_optimization.offload_param needs ZeRO stage 3 (parameters are "
                           "partitioned only there), got stage {}",
                           l.zero_stage);
  }
  if (l.offload_optimizer && l.zero_stage == 0) {
    throw invalid_argument("zero_optimization.offload_optimizer needs ZeRO stage 1, 2 or 3 "
                           "(the optimizer state is partitioned), got stage 0");
  }
  if (l.micro_batch < 1) throw invalid_argument("train_micro_batch_size_per_gpu must be at least 1, got {}", l.micro_batch);
  if (l.grad_accum < 1) throw invalid_argument("gradient_accumulation_steps must be at least 1, got {}", l.grad_accum);
  if (l.reduce_bucket_size < 1 || l.allgather_bucket_size < 1 || l.stage3_prefetch_bucket_size < 0 ||
      l.stage3_max_live_parameters < 1) {
    throw invalid_argument("zero_optimization bucket sizes must be positive");
  }
  if (l.num_threads < 1) throw invalid_argument("threads per rank must be at least 1, got {}", l.num_threads);
}

std::vector<int> stage_bounds(const ms::ModelShape& s, int pp, StageSplit partition, int tp) {
  return layout::stage_layer_bounds(
      s, pp, partition, tp);
}

int in_flight_micro_batches(const Layout& l, int stage) {
  if (l.pp == 1) return 1;
  if (l.schedule == PipelineSchedule::kGPipe) return l.grad_accum;
  return std::min(l.pp - stage, l.grad_accum);
}

int token_micro_batches(const Layout& l) { return l.pp > 1 || l.cuda_graph ? l.grad_accum : 1; }

bool RankMemory::same_bytes(const RankMemory& o) const {
  return params == o.params && grads == o.grads && optimizer == o.optimizer &&
         activations == o.activations && comm == o.comm && workspace == o.workspace &&
         checkpoint == o.checkpoint && cpu == o.cpu;
}

const RankMemory& MemoryPlan::peak_rank() const {
  if (ranks.empty()) throw Error(ErrorKind::kInternal, "memory plan without ranks");
  const RankMemory* best = &ranks.front();
  for (const auto& r : ranks) {
    if (r.total() > best->total()) best = &r;
  }
  return *best;
}

int storage_bytes(const Layout& l) {
  return param_bytes(layout::stored_precision(l.precision, l.device == DeviceKind::kCuda));
}
int grad_bytes(const Layout& l) {
  return param_bytes(layout::stored_precision(l.grad_precision.value_or(l.precision), l.device == DeviceKind::kCuda));
}

namespace {

// One ZeroEngine's region of a part's parameters: the whole part, or for a mixture of experts the
// dense region (over the dp x cp ranks) and the experts' (over the expert-data-parallel ranks,
// dp x cp / ep), each partitioned and bucketed on its own (runtime/parallel/expert_parallel.h).
struct Region {
  ZeroPartition zp;
  int ranks = 1;           // the group it is partitioned over
  int divide = 1;          // a rank's index in that group: its dp x cp index / divide
  int64_t persistent = 0;  // ZeRO-3 units kept whole
  int64_t gathered = 0;    // ZeRO-3 pooled gather buffers at their peak
  int64_t bucket = 0;      // ZeRO-2/3 bucket capacity (elements)
  int64_t wte = 0;         // ZeRO-2/3 token-embedding gradient buffer (elements)
};

// What every (stage, tp_rank) part holds, computed once; dp ranks differ only by their shard.
struct Part {
  RankMemory base;         // the tags that do not depend on the dp rank
  std::vector<Region> regions;
  int64_t tied = 0;        // pipeline: the tied wte gradient buffer (elements)
  int64_t frozen = 0;      // LoRA: the frozen base (elements), the model's own at any stage, no grads or state
  int64_t cp_comm = 0;     // the cp attention's buffers in flight (bytes)
};

// The embedding units' tensors by their family's names ("wte, wpe", "embed_tokens").
std::string embedding_names(const ms::ModelShape& s) {
  std::string out;
  for (const auto& t : ms::family_of(s).params(s)) {
    if (t.unit != ms::UnitKind::kTokenEmbedding && t.unit != ms::UnitKind::kPositionEmbedding) continue;
    out += (out.empty() ? "" : ", ") + std::string(t.name);
  }
  return out;
}

ms::ActConfig act_config(const ms::ModelShape& s, const Layout& l) {
  ms::ActConfig act;
  act.B = l.micro_batch;
  act.T = s.seq_len / l.cp;  // this rank's tokens of each sequence
  act.recompute = l.checkpointing;
  // CUDA attention: no scratch; a cp rank's attention keeps its own (cp_attention_scratch).
  act.num_threads = l.device == DeviceKind::kCuda || l.cp > 1 ? 0 : l.num_threads;
  act.storage_bytes = storage_bytes(l);
  act.sequence_parallel = l.sequence_parallel && l.tp > 1;
  return act;
}

// ZeRO-2/3 gradient buckets (layout::zero_gradient_buffers, the runtime's own sizing). Pipelines
// keep the tied token embedding's gradient in a buffer of their own on the first and the last
// stage (runtime/parallel/pipeline_stage.h, TiedEmbeddingHooks); an untied head has none.
void count_gradient_buffers(const Layout& l, const ms::ParamLayout& layout, Region& region) {
  const auto z = layout::zero_gradient_buffers(layout, l.reduce_bucket_size);
  region.bucket = z.bucket;
  region.wte = l.zero_stage < 2 ? 0 : z.token_embedding;
}

// ZeRO-3: units up to the persistence threshold stay whole; the others are gathered into pooled
// buffers (one pool per size, never shrunk): the unit in use plus the layers prefetched within
// stage3_prefetch_bucket_size, at most stage3_max_live_parameters.
void count_zero3_params(const Layout& l, const ms::ParamLayout& layout, Region& part) {
  if (l.zero_stage != 3) return;
  int64_t layer_n = 0;
  int nl = 0;
  for (const auto& u : layout.units) {
    if (u.numel <= l.stage3_param_persistence_threshold) {
      part.persistent += u.numel;
    } else if (u.kind == ms::UnitKind::kLayer || u.kind == ms::UnitKind::kExperts || u.kind == ms::UnitKind::kAdapters) {
      layer_n = u.numel;
      ++nl;
    } else {
      part.gathered += u.numel;
    }
  }
  if (nl > 0) {
    int64_t live = 1 + l.stage3_prefetch_bucket_size / layer_n;
    live = std::min(live, std::max<int64_t>(1, l.stage3_max_live_parameters / layer_n));
    part.gathered += std::min<int64_t>(live, nl) * layer_n;
  }
}

Part part_memory(const ms::ModelShape& s, const Layout& l, const std::vector<int>& bounds, int stage, int t) {
  const ms::ModelPart mp = part_for(s, bounds, stage, l.tp, t, l.ep);
  const ms::ParamLayout layout = ms::param_layout(s, mp);
  Part part;
  RankMemory& r = part.base;
  r.stage = stage;
  r.tp_rank = t;
  r.layer_begin = mp.layer_begin;
  r.layer_end = mp.layer_end;
  r.local_params = layout.total;
  r.in_flight = in_flight_micro_batches(l, stage);
  const ms::ActTotals at = ms::activation_totals(s, mp, act_config(s, l));
  r.activations = at.per_micro_batch_bytes * r.in_flight + at.shared_activation_bytes;
  // The trainer's token ids (inputs and targets, int32): one micro-batch at a time without a
  // pipeline; with one, every micro-batch of the step is loaded before the schedule runs (G of
  // them, on every stage). On a GPU the model also keeps one micro-batch of token ids on the
  // device (the model's upload buffer, inputs and targets).
  // With context parallelism the ids are this rank's T/cp of each sequence, and the whole
  // micro-batch the loader reads is kept beside them; the cp attention's scratch is the rank's too.
  const int64_t Tl = s.seq_len / l.cp;
  // With training.cuda_graph they are pinned host memory instead, one slot per micro-batch.
  const int64_t trainer_ids = kTokenBufferBytes * l.micro_batch * Tl * token_micro_batches(l);
  if (l.cuda_graph) r.cpu += trainer_ids;
  r.workspace = at.shared_workspace_bytes + (l.cuda_graph ? 0 : trainer_ids) +
                (l.device == DeviceKind::kCuda ? kTokenBufferBytes * l.micro_batch * Tl : 0) +
                (l.cp > 1 ? kTokenBufferBytes * l.micro_batch * s.seq_len : 0);
  const layout::CpScratchBytes cps = layout::cp_attention_scratch(
      {l.micro_batch, s.seq_len, s.n_head / l.tp, ms::kv_heads(s) / l.tp, s.head_dim(), l.cp, l.cp_method,
       static_cast<int>(storage_bytes(l)), l.device == DeviceKind::kCuda ? 0 : l.num_threads});
  r.workspace += cps.workspace;
  // Document packing: each micro-batch's Activations keeps its rows' document starts (int32).
  if (l.document_packing) r.workspace += int64_t{4} * l.micro_batch * Tl * r.in_flight;
  part.cp_comm = cps.comm;
  std::vector<std::pair<ms::ParamLayout, int>> regions;  // (layout, ranks / divide)
  if (ms::family_of(s).mlp == ms::MlpKind::kMoe) {
    regions = {{ms::dense_region(layout), 1}, {ms::expert_region(layout), l.ep}};
  } else if (s.lora.on()) {
    // LoRA: ZeRO, the gradients and the optimizer cover the adapters alone (runtime/parallel/engine.h).
    regions = {{ms::adapter_region(layout), 1}};
    part.frozen = layout.adapter_begin;
  } else {
    regions = {{layout, 1}};
  }
  for (const auto& [rl, ep] : regions) {
    Region rg;
    rg.ranks = l.zero_ranks() / ep;
    rg.divide = ep;
    rg.zp = zero_partition(rl.total, rg.ranks);
    count_gradient_buffers(l, rl, rg);
    count_zero3_params(l, rl, rg);
    part.regions.push_back(rg);
  }
  if (l.pp > 1 && s.tied() && (mp.has_embedding || mp.has_head) && !s.lora.on()) {
    part.tied = layout::zero_gradient_buffers(layout, l.reduce_bucket_size).token_embedding;
  }
  return part;
}

// World rank `rank` of a part: the tags that depend on its dp rank (its ZeRO shard).
RankMemory rank_memory(const Layout& l, const Part& part, int rank) {
  const int64_t sb = storage_bytes(l), gb = grad_bytes(l);
  // On a CPU run host memory is the device memory: offloading moves nothing.
  const bool offload_opt = optimizer_on_host(l);
  const bool offload_par = l.offload_param && l.device == DeviceKind::kCuda;
  RankMemory r = part.base;
  r.rank = rank;
  r.dp_rank = (rank / l.tp) % l.zero_ranks();  // its index among the dp x cp ranks of its part
  const int nb = l.overlap_comm ? 2 : 1;
  r.grads = part.tied * gb;
  r.params = part.frozen * sb;
  for (const Region& rg : part.regions) {
    const int64_t n = rg.zp.total();
    const int64_t mine = rg.zp.count(r.dp_rank / rg.divide);
    // params: the model's full copy (stages 0-2), or the shard + persistent + gathered units
    const int64_t param_elems = l.zero_stage == 3 ? mine + rg.persistent + rg.gathered : n;
    (offload_par ? r.cpu : r.params) += param_elems * sb;
    // grads: the model's full buffer (stages 0-1), or the partition + buckets + wte buffer
    r.grads += (l.zero_stage >= 2 ? mine + nb * rg.bucket + rg.wte : n) * gb;
    // optimizer: Adam m and v, and fp32 master weights beside 16-bit parameters, over the whole
    // part (stage 0) or this rank's partition. Offloaded (GPU runs): m, v, an fp32 master copy
    // whatever the precision and the gradients AdamW reads on the CPU (in their type), all in
    // pinned host memory.
    const int64_t opt_elems = l.zero_stage == 0 ? n : mine;
    // An async checkpoint's staging: what the rank's shard holds of this region (its partition
    // at every ZeRO stage): the parameters, the master weights, the optimizer's moments.
    if (l.checkpoint_staging) {
      const int64_t staged = mine * (sb + master_bytes(l.precision) + optimizer_state_bytes(l.optimizer));
      (l.device == DeviceKind::kCuda ? r.cpu : r.checkpoint) += staged;
    }
    if (offload_opt) {
      r.cpu += opt_elems * (optimizer_state_bytes(l.optimizer) + 4 + gb);
    } else {
      r.optimizer += opt_elems * (optimizer_state_bytes(l.optimizer) + master_bytes(l.precision));
    }
    if (config::OptimizerConfig::is_onebit(l.optimizer) && l.zero_ranks() > 1) {  // pinned host memory on a GPU
      const layout::OneBitSizes ob = layout::onebit_sizes(opt_elems, l.zero_ranks());
      (offload_opt ? r.cpu : r.optimizer) += ob.optimizer_bytes;
      (offload_opt ? r.cpu : r.comm) += ob.comm_bytes;
    }
    // comm: reduce-scatter receive buffers (stages 2/3); all-gather staging (stages 1/2, when
    // allgather_bucket_size is smaller than a partition)
    if (l.zero_stage >= 2) {
      r.comm += nb * std::min(rg.bucket, mine) * gb;
      if (rg.wte > 0) r.comm += std::min(rg.wte, mine) * gb;
    }
    if ((l.zero_stage == 1 || l.zero_stage == 2) && rg.ranks > 1 && l.allgather_bucket_size < rg.zp.stride()) {
      r.comm += l.allgather_bucket_size * rg.ranks * sb;
    }
  }
  r.comm += part.cp_comm;  // the cp attention's blocks (ring) or all-to-all pieces (Ulysses)
  return r;
}

// Notes: how the peak rank was counted.
void add_notes(MemoryPlan& plan) {
  const Layout& l = plan.layout;
  const ms::ModelShape& s = plan.shape;
  const bool offload_opt = optimizer_on_host(l);
  const bool offload_par = l.offload_param && l.device == DeviceKind::kCuda;
  const RankMemory& p = plan.peak_rank();
  const ms::ModelPart part = part_for(s, plan.bounds, p.stage, l.tp, p.tp_rank, l.ep);
  const ms::ActTotals at = ms::activation_totals(s, part, act_config(s, l));
  const int64_t pb = storage_bytes(l);
  auto z = [&](int min_stage) { return l.zero_stage >= min_stage && l.zero_ranks() > 1; };
  const int zr = l.zero_ranks();
  const char* head = !s.tied() ? " + final norm, lm_head" : part.has_embedding ? " + lnf" : " + lnf, wte (tied)";
  std::string what = fmt::format("layers {}-{}{}{}", p.layer_begin, p.layer_end - 1,
                                 part.has_embedding ? " + " + embedding_names(s) : std::string(),
                                 part.has_head ? head : "");
  plan.notes.push_back({"params", fmt::format("{} elements ({}{}) x {} B {}{}{}", p.local_params, what,
                                              l.tp > 1 ? fmt::format(", 1/{} tensor-parallel shard", l.tp) : "",
                                              pb, layout::precision_name(l.precision),
                                              l.precision != Precision::kFp32 && pb == 4 ? " values in fp32 buffers (GPU)" : "",
                                              l.zero_stage == 3 ? fmt::format(", ZeRO-3 shard 1/{} + persistent and gathered units", zr) : "")});
  if (offload_par) plan.notes.back().text += ", offloaded to CPU";
  const bool moe = ms::family_of(s).mlp == ms::MlpKind::kMoe;
  if (moe) {
    plan.notes.back().text += fmt::format("; the experts: {} of {} per layer{}", s.num_local_experts / l.ep,
                                          s.num_local_experts,
                                          l.ep > 1 ? fmt::format(" (expert-parallel {})", l.ep) : std::string());
  }
  if (s.lora.on()) {
    const ms::ParamLayout pl = ms::param_layout(s, part);
    plan.notes.back().text += fmt::format("; LoRA r={} alpha={}: the base's {} elements frozen (no gradients, no "
                                          "optimizer state, never ZeRO-partitioned), the adapters' {} train",
                                          s.lora.r, s.lora.alpha, pl.adapter_begin, pl.total - pl.adapter_begin);
  }
  plan.notes.push_back({"grads", fmt::format("{} B per element{}", grad_bytes(l),
                                             l.zero_stage >= 2 ? fmt::format(", ZeRO-{} partition 1/{} + {} bucket(s) + token-embedding buffer",
                                                                             l.zero_stage, zr, l.overlap_comm ? 2 : 1) : "")});
  if (l.pp > 1 && s.tied() && (part.has_embedding || part.has_head)) {
    plan.notes.back().text += ", + the pipeline's tied-wte gradient buffer";
  }
  plan.notes.push_back({"optimizer", fmt::format("{} {} ({} B){} per element{}{}", l.optimizer,
                                                 optimizer_state_bytes(l.optimizer) == 4    ? "one moment"
                                                 : optimizer_state_bytes(l.optimizer) == 8 ? "m, v"
                                                                                            : "m, v and more",
                                                 optimizer_state_bytes(l.optimizer),
                                                 master_bytes(l.precision) ? " + fp32 master (4 B)" : "",
                                                 z(1) ? fmt::format(", ZeRO-{} shard 1/{}", l.zero_stage, zr) : "",
                                                 offload_opt ? ", offloaded to CPU" : "")});
  if (moe && l.zero_stage >= 1) {
    plan.notes.back().text += fmt::format(" (the experts' over their expert-data-parallel group: 1/{})", zr / l.ep);
  }
  plan.notes.push_back({"activations",
                        fmt::format("{} micro-batch(es) in flight ({}) x {} per micro-batch (B={}, T={}{}){}",
                                    p.in_flight, l.pp > 1 ? layout::schedule_name(l.schedule) : "no pipeline",
                                    format_bytes(static_cast<double>(at.per_micro_batch_bytes)),
                                    l.micro_batch,
                                    l.cp > 1 ? fmt::format("{} of {}, context-parallel {} {}", s.seq_len / l.cp,
                                                           s.seq_len, l.cp, layout::cp_method_name(l.cp_method))
                                             : std::to_string(s.seq_len),
                                    l.checkpointing        ? ", checkpointed"
                                    : l.selective_recompute ? ", selective recompute: attention scores never stored"
                                                            : "",
                                    l.checkpointing ? " + " + format_bytes(static_cast<double>(
                                                                  at.shared_activation_bytes)) +
                                                          " to recompute one layer"
                                                    : std::string())});
  std::string comm;
  if (l.zero_stage >= 2) comm = "reduce-scatter receive buffers";
  if ((l.zero_stage == 1 || l.zero_stage == 2) && p.comm > 0 && zr > 1 &&
      l.allgather_bucket_size < zero_partition(p.local_params, zr).stride()) {
    comm += std::string(comm.empty() ? "" : "; ") + "all-gather staging (allgather_bucket_size x dp)";
  }
  if (l.cp > 1) {
    comm += std::string(comm.empty() ? "" : "; ") +
            (l.cp_method == layout::CpMethod::kRing ? "the ring's key/value blocks and dK/dV accumulators in flight"
                                                   : "Ulysses' all-to-all pieces");
  }
  if (comm.empty()) comm = "none: reductions run in place on the flat buffers";
  plan.notes.push_back({"comm", comm});
  plan.notes.push_back({"workspace", fmt::format("backward scratch, {}{}, logits chunk, token ids{}",
                                                 l.cp > 1 ? fmt::format("the {} attention's scratch{}",
                                                                        layout::cp_method_name(l.cp_method),
                                                                        l.cp_method == layout::CpMethod::kUlysses
                                                                            ? " (head layout, whole-sequence tiles)"
                                                                            : " (gathered chunks, fp32 merge)")
                                                 : l.device == DeviceKind::kCuda
                                                     ? std::string("no attention scratch (CUDA)")
                                                     : fmt::format("attention scratch for {} thread(s)", l.num_threads),
                                                 ms::family_of(s).positions == ms::PositionKind::kRope
                                                     ? ", RoPE tables (fp32)"
                                                     : "",
                                                 (l.pp > 1 ? fmt::format(" of all {} micro-batches", l.grad_accum)
                                                  : l.cuda_graph ? fmt::format(" (the model's copy; the trainer's {} slots "
                                                                               "are pinned host memory, for the CUDA graph)",
                                                                               l.grad_accum)
                                                           : std::string()) +
                                                     (l.cp > 1 ? " (and one whole micro-batch as read)" : "") +
                                                     (l.document_packing
                                                          ? ", document starts (int32) of each micro-batch in flight"
                                                          : ""))});
  if (l.checkpoint_staging) {
    plan.notes.push_back({"checkpoint", fmt::format("async checkpoint staging: the rank's checkpoint partition x "
                                                    "({} B params{} + {} B optimizer state){}",
                                                    pb, master_bytes(l.precision) ? " + 4 B master" : "",
                                                    optimizer_state_bytes(l.optimizer),
                                                    l.device == DeviceKind::kCuda ? ", pinned host memory" : "")});
  }
}

}  // namespace

MemoryPlan plan_memory(const ms::ModelShape& s, const Layout& l) {
  validate_layout(s, l);
  MemoryPlan plan;
  plan.layout = l;
  plan.shape = s;
  plan.bounds = stage_bounds(s, l.pp, l.partition, l.tp);
  std::vector<Part> parts;  // index stage * tp + tp_rank
  for (int stage = 0; stage < l.pp; ++stage) {
    for (int t = 0; t < l.tp; ++t) parts.push_back(part_memory(s, l, plan.bounds, stage, t));
  }
  plan.ranks.reserve(static_cast<size_t>(l.world_size()));
  for (int rank = 0; rank < l.world_size(); ++rank) {
    const int stage = rank / (l.tp * l.dp * l.cp);
    plan.ranks.push_back(rank_memory(l, parts[static_cast<size_t>(stage * l.tp + rank % l.tp)], rank));
  }
  add_notes(plan);
  return plan;
}

std::vector<RankGroup> distinct_ranks(const MemoryPlan& p) {
  std::vector<RankGroup> groups;
  for (const auto& r : p.ranks) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const RankGroup& g) {
      return g.first->stage == r.stage && g.first->same_bytes(r);
    });
    if (it == groups.end()) {
      groups.push_back({&r, {r.rank}, ""});
    } else {
      it->ranks.push_back(r.rank);
    }
  }
  for (auto& g : groups) {
    std::string text;
    size_t i = 0;
    while (i < g.ranks.size()) {
      size_t j = i;
      while (j + 1 < g.ranks.size() && g.ranks[j + 1] == g.ranks[j] + 1) ++j;
      if (!text.empty()) text += ",";
      text += j == i ? std::to_string(g.ranks[i]) : fmt::format("{}-{}", g.ranks[i], g.ranks[j]);
      i = j + 1;
    }
    g.ranks_text = text;
  }
  return groups;
}

Verdict verdict(const MemoryPlan& p, int64_t device_bytes) {
  Verdict v;
  v.device_bytes = device_bytes;
  const RankMemory& peak = p.peak_rank();
  v.peak_bytes = peak.total();
  v.peak_rank = peak.rank;
  v.margin = device_bytes - v.peak_bytes;
  v.fits = v.margin >= 0;
  if (v.fits) return v;

  // Try single changes of the layout, keeping the world size and the global batch.
  struct Try {
    std::string what;
    Layout l;
  };
  std::vector<Try> tries;
  const Layout& l = p.layout;
  if (!l.checkpointing) {
    Layout n = l;
    n.checkpointing = true;
    tries.push_back({"enable activation checkpointing", n});
  }
  for (int z = l.zero_stage + 1; z <= 3; ++z) {
    Layout n = l;
    n.zero_stage = z;
    tries.push_back({fmt::format("ZeRO stage {}", z), n});
  }
  if (!l.offload_optimizer && l.zero_stage >= 1) {
    Layout n = l;
    n.offload_optimizer = true;
    tries.push_back({"offload the optimizer to CPU (zero_optimization.offload_optimizer.device cpu)", n});
  }
  if (!l.offload_param && l.zero_stage == 3) {
    Layout n = l;
    n.offload_param = true;
    n.offload_optimizer = true;
    tries.push_back({"offload parameters and optimizer to CPU", n});
  }
  if (l.tp > 1 && !l.sequence_parallel) {
    Layout n = l;
    n.sequence_parallel = true;
    tries.push_back({"sequence parallelism (tensor_parallel.sequence_parallel true)", n});
  }
  if (l.micro_batch > 1 && l.micro_batch % 2 == 0) {
    Layout n = l;
    n.micro_batch /= 2;
    n.grad_accum *= 2;
    tries.push_back({fmt::format("micro-batch {} with {} accumulation steps", n.micro_batch, n.grad_accum), n});
  }
  if (l.dp % 2 == 0) {
    Layout n = l;
    n.tp *= 2;
    n.dp /= 2;
    n.grad_accum *= 2;
    tries.push_back({fmt::format("tensor parallelism {} (data parallelism {})", n.tp, n.dp), n});
    n = l;
    n.pp *= 2;
    n.dp /= 2;
    n.grad_accum *= 2;
    tries.push_back({fmt::format("pipeline stages {} (data parallelism {})", n.pp, n.dp), n});
    // Context parallelism: the sequence split over twice the ranks (activations halve).
    for (const auto method : {layout::CpMethod::kRing, layout::CpMethod::kUlysses}) {
      n = l;
      n.cp *= 2;
      n.cp_method = method;
      n.dp /= 2;
      n.grad_accum *= 2;
      tries.push_back({fmt::format("context parallelism {} {} (data parallelism {})", n.cp,
                                   layout::cp_method_name(method), n.dp),
                       n});
    }
  }
  std::vector<std::pair<int64_t, std::string>> ok;
  for (const auto& t : tries) {
    try {
      MemoryPlan q = plan_memory(p.shape, t.l);
      if (q.peak_total() <= device_bytes) {
        ok.push_back({q.peak_total(), fmt::format("{} (peak {})", t.what,
                                                  format_bytes(static_cast<double>(q.peak_total())))});
      }
    } catch (const Error&) {
      // an impossible variant (e.g. tp not dividing the heads) is simply not offered
    }
  }
  std::stable_sort(ok.begin(), ok.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& o : ok) v.fixes.push_back(std::move(o.second));
  return v;
}

}  // namespace ds::plan
