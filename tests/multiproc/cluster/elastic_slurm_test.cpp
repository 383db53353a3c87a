// Elastic node count on the real two-node Slurm test cluster (slurm_cluster.h): `dstrain launch
// --launcher slurm --nnodes 1:2` in an sbatch job of 2 nodes x 2 ranks; node n2 is killed mid-run
// with SIGKILL (its slurmd, the step's slurmstepd there, its agent and its ranks). The job goes on
// on n1 within the allocation (a new srun step there), from the latest checkpoint, exits 0 with
// the uninterrupted run's final loss (within 1e-3), and leaves no process. A suite of its own: it
// kills a slurmd, so it runs its own cluster.
#include <signal.h>

#include <gtest/gtest.h>

#include "multiproc/cluster/cluster_job.h"
#include "multiproc/cluster/slurm_cluster.h"
#include "multiproc/train/train_job.h"
#include "support/proc_scan.h"

namespace ds {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using test::JobProcess;
using test::TempDir;
using test::env_of;
using test::parent_of;

// Training ranks whose environment has `key`=`value` and a RANK.
std::vector<pid_t> ranks_with(const std::string& key, const std::string& value) {
  std::vector<pid_t> out;
  for (pid_t p : test::all_pids()) {
    if (env_of(p, key) == value && !env_of(p, "RANK").empty() && !env_of(p, "DSTRAIN_JOB_ID").empty()) {
      out.push_back(p);
    }
  }
  return out;
}

TEST(ElasticSlurm, LosingNodeN2GoesOnOnN1WithTheSameLoss) {
  test::SlurmCluster cluster;
  if (!cluster.skip_reason.empty()) GTEST_SKIP() << cluster.skip_reason;
  TempDir dir;
  test::write_cluster_tokens(dir / "train.bin");
  constexpr int kSteps = 40;
  auto cfg = [&](const std::string& name) {
    json c = test::cluster_config(dir / "train.bin", kSteps, dir / ("ckpt_" + name));
    c["training"]["checkpoint_interval"] = 5;
    c["training"]["log_interval"] = 1;
    const std::string path = dir / (name + ".json");
    std::ofstream(path) << c.dump();
    return path;
  };
  // The uninterrupted run: 4 ranks on this machine, the same global batch (8).
  auto whole = test::run_train_job(dir.path(), "whole", 4, json::parse(test::slurp(cfg("whole"))), {}, 180s);
  ASSERT_EQ(whole.rc, 0) << whole.err;
  const double ref = test::losses_of(whole.metrics).back();

  const std::string metrics = dir / "elastic.jsonl";
  const std::string script = dir / "elastic.sh";
  std::ofstream(script) << "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2\nexec " << DS_DSTRAIN_BIN
                        << " launch --launcher slurm --master-addr 127.0.0.1 --nnodes 1:2 --env OMP_NUM_THREADS=1 "
                        << "--env DSTRAIN_ELASTIC_TEST=slurm --kill-timeout 10 --agent-timeout 5 -- " << DS_DSTRAIN_BIN
                        << " train --config " << cfg("elastic") << " --metrics " << metrics << "\n";
  auto env = cluster.env();
  env.push_back("OMP_NUM_THREADS=1");
  JobProcess job({"/usr/bin/sbatch", "--wait", "-o", script + ".out", script}, dir.path(), env,
                 {"DSTRAIN_STORE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_JOB_ID"});
  ASSERT_TRUE(test::SlurmCluster::wait_for([&] { return test::read_metrics(metrics).size() >= 12; }, 120s))
      << test::slurp(script + ".out");
  // Node n2: its ranks (NODE_RANK 1), their agent, the slurmstepd above it, and its slurmd.
  std::vector<pid_t> victims;
  for (pid_t p : ranks_with("DSTRAIN_ELASTIC_TEST", "slurm")) {
    if (env_of(p, "NODE_RANK") == "1") victims.push_back(p);
  }
  ASSERT_FALSE(victims.empty()) << test::slurp(script + ".out");
  const pid_t agent = parent_of(victims.front());
  victims.push_back(agent);
  for (pid_t p = parent_of(agent); p > 1 && test::slurp("/proc/" + std::to_string(p) + "/comm").rfind("slurmstepd", 0) == 0;
       p = parent_of(p)) {
    victims.push_back(p);
  }
  victims.push_back(cluster.slurmd_pid("n2"));
  for (pid_t p : victims) ::kill(p, SIGKILL);

  const int rc = job.wait(300s);
  const std::string out = test::slurp(script + ".out");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("dstrain: lost node 1 (n2)"), std::string::npos) << out;
  EXPECT_NE(out.find("restarting on the 1 remaining node(s), 2 rank(s)"), std::string::npos) << out;
  const auto got = test::read_metrics(metrics);
  ASSERT_FALSE(got.empty()) << out;
  EXPECT_EQ(got.back().value("step", 0), kSteps) << out;
  EXPECT_NEAR(got.back().value("loss", 0.0), ref, 1e-3) << out;
  EXPECT_EQ(got.back().value("elastic_restarts", 0), 1) << out;
  EXPECT_TRUE(test::wait_gone(victims, 10s).empty());
  EXPECT_TRUE(test::SlurmCluster::wait_for([&] { return ranks_with("DSTRAIN_ELASTIC_TEST", "slurm").empty(); }, 30s))
      << "a rank outlived the job";
  std::cerr << "[ figure ] Slurm elastic: final loss " << got.back().value("loss", 0.0) << " vs " << ref
            << " uninterrupted; downtime " << got.back().value("elastic_downtime_s", 0.0) << " s\n";
}

}  // namespace
}  // namespace ds
