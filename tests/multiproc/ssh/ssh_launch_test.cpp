// `dstrain launch` and `dstrain check` over real SSH: the suite starts two OpenSSH servers on
// 127.0.0.2 and 127.0.0.3 (same unprivileged port, generated host and user keys) as two "nodes",
// then launches real workers through them. Skips itself where sshd cannot run (not root, no
// openssh-server). Every process it starts dies with it (PR_SET_PDEATHSIG), pass or fail.
//
// Note: each SSH command runs through the remote user's login shell; a slow ~/.bashrc adds its
// start-up time to every launch here.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>

#include <gtest/gtest.h>

#include "multiproc/launch/job_process.h"
#include "multiproc/ssh/ssh_nodes.h"
#include "support/run_command.h"

namespace ds {
namespace {

using namespace std::chrono_literals;
using test::JobProcess;
using test::TempDir;

using test::Nodes;
using test::free_port_on_both;

Nodes* g_nodes = nullptr;

class SshLaunch : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (g_nodes == nullptr) g_nodes = new Nodes();
  }
  static void TearDownTestSuite() {
    delete g_nodes;
    g_nodes = nullptr;
  }
  void SetUp() override {
    if (!g_nodes->skip_reason.empty()) GTEST_SKIP() << g_nodes->skip_reason;
  }

  static std::vector<std::string> launch(std::vector<std::string> extra,
                                         std::vector<std::string> worker,
                                         const std::string& key = "user",
                                         const std::string& known = "known_hosts") {
    std::vector<std::string> a = {DS_DSTRAIN_BIN, "launch", "-H", g_nodes->path("hostfile"),
                                  "--master-port", "0"};
    for (auto& f : g_nodes->ssh_flags(key, known)) a.push_back(f);
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back("--");
    a.push_back(DS_TEST_WORKER_BIN);
    a.insert(a.end(), worker.begin(), worker.end());
    return a;
  }
  // No ssh-agent: only the keys the tests name.
  static std::vector<std::string> no_agent() { return {"SSH_AUTH_SOCK"}; }
};

TEST_F(SshLaunch, TwoNodesFourRanksRendezvousAndReportTheirEnvironment) {
  JobProcess job(launch({}, {"--print-env", "--barrier"}), {}, {}, no_agent());
  ASSERT_EQ(job.wait(60s), 0) << job.err();
  std::string out = job.out();
  for (int r = 0; r < 4; ++r) {
    std::string p = "[rank " + std::to_string(r) + "] ";
    EXPECT_NE(out.find(p + "barrier passed by rank " + std::to_string(r) + " of 4"), std::string::npos) << out;
    EXPECT_NE(out.find(p + "env NODE_RANK=" + std::to_string(r / 2)), std::string::npos) << out;
    EXPECT_NE(out.find(p + "env LOCAL_RANK=" + std::to_string(r % 2)), std::string::npos);
    EXPECT_NE(out.find(p + "env WORLD_SIZE=4"), std::string::npos);
    EXPECT_NE(out.find(p + "env MASTER_ADDR=127.0.0.2"), std::string::npos);
    EXPECT_NE(out.find(p + "env DSTRAIN_STORE=127.0.0.2:"), std::string::npos);
    EXPECT_NE(out.find(p + "env DSTRAIN_JOB_TOKEN_LENGTH=64"), std::string::npos);
  }
}

TEST_F(SshLaunch, AFailingRankOnTheSecondNodeStopsBothNodes) {
  TempDir pids;
  JobProcess job(launch({"--kill-timeout", "5"}, {"--pid-dir", pids.path(), "--barrier", "--fail-rank", "3",
                                                  "--fail-code", "3", "--sleep", "120"}),
                 {}, {}, no_agent());
  int status = job.wait(60s);
  auto all = test::read_pids(pids.path(), 4, 1s);
  for (pid_t p : all) job.track(p);
  ASSERT_EQ(status, 3) << job.err();
  EXPECT_EQ(all.size(), 4u);
  EXPECT_TRUE(test::wait_gone(all, 5s).empty()) << "a worker outlived the job";
  EXPECT_NE(job.err().find("rank 3 on 127.0.0.3 exited with exit code 3"), std::string::npos) << job.err();
}

