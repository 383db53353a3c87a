// Asynchronous checkpoints (training.checkpoint_async) on real 2-rank jobs under `dstrain launch`:
//   - an async run's checkpoints equal a sync run's bit for bit (every shard; the manifest but for
//     the config's checkpoint settings and the checksum over them), and the wait
//     for the previous write is in the metrics (checkpoint_wait_ms);
//   - a resume from an async checkpoint continues the uninterrupted curve bit for bit, and ends
//     with the same final checkpoint;
//   - SIGKILL of a rank or of the launcher at random moments while writes are in flight (8 times,
//     a seeded RNG, alternating): no process survives, `latest` verifies, and the resume ends bit
//     for bit where the uninterrupted run ends;
//   - preemption (SIGTERM) flushes and commits the step it stopped at before the ranks exit 75;
//   - a full disk (a small tmpfs) during a write, and a write over the file-size limit (the
//     fallback where no tmpfs can be mounted, see checkpoint_integrity_test.cpp),
//     stops the job with an error naming the file and the step, and leaves the previous checkpoint
//     as `latest`, which resumes bit-exact.
#include <dirent.h>
#include <sys/mount.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>
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

constexpr int kSteps = 12;

// The pids of every live process whose command line mentions `needle` (a job's config path): the
// launcher and its ranks.
std::vector<pid_t> processes_mentioning(const std::string& needle) {
  std::vector<pid_t> out;
  for (pid_t pid : test::all_pids()) {
    const std::string cmd = test::cmdline_of(pid);
    if (pid != ::getpid() && cmd.find(needle) != std::string::npos && test::pid_alive(pid)) out.push_back(pid);
  }
  return out;
}

