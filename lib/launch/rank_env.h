// Where a process's place in the job comes from when a cluster's own launcher started it
// (`srun dstrain train`, `mpirun -np N dstrain train`), or `dstrain agent` under srun/mpirun.
//
// Sources, innermost first (the first one present wins):
//   explicit   RANK WORLD_SIZE [LOCAL_RANK LOCAL_WORLD_SIZE NODE_RANK]   dstrain launch, torchrun
//   openmpi    OMPI_COMM_WORLD_RANK _SIZE _LOCAL_RANK _LOCAL_SIZE       Open MPI's mpirun
//   pmi        PMI_RANK PMI_SIZE MPI_LOCALRANKID MPI_LOCALNRANKS        MPICH's Hydra, Intel MPI
//   slurm      SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_NODEID     srun; only inside a step
//              (SLURM_STEP_ID set): a batch script's own SLURM_PROCID=0 is not a rank
// Launchers nest (mpirun inside sbatch starts its daemons with srun; dstrain launch --launcher
// slurm runs its workers inside an srun step), so an outer source describing another set of
// processes is expected and ignored. Two sources describing a world of the same size must agree
// on the rank (and the local rank where both give one): otherwise it is an error naming both,
// e.g. a RANK exported by a batch script under `srun -n 4`.
//
// Pure: reads through an EnvGetter so tests pass a map. Deliberately not: setting anything.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace ds::launch {

using EnvGetter = std::function<std::optional<std::string>(const char* name)>;

// The process's environment through ds::env (lib/common/env.h: every name is in its table).
EnvGetter process_env();

struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = -1;        // -1: the source does not say
  int local_world_size = -1;  // -1: the source does not say
  int node_rank = -1;         // -1: the source does not say
  std::string source;         // "RANK/WORLD_SIZE", "Open MPI (OMPI_COMM_WORLD_*)", ...
};

// The winning source, or nullopt when none is set (a single process). Throws invalid_argument
// for a partial source (RANK without WORLD_SIZE), a value that is not a rank (non-integer, out
// of range) and for disagreeing sources, each naming the variables.
std::optional<RankInfo> resolve_rank(const EnvGetter& env);

// "2(x3),1" (SLURM_STEP_TASKS_PER_NODE) -> tasks on node `node`; -1 when unparsable.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node);

}  // namespace ds::launch
