// Every environment variable dstrain reads, in one table (after NCCL's NCCL_PARAM): grep for
// DS_ENV_KNOBS to find them all; docs/configuration.md lists the same table.
//
// Variables of the worker environment contract (RANK, WORLD_SIZE, ...) are listed too, since the
// runtime reads them; the launcher writes them (lib/launch/world.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ds::env {

// X(name, default-as-text, description)
#define DS_ENV_KNOBS(X)                                                                       \
  X("DSTRAIN_LOG_LEVEL", "info", "log level: trace, debug, info, warn, error, off")           \
  X("DSTRAIN_STORE", "", "host:port of the job's rendezvous store (set by the launcher)")      \
  X("DSTRAIN_JOB_ID", "", "job identifier (set by the launcher)")                              \
  X("DSTRAIN_JOB_TOKEN", "", "secret that authenticates the job's store clients (launcher)")   \
  X("DSTRAIN_COMM_BACKEND", "auto", "collectives backend: auto (shm on one host, else gloo), shm, gloo, nccl") \
  X("DSTRAIN_CUDA_MODULE", "", "path of libdstrain_cuda.so (default: beside the executable)")  \
  X("DSTRAIN_RESTART_COUNT", "0", "how many times the job was restarted (set by the launcher)") \
  X("RANK", "0", "global rank of this worker (set by the launcher)")                          \
  X("LOCAL_RANK", "0", "rank of this worker on its node (set by the launcher)")               \
  X("WORLD_SIZE", "1", "number of workers in the job (set by the launcher)")                  \
  X("LOCAL_WORLD_SIZE", "1", "number of workers on this node (set by the launcher)")          \
  X("NODE_RANK", "0", "index of this node in the hostfile order (set by the launcher)")       \
  X("MASTER_ADDR", "127.0.0.1", "address of the first node (set by the launcher)")            \
  X("MASTER_PORT", "29500", "port left free for the job's own use (set by the launcher)")    \
  X("DSTRAIN_STORE_PORT", "29401", "store port on rank 0's host when srun/mpirun start the ranks") \
  X("DSTRAIN_PREEMPT_SIGNAL", "", "signal that, besides SIGTERM, asks the trainer to checkpoint and exit 75") \
  X("DSTRAIN_LOG_DIR", "", "dstrain launch --log-dir (absolute), for the ranks' flight records (set by the launcher)") \
  X("DSTRAIN_FLIGHT_DIR", "", "where ranks write flight_<rank>.json (default: DSTRAIN_LOG_DIR, else $TMPDIR/dstrain-flight-<job id>)") \
  X("DSTRAIN_FLIGHT_RECORDER_ENTRIES", "2048", "operations each rank's flight recorder keeps (0: off)") \
  X("DSTRAIN_ELASTIC_WORLD_SIZE", "0", "--nnodes: the first world's size, whose global batch the trainer keeps (set by the launcher)") \
  X("DSTRAIN_ELASTIC_RESTARTS", "0", "--nnodes: how many times the job went on without lost nodes (set by the launcher)") \
  X("DSTRAIN_ELASTIC_LOST_AT", "", "--nnodes: Unix time of the latest node loss (set by the launcher)") \
  X("SLURM_JOB_ID", "", "Slurm: the allocation's job id (inside sbatch/salloc)")              \
  X("SLURM_JOB_NODELIST", "", "Slurm: the allocation's nodes, compressed (n[01-04,07])")       \
  X("SLURM_STEP_NODELIST", "", "Slurm: the nodes of this srun step")                           \
  X("SLURM_JOB_NUM_NODES", "", "Slurm: how many nodes the allocation has")                     \
  X("SLURM_STEP_ID", "", "Slurm: set inside an srun step (not in the batch script itself)")    \
  X("SLURM_PROCID", "", "Slurm: this task's rank in its step")                                 \
  X("SLURM_NTASKS", "", "Slurm: tasks in the step")                                            \
  X("SLURM_LOCALID", "", "Slurm: this task's rank on its node")                                \
  X("SLURM_NODEID", "", "Slurm: this node's index in the step")                                \
  X("SLURM_STEP_TASKS_PER_NODE", "", "Slurm: tasks per node of the step, e.g. 2(x3),1")       \
  X("SLURM_GPUS_ON_NODE", "", "Slurm: GPUs allocated on this node")                            \
  X("SLURM_NTASKS_PER_NODE", "", "Slurm: --ntasks-per-node of the allocation")                 \
  X("SLURM_RESTART_COUNT", "", "Slurm: times the batch job was requeued or restarted")         \
  X("SLURMD_NODENAME", "", "Slurm: this node's name in the cluster")                           \
  X("OMPI_COMM_WORLD_RANK", "", "Open MPI's mpirun: this process's rank")                      \
  X("OMPI_COMM_WORLD_SIZE", "", "Open MPI's mpirun: processes started")                        \
  X("OMPI_COMM_WORLD_LOCAL_RANK", "", "Open MPI's mpirun: rank on this node")                  \
  X("OMPI_COMM_WORLD_LOCAL_SIZE", "", "Open MPI's mpirun: processes on this node")             \
  X("PMI_RANK", "", "MPICH's (Hydra's) mpiexec: this process's rank")                         \
  X("PMI_SIZE", "", "MPICH's (Hydra's) mpiexec: processes started")                           \
  X("MPI_LOCALRANKID", "", "MPICH's (Hydra's) mpiexec: rank on this node")                    \
  X("MPI_LOCALNRANKS", "", "MPICH's (Hydra's) mpiexec: processes on this node")

// The raw value, or nullopt when unset. Only names from DS_ENV_KNOBS may be read (checked).
std::optional<std::string> get(const char* name);
// The value, or the table's default when unset or empty.
std::string get_or_default(const char* name);
// Integer value with the table's default; a non-integer value is an invalid_argument naming it.
int64_t get_int(const char* name);

struct KnobInfo {
  const char* name;
  const char* default_value;
  const char* description;
};
// The whole table, in order (for `dstrain report` and the docs).
const KnobInfo* knobs(size_t* count);

}  // namespace ds::env
