// run_job: picks the backend; the local backend (the Agent in this process, which hosts the
// store) is here, the remote ones in remote_job.cpp, --launcher none in none_job.cpp.
#include "launch/launcher.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <memory>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/socket.h"
#include "common/strings.h"
#include "dstrain/build_info.h"
#include "launch/agent_main.h"
#include "launch/agent_protocol.h"
#include "launch/job_summary.h"
#include "launch/none_job.h"
#include "launch/remote_job.h"
#include "launch/teardown.h"
#include "store/tcp_store_server.h"

namespace ds::launch {

bool is_local_host(const std::string& host) {
  if (host == "localhost" || host == "127.0.0.1" || host == "::1") return true;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0 && host == name) return true;
  return false;
}

namespace {
std::string random_hex(size_t bytes) {
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = ::getrandom(raw.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw system_error("getrandom: {}", errno_string(errno));
    }
    got += static_cast<size_t>(n);
  }
  std::string out;
  for (unsigned char c : raw) out += fmt::format("{:02x}", c);
  return out;
}

// ---------------------------------------------------------------- local backend

bool all_preempted(const GenerationResult& r, int world_size) {
  int n = 0;
  for (const auto& e : r.exits) n += is_preemption(Failure{e.rank, "", e.status, {}}) ? 1 : 0;
  return n == world_size;
}

// The local node's generation `r` into the job's outcome: its first failure, or the signal that
// stopped it (SIGTERM for a stop without one), and whether every rank was preempted. A signal
// that arrived during a failure's grace stays beside the failure, as the remote launcher keeps
// it: the user or the scheduler said stop, so the job is not restarted (restart_after).
void add_generation(const GenerationResult& r, const std::string& host, JobOutcome& outcome) {
  if (r.ok()) return;
  outcome.preempted = all_preempted(r, outcome.world_size);
  if (r.stop_signal != 0 || !r.first_failure) {
    outcome.stop_signal = r.stop_signal != 0 ? r.stop_signal : SIGTERM;
    return;
  }
  outcome.failure = Failure{r.first_failure->rank, host, r.first_failure->status, {}};
  outcome.stop_signal = r.interrupt_signal;
}

class LocalListener : public AgentListener {
 public:
  explicit LocalListener(OutputMux& mux) : mux_(mux) {}
  void on_started(int rank, pid_t pid) override { spdlog::debug("rank {} started: pid {}", rank, pid); }
  void on_output(int rank, int stream, std::string_view line) override { mux_.line(rank, stream, line); }
  void on_exit(int rank, const ExitStatus& s) override {
    spdlog::debug("rank {} ended: {}", rank, s.describe());
  }

 private:
  OutputMux& mux_;
};

int run_local(const JobSpec& spec, OutputMux& mux) {
  JobOutcome outcome;
  outcome.started = SteadyClock::now();
  outcome.world_size = spec.world.world_size();
  ignore_sigpipe();
  SignalPipe signals(spec.preempt_signal);
  const NodeSpec& node = spec.world.nodes.front();
  AgentConfig cfg = agent_config(spec, 0);
  cfg.job_id = make_job_id();
  cfg.token = spec.token.empty() ? make_job_token() : spec.token;

  int master_port = resolve_master_port(spec.world.master_port, node.host);
  store::TcpStoreServerOptions so;
  so.port = spec.store_port;
  so.token = cfg.token;
  store::TcpStoreServer server(so);
  server.start();
  std::string store_addr = fmt::format("127.0.0.1:{}", server.port());
  spdlog::debug("job {}: store at {}, MASTER_PORT {}", cfg.job_id, store_addr, master_port);

  LocalListener listener(mux);
  Agent agent(cfg, listener, signals);
  for (int restart = 0;; ++restart) {
    outcome.restarts = restart;
    add_generation(agent.run(store_addr, master_port, restart), node.host, outcome);
    if (!restart_after(outcome, restart, spec.max_restarts)) return finish(mux, outcome);
    mux.note(fmt::format("dstrain: {}; restarting every rank ({}/{})", describe_failure(*outcome.failure),
                         restart + 1, spec.max_restarts));
    mux.restart_marker(restart + 1);
    outcome.failure.reset();
  }
}

