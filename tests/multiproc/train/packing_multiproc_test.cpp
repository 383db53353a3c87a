// Document-aware packing (data.packing "document") under the parallel layouts, through `dstrain
// launch` (real processes, the real store and collectives, OMP_NUM_THREADS=1 per rank), against
// the single process with packing on the same global batch (8 sequences of 16 tokens, micro-batch
// 1), on a corpus whose documents (each begun by token 0) are 3 to 30 tokens long, so most windows
// hold several and some none:
//   Llama (RoPE, grouped-query): tp 2 (the heads split, positions the same on both ranks), tp 2
//   with sequence parallelism, pp 2 (every stage finds the document starts from its own window's
//   tokens), pp 2 with activation checkpointing, dp 2 at ZeRO 1 and 3;
//   GPT-2 (learned positions): tp 2 (wpe added after the vocabulary-parallel embedding), pp 2, dp 2;
//   at bf16 storage: Llama tp 2, pp 2, dp 2 at ZeRO 2, GPT-2 pp 2, against the bf16 single process.
// 10 steps of loss, gradient norm and validation loss within 1e-5 (1e-4 for the norm, as
// layout_multiproc_test.cpp; bf16 1e-3 and 2e-2, as llama_multiproc_test.cpp), and `dstrain plan --json`'s bytes equal to the measured peaks on
// every rank and tag (the document starts are counted as workspace). The single process with
// packing "none" trains another curve on the same data.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
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

constexpr int kSteps = 10;
constexpr int kVocab = 32, kSeq = 16;

struct Layout {
  std::string family = "llama";
  int tp = 1, pp = 1, dp = 1;
  int zero_stage = 0;
  bool checkpointing = false;
  bool sequence_parallel = false;
  bool bf16 = false;
  int world() const { return tp * pp * dp; }
  std::string model() const { return family + (bf16 ? "_bf16" : ""); }
  std::string name() const {
    return family + "_tp" + std::to_string(tp) + "_pp" + std::to_string(pp) + "_dp" + std::to_string(dp) + "_zero" +
           std::to_string(zero_stage) + (checkpointing ? "_recompute" : "") + (sequence_parallel ? "_sp" : "") + (bf16 ? "_bf16" : "");
  }
};
void PrintTo(const Layout& l, std::ostream* os) { *os << l.name(); }

class PackingLayouts : public ::testing::TestWithParam<Layout> {
 public:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::vector<uint16_t> toks(12000);
    std::mt19937 rng(11);
    size_t next_doc = 0;
    for (size_t i = 0; i < toks.size(); ++i) {
      if (i == next_doc) {
        toks[i] = 0;  // the document token
        next_doc = i + 3 + rng() % 28;
        continue;
      }
      toks[i] = static_cast<uint16_t>(1 + (i * 7 + i / 5) % 30);
      if (rng() % 16 == 0) toks[i] = static_cast<uint16_t>(1 + rng() % (kVocab - 1));
    }
    rt::data::write_token_file(*dir_ / "train.bin", toks);
    rt::data::write_token_file(*dir_ / "val.bin", std::vector<uint16_t>(toks.begin(), toks.begin() + 3000));
    baselines_ = new std::map<std::string, std::vector<json>>();
  }
  static void TearDownTestSuite() {
    delete baselines_;
    delete dir_;
  }

 protected:
  static json config(const Layout& l, const std::string& packing = "document") {
    json model = {{"type", l.family}, {"n_layer", 4}, {"n_head", 4}, {"n_embd", 32}, {"vocab_size", kVocab},
                  {"seq_len", kSeq}};
    if (l.family == "llama") {
      model["n_kv_head"] = 2;
      model["intermediate_size"] = 48;
    }
    json data = {{"train", *dir_ / "train.bin"}, {"val", *dir_ / "val.bin"}, {"packing", packing}};
    if (packing == "document") data["document_token"] = 0;
    json c = {
        {"train_batch_size", 8},
        {"train_micro_batch_size_per_gpu", 1},
        {"gradient_clipping", 0.5},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}, {"weight_decay", 0.1}}}}},
        {"zero_optimization", {{"stage", l.zero_stage}, {"reduce_bucket_size", 3000}, {"allgather_bucket_size", 2000}}},
        {"pipeline", {{"stages", l.pp}}},
        {"tensor_parallel", {{"size", l.tp}, {"sequence_parallel", l.sequence_parallel}}},
        {"activation_checkpointing", {{"enabled", l.checkpointing}}},
        {"model", model},
        {"data", data},
        {"training", {{"steps", kSteps}, {"seed", 7}, {"log_interval", 5}, {"eval_interval", 5},
                      {"eval_steps", 8 / l.dp}}},
    };
    if (l.bf16) c["bf16"] = {{"enabled", true}};
    return c;
  }

  static test::TrainJobResult run(const Layout& l, const json& cfg, std::vector<std::string> extra) {
    static int counter = 0;
    return test::run_train_job(dir_->path(), "run" + std::to_string(counter++), l.world(), cfg, extra, 240s);
  }

  // The single process with packing, once per family and precision; its peaks are its plan's.
  static const std::vector<json>& baseline(const Layout& l) {
    auto it = baselines_->find(l.model());
    if (it != baselines_->end()) return it->second;
    Layout one;
    one.family = l.family;
    one.bf16 = l.bf16;
    auto r = run(one, config(one), {});
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(r.metrics.size(), static_cast<size_t>(kSteps)) << r.err;
    for (const char* tag : {"params", "grads", "optimizer", "activations", "comm", "workspace", "total"}) {
      if (r.metrics.empty()) break;
      EXPECT_EQ(r.metrics.back().at(std::string("peak_bytes_") + tag).get<int64_t>(),
                r.metrics[0].at(std::string("planned_bytes_") + tag).get<int64_t>())
          << "single process " << l.family << " " << tag << ": measured (left) against the plan (right)";
    }
    // Packing changes the model's inputs: "none" on the same data is another curve.
    auto none = run(one, config(one, "none"), {});
    EXPECT_EQ(none.rc, 0) << none.err;
    if (!none.metrics.empty() && !r.metrics.empty()) {
      EXPECT_GT(std::abs(none.metrics[0].at("loss").get<double>() - r.metrics[0].at("loss").get<double>()), 1e-4);
    }
    return baselines_->emplace(l.model(), r.metrics).first->second;
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::map<std::string, std::vector<json>>* baselines_ = nullptr;
};

