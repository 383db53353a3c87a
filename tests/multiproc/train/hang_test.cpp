// Hung ranks on real 4-rank training jobs: one rank is stopped (SIGSTOP) mid-training, and the
// job must end within comm_timeout + 10 s, naming that rank, with no process left, through both
// host backends (shm and Gloo), and with context parallelism (cp 2 x dp 2: the stopped rank's
// ring partner waits in the ring attention's send/recv). And a slow rank is not a hung one: a rank that keeps making
// progress but is much slower than comm_timeout per step does not trip it.
// The flight recorder (comm/flight_recorder.h): the failed job's summary names the stopped rank as
// the one that hung, every rank leaves its record in the --log-dir, and `dstrain debug hang` names
// the stopped rank from them; `kill -USR2` of a running job's launcher makes every rank dump its
// record without stopping anything.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <regex>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/token_file.h"
#include "multiproc/launch/job_process.h"
#include "multiproc/train/train_job.h"
#include "support/proc_scan.h"
#include "support/run_command.h"

namespace ds {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using nlohmann::json;
using test::TempDir;

constexpr double kCommTimeout = 4;

// The dstrain train processes whose parent is `launcher`, by their RANK.
std::map<int, pid_t> ranks_of(pid_t launcher) {
  std::map<int, pid_t> out;
  for (pid_t p : test::children_of(launcher)) {
    const std::string rank = test::env_of(p, "RANK");
    if (!rank.empty()) out[std::stoi(rank)] = p;
  }
  return out;
}

// Tracks every rank of `ranks` as part of `job` (killed with it, checked gone); returns their pids.
std::vector<pid_t> track_all(test::JobProcess& job, const std::map<int, pid_t>& ranks) {
  std::vector<pid_t> pids;
  for (const auto& [r, p] : ranks) {
    pids.push_back(p);
    job.track(p);
  }
  return pids;
}

class Hangs : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::vector<uint16_t> toks(20000);
    std::mt19937 rng(5);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>((i * 3 + rng() % 3) % 31);
    rt::data::write_token_file(*dir_ / "train.bin", toks);
  }
  static void TearDownTestSuite() { delete dir_; }
  // GetParam(): the backend, with "+cp" for context parallelism 2 (ring).
  static std::string backend() { return GetParam().substr(0, GetParam().find('+')); }
  static bool cp() { return GetParam().find("+cp") != std::string::npos; }
  static json config(int steps) {
    return {{"train_batch_size", 4},
            {"context_parallel", {{"size", cp() ? 2 : 1}}},
            {"train_micro_batch_size_per_gpu", 1},
            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}}}}},
            {"zero_optimization", {{"stage", 1}}},
            {"model", {{"type", "gpt2"}, {"n_layer", 2}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 32}, {"seq_len", 16}}},
            {"data", {{"train", *dir_ / "train.bin"}}},
            {"training", {{"steps", steps}, {"seed", 3}, {"log_interval", 1}}}};
  }
  // A 4-rank job training `steps` steps on this test's backend, with comm_timeout kCommTimeout;
  // returns once `logged` steps are in its metrics file (or 120 s passed).
  std::unique_ptr<test::JobProcess> start(const std::string& name, int steps, size_t logged,
                                                 std::string* metrics) {
    const std::string tag = backend() + (cp() ? "_cp" : "");
    fs::remove_all(log_dir(name));
    const std::string cfg = *dir_ / (name + "_" + tag + ".json");
    *metrics = *dir_ / (name + "_" + tag + ".jsonl");
    std::ofstream(cfg) << config(steps).dump();
    auto job = std::make_unique<test::JobProcess>(
        std::vector<std::string>{DS_DSTRAIN_BIN, "launch", "--nproc-per-node", "4", "--master-port", "0", "--kill-timeout", "5",
                                 "--log-dir", log_dir(name), "--",
                                 DS_DSTRAIN_BIN, "train", "--config", cfg, "--metrics", *metrics,
                                 "--comm-timeout", std::to_string(kCommTimeout)},
        std::string{}, std::vector<std::string>{"OMP_NUM_THREADS=1", "DSTRAIN_COMM_BACKEND=" + backend()},
        std::vector<std::string>{"DSTRAIN_STORE", "RANK", "WORLD_SIZE"});
    const auto until = std::chrono::steady_clock::now() + 120s;
    while (test::nonempty_lines(*metrics) < logged && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(50ms);
    }
    return job;
  }
  static std::string log_dir(const std::string& name) {
    return *dir_ / ("logs_" + name + "_" + backend() + (cp() ? "_cp" : ""));
  }
  static TempDir* dir_;
};
TempDir* Hangs::dir_ = nullptr;

