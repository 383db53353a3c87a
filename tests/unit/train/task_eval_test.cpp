// Downstream evaluation (train/task_eval.h): the task files and their errors, the rows, acc and
// acc_norm against a hand computation, and the batched scorer against the KV-cache generator (an
// independent forward: one token at a time, its own attention) on every row.
#include "train/task_eval.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include <gtest/gtest.h>

#include "common/error.h"
#include "core/allocator.h"
#include "kernels/typed.h"
#include "model/generate.h"
#include "model/model.h"

namespace ds::rt::train {
namespace {

namespace ms = ds::model_spec;
namespace fs = std::filesystem;

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("ds_task_eval_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = (path / name).string();
    std::ofstream(p) << text;
    return p;
  }
};

ms::ModelShape byte_gpt2(int seq_len = 64) {
  ms::ModelShape s;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_embd = 32;
  s.vocab_size = 256;
  s.padded_vocab_size = 256;
  s.seq_len = seq_len;
  return s;
}

std::vector<float> initial_params(const ms::ModelShape& s, uint64_t seed) {
  auto m = make_model(s, ms::ModelPart::whole(s), ModelOptions{}, Allocator::process());
  m->init_weights(seed);
  std::vector<float> p(static_cast<size_t>(m->num_params()));
  kern::typed::to_host_f32(p.data(), m->params(), m->num_params());
  return p;
}

const std::string kThreeItems =
    R"({"ctx": "The farmer went out", "endings": ["to sow his seed.", "and ate", "zzq", "by the river to fish"], "label": 0})"
    "\n\n"
    R"({"ctx": "In the beginning", "endings": ["God created", "was the word and the word", "x", "it rained"], "label": "2"})"
    "\n"
    R"({"ctx": "And the light", "endings": ["shineth in darkness", "is good", "went out", "q"], "label": 3})"
    "\n";

TEST(TaskEval, ReadsHellaswagAsLlmcDoes) {
  TempDir d;
  const auto codec = codec_for(256);
  const EvalTask t = read_eval_task(TaskKind::kHellaswag, d.write("h.jsonl", kThreeItems), *codec, 0, 64);
  ASSERT_EQ(t.items.size(), 3u);
  EXPECT_EQ(t.rows(), 12);
  EXPECT_EQ(t.items[0].label, 0);
  EXPECT_EQ(t.items[1].label, 2);  // a label written as a string, as Hugging Face's copy has it
  EXPECT_EQ(t.items[2].line, 4);   // the blank line counts
  // ctx tokens, then " " + ending's tokens; the ending's are scored.
  const EvalRow& r = t.items[0].rows[1];
  EXPECT_EQ(r.score_begin, 19);
  EXPECT_EQ(codec->decode(r.tokens), "The farmer went out and ate");
  EXPECT_EQ(r.scored(), 8);
  // --limit: the first N items.
  EXPECT_EQ(read_eval_task(TaskKind::kHellaswag, d.write("h2.jsonl", kThreeItems), *codec, 2, 64).items.size(), 2u);
}

TEST(TaskEval, LongRowsLoseContextFromTheLeft) {
  TempDir d;
  const auto codec = codec_for(256);
  const std::string ctx(40, 'a');
  const EvalTask t = read_eval_task(TaskKind::kLambada, d.write("l.jsonl", R"({"text": ")" + ctx + R"( bcdefghij"})"),
                                    *codec, 0, 16);
  const EvalRow& r = t.items[0].rows[0];
  EXPECT_EQ(r.tokens.size(), 17u);  // seq_len + 1
  EXPECT_EQ(r.scored(), 10);        // " bcdefghij"
  EXPECT_EQ(codec->decode(r.tokens), std::string(7, 'a') + " bcdefghij");
}

void expect_error(TaskKind kind, const std::string& text, const std::string& message, int seq_len = 64) {
  TempDir d;
  const std::string path = d.write("bad.jsonl", text);
  const auto codec = codec_for(256);
  try {
    read_eval_task(kind, path, *codec, 0, seq_len);
    ADD_FAILURE() << "no error for " << text;
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path + ":" + message) << text;
  }
}

