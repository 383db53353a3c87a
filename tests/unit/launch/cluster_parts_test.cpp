// The pure parts of the cluster backends: Slurm's hostlist syntax, rank resolution from srun's,
// mpirun's and dstrain's variables, --launcher-args splitting, signal names, srun's command.
#include <signal.h>

#include <map>

#include <gtest/gtest.h>

#include "common/error.h"
#include "common/preemption.h"
#include "launch/cluster.h"
#include "launch/rank_env.h"
#include "launch/slurm.h"

namespace ds::launch {
namespace {

using Strings = std::vector<std::string>;

EnvGetter env_of(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return std::string(e.what()) + " | hint: " + e.hint();
  }
  return "";
}

TEST(Nodelist, ExpandsRangesListsPaddingAndSeveralGroups) {
  EXPECT_EQ(expand_nodelist("n1"), Strings{"n1"});
  EXPECT_EQ(expand_nodelist("n[1-2]"), (Strings{"n1", "n2"}));
  EXPECT_EQ(expand_nodelist("n[01-03,07],login"), (Strings{"n01", "n02", "n03", "n07", "login"}));
  EXPECT_EQ(expand_nodelist("gpu-a[1-2]-x"), (Strings{"gpu-a1-x", "gpu-a2-x"}));
  EXPECT_EQ(expand_nodelist("r[1-2]n[3,5]"), (Strings{"r1n3", "r1n5", "r2n3", "r2n5"}));
  EXPECT_EQ(expand_nodelist("n[8-10]"), (Strings{"n8", "n9", "n10"}));
  EXPECT_EQ(expand_nodelist("a,b[001-002]"), (Strings{"a", "b001", "b002"}));
}

TEST(Nodelist, BadListsAreClearErrors) {
  for (const char* bad :
       {"n[1-", "n1-2]", "n[]", "n[a-b]", "n[3-1]", "n1,,n2", "", "n[1-2", "n[[1]]", "n 1"}) {
    std::string msg = error_of([&] { expand_nodelist(bad); });
    EXPECT_NE(msg.find("cannot parse the Slurm nodelist"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("scontrol show hostnames"), std::string::npos) << msg;
  }
}

TEST(SlurmAllocation, OutsideOneIsAClearError) {
  std::string msg = error_of([] { read_slurm_allocation(env_of({})); });
  EXPECT_NE(msg.find("SLURM_JOB_ID"), std::string::npos) << msg;
  EXPECT_NE(msg.find("sbatch"), std::string::npos) << msg;
}

TEST(SlurmAllocation, SlotsComeFromTheFlagThenGpusThenTasksThenTheLocalGpus) {
  auto alloc = read_slurm_allocation(env_of(
      {{"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NODELIST", "n[1-2]"}, {"SLURM_NTASKS_PER_NODE", "3"}}));
  EXPECT_EQ(alloc.nodes, (Strings{"n1", "n2"}));
  EXPECT_EQ(slurm_hostfile(alloc, 2, 8).hosts.at(1).slots, 2);
  EXPECT_EQ(slurm_hostfile(alloc, 0, 8).hosts.at(0).slots, 3);
  alloc.gpus_on_node = 4;
  EXPECT_EQ(slurm_hostfile(alloc, 0, 8).hosts.at(0).slots, 4);
  alloc.gpus_on_node = alloc.ntasks_per_node = 0;
  EXPECT_EQ(slurm_hostfile(alloc, 0, 8).hosts.at(0).slots, 8);
  EXPECT_NE(error_of([&] { slurm_hostfile(alloc, 0, 0); }).find("--nproc-per-node"),
            std::string::npos);
}

TEST(SlurmAllocation, SrunStartsOneTaskPerChosenNode) {
  auto cmd = srun_command("/usr/bin/srun", {"n1", "n3"}, "job", {"--exclusive"});
  Strings want = {"/usr/bin/srun",    "--nodes=2",  "--ntasks=2", "--ntasks-per-node=1",
                  "--nodelist=n1,n3", "--whole",    "--mpi=none", "--kill-on-bad-exit=0",
                  "--job-name=job",   "--exclusive"};
  EXPECT_EQ(cmd, want);
}

TEST(RankEnv, NoSourceIsASingleProcess) {
  EXPECT_FALSE(resolve_rank(env_of({})).has_value());
}

TEST(RankEnv, EachLauncherSpeaksForItself) {
  auto slurm = resolve_rank(env_of({{"SLURM_STEP_ID", "0"},
                                    {"SLURM_PROCID", "3"},
                                    {"SLURM_NTASKS", "4"},
                                    {"SLURM_LOCALID", "1"},
                                    {"SLURM_NODEID", "1"},
                                    {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}}));
  ASSERT_TRUE(slurm);
  EXPECT_EQ(slurm->rank, 3);
  EXPECT_EQ(slurm->world_size, 4);
  EXPECT_EQ(slurm->local_rank, 1);
  EXPECT_EQ(slurm->local_world_size, 2);
  EXPECT_EQ(slurm->node_rank, 1);
  auto ompi = resolve_rank(env_of({{"OMPI_COMM_WORLD_RANK", "2"},
                                   {"OMPI_COMM_WORLD_SIZE", "4"},
                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}));
  ASSERT_TRUE(ompi);
  EXPECT_EQ(ompi->rank, 2);
  EXPECT_EQ(ompi->local_world_size, 4);
  auto pmi = resolve_rank(env_of({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "0"}}));
  ASSERT_TRUE(pmi);
  EXPECT_EQ(pmi->rank, 1);
  EXPECT_EQ(pmi->local_rank, 0);
}

TEST(RankEnv, ABatchScriptsOwnSlurmProcidIsNoRank) {
  EXPECT_FALSE(
      resolve_rank(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}})));
}

