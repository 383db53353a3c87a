#include "launch/world.h"

#include <cctype>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"

namespace ds::launch {

World make_world(const std::vector<config::NodeSlots>& nodes, const std::string& master_addr,
                 int master_port) {
  World w;
  w.master_port = master_port;
  int rank = 0;
  for (size_t n = 0; n < nodes.size(); ++n) {
    NodeSpec node;
    node.node_rank = static_cast<int>(n);
    node.host = nodes[n].host;
    node.slots = nodes[n].slots;
    node.first_rank = rank;
    for (size_t l = 0; l < node.slots.size(); ++l) {
      WorkerSpec ws;
      ws.rank = rank++;
      ws.local_rank = static_cast<int>(l);
      ws.node_rank = node.node_rank;
      ws.host = node.host;
      ws.devices = {node.slots[l]};
      w.workers.push_back(ws);
    }
    w.nodes.push_back(std::move(node));
  }
  if (w.workers.empty()) throw invalid_argument("the job has no workers: every slot was filtered out");
  w.master_addr = master_addr.empty() ? w.nodes.front().host : master_addr;
  return w;
}

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

void check_master_reachable(const World& world) {
  if (!is_loopback_host(world.master_addr)) return;
  for (const auto& n : world.nodes) {
    if (is_loopback_host(n.host)) continue;
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("MASTER_ADDR '{}' is a loopback address but node {} ('{}') is another machine: it "
                            "would be sent the store address {}:<port>, which there is itself",
                            world.master_addr, n.node_rank, n.host, world.master_addr),
                "name node 0 in the hostfile by an address the other nodes reach (its hostname or IP), or pass "
                "--master-addr ADDR");
  }
}

EnvList worker_env(const World& world, const WorkerSpec& worker, const JobEnv& job) {
  const NodeSpec& node = world.nodes.at(static_cast<size_t>(worker.node_rank));
  EnvList env = {
      {"RANK", std::to_string(worker.rank)},
      {"LOCAL_RANK", std::to_string(worker.local_rank)},
      {"WORLD_SIZE", std::to_string(world.world_size())},
      {"LOCAL_WORLD_SIZE", std::to_string(node.slots.size())},
      {"NODE_RANK", std::to_string(worker.node_rank)},
      {"MASTER_ADDR", world.master_addr},
      {"MASTER_PORT", std::to_string(world.master_port)},
      {"CUDA_VISIBLE_DEVICES", fmt::format("{}", fmt::join(node.slots, ","))},
      {"DSTRAIN_STORE", job.store_addr},
      {"DSTRAIN_JOB_ID", job.job_id},
      {"DSTRAIN_JOB_TOKEN", job.job_token},
      {"DSTRAIN_RESTART_COUNT", std::to_string(job.restart_count)},
  };
  for (const auto& kv : job.user_env) env.push_back(kv);
  return env;
}

bool is_secret_env(const std::string& name) { return name == "DSTRAIN_JOB_TOKEN"; }

std::pair<std::string, std::string> parse_env_assignment(const std::string& text,
                                                         const std::string& origin) {
  auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw invalid_argument("{}: expected KEY=VALUE, got '{}'", origin, text);
  }
  std::string key = text.substr(0, eq);
  bool ok = !std::isdigit(static_cast<unsigned char>(key[0]));
  for (char c : key) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  if (!ok) {
    throw invalid_argument("{}: '{}' is not a valid environment variable name "
                           "(letters, digits and '_', not starting with a digit)",
                           origin, key);
  }
  return {key, text.substr(eq + 1)};
}

}  // namespace ds::launch
