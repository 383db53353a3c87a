// `dstrain plan` through the real binary: exit codes, text and --json shapes.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <fstream>

#include "support/run_command.h"

namespace ds {
namespace {

using test::dstrain;
using test::run_command;
using test::source_path;

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// The hand-computed tiny model of memory_model_test.cpp as a job config in a temp file.
class TinyConfig {
 public:
  explicit TinyConfig(const std::string& extra = "") {
    char tmpl[] = "/tmp/ds_plan_cfg_XXXXXX";
    int fd = mkstemp(tmpl);
    if (fd >= 0) close(fd);
    path_ = tmpl;
    std::ofstream(path_) << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "zero_optimization": {"stage": 1}, )" << extra << R"(
      "model": {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 8, "vocab_size": 16,
                "padded_vocab_size": 16, "seq_len": 4}})";
  }
  ~TinyConfig() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(PlanCli, PaperGenericText) {
  auto r = run_command(dstrain() + " plan --params 7.5e9 --world-size 64 --zero-stage 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "31.41 GB")) << r.out;
  EXPECT_TRUE(contains(r.out, "0: 120.00 GB")) << r.out;
  EXPECT_TRUE(contains(r.out, "3: 1.88 GB")) << r.out;
}

TEST(PlanCli, PaperGenericJson) {
  auto r = run_command(dstrain() + " plan --params 7.5e9 --world-size 64 --zero-stage 3 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["per_gpu"]["total"].get<int64_t>(), 1875000000);
  EXPECT_EQ(j["per_gpu"]["params"].get<int64_t>(), 234375000);
}

TEST(PlanCli, DeepSpeedGenericMatchesItsPrintout) {
  auto r = run_command(dstrain() +
                       " plan --params 2851e6 --largest-layer-params 32e6 --gpus-per-node 8 "
                       "--num-nodes 1 --zero-stage 3 --formula deepspeed");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "   6.09GB | offload_param=none, offload_optimizer=none, zero_init=1"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "SW: Model with 2851M total params, 32M largest layer params.")) << r.out;

  r = run_command(dstrain() + " plan --params 2851e6 --world-size 8 --zero-stage 2 "
                              "--formula deepspeed --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["estimate"]["per_gpu"].get<int64_t>(), 12116750000);
  EXPECT_EQ(j["all_options"].size(), 2u);

  r = run_command(dstrain() + " plan --params 2851e6 --largest-layer-params 32e6 --world-size 8 "
                              "--zero-stage 3 --formula deepspeed --offload-optimizer cpu "
                              "--offload-param cpu --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["estimate"]["per_gpu"].get<int64_t>(), 128000000);
}

TEST(PlanCli, BadGenericInputsExitTwoAndNameTheRule) {
  auto r = run_command(dstrain() + " plan --params 7.5e9 --world-size 64 --zero-stage 5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "--zero-stage must be 0, 1, 2 or 3")) << r.err;
  r = run_command(dstrain() + " plan --params 7.5e9 --world-size 64 --zero-stage 1 --formula deepspeed");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "stages 2 and 3")) << r.err;
  r = run_command(dstrain() + " plan --params lots --world-size 64 --zero-stage 1");
  EXPECT_EQ(r.exit_code, 2);
  r = run_command(dstrain() + " plan --params 1e9 --world-size 8 --zero-stage 2 --formula deepspeed "
                              "--offload-param cpu --offload-optimizer cpu");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "ZeRO stage 3")) << r.err;
  r = run_command(dstrain() + " plan");
  EXPECT_EQ(r.exit_code, 2);
}

TEST(PlanCli, PaperActivationView) {
  auto r = run_command(dstrain() + " plan --formula paper --hidden 12288 --heads 96 --seq-len 2048 "
                                   "--tp 8 --layers 96 --pp 8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rows"].size(), 6u);
  EXPECT_EQ(j["rows"][1]["per_layer"].get<int64_t>(), 578813952);
  // first stage: 12 layers x 8 micro-batches in flight = 96 layers' worth
  EXPECT_EQ(j["rows"][1]["first_stage"].get<int64_t>(), 578813952LL * 96);
  r = run_command(dstrain() + " plan --formula paper --hidden 12288 --heads 96 --seq-len 2048 --tp 5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "must divide")) << r.err;
}

TEST(PlanCli, ModelModeJsonHasEveryRankWithIntegerBytes) {
  TinyConfig cfg;
  auto r = run_command(dstrain() + " plan --config " + cfg.path() + " --world-size 2 --gpu-mem 1MiB --json");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["ranks"].size(), 2u);
  for (const auto& rank : j["ranks"]) {
    for (const char* k : {"rank", "stage", "params", "grads", "optimizer", "activations", "buffers", "total"}) {
      ASSERT_TRUE(rank.contains(k)) << k;
      EXPECT_TRUE(rank[k].is_number_integer()) << k;
    }
  }
  const auto& r1 = j["ranks"][1];
  EXPECT_EQ(r1["rank"], 1);
  EXPECT_EQ(r1["params"], 7680);
  EXPECT_EQ(r1["optimizer"], 7680);
  EXPECT_EQ(r1["activations"], 9184);
  EXPECT_EQ(r1["buffers"], 3264);
  EXPECT_EQ(r1["total"], 35488);
  EXPECT_EQ(j["verdict"]["fits"], true);
  EXPECT_EQ(j["verdict"]["margin"], 1048576 - 35488);
}

