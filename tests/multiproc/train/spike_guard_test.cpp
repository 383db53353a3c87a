// training.skip_spikes under the real launcher (train/spike_guard.h): a step of garbage tokens
// (uniform random, on a corpus the model has learned to predict) injected at a known step is
// skipped at dp 2, logged and counted, and the run ends on the loss of the run without it within
// 1e-3; the clean run skips nothing; a run resumed after the spike judges as the uninterrupted one.
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

constexpr int kSteps = 150, kSpikeStep = 40, kT = 16, kWindowsPerStep = 8;

json config(const std::string& train, const std::string& ckpt = "") {
  json training = {{"steps", kSteps}, {"seed", 7}, {"log_interval", 1},
                   {"skip_spikes", {{"threshold", 6.0}, {"window", 16}}}};
  if (!ckpt.empty()) {
    training["checkpoint_dir"] = ckpt;
    training["checkpoint_interval"] = 45;
  }
  return {{"train_batch_size", kWindowsPerStep},
          {"train_micro_batch_size_per_gpu", 1},
          {"gradient_clipping", 1.0},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}, {"weight_decay", 0.0}}}}},
          {"scheduler", {{"type", "WarmupDecayLR"}, {"params", {{"warmup_num_steps", 10}, {"warmup_type", "linear"}}}}},
          {"model", {{"type", "gpt2"}, {"n_layer", 2}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 32}, {"seq_len", kT}}},
          {"data", {{"train", train}}},
          {"training", training}};
}

TEST(SpikeGuard, AGarbageStepIsSkippedAndTheRunEndsOnTheCleanLoss) {
  TempDir dir;
  auto toks = test::patterned_tokens(20000, 32);
  rt::data::write_token_file(dir / "clean.bin", toks);
  // Step s reads windows (s-1)*8 .. (s-1)*8+7 of B*T+1 tokens from token (s-1)*8*T on.
  std::mt19937 rng(11);
  const size_t from = static_cast<size_t>(kSpikeStep - 1) * kWindowsPerStep * kT;
  for (size_t i = from; i <= from + kWindowsPerStep * kT; ++i) toks[i] = static_cast<uint16_t>(rng() % 32);
  rt::data::write_token_file(dir / "spiked.bin", toks);

  const auto clean = test::run_train_job(dir.path(), "clean", 2, config(dir / "clean.bin"), {}, 240s);
  ASSERT_EQ(clean.rc, 0) << clean.err;
  const auto spiked = test::run_train_job(dir.path(), "spiked", 2, config(dir / "spiked.bin"), {}, 240s);
  ASSERT_EQ(spiked.rc, 0) << spiked.err;
  ASSERT_EQ(clean.metrics.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(spiked.metrics.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(clean.metrics.back().at("skipped_spikes").get<double>(), 0) << "the clean run skipped a step";
  for (int s = 1; s <= kSteps; ++s) {
    const json& m = spiked.metrics[static_cast<size_t>(s - 1)];
    EXPECT_EQ(m.at("skipped").get<bool>(), s == kSpikeStep) << "step " << s;
    EXPECT_EQ(m.at("skipped_spikes").get<double>(), s >= kSpikeStep ? 1 : 0) << "step " << s;
  }
  EXPECT_GT(spiked.metrics[kSpikeStep - 1].at("loss").get<double>(),
            clean.metrics[kSpikeStep - 1].at("loss").get<double>() + 0.5);
  EXPECT_NE((spiked.out + spiked.err).find("step 40: loss"), std::string::npos) << spiked.out << spiked.err;
  EXPECT_NE((spiked.out + spiked.err).find("the update is skipped (training.skip_spikes)"), std::string::npos);
  const double lc = clean.metrics.back().at("loss").get<double>(), ls = spiked.metrics.back().at("loss").get<double>();
  EXPECT_LE(std::abs(ls - lc), 1e-3) << "final loss " << ls << " with the spike, " << lc << " without";
  std::cout << "final loss with the spike " << ls << ", without " << lc << " (difference " << ls - lc << ")\n";

  // Resumed at step 45 (after the spike) the windows come back from the manifest: the same curve.
  const std::string ckpt = dir / "ckpt";
  ASSERT_EQ(test::run_train_job(dir.path(), "first", 2, config(dir / "spiked.bin", ckpt), {"--max-steps", "45"}, 240s).rc, 0);
  const auto resumed = test::run_train_job(dir.path(), "rest", 2, config(dir / "spiked.bin", ckpt), {"--resume"}, 240s);
  ASSERT_EQ(resumed.rc, 0) << resumed.err;
  ASSERT_EQ(resumed.metrics.size(), static_cast<size_t>(kSteps - 45));
  for (size_t i = 0; i < resumed.metrics.size(); ++i) {
    EXPECT_EQ(resumed.metrics[i].at("loss"), spiked.metrics[45 + i].at("loss")) << "step " << 46 + i;
    EXPECT_EQ(resumed.metrics[i].at("skipped_spikes").get<double>(), 1);
  }
}

}  // namespace
}  // namespace ds
