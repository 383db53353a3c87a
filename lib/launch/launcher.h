// The launcher's side of a job: start one agent per node (in-process for a single local node,
// over SSH otherwise), host or locate the store, relay output, tear every node down on the first
// failure (after the failure grace period, in which the other ranks may exit on their own) or at
// once on a signal, restart under --max-restarts, and sum up.
//
// Exit status of a job: 0 when every rank exited 0; otherwise the first failing rank's exit code,
// or 128+signal when it died by a signal; 128+signal when the launcher itself was interrupted;
// 1 when an agent or a node connection failed; 124 for a timeout reaching a node.
//
// Deliberately not: a scheduler. Nodes come from the hostfile; nothing is queued or retried
// except the whole job under --max-restarts.
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

enum class Backend { kAuto, kLocal, kSsh };

struct JobSpec {
  World world;
  std::vector<std::string> command;
  EnvList user_env;                      // --env and .dstrain_env (values are never printed)
  Millis kill_timeout = kDefaultKillTimeout;
  Millis failure_grace = kDefaultFailureGrace;  // see AgentConfig::failure_grace
  bool bind_cores = false;
  int max_restarts = 0;
  int store_port = 0;                    // 0: a free port on node 0
  OutputOptions output;
  Backend backend = Backend::kAuto;      // auto: local for one local node, ssh otherwise
  SshOptions ssh;
  std::string remote_dstrain;            // dstrain's path on the nodes (default: ours)
  std::string cwd;                       // workers' directory (default: ours)
  std::string agent_log_level;           // passed to remote agents ("" = their default)
};

// True for "localhost", 127.x.x.x (other than the loopback "nodes" 127.0.0.2+ which may run
// their own sshd, so only 127.0.0.1), "::1", and this machine's hostname.
bool is_local_host(const std::string& host);

// 256 random bits, hex; and "dstrain-YYYYmmdd-HHMMSS-xxxxxx".
std::string make_job_token();
std::string make_job_id();

// The agent's command line for one node (without the token, which goes over stdin).
std::vector<std::string> agent_command(const JobSpec& spec, const std::string& job_id,
                                       int node_rank);

// Runs the job to the end and returns its exit status (see above). Prints the summary through
// the OutputMux's note(). Throws ds::Error for failures before any worker starts (a node
// unreachable, a port in use), naming the host.
int run_job(const JobSpec& spec);

}  // namespace ds::launch
