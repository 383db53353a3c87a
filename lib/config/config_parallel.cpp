// The layout sections: pipeline (stages, how the layers are split over them, the schedule),
// tensor_parallel (its size, also under DeepSpeed's AutoTP name autotp_size, where 0 means off) and
// context_parallel (size and method, also under DeepSpeed-Ulysses' sequence_parallel_size).
// Whether the world size divides into them, and whether the model does, are rules across
// sections (config_validate.cpp).
#include <fmt/format.h>

#include "config/config_sections.h"

namespace ds::config::detail {

namespace {

const std::vector<std::string> kDsPipelineIgnored = {
    "seed_layers", "activation_checkpoint_interval", "pipe_partitioned", "grad_partitioned",
    "use_reentrant"};
const std::vector<std::string> kDsTensorParallelIgnored = {
    "tp_overlap_comm", "tp", "dtype", "partition_config", "preset_model", "keep_module_on_host",
    "replace_with_kernel_inject", "kernel_inject", "injection_policy_tuple", "tp_grain_size"};

}  // namespace

bool read_pipeline(ReadContext& ctx, Section& root, PipelineConfig& out) {
  bool stages_valid = true;
  Section s = root.section("pipeline");
  const Json* st = s.raw("stages");
  if (st && st->is_string() && st->get<std::string>() == "auto") {
    ctx.warn(s.child("stages"),
             "DeepSpeed's \"auto\" read as 1 (dstrain needs an explicit stage count)");
  } else if (st) {
    stages_valid = s.get_int("stages", out.stages, 1);
  }
  std::string partition = layout::stage_split_name(out.partition);
  if (s.get_choice("partition", partition, {"uniform", "parameters"})) out.partition = *layout::parse_stage_split(partition);
  std::string schedule = layout::schedule_name(out.schedule);
  if (s.get_choice("schedule", schedule, {"1f1b", "gpipe"})) out.schedule = *layout::parse_schedule(schedule);
  s.ignored(kDsPipelineIgnored);
  s.finish();
  return stages_valid;
}

Json pipeline_to_json(const PipelineConfig& c) {
  return Json{{"stages", c.stages},
              {"partition", layout::stage_split_name(c.partition)},
              {"schedule", layout::schedule_name(c.schedule)}};
}

bool read_tensor_parallel(ReadContext& ctx, Section& root, TensorParallelConfig& out) {
  bool size_valid = true;
  Section s = root.section("tensor_parallel");
  if (s.has("size") && s.has("autotp_size")) {
    s.raw("autotp_size");
    ctx.error(s.child("autotp_size"),
              "both \"size\" and DeepSpeed's \"autotp_size\" are given; keep \"size\"");
  } else if (s.has("autotp_size")) {
    int n = 0;
    size_valid = s.get_int("autotp_size", n, 0);
    if (size_valid) out.size = n == 0 ? 1 : n;  // DeepSpeed: 0 = off
  }
  if (s.has("size")) size_valid = s.get_int("size", out.size, 1);
  s.get_bool("sequence_parallel", out.sequence_parallel);
  s.raw("size");
  s.raw("autotp_size");
  s.ignored(kDsTensorParallelIgnored);
  s.finish();
  return size_valid;
}

Json tensor_parallel_to_json(const TensorParallelConfig& c) {
  return Json{{"size", c.size}, {"sequence_parallel", c.sequence_parallel}};
}

bool read_context_parallel(ReadContext& ctx, Section& root, ContextParallelConfig& out) {
  const bool has_section = root.has("context_parallel");
  if (root.has("sequence_parallel_size")) {
    // DeepSpeed-Ulysses' key: its sequence-parallel group is Ulysses over that many ranks.
    if (has_section) {
      root.raw("sequence_parallel_size");
      ctx.error(json_path_child("$", "sequence_parallel_size"),
                "both DeepSpeed's \"sequence_parallel_size\" and \"context_parallel\" are given; keep "
                "\"context_parallel\" (sequence_parallel_size N means {\"size\": N, \"method\": \"ulysses\"})");
    } else {
      out.method = layout::CpMethod::kUlysses;
      return root.get_int("sequence_parallel_size", out.size, 1);
    }
  }
  Section s = root.section("context_parallel");
  bool size_valid = true;
  if (s.has("size")) size_valid = s.get_int("size", out.size, 1);
  std::string method = layout::cp_method_name(out.method);
  if (s.get_choice("method", method, {"ring", "ulysses"})) out.method = *layout::parse_cp_method(method);
  s.finish();
  return size_valid;
}

Json context_parallel_to_json(const ContextParallelConfig& c) {
  return Json{{"size", c.size}, {"method", layout::cp_method_name(c.method)}};
}

bool read_expert_parallel(Section& root, ExpertParallelConfig& out) {
  Section s = root.section("expert_parallel");
  bool size_valid = true;
  if (s.has("size")) size_valid = s.get_int("size", out.size, 1);
  s.finish();
  return size_valid;
}

Json expert_parallel_to_json(const ExpertParallelConfig& c) { return Json{{"size", c.size}}; }

}  // namespace ds::config::detail
