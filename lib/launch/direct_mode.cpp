#include "launch/direct_mode.h"

#include <stdlib.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/strings.h"
#include "launch/slurm.h"
#include "store/tcp_store_client.h"
#include "store/tcp_store_server.h"

namespace ds::launch {

namespace {

constexpr int kDefaultStorePort = 29401;

std::string master_addr(const EnvGetter& env, const RankInfo& r) {
  if (auto a = env("MASTER_ADDR")) return std::string(trim(*a));
  if (r.local_world_size == r.world_size) return "127.0.0.1";
  std::string first = slurm_first_node(env);
  if (!first.empty()) return first;
  throw Error(
      ErrorKind::kInvalidArgument,
      fmt::format("{} started {} ranks on several nodes, but nothing says where rank 0 (and so "
                  "the store) runs",
                  r.source, r.world_size),
      "set MASTER_ADDR to rank 0's host for every rank (mpirun -x MASTER_ADDR=host0 ...)");
}

int store_port(const EnvGetter& env) {
  auto v = env("DSTRAIN_STORE_PORT");
  if (!v) return kDefaultStorePort;
  auto p = parse_int(trim(*v));
  if (!p || *p < 1 || *p > 65535) {
    throw invalid_argument("environment variable DSTRAIN_STORE_PORT='{}' is not a port (1..65535)",
                           *v);
  }
  return static_cast<int>(*p);
}

void put(const char* name, const std::string& value) {
  ::setenv(name, value.c_str(), 1);
}

}  // namespace

std::string slurm_first_node(const EnvGetter& env) {
  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"}) {
    if (auto list = env(name)) return expand_nodelist(std::string(trim(*list))).front();
  }
  return "";
}

std::unique_ptr<DirectMode> DirectMode::enter(const EnvGetter& env) {
  if (env("DSTRAIN_STORE")) return nullptr;
  auto r = resolve_rank(env);
  if (!r || r->world_size <= 1) return nullptr;
  auto token = env("DSTRAIN_JOB_TOKEN");
  if (!token) {
    throw Error(
        ErrorKind::kInvalidUsage,
        fmt::format("rank {} of {} (from {}) needs the job token in DSTRAIN_JOB_TOKEN: the ranks "
                    "meet in a store that rank 0 hosts, and it is never open",
                    r->rank, r->world_size, r->source),
        "export DSTRAIN_JOB_TOKEN=$(dstrain token) before srun or mpirun (srun passes it on; "
        "Open MPI needs mpirun -x DSTRAIN_JOB_TOKEN)");
  }
  std::unique_ptr<DirectMode> d(new DirectMode());
  d->rank_ = *r;
  const std::string addr = master_addr(env, *r);
  const int port = store_port(env);
  put("RANK", std::to_string(r->rank));
  put("WORLD_SIZE", std::to_string(r->world_size));
  put("LOCAL_RANK", std::to_string(std::max(0, r->local_rank)));
  if (r->local_world_size > 0) put("LOCAL_WORLD_SIZE", std::to_string(r->local_world_size));
  if (r->node_rank >= 0) put("NODE_RANK", std::to_string(r->node_rank));
  put("MASTER_ADDR", addr);
  if (!env("MASTER_PORT")) put("MASTER_PORT", "29500");
  put("DSTRAIN_STORE", fmt::format("{}:{}", addr, port));
  if (!env("DSTRAIN_JOB_ID")) put("DSTRAIN_JOB_ID", env("SLURM_JOB_ID").value_or("direct"));
  if (r->rank == 0) {
    store::TcpStoreServerOptions so;
    so.port = port;
    so.token = *token;
    d->server_ = std::make_unique<store::TcpStoreServer>(so);
    try {
      d->server_->start();
    } catch (const Error& e) {
      throw Error(e.kind(), fmt::format("rank 0 cannot host the job's store: {}", e.what()),
                  "pick another port with DSTRAIN_STORE_PORT (the same for every rank)");
    }
  }
  spdlog::debug("direct mode: rank {} of {} from {}; store at {}:{}", r->rank, r->world_size,
                r->source, addr, port);
  return d;
}

DirectMode::~DirectMode() = default;

void DirectMode::leave(Millis timeout) {
  try {
    auto client = store::connect_from_env(Millis(10000));
    client->set(fmt::format("direct/left/{}", rank_.rank), store::to_bytes("1"));
    if (rank_.rank == 0) {
      std::vector<std::string> keys;
      for (int q = 0; q < rank_.world_size; ++q) keys.push_back(fmt::format("direct/left/{}", q));
      client->wait(keys, timeout);
    }
  } catch (const Error& e) {
    spdlog::warn("direct mode: not every rank left the store cleanly: {}", e.what());
  }
  if (server_) server_->stop();
}

}  // namespace ds::launch
