// Direct mode: ranks that a cluster's own launcher started (`srun dstrain train`, `mpirun -np N
// dstrain train`), or that a user started by hand with RANK/WORLD_SIZE/MASTER_ADDR, without
// `dstrain launch`. No dstrain launcher hosts a store for them, so rank 0 does.
//
// enter() turns the cluster's environment (rank_env.h) into the worker contract the trainer
// reads (RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE NODE_RANK MASTER_ADDR MASTER_PORT
// DSTRAIN_STORE DSTRAIN_JOB_ID) in this process's environment, and on rank 0 starts the store
// server in a thread of this process:
//   address  MASTER_ADDR if set; 127.0.0.1 when every rank is on this node; else the first node
//            of the Slurm step (SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST); else an error
//   port     DSTRAIN_STORE_PORT (default 29401)
//   token    DSTRAIN_JOB_TOKEN, required: `export DSTRAIN_JOB_TOKEN=$(dstrain token)` before srun
//            (which passes the environment on) or mpirun (-x DSTRAIN_JOB_TOKEN); the store is
//            never open
// The store lives in rank 0's process, so it must outlive every other rank's last use of it:
// leave() is called by every rank at its end (trained or preempted); rank 0's leave() waits until
// every rank has left before the server stops. A rank that fails never leaves; rank 0 then waits
// its timeout, and the job fails anyway (srun and mpirun end the others).
//
// Deliberately not: restarts. A requeued or restarted job starts a fresh store.
#pragma once

#include <memory>

#include "common/deadline.h"
#include "launch/rank_env.h"

namespace ds::store {
class TcpStoreServer;
}

namespace ds::launch {

class DirectMode {
 public:
  // nullptr when there is nothing to do: DSTRAIN_STORE is set (dstrain launch runs us), or no
  // rank source says there is more than one rank. Throws invalid_usage without a token,
  // invalid_argument for disagreeing rank sources or no address for rank 0, system_error when
  // rank 0's store port is taken (naming it).
  static std::unique_ptr<DirectMode> enter(const EnvGetter& env = process_env());
  ~DirectMode();

  const RankInfo& rank() const { return rank_; }
  // See above; at most `timeout` on rank 0, which then stops the store.
  void leave(Millis timeout = Millis(60000));

 private:
  DirectMode() = default;
  RankInfo rank_;
  std::unique_ptr<store::TcpStoreServer> server_;
};

// The first node of the Slurm step (or job) from SLURM_STEP_NODELIST / SLURM_JOB_NODELIST;
// empty when neither is set.
std::string slurm_first_node(const EnvGetter& env);

}  // namespace ds::launch