TEST(TaskEval, BadLinesAreNamedWithTheirLine) {
  const std::string ok = R"({"ctx": "a", "endings": ["b", "c", "d", "e"], "label": 1})";
  expect_error(TaskKind::kHellaswag, ok + "\n" + R"({"ctx": "a", "endings": ["b", "c", "d"], "label": 1})",
               "2: \"endings\": expected an array of 4 strings, got 3 endings");
  expect_error(TaskKind::kHellaswag, ok + "\n" + ok + "\n" + R"({"ctx": "a", "endings": ["b", "c", "d", "e"], "label": 4})",
               "3: \"label\": expected 0, 1, 2 or 3 (the right ending), got 4");
  expect_error(TaskKind::kHellaswag, R"({"ctx": "a", "endings": ["b", "c", "d", "e"], "label": "x"})",
               "1: \"label\": expected 0, 1, 2 or 3 (the right ending), got \"x\"");
  expect_error(TaskKind::kHellaswag, R"({"ctx": "a", "endings": ["b", "c", "d", "e"]})", "1: missing \"label\"");
  expect_error(TaskKind::kHellaswag, R"({"ctx": 3, "endings": ["b", "c", "d", "e"], "label": 0})",
               "1: \"ctx\": expected a string, got number");
  expect_error(TaskKind::kHellaswag, R"({"ctx": "a", "endings": ["b", 2, "d", "e"], "label": 0})",
               "1: \"endings[1]\": expected a string, got number");
  expect_error(TaskKind::kHellaswag, "{\"ctx\": \"a\",", "1: not a JSON object");
  expect_error(TaskKind::kHellaswag, R"({"ctx": "a", "endings": ["b", "c", "d", ")" + std::string(70, 'e') + R"("], "label": 0})",
               "1: endings[3]: the continuation is 71 tokens, more than model.seq_len 64 can score");
  expect_error(TaskKind::kLambada, R"({"text": "oneword"})", "1: \"text\": expected a context, a space and a last word");
  expect_error(TaskKind::kLambada, R"({"txt": "a b"})", "1: missing \"text\"");
}

TEST(TaskEval, AnEmptyFileAndAnUnknownTaskAreNamed) {
  TempDir d;
  const auto codec = codec_for(256);
  const std::string p = d.write("empty.jsonl", "\n\n");
  EXPECT_THROW(read_eval_task(TaskKind::kLambada, p, *codec, 0, 64), Error);
  EXPECT_THROW(read_eval_task(TaskKind::kLambada, (d.path / "missing.jsonl").string(), *codec, 0, 64), Error);
  try {
    task_kind_of("mmlu", "--task");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "--task: unknown task \"mmlu\": expected \"hellaswag\" or \"lambada\"");
  }
}

TEST(TaskEval, AccCountsTheLowestSumAndAccNormTheLowestMean) {
  // Three items by hand. Item 0: sums (4, 3, 9, 8) over (2, 1, 3, 4) tokens: means (2, 3, 3, 2):
  // acc picks 1, acc_norm picks 0 (the first of the tied means). Item 1: sums (5, 6, 1, 7) over
  // (5, 3, 1, 7): means (1, 2, 1, 1): acc picks 2, acc_norm picks 0. Item 2: sums (2, 2, 3, 1) over
  // (1, 1, 6, 1): means (2, 2, 0.5, 1): acc picks 3, acc_norm picks 2. Labels (0, 2, 2): acc 1/3
  // (item 1), acc_norm 2/3 (items 0 and 2).
  EvalTask t;
  const std::vector<std::vector<int>> lens = {{2, 1, 3, 4}, {5, 3, 1, 7}, {1, 1, 6, 1}};
  const std::vector<std::vector<double>> sums = {{4, 3, 9, 8}, {5, 6, 1, 7}, {2, 2, 3, 1}};
  const std::vector<int> labels = {0, 2, 2};
  std::vector<RowScore> scores;
  for (size_t i = 0; i < 3; ++i) {
    EvalItem item;
    item.label = labels[i];
    for (size_t e = 0; e < 4; ++e) {
      EvalRow row;
      row.tokens.assign(static_cast<size_t>(1 + lens[i][e]), 7);
      row.score_begin = 1;
      item.rows.push_back(row);
      scores.push_back({sums[i][e], 0});
    }
    t.items.push_back(item);
  }
  const TaskScore s = summarize_task(t, scores);
  EXPECT_EQ(s.n, 3);
  EXPECT_DOUBLE_EQ(s.acc, 1.0 / 3);
  EXPECT_DOUBLE_EQ(s.acc_norm, 2.0 / 3);
  EXPECT_EQ(task_score_json(s).dump(), R"({"acc":0.3333333333333333,"acc_norm":0.6666666666666666,"n":3,"task":"hellaswag"})");
  const auto m = task_metrics(s);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].first, "eval_hellaswag_acc");
  EXPECT_EQ(m[1].first, "eval_hellaswag_acc_norm");
}

