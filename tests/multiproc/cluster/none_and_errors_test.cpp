// `dstrain launch --launcher none`: two `--node-rank` processes on this machine form one job
// (the local 4-rank curve), a missing node is named after --join-timeout, and a rank failing on
// node 1 ends node 0 too, both reporting it. And the cluster engines' bad input, each a clear
// error: --launcher slurm outside an allocation, an unparsable nodelist, disagreeing rank
// sources, a missing token in direct mode and under --launcher none, mpirun absent.
#include <gtest/gtest.h>

#include "multiproc/cluster/cluster_job.h"
#include "multiproc/cluster/slurm_cluster.h"
#include "multiproc/train/train_job.h"

namespace ds {
namespace {

using namespace std::chrono_literals;
using test::JobProcess;
using test::TempDir;

constexpr int kSteps = 20;

class ClusterLaunch : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    test::write_cluster_tokens(*dir_ / "train.bin");
    std::ofstream(*dir_ / "cfg.json") << test::cluster_config(*dir_ / "train.bin", kSteps).dump();
    std::ofstream(*dir_ / "hostfile") << "127.0.0.1 slots=2\nlocalhost slots=2\n";
  }
  static void TearDownTestSuite() { delete dir_; }

  // The outer environment's rank, store and cluster variables, except those `env` sets (the
  // JobProcess unsets after it sets).
  static std::vector<std::string> unset(const std::vector<std::string>& env = {}) {
    std::vector<std::string> out;
    for (const char* k : {"DSTRAIN_STORE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_JOB_ID",
                          "SLURM_JOB_NODELIST", "SLURM_STEP_ID", "DSTRAIN_JOB_TOKEN",
                          "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"}) {
      bool set = false;
      for (const auto& kv : env) set = set || kv.rfind(std::string(k) + "=", 0) == 0;
      if (!set) out.push_back(k);
    }
    return out;
  }
  // `dstrain launch --launcher none --node-rank N` of the shared hostfile.
  static std::vector<std::string> node(int n, int port, std::vector<std::string> extra,
                                       std::vector<std::string> cmd) {
    std::vector<std::string> a = {DS_DSTRAIN_BIN,
                                  "launch",
                                  "--launcher",
                                  "none",
                                  "--node-rank",
                                  std::to_string(n),
                                  "-H",
                                  *dir_ / "hostfile",
                                  "--master-port",
                                  "0",
                                  "--store-port",
                                  std::to_string(port),
                                  "--env",
                                  "OMP_NUM_THREADS=1"};
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back("--");
    a.insert(a.end(), cmd.begin(), cmd.end());
    return a;
  }
  static std::vector<std::string> token_env() {
    return {"DSTRAIN_JOB_TOKEN=" +
                test::run_command(std::string(DS_DSTRAIN_BIN) + " token").out.substr(0, 64),
            "OMP_NUM_THREADS=1"};
  }
  // Runs `argv` with `env` and expects exit status `status` and `needle` in its stderr.
  static void expect_error(std::vector<std::string> argv, std::vector<std::string> env, int status,
                           const std::string& needle) {
    JobProcess p(std::move(argv), dir_->path(), env, unset(env));
    EXPECT_EQ(p.wait(60s), status) << p.err();
    EXPECT_NE(p.err().find(needle), std::string::npos) << p.err();
  }

  static inline TempDir* dir_ = nullptr;
};

TEST_F(ClusterLaunch, TwoNoneNodesFormOneJobWithTheLocalCurve) {
  auto ref = test::run_train_job(dir_->path(), "reference", 4,
                                 test::cluster_config(*dir_ / "train.bin", kSteps), {}, 120s);
  ASSERT_EQ(ref.rc, 0) << ref.err;
  const int port = test::free_tcp_port();
  auto env = token_env();
  std::vector<std::string> train = {DS_DSTRAIN_BIN,     "train",     "--config",
                                    *dir_ / "cfg.json", "--metrics", *dir_ / "none.jsonl"};
  JobProcess n1(node(1, port, {}, train), dir_->path(), env, unset(env));
  JobProcess n0(node(0, port, {}, train), dir_->path(), env, unset(env));
  ASSERT_EQ(n0.wait(120s), 0) << n0.err();
  ASSERT_EQ(n1.wait(30s), 0) << n1.err();
  auto got = test::losses_of(test::read_metrics(*dir_ / "none.jsonl"));
  auto want = test::losses_of(ref.metrics);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LE(std::abs(got[i] - want[i]), 1e-6 * want[i]) << "step " << i + 1;
  for (auto* n : {&n0, &n1}) {
    EXPECT_NE(n->err().find("job finished: all 4 rank(s) exited 0"), std::string::npos) << n->err();
  }
}

