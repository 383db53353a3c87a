// `dstrain agent`: the process the launcher starts on every node, over SSH or through srun or
// mpirun. It speaks the agent protocol (agent_protocol.h) on stdin/stdout (SSH) or on the
// connection it dialled back to the launcher on (controller.h), hosts the job's store when it is node 0, and runs
// one Agent generation per "start" until "quit", end of stdin, or a signal.
//
// Deliberately not: usable by hand. It is an internal subcommand; `dstrain launch` drives it.
#pragma once

#include <string>
#include <vector>

#include "common/deadline.h"
#include "launch/agent.h"
#include "launch/world.h"

namespace ds::launch {

struct AgentProcessOptions {
  World world;
  int node_rank = 0;
  std::vector<std::string> command;
  std::string job_id;
  Millis kill_timeout = kDefaultKillTimeout;
  Millis failure_grace = kDefaultFailureGrace;
  bool bind_cores = false;
  std::string cwd;           // workers' directory; when it does not exist here: a warning
  bool serve_store = false;  // node 0: host the store, report "store <port> <master_port>"
  int store_port = 0;        // 0: a free port
  Millis token_timeout{30000};  // how long to wait for the token line
  int preempt_signal = 0;       // see AgentConfig::preempt_signal
  // The controller's channel: stdin/stdout (SSH), or one socket both ways (an agent that dialled
  // back, controller.h), which then carries no token line: `token` is already known.
  int in_fd = 0;
  int out_fd = 1;
  std::string token;
};

// Runs the agent until its controller says quit or goes away. Returns the process exit status:
// 0 normally, 128+signal when a signal stopped it, 1 after a "fatal" message.
int run_agent_process(const AgentProcessOptions& options);

// Picks MASTER_PORT for this node: `port` 0 -> a free port; otherwise `port` if nothing listens
// there, else a system_error naming host:port with a hint.
int resolve_master_port(int port, const std::string& host);

}  // namespace ds::launch
