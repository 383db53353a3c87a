// DeepSpeed's optimizers beside Adam under the real launcher (train/optimizer_state.h):
//   - Lamb, Adagrad and Lion are exact at dp 2 (ZeRO 1: the partitions cut tensors; LAMB's trust
//     ratio is per whole tensor) and LAMB at tp 2 x dp 2 (ZeRO 2), against one process, 20 steps;
//   - Adagrad's one-moment checkpoint resumes at another dp; 0/1 Adam's scalar state (its variance
//     and local-step schedules) resumes exactly;
//   - 1-bit Adam on 2 and 4 ranks trains the README's tiny GPT-2 on real text to within 3% of
//     Adam's loss over 200 steps, sending at most 1/8 of Adam's bytes per step after its warm-up.
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
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

constexpr int kSteps = 20;

class OptimizerMultiproc : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::vector<uint16_t> toks = test::patterned_tokens(20000, 32);
    rt::data::write_token_file(*dir_ / "train.bin", toks);
  }
  static void TearDownTestSuite() { delete dir_; }

 protected:
  // Global batch 8 sequences of 16 tokens (micro-batch 1, G = 8 / dp), a 4-layer GPT-2 of width 32.
  static json config(const json& optimizer, int dp, int tp = 1, int stage = 0) {
    return {
        {"train_batch_size", 8},
        {"train_micro_batch_size_per_gpu", 1},
        {"gradient_clipping", 0.5},
        {"optimizer", optimizer},
        {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 3000}, {"allgather_bucket_size", 2000}}},
        {"tensor_parallel", {{"size", tp}}},
        {"model",
         {{"type", "gpt2"}, {"n_layer", 4}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 32}, {"seq_len", 16}}},
        {"data", {{"train", *dir_ / "train.bin"}}},
        {"training", {{"steps", kSteps}, {"seed", 7}, {"log_interval", 1}}},
    };
  }
  static test::TrainJobResult run(int world, const json& cfg, std::vector<std::string> extra = {}) {
    static int counter = 0;
    return test::run_train_job(dir_->path(), "opt" + std::to_string(counter++), world, cfg, extra, 300s);
  }
  static void expect_same_curve(const std::vector<json>& base, const std::vector<json>& m, int first_step,
                                double loss_tol, const std::string& what) {
    test::expect_curve_matches(base, m, first_step,
                               [&](const std::string& key) { return key == "grad_norm" ? 10 * loss_tol : loss_tol; },
                               what);
  }
  // `first` on `w1` ranks until its checkpoint at step 10 (in `ckpt`), then `rest` on `w2` ranks
  // resumed from it: the resumed run's result.
  static test::TrainJobResult stop_at_10_and_resume(json first, int w1, json rest, int w2, const std::string& ckpt) {
    first["training"]["checkpoint_dir"] = ckpt;
    first["training"]["checkpoint_interval"] = 10;
    const auto a = run(w1, first, {"--max-steps", "10"});
    EXPECT_EQ(a.rc, 0) << a.err;
    rest["training"]["checkpoint_dir"] = ckpt;
    return run(w2, rest, {"--resume"});
  }
  static inline TempDir* dir_ = nullptr;
};

json optimizer(const std::string& type, double lr) {
  return {{"type", type}, {"params", {{"lr", lr}, {"weight_decay", 0.1}}}};
}

TEST_F(OptimizerMultiproc, LambAdagradAndLionAreExactAtDataParallel2) {
  for (const auto& [type, lr] : std::vector<std::pair<std::string, double>>{{"Lamb", 0.01}, {"Adagrad", 0.01},
                                                                             {"Lion", 0.001}}) {
    const auto one = run(1, config(optimizer(type, lr), 1));
    ASSERT_EQ(one.rc, 0) << type << "\n" << one.err;
    ASSERT_EQ(one.metrics.size(), static_cast<size_t>(kSteps));
    const auto two = run(2, config(optimizer(type, lr), 2, 1, 1));
    ASSERT_EQ(two.rc, 0) << type << "\n" << two.err;
    expect_same_curve(one.metrics, two.metrics, 1, 1e-5, type + " dp2 zero1");
    if (type == "Lamb") {  // the ratio's norms summed over tp too (the replicated tensors counted once)
      const auto four = run(4, config(optimizer(type, lr), 2, 2, 2));
      ASSERT_EQ(four.rc, 0) << four.err;
      expect_same_curve(one.metrics, four.metrics, 1, 1e-5, "Lamb tp2 dp2 zero2");
    }
  }
}