class CheckpointAsync : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::vector<uint16_t> toks(20000);
    std::mt19937 rng(5);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>((i * 3 + i / 5 + rng() % 3) % 31);
    rt::data::write_token_file(*dir_ / "train.bin", toks);
    // The uninterrupted run, sync checkpoints every 4 steps: the reference of every test.
    sync_root_ = new std::string(*dir_ / "sync");
    auto r = run(config(*sync_root_, 4, false), {});
    ASSERT_EQ(r.rc, 0) << r.err;
    ASSERT_EQ(r.metrics.size(), static_cast<size_t>(kSteps));
    baseline_ = new std::vector<json>(r.metrics);
  }
  static void TearDownTestSuite() {
    delete baseline_;
    delete sync_root_;
    delete dir_;
  }
  static json config(const std::string& ckpt_dir, int interval, bool async, int keep_last = 0) {
    json training = {{"steps", kSteps}, {"seed", 3}, {"log_interval", 1}, {"checkpoint_dir", ckpt_dir},
                     {"checkpoint_interval", interval}, {"keep_last", keep_last}, {"checkpoint_async", async}};
    return {{"train_batch_size", 4},
            {"train_micro_batch_size_per_gpu", 1},
            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}}}}},
            {"zero_optimization", {{"stage", 1}}},
            {"model", {{"type", "gpt2"}, {"n_layer", 2}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 32}, {"seq_len", 16}}},
            {"data", {{"train", *dir_ / "train.bin"}}},
            {"training", training}};
  }
  static std::string next_name() {
    static int counter = 0;
    return "run" + std::to_string(counter++);
  }
  static test::TrainJobResult run(const json& cfg, const std::vector<std::string>& extra,
                                  const std::string& name = next_name()) {
    return test::run_train_job(dir_->path(), name, 2, cfg, extra, 120s);
  }
  // The losses of `r` equal the uninterrupted run's, bit for bit, from its first step on.
  static void expect_continues(const test::TrainJobResult& r, const std::string& what) {
    ASSERT_EQ(r.rc, 0) << what << "\n" << r.err;
    for (const json& m : r.metrics) {
      const int step = m.at("step").get<int>();
      ASSERT_GE(step, 1);
      ASSERT_LE(step, kSteps);
      EXPECT_EQ(m.at("loss").get<double>(), (*baseline_)[static_cast<size_t>(step - 1)].at("loss").get<double>())
          << what << ": step " << step;
    }
    if (!r.metrics.empty()) {
      EXPECT_EQ(r.metrics.back().at("step").get<int>(), kSteps) << what;
    }
  }
  // Every shard of step directory `a` equals `b`'s byte for byte; the manifests are equal but for
  // the config's checkpoint settings (dir, async, interval, keep_last) and the checksum over them.
  static void expect_same_checkpoint(const std::string& a, const std::string& b) {
    for (const char* shard : {"rank_00000.bin", "rank_00001.bin"}) {
      ASSERT_TRUE(fs::exists(a + "/" + shard)) << a;
      ASSERT_TRUE(fs::exists(b + "/" + shard)) << b;
      EXPECT_TRUE(test::slurp(a + "/" + shard) == test::slurp(b + "/" + shard)) << a << " vs " << b << ": " << shard;
    }
    auto strip = [](const std::string& dir) {
      json m = json::parse(test::slurp(dir + "/manifest.json"));
      m.erase("crc32c");
      for (const char* key : {"checkpoint_dir", "checkpoint_async", "checkpoint_interval", "keep_last"}) {
        m["config"]["training"].erase(key);
      }
      return m;
    };
    EXPECT_EQ(strip(a), strip(b)) << a << " vs " << b;
  }
  // Starts `dstrain launch` of 2 ranks on `cfg` (written to <name>.json, metrics to <name>.jsonl)
  // without waiting.
  static std::unique_ptr<test::JobProcess> start_job(const std::string& name, const json& cfg) {
    const std::string cfg_path = *dir_ / (name + ".json");
    std::ofstream(cfg_path) << cfg.dump(2);
    const std::string bin = test::dstrain();
    return std::make_unique<test::JobProcess>(
        std::vector<std::string>{bin, "launch", "--nproc-per-node", "2", "--master-port", "0", "--env",
                                 "OMP_NUM_THREADS=1", "--kill-timeout", "5", "--", bin, "train", "--config", cfg_path,
                                 "--metrics", *dir_ / (name + ".jsonl")},
        "", std::vector<std::string>{"OMP_NUM_THREADS=1"},
        std::vector<std::string>{"DSTRAIN_STORE", "RANK", "WORLD_SIZE"});
  }
  // Waits (up to 60 s) until the metrics file has `lines` lines, calling `each` every millisecond.
  static bool wait_for_step(const std::string& metrics, int lines, const std::function<void()>& each) {
    const auto started = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - started < 60s) {
      const std::string text = test::slurp(metrics);
      if (std::count(text.begin(), text.end(), '\n') >= lines) return true;
      each();
      std::this_thread::sleep_for(1ms);
    }
    return false;
  }
  static std::string latest_of(const std::string& root) {
    std::string l = test::slurp(root + "/latest");
    while (!l.empty() && l.back() == '\n') l.pop_back();
    return l;
  }
  static inline TempDir* dir_ = nullptr;
  static inline std::string* sync_root_ = nullptr;
  static inline std::vector<json>* baseline_ = nullptr;
};

TEST_F(CheckpointAsync, AsyncCheckpointsEqualSyncOnesBitForBit) {
  const std::string root = *dir_ / "async";
  const auto r = run(config(root, 4, true), {});
  expect_continues(r, "async run");
  ASSERT_EQ(r.metrics.size(), static_cast<size_t>(kSteps));
  for (int step : {4, 8, 12}) {
    SCOPED_TRACE(step);
    const std::string name = fmt::format("/step_{:08d}", step);
    expect_same_checkpoint(root + name, *sync_root_ + name);
    EXPECT_TRUE(r.metrics[static_cast<size_t>(step - 1)].contains("checkpoint_wait_ms"));
  }
  EXPECT_FALSE(r.metrics[0].contains("checkpoint_wait_ms"));
  EXPECT_EQ(latest_of(root), "step_00000012");
  EXPECT_NE(r.err.find("saved checkpoint " + root + "/step_00000012 (async)"), std::string::npos) << r.err;
  const auto v = test::run_command(test::dstrain() + " checkpoint verify " + root);
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
}