TEST(PlanCli, ModelModeTextAndVerdict) {
  TinyConfig cfg;
  auto r = run_command(dstrain() + " plan --config " + cfg.path() + " --world-size 2 --gpu-mem 1MiB");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "0-1")) << r.out;
  EXPECT_TRUE(contains(r.out, "verdict: fits")) << r.out;
  EXPECT_TRUE(contains(r.out, "34.66 KiB")) << r.out;  // 35488 bytes
  // 30000 bytes: does not fit, exit 1, and says what would.
  r = run_command(dstrain() + " plan --config " + cfg.path() + " --world-size 2 --gpu-mem 30000");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.out, "does NOT fit")) << r.out;
  EXPECT_TRUE(contains(r.out, "each of these alone would fit")) << r.out;
}

TEST(PlanCli, ModelModePipelineRanksDiffer) {
  TinyConfig cfg(R"("pipeline": {"stages": 2}, )");
  auto r = run_command(dstrain() + " plan --config " + cfg.path() + " --world-size 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["ranks"].size(), 4u);
  EXPECT_EQ(j["ranks"][0]["stage"], 0);
  EXPECT_EQ(j["ranks"][3]["stage"], 1);
  // stage 0 holds 1032 elements, stage 1 1016: ZeRO-1 partitions of 528 + 504 and 512 + 504
  // make every rank distinct
  EXPECT_EQ(j["distinct"].size(), 4u);
  EXPECT_EQ(j["ranks"][0]["optimizer"], 528 * 8);
  EXPECT_EQ(j["ranks"][1]["optimizer"], 504 * 8);
}

TEST(PlanCli, ImpossibleLayoutsExitTwoNamingTheRule) {
  TinyConfig cfg(R"("tensor_parallel": {"size": 4}, )");
  auto r = run_command(dstrain() + " plan --config " + cfg.path() + " --world-size 4");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "n_head")) << r.err;
  TinyConfig ok;
  r = run_command(dstrain() + " plan --config " + ok.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "world size")) << r.err;
  r = run_command(dstrain() + " plan --config " + ok.path() + " --world-size 2 --recommend");
  // without --gpu-mem and without GPUs: exit 2 (on a GPU machine the GPUs' memory is used)
  if (r.exit_code != 0) {
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_TRUE(contains(r.err, "device memory")) << r.err;
  }
}

TEST(PlanCli, RecommendListsOnlyLayoutsThatFit) {
  TinyConfig cfg;
  auto r = run_command(dstrain() + " plan --config " + cfg.path() +
                       " --world-size 4 --gpu-mem 40000 --recommend --top 100 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_GT(j["recommendations"].size(), 0u);
  EXPECT_GT(j["rejected_memory"].get<int>(), 0);
  for (const auto& e : j["recommendations"]) {
    EXPECT_LE(e["peak_bytes"].get<int64_t>(), 40000);
    EXPECT_NE(e["layout"]["tp"], 4);  // 4 does not divide 2 heads
    EXPECT_FALSE(e["reason"].get<std::string>().empty());
  }
  r = run_command(dstrain() + " plan --config " + cfg.path() + " --world-size 4 --gpu-mem 40000 --recommend --top 500");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "tp 1 x pp 1 x dp 4")) << r.out;
  r = run_command(dstrain() + " plan --config " + cfg.path() + " --world-size 4 --gpu-mem 1000 --recommend");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.out, "no layout fits")) << r.out;
}

TEST(PlanCli, ConfigPaperView) {
  TinyConfig cfg;
  auto r = run_command(dstrain() + " plan --config " + cfg.path() + " --world-size 2 --formula paper --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  // s=4, b=2, h=8, a=2: sbh(34 + 5as/h) = 64 x (34 + 5) = 2496
  EXPECT_EQ(j["rows"][0]["per_layer"], 2496);
}

TEST(PlanCli, RecommendSaysWhetherItIsCalibrated) {
  TinyConfig cfg;
  const std::string base = dstrain() + " plan --config " + cfg.path() + " --world-size 4 --gpu-mem 40000 --recommend";
  auto r = run_command(base + " --tokens 1e6");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "built-in constants, NOT calibrated")) << r.out;
  EXPECT_TRUE(contains(r.out, "to train")) << r.out;
  EXPECT_TRUE(contains(r.out, "runner-up (#2) against the pick:")) << r.out;
  EXPECT_TRUE(contains(r.out, "bound by ")) << r.out;
  r = run_command(base + " --json --tokens 1e6");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["calibration"]["measured"], false);
  EXPECT_EQ(j["tokens"], 1000000);
  const auto& first = j["recommendations"][0];
  EXPECT_TRUE(first["measured_ms"].is_null());
  EXPECT_NEAR(first["predicted_ms"].get<double>(), 1e3 * first["step_seconds"].get<double>(), 1e-9);
  EXPECT_GT(first["time_to_train_s"].get<double>(), 0);
  EXPECT_TRUE(first.contains("runner_up_trades"));
}

TEST(PlanCli, CalibrationFileErrorsNameThePath) {
  TinyConfig cfg;
  const std::string base = dstrain() + " plan --config " + cfg.path() + " --world-size 4 --gpu-mem 40000 --recommend";
  auto r = run_command(base + " --calibration /nonexistent/calib.json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "/nonexistent/calib.json")) << r.err;
  char tmpl[] = "/tmp/ds_calib_XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd >= 0) close(fd);
  std::ofstream(tmpl) << R"({"format": "dstrain-calibration", "version": 1, "host": 7})";
  r = run_command(base + " --calibration " + tmpl);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, std::string(tmpl) + ":1: $.host: expected a string, got 7")) << r.err;
  unlink(tmpl);
  r = run_command(dstrain() + " plan --config " + cfg.path() + " --world-size 4 --calibration x.json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "--calibration is read by --recommend")) << r.err;
  r = run_command(dstrain() + " plan --config " + cfg.path() + " --world-size 4 --measure");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "add --recommend")) << r.err;
  r = run_command(dstrain() + " plan --calibrate --config " + cfg.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "-o FILE")) << r.err;
}

}  // namespace
}  // namespace ds
