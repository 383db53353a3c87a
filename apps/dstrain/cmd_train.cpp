// `dstrain train`: train in this process. Alone it is a single-process run; under `dstrain
// launch` every worker runs it, reading its rank and world from the environment contract; started
// by srun or mpirun (direct mode, lib/launch/direct_mode.h), it first turns their environment into
// that contract, and rank 0 hosts the store.
//
// Preemption: from the start of training to the exit, SIGTERM (and --preempt-signal /
// DSTRAIN_PREEMPT_SIGNAL) asks every rank to finish the step, write a checkpoint and exit 75
// (common/preemption.h); before training starts it ends the process as usual. A restarted job
// (DSTRAIN_RESTART_COUNT or SLURM_RESTART_COUNT above 0) with training.checkpoint_dir resumes
// from its latest checkpoint without --resume.
#include <signal.h>

#include <csignal>
#include <iostream>

#include <spdlog/spdlog.h>

#include <omp.h>

#include "auto_batch.h"
#include "commands.h"
#include "comm/flight_recorder.h"
#include "common/env.h"
#include "common/error.h"
#include "common/preemption.h"
#include "common/rank_lines.h"
#include "config/job_config.h"
#include "launch/direct_mode.h"
#include "train/trainer.h"

namespace ds::cli {

namespace {

struct TrainCmdOptions {
  std::string config;
  config::ParseOptions parse;  // --strict
  AutoBatchFlags auto_batch;   // --gpu-mem, --calibration: train_micro_batch_size_per_gpu "auto"
  std::string preempt_signal;  // besides SIGTERM
  rt::train::TrainOptions train;
  std::string export_llmc;  // after training: the weights as an llm.c checkpoint
  std::string export_llmc_dtype = "fp32";  // fp32 (version 3) or bf16 (version 5)
  double comm_timeout = 0;                 // > 0: overrides training.comm_timeout
  std::string export_safetensors;          // after training: HF safetensors + config.json
  std::string export_safetensors_dtype = "fp32";
  std::string export_adapter;              // after training: a LoRA run's adapters in PEFT's files
};

// How many times the job was restarted: by dstrain launch --max-restarts, or by Slurm (requeue).
int64_t restart_count() {
  int64_t slurm = env::get("SLURM_RESTART_COUNT") ? env::get_int("SLURM_RESTART_COUNT") : 0;
  return std::max(env::get_int("DSTRAIN_RESTART_COUNT"), slurm);
}

// An elastic restart (dstrain launch --nnodes) on fewer ranks keeps the first world's global
// batch: the micro-batch stays and gradient_accumulation_steps grows, through --set overrides of
// the batch triad (the loader then resumes at the same sample: its windows per optimizer step are
// unchanged). A batch the new data-parallel size cannot divide is an error naming both sizes.
void keep_elastic_global_batch(const TrainCmdOptions& o, int world, bool rank0, config::ParseOptions& parse) {
  const int64_t first = env::get_int("DSTRAIN_ELASTIC_WORLD_SIZE");
  if (first <= 0 || first == world) return;
  const auto base = config::load_job_config(o.config, static_cast<int>(first), o.parse);
  if (base.auto_micro_batch.pending) {
    throw invalid_argument("{}: an elastic restart on {} rank(s) needs a fixed train_micro_batch_size_per_gpu (it "
                           "keeps the micro-batch and raises gradient_accumulation_steps), not \"auto\"",
                           o.config, world);
  }
  const int64_t tbs = base.train_batch_size, mbs = base.train_micro_batch_size_per_gpu;
  const int64_t model_parallel = first / base.data_parallel_size;
  if (world % model_parallel != 0) {
    throw invalid_argument("{}: an elastic restart on {} rank(s) cannot keep the layout: tensor x pipeline x context "
                           "parallel = {} does not divide {}",
                           o.config, world, model_parallel, world);
  }
  const int64_t dp = world / model_parallel;
  if (tbs % (mbs * dp) != 0) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{}: an elastic restart on {} rank(s) cannot keep the global batch: train_batch_size {} "
                            "(the first world's, {} rank(s) at data-parallel size {}) is not divisible by "
                            "train_micro_batch_size_per_gpu x the new data-parallel size = {} x {} = {}",
                            o.config, world, tbs, first, base.data_parallel_size, mbs, dp, mbs * dp),
                "choose a train_batch_size that every data-parallel size the job may shrink to divides, or a "
                "larger --nnodes MIN");
  }
  const int64_t gas = tbs / (mbs * dp);
  parse.sets.push_back(fmt::format("train_batch_size={}", tbs));
  parse.sets.push_back(fmt::format("train_micro_batch_size_per_gpu={}", mbs));
  parse.sets.push_back(fmt::format("gradient_accumulation_steps={}", gas));
  if (rank0) {
    spdlog::info("elastic restart on {} rank(s) (the job began with {}): data-parallel size {} -> {}, "
                 "gradient_accumulation_steps {} -> {}, global batch {} kept",
                 world, first, base.data_parallel_size, dp, base.gradient_accumulation_steps, gas, tbs);
  }
}