TEST_F(CheckpointAsync, AResumeFromAnAsyncCheckpointContinuesBitExact) {
  const std::string root = *dir_ / "async_resume";
  const auto first = run(config(root, 4, true), {"--max-steps", "8"});
  ASSERT_EQ(first.rc, 0) << first.err;
  // --max-steps is a deliberate exit: the last write was committed before it.
  EXPECT_EQ(latest_of(root), "step_00000008");
  const auto resumed = run(config(root, 4, true), {"--resume"});
  expect_continues(resumed, "resumed");
  ASSERT_EQ(resumed.metrics.size(), 4u);
  EXPECT_EQ(resumed.metrics.front().at("step").get<int>(), 9);
  expect_same_checkpoint(root + "/step_00000012", *sync_root_ + "/step_00000012");
}

// Kills at random moments of a run that writes a checkpoint every step (keep_last 2: the writer
// prunes too), alternating a rank and the launcher; each time nothing survives, `latest` (when
// there is one) verifies, and the resumed run ends on the uninterrupted run's final checkpoint.
TEST_F(CheckpointAsync, KilledAtRandomMomentsResumesBitExact) {
  // The uninterrupted async run.
  const auto whole = run(config(*dir_ / "kill_whole", 1, true, 2), {});
  expect_continues(whole, "uninterrupted async run");
  // The moment: a random step's metrics line (rank 0 reports a step after its checkpoint's write
  // started, so that write is then in flight), then a random 0-5 ms more.
  std::mt19937 rng(20261205);
  std::uniform_int_distribution<int> at_step(1, kSteps - 1);
  std::uniform_real_distribution<double> when(0.0, 0.005);
  for (int i = 0; i < 8; ++i) {
    const bool kill_launcher = i % 2 == 1;
    const std::string root = *dir_ / ("kill" + std::to_string(i));
    const std::string name = "kill" + std::to_string(i);
    SCOPED_TRACE(name + (kill_launcher ? ": the launcher" : ": rank 1"));
    const json cfg = config(root, 1, true, 2);
    const std::string cfg_path = *dir_ / (name + ".json");
    const std::string bin = test::dstrain();
    auto job = start_job(name, cfg);
    std::vector<pid_t> ranks;
    auto note_ranks = [&] {
      const auto c = test::children_of(job->pid());
      if (c.size() > ranks.size()) ranks = c;
    };
    const int step = at_step(rng);
    wait_for_step(*dir_ / (name + ".jsonl"), step, note_ranks);
    const double delay = when(rng);
    const auto seen = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - seen < std::chrono::duration<double>(delay)) {
      note_ranks();
      std::this_thread::sleep_for(1ms);
    }
    for (pid_t p : ranks) job->track(p);
    std::cout << name << ": SIGKILL " << (kill_launcher ? "the launcher" : "a rank") << " " << delay
              << " s after step " << step << "'s metrics line\n";
    if (kill_launcher) {
      job->signal(SIGKILL);
    } else if (!ranks.empty()) {
      ::kill(ranks.back(), SIGKILL);
    }
    const int rc = job->wait(60s);
    EXPECT_NE(rc, -1) << "the launcher did not exit";
    EXPECT_TRUE(test::wait_gone(ranks, 20s).empty()) << "a rank survived";
    EXPECT_TRUE(processes_mentioning(cfg_path).empty()) << "a process of the job survived";
    std::string in_flight;  // a temporary directory left: a write was cut off
    if (fs::exists(root)) {
      for (const auto& e : fs::directory_iterator(root)) {
        if (e.path().filename().string().rfind(".tmp-", 0) == 0) in_flight += " " + e.path().filename().string();
      }
    }
    std::cout << name << ": latest after the kill: " << (fs::exists(root + "/latest") ? latest_of(root) : "none")
              << (in_flight.empty() ? "" : ", cut off:" + in_flight) << "\n";
    if (fs::exists(root + "/latest")) {
      const auto v = test::run_command(bin + " checkpoint verify " + root + "/" + latest_of(root));
      EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
    }
    const auto resumed = run(cfg, {"--resume"}, name + "_resumed");
    expect_continues(resumed, name + " resumed");
    std::cout << name << ": resumed at step "
              << (resumed.metrics.empty() ? kSteps + 1 : resumed.metrics.front().at("step").get<int>()) << "\n";
    EXPECT_EQ(latest_of(root), "step_00000012");
    expect_same_checkpoint(root + "/step_00000012", *sync_root_ + "/step_00000012");
    const auto v = test::run_command(bin + " checkpoint verify " + root + "/step_00000012");
    EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
    EXPECT_TRUE(processes_mentioning(*dir_ / (name + "_resumed.json")).empty())
        << "a process of the resumed job survived";
  }
}

