// Downstream evaluation (runtime/train/task_eval.h) on a trained model, through real processes:
// a tiny byte-level GPT-2 trained on a repeated text, asked to choose between the text's true
// continuation and three random strings of the same length (HellaSwag's format), scores acc 1.0;
// with the labels moved off the true ending for three items in four it scores 0.25. Every
// training.eval_tasks score in the metrics (at every eval_interval) equals `dstrain eval` on the
// checkpoint of the same step, under dp with ZeRO-3, tp with sequence parallelism, pp and cp.
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/token_file.h"
#include "multiproc/launch/job_process.h"
#include "multiproc/train/train_job.h"

namespace ds {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using test::TempDir;

constexpr int kSteps = 450, kInterval = kSteps / 3;
constexpr int kItems = 24, kLambadaItems = 16, kSeq = 64, kRow = kSeq, kEnding = 16;

// The text the model memorises: 512 bytes, so every training row (64 bytes, at multiples of 64 in
// the repeated file) starts at one of 8 offsets of it, and the items' contexts start there too:
// the model is asked about exactly what it saw, at the positions it saw it.
const std::string& text() {
  static const std::string t = std::string(
      "The river ran past the mill and under the old stone bridge. Every morning the miller opened the gate, "
      "and the water turned the wheel until the sun went down. His daughter kept the geese on the green, "
      "and his son carried flour to the town on a grey horse. In winter the ice held the wheel still, so the "
      "family mended nets and told stories by the fire. When spring came the swallows returned to the barn, "
      "the meadow filled with yellow flowers, and the children ran barefoot along the bank of the river.")
      .substr(0, 512);
  return t;
}

struct Files {
  std::string hellaswag, shuffled, lambada;
};

// Items cut from the text at spaces, each inside one 64-byte row: the context from the row's
// start to the space, then (HellaSwag) the true ending at `label` among three random lowercase
// strings of its length, or (LAMBADA) the next word. `shuffled` moves the label off the true
// ending for three items in four (item i keeps it when i % 4 == 0).
Files write_tasks(const std::string& dir) {
  const std::string& t = text();
  std::mt19937 rng(3);
  std::vector<size_t> spaces;  // a context of at least 8 bytes and an ending that ends in the row
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == ' ' && i % kRow >= 8 && i % kRow + 1 + kEnding <= kRow) spaces.push_back(i);
  }
  std::ofstream h(dir + "/hellaswag.jsonl"), s(dir + "/shuffled.jsonl"), l(dir + "/lambada.jsonl");
  for (int i = 0; i < kItems; ++i) {
    const size_t at = spaces[(static_cast<size_t>(i) * 7919) % spaces.size()], row = at - at % kRow;
    const std::string ctx = t.substr(row, at - row), truth = t.substr(at + 1, kEnding);
    const int label = i % 4;
    json endings = json::array();
    for (int e = 0; e < 4; ++e) {
      std::string r;
      for (int k = 0; k < kEnding; ++k) r.push_back(static_cast<char>('a' + rng() % 26));
      endings.push_back(e == label ? truth : r);
    }
    h << json{{"ctx", ctx}, {"endings", endings}, {"label", label}}.dump() << "\n";
    s << json{{"ctx", ctx}, {"endings", endings}, {"label", (label + i % 4) % 4}}.dump() << "\n";
  }
  // LAMBADA: the next word ends inside the row's 65 bytes (its inputs and their targets).
  std::vector<std::pair<size_t, size_t>> words;
  for (size_t at : spaces) {
    const size_t row = at - at % kRow, end = t.find_first_of(" .,", at + 1);
    if (end != std::string::npos && end - row <= kRow + 1) words.emplace_back(row, end);
  }
  for (int i = 0; i < kLambadaItems; ++i) {
    const auto [row, end] = words[(static_cast<size_t>(i) * 104729) % words.size()];
    l << json{{"text", t.substr(row, end - row)}}.dump() << "\n";
  }
  return {dir + "/hellaswag.jsonl", dir + "/shuffled.jsonl", dir + "/lambada.jsonl"};
}