TEST_P(Hangs, AStoppedRankIsNamedWithinTheCommTimeout) {
  std::string metrics;
  auto job_ptr = start("stop", 1000000, 3, &metrics);
  test::JobProcess& job = *job_ptr;
  ASSERT_GE(test::nonempty_lines(metrics), 3u) << job.err();
  auto ranks = ranks_of(job.pid());
  ASSERT_EQ(ranks.size(), 4u) << job.err();
  const std::vector<pid_t> pids = track_all(job, ranks);
  ASSERT_EQ(::kill(ranks[2], SIGSTOP), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = job.wait(std::chrono::milliseconds(static_cast<int>(kCommTimeout * 1000)) + 60s);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::kill(ranks[2], SIGCONT);
  ASSERT_NE(rc, -1) << "still running after " << took << " s\n" << job.err();
  EXPECT_NE(rc, 0);
  EXPECT_LE(took, kCommTimeout + 10) << job.err();
  const std::string err = job.err();
  // Named by its world rank: "rank 2 (vm)" where a world peer saw it first, "rank 0 (world rank 2,
  // vm)" where a peer of a smaller group (cp, tp) did.
  EXPECT_TRUE(err.find("rank 2 (") != std::string::npos || err.find("(world rank 2,") != std::string::npos) << err;
  EXPECT_NE(err.find("made no progress"), std::string::npos) << err;
  EXPECT_TRUE(test::wait_gone(pids, 15s).empty()) << "a rank outlived the job";
  // The summary names the stopped rank as the hung one, not the first rank to exit.
  EXPECT_NE(err.find("dstrain: job failed: rank 2 on "), std::string::npos) << err;
  EXPECT_NE(err.find(" hung: it made no progress for "), std::string::npos) << err;
  // The waiting ranks' flight records are in the log dir (the stopped one writes its own only
  // when the teardown's SIGCONT lets it see its group fail before SIGTERM ends it), and the
  // analysis names rank 2.
  for (int r : {0, 1, 3}) {
    EXPECT_TRUE(fs::exists(log_dir("stop") + "/flight_" + std::to_string(r) + ".json")) << r << "\n" << err;
  }
  const auto hang = test::run_command(std::string(DS_DSTRAIN_BIN) + " debug hang " + log_dir("stop"));
  EXPECT_EQ(hang.exit_code, 0) << hang.out << hang.err;
  EXPECT_NE(hang.out.find("verdict: rank 2 is behind"), std::string::npos) << hang.out;
  // ... and the operation and sequence number the others wait in ("wait in #57 all_reduce").
  EXPECT_TRUE(std::regex_search(hang.out, std::regex("waits? in #[0-9]+ [a-z_]+ \\("))) << hang.out;
  std::cerr << "[ report ] " << GetParam() << ":\n" << hang.out;
  std::cerr << "[ figure ] " << GetParam() << ": SIGSTOP to a failed job and teardown in " << took
            << " s with comm_timeout " << kCommTimeout << " s\n";
}

// A rank stopped for 2.5x the timeout in small slices (SIGSTOP/SIGCONT, 60% of the time stopped)
// keeps making progress between them: slow, not hung. The job finishes.
TEST_P(Hangs, ASlowRankIsNotAHungOne) {
  std::string metrics;
  auto job_ptr = start("slow", 400, 2, &metrics);
  test::JobProcess& job = *job_ptr;
  auto ranks = ranks_of(job.pid());
  ASSERT_EQ(ranks.size(), 4u) << job.err();
  for (auto& [r, p] : ranks) job.track(p);
  const auto slow_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int>(2500 * kCommTimeout));
  while (std::chrono::steady_clock::now() < slow_until) {
    ::kill(ranks[1], SIGSTOP);
    std::this_thread::sleep_for(300ms);
    ::kill(ranks[1], SIGCONT);
    std::this_thread::sleep_for(200ms);
  }
  EXPECT_EQ(job.wait(300s), 0) << job.err();
  EXPECT_EQ(test::nonempty_lines(metrics), 400u);
}

// kill -USR2 of the launcher: every rank writes flight_<rank>.json ("dump signal") and goes on.
TEST_P(Hangs, TheDumpSignalWritesEveryRanksRecordAndStopsNothing) {
  if (GetParam() != "shm") GTEST_SKIP() << "one backend is enough: the signal path is the launcher's";
  std::string metrics;
  auto job_ptr = start("usr2", 1000000, 2, &metrics);
  test::JobProcess& job = *job_ptr;
  auto ranks = ranks_of(job.pid());
  ASSERT_EQ(ranks.size(), 4u) << job.err();
  const std::vector<pid_t> pids = track_all(job, ranks);
  job.signal(SIGUSR2);
  const auto until = std::chrono::steady_clock::now() + 20s;
  auto dumped = [&] {
    for (int r = 0; r < 4; ++r) {
      if (!fs::exists(log_dir("usr2") + "/flight_" + std::to_string(r) + ".json")) return false;
    }
    return true;
  };
  while (!dumped() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(dumped()) << job.err();
  for (int r = 0; r < 4; ++r) {
    const auto d = json::parse(test::slurp(log_dir("usr2") + "/flight_" + std::to_string(r) + ".json"));
    EXPECT_EQ(d["reason"], "dump signal");
    EXPECT_EQ(d["world_rank"], r);
    EXPECT_FALSE(d["entries"].empty());
  }
  // Still training: more steps get logged after the dump.
  const size_t before = test::nonempty_lines(metrics);
  const auto more = std::chrono::steady_clock::now() + 60s;
  while (test::nonempty_lines(metrics) < before + 2 && std::chrono::steady_clock::now() < more) std::this_thread::sleep_for(50ms);
  EXPECT_GE(test::nonempty_lines(metrics), before + 2) << job.err();
  job.signal(SIGTERM);
  EXPECT_NE(job.wait(60s), -1);
  EXPECT_TRUE(test::wait_gone(pids, 15s).empty()) << "a rank outlived the job";
}

INSTANTIATE_TEST_SUITE_P(Backends, Hangs, ::testing::Values("shm", "gloo", "shm+cp", "gloo+cp"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (auto& c : n) c = c == '+' ? '_' : c;
                           return n;
                         });

}  // namespace
}  // namespace ds