TEST_F(SshLaunch, KillingTheLauncherLeavesNoWorkerOnEitherNode) {
  TempDir pids;
  JobProcess job(launch({"--kill-timeout", "3"}, {"--pid-dir", pids.path(), "--sleep", "120"}), {}, {},
                 no_agent());
  auto all = test::read_pids(pids.path(), 4, 30s);
  for (pid_t p : all) job.track(p);
  ASSERT_EQ(all.size(), 4u) << job.err();
  job.signal(SIGKILL);
  EXPECT_EQ(job.wait(10s), 137);
  // sshd sees the connection drop, the agents see end of stdin and tear their nodes down.
  auto left = test::wait_gone(all, 15s);
  EXPECT_TRUE(left.empty()) << left.size() << " worker(s) left behind";
}

TEST_F(SshLaunch, SigintStopsBothNodes) {
  TempDir pids;
  JobProcess job(launch({"--kill-timeout", "3"}, {"--pid-dir", pids.path(), "--sleep", "120"}), {}, {},
                 no_agent());
  auto all = test::read_pids(pids.path(), 4, 30s);
  for (pid_t p : all) job.track(p);
  ASSERT_EQ(all.size(), 4u) << job.err();
  job.signal(SIGINT);
  EXPECT_EQ(job.wait(20s), 130) << job.err();
  EXPECT_TRUE(test::wait_gone(all, 5s).empty());
}

// An agent that stops answering (SIGSTOP: its heartbeat stops with it) fails the job within
// the agent timeout, naming its node; the launcher kills it over a second connection, so its
// workers go with it, and the other node is torn down.
TEST_F(SshLaunch, AStoppedAgentIsNamedAndItsNodeTornDown) {
  TempDir pids;
  JobProcess job(launch({"--kill-timeout", "3", "--agent-timeout", "3"}, {"--pid-dir", pids.path(), "--sleep", "120"}),
                 {}, {}, no_agent());
  auto all = test::read_pids(pids.path(), 4, 30s);
  for (pid_t p : all) job.track(p);
  ASSERT_EQ(all.size(), 4u) << job.err();
  const pid_t rank2 = std::atoi(test::slurp(pids.path() + "/rank_2.pid").c_str());
  std::ifstream st("/proc/" + std::to_string(rank2) + "/stat");
  std::string line;
  std::getline(st, line);
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  char state;
  pid_t agent = 0;
  rest >> state >> agent;
  ASSERT_GT(agent, 1);
  job.track(agent);
  ASSERT_EQ(::kill(agent, SIGSTOP), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = job.wait(60s);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_NE(rc, -1) << job.err();
  EXPECT_EQ(rc, 1) << job.err();
  EXPECT_LE(took, 3 + 10) << job.err();
  EXPECT_NE(job.err().find("the agent on node 1 (127.0.0.3, pid " + std::to_string(agent) + ") sent nothing"),
            std::string::npos)
      << job.err();
  all.push_back(agent);
  EXPECT_TRUE(test::wait_gone(all, 10s).empty()) << "a worker or the stopped agent outlived the job";
  std::cerr << "[ figure ] SIGSTOP of an agent to a failed job in " << took << " s (agent timeout 3 s)\n";
}

TEST_F(SshLaunch, AnUnknownHostKeyIsAClearError) {
  std::ofstream(g_nodes->path("empty_known_hosts")) << "";
  JobProcess job(launch({}, {}, "user", "empty_known_hosts"), {}, {}, no_agent());
  EXPECT_EQ(job.wait(30s), 1) << job.err();
  EXPECT_NE(job.err().find("unknown host key"), std::string::npos) << job.err();
  EXPECT_NE(job.err().find("--ssh-accept-new-host-keys"), std::string::npos) << job.err();
}

TEST_F(SshLaunch, AcceptNewHostKeysRecordsThem) {
  std::ofstream(g_nodes->path("tofu_known_hosts")) << "";
  JobProcess job(launch({"--ssh-accept-new-host-keys"}, {"--barrier"}, "user", "tofu_known_hosts"), {},
                 {}, no_agent());
  ASSERT_EQ(job.wait(60s), 0) << job.err();
  std::string kh = test::slurp(g_nodes->path("tofu_known_hosts"));
  EXPECT_NE(kh.find("[127.0.0.2]:" + std::to_string(g_nodes->port)), std::string::npos) << kh;
  EXPECT_NE(kh.find("[127.0.0.3]:" + std::to_string(g_nodes->port)), std::string::npos) << kh;
}

TEST_F(SshLaunch, AChangedHostKeyIsAlwaysAnError) {
  // node 2's name with node 3's key: what a man in the middle would present.
  std::ofstream(g_nodes->path("changed_known_hosts"))
      << "[127.0.0.2]:" << g_nodes->port << " " << test::slurp(g_nodes->path("host3.pub"))
      << "[127.0.0.3]:" << g_nodes->port << " " << test::slurp(g_nodes->path("host3.pub"));
  JobProcess job(launch({"--ssh-accept-new-host-keys"}, {}, "user", "changed_known_hosts"), {}, {},
                 no_agent());
  EXPECT_EQ(job.wait(30s), 1) << job.err();
  EXPECT_NE(job.err().find("does not match"), std::string::npos) << job.err();
}

TEST_F(SshLaunch, AWrongUserKeyIsAClearError) {
  JobProcess job(launch({}, {}, "wrong"), {}, {}, no_agent());
  EXPECT_EQ(job.wait(30s), 1) << job.err();
  EXPECT_NE(job.err().find("public key authentication failed"), std::string::npos) << job.err();
  EXPECT_NE(job.err().find(g_nodes->path("wrong")), std::string::npos) << job.err();
}

TEST_F(SshLaunch, AClosedPortIsAClearError) {
  int closed = free_port_on_both();
  auto args = launch({}, {});
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--ssh-port") args[i + 1] = std::to_string(closed);
  }
  JobProcess job(args, {}, {}, no_agent());
  EXPECT_EQ(job.wait(30s), 1) << job.err();
  EXPECT_NE(job.err().find("Connection refused"), std::string::npos) << job.err();
  EXPECT_NE(job.err().find("127.0.0.2:" + std::to_string(closed)), std::string::npos) << job.err();
}