std::string step_dir(int step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08d", step);
  return name;
}

struct Layout {
  std::string name;
  int dp = 1, tp = 1, pp = 1, cp = 1, zero = 0;
  bool sp = false;
  int world() const { return dp * tp * pp * cp; }
};

class Eval : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::vector<uint16_t> toks;
    for (int rep = 0; rep < 40; ++rep) {
      for (char c : text()) toks.push_back(static_cast<unsigned char>(c));
    }
    rt::data::write_token_file(*dir_ / "train.bin", toks);
    files_ = new Files(write_tasks(dir_->path()));
    base_ = new test::TrainJobResult(run("base", Layout{"dp2", 2}, kSteps, kInterval, {}));
  }
  static void TearDownTestSuite() {
    delete base_;
    delete files_;
    delete dir_;
  }

 protected:
  // Global batch 8 sequences of 64 bytes, micro-batch 4.
  static json config(const std::string& name, const Layout& l, int steps, int interval) {
    return {
        {"train_batch_size", 8},
        {"train_micro_batch_size_per_gpu", 4},
        {"gradient_clipping", 1.0},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}, {"weight_decay", 0.0}}}}},
        {"zero_optimization", {{"stage", l.zero}}},
        {"pipeline", {{"stages", l.pp}}},
        {"tensor_parallel", {{"size", l.tp}, {"sequence_parallel", l.sp}}},
        {"context_parallel", {{"size", l.cp}}},
        {"model",
         {{"type", "gpt2"}, {"n_layer", 2}, {"n_head", 4}, {"n_embd", 64}, {"vocab_size", 256}, {"seq_len", kSeq}}},
        {"data", {{"train", *dir_ / "train.bin"}, {"shuffle", true}}},
        {"training",
         {{"steps", steps},
          {"seed", 5},
          {"log_interval", 1},
          {"eval_interval", interval},
          {"checkpoint_dir", *dir_ / ("ckpt_" + name)},
          {"checkpoint_interval", interval},
          {"eval_tasks",
           {{{"task", "hellaswag"}, {"data", files_->hellaswag}}, {{"task", "lambada"}, {"data", files_->lambada}}}}}},
    };
  }
  static test::TrainJobResult run(const std::string& name, const Layout& l, int steps, int interval,
                                  const std::vector<std::string>& extra) {
    return test::run_train_job(dir_->path(), name, l.world(), config(name, l, steps, interval), extra, 300s);
  }
  // `dstrain eval --json` of a checkpoint.
  static json eval(const std::string& task, const std::string& data, const std::string& checkpoint) {
    test::JobProcess p({DS_DSTRAIN_BIN, "eval", "--task", task, "--data", data, "--checkpoint", checkpoint, "--json"}, "",
                 {"OMP_NUM_THREADS=1"});
    EXPECT_EQ(p.wait(120s), 0) << p.err();
    return json::parse(p.out());
  }
  // The metrics' scores at `step` equal `dstrain eval` on the step's checkpoint: the same picks, so
  // the same accuracies exactly; LAMBADA's perplexity within float rounding (other batch shapes).
  static void expect_metrics_equal_eval(const std::vector<json>& metrics, int step, const std::string& ckpt,
                                        const std::string& what) {
    const json* m = nullptr;
    for (const auto& r : metrics) m = r.at("step") == step ? &r : m;
    ASSERT_NE(m, nullptr) << what << " step " << step;
    const json h = eval("hellaswag", files_->hellaswag, ckpt), l = eval("lambada", files_->lambada, ckpt);
    EXPECT_EQ(h.at("n"), kItems);
    EXPECT_EQ(l.at("n"), kLambadaItems);
    EXPECT_EQ(m->at("eval_hellaswag_acc").get<double>(), h.at("acc").get<double>()) << what << " step " << step;
    EXPECT_EQ(m->at("eval_hellaswag_acc_norm").get<double>(), h.at("acc_norm").get<double>()) << what;
    EXPECT_EQ(m->at("eval_lambada_acc").get<double>(), l.at("acc").get<double>()) << what;
    EXPECT_NEAR(m->at("eval_lambada_ppl").get<double>(), l.at("ppl").get<double>(), 1e-4 * l.at("ppl").get<double>())
        << what;
  }

  static inline TempDir* dir_ = nullptr;
  static inline Files* files_ = nullptr;
  static inline test::TrainJobResult* base_ = nullptr;
};