// ---------------------------------------------------------------- remote backends, elastic

std::unique_ptr<AgentStarter> make_starter(const JobSpec& spec, OutputMux& mux) {
  if (spec.backend == Backend::kSlurm || spec.backend == Backend::kOpenMpi || spec.backend == Backend::kMpich) {
    return make_cluster_starter(spec, mux);
  }
  return make_ssh_starter(spec);
}

void set_env(EnvList& env, const std::string& key, const std::string& value) {
  for (auto& kv : env) {
    if (kv.first == key) {
      kv.second = value;
      return;
    }
  }
  env.emplace_back(key, value);
}

// The world without the lost nodes (renumbered in their old order).
World shrunk_world(const JobSpec& spec, const std::vector<LostNode>& lost) {
  std::vector<config::NodeSlots> nodes;
  for (const auto& n : spec.world.nodes) {
    bool gone = false;
    for (const auto& l : lost) gone = gone || l.node_rank == n.node_rank;
    if (!gone) nodes.push_back({n.host, n.slots});
  }
  return make_world(nodes, spec.master_addr_option, spec.world.master_port);
}

std::string lost_nodes_text(const std::vector<LostNode>& lost) {
  std::string s;
  for (const auto& l : lost) s += fmt::format("{}node {} ({})", s.empty() ? "" : ", ", l.node_rank, l.host);
  return s;
}

// A remote job; with --nnodes MIN:MAX (spec.min_nodes) it goes on without the nodes it loses, as
// long as MIN remain (launcher.h: JobSpec::min_nodes).
int run_remote(const JobSpec& given, OutputMux& mux) {
  if (given.min_nodes <= 0) {
    auto starter = make_starter(given, mux);
    return run_remote_job(given, mux, *starter);
  }
  JobSpec spec = given;
  set_env(spec.user_env, "DSTRAIN_ELASTIC_WORLD_SIZE", std::to_string(spec.world.world_size()));
  const size_t first_nodes = spec.world.nodes.size();
  for (int elastic_restarts = 0;;) {
    RemoteResult r;
    {
      auto starter = make_starter(spec, mux);
      r = run_remote_attempt(spec, mux, *starter);
    }
    if (r.forced) return 128 + r.outcome.stop_signal;
    const size_t left = spec.world.nodes.size() - r.lost.size();
    const bool node_loss = !r.lost.empty() && r.outcome.stop_signal == 0 && !r.outcome.preempted;
    if (!node_loss) return finish(mux, r.outcome);
    const auto step = mux.failed_at_step();
    const std::string at = step ? fmt::format(" at step {}", *step) : "";
    if (left < static_cast<size_t>(spec.min_nodes)) {
      mux.note(fmt::format("dstrain: lost {}{}: {} of {} node(s) left, fewer than the {} --nnodes asks for",
                           lost_nodes_text(r.lost), at, left, first_nodes, spec.min_nodes));
      return finish(mux, r.outcome);
    }
    ++elastic_restarts;
    const double lost_at = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() -
                           std::chrono::duration<double>(SteadyClock::now() - r.lost.front().when).count();
    spec.world = shrunk_world(spec, r.lost);
    spec.restart_base += r.outcome.restarts + 1;
    set_env(spec.user_env, "DSTRAIN_ELASTIC_RESTARTS", std::to_string(elastic_restarts));
    set_env(spec.user_env, "DSTRAIN_ELASTIC_LOST_AT", fmt::format("{:.3f}", lost_at));
    mux.note(fmt::format("dstrain: lost {}{} ({}); restarting on the {} remaining node(s), {} rank(s), from the latest "
                         "checkpoint (elastic restart {}; --nnodes {}:{})",
                         lost_nodes_text(r.lost), at, r.lost.front().why, spec.world.nodes.size(),
                         spec.world.world_size(), elastic_restarts, spec.min_nodes, spec.max_nodes));
    mux.restart_marker(spec.restart_base);
  }
}

}  // namespace

