// Job config parsing and validation, the outline: parse the JSON strictly (json_reader.h), walk
// it once with one reader per section (config_sections.h), then apply the rules that span
// sections (config_validate.h), only on values that were themselves valid, so one mistake gives
// one message. Every fault is collected and thrown at the end as one ConfigError. The order of
// the readers below is the order of the messages; the top-level keys they declare, in that
// order, are what "did you mean" picks from.
//
// to_json() is the same outline the other way: each section's writer sits beside its reader.
#include "config/job_config.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "common/strings.h"
#include "config/config_sections.h"
#include "config/config_validate.h"
#include "config/json_reader.h"

namespace ds::config {

using detail::Json;

namespace {

// Walks every section of `root` into `cfg` and applies the cross-section rules.
void read_sections(detail::ReadContext& ctx, detail::Section& root, JobConfig& cfg) {
  detail::SectionsValid valid;
  valid.batch = detail::read_top_level(ctx, root, cfg);
  detail::read_fp16(root, cfg.fp16);
  detail::read_bf16(ctx, root, cfg.bf16);
  detail::read_gradient_types(root, cfg.gradient_types);
  valid.zero_stage = detail::read_zero(ctx, root, cfg.zero);
  detail::read_optimizer(ctx, root, cfg.optimizer);
  detail::SchedulerSection sched = detail::read_scheduler_type(ctx, root, cfg.scheduler);
  detail::read_activation_checkpointing(root, cfg.activation_checkpointing);
  valid.pipeline_stages = detail::read_pipeline(ctx, root, cfg.pipeline);
  valid.tensor_parallel_size = detail::read_tensor_parallel(ctx, root, cfg.tensor_parallel);
  valid.context_parallel_size = detail::read_context_parallel(ctx, root, cfg.context_parallel);
  valid.expert_parallel_size = detail::read_expert_parallel(root, cfg.expert_parallel);
  detail::read_checkpoint(root);
  detail::read_monitor(root, "tensorboard", cfg.path, cfg.tensorboard);
  detail::read_monitor(root, "csv_monitor", cfg.path, cfg.csv_monitor);
  valid.model = detail::read_model(ctx, root, cfg);
  detail::read_lora(ctx, root, cfg);
  valid.document_token = detail::read_data(ctx, root, cfg);
  const detail::TrainingRead training = detail::read_training(ctx, root, cfg.path, cfg.training);
  detail::check_eval_needs_val(ctx, cfg, training.eval_interval_given);
  detail::read_scheduler_params(ctx, sched, cfg, training.steps_valid, cfg.scheduler);
  detail::finish_top_level(root);
  detail::check_across_sections(ctx, valid, cfg);
}

// Applies one --set "KEY=VALUE" to `root`; records an error naming the flag when it cannot.
void apply_set(detail::ReadContext& ctx, Json& root, const std::string& flag) {
  const size_t eq = flag.find('=');
  const std::string key = flag.substr(0, eq == std::string::npos ? 0 : eq);
  std::vector<std::string> parts = split(key, '.');
  bool empty_part = key.empty();
  for (const auto& part : parts) empty_part = empty_part || part.empty();
  if (eq == std::string::npos || empty_part) {
    ctx.errors.push_back(fmt::format("--set {}: expected KEY=VALUE, KEY a dotted path of keys "
                                     "(optimizer.params.lr=3e-4)", flag));
    return;
  }
  const std::string text = flag.substr(eq + 1);
  Json value = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) value = text;  // not JSON: a string (AdamW, cosine, ...)
  Json* at = &root;
  std::string path = "$";
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    path = json_path_child(path, parts[i]);
    Json& next = (*at)[parts[i]];  // an absent key becomes null, then an object
    if (next.is_null()) next = Json::object();
    if (!next.is_object()) {
      ctx.errors.push_back(fmt::format("--set {}: {} is {}, not an object, so it has no key \"{}\"",
                                       flag, path, detail::show(next), parts[i + 1]));
      return;
    }
    at = &next;
  }
  (*at)[parts.back()] = std::move(value);
  ctx.set_paths.emplace_back(json_path_child(path, parts.back()), flag);
}

}  // namespace

