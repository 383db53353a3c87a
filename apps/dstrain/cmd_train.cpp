// `dstrain train`: train in this process. Alone it is a single-process run; under `dstrain
// launch` every worker runs it, reading its rank and world from the environment contract.
#include <csignal>
#include <iostream>

#include "commands.h"
#include "common/env.h"
#include "config/job_config.h"
#include "train/trainer.h"

namespace ds::cli {

namespace {

struct TrainCmdOptions {
  std::string config;
  rt::train::TrainOptions train;
  std::string export_llmc;  // after training: the weights as an llm.c checkpoint
};

int run_train(const TrainCmdOptions& o) {
  // A write past a file-size limit (RLIMIT_FSIZE) fails with EFBIG, reported with the path and
  // the bytes needed, instead of killing the rank with SIGXFSZ.
  std::signal(SIGXFSZ, SIG_IGN);
  int world = static_cast<int>(env::get_int("WORLD_SIZE"));
  auto cfg = config::load_job_config(o.config, world);
  for (const auto& w : cfg.warnings) {
    if (env::get_int("RANK") == 0) std::cerr << "dstrain: warning: " << w << "\n";
  }
  rt::train::Trainer trainer(cfg, o.train);
  trainer.run();
  if (!o.export_llmc.empty()) {
    trainer.export_llmc(o.export_llmc);
    if (env::get_int("RANK") == 0) std::cerr << "dstrain: wrote llm.c checkpoint " << o.export_llmc << "\n";
  }
  return 0;
}

}  // namespace

void add_train_command(CLI::App& app, std::vector<Command>& out) {
  auto o = std::make_shared<TrainCmdOptions>();
  auto* sub = app.add_subcommand("train", "train a GPT-2 model in this process (what every rank of "
                                          "`dstrain launch` runs)");
  sub->add_option("--config,-c", o->config, "job config (DeepSpeed-style JSON)")->required();
  sub->add_option("--init-from", o->train.init_from, "start from this llm.c GPT-2 checkpoint");
  sub->add_option("--metrics", o->train.metrics_path,
                  "append one JSON object per step to this file (rank 0 writes it; every rank "
                  "may be given the same path)");
  sub->add_flag("--metrics-all-ranks", o->train.metrics_all_ranks,
                "rank 0's metrics also carry every rank's peak bytes (peak_bytes_<tag>_rank<r>)");
  sub->add_flag("--resume", o->train.resume,
                "continue from the latest checkpoint in training.checkpoint_dir, if any");
  sub->add_option("--resume-from", o->train.resume_from,
                  "resume from this checkpoint directory (a step_* directory of training.checkpoint_dir) "
                  "instead of the one `latest` names");
  sub->add_option("--max-steps", o->train.max_steps,
                  "stop after this step (the schedule still spans training.steps)");
  sub->add_option("--export-llmc", o->export_llmc,
                  "after training, write the fp32 weights as an llm.c GPT-2 checkpoint (rank 0 "
                  "writes; with --resume --max-steps N it exports checkpoint N without training); "
                  "tensor-parallel and pipeline parts are reassembled into the whole model");
  // Test hooks (hidden): a rank SIGKILLs itself mid-step.
  sub->add_option("--test-kill-rank", o->train.kill_rank)->group("");
  sub->add_option("--test-kill-at-step", o->train.kill_at_step)->group("");
  // Test hook (hidden): one gradient element (global element 0, on rank 0) becomes +inf.
  sub->add_option("--test-inject-inf-at-step", o->train.inject_inf_at_step)->group("");
  out.push_back({sub, [o] { return run_train(*o); }});
}

}  // namespace ds::cli
