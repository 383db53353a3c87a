// Elastic node count over real SSH (dstrain launch --nnodes MIN:MAX): two OpenSSH "nodes" on
// 127.0.0.2 and 127.0.0.3 (their own sshd, started by this suite), 2 ranks each, training a tiny
// GPT-2 with checkpoints. Node 1 is killed mid-run with SIGKILL: its sshd, its SSH sessions, its
// agent and its ranks.
//   - --nnodes 1:2: the job goes on on node 0 from the latest checkpoint (data-parallel 4 -> 2,
//     gradient accumulation 1 -> 2), exits 0, its final loss within 1e-3 of the uninterrupted
//     two-node run's, the loss named with its step, and no process left on either node;
//   - --nnodes 2:2: the job fails naming the node, as without --nnodes.
// Skips itself where sshd cannot run (not root, no openssh-server).
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/token_file.h"
#include "multiproc/launch/job_process.h"
#include "multiproc/ssh/ssh_nodes.h"
#include "support/proc_scan.h"

namespace ds {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using nlohmann::json;
using test::JobProcess;
using test::all_pids;
using test::env_of;
using test::parent_of;

test::Nodes* g_nodes = nullptr;

// The training ranks of job `job_id` on node `node` (by NODE_RANK).
std::vector<pid_t> ranks_on(const std::string& job_id, int node) {
  std::vector<pid_t> out;
  for (pid_t p : all_pids()) {
    if (env_of(p, "DSTRAIN_JOB_ID") == job_id && env_of(p, "NODE_RANK") == std::to_string(node) &&
        !env_of(p, "RANK").empty()) {
      out.push_back(p);
    }
  }
  return out;
}

// The job id of a running rank of this suite's job `name` (its DSTRAIN_ELASTIC_TEST=<name>: ctest
// runs the tests as processes side by side), or "".
std::string job_id_of_any_rank(const std::string& name) {
  for (pid_t p : all_pids()) {
    const std::string id = env_of(p, "DSTRAIN_JOB_ID");
    if (!id.empty() && !env_of(p, "RANK").empty() && env_of(p, "DSTRAIN_ELASTIC_TEST") == name) return id;
  }
  return {};
}

json last_record(const std::string& metrics) {
  std::ifstream in(metrics);
  std::string l, last;
  while (std::getline(in, l)) {
    if (!l.empty()) last = l;
  }
  return last.empty() ? json() : json::parse(last);
}

class ElasticSsh : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_nodes = new test::Nodes();
    std::vector<uint16_t> toks(40000);
    std::mt19937 rng(11);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>((i * 5 + rng() % 4) % 61);
    rt::data::write_token_file(g_nodes->path("train.bin"), toks);
  }
  static void TearDownTestSuite() {
    delete g_nodes;
    g_nodes = nullptr;
  }
  void SetUp() override {
    if (!g_nodes->skip_reason.empty()) GTEST_SKIP() << g_nodes->skip_reason;
  }

  static std::string config(const std::string& name, int steps) {
    const json c = {
        {"train_batch_size", 8},
        {"train_micro_batch_size_per_gpu", 2},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}}}}},
        {"zero_optimization", {{"stage", 1}}},
        {"model", {{"type", "gpt2"}, {"n_layer", 2}, {"n_head", 2}, {"n_embd", 64}, {"vocab_size", 64}, {"seq_len", 64}}},
        {"data", {{"train", g_nodes->path("train.bin")}}},
        {"training",
         {{"steps", steps}, {"seed", 7}, {"log_interval", 1}, {"checkpoint_dir", g_nodes->path("ckpt_" + name)},
          {"checkpoint_interval", 5}}}};
    const std::string path = g_nodes->path(name + ".json");
    std::ofstream(path) << c.dump();
    return path;
  }

  static std::unique_ptr<JobProcess> launch(const std::string& name, const std::string& nnodes, int steps) {
    std::vector<std::string> a = {DS_DSTRAIN_BIN, "launch", "-H", g_nodes->path("hostfile"), "--master-port", "0",
                                  "--kill-timeout", "5", "--env", "OMP_NUM_THREADS=1", "--env",
                                  "DSTRAIN_ELASTIC_TEST=" + name};
    for (auto& f : g_nodes->ssh_flags()) a.push_back(f);
    if (!nnodes.empty()) a.insert(a.end(), {"--nnodes", nnodes});
    a.insert(a.end(), {"--", DS_DSTRAIN_BIN, "train", "--config", config(name, steps), "--metrics",
                       g_nodes->path(name + ".jsonl"), "--comm-timeout", "10"});
    return std::make_unique<JobProcess>(a, std::string{}, std::vector<std::string>{},
                                        std::vector<std::string>{"SSH_AUTH_SOCK", "DSTRAIN_STORE", "RANK",
                                                                 "WORLD_SIZE"});
  }

  // Waits until the metrics of `name` have `n` records (or 120 s).
  static void wait_records(const std::string& name, size_t n) {
    const auto until = std::chrono::steady_clock::now() + 120s;
    while (test::nonempty_lines(g_nodes->path(name + ".jsonl")) < n && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(50ms);
    }
  }

  // SIGKILLs node 1 of the running job: its ranks, its agent, the agent's SSH session processes
  // and, with `sshd_too`, node 1's sshd. Returns every pid it killed.
  static std::vector<pid_t> kill_node1(JobProcess& job, const std::string& name, bool sshd_too) {
    std::string id;
    const auto until = std::chrono::steady_clock::now() + 30s;
    while ((id = job_id_of_any_rank(name)).empty() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(50ms);
    }
    std::vector<pid_t> victims = ranks_on(id, 1);
    if (victims.empty()) return victims;
    const pid_t agent = parent_of(victims.front());
    victims.push_back(agent);
    const pid_t listener = g_nodes->sshd[1]->pid();
    // The sshd session processes between the listener and the agent.
    for (pid_t p = parent_of(agent); p > 1 && p != listener; p = parent_of(p)) victims.push_back(p);
    if (sshd_too) victims.push_back(listener);
    for (pid_t p : victims) {
      job.track(p);
      ::kill(p, SIGKILL);
    }
    return victims;
  }
};

