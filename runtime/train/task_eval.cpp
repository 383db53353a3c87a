// Downstream evaluation (task_eval.h): the task files, the rows, the scores and the whole-model scorer.
#include "train/task_eval.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/strings.h"
#include "kernels/typed.h"
#include "model/model.h"

namespace ds::rt::train {

namespace {

using Json = nlohmann::json;

constexpr int kHellaswagEndings = 4;

struct LineError {
  const std::string& path;
  int64_t line;
  Error operator()(const std::string& what) const {
    return Error(ErrorKind::kInvalidArgument, fmt::format("{}:{}: {}", path, line, what),
                 "each line must be one JSON object of the task's format (docs/evaluation.md)");
  }
};

const std::string& string_at(const Json& j, const char* key, const LineError& err) {
  auto it = j.find(key);
  if (it == j.end()) throw err(fmt::format("missing \"{}\"", key));
  if (!it->is_string()) throw err(fmt::format("\"{}\": expected a string, got {}", key, it->type_name()));
  return it->get_ref<const std::string&>();
}

std::vector<int32_t> encode(const TextCodec& codec, const std::string& text, const char* what, const LineError& err) {
  try {
    return codec.encode(text);
  } catch (const Error& e) {
    throw err(fmt::format("{}: cannot tokenize with the {} tokenizer: {}", what, codec.name(), e.what()));
  }
}

// Context then continuation, losing context from the left past seq_len + 1 tokens.
EvalRow make_row(const std::vector<int32_t>& context, const std::vector<int32_t>& continuation, int seq_len,
                 const char* what, const LineError& err) {
  if (context.empty()) throw err(fmt::format("{}: the context is empty (a scored token needs one before it)", what));
  if (continuation.empty()) throw err(fmt::format("{}: the continuation has no tokens", what));
  if (static_cast<int64_t>(continuation.size()) > seq_len) {
    throw err(fmt::format("{}: the continuation is {} tokens, more than model.seq_len {} can score", what,
                          continuation.size(), seq_len));
  }
  EvalRow row;
  const size_t keep = std::min(context.size(), static_cast<size_t>(seq_len) + 1 - continuation.size());
  row.tokens.assign(context.end() - static_cast<std::ptrdiff_t>(keep), context.end());
  row.score_begin = static_cast<int32_t>(keep);
  row.tokens.insert(row.tokens.end(), continuation.begin(), continuation.end());
  return row;
}

EvalItem hellaswag_item(const Json& j, const TextCodec& codec, int seq_len, const LineError& err) {
  const std::vector<int32_t> ctx = encode(codec, string_at(j, "ctx", err), "ctx", err);
  auto e = j.find("endings");
  if (e == j.end()) throw err("missing \"endings\"");
  if (!e->is_array() || e->size() != kHellaswagEndings) {
    throw err(fmt::format("\"endings\": expected an array of {} strings, got {}", kHellaswagEndings,
                          e->is_array() ? fmt::format("{} endings", e->size()) : std::string(e->type_name())));
  }
  EvalItem item;
  for (size_t i = 0; i < e->size(); ++i) {
    const Json& s = (*e)[i];
    const std::string at = fmt::format("endings[{}]", i);
    if (!s.is_string()) throw err(fmt::format("\"{}\": expected a string, got {}", at, s.type_name()));
    item.rows.push_back(
        make_row(ctx, encode(codec, " " + s.get<std::string>(), at.c_str(), err), seq_len, at.c_str(), err));
  }
  auto l = j.find("label");
  if (l == j.end()) throw err("missing \"label\"");
  std::optional<int64_t> label;
  if (l->is_number_integer()) label = l->get<int64_t>();
  if (l->is_string()) label = parse_int(l->get<std::string>());
  if (!label || *label < 0 || *label >= kHellaswagEndings) {
    throw err(fmt::format("\"label\": expected 0, 1, 2 or 3 (the right ending), got {}", l->dump()));
  }
  item.label = static_cast<int>(*label);
  return item;
}

EvalItem lambada_item(const Json& j, const TextCodec& codec, int seq_len, const LineError& err) {
  const std::string& text = string_at(j, "text", err);
  // Trailing whitespace only: leading text is context, positions included.
  std::string trimmed = text;
  while (!trimmed.empty() && std::isspace(static_cast<unsigned char>(trimmed.back()))) trimmed.pop_back();
  const size_t space = trimmed.rfind(' ');
  if (space == std::string::npos || space == 0 || space + 1 == trimmed.size()) {
    throw err("\"text\": expected a context, a space and a last word");
  }
  EvalItem item;
  item.rows.push_back(make_row(encode(codec, trimmed.substr(0, space), "text", err),
                               encode(codec, trimmed.substr(space), "text", err), seq_len, "text", err));
  return item;
}

}  // namespace

TaskKind task_kind_of(const std::string& name, const std::string& where) {
  if (name == "hellaswag") return TaskKind::kHellaswag;
  if (name == "lambada") return TaskKind::kLambada;
  throw invalid_argument("{}: unknown task \"{}\": expected \"hellaswag\" or \"lambada\"", where, name);
}

const char* task_name(TaskKind k) { return k == TaskKind::kHellaswag ? "hellaswag" : "lambada"; }

std::vector<const EvalRow*> EvalTask::row_list() const {
  std::vector<const EvalRow*> out;
  for (const auto& item : items) {
    for (const auto& row : item.rows) out.push_back(&row);
  }
  return out;
}

int64_t EvalTask::rows() const {
  int64_t n = 0;
  for (const auto& it : items) n += static_cast<int64_t>(it.rows.size());
  return n;
}

EvalTask read_eval_task(TaskKind kind, const std::string& path, const TextCodec& codec, int64_t limit, int seq_len) {
  std::ifstream in(path);
  if (!in) {
    throw Error(ErrorKind::kInvalidArgument, fmt::format("cannot read the {} file {}", task_name(kind), path),
                "give the task's jsonl file (docs/evaluation.md says where to get it)");
  }
  EvalTask task;
  task.kind = kind;
  task.path = path;
  std::string text;
  int64_t line = 0;
  while ((limit <= 0 || static_cast<int64_t>(task.items.size()) < limit) && std::getline(in, text)) {
    ++line;
    if (trim(text).empty()) continue;
    const LineError err{path, line};
    Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) throw err("not a JSON object");
    EvalItem item = kind == TaskKind::kHellaswag ? hellaswag_item(j, codec, seq_len, err)
                                                 : lambada_item(j, codec, seq_len, err);
    item.line = line;
    task.items.push_back(std::move(item));
  }
  if (task.items.empty()) {
    throw Error(ErrorKind::kInvalidArgument, fmt::format("the {} file {} holds no items", task_name(kind), path),
                "give the task's jsonl file, one JSON object per line");
  }
  return task;
}

