// What a run shows of itself, through real `dstrain train` runs (alone and under `dstrain launch`)
// on a tiny model: the wall-clock breakdown adds up to the step time (one process, ZeRO-2 over two
// ranks, a two-stage pipeline), MFU and TFLOP/s equal the formula for the config's peak.
#include <cmath>
#include <fstream>
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

constexpr int kLayers = 2, kEmbd = 32, kVocab = 64, kSeq = 16, kHeads = 2;

class Monitors : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::vector<uint16_t> toks(20000);
    std::mt19937 rng(5);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>(rng() % kVocab);
    rt::data::write_token_file(dir_->path() + "/train.bin", toks);
    rt::data::write_token_file(dir_->path() + "/val.bin", std::vector<uint16_t>(toks.begin(), toks.begin() + 4000));
  }
  static void TearDownTestSuite() { delete dir_; }

  // Global batch 8 sequences of 16 tokens, micro-batch 2.
  static json config(int steps, int dp = 1) {
    return {
        {"train_batch_size", 8},
        {"train_micro_batch_size_per_gpu", 2},
        {"wall_clock_breakdown", true},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}}}}},
        {"model",
         {{"type", "gpt2"}, {"n_layer", kLayers}, {"n_head", kHeads}, {"n_embd", kEmbd}, {"vocab_size", kVocab},
          {"seq_len", kSeq}}},
        {"data", {{"train", dir_->path() + "/train.bin"}, {"val", dir_->path() + "/val.bin"}}},
        {"training", {{"steps", steps}, {"seed", 3}, {"log_interval", 2}, {"eval_interval", 3}, {"eval_steps", 2}}},
    };
  }

  static test::TrainJobResult run(int nproc, const json& cfg, std::vector<std::string> extra = {}) {
    static int counter = 0;
    return test::run_train_job(dir_->path(), "run" + std::to_string(counter++), nproc, cfg, extra, 120s);
  }

  static void expect_breakdown_sums(const test::TrainJobResult& r, const std::string& what) {
    ASSERT_EQ(r.rc, 0) << what << "\n" << r.err;
    ASSERT_FALSE(r.metrics.empty()) << what;
    const char* phases[] = {"data", "forward", "backward", "reduce", "gather", "stats", "optimizer", "pipeline_wait"};
    for (const auto& m : r.metrics) {
      double sum = 0;
      for (const char* p : phases) {
        const std::string key = std::string("time_") + p + "_ms";
        ASSERT_TRUE(m.contains(key)) << what << ": " << key << " missing in " << m.dump();
        EXPECT_GE(m[key].get<double>(), 0) << what << " " << key;
        sum += m[key].get<double>();
      }
      const double step_ms = m.at("ms_per_step").get<double>();
      EXPECT_NEAR(sum, step_ms, 0.1 * step_ms) << what << " step " << m.at("step");
      EXPECT_GT(m.at("time_forward_ms").get<double>(), 0) << what;
      EXPECT_GT(m.at("time_backward_ms").get<double>(), 0) << what;
    }
    EXPECT_NE(r.out.find("time (ms) | data "), std::string::npos) << what << ": no breakdown line\n" << r.out;
  }

  static TempDir* dir_;
};
TempDir* Monitors::dir_ = nullptr;

TEST_F(Monitors, BreakdownSumsToStepTime) {
  expect_breakdown_sums(run(1, config(6)), "one process, 4 accumulation steps");
}

TEST_F(Monitors, BreakdownSumsToStepTimeWithZero2) {
  json cfg = config(6, 2);
  cfg["zero_optimization"] = {{"stage", 2}, {"overlap_comm", true}, {"reduce_bucket_size", 3000}};
  const auto r = run(2, cfg);
  expect_breakdown_sums(r, "ZeRO-2 over 2 ranks");
  for (const auto& m : r.metrics) {
    EXPECT_GT(m.at("time_reduce_comm_ms").get<double>(), 0) << "the dp group ran reductions";
    EXPECT_GE(m.at("time_gather_comm_ms").get<double>(), 0);
  }
}

TEST_F(Monitors, BreakdownSumsToStepTimeWithPipeline) {
  json cfg = config(6, 1);
  cfg["pipeline"] = {{"stages", 2}};
  const auto r = run(2, cfg);
  expect_breakdown_sums(r, "2 pipeline stages");
  double waits = 0;
  for (const auto& m : r.metrics) waits += m.at("time_pipeline_wait_ms").get<double>();
  EXPECT_GT(waits, 0) << "the first stage waits for the last one's gradients";
}

TEST_F(Monitors, MfuEqualsTheFormula) {
  json cfg = config(4);
  cfg["training"]["peak_tflops"] = 0.25;
  cfg.erase("wall_clock_breakdown");
  const auto r = run(1, cfg);
  ASSERT_EQ(r.rc, 0) << r.err;
  // GPT-2's parameters for this shape by hand (padded vocabulary 128), then 6N + 6LCT.
  const double C = kEmbd, L = kLayers, T = kSeq, Vp = 128;
  const double layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
  const double n = Vp * C + T * C + L * layer + 2 * C;
  const double flops_per_token = 6 * n + 6 * L * C * T;
  const double tokens = 8.0 * kSeq;
  ASSERT_EQ(r.metrics.size(), 4u);
  for (const auto& m : r.metrics) {
    const double seconds = m.at("ms_per_step").get<double>() / 1000;
    const double tflops = flops_per_token * tokens / seconds / 1e12;
    EXPECT_NEAR(m.at("tflops").get<double>(), tflops, 1e-9 * tflops);
    EXPECT_NEAR(m.at("mfu").get<double>(), tflops / 0.25, 1e-9 * tflops);
    EXPECT_FALSE(m.contains("time_forward_ms")) << "no breakdown unless wall_clock_breakdown";
  }
  EXPECT_NE(r.out.find("MFU against 0.25 TFLOP/s per rank (training.peak_tflops)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| MFU "), std::string::npos) << r.out;
}

TEST_F(Monitors, MfuAgainstAMeasuredPeakOnTheCpu) {
  const auto r = run(1, config(2));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("(measured: a fp32 512x768x1536 matmul at start-up"), std::string::npos) << r.out;
  for (const auto& m : r.metrics) EXPECT_GT(m.at("mfu").get<double>(), 0);
}

}  // namespace
}  // namespace ds