// Preemption (SIGTERM to the launcher, forwarded to every rank) flushes the write in flight and
// commits the preempted step before the ranks exit 75; the resume continues bit-exact.
TEST_F(CheckpointAsync, PreemptionFlushesAndCommitsBeforeExit) {
  const std::string root = *dir_ / "preempted";
  const std::string name = "preempted";
  const json cfg = config(root, 1, true);
  const std::string cfg_path = *dir_ / (name + ".json"), metrics = *dir_ / (name + ".jsonl");
  std::ofstream(cfg_path) << cfg.dump(2);
  const std::string bin = test::dstrain();
  test::JobProcess job({bin, "launch", "--nproc-per-node", "2", "--master-port", "0", "--env", "OMP_NUM_THREADS=1",
                        "--kill-timeout", "5", "--", bin, "train", "--config", cfg_path, "--metrics", metrics},
                       "", {"OMP_NUM_THREADS=1"}, {"DSTRAIN_STORE", "RANK", "WORLD_SIZE"});
  const auto started = std::chrono::steady_clock::now();
  while (!(fs::exists(metrics) && fs::file_size(metrics) > 0) && std::chrono::steady_clock::now() - started < 60s) {
    std::this_thread::sleep_for(1ms);
  }
  job.signal(SIGTERM);
  const int rc = job.wait(60s);
  if (rc == 0) GTEST_SKIP() << "the run ended before the signal reached it";
  ASSERT_EQ(rc, 75) << job.err();
  int last = 0;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) last = json::parse(line).at("step").get<int>();
  }
  ASSERT_GT(last, 0);
  EXPECT_LT(last, kSteps);
  EXPECT_EQ(latest_of(root), fmt::format("step_{:08d}", last)) << job.err();
  EXPECT_NE((job.out() + job.err()).find("async checkpoint flushed"), std::string::npos) << job.out() << job.err();
  const auto resumed = run(cfg, {"--resume"}, name + "_resumed");
  expect_continues(resumed, "resumed after preemption");
  ASSERT_FALSE(resumed.metrics.empty());
  EXPECT_EQ(resumed.metrics.front().at("step").get<int>(), last + 1);
}