void fill_eval_row(const EvalRow* row, int T, int32_t* inputs, int32_t* targets) {
  std::fill_n(inputs, T, 0);
  std::fill_n(targets, T, -1);
  if (row == nullptr) return;
  const auto n = static_cast<int>(row->tokens.size());
  DS_CHECK(n - 1 <= T, "row of {} tokens in {} positions", n, T);
  std::copy_n(row->tokens.begin(), n - 1, inputs);
  for (int t = row->score_begin - 1; t < n - 1; ++t) targets[t] = row->tokens[static_cast<size_t>(t) + 1];
}

RowScore score_eval_row(const EvalRow& row, const float* losses, const uint8_t* top) {
  RowScore s;
  const auto n = static_cast<int>(row.tokens.size());
  for (int t = row.score_begin - 1; t < n - 1; ++t) {
    s.loss += losses[t];
    s.misses += top[t] ? 0 : 1;
  }
  return s;
}

TaskScore summarize_task(const EvalTask& task, std::span<const RowScore> rows) {
  DS_CHECK(static_cast<int64_t>(rows.size()) == task.rows(), "{} scores for {} rows", rows.size(), task.rows());
  TaskScore s;
  s.kind = task.kind;
  s.n = static_cast<int64_t>(task.items.size());
  size_t r = 0;
  double right = 0, right_norm = 0, loss_sum = 0;
  for (const EvalItem& item : task.items) {
    if (task.kind == TaskKind::kLambada) {
      right += rows[r].misses == 0 ? 1 : 0;
      loss_sum += rows[r].loss;
      ++r;
      continue;
    }
    // The lowest summed and the lowest mean loss; ties go to the first, as argmin does.
    int best = 0, best_norm = 0;
    double lo = std::numeric_limits<double>::infinity(), lo_norm = lo;
    for (size_t i = 0; i < item.rows.size(); ++i, ++r) {
      const double sum = rows[r].loss, mean = sum / static_cast<double>(item.rows[i].scored());
      if (sum < lo) lo = sum, best = static_cast<int>(i);
      if (mean < lo_norm) lo_norm = mean, best_norm = static_cast<int>(i);
    }
    right += best == item.label ? 1 : 0;
    right_norm += best_norm == item.label ? 1 : 0;
  }
  const auto n = static_cast<double>(s.n);
  s.acc = right / n;
  s.acc_norm = right_norm / n;
  s.ppl = task.kind == TaskKind::kLambada ? std::exp(loss_sum / n) : 0;
  return s;
}

