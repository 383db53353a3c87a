// `dstrain plan` through the real binary: exit codes, text and --json shapes.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/run_command.h"

namespace ds {
namespace {

using test::dstrain;
using test::run_command;
using test::source_path;

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

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

}  // namespace
}  // namespace ds
