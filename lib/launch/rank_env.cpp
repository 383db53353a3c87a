// Rank resolution: read every source that is present, pick the innermost, check the others that
// describe a world of the same size against it.
#include "launch/rank_env.h"

#include <vector>

#include <fmt/format.h>

#include "common/env.h"
#include "common/error.h"
#include "common/strings.h"

namespace ds::launch {

EnvGetter process_env() {
  return [](const char* name) -> std::optional<std::string> {
    auto v = env::get(name);
    if (v && trim(*v).empty()) return std::nullopt;
    return v;
  };
}

namespace {

struct SourceDef {
  const char* label;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;  // nullptr: computed (Slurm)
  const char* node;        // nullptr: unknown
};

// Innermost first.
const SourceDef kSources[] = {
    {"RANK/WORLD_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK"},
    {"Open MPI (OMPI_COMM_WORLD_*)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", nullptr},
    {"MPICH/Hydra (PMI_RANK/PMI_SIZE)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
     "MPI_LOCALNRANKS", nullptr},
    {"Slurm's srun (SLURM_PROCID/SLURM_NTASKS)", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
     nullptr, "SLURM_NODEID"},
};

int read_int(const EnvGetter& env, const char* name, int min, int max) {
  auto v = env(name);
  if (!v) return -1;
  auto n = parse_int(trim(*v));
  if (!n || *n < min || *n > max) {
    throw Error(
        ErrorKind::kInvalidArgument,
        fmt::format("environment variable {}='{}' is not a valid value (expected an integer "
                    "in {}..{})",
                    name, *v, min, max),
        "unset it, or fix whatever exports it");
  }
  return static_cast<int>(*n);
}

std::optional<RankInfo> read_source(const EnvGetter& env, const SourceDef& d) {
  const bool slurm = d.local_size == nullptr;
  if (slurm && !env("SLURM_STEP_ID")) return std::nullopt;  // the batch script, not a task
  bool has_rank = env(d.rank).has_value(), has_size = env(d.size).has_value();
  if (!has_rank && !has_size) return std::nullopt;
  if (has_rank != has_size) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{} is set but {} is not: a rank needs its world size",
                            has_rank ? d.rank : d.size, has_rank ? d.size : d.rank),
                fmt::format("set both {} and {}, or neither", d.rank, d.size));
  }
  RankInfo r;
  r.source = d.label;
  r.world_size = read_int(env, d.size, 1, 1 << 24);
  r.rank = read_int(env, d.rank, 0, r.world_size - 1);
  if (r.rank < 0) {
    throw invalid_argument("{} is set but {} is not a rank below {}={}", d.rank, d.rank, d.size,
                           r.world_size);
  }
  r.local_rank = read_int(env, d.local_rank, 0, r.world_size - 1);
  if (d.node != nullptr) r.node_rank = read_int(env, d.node, 0, r.world_size - 1);
  if (!slurm) {
    r.local_world_size = read_int(env, d.local_size, 1, r.world_size);
  } else if (auto tpn = env("SLURM_STEP_TASKS_PER_NODE"); tpn && r.node_rank >= 0) {
    r.local_world_size = slurm_tasks_on_node(*tpn, r.node_rank);
  }
  if (r.local_rank >= 0 && r.local_world_size > 0 && r.local_rank >= r.local_world_size) {
    throw invalid_argument("{}={} is not below the {} process(es) its source puts on this node",
                           d.local_rank, r.local_rank, r.local_world_size);
  }
  return r;
}

}  // namespace

int slurm_tasks_on_node(const std::string& text, int node) {
  int seen = 0;
  for (const auto& part : split(text, ',')) {
    std::string_view p = trim(part);
    int64_t repeat = 1;
    auto paren = p.find('(');
    if (paren != std::string_view::npos) {
      if (p.size() < paren + 4 || p.substr(paren, 2) != "(x" || p.back() != ')') return -1;
      auto rep = parse_int(p.substr(paren + 2, p.size() - paren - 3));
      if (!rep || *rep < 1) return -1;
      repeat = *rep;
      p = p.substr(0, paren);
    }
    auto tasks = parse_int(p);
    if (!tasks || *tasks < 0) return -1;
    if (node < seen + repeat) return static_cast<int>(*tasks);
    seen += static_cast<int>(repeat);
  }
  return -1;
}

std::optional<RankInfo> resolve_rank(const EnvGetter& env) {
  std::vector<RankInfo> present;
  for (const auto& d : kSources) {
    if (auto r = read_source(env, d)) present.push_back(*r);
  }
  if (present.empty()) return std::nullopt;
  const RankInfo& win = present.front();
  for (size_t i = 1; i < present.size(); ++i) {
    const RankInfo& other = present[i];
    if (other.world_size != win.world_size) continue;  // an outer launcher's own processes
    bool local_differs =
        win.local_rank >= 0 && other.local_rank >= 0 && win.local_rank != other.local_rank;
    if (other.rank == win.rank && !local_differs) continue;
    throw Error(
        ErrorKind::kInvalidArgument,
        fmt::format("two rank sources disagree about this process of a {}-rank world: {} says "
                    "rank {} (local rank {}), {} says rank {} (local rank {})",
                    win.world_size, win.source, win.rank, win.local_rank, other.source, other.rank,
                    other.local_rank),
        "start the ranks with one launcher, and do not export RANK/WORLD_SIZE/LOCAL_RANK in a "
        "batch script that srun or mpirun runs (unset them there)");
  }
  return win;
}

}  // namespace ds::launch