TEST_P(PackingLayouts, TenStepsMatchTheSingleProcessAndThePlan) {
  const Layout l = GetParam();
  static int plan_counter = 0;
  const json cfg = config(l);
  auto r = run(l, cfg, {"--metrics-all-ranks"});
  ASSERT_EQ(r.rc, 0) << l.name() << "\n" << r.err;
  // bf16: the tolerances of llama_multiproc_test.cpp (a last-bit difference of an fp32 sum can flip
  // a bf16 rounding), against the bf16 single process.
  test::expect_curve_matches(
      baseline(l), r.metrics, 1,
      [&](const std::string& key) {
        if (l.bf16) return key == "grad_norm" ? 2e-2 : 1e-3;
        return key == "grad_norm" ? 1e-4 : 1e-5;
      },
      l.name());
  ASSERT_FALSE(r.metrics.empty());
  const std::string cfg_path = *dir_ / ("plan" + std::to_string(plan_counter++) + ".json");
  std::ofstream(cfg_path) << cfg.dump(2);
  const json ranks = test::plan_ranks(cfg_path, l.world());
  const int exact = test::expect_plan_equals_peaks(ranks, r.metrics.back(), l.world(), l.name());
  std::cout << l.name() << ": plan == measured peak on " << exact << " of " << 8 * l.world() << " (rank, tag) pairs\n";
}

Layout gpt2(Layout l) {
  l.family = "gpt2";
  return l;
}
Layout bf16(Layout l) {
  l.bf16 = true;
  return l;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PackingLayouts,
    ::testing::Values(Layout{"llama", 2, 1, 1}, Layout{"llama", 2, 1, 1, 0, false, true}, Layout{"llama", 1, 2, 1},
                      Layout{"llama", 1, 2, 1, 0, true}, Layout{"llama", 1, 1, 2, 1}, Layout{"llama", 1, 1, 2, 3},
                      gpt2(Layout{"", 2, 1, 1}), gpt2(Layout{"", 1, 2, 1}), gpt2(Layout{"", 1, 1, 2, 1}),
                      bf16(Layout{"llama", 2, 1, 1}), bf16(Layout{"llama", 1, 2, 1}),
                      bf16(Layout{"llama", 1, 1, 2, 2}), bf16(gpt2(Layout{"", 1, 2, 1}))),
    [](const ::testing::TestParamInfo<Layout>& i) { return i.param.name(); });

}  // namespace
}  // namespace ds
