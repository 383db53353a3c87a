// dstrain on a real two-node Slurm cluster on this machine (slurm_cluster.h: munged, slurmctld,
// `slurmd -N n1` and `-N n2`): `dstrain launch --launcher slurm` in an sbatch job and `srun
// dstrain train` in direct mode train the same curve as `dstrain launch --nproc-per-node 4`;
// scancel leaves no process on either node; `scontrol requeue` of a running job makes every rank
// write a checkpoint and exit 75, and the requeued job resumes by itself and ends on the
// uninterrupted run's final loss, bit for bit. Skips itself where Slurm cannot run (not root,
// slurm-wlm or munge missing).
#include <gtest/gtest.h>

#include "launch/slurm.h"
#include "multiproc/cluster/cluster_job.h"
#include "multiproc/cluster/slurm_cluster.h"
#include "multiproc/train/train_job.h"

namespace ds {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using test::JobProcess;
using test::TempDir;

constexpr int kCurveSteps = 20;
constexpr int kLongSteps = 600;  // long enough that a requeue lands mid-run

class SlurmJobs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = new test::SlurmCluster();
    dir_ = new TempDir();
    if (!cluster_->skip_reason.empty()) return;
    test::write_cluster_tokens(*dir_ / "train.bin");
    auto r = test::run_train_job(dir_->path(), "reference", 4, config(kCurveSteps), {}, 120s);
    ASSERT_EQ(r.rc, 0) << r.err;
    reference_ = new std::vector<double>(test::losses_of(r.metrics));
  }
  static void TearDownTestSuite() {
    delete cluster_;
    delete dir_;
    delete reference_;
  }
  void SetUp() override {
    if (!cluster_->skip_reason.empty()) GTEST_SKIP() << cluster_->skip_reason;
  }

  static json config(int steps, const std::string& ckpt = "") {
    return test::cluster_config(*dir_ / "train.bin", steps, ckpt);
  }
  static std::string write(const std::string& name, const std::string& text) {
    std::string path = *dir_ / name;
    std::ofstream(path) << text;
    return path;
  }

  // A batch script that execs `dstrain launch --launcher slurm` (2 nodes x 2 ranks) of `cfg`. The
  // kill timeout (and the cluster's KillWait) leave a preempted step and its checkpoint room on a
  // loaded 2-core machine; a healthy run never waits for them.
  static std::string launch_script(const std::string& name, const json& cfg,
                                   const std::string& extra = "") {
    std::string c = write(name + ".json", cfg.dump());
    return write(name + ".sh", "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2\nexec " +
                                   std::string(DS_DSTRAIN_BIN) +
                                   " launch --launcher slurm --master-addr 127.0.0.1 " +
                                   "--env OMP_NUM_THREADS=1 --kill-timeout 40 " + extra + " -- " +
                                   DS_DSTRAIN_BIN + " train --config " + c + " --metrics " +
                                   (*dir_ / (name + ".jsonl")) + "\n");
  }

  static std::vector<std::string> env() {
    auto e = cluster_->env();
    e.push_back("OMP_NUM_THREADS=1");
    return e;
  }
  static std::vector<std::string> unset() {
    return {"DSTRAIN_STORE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_JOB_ID"};
  }

  // sbatch's job id of `script` (not waiting for it).
  static std::string submit(const std::string& script, const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {"/usr/bin/sbatch", "--parsable", "-o", script + ".out"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back(script);
    JobProcess sb(argv, dir_->path(), env(), unset());
    EXPECT_EQ(sb.wait(30s), 0) << sb.err();
    std::string id = sb.out();
    return id.substr(0, id.find_first_of(";\n"));
  }

  static void expect_reference_curve(const std::string& metrics, const std::string& what) {
    auto got = test::losses_of(test::read_metrics(metrics));
    ASSERT_EQ(got.size(), reference_->size()) << what;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_LE(std::abs(got[i] - (*reference_)[i]), 1e-6 * std::abs((*reference_)[i]))
          << what << " step " << i + 1;
    }
  }

  static inline test::SlurmCluster* cluster_ = nullptr;
  static inline TempDir* dir_ = nullptr;
  static inline std::vector<double>* reference_ = nullptr;
};

