#include "launch/world.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace ds::launch {
namespace {

TEST(World, RanksFollowHostfileOrderAndSlots) {
  std::vector<config::NodeSlots> nodes = {{"a", {0, 2}}, {"b", {1, 2, 3}}};
  auto w = make_world(nodes, "", 29500);
  ASSERT_EQ(w.world_size(), 5);
  EXPECT_EQ(w.master_addr, "a");
  EXPECT_EQ(w.workers[1].rank, 1);
  EXPECT_EQ(w.workers[1].host, "a");
  EXPECT_EQ(w.workers[1].devices, std::vector<int>{2});
  EXPECT_EQ(w.workers[2].node_rank, 1);
  EXPECT_EQ(w.workers[2].local_rank, 0);
  EXPECT_EQ(w.workers[4].devices, std::vector<int>{3});
  EXPECT_EQ(w.nodes[1].first_rank, 2);
}

TEST(World, EnvContract) {
  auto w = make_world({{"a", {0, 1}}, {"b", {4, 5}}}, "10.0.0.1", 1234);
  JobEnv job{"a:5000", "job1", "s3cret", 2, {{"FOO", "bar"}}};
  auto env = worker_env(w, w.workers[3], job);
  EnvList want = {{"RANK", "3"},
                  {"LOCAL_RANK", "1"},
                  {"WORLD_SIZE", "4"},
                  {"LOCAL_WORLD_SIZE", "2"},
                  {"NODE_RANK", "1"},
                  {"MASTER_ADDR", "10.0.0.1"},
                  {"MASTER_PORT", "1234"},
                  {"CUDA_VISIBLE_DEVICES", "4,5"},
                  {"DSTRAIN_STORE", "a:5000"},
                  {"DSTRAIN_JOB_ID", "job1"},
                  {"DSTRAIN_JOB_TOKEN", "s3cret"},
                  {"DSTRAIN_RESTART_COUNT", "2"},
                  {"FOO", "bar"}};
  EXPECT_EQ(env, want);
  EXPECT_TRUE(is_secret_env("DSTRAIN_JOB_TOKEN"));
  EXPECT_FALSE(is_secret_env("RANK"));
}

TEST(World, EnvAssignments) {
  EXPECT_EQ(parse_env_assignment("A=b=c", "--env"), (std::pair<std::string, std::string>{"A", "b=c"}));
  EXPECT_EQ(parse_env_assignment("A=", "--env"), (std::pair<std::string, std::string>{"A", ""}));
  try {
    parse_env_assignment("NOEQUALS", "--env");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--env: expected KEY=VALUE, got 'NOEQUALS'");
  }
  try {
    parse_env_assignment("1A=x", ".dstrain_env:3");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 ".dstrain_env:3: '1A' is not a valid environment variable name (letters, digits "
                 "and '_', not starting with a digit)");
  }
}

}  // namespace
}  // namespace ds::launch
