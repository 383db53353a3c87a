// `dstrain agent` (internal): the per-node agent that `dstrain launch` starts over SSH, or
// through srun/mpirun. Its arguments carry the world and the command. Over SSH the job token and
// extra environment arrive on stdin (lib/launch/agent_protocol.h); started by srun/mpirun
// (--controller), it reads its node rank from their environment (lib/launch/rank_env.h), the
// token from DSTRAIN_JOB_TOKEN, and dials back to the launcher (lib/launch/controller.h).
// `--probe` answers `dstrain check` with one JSON line.
#include <unistd.h>

#include <iostream>
#include <thread>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common/error.h"
#include "core/device.h"
#include "dstrain/build_info.h"
#include "launch/agent.h"
#include "launch/agent_main.h"
#include "launch/agent_protocol.h"
#include "launch/controller.h"
#include "launch/rank_env.h"
#include "common/env.h"
#include "common/socket.h"

namespace ds::cli {

namespace {

struct AgentOptions {
  std::string job_id;
  int node_rank = 0;
  std::string world_json;
  int64_t kill_timeout_ms = launch::kDefaultKillTimeout.count();
  int64_t failure_grace_ms = launch::kDefaultFailureGrace.count();
  bool bind_cores = false;
  std::string cwd;
  bool serve_store = false;
  int store_port = 0;
  bool probe = false;
  int master_port = 29500;
  bool node_rank_from_env = false;
  std::string controller;  // host:port to dial back to
  int preempt_signal = 0;
  std::vector<std::string> command;
};

void setup_agent(CLI::App& sub, AgentOptions& o) {
  sub.add_option("--job-id", o.job_id, "the job's id");
  sub.add_option("--node-rank", o.node_rank, "this node's index in the world");
  sub.add_option("--world", o.world_json, "the world as JSON (nodes, slots, master address/port)");
  sub.add_option("--kill-timeout-ms", o.kill_timeout_ms, "SIGTERM -> SIGKILL grace in ms");
  sub.add_option("--failure-grace-ms", o.failure_grace_ms,
                 "after a worker fails: ms the others may take to exit before SIGTERM");
  sub.add_flag("--bind-cores-to-rank", o.bind_cores, "pin each local rank to its block of CPUs");
  sub.add_option("--cwd", o.cwd, "the workers' working directory");
  sub.add_flag("--serve-store", o.serve_store, "host the job's store (node 0)");
  sub.add_option("--store-port", o.store_port, "the store's port (0: a free one)");
  sub.add_flag("--probe", o.probe, "print this node's facts as JSON for `dstrain check`, then exit");
  sub.add_option("--master-port", o.master_port, "with --probe: the port to check");
  sub.add_flag("--node-rank-from-env", o.node_rank_from_env,
               "take the node rank from srun's or mpirun's environment (then node 0 hosts the store)");
  sub.add_option("--controller", o.controller, "host:port of the launcher to dial back to");
  sub.add_option("--preempt-signal", o.preempt_signal, "signal number forwarded to the workers as preemption");
  sub.add_option("command", o.command, "the worker command (after --)");
}

// srun's or mpirun's rank of this agent: its node. The step must have one task per node of the
// world, and under Slurm this node must be the world's node of that rank.
int node_rank_from_env(int nodes, const launch::World& world) {
  auto r = launch::resolve_rank(launch::process_env());
  if (!r) {
    throw Error(ErrorKind::kInvalidUsage, "dstrain agent --node-rank-from-env: no rank in the environment",
                "srun or mpirun must start the agent (SLURM_PROCID, OMPI_COMM_WORLD_RANK or PMI_RANK)");
  }
  if (r->world_size != nodes) {
    throw invalid_argument("dstrain agent: {} started {} agent(s) but the world has {} node(s)", r->source,
                           r->world_size, nodes);
  }
  auto slurm_node = env::get("SLURMD_NODENAME");
  const std::string& host = world.nodes.at(static_cast<size_t>(r->rank)).host;
  if (slurm_node && env::get("SLURM_STEP_ID") && *slurm_node != host) {
    throw invalid_argument("dstrain agent: srun put node rank {} on {}, but the world has {} there", r->rank,
                           *slurm_node, host);
  }
  return r->rank;
}

int run_agent(const AgentOptions& o) {
  if (o.probe) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    bool port_free = true;
    try {
      launch::resolve_master_port(o.master_port, host);
    } catch (const Error&) {
      port_free = false;
    }
    nlohmann::json j = {{"version", DSTRAIN_VERSION},
                        {"hostname", host},
                        {"gpus", rt::gpu_count()},
                        {"cpus", launch::available_cpus().size()},
                        {"master_port", o.master_port},
                        {"master_port_free", port_free}};
    std::cout << j.dump() << "\n";
    return 0;
  }
  if (o.world_json.empty() || o.command.empty()) {
    throw Error(ErrorKind::kInvalidUsage, "dstrain agent needs --world and a command after --",
                "the agent is internal: `dstrain launch` starts it on every node");
  }
  launch::AgentProcessOptions p;
  p.world = launch::proto::world_from_json(o.world_json);
  const int nodes = static_cast<int>(p.world.nodes.size());
  p.node_rank = o.node_rank_from_env ? node_rank_from_env(nodes, p.world) : o.node_rank;
  if (p.node_rank < 0 || p.node_rank >= nodes) {
    throw invalid_argument("--node-rank {} is outside the world's {} node(s)", p.node_rank, nodes);
  }
  p.command = o.command;
  p.job_id = o.job_id;
  p.kill_timeout = Millis(o.kill_timeout_ms);
  p.failure_grace = Millis(o.failure_grace_ms);
  p.bind_cores = o.bind_cores;
  p.cwd = o.cwd;
  p.serve_store = o.serve_store || (o.node_rank_from_env && p.node_rank == 0);
  p.store_port = o.store_port;
  p.preempt_signal = o.preempt_signal;
  if (!o.controller.empty()) {
    p.token = env::get_or_default("DSTRAIN_JOB_TOKEN");
    if (p.token.empty()) {
      throw Error(ErrorKind::kInvalidUsage, "dstrain agent --controller: DSTRAIN_JOB_TOKEN is not set",
                  "the launcher sets it for srun/mpirun; with mpirun it must be passed on (-x DSTRAIN_JOB_TOKEN)");
    }
    auto at = net::parse_host_port(o.controller, "--controller");
    net::Fd fd = launch::dial_controller(at, p.token, p.node_rank, Deadline::after(Millis(60000)));
    p.in_fd = p.out_fd = fd.release();  // open for the agent's life
  }
  return launch::run_agent_process(p);
}

}  // namespace

void add_agent_command(CLI::App& app, std::vector<Command>& out) {
  auto opts = std::make_shared<AgentOptions>();
  auto* sub = app.add_subcommand("agent", "(internal) the per-node agent `dstrain launch` starts");
  sub->group("");  // hidden from --help
  setup_agent(*sub, *opts);
  out.push_back({sub, [opts] { return run_agent(*opts); }});
}

}  // namespace ds::cli