int preemption_signal(const TrainCmdOptions& o) {
  if (!o.preempt_signal.empty()) return preempt::parse_signal(o.preempt_signal, "--preempt-signal");
  auto v = env::get("DSTRAIN_PREEMPT_SIGNAL");
  return v && !v->empty() ? preempt::parse_signal(*v, "DSTRAIN_PREEMPT_SIGNAL") : 0;
}

int run_train(const TrainCmdOptions& o) {
  // A write past a file-size limit (RLIMIT_FSIZE) fails with EFBIG, reported with the path and
  // the bytes needed, instead of killing the rank with SIGXFSZ.
  std::signal(SIGXFSZ, SIG_IGN);
  auto direct = launch::DirectMode::enter();  // srun/mpirun started us: their ranks, rank 0's store
  const bool rank0 = env::get_int("RANK") == 0;
  int world = static_cast<int>(env::get_int("WORLD_SIZE"));
  config::ParseOptions parse = o.parse;
  keep_elastic_global_batch(o, world, rank0, parse);
  auto cfg = config::load_job_config(o.config, world, parse);
  // A micro-batch "auto": every rank plans the same job on the same inputs, so picks the same.
  resolve_auto_batch(cfg, o.auto_batch, std::max<int>(1, static_cast<int>(env::get_int("LOCAL_WORLD_SIZE"))),
                     omp_get_max_threads());
  if (o.comm_timeout > 0) cfg.training.comm_timeout = o.comm_timeout;
  for (const auto& w : cfg.warnings) {
    if (rank0) std::cerr << "dstrain: warning: " << w << "\n";
  }
  rt::train::TrainOptions opts = o.train;
  if (!opts.resume && !cfg.training.checkpoint_dir.empty() && restart_count() > 0) {
    opts.resume = true;
    if (rank0) spdlog::info("restart {} of this job: resuming from the latest checkpoint in {}", restart_count(),
                            cfg.training.checkpoint_dir);
  }
  const int extra_signal = preemption_signal(o);
  // kill -USR2 (of this rank, or of `dstrain launch`, which passes it on) dumps the collectives'
  // flight record (comm/flight_recorder.h), unless SIGUSR2 is the preemption signal.
  if (extra_signal != SIGUSR2) rt::comm::flight::install_dump_signal(SIGUSR2);
  rt::train::Trainer trainer(cfg, opts);
  // From here to the exit a stop signal only sets the flag: Slurm, srun and the agent may each
  // deliver one, and a rank that already stopped must still check out and exit 75.
  const preempt::Guard guard({extra_signal});
  rt::train::TrainResult result;
  try {
    result = trainer.run();
  } catch (...) {
    // For the launcher: an elastic restart names the step at which a node was lost.
    rank_lines::announce_failed_step(trainer.step_in_progress());
    throw;
  }
  if (!result.preempted && !o.export_llmc.empty()) {
    trainer.export_llmc(o.export_llmc, o.export_llmc_dtype == "bf16");
    if (rank0) std::cerr << "dstrain: wrote llm.c checkpoint " << o.export_llmc << "\n";
  }
  if (!result.preempted && !o.export_adapter.empty()) {
    trainer.export_adapter(o.export_adapter, o.export_safetensors_dtype);
    if (rank0) std::cerr << "dstrain: wrote the LoRA adapter (PEFT) in " << o.export_adapter << "\n";
  }
  if (!result.preempted && !o.export_safetensors.empty()) {
    trainer.export_safetensors(o.export_safetensors, o.export_safetensors_dtype);
    if (rank0) std::cerr << "dstrain: wrote Hugging Face safetensors in " << o.export_safetensors << "\n";
  }
  if (direct) direct->leave();
  if (!result.preempted) return 0;
  if (!result.checkpoint_written) {
    if (rank0) {
      std::cerr << "dstrain: preempted after step " << result.last_step
                << " without training.checkpoint_dir: nothing was saved\n";
    }
    return 128 + (preempt::signal_received() != 0 ? preempt::signal_received() : SIGTERM);
  }
  if (rank0) {
    std::cerr << "dstrain: preempted: every rank stopped after step " << result.last_step << " and wrote its checkpoint to " << cfg.training.checkpoint_dir
              << "; exit status " << preempt::kPreemptedExitCode << "\n";
  }
  return preempt::kPreemptedExitCode;
}

}  // namespace

