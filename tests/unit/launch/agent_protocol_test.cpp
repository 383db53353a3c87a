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

TEST(AgentProtocol, WorldJsonIsCheckedAsTheHostfileIs) {
  auto error_of = [](const std::string& json) {
    try {
      proto::world_from_json(json);
      return std::string("ok");
    } catch (const Error& e) {
      return std::string(e.what());
    }
  };
  EXPECT_EQ(error_of(R"({"nodes":[],"master_addr":"","master_port":1})"), "agent: malformed --world JSON: no nodes");
  EXPECT_EQ(error_of(R"({"nodes":[{"host":"a","slots":[]}],"master_addr":"","master_port":1})"),
            "agent: malformed --world JSON: node 0 (a) has no slots");
  EXPECT_EQ(error_of(R"({"nodes":[{"host":"a","slots":[1,1]}],"master_addr":"","master_port":1})"),
            "agent: malformed --world JSON: node 0 (a): slots must be distinct, ascending, 0-4095");
  EXPECT_EQ(error_of(R"({"nodes":[{"host":"a","slots":[-1]}],"master_addr":"","master_port":1})"),
            "agent: malformed --world JSON: node 0 (a): slots must be distinct, ascending, 0-4095");
  EXPECT_EQ(error_of(R"({"nodes":[{"host":"a","slots":[0]}],"master_addr":"","master_port":70000})"),
            "agent: malformed --world JSON: master_port 70000 is not 0-65535");
  EXPECT_EQ(error_of(R"({"nodes":[{"host":"a","slots":[0]}],"master_addr":"","master_port":0})"), "ok");
  // Floats and out-of-range integers are refused, never cast (the fuzzer's find: a 40-digit port).
  EXPECT_EQ(error_of(R"({"nodes":[{"host":"a","slots":[0]}],"master_addr":"","master_port":4444444444444444444444444444444444444444})"),
            "agent: malformed --world JSON: master_port must be an integer, got 4.4444444444444446e+39");
  EXPECT_EQ(error_of(R"({"nodes":[{"host":"a","slots":[0]}],"master_addr":"","master_port":18446744073709551615})"),
            "agent: malformed --world JSON: master_port 18446744073709551615 is not 0-65535");
  EXPECT_EQ(error_of(R"({"nodes":[{"host":"a","slots":[0.5]}],"master_addr":"","master_port":1})"),
            "agent: malformed --world JSON: slot must be an integer, got 0.5");
  EXPECT_EQ(error_of(R"({"nodes":[{"host":"a","slots":[5000000000]}],"master_addr":"","master_port":1})"),
            "agent: malformed --world JSON: slot 5000000000 is not -2147483648-2147483647");
  EXPECT_EQ(error_of(R"({"nodes":[{"host":"a","slots":3}],"master_addr":"","master_port":1})"),
            "agent: malformed --world JSON: slots must be an array, got 3");
}

TEST(AgentProtocol, AgentMessagesParseWithRangesChecked) {
  using K = proto::AgentMessage::Kind;
  auto m = proto::parse_agent_message(R"(out 3 2 a\\b\nc  d)", 4);
  EXPECT_EQ(m.kind, K::kOut);
  EXPECT_EQ(m.rank, 3);
  EXPECT_EQ(m.stream, 2);
  EXPECT_EQ(m.text, "a\\b\nc  d");
  m = proto::parse_agent_message("exit 1 signal 9", 2);
  EXPECT_EQ(m.kind, K::kExit);
  EXPECT_EQ(m.status.signal, 9);
  m = proto::parse_agent_message("store 29400 29500", 2);
  EXPECT_EQ(m.kind, K::kStore);
  EXPECT_EQ(m.store_port, 29400);
  EXPECT_EQ(proto::parse_agent_message("done", 2).kind, K::kDone);
  EXPECT_EQ(proto::parse_agent_message(proto::msg_beat(4242).substr(0, proto::msg_beat(4242).size() - 1), 2).pid, 4242);
  EXPECT_EQ(proto::parse_agent_message("beat 0", 2).kind, K::kMalformed);
  EXPECT_EQ(proto::parse_agent_message("beat it", 2).kind, K::kText);
  EXPECT_EQ(proto::parse_agent_message(R"(fatal no\nway)", 2).text, "no\nway");
  // Out of range: the protocol, broken (the launcher fails the node).
  m = proto::parse_agent_message("out 4 1 hello", 4);
  EXPECT_EQ(m.kind, K::kMalformed);
  EXPECT_EQ(m.text, "rank 4 in 'out' is outside the job's ranks 0-3");
  EXPECT_EQ(proto::parse_agent_message("exit 0 code 256", 4).kind, K::kMalformed);
  EXPECT_EQ(proto::parse_agent_message("exit 0 signal 0", 4).kind, K::kMalformed);
  EXPECT_EQ(proto::parse_agent_message("store 0 29500", 4).kind, K::kMalformed);
  EXPECT_EQ(proto::parse_agent_message("started 1 -5", 4).kind, K::kMalformed);
  // Not the protocol's integers: a shell's words, shown as they are.
  EXPECT_EQ(proto::parse_agent_message("out of the box", 4).kind, K::kText);
  EXPECT_EQ(proto::parse_agent_message("exit now please ok", 4).kind, K::kText);
  EXPECT_EQ(proto::parse_agent_message("", 4).kind, K::kText);
}

TEST(AgentProtocol, LauncherMessagesParseWithFieldsChecked) {
  using K = proto::LauncherMessage::Kind;
  auto m = proto::parse_launcher_message("start 10.0.0.1:29400 0 2");
  EXPECT_EQ(m.kind, K::kStart);
  EXPECT_EQ(m.store_addr, "10.0.0.1:29400");
  EXPECT_EQ(m.restart_count, 2);
  m = proto::parse_launcher_message(R"(env A_1=x\ny=z)");
  EXPECT_EQ(m.kind, K::kEnv);
  EXPECT_EQ(m.key, "A_1");
  EXPECT_EQ(m.value, "x\ny=z");
  EXPECT_EQ(proto::parse_launcher_message("stop 10").signal, 10);
  EXPECT_EQ(proto::parse_launcher_message("quit").kind, K::kQuit);
  EXPECT_EQ(proto::parse_launcher_message("dump").kind, K::kDump);
  EXPECT_EQ(proto::msg_dump(), "dump\n");
  EXPECT_EQ(proto::parse_launcher_message("token abc").token, "abc");
  EXPECT_EQ(proto::parse_launcher_message("hello").kind, K::kUnknown);
  for (const char* bad : {"start host 0 1", "start h:1 70000 0", "start h:1 0 -1", "start h:1 0", "env =x",
                          "env 1A=x", "env NOEQUALS", "stop 99", "token "}) {
    EXPECT_EQ(proto::parse_launcher_message(bad).kind, K::kMalformed) << bad;
  }
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
