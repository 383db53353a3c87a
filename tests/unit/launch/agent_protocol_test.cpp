// The agent protocol's encoding, the world's JSON round trip, the agent's command line (no
// token), core binding and the worker environment's OMP_NUM_THREADS rule.
#include "launch/agent_protocol.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "launch/agent.h"
#include "launch/launcher.h"

namespace ds::launch {
namespace {

TEST(AgentProtocol, EscapesRoundTrip) {
  std::string nasty = "a\\b\nc\rd \\n";
  EXPECT_EQ(proto::escape(nasty).find('\n'), std::string::npos);
  EXPECT_EQ(proto::unescape(proto::escape(nasty)), nasty);
  auto f = proto::split_fields(proto::msg_out(3, 2, "hello  world"), 4);
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[0], "out");
  EXPECT_EQ(f[1], "3");
  EXPECT_EQ(f[2], "2");
  EXPECT_EQ(f[3], "hello  world\n");
  ExitStatus sig;
  sig.signal = 9;
  EXPECT_EQ(proto::msg_exit(1, sig), "exit 1 signal 9\n");
}

TEST(AgentProtocol, WorldRoundTripsThroughJson) {
  World w = make_world({{"a", {0, 2}}, {"b", {1}}}, "10.0.0.1", 1234);
  World back = proto::world_from_json(proto::world_to_json(w));
  EXPECT_EQ(back.world_size(), 3);
  EXPECT_EQ(back.nodes[0].slots, (std::vector<int>{0, 2}));
  EXPECT_EQ(back.nodes[1].host, "b");
  EXPECT_EQ(back.master_addr, "10.0.0.1");
  EXPECT_EQ(back.master_port, 1234);
  EXPECT_THROW(proto::world_from_json("{\"nodes\": 3}"), Error);
}

TEST(AgentCommand, CarriesTheWorldButNeverTheToken) {
  JobSpec spec;
  spec.world = make_world({{"a", {0}}, {"b", {0}}}, "", 29500);
  spec.command = {"python3", "train.py", "--lr", "it's"};
  spec.remote_dstrain = "/opt/dstrain";
  spec.user_env = {{"SECRET", "value-from-env-file"}};
  auto cmd = agent_command(spec, "job-1", 0);
  std::string line = shell_join(cmd);
  EXPECT_NE(line.find("--serve-store"), std::string::npos);
  EXPECT_EQ(line.find("value-from-env-file"), std::string::npos);
  EXPECT_NE(line.find("'it'\\''s'"), std::string::npos) << line;
  EXPECT_EQ(shell_join(agent_command(spec, "job-1", 1)).find("--serve-store"), std::string::npos);
}

TEST(Agent, CoreBlocksPerLocalRank) {
  std::vector<int> cpus = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(cpus_for_local_rank(cpus, 0, 2), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(cpus_for_local_rank(cpus, 2, 3), (std::vector<int>{4, 5}));
  EXPECT_EQ(cpus_for_local_rank({0, 1}, 3, 4), (std::vector<int>{1}));
}

TEST(Agent, OmpThreadsDefaultsToCoresPerLocalRankUnlessGiven) {
  AgentConfig cfg;
  cfg.world = make_world({{"localhost", {0, 1, 2, 3}}}, "", 29500);
  JobEnv job;
  auto find = [](const EnvList& env, const std::string& k) {
    std::string v = "<unset>";
    for (const auto& kv : env) {
      if (kv.first == k) v = kv.second;
    }
    return v;
  };
  ::unsetenv("OMP_NUM_THREADS");
  EXPECT_EQ(find(build_worker_env(cfg, cfg.world.workers[1], job, 16), "OMP_NUM_THREADS"), "4");
  EXPECT_EQ(find(build_worker_env(cfg, cfg.world.workers[1], job, 2), "OMP_NUM_THREADS"), "1");
  cfg.user_env = {{"OMP_NUM_THREADS", "3"}};
  EXPECT_EQ(find(build_worker_env(cfg, cfg.world.workers[1], job, 16), "OMP_NUM_THREADS"), "3");
  EXPECT_EQ(find(build_worker_env(cfg, cfg.world.workers[1], job, 16), "RANK"), "1");
}

}  // namespace
}  // namespace ds::launch
