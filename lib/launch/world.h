// The world of a job: which rank runs where, and the environment contract every worker gets.
// Pure data and arithmetic; the launcher, the agent and `launch --dry-run` all derive from it.
//
// Ranks are numbered node by node in hostfile order, local ranks in slot order. A worker's
// devices are its node's slot at its local rank; CUDA_VISIBLE_DEVICES lists all of the node's
// selected slots (as DeepSpeed sets it), so a PyTorch script's set_device(LOCAL_RANK) works.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "config/hostfile.h"

namespace ds::launch {

struct WorkerSpec {
  int rank = 0;
  int local_rank = 0;
  int node_rank = 0;
  std::string host;
  std::vector<int> devices;  // slot index on its host (the CUDA device index with GPUs)
};

struct NodeSpec {
  int node_rank = 0;
  std::string host;
  std::vector<int> slots;
  int first_rank = 0;  // global rank of local rank 0
};

struct World {
  std::vector<NodeSpec> nodes;
  std::vector<WorkerSpec> workers;
  std::string master_addr;  // MASTER_ADDR: the first node unless overridden
  int master_port = 29500;  // MASTER_PORT: left free for the job's own use
  int world_size() const { return static_cast<int>(workers.size()); }
};

// Builds the world from filtered hosts. `master_addr` empty means the first node's host.
World make_world(const std::vector<config::NodeSlots>& nodes, const std::string& master_addr,
                 int master_port);

// True for names that mean "this machine" on every host: localhost, 127.0.0.0/8, ::1.
bool is_loopback_host(const std::string& host);

// A job whose MASTER_ADDR (node 0's host unless --master-addr) is a loopback name while some node
// is not would hand the remote nodes a store address that, on them, is themselves. Throws
// invalid_argument naming both hosts and the fix (name node 0 by an address the others reach, or
// --master-addr). All-loopback worlds (one machine, as the SSH tests' 127.0.0.2/127.0.0.3) pass.
void check_master_reachable(const World& world);

using EnvList = std::vector<std::pair<std::string, std::string>>;

// Job-wide values that are not part of the world's shape.
struct JobEnv {
  std::string store_addr;   // DSTRAIN_STORE host:port
  std::string job_id;       // DSTRAIN_JOB_ID
  std::string job_token;    // DSTRAIN_JOB_TOKEN (secret: never printed)
  int restart_count = 0;    // DSTRAIN_RESTART_COUNT
  EnvList user_env;         // --env KEY=VAL and .dstrain_env, applied after the contract
};

// The environment contract for one worker, in a fixed order: RANK LOCAL_RANK WORLD_SIZE
// LOCAL_WORLD_SIZE NODE_RANK MASTER_ADDR MASTER_PORT CUDA_VISIBLE_DEVICES DSTRAIN_STORE
// DSTRAIN_JOB_ID DSTRAIN_JOB_TOKEN DSTRAIN_RESTART_COUNT, then the user's variables.
EnvList worker_env(const World& world, const WorkerSpec& worker, const JobEnv& job);

// The names whose values are secret: printing code replaces their values with "<hidden>".
bool is_secret_env(const std::string& name);

// "KEY=VAL" -> pair; a missing '=' or an invalid name is an invalid_argument naming `origin`.
std::pair<std::string, std::string> parse_env_assignment(const std::string& text,
                                                         const std::string& origin);

}  // namespace ds::launch
