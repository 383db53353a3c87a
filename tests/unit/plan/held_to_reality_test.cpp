// The plan held to what the runtime really allocates: `dstrain train` runs two steps of a tiny
// model and records its allocator's peak bytes per tag (--metrics); `dstrain plan --json` must
// give the same bytes per tag. One process per layout (ZeRO 0-3, bf16, checkpointing): the
// multi-rank layouts are held by the multiproc tests of the 3D issue.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <sstream>

#include "support/run_command.h"

namespace ds {
namespace {

using test::dstrain;
using test::run_command;

class Reality : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ds_plan_real_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // An llm.c token file: 256 int32 header (magic, version, count), then uint16 tokens.
    std::ofstream f(dir_ + "/train.bin", std::ios::binary);
    int32_t header[256] = {20240520, 1, 4096};
    f.write(reinterpret_cast<const char*>(header), sizeof(header));
    for (int i = 0; i < 4096; ++i) {
      uint16_t t = static_cast<uint16_t>((i * 7919) % 64);
      f.write(reinterpret_cast<const char*>(&t), sizeof(t));
    }
  }
  void TearDown() override { run_command("rm -rf " + dir_); }

  // Writes a config with `extra` keys, trains 2 steps, plans it; compares every tag.
  void check(const std::string& name, const std::string& extra) {
    const std::string cfg = dir_ + "/" + name + ".json";
    std::ofstream(cfg) << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, )"
                       << extra << R"(
      "model": {"type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 64, "seq_len": 16},
      "data": {"train": "train.bin"},
      "training": {"steps": 2, "log_interval": 1, "device": "cpu"}})";
    const std::string metrics = dir_ + "/" + name + ".jsonl";
    auto t = run_command("OMP_NUM_THREADS=1 " + dstrain() + " train --config " + cfg + " --metrics " + metrics);
    ASSERT_EQ(t.exit_code, 0) << t.err << t.out;
    std::ifstream in(metrics);
    std::string line, last;
    while (std::getline(in, line)) {
      if (!line.empty()) last = line;
    }
    ASSERT_FALSE(last.empty()) << "no metrics in " << metrics;
    auto real = nlohmann::json::parse(last);
    auto p = run_command("OMP_NUM_THREADS=1 " + dstrain() + " plan --config " + cfg + " --world-size 1 --json");
    ASSERT_EQ(p.exit_code, 0) << p.err;
    auto plan = nlohmann::json::parse(p.out)["ranks"][0];
    for (const char* tag : {"params", "grads", "optimizer", "activations", "comm", "workspace", "total"}) {
      const std::string key = std::string("peak_bytes_") + tag;
      ASSERT_TRUE(real.contains(key)) << key << " missing in " << last;
      const double measured = real[key].get<double>();
      const double planned = plan[tag].get<double>();
      EXPECT_NEAR(planned, measured, 0.05 * measured + 1) << name << ": " << tag;
    }
  }

  std::string dir_;
};

TEST_F(Reality, Zero0Fp32) { check("z0", R"("zero_optimization": {"stage": 0},)"); }
TEST_F(Reality, Zero1Bf16Checkpointing) {
  check("z1", R"("zero_optimization": {"stage": 1}, "bf16": {"enabled": true},
                 "activation_checkpointing": {"enabled": true},)");
}
TEST_F(Reality, Zero2OverlapSmallBuckets) {
  check("z2", R"("zero_optimization": {"stage": 2, "overlap_comm": true, "reduce_bucket_size": 5000},)");
}
TEST_F(Reality, Zero3PrefetchAndPersistence) {
  check("z3", R"("zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 1000,
                 "stage3_prefetch_bucket_size": 20000},)");
}

}  // namespace
}  // namespace ds