void add_train_command(CLI::App& app, std::vector<Command>& out) {
  auto o = std::make_shared<TrainCmdOptions>();
  auto* sub = app.add_subcommand("train", "train the config's model (any model.type) in this process (what "
                                          "every rank of `dstrain launch` runs)");
  sub->add_option("--config,-c", o->config, "job config (DeepSpeed-style JSON)")->required();
  add_config_read_flags(sub, o->parse);
  add_auto_batch_flags(sub, o->auto_batch);
  sub->add_option("--init-from", o->train.init_from, "start from these weights in the model family's format: an llm.c checkpoint file, or "
                  "Hugging Face safetensors (a file or a directory)");
  sub->add_option("--metrics", o->train.metrics_path,
                  "append one JSON object per step to this file (rank 0 writes it; every rank "
                  "may be given the same path)");
  sub->add_flag("--metrics-all-ranks", o->train.metrics_all_ranks,
                "rank 0's metrics also carry every rank's peak bytes (peak_bytes_<tag>_rank<r>)");
  sub->add_flag("--resume", o->train.resume,
                "continue from the latest checkpoint in training.checkpoint_dir, if any (implied "
                "after a restart or a Slurm requeue)");
  sub->add_option("--resume-from", o->train.resume_from,
                  "resume from this checkpoint directory (a step_* directory of training.checkpoint_dir) "
                  "instead of the one `latest` names");
  sub->add_option("--preempt-signal", o->preempt_signal,
                  "besides SIGTERM, this signal (e.g. USR1) makes every rank finish its step, write "
                  "a checkpoint and exit 75 (default: DSTRAIN_PREEMPT_SIGNAL)");
  sub->add_option("--max-steps", o->train.max_steps,
                  "stop after this step (the schedule still spans training.steps)");
  sub->add_option("--export-llmc", o->export_llmc,
                  "after training, write the weights as an llm.c checkpoint (families llm.c holds; rank 0 "
                  "writes; with --resume --max-steps N it exports checkpoint N without training); "
                  "tensor-parallel and pipeline parts are reassembled into the whole model");
  sub->add_option("--export-llmc-dtype", o->export_llmc_dtype,
                  "fp32 (llm.c's version 3, the default) or bf16 (version 5, as llm.c's GPU trainer "
                  "writes: every weight rounded to bf16 once)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  sub->add_option("--export-safetensors", o->export_safetensors,
                  "after training, write the weights into this directory as Hugging Face safetensors "
                  "(the family's HF names) with a config.json transformers reads (families with an HF format)");
  sub->add_option("--export-safetensors-dtype", o->export_safetensors_dtype,
                  "fp32 (default), bf16 or fp16 (also the adapter's, --export-adapter)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  sub->add_option("--export-adapter", o->export_adapter,
                  "after training a LoRA run, write its adapters into this directory as PEFT's "
                  "adapter_config.json and adapter_model.safetensors (peft.PeftModel.from_pretrained loads "
                  "them); --export-safetensors and --export-llmc write the merged model W + (alpha/r) B A");
  // Test hooks (hidden): a rank SIGKILLs itself mid-step.
  sub->add_option("--comm-timeout", o->comm_timeout,
                  "seconds a rank may show no progress while the others wait for it in a collective "
                  "before the job fails naming it (default: training.comm_timeout, 60)")
      ->check(CLI::Range(0.001, 86400.0));
  sub->add_option("--test-kill-rank", o->train.kill_rank)->group("");
  sub->add_option("--test-kill-at-step", o->train.kill_at_step)->group("");
  // Test hook (hidden): one gradient element (global element 0, on rank 0) becomes +inf.
  sub->add_option("--test-inject-inf-at-step", o->train.inject_inf_at_step)->group("");
  out.push_back({sub, [o] { return run_train(*o); }});
}

}  // namespace ds::cli