ConfigError::ConfigError(const std::string& source, std::vector<std::string> errors)
    : Error(ErrorKind::kInvalidArgument,
            [&] {
              if (errors.size() == 1) return errors[0];
              std::string msg = fmt::format("{} errors in {}:", errors.size(), source);
              for (const auto& e : errors) msg += "\n  " + e;
              return msg;
            }(),
            "see docs/configuration.md for every key, its type and default"),
      errors_(std::move(errors)) {}

JobConfig parse_job_config(std::string_view text, const std::string& path, int world_size,
                           const ParseOptions& options) {
  if (world_size < 1) throw invalid_argument("world size must be at least 1, got {}", world_size);
  const std::string source = path.empty() ? "<config>" : path;

  std::vector<std::string> dup_errors;
  JsonDocument doc;
  try {
    doc = parse_json(text, source, &dup_errors);
  } catch (const Error& e) {
    throw ConfigError(source, {e.what()});
  }

  detail::ReadContext ctx{doc, source, std::move(dup_errors), {}, options.strict, {}};
  JobConfig cfg;
  cfg.path = path;
  cfg.world_size = world_size;
  if (!doc.value.is_object()) {
    ctx.error("$", fmt::format("expected a JSON object at the top level, got {}",
                               detail::show(doc.value)));
    throw ConfigError(source, ctx.errors);
  }
  for (const auto& flag : options.sets) apply_set(ctx, doc.value, flag);
  detail::Section root(ctx, &doc.value, "$");
  read_sections(ctx, root, cfg);

  if (!ctx.errors.empty()) throw ConfigError(source, ctx.errors);
  cfg.warnings = std::move(ctx.warnings);
  return cfg;
}

