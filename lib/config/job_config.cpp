// Job config parsing and validation. One pass over the JSON with a `Section` walker per object
// (config_reader.h): each typed getter declares the key as known, checks type and range and
// records an error with the key's JSON path and line; `ignored()` declares DeepSpeed keys
// accepted with a warning; `finish()` turns every remaining key into an "unknown key" error with
// the closest known key suggested. Cross-key rules (batch triad, precision, ZeRO/pipeline,
// model/TP shapes) run after the walk, only on values that were themselves valid, so one mistake
// gives one message.
#include "config/job_config.h"

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "common/strings.h"
#include "config/config_reader.h"
#include "config/config_sections.h"
#include "config/json_reader.h"

namespace ds::config {

namespace {

using detail::Json;
using detail::kI32Max;
using detail::kI64Max;
using detail::kInf;
using detail::Section;
using detail::show;
using Ctx = detail::ReadContext;

// DeepSpeed keys dstrain accepts without acting on them, per section. Anything not read and not
// listed here is an unknown-key error.

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

JobConfig parse_job_config(std::string_view text, const std::string& path, int world_size) {
  if (world_size < 1) throw invalid_argument("world size must be at least 1, got {}", world_size);
  const std::string source = path.empty() ? "<config>" : path;

  std::vector<std::string> dup_errors;
  JsonDocument doc;
  try {
    doc = parse_json(text, source, &dup_errors);
  } catch (const Error& e) {
    throw ConfigError(source, {e.what()});
  }

  Ctx ctx{doc, source, std::move(dup_errors), {}};
  JobConfig cfg;
  cfg.path = path;
  cfg.world_size = world_size;

  if (!doc.value.is_object()) {
    ctx.error("$", fmt::format("expected a JSON object at the top level, got {}", show(doc.value)));
    throw ConfigError(source, ctx.errors);
  }
  Section root(ctx, &doc.value, "$");

  // --- batch triad (resolved below), top-level scalars
  const detail::BatchKeys batch = detail::read_top_level(root, cfg);
  int64_t tbs = batch.train_batch_size, mbs = batch.micro_batch_size,
          gas = batch.accumulation_steps;
  const bool has_tbs = batch.has_train_batch_size, has_mbs = batch.has_micro_batch_size,
             has_gas = batch.has_accumulation_steps, batch_ok = batch.valid;

  // --- precision
  detail::read_fp16(root, cfg.fp16);
  detail::read_bf16(ctx, root, cfg.bf16);

  // --- ZeRO
  const bool zero_stage_ok = detail::read_zero(ctx, root, cfg.zero);

  // --- optimizer, scheduler (parameters read after training.steps is known)
  detail::read_optimizer(ctx, root, cfg.optimizer);
  detail::SchedulerSection sched = detail::read_scheduler_type(ctx, root, cfg.scheduler);

  // --- activation checkpointing, pipeline, tensor parallel, checkpoint
  detail::read_activation_checkpointing(root, cfg.activation_checkpointing);
  const bool pp_ok = detail::read_pipeline(ctx, root, cfg.pipeline);
  const bool tp_ok = detail::read_tensor_parallel(ctx, root, cfg.tensor_parallel);
  detail::read_checkpoint(root);

  // --- dstrain sections: model, data, training
  const bool model_ok = detail::read_model(ctx, root, cfg);
  detail::read_data(ctx, root, cfg);
  const detail::TrainingRead training = detail::read_training(ctx, root, path, cfg.training);
  const bool steps_ok = training.steps_valid;
  if (training.eval_interval_given && cfg.training.eval_interval > 0 && cfg.has_data &&
      cfg.data.val.empty()) {
    ctx.error(json_path_child("$.training", "eval_interval"),
              fmt::format("eval_interval {} needs data.val (a validation token file)",
                          cfg.training.eval_interval));
  }

  // --- scheduler parameters
  detail::read_scheduler_params(ctx, sched, cfg, steps_ok, cfg.scheduler);

  detail::finish_top_level(root);

  // --- cross-key rules
  if (cfg.fp16.enabled && cfg.bf16.enabled) {
    ctx.error(root.child("bf16"), "fp16 and bf16 cannot both be enabled (as in DeepSpeed)");
  }
  const int tp = cfg.tensor_parallel.size, pp = cfg.pipeline.stages;
  bool layout_ok = pp_ok && tp_ok;
  if (layout_ok && world_size % (tp * pp) != 0) {
    ctx.error(tp > 1 ? root.child("tensor_parallel") : root.child("pipeline"),
              fmt::format("world size {} is not divisible by tensor_parallel.size x pipeline.stages "
                          "= {} x {} = {} (the data-parallel size must be a whole number)",
                          world_size, tp, pp, tp * pp));
    layout_ok = false;
  }
  if (layout_ok) cfg.data_parallel_size = world_size / (tp * pp);
  if (zero_stage_ok && pp_ok && cfg.zero.stage == 3 && pp > 1) {
    ctx.error(root.child("zero_optimization"),
              fmt::format("ZeRO stage 3 cannot be combined with pipeline parallelism (pipeline.stages "
                          "= {}), as in DeepSpeed; use stage 0-2 or pipeline.stages 1", pp));
  }

  // Batch triad, as DeepSpeed's _set_batch_related_parameters + _batch_assertion, against the
  // data-parallel size; where DeepSpeed integer-divides and then fails its assertion, we say
  // which division was not exact.
  if (batch_ok && layout_ok) {
    const int64_t dp = cfg.data_parallel_size;
    std::string tbs_p = root.child("train_batch_size");
    if (has_tbs && has_mbs && has_gas) {
      if (tbs != mbs * gas * dp) {
        ctx.error(tbs_p, fmt::format("{} != train_micro_batch_size_per_gpu x gradient_accumulation_steps "
                                     "x data-parallel size = {} x {} x {} = {}",
                                     tbs, mbs, gas, dp, mbs * gas * dp));
      }
    } else if (has_tbs && has_mbs) {
      if (tbs % (mbs * dp) != 0) {
        ctx.error(tbs_p, fmt::format("{} is not divisible by train_micro_batch_size_per_gpu x "
                                     "data-parallel size = {} x {} = {}, so "
                                     "gradient_accumulation_steps cannot be derived",
                                     tbs, mbs, dp, mbs * dp));
      } else {
        gas = tbs / (mbs * dp);
      }
    } else if (has_tbs && has_gas) {
      if (tbs % (gas * dp) != 0) {
        ctx.error(tbs_p, fmt::format("{} is not divisible by gradient_accumulation_steps x "
                                     "data-parallel size = {} x {} = {}, so "
                                     "train_micro_batch_size_per_gpu cannot be derived",
                                     tbs, gas, dp, gas * dp));
      } else {
        mbs = tbs / (gas * dp);
      }
    } else if (has_mbs && has_gas) {
      tbs = mbs * gas * dp;
    } else if (has_tbs) {
      gas = 1;
      if (tbs % dp != 0) {
        ctx.error(tbs_p, fmt::format("{} is not divisible by the data-parallel size {}, so "
                                     "train_micro_batch_size_per_gpu cannot be derived "
                                     "(gradient_accumulation_steps defaults to 1)", tbs, dp));
      } else {
        mbs = tbs / dp;
      }
    } else if (has_mbs) {
      gas = 1;
      tbs = mbs * dp;
    } else {
      ctx.error("$", "either train_batch_size or train_micro_batch_size_per_gpu must be given "
                     "(as in DeepSpeed)");
    }
    cfg.train_batch_size = tbs;
    cfg.train_micro_batch_size_per_gpu = mbs;
    cfg.gradient_accumulation_steps = gas;
  }

  // Model shapes against the layout.
  if (cfg.has_model && model_ok) {
    const auto& m = cfg.model;
    std::string mp = root.child("model");
    if (tp_ok && tp > 1) {
      if (m.n_head % tp != 0) {
        ctx.error(json_path_child(mp, "n_head"),
                  fmt::format("n_head ({}) must be divisible by tensor_parallel.size ({})", m.n_head, tp));
      }
      if ((4LL * m.n_embd) % tp != 0) {
        ctx.error(json_path_child(mp, "n_embd"),
                  fmt::format("4 x n_embd ({}) must be divisible by tensor_parallel.size ({})",
                              4LL * m.n_embd, tp));
      }
      if (m.padded_vocab_size % tp != 0) {
        ctx.error(json_path_child(mp, "padded_vocab_size"),
                  fmt::format("padded_vocab_size ({}) must be divisible by tensor_parallel.size ({}); "
                              "set model.padded_vocab_size to a multiple of {}",
                              m.padded_vocab_size, tp, tp));
      }
    }
    if (pp_ok && pp > m.n_layer) {
      ctx.error(json_path_child(root.child("pipeline"), "stages"),
                fmt::format("pipeline.stages ({}) must not exceed model.n_layer ({})", pp, m.n_layer));
    }
  }

  if (!ctx.errors.empty()) throw ConfigError(source, ctx.errors);
  cfg.warnings = std::move(ctx.warnings);
  return cfg;
}

JobConfig load_job_config(const std::string& path, int world_size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw invalid_argument("cannot read config {}: {}", path, errno_string(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw invalid_argument("cannot read config {}: {}", path, errno_string(errno));
  return parse_job_config(ss.str(), path, world_size);
}

void require_training_sections(const JobConfig& config) {
  const std::string source = config.path.empty() ? "<config>" : config.path;
  std::vector<std::string> missing;
  if (!config.has_model) missing.push_back(source + ": $.model: missing (dstrain train needs the model shape)");
  if (!config.has_data) missing.push_back(source + ": $.data.train: missing (dstrain train needs a training token file)");
  if (config.training.steps <= 0) {
    missing.push_back(source + ": $.training.steps: missing (dstrain train needs the number of steps)");
  }
  if (!missing.empty()) throw ConfigError(source, std::move(missing));
}

nlohmann::ordered_json JobConfig::to_json() const {
  Json j = Json::object();
  detail::top_level_to_json(*this, j);
  j["fp16"] = detail::fp16_to_json(fp16);
  j["bf16"] = detail::bf16_to_json(bf16);
  j["zero_optimization"] = detail::zero_to_json(zero);
  j["optimizer"] = detail::optimizer_to_json(optimizer);
  j["scheduler"] = detail::scheduler_to_json(scheduler);
  j["activation_checkpointing"] =
      detail::activation_checkpointing_to_json(activation_checkpointing);
  j["pipeline"] = detail::pipeline_to_json(pipeline);
  j["tensor_parallel"] = detail::tensor_parallel_to_json(tensor_parallel);
  j["checkpoint"] = detail::checkpoint_to_json(checkpoint);
  j["model"] = detail::model_to_json(*this);
  j["data"] = detail::data_to_json(*this);
  j["training"] = detail::training_to_json(training);
  return j;
}

}  // namespace ds::config
