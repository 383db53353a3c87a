// `dstrain eval`: a downstream task (runtime/train/task_eval.h: HellaSwag, LAMBADA) scored by a
// trained model on the CPU: the weights of a dstrain checkpoint (any layout), an llm.c file, Hugging
// Face safetensors (with the config that gives their shape), or what a config names. The result
// goes to stdout (a line, or JSON with --json), what was loaded to stderr.
#include <chrono>
#include <filesystem>
#include <iostream>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common/error.h"
#include "config/job_config.h"
#include "train/sampling.h"
#include "train/task_eval.h"

namespace ds::cli {

namespace {

namespace rtt = rt::train;

struct EvalCmdOptions {
  std::string task, data, checkpoint, init_from, config;
  int64_t limit = 0;
  int batch = 8;
  bool json = false;
  std::string tokenizer, vocab, spm_model, llmc;
};

int run_eval(const EvalCmdOptions& o) {
  if (o.checkpoint.empty() && o.init_from.empty() && o.config.empty()) {
    throw Error(ErrorKind::kInvalidArgument, "dstrain eval needs a model: --checkpoint DIR, --init-from FILE or --config FILE",
                "--checkpoint takes a step_N directory or a training.checkpoint_dir; --init-from an llm.c file, or "
                "Hugging Face safetensors with --config; --config alone evaluates what the config names (its "
                "newest checkpoint, else its model.init_from, else its untrained initial weights)");
  }
  if (!o.checkpoint.empty() && !o.init_from.empty()) {
    throw invalid_argument("dstrain eval takes one of --checkpoint and --init-from, not both");
  }
  const rtt::TaskKind kind = rtt::task_kind_of(o.task, "--task");
  const bool hf = !o.init_from.empty() && (std::filesystem::is_directory(o.init_from) ||
                                           std::filesystem::path(o.init_from).extension() == ".safetensors");
  if (hf && o.config.empty()) {
    throw Error(ErrorKind::kInvalidArgument,
                "--init-from " + o.init_from + ": Hugging Face safetensors need --config FILE for the model's shape",
                "pass the config the weights were trained or exported with");
  }
  std::optional<config::JobConfig> cfg;
  if (!o.config.empty()) cfg = config::load_job_config(o.config, 1);
  rtt::SamplingModel model = !o.checkpoint.empty() ? rtt::load_checkpoint_model(o.checkpoint)
                             : hf                  ? rtt::load_hf_model(o.init_from, *cfg)
                             : !o.init_from.empty() ? rtt::load_llmc_model(o.init_from)
                                                    : rtt::load_config_model(*cfg);
  if (cfg) rtt::require_same_model(model, *cfg);
  // The tokenizer: the flags, else the config's data.tokenizer, else the checkpoint's run's.
  std::optional<rt::data::TokenizerSpec> spec;
  if (!o.tokenizer.empty()) {
    spec = rt::data::TokenizerSpec{o.tokenizer, o.tokenizer == "gpt2" || o.tokenizer == "hf" ? o.vocab
                                                : o.tokenizer == "llmc"                      ? o.llmc
                                                                                             : o.spm_model};
  } else if (cfg) {
    spec = rtt::config_tokenizer(*cfg);
  } else if (!o.checkpoint.empty()) {
    spec = rtt::config_tokenizer(rtt::checkpoint_config(o.checkpoint));
  }
  const auto codec = rtt::codec_for(model.shape.vocab_size, spec ? &*spec : nullptr);
  const rtt::EvalTask task = rtt::read_eval_task(kind, o.data, *codec, o.limit, model.shape.seq_len);
  const int rows_per_item = kind == rtt::TaskKind::kHellaswag ? 4 : 1;
  const int T = rtt::eval_positions(task, model.shape.seq_len);
  std::cerr << fmt::format("dstrain: {} on {} items of {} with {} ({} tokenizer; {} rows of {} positions a batch)\n",
                           o.task, task.items.size(), o.data, model.source, codec->name(), o.batch * rows_per_item,
                           T);
  rtt::EvalScorer scorer(model.shape, model.params.data(), o.batch * rows_per_item, T);
  const auto t0 = std::chrono::steady_clock::now();
  const rtt::TaskScore score = rtt::summarize_task(task, scorer.score(task));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cerr << fmt::format("dstrain: scored {} items in {:.3f} s ({:.3f} items/s)\n", score.n, seconds,
                           static_cast<double>(score.n) / seconds);
  if (o.json) {
    std::cout << rtt::task_score_json(score).dump() << "\n";
  } else if (kind == rtt::TaskKind::kHellaswag) {
    std::cout << fmt::format("hellaswag: n {} acc {:.4f} acc_norm {:.4f}\n", score.n, score.acc, score.acc_norm);
  } else {
    std::cout << fmt::format("lambada: n {} acc {:.4f} ppl {:.4f}\n", score.n, score.acc, score.ppl);
  }
  return 0;
}

}  // namespace

void add_eval_command(CLI::App& app, std::vector<Command>& out) {
  auto o = std::make_shared<EvalCmdOptions>();
  auto* sub = app.add_subcommand("eval", "score a trained model on a downstream task (HellaSwag, LAMBADA) on the CPU");
  sub->add_option("--task", o->task, "hellaswag (4 endings, acc and acc_norm) or lambada (last word: acc, ppl)")
      ->required()
      ->check(CLI::IsMember({"hellaswag", "lambada"}));
  sub->add_option("--data", o->data,
                  "the task's jsonl: HellaSwag's {ctx, endings, label} lines (llm.c's hellaswag_val.jsonl), "
                  "LAMBADA's {text} lines (docs/evaluation.md)")
      ->required();
  sub->add_option("--checkpoint", o->checkpoint,
                  "a dstrain checkpoint: a step_N directory, or a training.checkpoint_dir (its latest)");
  sub->add_option("--init-from", o->init_from,
                  "an llm.c checkpoint file, or Hugging Face safetensors (a .safetensors file or a directory, "
                  "with --config)");
  sub->add_option("--config,-c", o->config,
                  "a run's config: alone, evaluate what it names (its newest checkpoint, else model.init_from, else "
                  "its untrained initial weights); with another source, its model must match; its data.tokenizer "
                  "is the default tokenizer");
  sub->add_option("--limit", o->limit, "score the first N items only (default: all)")->check(CLI::Range(int64_t{0}, INT64_MAX));
  sub->add_option("--batch", o->batch, "items per forward pass (default 8)")->check(CLI::Range(1, 1 << 16));
  sub->add_flag("--json", o->json, "print {\"task\", \"n\", \"acc\", \"acc_norm\" (or \"ppl\")} as JSON");
  sub->add_option("--tokenizer", o->tokenizer,
                  "the run's tokenizer: byte, gpt2, hf, sentencepiece or llmc (default: the config's or the "
                  "checkpoint's data.tokenizer, else byte-level for a vocabulary of 256 or less)")
      ->check(CLI::IsMember({"byte", "gpt2", "hf", "sentencepiece", "llmc"}));
  sub->add_option("--vocab", o->vocab, "gpt2: the vocabulary directory; hf: tokenizer.json or its directory");
  sub->add_option("--spm-model", o->spm_model, "sentencepiece: the .model file");
  sub->add_option("--llmc-tokenizer", o->llmc, "llmc: llm.c's gpt2_tokenizer.bin");
  out.push_back({sub, [o] { return run_eval(*o); }});
}

}  // namespace ds::cli
