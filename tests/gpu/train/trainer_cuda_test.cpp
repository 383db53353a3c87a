// The trainer on one GPU: training.cuda_graph (train/step_graph.h) trains as the eager step does,
// at fp32, bf16 and fp16 (whose dynamic loss scale makes the graph capture again), for GPT-2 and
// a Llama with grouped-query attention, with gradient accumulation.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "config/job_config.h"
#include "gpu/cuda_test_util.h"
#include "data/token_file.h"
#include "train/trainer.h"

namespace ds::rt::train {
namespace {

namespace fs = std::filesystem;

class TrainerCuda : public ds::test::CudaTest {
 protected:
  void SetUp() override {
    ds::test::CudaTest::SetUp();
    if (IsSkipped()) return;
    dir_ = fs::temp_directory_path() / ("ds_trainer_cuda_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::mt19937 rng(7);
    std::vector<uint16_t> toks(40000);
    for (size_t i = 0; i < toks.size(); ++i) {
      toks[i] = static_cast<uint16_t>((i * 7 + (i / 5)) % 61);
      if (rng() % 50 == 0) toks[i] = static_cast<uint16_t>(rng() % 64);
    }
    data::write_token_file((dir_ / "train.bin").string(), toks);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  nlohmann::json base_config(const std::string& family) const {
    nlohmann::json model = {{"type", family}, {"n_layer", 2},     {"n_head", 4},
                            {"n_embd", 64},   {"vocab_size", 64}, {"seq_len", 32}};
    if (family == "llama") {
      model["num_key_value_heads"] = 2;
      model["intermediate_size"] = 128;
    }
    return {
        {"train_micro_batch_size_per_gpu", 4},
        {"gradient_accumulation_steps", 3},
        {"gradient_clipping", 1.0},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}, {"weight_decay", 0.1}}}}},
        {"model", model},
        {"data", {{"train", (dir_ / "train.bin").string()}}},
        {"training", {{"steps", 8}, {"seed", 5}, {"log_interval", 1}, {"device", "cuda"}}},
    };
  }

  struct Row {
    double loss = 0, grad_norm = 0;
    bool skipped = false;
  };
  std::vector<Row> train(nlohmann::json j, bool graph, const std::string& name) const {
    j["training"]["cuda_graph"] = graph;
    const std::string path = (dir_ / (name + ".json")).string();
    std::ofstream(path) << j.dump(2);
    TrainOptions o;
    o.metrics_path = (dir_ / (name + (graph ? "_graph" : "_eager") + ".jsonl")).string();
    Trainer(config::load_job_config(path, 1), o).run();
    std::vector<Row> rows;
    std::ifstream in(o.metrics_path);
    for (std::string line; std::getline(in, line);) {
      const auto r = nlohmann::json::parse(line);
      if (!r.contains("loss")) continue;
      // A skipped step's norm is null (an overflow): -1 here.
      const double norm = r["grad_norm"].is_number() ? r["grad_norm"].get<double>() : -1.0;
      rows.push_back({r["loss"].get<double>(), norm, r.value("skipped", false)});
    }
    return rows;
  }

  // The graph replays the eager step's kernels; only the embedding backward's atomic additions
  // may sum in another order, so the two runs agree to float rounding, step by step.
  void expect_same_training(const nlohmann::json& j, const std::string& name) const {
    const auto eager = train(j, false, name), graphed = train(j, true, name);
    ASSERT_EQ(eager.size(), 8u) << name;
    ASSERT_EQ(graphed.size(), eager.size()) << name;
    for (size_t i = 0; i < eager.size(); ++i) {
      SCOPED_TRACE(name + " step " + std::to_string(i + 1));
      EXPECT_EQ(graphed[i].skipped, eager[i].skipped);
      EXPECT_NEAR(graphed[i].loss, eager[i].loss, 1e-4 * std::abs(eager[i].loss) + 1e-6);
      EXPECT_NEAR(graphed[i].grad_norm, eager[i].grad_norm, 1e-3 * std::abs(eager[i].grad_norm) + 1e-6);
    }
    EXPECT_LT(graphed.back().loss, graphed.front().loss) << name;
  }

  fs::path dir_;
};

TEST_F(TrainerCuda, TheCudaGraphTrainsAsTheEagerStepFp32) {
  expect_same_training(base_config("gpt2"), "gpt2_fp32");
  expect_same_training(base_config("llama"), "llama_fp32");
}

TEST_F(TrainerCuda, TheCudaGraphTrainsAsTheEagerStepBf16) {
  auto j = base_config("gpt2");
  j["bf16"] = {{"enabled", true}};
  expect_same_training(j, "gpt2_bf16");
  auto l = base_config("llama");
  l["bf16"] = {{"enabled", true}};
  expect_same_training(l, "llama_bf16");
}

// fp16's dynamic loss scale changes within the run (from 2^20: halved on an overflow, doubled after
// two clean steps): each new scale is a new capture.
TEST_F(TrainerCuda, TheCudaGraphCapturesAgainWhenTheLossScaleChanges) {
  auto j = base_config("gpt2");
  j["fp16"] = {{"enabled", true}, {"initial_scale_power", 20}, {"loss_scale_window", 2}};
  expect_same_training(j, "gpt2_fp16");
}

// ZeRO at one rank keeps its buffers in the graph (stage 2: the gradient partition and buckets).
TEST_F(TrainerCuda, TheCudaGraphHoldsZeroStage2AtOneRank) {
  auto j = base_config("gpt2");
  j["zero_optimization"] = {{"stage", 2}};
  expect_same_training(j, "gpt2_zero2");
}

}  // namespace
}  // namespace ds::rt::train