nlohmann::json task_score_json(const TaskScore& s) {
  Json j{{"task", task_name(s.kind)}, {"n", s.n}, {"acc", s.acc}};
  if (s.kind == TaskKind::kHellaswag) j["acc_norm"] = s.acc_norm;
  else j["ppl"] = s.ppl;
  return j;
}

std::vector<std::pair<std::string, double>> task_metrics(const TaskScore& s) {
  const std::string p = std::string("eval_") + task_name(s.kind) + "_";
  if (s.kind == TaskKind::kHellaswag) return {{p + "acc", s.acc}, {p + "acc_norm", s.acc_norm}};
  return {{p + "acc", s.acc}, {p + "ppl", s.ppl}};
}

int eval_positions(const EvalTask& task, int seq_len) {
  size_t longest = 2;
  for (const auto& item : task.items) {
    for (const auto& row : item.rows) longest = std::max(longest, row.tokens.size());
  }
  const int64_t need = (static_cast<int64_t>(longest) - 1 + 15) / 16 * 16;
  return static_cast<int>(std::min<int64_t>(need, seq_len));
}

EvalScorer::EvalScorer(const model_spec::ModelShape& shape, const float* params, int batch_rows, int T,
                       Allocator& alloc)
    : B_(batch_rows), T_(T) {
  ModelOptions o;
  o.B = batch_rows;
  o.T = T;
  model_ = make_model(shape, model_spec::ModelPart::whole(shape), o, alloc);
  kern::typed::from_host_f32(model_->params(), params, model_->num_params());
  model_->set_training(false);
  acts_ = model_->new_activations();
  acts_->record_top = true;
  inputs_.resize(static_cast<size_t>(B_) * T_);
  targets_.resize(inputs_.size());
}

EvalScorer::~EvalScorer() = default;

std::vector<RowScore> EvalScorer::score(const EvalTask& task) {
  const std::vector<const EvalRow*> rows = task.row_list();
  std::vector<RowScore> out(rows.size());
  const auto& part = model_->part();
  for (size_t r0 = 0; r0 < rows.size(); r0 += static_cast<size_t>(B_)) {
    const size_t n = std::min(rows.size() - r0, static_cast<size_t>(B_));
    for (size_t b = 0; b < static_cast<size_t>(B_); ++b) {
      fill_eval_row(b < n ? rows[r0 + b] : nullptr, T_, inputs_.data() + b * T_, targets_.data() + b * T_);
    }
    model_->embed_forward(*acts_, inputs_.data());
    model_->blocks_forward(*acts_, part.layer_begin, part.layer_end);
    model_->head_forward(*acts_, targets_.data());
    for (size_t b = 0; b < n; ++b) {
      out[r0 + b] = score_eval_row(*rows[r0 + b], acts_->host_losses.data() + b * T_,
                                   acts_->target_is_top.data() + b * T_);
    }
  }
  return out;
}

}  // namespace ds::rt::train
