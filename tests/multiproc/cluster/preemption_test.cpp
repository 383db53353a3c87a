// Preemption through the launcher, on this machine: the signal named by --preempt-signal
// (SIGUSR1, as `sbatch --signal=USR1@60` sends) reaches `dstrain launch`, which forwards it to
// every rank; the ranks finish their step, write a checkpoint and exit 75, and the launcher says
// "preempted" and exits 75. A restarted generation (DSTRAIN_RESTART_COUNT 1, what --max-restarts
// sets) resumes from that checkpoint without --resume and ends on the uninterrupted run's loss,
// bit for bit.
#include <signal.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "multiproc/cluster/cluster_job.h"
#include "multiproc/train/train_job.h"

namespace ds {
namespace {

using namespace std::chrono_literals;
using test::JobProcess;
using test::TempDir;

TEST(LaunchPreemption, APreemptSignalCheckpointsEveryRankAndARestartResumesBitForBit) {
  TempDir dir;
  test::write_cluster_tokens(dir / "train.bin");
  constexpr int kSteps = 600;
  auto full = test::run_train_job(dir.path(), "full", 2,
                                  test::cluster_config(dir / "train.bin", kSteps), {}, 180s);
  ASSERT_EQ(full.rc, 0) << full.err;

  const std::string ckpt = dir / "ckpt";
  std::ofstream(dir / "cfg.json") << test::cluster_config(dir / "train.bin", kSteps, ckpt).dump();
  auto launch = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {
        DS_DSTRAIN_BIN,     "launch", "--nproc-per-node", "2", "--env", "OMP_NUM_THREADS=1",
        "--preempt-signal", "USR1",   "--kill-timeout",   "30", "--master-port", "0"};
    a.insert(a.end(), extra.begin(), extra.end());
    for (const std::string& w :
         {std::string("--"), std::string(DS_DSTRAIN_BIN), std::string("train"),
          std::string("--config"), dir / "cfg.json", std::string("--metrics"), dir / "m.jsonl"}) {
      a.push_back(w);
    }
    return a;
  };
  std::vector<std::string> unset = {"DSTRAIN_STORE", "RANK", "WORLD_SIZE", "DSTRAIN_RESTART_COUNT",
                                    "SLURM_RESTART_COUNT"};
  JobProcess first(launch({}), dir.path(), {"OMP_NUM_THREADS=1"}, unset);
  auto until = std::chrono::steady_clock::now() + 60s;
  while (test::read_metrics(dir / "m.jsonl").size() < 5 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(10ms);
  }
  first.signal(SIGUSR1);
  ASSERT_EQ(first.wait(60s), 75) << first.err();
  EXPECT_NE(first.err().find(
                "dstrain: job preempted: all 2 rank(s) finished their step, wrote a checkpoint and "
                "exited 75"),
            std::string::npos)
      << first.err();
  const auto before = test::read_metrics(dir / "m.jsonl");
  ASSERT_LT(before.size(), static_cast<size_t>(kSteps))
      << "the run ended before the signal arrived";
  const int stopped = before.back().at("step").get<int>();
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/step_" + fmt::format("{:08d}", stopped)))
      << "step " << stopped;

  JobProcess again(launch({"--env", "DSTRAIN_RESTART_COUNT=1"}), dir.path(), {"OMP_NUM_THREADS=1"},
                   unset);
  ASSERT_EQ(again.wait(120s), 0) << again.err();
  EXPECT_NE(again.err().find("resuming from the latest checkpoint in " + ckpt), std::string::npos)
      << again.err();
  const auto all = test::read_metrics(dir / "m.jsonl");
  ASSERT_EQ(all.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(all[static_cast<size_t>(stopped)].at("step").get<int>(), stopped + 1);
  EXPECT_EQ(all.back().at("loss").get<double>(), full.metrics.back().at("loss").get<double>());
}

}  // namespace
}  // namespace ds