JobConfig load_job_config(const std::string& path, int world_size, const ParseOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw invalid_argument("cannot read config {}: {}", path, errno_string(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw invalid_argument("cannot read config {}: {}", path, errno_string(errno));
  return parse_job_config(ss.str(), path, world_size, options);
}

void require_training_sections(const JobConfig& config) {
  const std::string source = config.path.empty() ? "<config>" : config.path;
  std::vector<std::string> missing;
  if (!config.has_model) {
    missing.push_back(source + ": $.model: missing (dstrain train needs the model shape)");
  }
  if (!config.has_data) {
    missing.push_back(source +
                      ": $.data.train: missing (dstrain train needs a training token file)");
  }
  if (config.training.steps <= 0) {
    missing.push_back(source +
                      ": $.training.steps: missing (dstrain train needs the number of steps)");
  }
  if (!missing.empty()) throw ConfigError(source, std::move(missing));
}

void set_auto_micro_batch(JobConfig& c, int64_t micro, const std::string& why) {
  JobConfig::AutoMicroBatch& a = c.auto_micro_batch;
  if (!a.pending) throw Error(ErrorKind::kInternal, "set_auto_micro_batch: no micro-batch \"auto\" is pending");
  const std::string source = c.path.empty() ? "<config>" : c.path;
  const int64_t dp = c.data_parallel_size;
  auto fail = [&](const std::string& what) {
    throw ConfigError(source, {fmt::format("{}: \"auto\" -> {}: {}", a.where_micro_batch, micro, what)});
  };
  if (micro < 1 || micro > detail::kI32Max) fail("expected an integer >= 1");
  if (a.train_batch_size_fixed) {
    const int64_t share = c.train_batch_size / dp;
    if (share % micro != 0) {
      fail(fmt::format("does not divide train_batch_size / data-parallel size = {} / {} = {}",
                       c.train_batch_size, dp, share));
    }
    c.gradient_accumulation_steps = share / micro;
  } else {
    if (!a.accumulation_steps_fixed) c.gradient_accumulation_steps = 1;
    c.train_batch_size = micro * c.gradient_accumulation_steps * dp;
  }
  if (const int64_t tokens = sequence_parallel_remainder_tokens(c, micro)) {
    fail(fmt::format("micro x model.seq_len / context_parallel.size = {} tokens is not divisible by "
                     "tensor_parallel.size {} (sequence parallelism)",
                     tokens, c.tensor_parallel.size));
  }
  c.train_micro_batch_size_per_gpu = micro;
  a.pending = false;
  c.warnings.push_back(fmt::format("{}: \"auto\" -> {}: {}", a.where_micro_batch, micro, why));
  if (a.auto_train_batch_size) {
    c.warnings.push_back(a.where_train_batch_size + ": " + detail::train_batch_size_auto_note(c));
  }
  if (a.auto_accumulation_steps) {
    c.warnings.push_back(a.where_accumulation_steps + ": " +
                         detail::accumulation_steps_auto_note(c, a.train_batch_size_fixed));
  }
}

std::vector<int64_t> auto_micro_batch_candidates(const JobConfig& c) {
  const JobConfig::AutoMicroBatch& a = c.auto_micro_batch;
  std::vector<int64_t> all;
  if (a.train_batch_size_fixed) {
    const int64_t share = c.train_batch_size / c.data_parallel_size;
    for (int64_t m = 1; m <= share; ++m) {
      if (share % m == 0) all.push_back(m);
    }
  } else {
    for (int64_t m = 1; m <= kMaxAutoMicroBatch; m *= 2) all.push_back(m);
  }
  std::vector<int64_t> out;
  for (int64_t m : all) {
    if (sequence_parallel_remainder_tokens(c, m) == 0) out.push_back(m);
  }
  return out;
}

int64_t sequence_parallel_remainder_tokens(const JobConfig& c, int64_t micro) {
  const int tp = c.tensor_parallel.size;
  if (!c.has_model || !c.tensor_parallel.sequence_parallel || tp <= 1) return 0;
  const int64_t tokens = micro * (c.model.shape.seq_len / c.context_parallel.size);
  return tokens % tp != 0 ? tokens : 0;
}

void apply_sets(nlohmann::ordered_json& root, const std::vector<std::string>& sets) {
  JsonDocument doc;
  detail::ReadContext ctx{doc, "<config>", {}, {}, false, {}};
  for (const auto& flag : sets) apply_set(ctx, root, flag);
  if (!ctx.errors.empty()) throw ConfigError("--set", ctx.errors);
}

nlohmann::ordered_json JobConfig::to_json() const {
  Json j = Json::object();
  detail::top_level_to_json(*this, j);
  j["fp16"] = detail::fp16_to_json(fp16);
  j["bf16"] = detail::bf16_to_json(bf16);
  detail::gradient_types_to_json(*this, j);
  j["zero_optimization"] = detail::zero_to_json(zero);
  j["optimizer"] = detail::optimizer_to_json(optimizer);
  j["scheduler"] = detail::scheduler_to_json(scheduler);
  j["activation_checkpointing"] =
      detail::activation_checkpointing_to_json(activation_checkpointing);
  j["pipeline"] = detail::pipeline_to_json(pipeline);
  j["tensor_parallel"] = detail::tensor_parallel_to_json(tensor_parallel);
  j["context_parallel"] = detail::context_parallel_to_json(context_parallel);
  j["expert_parallel"] = detail::expert_parallel_to_json(expert_parallel);
  j["checkpoint"] = detail::checkpoint_to_json(checkpoint);
  j["tensorboard"] = detail::monitor_to_json(tensorboard);
  j["csv_monitor"] = detail::monitor_to_json(csv_monitor);
  j["model"] = detail::model_to_json(*this);
  j["lora"] = detail::lora_to_json(lora);
  j["data"] = detail::data_to_json(*this);
  j["training"] = detail::training_to_json(training);
  return j;
}

}  // namespace ds::config
