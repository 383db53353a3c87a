// `dstrain launch --launcher slurm`: the nodes and slots of the Slurm allocation we run in, and
// the one `srun` step that starts an agent on each of them.
//
// Nodes come from SLURM_JOB_NODELIST in Slurm's compressed hostlist syntax, expanded here
// (expand_nodelist, the same result as `scontrol show hostnames`), in the allocation's order.
// Slots per node: --nproc-per-node, else SLURM_GPUS_ON_NODE, else SLURM_NTASKS_PER_NODE, else
// this node's GPU count. --include/--exclude/--num-nodes/--num-gpus filter the allocation as
// they filter a hostfile.
//
// Deliberately not: submitting jobs. The launcher runs inside an allocation (sbatch/salloc);
// it never calls sbatch, and never talks to slurmctld except through srun.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/hostfile.h"
#include "launch/rank_env.h"

namespace ds::launch {

// "n[01-03,07],gpu-a[1-2]-x,login" -> n01 n02 n03 n07 gpu-a1-x gpu-a2-x login. Several bracket
// groups in one name multiply out; a range keeps the zero-padding of its bounds. An unparsable
// list is an invalid_argument quoting it and saying where it breaks.
std::vector<std::string> expand_nodelist(const std::string& list);

struct SlurmAllocation {
  std::string job_id;
  std::vector<std::string> nodes;  // the allocation's order
  int gpus_on_node = 0;            // SLURM_GPUS_ON_NODE (0: unset)
  int ntasks_per_node = 0;         // SLURM_NTASKS_PER_NODE (0: unset)
};

// True when this process runs inside an allocation (SLURM_JOB_ID and SLURM_JOB_NODELIST set).
bool in_slurm_allocation(const EnvGetter& env);

// The allocation, or invalid_usage (not inside one: names SLURM_JOB_ID and says how to get one),
// or invalid_argument (a nodelist that does not parse).
SlurmAllocation read_slurm_allocation(const EnvGetter& env);

// The hostfile the allocation amounts to (path "<Slurm job N>", for the filters' messages),
// with `nproc_per_node` (> 0) or the allocation's own slot count per node (`local_gpus` last)
// slots each; invalid_argument with a hint when nothing gives one.
config::Hostfile slurm_hostfile(const SlurmAllocation& alloc, int nproc_per_node, int local_gpus);

// The srun command that starts one agent per node of `hosts` (in that order), before the
// agent's own argv: srun --nodes=N --ntasks=N --ntasks-per-node=1 --nodelist=... --whole ...
std::vector<std::string> srun_command(const std::string& srun,
                                      const std::vector<std::string>& hosts,
                                      const std::string& job_name,
                                      const std::vector<std::string>& extra_args);

}  // namespace ds::launch