TEST_F(Eval, ScoresAreInTheMetricsAtEveryEvalInterval) {
  ASSERT_EQ(base_->rc, 0) << base_->err;
  ASSERT_EQ(base_->metrics.size(), static_cast<size_t>(kSteps));
  for (const auto& r : base_->metrics) {
    const bool due = r.at("step").get<int>() % kInterval == 0;
    for (const char* k : {"eval_hellaswag_acc", "eval_hellaswag_acc_norm", "eval_lambada_acc", "eval_lambada_ppl"}) {
      EXPECT_EQ(r.contains(k), due) << "step " << r.at("step") << " " << k;
    }
  }
  EXPECT_NE(base_->out.find("eval at step " + std::to_string(kSteps) + ": eval_hellaswag_acc"), std::string::npos)
      << base_->out;
}

TEST_F(Eval, TrainedModelPicksTheTrueContinuation) {
  ASSERT_EQ(base_->rc, 0) << base_->err;
  const json& last = base_->metrics.back();
  EXPECT_EQ(last.at("eval_hellaswag_acc").get<double>(), 1.0);
  EXPECT_EQ(last.at("eval_hellaswag_acc_norm").get<double>(), 1.0);
  // The memorised text's next word, greedily, for most items (a word's every byte must be the top
  // one: a near tie at one byte misses it); its perplexity near 1.
  EXPECT_GE(last.at("eval_lambada_acc").get<double>(), 0.75);
  EXPECT_LT(last.at("eval_lambada_ppl").get<double>(), 1.5);
  // With the label off the true ending in three items of four: a quarter.
  const json s = eval("hellaswag", files_->shuffled, dir_->path() + "/ckpt_base/" + step_dir(kSteps));
  EXPECT_DOUBLE_EQ(s.at("acc").get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(s.at("acc_norm").get<double>(), 0.25);
}

TEST_F(Eval, MetricsEqualDstrainEvalOnTheSameCheckpoint) {
  ASSERT_EQ(base_->rc, 0) << base_->err;
  for (int step = kInterval; step <= kSteps; step += kInterval) {
    expect_metrics_equal_eval(base_->metrics, step, dir_->path() + "/ckpt_base/" + step_dir(step), "dp2");
  }
}

// Ten more steps from the base's first checkpoint under another layout (a resharding resume), scored ten
// steps later by the run and by `dstrain eval` on its checkpoint.
TEST_F(Eval, EveryLayoutsScoresEqualDstrainEval) {
  ASSERT_EQ(base_->rc, 0) << base_->err;
  const std::string from = dir_->path() + "/ckpt_base/" + step_dir(kInterval);
  for (const Layout& l : {Layout{"dp2_zero3", 2, 1, 1, 1, 3}, Layout{"tp2_sp", 1, 2, 1, 1, 0, true},
                          Layout{"pp2", 1, 1, 2}, Layout{"cp2", 1, 1, 1, 2}}) {
    const auto r = run(l.name, l, kInterval + 10, 10, {"--resume-from", from});
    ASSERT_EQ(r.rc, 0) << l.name << "\n" << r.err;
    ASSERT_EQ(r.metrics.size(), 10u) << l.name;
    expect_metrics_equal_eval(r.metrics, kInterval + 10, dir_->path() + "/ckpt_" + l.name + "/" + step_dir(kInterval + 10),
                              l.name);
  }
}

}  // namespace
}  // namespace ds
