// `dstrain eval`: a downstream task (runtime/train/task_eval.h: HellaSwag, LAMBADA) scored by a
// trained model on the CPU: the weights of a dstrain checkpoint (any layout), an llm.c file, Hugging
// Face safetensors (with the config that gives their shape), or what a config names. The result
// goes to stdout (a line, or JSON with --json), what was loaded to stderr.
#include <chrono>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "model_source.h"
#include "train/sampling.h"
#include "train/task_eval.h"

namespace ds::cli {

namespace {

namespace rtt = rt::train;

struct EvalCmdOptions {
  ModelSourceOptions source{"eval", /*config_names_model=*/true};
  std::string task, data;
  int64_t limit = 0;
  int batch = 8;
  bool json = false;
};

int run_eval(const EvalCmdOptions& o) {
  const rtt::TaskKind kind = rtt::task_kind_of(o.task, "--task");
  const LoadedModel m = load_model_source(o.source);
  const rtt::SamplingModel& model = m.model;
  const rtt::EvalTask task = rtt::read_eval_task(kind, o.data, *m.codec, o.limit, model.shape.seq_len);
  const int rows_per_item = kind == rtt::TaskKind::kHellaswag ? 4 : 1;
  const int T = rtt::eval_positions(task, model.shape.seq_len);
  std::cerr << fmt::format("dstrain: {} on {} items of {} with {} ({} tokenizer; {} rows of {} positions a batch)\n",
                           o.task, task.items.size(), o.data, model.source, m.codec->name(), o.batch * rows_per_item,
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
  add_model_source_options(sub, o->source,
                           "a run's config: alone, evaluate what it names (its newest checkpoint, else "
                           "model.init_from, else its untrained initial weights); with another source, its model "
                           "must match; its data.tokenizer is the default tokenizer");
  sub->add_option("--limit", o->limit, "score the first N items only (default: all)")
      ->check(CLI::Range(int64_t{0}, INT64_MAX));
  sub->add_option("--batch", o->batch, "items per forward pass (default 8)")->check(CLI::Range(1, 1 << 16));
  sub->add_flag("--json", o->json, "print {\"task\", \"n\", \"acc\", \"acc_norm\" (or \"ppl\")} as JSON");
  out.push_back({sub, [o] { return run_eval(*o); }});
}

}  // namespace ds::cli
