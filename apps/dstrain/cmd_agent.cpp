// `dstrain agent` (internal): the per-node agent that `dstrain launch` starts over SSH. Its
// arguments carry the world and the command; the job token and extra environment arrive on
// stdin (lib/launch/agent_protocol.h). `--probe` answers `dstrain check` with one JSON line.
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
  sub.add_option("command", o.command, "the worker command (after --)");
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
  if (o.node_rank < 0 || o.node_rank >= static_cast<int>(p.world.nodes.size())) {
    throw invalid_argument("--node-rank {} is outside the world's {} node(s)", o.node_rank,
                           p.world.nodes.size());
  }
  p.node_rank = o.node_rank;
  p.command = o.command;
  p.job_id = o.job_id;
  p.kill_timeout = Millis(o.kill_timeout_ms);
  p.failure_grace = Millis(o.failure_grace_ms);
  p.bind_cores = o.bind_cores;
  p.cwd = o.cwd;
  p.serve_store = o.serve_store;
  p.store_port = o.store_port;
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
