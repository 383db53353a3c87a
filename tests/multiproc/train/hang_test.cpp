// Hung ranks on real 4-rank training jobs: one rank is stopped (SIGSTOP) mid-training, and the
// job must end within comm_timeout + 10 s, naming that rank, with no process left, through both
// host backends (shm and Gloo), and with context parallelism (cp 2 x dp 2: the stopped rank's
// ring partner waits in the ring attention's send/recv). And a slow rank is not a hung one: a rank that keeps making
// progress but is much slower than comm_timeout per step does not trip it.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/token_file.h"
#include "multiproc/launch/job_process.h"
#include "multiproc/train/train_job.h"

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
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    std::ifstream st(e.path() / "stat");
    std::string line;
    std::getline(st, line);
    const auto rp = line.rfind(')');
    if (rp == std::string::npos) continue;
    std::istringstream rest(line.substr(rp + 2));
    char state;
    pid_t ppid;
    rest >> state >> ppid;
    if (ppid != launcher) continue;
    std::ifstream env(e.path() / "environ", std::ios::binary);
    std::string kv;
    while (std::getline(env, kv, '\0')) {
      if (kv.rfind("RANK=", 0) == 0) out[std::stoi(kv.substr(5))] = std::stoi(name);
    }
  }
  return out;
}

size_t lines_in(const std::string& path) {
  std::ifstream in(path);
  size_t n = 0;
  std::string l;
  while (std::getline(in, l)) n += !l.empty();
  return n;
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
    const std::string cfg = *dir_ / (name + "_" + tag + ".json");
    *metrics = *dir_ / (name + "_" + tag + ".jsonl");
    std::ofstream(cfg) << config(steps).dump();
    auto job = std::make_unique<test::JobProcess>(
        std::vector<std::string>{DS_DSTRAIN_BIN, "launch", "--nproc-per-node", "4", "--master-port", "0", "--kill-timeout", "5", "--",
                                 DS_DSTRAIN_BIN, "train", "--config", cfg, "--metrics", *metrics,
                                 "--comm-timeout", std::to_string(kCommTimeout)},
        std::string{}, std::vector<std::string>{"OMP_NUM_THREADS=1", "DSTRAIN_COMM_BACKEND=" + backend()},
        std::vector<std::string>{"DSTRAIN_STORE", "RANK", "WORLD_SIZE"});
    const auto until = std::chrono::steady_clock::now() + 120s;
    while (lines_in(*metrics) < logged && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(50ms);
    }
    return job;
  }
  static TempDir* dir_;
};
TempDir* Hangs::dir_ = nullptr;

TEST_P(Hangs, AStoppedRankIsNamedWithinTheCommTimeout) {
  std::string metrics;
  auto job_ptr = start("stop", 1000000, 3, &metrics);
  test::JobProcess& job = *job_ptr;
  ASSERT_GE(lines_in(metrics), 3u) << job.err();
  auto ranks = ranks_of(job.pid());
  ASSERT_EQ(ranks.size(), 4u) << job.err();
  std::vector<pid_t> pids;
  for (auto& [r, p] : ranks) {
    pids.push_back(p);
    job.track(p);
  }
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
  EXPECT_EQ(lines_in(metrics), 400u);
}

INSTANTIATE_TEST_SUITE_P(Backends, Hangs, ::testing::Values("shm", "gloo", "shm+cp", "gloo+cp"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (auto& c : n) c = c == '+' ? '_' : c;
                           return n;
                         });

}  // namespace
}  // namespace ds
