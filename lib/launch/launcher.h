// The launcher's side of a job: start one agent per node and drive them to the end. Backends:
//   local    a single local node: the agent runs in this process, which hosts the store
//   ssh      one `dstrain agent` per node over SSH (libssh2)
//   slurm    inside an allocation: one `srun --nodes=N --ntasks-per-node=1` step starts them
//   openmpi  `mpirun -npernode 1` over the hostfile's hosts starts them
//   mpich    `mpiexec -ppn 1` (Hydra) over the hostfile's hosts starts them
//   none     every node runs `dstrain launch --node-rank N` itself (Kubernetes-style); node 0
//            hosts the store and the others join it (none_job.h)
// The agents of slurm/openmpi/mpich dial back to the launcher (controller.h); from the agent
// on, every backend is the same: per-rank environment, rank-prefixed output, the first failure
// answered by the failure grace then a stop of every node, restarts under --max-restarts.
//
// Exit status of a job: 0 when every rank exited 0; 75 when every rank was preempted and wrote
// its checkpoint (common/preemption.h); otherwise the first failing rank's exit code, or
// 128+signal when it died by a signal; 128+signal when the launcher itself was interrupted;
// 1 when an agent or a node failed; 124 for a timeout reaching a node.
//
// Deliberately not: a scheduler. Nodes come from the hostfile or the allocation; nothing is
// queued or retried except the whole job under --max-restarts.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "launch/agent.h"
#include "launch/output.h"
#include "launch/ssh.h"
#include "launch/world.h"

namespace ds::launch {

enum class Backend { kAuto, kLocal, kSsh, kSlurm, kOpenMpi, kMpich, kNone };

// "auto", "local", "ssh", "slurm", "openmpi", "mpich", "none".
const char* backend_name(Backend backend);

struct JobSpec {
  World world;
  std::vector<std::string> command;
  EnvList user_env;                      // --env and .dstrain_env (values are never printed)
  Millis kill_timeout = kDefaultKillTimeout;
  Millis failure_grace = kDefaultFailureGrace;  // see AgentConfig::failure_grace
  // A remote node's agent heard from for this long (no line, not even its once-a-second
  // heartbeat: agent_protocol.h) is stopped, hung or gone: the job fails naming the node.
  Millis agent_timeout{10000};
  bool bind_cores = false;
  int max_restarts = 0;
  int store_port = 0;                    // 0: a free port on node 0
  OutputOptions output;
  Backend backend = Backend::kAuto;      // auto: local for one local node, ssh otherwise
  SshOptions ssh;
  std::string remote_dstrain;            // dstrain's path on the nodes (default: ours)
  std::string cwd;                       // workers' directory (default: ours)
  std::string agent_log_level;           // passed to remote agents ("" = their default)
  // Besides SIGTERM, this signal (e.g. SIGUSR1) means "preempted": forwarded as is to every
  // worker, which checkpoints and exits 75 (0: SIGTERM only). See agent.h.
  int preempt_signal = 0;
  std::vector<std::string> launcher_args;  // extra words for srun / mpirun (--launcher-args)
  Millis join_timeout{120000};           // slurm/openmpi/mpich/none: every node's agent has joined
  std::string launcher_addr;             // the address agents dial back to (default: hostname)
  std::string token;                     // the job token; empty: a fresh one (none: required)
  int node_rank = 0;                     // --launcher none: this node
  // Elastic node count (--nnodes MIN:MAX; ssh, slurm, openmpi, mpich): when nodes are lost (their
  // channel broke, their agent went silent) and at least min_nodes remain, the job is torn down
  // as after any failure and started again on the remaining nodes, as a restart
  // (DSTRAIN_RESTART_COUNT goes on counting, so `dstrain train` resumes from its latest
  // checkpoint). The ranks get DSTRAIN_ELASTIC_WORLD_SIZE (the first world's size: `dstrain
  // train` keeps that world's global batch by raising gradient_accumulation_steps),
  // DSTRAIN_ELASTIC_RESTARTS and DSTRAIN_ELASTIC_LOST_AT (Unix seconds of the latest loss). 0: not
  // elastic (a lost node ends the job). A node that comes back is not re-admitted.
  int min_nodes = 0;
  int max_nodes = 0;               // --nnodes MAX (for messages: the world never grows)
  std::string master_addr_option;  // --master-addr as given ("": node 0's host, again after a loss)
  int restart_base = 0;            // restarts before this run of the agents (elastic restarts)
};

// True for "localhost", 127.x.x.x (other than the loopback "nodes" 127.0.0.2+ which may run
// their own sshd, so only 127.0.0.1), "::1", and this machine's hostname.
bool is_local_host(const std::string& host);

// 256 random bits, hex; and "dstrain-YYYYmmdd-HHMMSS-xxxxxx".
std::string make_job_token();
std::string make_job_id();

// The agent's command line for one node (without the token, which goes over stdin). With
// node_rank -1 (srun/mpirun start one command everywhere) the agent reads its node rank from its
// launcher's environment, hosts the store when that rank is 0, and dials back to `controller`
// (host:port) for the protocol.
std::vector<std::string> agent_command(const JobSpec& spec, const std::string& job_id,
                                       int node_rank, const std::string& controller = "");

// The AgentConfig of node `node_rank` of the job (job id and token left to the caller).
AgentConfig agent_config(const JobSpec& spec, int node_rank);

// Runs the job to the end and returns its exit status (see above). Prints the summary through
// the OutputMux's note(). Throws ds::Error for failures before any worker starts (a node
// unreachable, a port in use), naming the host.
int run_job(const JobSpec& spec);

}  // namespace ds::launch