TEST_F(SlurmJobs, OurNodelistExpansionAgreesWithScontrol) {
  for (const char* list :
       {"n[1-2]", "n[01-03,07],login", "r[1-2]n[3,5]", "gpu-a[8-10]", "node[001-003],x9"}) {
    auto r = cluster_->run(std::string("scontrol show hostnames '") + list + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::string ours;
    for (const auto& h : launch::expand_nodelist(list)) ours += h + "\n";
    EXPECT_EQ(ours, r.out) << list << ": " << r.err;
  }
}

TEST_F(SlurmJobs, SbatchOfLaunchSlurmTwoNodesTwoRanksMatchesTheLocalCurve) {
  std::string script = launch_script("sbatch_launch", config(kCurveSteps));
  JobProcess job({"/usr/bin/sbatch", "--wait", "-o", script + ".out", script}, dir_->path(), env(),
                 unset());
  ASSERT_EQ(job.wait(120s), 0) << job.err() << test::slurp(script + ".out");
  std::string out = test::slurp(script + ".out");
  EXPECT_NE(out.find("job finished: all 4 rank(s) exited 0"), std::string::npos) << out;
  expect_reference_curve(*dir_ / "sbatch_launch.jsonl", "sbatch + --launcher slurm");
}

TEST_F(SlurmJobs, SrunOfDstrainTrainInDirectModeMatchesTheLocalCurve) {
  std::string cfg = write("direct.json", config(kCurveSteps).dump());
  auto e = env();
  e.push_back("DSTRAIN_JOB_TOKEN=" +
              test::run_command(std::string(DS_DSTRAIN_BIN) + " token").out.substr(0, 64));
  e.push_back("MASTER_ADDR=127.0.0.1");
  e.push_back("DSTRAIN_STORE_PORT=" + std::to_string(test::free_tcp_port()));
  JobProcess job({"/usr/bin/srun", "-N", "2", "--ntasks-per-node=2", DS_DSTRAIN_BIN, "train",
                  "--config", cfg, "--metrics", *dir_ / "direct.jsonl"},
                 dir_->path(), e, unset());
  ASSERT_EQ(job.wait(120s), 0) << job.err() << job.out();
  expect_reference_curve(*dir_ / "direct.jsonl", "srun dstrain train");
}

TEST_F(SlurmJobs, ScancelMidRunLeavesNoProcessOnEitherNode) {
  TempDir pids;
  std::string script =
      write("scancel.sh", "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2\nexec " +
                              std::string(DS_DSTRAIN_BIN) + " launch --launcher slurm " +
                              "--master-addr 127.0.0.1 --kill-timeout 5 -- " + DS_TEST_WORKER_BIN +
                              " --pid-dir " + pids.path() + " --barrier --sleep 120\n");
  std::string id = submit(script, {});
  auto workers = test::read_pids(pids.path(), 4, 60s);
  ASSERT_EQ(workers.size(), 4u) << test::slurp(script + ".out");
  EXPECT_FALSE(test::processes_mentioning(pids.path()).empty());
  ASSERT_EQ(cluster_->run("scancel " + id).exit_code, 0);
  EXPECT_TRUE(test::SlurmCluster::wait_for(
      [&] { return test::processes_mentioning(pids.path()).empty(); }, 30s))
      << "left behind:\n"
      << test::processes_mentioning(pids.path()).front();
  EXPECT_TRUE(test::wait_gone(workers, 1s).empty());
  EXPECT_TRUE(test::SlurmCluster::wait_for([&] { return cluster_->stepd_pids().empty(); }, 30s))
      << "a slurmstepd of the job is still running";
}

TEST_F(SlurmJobs, RequeueCheckpointsAndTheRequeuedJobEndsOnTheUninterruptedLoss) {
  auto full = test::run_train_job(dir_->path(), "uninterrupted", 4, config(kLongSteps), {}, 180s);
  ASSERT_EQ(full.rc, 0) << full.err;
  std::string ckpt = *dir_ / "requeue_ckpt";
  std::string script = launch_script("requeue", config(kLongSteps, ckpt));
  std::string id = submit(script, {"--requeue", "--open-mode=append"});
  const std::string metrics = *dir_ / "requeue.jsonl";
  ASSERT_TRUE(
      test::SlurmCluster::wait_for([&] { return test::read_metrics(metrics).size() >= 5; }, 60s))
      << test::slurp(script + ".out");
  ASSERT_EQ(cluster_->run("scontrol requeue " + id).exit_code, 0);
  ASSERT_TRUE(test::SlurmCluster::wait_for(
      [&] {
        return cluster_->job_field(id, "JobState") == "COMPLETED" &&
               cluster_->job_field(id, "Restarts") == "1";
      },
      150s))
      << cluster_->job_field(id, "JobState") << "\n"
      << test::slurp(script + ".out");
  std::string out = test::slurp(script + ".out");
  // The launcher's summary of the first run: "job preempted" when every agent's exit-75 reports
  // reached it. On a requeue Slurm also cancels the step and srun then forces its tasks' end
  // ("srun: forcing job termination"), which can cut an agent's stream before its last reports
  // are relayed, or kill a rank before the launcher itself is signalled (is_teardown_death in
  // job_summary.h): the launcher then says "job interrupted by SIGTERM" (seen about 1 run in 20;
  // the second case, summed up as a failure before, failed this test in 2 of 4 full runs).
  // Either way every rank wrote the checkpoint, which is what the requeued run resumes from
  // (checked below, step by step).
  const bool preempted_summary = out.find("dstrain: job preempted: all 4 rank(s) finished their step, wrote a "
                                          "checkpoint and exited 75") != std::string::npos;
  const bool interrupted_summary = out.find("dstrain: job interrupted by SIGTERM") != std::string::npos;
  EXPECT_TRUE(preempted_summary || interrupted_summary) << out;
  EXPECT_NE(out.find("resuming from the latest checkpoint"), std::string::npos) << out;
  // The metrics hold the first run's steps 1..k and the requeued run's k+1..600, each once.
  auto m = test::read_metrics(metrics);
  ASSERT_EQ(m.size(), static_cast<size_t>(kLongSteps)) << out;
  for (size_t i = 0; i < m.size(); ++i) ASSERT_EQ(m[i].at("step").get<size_t>(), i + 1);
  bool preemption_checkpoint = false;
  for (const auto& e : std::filesystem::directory_iterator(ckpt)) {
    const std::string name = e.path().filename();
    if (name.rfind("step_", 0) == 0 && std::stoi(name.substr(5)) % 1000 != 0 &&
        std::stoi(name.substr(5)) < kLongSteps) {
      preemption_checkpoint = true;
    }
  }
  EXPECT_TRUE(preemption_checkpoint)
      << "no checkpoint between the intervals: the requeue wrote none";
  EXPECT_EQ(m.back().at("loss").get<double>(), full.metrics.back().at("loss").get<double>());
}

}  // namespace
}  // namespace ds
