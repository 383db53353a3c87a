// `dstrain launch` on the local node, through the real binary with real worker processes
// (ds_test_worker) that rendezvous through the real store: the environment contract, the
// barrier, output prefixing, teardown on failure and on signals (checked by pid), exit codes,
// restarts, .dstrain_env, core binding, and two jobs side by side.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <regex>
#include <thread>

#include <gtest/gtest.h>

#include "multiproc/launch/job_process.h"

namespace ds {
namespace {

using namespace std::chrono_literals;
using test::JobProcess;
using test::TempDir;

std::string fmt_rank(int r) { return "[rank " + std::to_string(r) + "] "; }

std::vector<std::string> launch_args(int nproc, std::vector<std::string> launch_flags,
                                     std::vector<std::string> worker_flags) {
  std::vector<std::string> a = {DS_DSTRAIN_BIN, "launch", "--nproc-per-node", std::to_string(nproc),
                                "--master-port", "0"};
  a.insert(a.end(), launch_flags.begin(), launch_flags.end());
  a.push_back("--");
  a.push_back(DS_TEST_WORKER_BIN);
  a.insert(a.end(), worker_flags.begin(), worker_flags.end());
  return a;
}

TEST(LaunchLocal, FourRanksRendezvousAndGetTheContract) {
  JobProcess job(launch_args(4, {}, {"--print-env", "--barrier"}));
  ASSERT_EQ(job.wait(), 0) << job.err();
  std::string out = job.out();
  for (int r = 0; r < 4; ++r) {
    auto p = fmt_rank(r);
    EXPECT_NE(out.find(p + "barrier passed by rank " + std::to_string(r) + " of 4"), std::string::npos) << out;
    EXPECT_NE(out.find(p + "env RANK=" + std::to_string(r)), std::string::npos);
    EXPECT_NE(out.find(p + "env LOCAL_RANK=" + std::to_string(r)), std::string::npos);
    EXPECT_NE(out.find(p + "env WORLD_SIZE=4"), std::string::npos);
    EXPECT_NE(out.find(p + "env LOCAL_WORLD_SIZE=4"), std::string::npos);
    EXPECT_NE(out.find(p + "env NODE_RANK=0"), std::string::npos);
    EXPECT_NE(out.find(p + "env MASTER_ADDR=localhost"), std::string::npos);
    EXPECT_NE(out.find(p + "env DSTRAIN_STORE=127.0.0.1:"), std::string::npos);
    EXPECT_NE(out.find(p + "env DSTRAIN_JOB_TOKEN_LENGTH=64"), std::string::npos);
    EXPECT_NE(out.find(p + "env DSTRAIN_RESTART_COUNT=0"), std::string::npos);
  }
  int cpus = static_cast<int>(std::thread::hardware_concurrency());
  EXPECT_NE(out.find("env OMP_NUM_THREADS=" + std::to_string(std::max(1, cpus / 4))),
            std::string::npos);
  EXPECT_EQ(out.find("MASTER_PORT=0\n"), std::string::npos) << "port 0 must become a real port";
  EXPECT_EQ(job.err().find("DSTRAIN_JOB_TOKEN="), std::string::npos);
}

TEST(LaunchLocal, ARankExitingThreeStopsTheOthersAndNamesIt) {
  TempDir pids;
  JobProcess job(launch_args(4, {"--kill-timeout", "5"},
                             {"--pid-dir", pids.path(), "--barrier", "--fail-rank", "1",
                              "--fail-code", "3", "--sleep", "120"}));
  int status = job.wait(60s);
  auto all = test::read_pids(pids.path(), 4, 1s);
  for (pid_t p : all) job.track(p);
  ASSERT_EQ(status, 3) << job.err();
  EXPECT_EQ(all.size(), 4u);
  EXPECT_TRUE(test::wait_gone(all, 0ms).empty()) << "a worker outlived the launcher";
  std::string err = job.err();
  EXPECT_NE(err.find("rank 1 on localhost exited with exit code 3"), std::string::npos) << err;
}

TEST(LaunchLocal, WorkersIgnoringSigtermAreKilledAfterTheKillTimeout) {
  TempDir pids;
  JobProcess job(launch_args(3, {"--kill-timeout", "0.5"},
                             {"--pid-dir", pids.path(), "--barrier", "--fail-rank", "2",
                              "--fail-code", "4", "--sleep", "120", "--ignore-sigterm"}));
  int status = job.wait(60s);
  auto all = test::read_pids(pids.path(), 3, 1s);
  for (pid_t p : all) job.track(p);
  ASSERT_EQ(status, 4) << job.err();
  EXPECT_TRUE(test::wait_gone(all, 0ms).empty());
  EXPECT_NE(job.err().find("SIGKILL"), std::string::npos) << job.err();
}

TEST(LaunchLocal, SigintToTheLauncherLeavesNoWorker) {
  TempDir pids;
  JobProcess job(launch_args(3, {"--kill-timeout", "5"}, {"--pid-dir", pids.path(), "--sleep", "120"}));
  auto all = test::read_pids(pids.path(), 3);
  for (pid_t p : all) job.track(p);
  ASSERT_EQ(all.size(), 3u) << job.err();
  job.signal(SIGINT);
  int status = job.wait(30s);
  EXPECT_EQ(status, 130) << job.err();
  EXPECT_TRUE(test::wait_gone(all, 0ms).empty());
  EXPECT_NE(job.err().find("interrupted by SIGINT"), std::string::npos) << job.err();
}

TEST(LaunchLocal, SigkillOfTheLauncherLeavesNoWorker) {
  TempDir pids;
  JobProcess job(launch_args(2, {}, {"--pid-dir", pids.path(), "--sleep", "120"}));
  auto all = test::read_pids(pids.path(), 2);
  for (pid_t p : all) job.track(p);
  ASSERT_EQ(all.size(), 2u) << job.err();
  job.signal(SIGKILL);
  EXPECT_EQ(job.wait(30s), 137);
  EXPECT_TRUE(test::wait_gone(all, 10s).empty());
}

TEST(LaunchLocal, ARankKilledBySigkillIsReportedAsSuch) {
  JobProcess job(launch_args(3, {"--kill-timeout", "5"}, {"--barrier", "--kill-self-rank", "2", "--sleep", "120"}));
  ASSERT_EQ(job.wait(60s), 137) << job.err();
  EXPECT_NE(job.err().find("rank 2 on localhost was killed by signal 9 (SIGKILL)"), std::string::npos)
      << job.err();
}

TEST(LaunchLocal, OutputIsPrefixedLineByLineAndLogged) {
  TempDir logs;
  JobProcess job(launch_args(4, {"--log-dir", logs.path(), "--ranks-filter", "0,2-3"}, {"--lines", "300"}));
  ASSERT_EQ(job.wait(), 0) << job.err();
  std::regex out_line(R"(\[rank (\d)\] line (\d+) of rank (\d))");
  std::regex err_line(R"(\[rank (\d)\] err (\d+) of rank (\d))");
  auto check = [](const std::string& text, const std::regex& re, size_t want) {
    std::istringstream in(text);
    std::string line;
    size_t n = 0;
    std::set<std::string> ranks;
    while (std::getline(in, line)) {
      std::smatch m;
      if (line.rfind("[dstrain]", 0) == 0) continue;
      ASSERT_TRUE(std::regex_match(line, m, re)) << "mangled line: " << line;
      EXPECT_EQ(m[1], m[3]) << line;
      ranks.insert(m[1]);
      ++n;
    }
    EXPECT_EQ(n, want);
    EXPECT_EQ(ranks, (std::set<std::string>{"0", "2", "3"}));
  };
  check(job.out(), out_line, 900);
  check(job.err(), err_line, 900);
  for (int r = 0; r < 4; ++r) {
    std::string log = test::slurp(logs / ("rank_" + std::to_string(r) + ".log"));
    EXPECT_EQ(test::count_lines_containing(log, "of rank " + std::to_string(r)), 600u) << r;
    EXPECT_EQ(log.find("[rank"), std::string::npos) << "log files hold the raw lines";
  }
}

TEST(LaunchLocal, EnvFileAndEnvFlagReachTheWorkersButNotTheDryRun) {
  TempDir cwd;
  std::ofstream(cwd / ".dstrain_env") << "# secrets for the job\n\nSECRET_A=s3cr3t-value\n"
                                         "export PLAIN_B=two words\nOVERRIDE=from-file\n";
  JobProcess job(launch_args(2, {"--env", "OVERRIDE=from-flag", "--env", "OMP_NUM_THREADS=7"},
                             {"--show-env", "SECRET_A", "--show-env", "PLAIN_B", "--show-env",
                              "OVERRIDE", "--show-env", "OMP_NUM_THREADS"}),
                 cwd.path());
  ASSERT_EQ(job.wait(), 0) << job.err();
  std::string out = job.out();
  EXPECT_NE(out.find("[rank 1] show SECRET_A=s3cr3t-value"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 0] show PLAIN_B=two words"), std::string::npos);
  EXPECT_NE(out.find("[rank 0] show OVERRIDE=from-flag"), std::string::npos);
  EXPECT_NE(out.find("[rank 1] show OMP_NUM_THREADS=7"), std::string::npos);

  JobProcess dry({DS_DSTRAIN_BIN, "launch", "--dry-run", "--nproc-per-node", "2", "--", "true"},
                 cwd.path());
  ASSERT_EQ(dry.wait(), 0) << dry.err();
  EXPECT_EQ(dry.out().find("s3cr3t-value"), std::string::npos) << dry.out();
  EXPECT_NE(dry.out().find("SECRET_A="), std::string::npos) << dry.out();

  std::ofstream(cwd / ".dstrain_env") << "OK=1\nthis-is-a-pasted-secret\n";
  JobProcess bad(launch_args(1, {}, {}), cwd.path());
  EXPECT_EQ(bad.wait(), 2);
  EXPECT_NE(bad.err().find(".dstrain_env:2"), std::string::npos) << bad.err();
  EXPECT_EQ(bad.err().find("pasted-secret"), std::string::npos) << bad.err();
}

TEST(LaunchLocal, MaxRestartsRunsANewGeneration) {
  JobProcess job(launch_args(2, {"--max-restarts", "2"},
                             {"--barrier", "--fail-until-restart", "2", "--show-env", "DSTRAIN_RESTART_COUNT"}));
  ASSERT_EQ(job.wait(), 0) << job.err();
  std::string out = job.out();
  for (int g = 0; g <= 2; ++g) {
    EXPECT_NE(out.find("[rank 1] show DSTRAIN_RESTART_COUNT=" + std::to_string(g)), std::string::npos) << out;
  }
  // Rank 0 passes the barrier in every generation (then fails in the first two); rank 1 may be
  // stopped before it prints in those, but passes in the last.
  EXPECT_EQ(test::count_lines_containing(out, "[rank 0] barrier passed"), 3u) << out;
  EXPECT_GE(test::count_lines_containing(out, "[rank 1] barrier passed"), 1u) << out;
  EXPECT_EQ(test::count_lines_containing(job.err(), "restarting every rank"), 2u) << job.err();

  JobProcess out_of_restarts(launch_args(2, {"--max-restarts", "1"}, {"--barrier", "--fail-until-restart", "5"}));
  EXPECT_EQ(out_of_restarts.wait(), 5) << out_of_restarts.err();
  EXPECT_NE(out_of_restarts.err().find("after 1 restart(s)"), std::string::npos) << out_of_restarts.err();
}

// A rank fails, and while the others have their failure grace the launcher is interrupted: the
// user said stop, so --max-restarts does not start another generation (the remote launcher's rule
// too); the failure stays the job's status.
TEST(LaunchLocal, SigintDuringAFailuresGraceIsNotRestarted) {
  TempDir pids;
  JobProcess job(launch_args(2, {"--max-restarts", "3", "--failure-grace", "30", "--kill-timeout", "5"},
                             {"--pid-dir", pids.path(), "--barrier", "--fail-rank", "1", "--fail-code", "3",
                              "--sleep", "120"}));
  auto all = test::read_pids(pids.path(), 2);
  for (pid_t p : all) job.track(p);
  ASSERT_EQ(all.size(), 2u) << job.err();
  const pid_t rank1 = std::atoi(test::slurp(pids.path() + "/rank_1.pid").c_str());
  ASSERT_TRUE(test::wait_gone({rank1}, 30s).empty()) << "rank 1 did not fail: " << job.err();
  std::this_thread::sleep_for(500ms);  // the launcher has seen it: rank 0 is in the grace
  job.signal(SIGINT);
  EXPECT_EQ(job.wait(30s), 3) << job.err();
  EXPECT_TRUE(test::wait_gone(all, 0ms).empty());
  EXPECT_EQ(job.err().find("restarting every rank"), std::string::npos) << job.err();
  EXPECT_NE(job.err().find("rank 1 on localhost exited with exit code 3"), std::string::npos) << job.err();
}

TEST(LaunchLocal, AMasterPortInUseIsReportedWithItsAddress) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  JobProcess job({DS_DSTRAIN_BIN, "launch", "--nproc-per-node", "1", "--master-port",
                  std::to_string(port), "--", "true"});
  int status = job.wait();
  ::close(fd);
  EXPECT_NE(status, 0);
  EXPECT_NE(job.err().find("MASTER_PORT " + std::to_string(port) + " is in use on localhost"),
            std::string::npos)
      << job.err();
}

TEST(LaunchLocal, TwoJobsOnOneHostDoNotTouchEachOther) {
  TempDir pids_a;
  JobProcess a(launch_args(2, {}, {"--pid-dir", pids_a.path(), "--sleep", "120"}));
  auto a_pids = test::read_pids(pids_a.path(), 2);
  for (pid_t p : a_pids) a.track(p);
  ASSERT_EQ(a_pids.size(), 2u) << a.err();
  JobProcess b(launch_args(2, {"--kill-timeout", "1"}, {"--barrier", "--fail-rank", "0", "--fail-code", "9", "--sleep", "120"}));
  EXPECT_EQ(b.wait(), 9) << b.err();
  for (pid_t p : a_pids) EXPECT_TRUE(test::pid_alive(p)) << "job B's teardown killed job A's pid " << p;
  a.signal(SIGTERM);
  EXPECT_EQ(a.wait(30s), 128 + SIGTERM);
  EXPECT_TRUE(test::wait_gone(a_pids, 0ms).empty());
}

TEST(LaunchLocal, BindCoresToRankGivesDisjointCpus) {
  JobProcess job(launch_args(2, {"--bind-cores-to-rank"}, {"--affinity"}));
  ASSERT_EQ(job.wait(), 0) << job.err();
  std::regex re(R"(\[rank (\d)\] affinity ([0-9,]+))");
  std::string out = job.out();
  std::map<std::string, std::string> aff;
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) {
    aff[(*it)[1]] = (*it)[2];
  }
  ASSERT_EQ(aff.size(), 2u) << out;
  auto set_of = [](const std::string& s) {
    std::set<std::string> out;
    std::stringstream ss(s);
    std::string t;
    while (std::getline(ss, t, ',')) out.insert(t);
    return out;
  };
  auto s0 = set_of(aff["0"]), s1 = set_of(aff["1"]);
  if (std::thread::hardware_concurrency() >= 2) {
    for (const auto& c : s0) EXPECT_EQ(s1.count(c), 0u) << "cpu " << c << " in both ranks";
  }
}

TEST(LaunchLocal, AMissingProgramIsAClearFailure) {
  JobProcess job({DS_DSTRAIN_BIN, "launch", "--nproc-per-node", "2", "--master-port", "0", "--",
                  "/nonexistent/program"});
  EXPECT_EQ(job.wait(), 127);
  EXPECT_NE(job.err().find("command '/nonexistent/program' not found"), std::string::npos) << job.err();
}

}  // namespace
}  // namespace ds
