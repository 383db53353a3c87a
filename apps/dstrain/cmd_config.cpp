// `dstrain config check CONFIG [--world-size N] [--train] [--strict] [--set KEY=VALUE]...
// [--gpu-mem SIZE] [--calibration FILE]`: validate a job config and print it
// resolved (every default filled in, the batch triad resolved for the world size, a micro-batch
// "auto" picked by the plan as `dstrain train` picks it: auto_batch.h) as JSON on
// stdout, warnings on stderr; or print every error and exit 2.
// It reads only the config: data files and checkpoints are not opened.
#include <cstdio>
#include <iostream>
#include <memory>

#include <fmt/format.h>

#include "auto_batch.h"
#include "commands.h"
#include "config/job_config.h"
#include "plan/plan_inputs.h"

namespace ds::cli {

namespace {

struct ConfigCheckOptions {
  std::string config;
  int world_size = 1;
  bool train = false;
  config::ParseOptions parse;
  AutoBatchFlags auto_batch;  // --gpu-mem, --calibration
};

int run_config_check(const ConfigCheckOptions& o) {
  config::JobConfig cfg;
  try {
    cfg = config::load_job_config(o.config, o.world_size, o.parse);
    if (o.train) config::require_training_sections(cfg);
    // A micro-batch "auto" is planned as `dstrain train` plans it, the world's ranks on this node;
    // without a model section it stays "auto" until the run.
    if (cfg.auto_micro_batch.pending && cfg.has_model) {
      resolve_auto_batch(cfg, o.auto_batch, o.world_size, plan::resolve_threads_per_rank(0));
    } else if (cfg.auto_micro_batch.pending) {
      cfg.warnings.push_back(cfg.auto_micro_batch.where_micro_batch +
                             ": \"auto\": picked by the plan when the run starts; no model section here to plan "
                             "it with");
    }
  } catch (const config::ConfigError& e) {
    for (const auto& err : e.errors()) std::fprintf(stderr, "error: %s\n", err.c_str());
    std::fprintf(stderr, "dstrain: %zu error%s in %s (see docs/configuration.md)\n",
                 e.errors().size(), e.errors().size() == 1 ? "" : "s", o.config.c_str());
    return e.exit_code();
  }
  for (const auto& w : cfg.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  std::cout << cfg.to_json().dump(2) << std::endl;
  if (!o.train) {
    std::vector<std::string> missing;
    if (!cfg.has_model) missing.push_back("model");
    if (!cfg.has_data) missing.push_back("data.train");
    if (cfg.training.steps <= 0) missing.push_back("training.steps");
    if (!missing.empty()) {
      std::string list;
      for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
      std::fprintf(stderr, "note: valid, but `dstrain train` also needs: %s (check with --train)\n",
                   list.c_str());
    }
  }
  const auto& a = cfg.auto_micro_batch;
  auto number = [&](int64_t v, bool from_pick) { return from_pick ? std::string("auto") : std::to_string(v); };
  std::fprintf(stderr, "ok: %s for world size %d: data-parallel %d x tensor-parallel %d x "
               "pipeline %d; batch %s = micro %s x accumulation %s x data-parallel %d\n",
               o.config.c_str(), cfg.world_size, cfg.data_parallel_size, cfg.tensor_parallel.size,
               cfg.pipeline.stages, number(cfg.train_batch_size, a.pending && !a.train_batch_size_fixed).c_str(),
               number(cfg.train_micro_batch_size_per_gpu, a.pending).c_str(),
               number(cfg.gradient_accumulation_steps, a.pending && !a.accumulation_steps_fixed).c_str(),
               cfg.data_parallel_size);
  return 0;
}

}  // namespace

void add_config_read_flags(CLI::App* sub, config::ParseOptions& o) {
  sub->add_flag("--strict", o.strict,
                "every unknown key is an error (default: one DeepSpeed would ignore is a warning "
                "unless a known key is within two edits)");
  sub->add_option("--set", o.sets,
                  "KEY=VALUE: set a key of the config before it is validated (repeatable); KEY "
                  "is a dotted path (optimizer.params.lr=3e-4, zero_optimization.stage=2), VALUE "
                  "JSON when it parses as JSON, else a string")
      ->allow_extra_args(false);
}

void add_config_command(CLI::App& app, std::vector<Command>& out) {
  auto* sub = app.add_subcommand("config", "work with job configs (DeepSpeed-style JSON)");
  sub->require_subcommand(1);
  auto opts = std::make_shared<ConfigCheckOptions>();
  auto* check = sub->add_subcommand(
      "check",
      "validate a job config; print it resolved (every default filled in) as JSON on stdout and "
      "warnings on stderr, exit 0; or print every error and exit 2");
  check->add_option("config", opts->config, "the job config (JSON)")->required();
  check->add_option("--world-size,-n", opts->world_size,
                    "number of ranks the batch sizes are resolved for (default 1)");
  check->add_flag("--train", opts->train,
                  "also require what `dstrain train` needs: a model section, data.train and "
                  "training.steps");
  add_config_read_flags(check, opts->parse);
  add_auto_batch_flags(check, opts->auto_batch);
  out.push_back({check, [opts] { return run_config_check(*opts); }});
}

}  // namespace ds::cli
