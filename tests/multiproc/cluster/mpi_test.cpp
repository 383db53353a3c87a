// dstrain under real MPI launchers: `mpirun -np 4 dstrain train` (Debian's Open MPI) and
// `mpiexec.hydra -n 4 dstrain train` (Debian's MPICH) in direct mode, and `dstrain launch
// --launcher openmpi` / `--launcher mpich` over a 2-"host" hostfile of loopback names, whose
// daemons (orted, hydra_pmi_proxy) Open MPI and Hydra start through real sshd on 127.0.0.2 and
// 127.0.0.3 (ssh_nodes.h). Each trains the curve of `dstrain launch --nproc-per-node 4`.
// Everything is kept on the loopback interface (oob_tcp_if_include lo, -iface lo). Skips itself
// where mpirun/mpiexec.hydra or sshd are not available.
#include <gtest/gtest.h>

#include "multiproc/cluster/cluster_job.h"
#include "multiproc/cluster/slurm_cluster.h"
#include "multiproc/ssh/ssh_nodes.h"
#include "multiproc/train/train_job.h"

namespace ds {
namespace {

using namespace std::chrono_literals;
using test::JobProcess;
using test::TempDir;

constexpr int kSteps = 20;
const char* kOpenMpi = "/usr/bin/mpirun.openmpi";
const char* kHydra = "/usr/bin/mpiexec.hydra";

class MpiJobs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    nodes_ = new test::Nodes();
    test::write_cluster_tokens(*dir_ / "train.bin");
    std::ofstream(*dir_ / "cfg.json") << test::cluster_config(*dir_ / "train.bin", kSteps).dump();
    auto r = test::run_train_job(dir_->path(), "reference", 4,
                                 test::cluster_config(*dir_ / "train.bin", kSteps), {}, 120s);
    ASSERT_EQ(r.rc, 0) << r.err;
    reference_ = new std::vector<double>(test::losses_of(r.metrics));
  }
  static void TearDownTestSuite() {
    delete nodes_;
    delete dir_;
    delete reference_;
  }

  static void need(const char* program) {
    if (::access(program, X_OK) != 0)
      GTEST_SKIP() << program << " is not installed (scripts/install-deps.sh)";
  }
  static void need_nodes() {
    if (!nodes_->skip_reason.empty()) GTEST_SKIP() << nodes_->skip_reason;
  }

  static std::vector<std::string> env() {
    return {"OMP_NUM_THREADS=1",
            "DSTRAIN_JOB_TOKEN=" +
                test::run_command(std::string(DS_DSTRAIN_BIN) + " token").out.substr(0, 64),
            "DSTRAIN_STORE_PORT=" + std::to_string(test::free_tcp_port())};
  }
  static std::vector<std::string> unset() {
    return {"DSTRAIN_STORE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "SSH_AUTH_SOCK"};
  }
  static std::vector<std::string> train_args(const std::string& metrics) {
    return {DS_DSTRAIN_BIN, "train", "--config", *dir_ / "cfg.json", "--metrics", metrics};
  }

  static void run_and_compare(std::vector<std::string> argv, const std::string& metrics,
                              const std::string& what) {
    JobProcess job(std::move(argv), dir_->path(), env(), unset());
    ASSERT_EQ(job.wait(120s), 0) << what << "\n" << job.out() << job.err();
    auto got = test::losses_of(test::read_metrics(metrics));
    ASSERT_EQ(got.size(), reference_->size()) << what;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_LE(std::abs(got[i] - (*reference_)[i]), 1e-6 * std::abs((*reference_)[i]))
          << what << " step " << i + 1;
    }
  }

  static inline TempDir* dir_ = nullptr;
  static inline test::Nodes* nodes_ = nullptr;
  static inline std::vector<double>* reference_ = nullptr;
};

TEST_F(MpiJobs, MpirunOfDstrainTrainMatchesTheLocalCurve) {
  need(kOpenMpi);
  std::vector<std::string> argv = {kOpenMpi,
                                   "-np",
                                   "4",
                                   "--allow-run-as-root",
                                   "--oversubscribe",
                                   "--mca",
                                   "oob_tcp_if_include",
                                   "lo",
                                   "-x",
                                   "DSTRAIN_JOB_TOKEN",
                                   "-x",
                                   "OMP_NUM_THREADS"};
  for (auto& a : train_args(*dir_ / "openmpi_direct.jsonl")) argv.push_back(a);
  run_and_compare(argv, *dir_ / "openmpi_direct.jsonl", "mpirun -np 4 dstrain train");
}

TEST_F(MpiJobs, HydraMpiexecOfDstrainTrainMatchesTheLocalCurve) {
  need(kHydra);
  std::vector<std::string> argv = {kHydra, "-n", "4", "-iface", "lo"};
  for (auto& a : train_args(*dir_ / "hydra_direct.jsonl")) argv.push_back(a);
  run_and_compare(argv, *dir_ / "hydra_direct.jsonl", "mpiexec.hydra -n 4 dstrain train");
}

TEST_F(MpiJobs, LauncherOpenmpiOverTwoLoopbackHostsMatchesTheLocalCurve) {
  need(kOpenMpi);
  need_nodes();
  std::vector<std::string> argv = {DS_DSTRAIN_BIN,
                                   "launch",
                                   "--launcher",
                                   "openmpi",
                                   "-H",
                                   nodes_->path("hostfile"),
                                   "--master-port",
                                   "0",
                                   "--launcher-args",
                                   "--allow-run-as-root --mca plm_rsh_agent " +
                                       nodes_->ssh_wrapper() + " --mca oob_tcp_if_include lo",
                                   "--"};
  for (auto& a : train_args(*dir_ / "openmpi_launch.jsonl")) argv.push_back(a);
  run_and_compare(argv, *dir_ / "openmpi_launch.jsonl", "--launcher openmpi");
}

TEST_F(MpiJobs, LauncherMpichOverTwoLoopbackHostsMatchesTheLocalCurve) {
  need(kHydra);
  need_nodes();
  std::vector<std::string> argv = {
      DS_DSTRAIN_BIN,
      "launch",
      "--launcher",
      "mpich",
      "-H",
      nodes_->path("hostfile"),
      "--master-port",
      "0",
      "--launcher-args",
      "-launcher ssh -launcher-exec " + nodes_->ssh_wrapper() + " -iface lo",
      "--"};
  for (auto& a : train_args(*dir_ / "mpich_launch.jsonl")) argv.push_back(a);
  run_and_compare(argv, *dir_ / "mpich_launch.jsonl", "--launcher mpich");
}

}  // namespace
}  // namespace ds