std::string make_job_token() { return random_hex(32); }

std::string make_job_id() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return fmt::format("dstrain-{}-{}", buf, random_hex(3));
}

AgentConfig agent_config(const JobSpec& spec, int node_rank) {
  AgentConfig cfg;
  cfg.world = spec.world;
  cfg.node_rank = node_rank;
  cfg.command = spec.command;
  cfg.user_env = spec.user_env;
  cfg.kill_timeout = spec.kill_timeout;
  cfg.failure_grace = spec.failure_grace;
  cfg.bind_cores = spec.bind_cores;
  cfg.cwd = spec.cwd;
  cfg.preempt_signal = spec.preempt_signal;
  return cfg;
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kAuto: return "auto";
    case Backend::kLocal: return "local";
    case Backend::kSsh: return "ssh";
    case Backend::kSlurm: return "slurm";
    case Backend::kOpenMpi: return "openmpi";
    case Backend::kMpich: return "mpich";
    case Backend::kNone: return "none";
  }
  return "?";
}

std::vector<std::string> agent_command(const JobSpec& spec, const std::string& job_id,
                                       int node_rank, const std::string& controller) {
  std::vector<std::string> cmd = {spec.remote_dstrain};
  if (!spec.agent_log_level.empty()) {
    cmd.push_back("--log-level");
    cmd.push_back(spec.agent_log_level);
  }
  cmd.insert(cmd.end(), {"agent", "--job-id", job_id, "--world", proto::world_to_json(spec.world),
                         "--kill-timeout-ms", std::to_string(spec.kill_timeout.count()),
                         "--failure-grace-ms", std::to_string(spec.failure_grace.count())});
  if (node_rank >= 0) {
    cmd.insert(cmd.end(), {"--node-rank", std::to_string(node_rank)});
  } else {
    cmd.insert(cmd.end(), {"--node-rank-from-env", "--controller", controller});
  }
  if (spec.bind_cores) cmd.push_back("--bind-cores-to-rank");
  if (spec.preempt_signal != 0) cmd.insert(cmd.end(), {"--preempt-signal", std::to_string(spec.preempt_signal)});
  if (!spec.cwd.empty()) cmd.insert(cmd.end(), {"--cwd", spec.cwd});
  if (node_rank <= 0) {
    if (node_rank == 0) cmd.push_back("--serve-store");
    cmd.insert(cmd.end(), {"--store-port", std::to_string(spec.store_port)});
  }
  cmd.push_back("--");
  cmd.insert(cmd.end(), spec.command.begin(), spec.command.end());
  return cmd;
}

int run_job(const JobSpec& spec) {
  OutputMux mux(spec.output);
  const bool one_local = spec.world.nodes.size() == 1 && is_local_host(spec.world.nodes.front().host);
  switch (spec.backend) {
    case Backend::kLocal:
      if (!one_local) {
        throw invalid_usage("--launcher local runs a single local node; this job has {} node(s) "
                            "starting with '{}': use --launcher ssh",
                            spec.world.nodes.size(), spec.world.nodes.front().host);
      }
      return run_local(spec, mux);
    case Backend::kAuto:
      if (one_local) return run_local(spec, mux);
      [[fallthrough]];
    case Backend::kSsh:
    case Backend::kSlurm:
    case Backend::kOpenMpi:
    case Backend::kMpich: return run_remote(spec, mux);
    case Backend::kNone: return run_none_node(spec, mux);
  }
  return 1;
}

}  // namespace ds::launch
