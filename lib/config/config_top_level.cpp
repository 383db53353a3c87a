// The top level of a job config: the batch triad's three keys (read here, resolved against the
// data-parallel size in config_validate.cpp; "auto" for train_batch_size or
// gradient_accumulation_steps reads as absent, for train_micro_batch_size_per_gpu as the
// planner's to pick, JobConfig::AutoMicroBatch), steps_per_print, gradient_clipping ("auto": 1.0,
// the Hugging Face Trainer's default) and wall_clock_breakdown, and the
// DeepSpeed top-level keys dstrain accepts without acting on them. The sections themselves have
// their own readers (config_sections.h).
#include "config/config_sections.h"

namespace ds::config::detail {

namespace {

// DeepSpeed's top-level keys dstrain accepts without acting on them. Anything not read and not
// listed here is an unknown-key error.
const std::vector<std::string> kDsTopLevelIgnored = {
    "aio", "amp", "autotuning", "comet", "comms_logger", "compile",
    "compression_training", "curriculum_learning", "data_efficiency",
    "dataloader_drop_last", "datastates", "disable_allgather", "dump_state",
    "eigenvalue", "elasticity", "expert_parallel", "flops_profiler", "gradient_allreduce_op",
    "gradient_predivide_factor", "graph_harvesting", "hybrid_engine", "memory_breakdown",
    "nebula", "prescale_gradients", "progressive_layer_drop", "quantize_training",
    "seq_parallel_comm_data_type", "sparse_attention",
    "sparse_gradients", "timers", "torch_autocast",
    "use_data_before_expert_parallelism", "vocabulary_size", "wandb",
    "weight_quantization", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer"};

}  // namespace

// Whether `key` is present with Hugging Face's "auto" placeholder (declaring it known).
bool given_auto(Section& root, const std::string& key) {
  const Json* v = root.raw(key);
  return v && v->is_string() && v->get<std::string>() == "auto";
}

BatchKeys read_top_level(ReadContext& ctx, Section& root, JobConfig& cfg) {
  BatchKeys b;
  b.auto_train_batch_size = given_auto(root, "train_batch_size");
  b.auto_accumulation_steps = given_auto(root, "gradient_accumulation_steps");
  if (!b.auto_train_batch_size) {
    b.has_train_batch_size = root.get_int("train_batch_size", b.train_batch_size, 1, kI32Max);
  }
  b.auto_micro_batch = given_auto(root, "train_micro_batch_size_per_gpu");
  if (!b.auto_micro_batch) {
    b.has_micro_batch_size =
        root.get_int("train_micro_batch_size_per_gpu", b.micro_batch_size, 1, kI32Max);
  }
  if (!b.auto_accumulation_steps) {
    b.has_accumulation_steps =
        root.get_int("gradient_accumulation_steps", b.accumulation_steps, 1, kI32Max);
  }
  b.valid = !(root.has("train_batch_size") && !b.has_train_batch_size && !b.auto_train_batch_size) &&
            !(root.has("train_micro_batch_size_per_gpu") && !b.has_micro_batch_size &&
              !b.auto_micro_batch) &&
            !(root.has("gradient_accumulation_steps") && !b.has_accumulation_steps &&
              !b.auto_accumulation_steps);
  root.get_int("steps_per_print", cfg.steps_per_print, 1);
  if (given_auto(root, "gradient_clipping")) {
    cfg.gradient_clipping = 1.0;
    ctx.warn(root.child("gradient_clipping"),
             "\"auto\" -> 1.0: the Hugging Face Trainer's default max_grad_norm");
  } else {
    root.get_number("gradient_clipping", cfg.gradient_clipping, 0);
  }
  root.get_bool("wall_clock_breakdown", cfg.wall_clock_breakdown);
  return b;
}

void finish_top_level(Section& root) {
  root.ignored(kDsTopLevelIgnored);
  root.finish();
}

void top_level_to_json(const JobConfig& cfg, Json& out) {
  // A pending micro-batch "auto" stays "auto", with the keys that follow from it.
  const auto& a = cfg.auto_micro_batch;
  out["train_batch_size"] =
      a.pending && !a.train_batch_size_fixed ? Json("auto") : Json(cfg.train_batch_size);
  out["train_micro_batch_size_per_gpu"] =
      a.pending ? Json("auto") : Json(cfg.train_micro_batch_size_per_gpu);
  out["gradient_accumulation_steps"] =
      a.pending && !a.accumulation_steps_fixed ? Json("auto") : Json(cfg.gradient_accumulation_steps);
  out["steps_per_print"] = cfg.steps_per_print;
  out["gradient_clipping"] = cfg.gradient_clipping;
  out["wall_clock_breakdown"] = cfg.wall_clock_breakdown;
}

}  // namespace ds::config::detail