TEST_F(ClusterLaunch, AMissingNoneNodeIsNamedAfterTheJoinTimeout) {
  expect_error(node(0, test::free_tcp_port(), {"--join-timeout", "2"}, {"/bin/true"}), token_env(),
               124, "node 1 (localhost) did not join within 2.0 s");
}

TEST_F(ClusterLaunch, ARankFailingOnNoneNodeOneEndsNodeZeroToo) {
  TempDir pids;
  const int port = test::free_tcp_port();
  auto env = token_env();
  std::vector<std::string> worker = {DS_TEST_WORKER_BIN, "--pid-dir", pids.path(),   "--barrier",
                                     "--fail-rank",      "3",         "--fail-code", "3",
                                     "--sleep",          "60"};
  JobProcess n1(node(1, port, {"--failure-grace", "1", "--kill-timeout", "3"}, worker),
                dir_->path(), env, unset(env));
  JobProcess n0(node(0, port, {"--failure-grace", "1", "--kill-timeout", "3"}, worker),
                dir_->path(), env, unset(env));
  EXPECT_EQ(n0.wait(60s), 3) << n0.err();
  EXPECT_EQ(n1.wait(30s), 3) << n1.err();
  for (auto* n : {&n0, &n1}) {
    EXPECT_NE(n->err().find("rank 3 on localhost exited with exit code 3"), std::string::npos)
        << n->err();
  }
  auto all = test::read_pids(pids.path(), 4, 1s);
  EXPECT_EQ(all.size(), 4u);
  EXPECT_TRUE(test::wait_gone(all, 5s).empty()) << "a worker outlived the job";
}

TEST_F(ClusterLaunch, LauncherSlurmOutsideAnAllocationIsAClearError) {
  expect_error({DS_DSTRAIN_BIN, "launch", "--launcher", "slurm", "--", "/bin/true"}, {}, 2,
               "--launcher slurm runs inside a Slurm allocation, but "
               "SLURM_JOB_ID/SLURM_JOB_NODELIST are not set");
}

TEST_F(ClusterLaunch, AnUnparsableNodelistIsAClearError) {
  expect_error(
      {DS_DSTRAIN_BIN, "launch", "--launcher", "slurm", "--nproc-per-node", "2", "--", "/bin/true"},
      {"SLURM_JOB_ID=42", "SLURM_JOB_NODELIST=n[1-2,x]"}, 2,
      "cannot parse the Slurm nodelist 'n[1-2,x]' at character 2: 'x' is not a number or a range");
}

TEST_F(ClusterLaunch, DisagreeingRankSourcesAreAClearError) {
  expect_error({DS_DSTRAIN_BIN, "train", "--config", *dir_ / "cfg.json"},
               {"RANK=0", "WORLD_SIZE=4", "SLURM_STEP_ID=0", "SLURM_PROCID=2", "SLURM_NTASKS=4"}, 2,
               "RANK/WORLD_SIZE says rank 0 (local rank -1), Slurm's srun "
               "(SLURM_PROCID/SLURM_NTASKS) says rank 2");
}

TEST_F(ClusterLaunch, AMissingTokenInDirectModeSaysHowToSetOne) {
  expect_error({DS_DSTRAIN_BIN, "train", "--config", *dir_ / "cfg.json"},
               {"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2"}, 2,
               "export DSTRAIN_JOB_TOKEN=$(dstrain token)");
  expect_error(node(1, test::free_tcp_port(), {}, {"/bin/true"}), {}, 2,
               "--launcher none needs the job token in DSTRAIN_JOB_TOKEN on every node");
}

TEST_F(ClusterLaunch, MpirunAbsentIsAClearError) {
  TempDir empty;
  expect_error(
      {DS_DSTRAIN_BIN, "launch", "--launcher", "openmpi", "-H", *dir_ / "hostfile", "--",
       "/bin/true"},
      {"PATH=" + empty.path()}, 2,
      "--launcher openmpi needs Open MPI's mpirun, but none of mpirun.openmpi, mpirun is on PATH");
  expect_error({DS_DSTRAIN_BIN, "launch", "--launcher", "mpich", "-H", *dir_ / "hostfile", "--",
                "/bin/true"},
               {"PATH=" + empty.path()}, 2, "install it (Debian package mpich)");
}

}  // namespace
}  // namespace ds
