// Job config -> plan input. Field by field; the config already validated ranges and the batch triad.
#include "plan/from_config.h"

#include <cmath>
#include <limits>
#include <string_view>

#include <fmt/format.h>

#include "common/error.h"
#include "common/strings.h"
#include "model_spec/family.h"

namespace ds::plan {

PlanInput plan_input_from_config(const config::JobConfig& c) {
  if (!c.has_model) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{}: $.model: dstrain plan --config needs a model section "
                            "(n_layer, n_head, n_embd, vocab_size, seq_len)",
                            c.path.empty() ? "config" : c.path),
                "without a model, use the generic mode: dstrain plan --params N --world-size W "
                "--zero-stage K");
  }
  PlanInput in;
  in.shape = c.model.shape;  // resolved by the config, its family's keys included

  Layout& l = in.layout;
  l.tp = c.tensor_parallel.size;
  l.sequence_parallel = c.tensor_parallel.sequence_parallel;
  l.document_packing = c.data.packing == config::Packing::kDocument;
  l.pp = c.pipeline.stages;
  l.dp = c.data_parallel_size;
  l.cp = c.context_parallel.size;
  l.ep = c.expert_parallel.size;
  l.cp_method = c.context_parallel.method;
  l.zero_stage = c.zero.stage;
  l.offload_optimizer = c.zero.offload_optimizer.device == "cpu";
  l.optimizer = c.optimizer.type;
  l.offload_param = c.zero.offload_param.device == "cpu";
  l.micro_batch = static_cast<int>(c.train_micro_batch_size_per_gpu);
  l.grad_accum = static_cast<int>(c.gradient_accumulation_steps);
  l.checkpointing = c.activation_checkpointing.full();
  l.selective_recompute = c.activation_checkpointing.enabled && !c.activation_checkpointing.full();
  l.schedule = c.pipeline.schedule;
  l.partition = c.pipeline.partition;
  l.precision = c.precision();
  l.grad_precision = c.gradient_dtype();
  in.grad_precision = c.gradient_dtype();
  l.device = c.training.device == "cuda" ? DeviceKind::kCuda : DeviceKind::kCpu;
  l.overlap_comm = c.zero.overlap_comm;
  l.stage3_param_persistence_threshold = c.zero.stage3_param_persistence_threshold;
  l.reduce_bucket_size = c.zero.reduce_bucket_size;
  l.allgather_bucket_size = c.zero.allgather_bucket_size;
  l.stage3_prefetch_bucket_size = c.zero.stage3_prefetch_bucket_size;
  l.stage3_max_live_parameters = c.zero.stage3_max_live_parameters;
  l.checkpoint_staging = c.training.checkpoint_async && !c.training.checkpoint_dir.empty();
  l.cuda_graph = c.training.cuda_graph && l.device == DeviceKind::kCuda;
  return in;
}

RankMemory predicted_rank_memory(const config::JobConfig& c, int world_rank, int num_threads) {
  PlanInput in = plan_input_from_config(c);
  if (world_rank < 0 || world_rank >= in.layout.world_size()) {
    throw invalid_argument("{}: rank {} lies outside the job's {} rank(s) (tensor-parallel {} x "
                           "pipeline {} x data-parallel {} x context-parallel {})",
                           c.path.empty() ? "config" : c.path, world_rank, in.layout.world_size(),
                           in.layout.tp, in.layout.pp, in.layout.dp, in.layout.cp);
  }
  if (num_threads < 1) throw invalid_argument("threads per rank must be at least 1, got {}", num_threads);
  in.layout.num_threads = num_threads;
  MemoryPlan p = plan_memory(in.shape, in.layout);
  return p.ranks.at(static_cast<size_t>(world_rank));
}

std::map<std::string, int64_t> tag_bytes(const RankMemory& r) {
  return {{"params", r.params},          {"grads", r.grads}, {"optimizer", r.optimizer},
          {"activations", r.activations}, {"comm", r.comm},   {"workspace", r.workspace},
          {"checkpoint", r.checkpoint},       {"total", r.total()},           {"pinned_host", r.cpu}};
}

double relative_difference(int64_t planned, int64_t measured) {
  if (planned == 0) return measured == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return static_cast<double>(measured - planned) / static_cast<double>(planned);
}

std::string describe_prediction(const RankMemory& planned, const std::map<std::string, int64_t>& measured) {
  std::string out = fmt::format("memory of rank {} (stage {}, layers {}-{}, tp rank {}, dp rank {}): plan vs "
                                "measured peak\n",
                                planned.rank, planned.stage, planned.layer_begin, planned.layer_end - 1,
                                planned.tp_rank, planned.dp_rank);
  const auto plan = tag_bytes(planned);
  for (const char* tag : kTagNames) {
    const int64_t p = plan.at(tag);
    auto it = measured.find(tag);
    // Pinned host memory only matters where something is offloaded (GPU runs).
    if (std::string_view(tag) == "pinned_host" && p == 0 && (it == measured.end() || it->second == 0)) continue;
    std::string m = "?", diff;
    if (it != measured.end()) {
      m = format_bytes(static_cast<double>(it->second));
      const double d = relative_difference(p, it->second);
      diff = std::isinf(d) ? "(not planned)" : fmt::format("{:+.2f}%", 100.0 * d);
    }
    out += fmt::format("  {:<12} {:>12} {:>12} {:>9}\n", tag, format_bytes(static_cast<double>(p)), m, diff);
  }
  return out;
}

}  // namespace ds::plan
