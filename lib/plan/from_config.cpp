// Job config -> plan input. Field by field; the config already validated ranges and the batch triad.
#include "plan/from_config.h"

#include "common/error.h"

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
  in.shape.n_layer = c.model.n_layer;
  in.shape.n_head = c.model.n_head;
  in.shape.n_embd = c.model.n_embd;
  in.shape.vocab_size = c.model.vocab_size;
  in.shape.padded_vocab_size = c.model.padded_vocab_size;
  in.shape.seq_len = c.model.seq_len;

  Layout& l = in.layout;
  l.tp = c.tensor_parallel.size;
  l.pp = c.pipeline.stages;
  l.dp = c.data_parallel_size;
  l.zero_stage = c.zero.stage;
  l.offload_optimizer = c.zero.offload_optimizer.device == "cpu";
  l.offload_param = c.zero.offload_param.device == "cpu";
  l.micro_batch = static_cast<int>(c.train_micro_batch_size_per_gpu);
  l.grad_accum = static_cast<int>(c.gradient_accumulation_steps);
  l.checkpointing = c.activation_checkpointing.enabled;
  if (c.pipeline.schedule == "1f1b") {
    l.schedule = Schedule::k1F1B;
  } else if (c.pipeline.schedule == "gpipe") {
    l.schedule = Schedule::kGPipe;
  } else {
    throw invalid_argument("{}: $.pipeline.schedule: expected \"1f1b\" or \"gpipe\", got \"{}\"",
                           c.path, c.pipeline.schedule);
  }
  if (c.pipeline.partition == "uniform") {
    l.partition = StagePartition::kUniform;
  } else if (c.pipeline.partition == "parameters") {
    l.partition = StagePartition::kParameters;
  } else {
    throw invalid_argument("{}: $.pipeline.partition: expected \"uniform\" or \"parameters\", got \"{}\"",
                           c.path, c.pipeline.partition);
  }
  l.precision = c.bf16.enabled ? Precision::kBf16 : c.fp16.enabled ? Precision::kFp16 : Precision::kFp32;
  l.device = c.training.device == "cuda" ? DeviceKind::kCuda : DeviceKind::kCpu;
  l.overlap_comm = c.zero.overlap_comm;
  l.stage3_param_persistence_threshold = c.zero.stage3_param_persistence_threshold;
  l.reduce_bucket_size = c.zero.reduce_bucket_size;
  l.allgather_bucket_size = c.zero.allgather_bucket_size;
  l.stage3_prefetch_bucket_size = c.zero.stage3_prefetch_bucket_size;
  l.stage3_max_live_parameters = c.zero.stage3_max_live_parameters;
  return in;
}

}  // namespace ds::plan