TEST_F(OptimizerMultiproc, OneMomentAndScalarStatesResume) {
  // Adagrad: its sum of squares alone in the shards, re-partitioned from dp 2 to dp 1.
  const json ada = optimizer("Adagrad", 0.01);
  const auto whole = run(1, config(ada, 1));
  ASSERT_EQ(whole.rc, 0) << whole.err;
  const std::string ckpt = *dir_ / "adagrad_ckpt";
  const auto resumed = stop_at_10_and_resume(config(ada, 2, 1, 1), 2, config(ada, 1), 1, ckpt);
  ASSERT_EQ(resumed.rc, 0) << resumed.err;
  expect_same_curve(whole.metrics, resumed.metrics, 11, 1e-5, "Adagrad resumed dp2 -> dp1");

  // 0/1 Adam on one rank: past its variance freeze and through local steps; resumed at step 10 it
  // continues bit for bit (its schedules come back from the manifest).
  json zo = {{"type", "ZeroOneAdam"},
             {"params", {{"lr", 0.003}, {"var_freeze_step", 6}, {"var_update_scaler", 2}, {"local_step_scaler", 3},
                         {"local_step_clipper", 4}}}};
  const auto zo_whole = run(1, config(zo, 1));
  ASSERT_EQ(zo_whole.rc, 0) << zo_whole.err;
  const auto zo_resumed = stop_at_10_and_resume(config(zo, 1), 1, config(zo, 1), 1, *dir_ / "zo_ckpt");
  ASSERT_EQ(zo_resumed.metrics.size(), 10u);
  ASSERT_EQ(zo_resumed.rc, 0) << zo_resumed.err;
  for (size_t i = 0; i < zo_resumed.metrics.size(); ++i) {
    EXPECT_EQ(zo_resumed.metrics[i].at("loss"), zo_whole.metrics[10 + i].at("loss")) << "step " << 11 + i;
  }
  // A checkpoint of another optimizer is refused by name.
  json other = config(optimizer("Lion", 0.001), 1);
  other["training"]["checkpoint_dir"] = ckpt;
  const auto refused = run(1, other, {"--resume"});
  EXPECT_NE(refused.rc, 0);
  EXPECT_NE(refused.err.find("no 'exp_avg' for optimizer Lion"), std::string::npos) << refused.err;
}

std::string kjv(const char* file) { return std::string(DS_SOURCE_DIR) + "/data/kjv/" + file; }

TEST_F(OptimizerMultiproc, OneBitAdamTrainsLikeAdamWithAFractionOfTheBytes) {
  ASSERT_TRUE(std::filesystem::exists(kjv("train.bin"))) << "data/kjv/train.bin is missing: run scripts/prepare-kjv.sh";
  // The README's byte-level GPT-2 at 2 layers: a warm-up schedule across the freeze, as DeepSpeed's
  // 1-bit Adam tutorials use (its warm-up Adam has no bias correction).
  auto cfg = [&](const json& opt) {
    return json{{"train_batch_size", 16},
                {"train_micro_batch_size_per_gpu", 4},
                {"gradient_clipping", 1.0},
                {"optimizer", opt},
                {"scheduler",
                 {{"type", "WarmupLR"},
                  {"params", {{"warmup_num_steps", 50}, {"warmup_type", "linear"}, {"warmup_max_lr", 0.003}}}}},
                {"zero_optimization", {{"stage", 0}}},
                {"model",
                 {{"type", "gpt2"}, {"n_layer", 2}, {"n_head", 4}, {"n_embd", 64}, {"vocab_size", 256}, {"seq_len", 64}}},
                {"data", {{"train", kjv("train.bin")}}},
                {"training", {{"steps", 200}, {"seed", 1}, {"log_interval", 1}}}};
  };
  const json adam = {{"type", "Adam"}, {"params", {{"lr", 0.003}, {"betas", {0.9, 0.99}}, {"weight_decay", 0.0}}}};
  const json onebit = {{"type", "OneBitAdam"},
                       {"params", {{"lr", 0.003}, {"betas", {0.9, 0.99}}, {"freeze_step", 60}}}};
  for (int world : {2, 4}) {
    const auto a = run(world, cfg(adam));
    ASSERT_EQ(a.rc, 0) << a.err;
    const auto b = run(world, cfg(onebit));
    ASSERT_EQ(b.rc, 0) << b.err;
    ASSERT_EQ(a.metrics.size(), 200u);
    ASSERT_EQ(b.metrics.size(), 200u);
    auto tail_loss = [](const std::vector<json>& m) {
      double s = 0;
      for (size_t i = 190; i < 200; ++i) s += m[i].at("loss").get<double>();
      return s / 10;
    };
    const double la = tail_loss(a.metrics), lb = tail_loss(b.metrics);
    EXPECT_LE(std::abs(lb - la), 0.03 * la) << world << " ranks: 1-bit Adam " << lb << " vs Adam " << la;
    const double bytes_adam = a.metrics[100].at("comm_bytes_sent").get<double>();
    for (size_t i = 60; i < 200; ++i) {
      EXPECT_LE(b.metrics[i].at("comm_bytes_sent").get<double>(), bytes_adam / 8) << world << " ranks, step " << i + 1;
    }
    std::cout << fmt::format("{} ranks: loss (steps 191-200) Adam {:.4f}, 1-bit Adam {:.4f} ({:+.2f}%); bytes/step "
                             "Adam {:.0f}, 1-bit after warm-up {:.0f} (1/{:.1f})\n",
                             world, la, lb, 100 * (lb - la) / la, bytes_adam,
                             b.metrics[150].at("comm_bytes_sent").get<double>(),
                             bytes_adam / b.metrics[150].at("comm_bytes_sent").get<double>());
  }
}

}  // namespace
}  // namespace ds