TEST_F(SshLaunch, AMasterPortInUseOnNodeZeroIsReportedWithItsAddress) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  auto args = launch({}, {});
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--master-port") args[i + 1] = std::to_string(port);
  }
  JobProcess job(args, {}, {}, no_agent());
  int status = job.wait(30s);
  ::close(fd);
  EXPECT_EQ(status, 1) << job.err();
  EXPECT_NE(job.err().find("MASTER_PORT " + std::to_string(port) + " is in use on 127.0.0.2"),
            std::string::npos)
      << job.err();
}

TEST_F(SshLaunch, CheckReportsEveryHost) {
  std::vector<std::string> args = {DS_DSTRAIN_BIN, "check", "-H", g_nodes->path("hostfile"),
                                   "--master-port", "0"};
  for (auto& f : g_nodes->ssh_flags()) args.push_back(f);
  JobProcess ok(args, {}, {}, no_agent());
  ASSERT_EQ(ok.wait(60s), 0) << ok.out() << ok.err();
  EXPECT_NE(ok.out().find("all 2 host(s) ready"), std::string::npos) << ok.out();
  EXPECT_EQ(test::count_lines_containing(ok.out(), "  ok    ok "), 2u) << ok.out();

  args.push_back("--remote-dstrain");
  args.push_back("/nonexistent/dstrain");
  JobProcess missing(args, {}, {}, no_agent());
  EXPECT_EQ(missing.wait(60s), 1);
  EXPECT_NE(missing.out().find("is dstrain installed there?"), std::string::npos) << missing.out();
}

}  // namespace
}  // namespace ds
