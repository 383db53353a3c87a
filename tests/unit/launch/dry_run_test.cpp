// `dstrain launch --dry-run` through the real binary: the ranks, their environment, --json, and
// that the job token never appears.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "support/run_command.h"

namespace ds {
namespace {

using test::dstrain;
using test::run_command;
using test::source_path;

TEST(DryRun, JsonListsEveryRankWithItsEnvironment) {
  auto r = run_command(dstrain() + " launch --dry-run --json -H " +
                       source_path("hostfiles/example-cluster.txt") +
                       " --include 'worker-0:1,3@worker-2' --env FOO=bar -- python3 train.py");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 10u);
  EXPECT_EQ(j[1]["rank"], 1);
  EXPECT_EQ(j[1]["host"], "worker-0");
  EXPECT_EQ(j[1]["node_rank"], 0);
  EXPECT_EQ(j[1]["local_rank"], 1);
  EXPECT_EQ(j[1]["devices"], nlohmann::json::array({3}));
  EXPECT_EQ(j[2]["host"], "worker-2");
  EXPECT_EQ(j[2]["node_rank"], 1);
  EXPECT_EQ(j[2]["local_rank"], 0);
  auto env = j[9]["env"];
  EXPECT_EQ(env["RANK"], "9");
  EXPECT_EQ(env["LOCAL_RANK"], "7");
  EXPECT_EQ(env["WORLD_SIZE"], "10");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "8");
  EXPECT_EQ(env["NODE_RANK"], "1");
  EXPECT_EQ(env["MASTER_ADDR"], "worker-0");
  EXPECT_EQ(env["MASTER_PORT"], "29500");
  EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], "0,1,2,3,4,5,6,7");
  EXPECT_EQ(env["DSTRAIN_JOB_TOKEN"], "<hidden>");
  EXPECT_EQ(env["FOO"], "bar");
  EXPECT_EQ(j[0]["command"], nlohmann::json::array({"python3", "train.py"}));
}

TEST(DryRun, TextOutputNamesHostsAndHidesTheToken) {
  auto r = run_command(dstrain() + " launch --dry-run --nproc-per-node 3 -- hostname");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("dry run: 3 rank(s) on 1 node(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank   2  host localhost  node_rank 0  local_rank 2  devices 2"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("DSTRAIN_JOB_TOKEN=<hidden>"), std::string::npos);
}

TEST(DryRun, BadInputsExitWithClearErrors) {
  auto r = run_command(dstrain() + " launch --dry-run -H /nonexistent -- x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("cannot read hostfile /nonexistent"), std::string::npos) << r.err;

  r = run_command(dstrain() + " launch --dry-run -H " + source_path("hostfiles/example-cluster.txt") +
                  " --include worker-7 -- x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--include: host 'worker-7' is not in the hostfile"), std::string::npos)
      << r.err;

  // A loopback node 0 with a remote node: the remote one could never reach the store.
  {
    const std::string hf = ::testing::TempDir() + "/localhost-first.txt";
    std::ofstream(hf) << "localhost slots=1\nworker-1 slots=1\n";
    r = run_command(dstrain() + " launch --dry-run -H " + hf + " -- x");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("MASTER_ADDR 'localhost' is a loopback address but node 1 ('worker-1') is another machine"),
              std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--master-addr"), std::string::npos) << r.err;
    r = run_command(dstrain() + " launch --dry-run -H " + hf + " --master-addr 10.0.0.5 -- x");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::ofstream(hf) << "worker-0 slots=1\nworker-1 slots=1\n";
    r = run_command(dstrain() + " launch --dry-run -H " + hf + " --master-addr 127.0.0.1 -- x");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    r = run_command(dstrain() + " launch --dry-run -H " + source_path("hostfiles/loopback-2node.txt") + " -- x");
    EXPECT_EQ(r.exit_code, 0) << r.err;  // every node on this machine
  }

  r = run_command(dstrain() + " launch --dry-run --nproc-per-node 2 --env BAD -- x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--env: expected KEY=VALUE, got 'BAD'"), std::string::npos) << r.err;

  // Without a command the trainer's config is validated once, against the job's world size.
  r = run_command(dstrain() + " launch --dry-run --nproc-per-node 3 --config " +
                  source_path("configs/gpt2-tiny-cpu.json"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = run_command(dstrain() + " launch --nproc-per-node 3 --config " +
                  source_path("configs/gpt2-small-fp16-deepspeed.json") + " --env FOO=1");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("$.train_batch_size: 32 is not divisible"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("[rank"), std::string::npos) << "no rank may start: " << r.out;

  r = run_command(dstrain() + " launch --dry-run --nproc-per-node 2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("nothing to run: no --config and no command"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ds