// A full disk (a tmpfs with room for two checkpoints, not three) during the write of step 12: the
// flush at the end raises it, naming the step and the cause; step 8 stays `latest`, verifies and
// resumes bit-exact. Skipped where mounting a tmpfs is not allowed (the file-size test below is
// the fallback).
TEST_F(CheckpointAsync, AFullDiskDuringAnAsyncWriteKeepsThePreviousCheckpoint) {
  uint64_t one = 0;  // one checkpoint's bytes on disk, from the sync run
  for (const auto& e : fs::recursive_directory_iterator(*sync_root_ + "/step_00000004")) {
    if (e.is_regular_file()) one += (e.file_size() + 4095) / 4096 * 4096;
  }
  const std::string root = *dir_ / "async_full";
  fs::create_directories(root);
  const std::string opts = "size=" + std::to_string(2 * one + one / 2);
  if (::mount("tmpfs", root.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
    GTEST_SKIP() << "mounting a tmpfs is not allowed here";
  }
  const auto r = run(config(root, 4, true), {});
  EXPECT_NE(r.rc, 0);
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("async checkpoint of step 12 failed"), std::string::npos) << all;
  EXPECT_NE(all.find("No space left on device"), std::string::npos) << all;
  EXPECT_NE(all.find(root + "/step_00000008 is still `latest`"), std::string::npos) << all;
  EXPECT_FALSE(fs::exists(root + "/step_00000012"));
  EXPECT_EQ(latest_of(root), "step_00000008");
  const auto v = test::run_command(test::dstrain() + " checkpoint verify " + root + "/step_00000008");
  EXPECT_EQ(v.exit_code, 0) << v.out;
  const std::string copy = *dir_ / "async_full_copy";
  fs::copy(root, copy, fs::copy_options::recursive);
  ::umount2(root.c_str(), MNT_DETACH);
  const auto resumed = run(config(copy, 4, true), {"--resume"});
  expect_continues(resumed, "resumed after the full disk");
  ASSERT_FALSE(resumed.metrics.empty());
  EXPECT_EQ(resumed.metrics.front().at("step").get<int>(), 9);
}

// RLIMIT_FSIZE below one shard (a full disk's fallback, as in checkpoint_integrity_test.cpp): the
// write of step 8 fails on the writer threads; the job stops at its next checkpoint with an error
// naming the file and the step; step 4 stays `latest` and resumes bit-exact.
TEST_F(CheckpointAsync, AWriteOverTheFileSizeLimitStopsTheJobAndKeepsThePreviousCheckpoint) {
  const std::string root = *dir_ / "async_limited";
  ASSERT_EQ(run(config(root, 4, true), {"--max-steps", "4"}).rc, 0);
  ASSERT_EQ(latest_of(root), "step_00000004");
  const std::string cfg = *dir_ / "async_limited.json";
  std::ofstream(cfg) << config(root, 4, true).dump(2);
  // Gloo: the shm backend's segments are files too, which the limit would refuse.
  const auto r = test::run_command("ulimit -f 4; env -u DSTRAIN_STORE -u RANK -u WORLD_SIZE OMP_NUM_THREADS=1 "
                                   "DSTRAIN_COMM_BACKEND=gloo " +
                                   test::dstrain() + " launch --nproc-per-node 2 --kill-timeout 5 -- " +
                                   test::dstrain() + " train --resume --config " + cfg);
  EXPECT_NE(r.exit_code, 0);
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("async checkpoint of step 8 failed"), std::string::npos) << all;
  EXPECT_NE(all.find("File too large"), std::string::npos) << all;
  EXPECT_NE(all.find("the file needs"), std::string::npos) << all;
  EXPECT_NE(all.find(".tmp-step_00000008/rank_0000"), std::string::npos) << all;  // the file
  EXPECT_NE(all.find(root + "/step_00000004 is still `latest`"), std::string::npos) << all;
  EXPECT_FALSE(fs::exists(root + "/step_00000008"));
  EXPECT_FALSE(fs::exists(root + "/step_00000012"));
  EXPECT_EQ(latest_of(root), "step_00000004");
  const auto resumed = run(config(root, 4, true), {"--resume"});
  expect_continues(resumed, "resumed after the failed write");
  ASSERT_FALSE(resumed.metrics.empty());
  EXPECT_EQ(resumed.metrics.front().at("step").get<int>(), 5);
}

}  // namespace
}  // namespace ds