TEST_F(ElasticSsh, TwoTwoFailsNamingTheLostNode) {
  auto job = launch("fixed", "2:2", 1000);
  wait_records("fixed", 3);
  ASSERT_GE(test::nonempty_lines(g_nodes->path("fixed.jsonl")), 3u) << job->err();
  const auto killed = kill_node1(*job, "fixed", /*sshd_too=*/false);
  ASSERT_FALSE(killed.empty()) << job->err();
  const int rc = job->wait(90s);
  ASSERT_NE(rc, -1) << job->err();
  EXPECT_NE(rc, 0);
  const std::string err = job->err();
  EXPECT_NE(err.find("lost node 1 (127.0.0.3)"), std::string::npos) << err;
  EXPECT_NE(err.find("1 of 2 node(s) left, fewer than the 2 --nnodes asks for"), std::string::npos) << err;
  EXPECT_EQ(err.find("elastic restart"), std::string::npos) << err;
  EXPECT_TRUE(test::wait_gone(killed, 10s).empty());
  EXPECT_TRUE(job_id_of_any_rank("fixed").empty()) << "a rank outlived the job";
}

// Last in the suite: it kills node 1's sshd.
TEST_F(ElasticSsh, LosingANodeGoesOnOnTheOtherWithTheSameLoss) {
  constexpr int kSteps = 150;  // several seconds: the kill lands mid-run
  auto whole = launch("whole", "", kSteps);
  ASSERT_EQ(whole->wait(300s), 0) << whole->err();
  const json ref = last_record(g_nodes->path("whole.jsonl"));
  ASSERT_EQ(ref.value("step", 0), kSteps) << ref.dump();

  auto job = launch("elastic", "1:2", kSteps);
  wait_records("elastic", 12);  // past the checkpoint of step 10
  ASSERT_GE(test::nonempty_lines(g_nodes->path("elastic.jsonl")), 12u) << job->err();
  auto killed = kill_node1(*job, "elastic", /*sshd_too=*/true);
  ASSERT_GE(killed.size(), 4u) << "two ranks, their agent, an sshd session and the listener\n" << job->err();
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = job->wait(300s);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string err = job->err();
  ASSERT_EQ(rc, 0) << err;
  EXPECT_NE(err.find("dstrain: lost node 1 (127.0.0.3) at step "), std::string::npos) << err;
  EXPECT_NE(err.find("restarting on the 1 remaining node(s), 2 rank(s), from the latest checkpoint (elastic restart "
                     "1; --nnodes 1:2)"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("gradient_accumulation_steps 1 -> 2, global batch 8 kept"), std::string::npos) << err;
  const json last = last_record(g_nodes->path("elastic.jsonl"));
  EXPECT_EQ(last.value("step", 0), kSteps) << last.dump();
  EXPECT_NEAR(last.value("loss", 0.0), ref.value("loss", 1.0), 1e-3) << last.dump() << "\n" << ref.dump();
  EXPECT_EQ(last.value("elastic_restarts", 0), 1) << last.dump();
  EXPECT_GT(last.value("elastic_downtime_s", 0.0), 0.0) << last.dump();
  EXPECT_TRUE(test::wait_gone(killed, 10s).empty());
  EXPECT_TRUE(job_id_of_any_rank("elastic").empty()) << "a rank outlived the job";
  std::istringstream lines(err);
  for (std::string l; std::getline(lines, l);) {
    if (l.rfind("dstrain:", 0) == 0 || l.find("elastic restart on") != std::string::npos) std::cerr << "[ log ] " << l << "\n";
  }
  std::cerr << "[ figure ] elastic: node 1 SIGKILLed to the job's end on node 0 in " << took
            << " s; downtime (loss to the first step on the new world) " << last.value("elastic_downtime_s", 0.0)
            << " s; final loss " << last.value("loss", 0.0) << " vs " << ref.value("loss", 0.0) << " uninterrupted\n";
}

}  // namespace
}  // namespace ds
