// Shards through the real trainer: a corpus split into 3 shards (at points that are not window
// boundaries) trains exactly the loss curve of the unsplit file, with and without shuffle, and a
// run interrupted so that its first window after the resume spans a shard boundary continues bit
// for bit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/job_config.h"
#include "data/token_file.h"
#include "test_dir.h"
#include "train/trainer.h"

namespace ds::rt::data {
namespace {

using test::TempDir;

class ShardTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(7);
    all_.resize(20000);
    for (size_t i = 0; i < all_.size(); ++i) {
      all_[i] = static_cast<uint16_t>((i * 7 + (i / 5)) % 29);
      if (rng() % 50 == 0) all_[i] = static_cast<uint16_t>(rng() % 32);
    }
    write_token_file(dir_.file("all.bin"), all_);
    // Step 6 (1-based) reads windows at 640 and 704 (B*T = 64, G = 2): 700 lies inside the first.
    const size_t cuts[] = {0, 700, 13013, all_.size()};
    for (int k = 0; k < 3; ++k) {
      std::span<const uint16_t> part(all_.data() + cuts[k], cuts[k + 1] - cuts[k]);
      write_token_file(dir_.file("shard_" + std::to_string(k) + ".bin"), part);
    }
  }

  nlohmann::json config(const nlohmann::json& train, bool shuffle) const {
    return {{"train_micro_batch_size_per_gpu", 4},
            {"gradient_accumulation_steps", 2},
            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}, {"weight_decay", 0.0}}}}},
            {"model", {{"type", "gpt2"}, {"n_layer", 1}, {"n_head", 2}, {"n_embd", 32},
                       {"vocab_size", 32}, {"seq_len", 16}}},
            {"data", {{"train", train}, {"shuffle", shuffle}}},
            {"training", {{"steps", 12}, {"seed", 5}, {"log_interval", 100}}}};
  }

  std::vector<double> losses(const nlohmann::json& j, const rt::train::TrainOptions& o = {}) const {
    const std::string path = dir_.file("cfg.json");
    std::ofstream(path) << j.dump(2);
    rt::train::Trainer t(config::load_job_config(path, 1), o);
    return t.run().losses;
  }

  TempDir dir_;
  std::vector<uint16_t> all_;
};

TEST_F(ShardTraining, ThreeShardsTrainTheUnsplitCurve) {
  for (bool shuffle : {false, true}) {
    const auto one = losses(config(dir_.file("all.bin"), shuffle));
    const auto glob = losses(config(dir_.file("shard_*.bin"), shuffle));
    const auto list = losses(config(nlohmann::json::array({dir_.file("shard_2.bin"), dir_.file("shard_0.bin"),
                                                          dir_.file("shard_1.bin")}), shuffle));
    ASSERT_EQ(one.size(), 12u);
    EXPECT_EQ(glob, one) << "shuffle " << shuffle;
    EXPECT_EQ(list, one) << "shuffle " << shuffle;
  }
}

TEST_F(ShardTraining, ResumeAcrossAShardBoundaryIsBitExact) {
  auto j = config(dir_.file("shard_*.bin"), false);
  j["training"]["checkpoint_dir"] = dir_.file("ckpt");
  j["training"]["checkpoint_interval"] = 5;
  const auto full = losses(j);
  std::filesystem::remove_all(dir_.file("ckpt"));
  rt::train::TrainOptions stop;
  stop.max_steps = 7;  // the last checkpoint is step 5; step 6's first window spans token 700
  auto resumed = losses(j, stop);
  resumed.resize(5);
  rt::train::TrainOptions resume;
  resume.resume = true;
  const auto rest = losses(j, resume);
  resumed.insert(resumed.end(), rest.begin(), rest.end());
  EXPECT_EQ(resumed, full);
}

}  // namespace
}  // namespace ds::rt::data