TEST(TaskEval, LambadaAccIsGreedyAndPplTheMeanSummedLoss) {
  EvalTask t;
  t.kind = TaskKind::kLambada;
  for (int i = 0; i < 4; ++i) {
    EvalItem item;
    item.rows.push_back(EvalRow{{1, 2, 3}, 1});
    t.items.push_back(item);
  }
  const std::vector<RowScore> scores = {{1.0, 0}, {2.0, 1}, {3.0, 0}, {2.0, 2}};
  const TaskScore s = summarize_task(t, scores);
  EXPECT_DOUBLE_EQ(s.acc, 0.5);
  EXPECT_NEAR(s.ppl, std::exp(2.0), 1e-12);
  EXPECT_EQ(task_metrics(s)[1].first, "eval_lambada_ppl");
}

// Every row's summed loss and greedy misses, one token at a time through the generator's own
// forward (KV cache): the hand computation the scorer must match.
std::vector<RowScore> generator_scores(const ms::ModelShape& s, const float* params, const EvalTask& t) {
  Generator gen(s, params);
  std::vector<RowScore> out;
  for (const auto& item : t.items) {
    for (const auto& row : item.rows) {
      gen.reset();
      RowScore rs;
      for (size_t i = 0; i + 1 < row.tokens.size(); ++i) {
        const float* logits = gen.feed(row.tokens[i]);
        if (static_cast<int32_t>(i) + 1 < row.score_begin) continue;
        const int target = row.tokens[i + 1];
        double mx = -std::numeric_limits<double>::infinity();
        for (int v = 0; v < s.vocab_size; ++v) mx = std::max(mx, static_cast<double>(logits[v]));
        double z = 0;
        for (int v = 0; v < s.vocab_size; ++v) z += std::exp(logits[v] - mx);
        rs.loss += std::log(z) + mx - logits[target];
        rs.misses += logits[target] >= mx ? 0 : 1;
      }
      out.push_back(rs);
    }
  }
  return out;
}

// A grouped-query Llama (RMSNorm, RoPE, SwiGLU, untied head) over the same bytes.
ms::ModelShape byte_llama() {
  ms::ModelShape s = byte_gpt2();
  s.family = ms::ModelFamily::kLlama;
  s.n_kv_head = 2;
  s.intermediate_size = 72;
  s.rope_theta = 500.0;
  s.norm_eps = 1e-6;
  s.tie_embeddings = false;
  return s;
}

class ScorerFamilies : public ::testing::TestWithParam<const char*> {};

TEST_P(ScorerFamilies, BatchedScorerMatchesTheGeneratorOnEveryRow) {
  TempDir d;
  const ms::ModelShape s = std::string(GetParam()) == "gpt2" ? byte_gpt2() : byte_llama();
  const std::vector<float> params = initial_params(s, 7);
  const auto codec = codec_for(256);
  const EvalTask t = read_eval_task(TaskKind::kHellaswag, d.write("h.jsonl", kThreeItems), *codec, 0, s.seq_len);
  const std::vector<RowScore> want = generator_scores(s, params.data(), t);
  const int T = eval_positions(t, s.seq_len);
  EXPECT_EQ(T, 48);  // the longest row, 43 tokens, needs 42 positions: rounded up to 16
  for (int batch_rows : {1, 4, 5, 12, 16}) {
    EvalScorer scorer(s, params.data(), batch_rows, T);
    const std::vector<RowScore> got = scorer.score(t);
    ASSERT_EQ(got.size(), want.size());
    for (size_t r = 0; r < got.size(); ++r) {
      EXPECT_NEAR(got[r].loss, want[r].loss, 1e-4 * std::abs(want[r].loss)) << "row " << r << " batch " << batch_rows;
      EXPECT_EQ(got[r].misses, want[r].misses) << "row " << r;
    }
    // acc and acc_norm from either: the same picks.
    const TaskScore a = summarize_task(t, got), b = summarize_task(t, want);
    EXPECT_EQ(a.acc, b.acc);
    EXPECT_EQ(a.acc_norm, b.acc_norm);
  }
}

INSTANTIATE_TEST_SUITE_P(TaskEval, ScorerFamilies, ::testing::Values("gpt2", "llama_gqa"));

}  // namespace
}  // namespace ds::rt::train
