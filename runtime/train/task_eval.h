// Downstream evaluation: tasks scored by a language model's completion losses, for
// `dstrain eval` and for training.eval_tasks (trainer.cpp).
//
// Two tasks, each a jsonl file (one JSON object per line; blank lines skipped):
//   hellaswag  llm.c's reading of HellaSwag: {"ctx": str, "endings": [4 str], "label": 0..3 (or
//              "0".."3")}. Each ending is scored by its completion loss given the context: the
//              tokens of encode(" " + ending) after encode(ctx), as llm.c's hellaswag.py does (no
//              start token). acc: the ending with the lowest summed loss is the label; acc_norm:
//              the lowest mean loss per token (llm.c's "completion style").
//   lambada    last-word prediction (LAMBADA, as EleutherAI's harness reads lambada_openai):
//              {"text": str}; the context is the text before its last space, the target
//              encode(" " + last word). acc: every target token is the model's most likely one
//              (greedy); ppl: exp of the mean over items of the target's summed loss.
//
// A row is one scored sequence: context then continuation, of which the continuation's tokens
// are scored (each predicted from the tokens before it). A row longer than model.seq_len + 1
// tokens loses context from the left (as lm-evaluation-harness truncates); a continuation that
// alone does not fit is an error naming the line. Rows go through the model as batch rows,
// left-aligned, padded with token 0 and ignored targets (-1), which a causal model never
// attends to from a scored position.
//
// The scorers: EvalScorer runs a whole model (fp32, host) in batches of rows (dstrain eval);
// the trainer runs its own model, any layout, through fill_eval_row and score_eval_row.
// Thread safety: none needed (one caller per object).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/allocator.h"
#include "model_spec/shape.h"
#include "train/sampling.h"

namespace ds::rt {
class Model;
class Activations;
}  // namespace ds::rt

namespace ds::rt::train {

enum class TaskKind { kHellaswag, kLambada };

// "hellaswag" | "lambada"; invalid_argument naming `where` and the two names otherwise.
TaskKind task_kind_of(const std::string& name, const std::string& where);
const char* task_name(TaskKind k);

struct EvalRow {
  std::vector<int32_t> tokens;  // context then continuation
  int32_t score_begin = 1;      // tokens [score_begin, size) are scored; >= 1
  int64_t scored() const { return static_cast<int64_t>(tokens.size()) - score_begin; }
};

struct EvalItem {
  std::vector<EvalRow> rows;  // hellaswag: the 4 endings; lambada: the one target
  int label = 0;              // the right row
  int64_t line = 0;           // in the file, for messages
};

struct EvalTask {
  TaskKind kind = TaskKind::kHellaswag;
  std::string path;
  std::vector<EvalItem> items;
  int64_t rows() const;
  // Every item's rows in order (the order scores are given in).
  std::vector<const EvalRow*> row_list() const;
};

// Reads the first `limit` items (0: all) of `path`, tokenized by `codec`, for a model of
// `seq_len` positions. invalid_argument naming "path:line" and the key for a malformed line (not
// JSON, a missing or mistyped key, hellaswag endings other than 4, a label outside 0..3, a lambada
// text without a space before its last word, a continuation longer than seq_len tokens), and the
// file when it cannot be read or holds no item.
EvalTask read_eval_task(TaskKind kind, const std::string& path, const TextCodec& codec, int64_t limit, int seq_len);

// One row's sums: the scored tokens' losses and how many of them were not the model's top token.
// Summable over ranks that each hold some of the row's positions (context parallelism).
struct RowScore {
  double loss = 0;
  double misses = 0;
};

// Batch row of T positions: inputs = tokens[0..n-2], targets = tokens[t+1] where t+1 is scored,
// else -1; positions n-1..T-1 padded (input 0, target -1). n - 1 <= T. A null row: all padding.
void fill_eval_row(const EvalRow* row, int T, int32_t* inputs, int32_t* targets);
// The row's sums from the per-position losses and top flags of its batch row (T each, as
// Activations::host_losses / target_is_top hold them).
RowScore score_eval_row(const EvalRow& row, const float* losses, const uint8_t* top);

struct TaskScore {
  TaskKind kind = TaskKind::kHellaswag;
  int64_t n = 0;
  double acc = 0;
  double acc_norm = 0;  // hellaswag
  double ppl = 0;       // lambada
};
// From every row's score, in the task's row order (items in order, their rows in order).
TaskScore summarize_task(const EvalTask& task, std::span<const RowScore> rows);
// {"task", "n", "acc", "acc_norm"} (hellaswag) or {"task", "n", "acc", "ppl"} (lambada).
nlohmann::json task_score_json(const TaskScore& s);
// The metrics' names and values: eval_<task>_acc and eval_<task>_acc_norm (or _ppl).
std::vector<std::pair<std::string, double>> task_metrics(const TaskScore& s);

// A whole model (fp32, on the host) scoring rows `batch_rows` at a time in sequences of T
// positions (T >= every row's length - 1, <= seq_len).
class EvalScorer {
 public:
  EvalScorer(const model_spec::ModelShape& shape, const float* params, int batch_rows, int T,
             Allocator& alloc = Allocator::process());
  ~EvalScorer();
  std::vector<RowScore> score(const EvalTask& task);

 private:
  int B_, T_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Activations> acts_;
  std::vector<int32_t> inputs_, targets_;
};

// The positions a task's longest row needs (its length - 1), rounded up to a multiple of 16,
// at most seq_len.
int eval_positions(const EvalTask& task, int seq_len);

}  // namespace ds::rt::train