TEST(RankEnv, InnerLaunchersWinOverOuterOnesOfAnotherSize) {
  // dstrain launch --launcher slurm: the workers of a 2-node step of agents.
  auto r = resolve_rank(env_of({{"RANK", "3"},
                                {"WORLD_SIZE", "4"},
                                {"LOCAL_RANK", "1"},
                                {"SLURM_STEP_ID", "0"},
                                {"SLURM_PROCID", "1"},
                                {"SLURM_NTASKS", "2"},
                                {"SLURM_LOCALID", "0"}}));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->source, "RANK/WORLD_SIZE");
  // mpirun inside sbatch: its daemons are an srun step of one task per node.
  auto m = resolve_rank(env_of({{"OMPI_COMM_WORLD_RANK", "5"},
                                {"OMPI_COMM_WORLD_SIZE", "8"},
                                {"SLURM_STEP_ID", "0"},
                                {"SLURM_PROCID", "1"},
                                {"SLURM_NTASKS", "2"}}));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->rank, 5);
}

TEST(RankEnv, DisagreeingSourcesAreAnErrorNamingBoth) {
  std::string msg = error_of([] {
    resolve_rank(env_of({{"RANK", "0"},
                         {"WORLD_SIZE", "4"},
                         {"SLURM_STEP_ID", "0"},
                         {"SLURM_PROCID", "2"},
                         {"SLURM_NTASKS", "4"}}));
  });
  EXPECT_NE(msg.find("RANK/WORLD_SIZE says rank 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Slurm's srun (SLURM_PROCID/SLURM_NTASKS) says rank 2"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("unset"), std::string::npos) << msg;
  std::string local = error_of([] {
    resolve_rank(env_of({{"OMPI_COMM_WORLD_RANK", "1"},
                         {"OMPI_COMM_WORLD_SIZE", "2"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                         {"PMI_RANK", "1"},
                         {"PMI_SIZE", "2"},
                         {"MPI_LOCALRANKID", "0"}}));
  });
  EXPECT_NE(local.find("disagree"), std::string::npos) << local;
}

TEST(RankEnv, PartialOrOutOfRangeValuesAreErrors) {
  EXPECT_NE(error_of([] {
              resolve_rank(env_of({{"RANK", "1"}}));
            }).find("WORLD_SIZE is not"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              resolve_rank(env_of({{"PMI_RANK", "2"}, {"PMI_SIZE", "2"}}));
            }).find("PMI_RANK='2'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              resolve_rank(env_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}}));
            }).find("RANK='x'"),
            std::string::npos);
}

TEST(RankEnv, SlurmTasksPerNode) {
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 4), -1);
  EXPECT_EQ(slurm_tasks_on_node("2(y3)", 0), -1);
}

TEST(LauncherArgs, SplitLikeAShell) {
  EXPECT_EQ(split_launcher_args(""), Strings{});
  EXPECT_EQ(split_launcher_args("  --mca btl self,tcp  -x 'A=b c' \"d\\\"e\" f\\ g"),
            (Strings{"--mca", "btl", "self,tcp", "-x", "A=b c", "d\"e", "f g"}));
  EXPECT_NE(error_of([] { split_launcher_args("-x 'open"); }).find("unterminated single quote"),
            std::string::npos);
}

TEST(Preemption, SignalNames) {
  EXPECT_EQ(preempt::parse_signal("SIGUSR1", "--preempt-signal"), SIGUSR1);
  EXPECT_EQ(preempt::parse_signal("usr2", "--preempt-signal"), SIGUSR2);
  EXPECT_EQ(preempt::parse_signal("15", "--preempt-signal"), SIGTERM);
  std::string msg = error_of([] { preempt::parse_signal("SIGNOPE", "--preempt-signal"); });
  EXPECT_NE(msg.find("--preempt-signal: 'SIGNOPE' is not a signal"), std::string::npos) << msg;
}

TEST(Preemption, TheGuardTurnsSignalsIntoTheFlagAndRestores) {
  preempt::reset();
  {
    preempt::Guard guard({SIGUSR1});
    ::raise(SIGUSR1);
    EXPECT_TRUE(preempt::requested());
    EXPECT_EQ(preempt::signal_received(), SIGUSR1);
    preempt::reset();
    ::raise(SIGTERM);
    EXPECT_EQ(preempt::signal_received(), SIGTERM);
  }
  preempt::reset();
  struct sigaction now {};
  ::sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
}

}  // namespace
}  // namespace ds::launch
