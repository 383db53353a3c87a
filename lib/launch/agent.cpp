// The agent's supervision loop. One poll() over: the signal pipe (SIGCHLD reaps, SIGINT/TERM/HUP
// tear down), the controller's fd, and every worker's stdout and stderr pipe. Every event goes to
// the teardown machine (teardown.h), which decides; this file carries out its orders.
//
// After the first worker failure: a grace period (failure_grace) in which the others may exit on
// their own, e.g. after reporting the dead peer from a collective; then teardown. A signal or a
// controller stop skips the grace period.
// Teardown: SIGTERM to the process group of every worker still running, then SIGKILL to those
// left when the kill timeout passes. A worker reaped during teardown gets its group SIGKILLed
// right away, so children it left in its group do not outlive it.
#include "launch/agent.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "launch/output.h"

namespace ds::launch {

std::vector<int> available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) out.push_back(c);
    }
  }
  if (out.empty()) {
    unsigned n = std::max(1u, std::thread::hardware_concurrency());
    for (unsigned c = 0; c < n; ++c) out.push_back(static_cast<int>(c));
  }
  return out;
}

std::vector<int> cpus_for_local_rank(const std::vector<int>& cpus, int local_rank,
                                     int local_world_size) {
  if (cpus.empty() || local_world_size <= 0) return {};
  size_t n = cpus.size(), lws = static_cast<size_t>(local_world_size);
  size_t lr = static_cast<size_t>(local_rank);
  if (n < lws) return {cpus[lr % n]};  // more ranks than CPUs: share round-robin
  size_t per = n / lws;
  return std::vector<int>(cpus.begin() + static_cast<std::ptrdiff_t>(lr * per),
                          cpus.begin() + static_cast<std::ptrdiff_t>((lr + 1) * per));
}

EnvList build_worker_env(const AgentConfig& cfg, const WorkerSpec& worker, const JobEnv& job,
                         int num_cpus) {
  EnvList env;
  std::map<std::string, size_t> index;
  auto put = [&](const std::string& k, const std::string& v) {
    auto it = index.find(k);
    if (it != index.end()) {
      env[it->second].second = v;
    } else {
      index[k] = env.size();
      env.emplace_back(k, v);
    }
  };
  for (const auto& [k, v] : current_environment()) put(k, v);
  JobEnv contract = job;
  contract.user_env.clear();
  for (const auto& [k, v] : worker_env(cfg.world, worker, contract)) put(k, v);
  bool user_omp = index.count("OMP_NUM_THREADS") > 0;
  for (const auto& kv : cfg.user_env) user_omp = user_omp || kv.first == "OMP_NUM_THREADS";
  if (cfg.preempt_signal != 0) put("DSTRAIN_PREEMPT_SIGNAL", signal_name(cfg.preempt_signal));
  if (!user_omp) {
    int local = static_cast<int>(cfg.world.nodes.at(static_cast<size_t>(worker.node_rank)).slots.size());
    put("OMP_NUM_THREADS", std::to_string(std::max(1, num_cpus / std::max(1, local))));
  }
  for (const auto& [k, v] : cfg.user_env) put(k, v);
  return env;
}

Agent::Agent(AgentConfig config, AgentListener& listener, SignalPipe& signals)
    : config_(std::move(config)), listener_(listener), signals_(signals) {}

namespace {

struct Running {
  const WorkerSpec* spec = nullptr;
  pid_t pid = -1;
  int fds[2] = {-1, -1};  // stdout, stderr read ends
  LineSplitter lines[2];
  bool reaped = false;
};

JobEnv job_env(const AgentConfig& cfg, const std::string& store_addr, int restart_count) {
  JobEnv job;
  job.store_addr = store_addr;
  job.job_id = cfg.job_id;
  job.job_token = cfg.token;
  job.restart_count = restart_count;
  job.user_env = cfg.user_env;
  return job;
}

// One generation of this node's workers: their processes and pipes, driven by the teardown
// machine (teardown.h), whose orders become signals to the workers' process groups.
class NodeGeneration {
 public:
  // `stop_requested` and `stop_signal` are the agent's: a listener or on_control may change them
  // while the generation runs.
  NodeGeneration(AgentConfig cfg, AgentListener& listener, SignalPipe& signals,
                 const bool& stop_requested, bool& dump_requested, const int& stop_signal)
      : cfg_(std::move(cfg)),
        node_(cfg_.world.nodes.at(static_cast<size_t>(cfg_.node_rank))),
        listener_(listener),
        signals_(signals),
        stop_requested_(stop_requested),
        dump_requested_(dump_requested),
        stop_signal_(stop_signal),
        teardown_(TeardownPolicy{cfg_.failure_grace, cfg_.kill_timeout, cfg_.preempt_signal}) {
    workers_.reserve(node_.slots.size());
    for (const auto& w : cfg_.world.workers) {
      if (w.node_rank != cfg_.node_rank) continue;
      workers_.emplace_back();
      workers_.back().spec = &w;
    }
  }
  NodeGeneration(const NodeGeneration&) = delete;
  NodeGeneration& operator=(const NodeGeneration&) = delete;

  // Forks every worker of this node, then confirms each exec (so N workers start in parallel
  // rather than one exec after another). A worker that cannot start is a failure (code 127).
  void start_workers(const JobEnv& job) {
    const std::vector<int> cpus = available_cpus();
    std::vector<Spawned> started(workers_.size());
    for (size_t i = 0; i < workers_.size() && !teardown_.stopping(); ++i) {
      fork_worker(workers_[i], started[i], job, cpus);
    }
    for (size_t i = 0; i < workers_.size(); ++i) confirm_worker(workers_[i], started[i]);
  }

  // Until every started worker is reaped: their output, the signals, the controller, the time.
  void supervise(int control_fd, const std::function<bool()>& on_control) {
    control_fd_ = control_fd;
    control_open_ = control_fd >= 0;
    while (running_ > 0) {
      if (stop_requested_) carry_out(teardown_.stop_requested(stop_signal_, Clock::now()));
      poll_once(on_control);
      if (dump_requested_) {
        dump_requested_ = false;
        dump_flight_records();
      }
      reap();
      if (running_ > 0) carry_out(teardown_.tick(Clock::now()));
    }
  }

  GenerationResult finish() {
    for (auto& r : workers_) {
      pump(r, 0, true);
      pump(r, 1, true);
    }
    return teardown_.generation_result();
  }

 private:
  void fork_worker(Running& r, Spawned& started, const JobEnv& job, const std::vector<int>& cpus) {
    SpawnRequest req;
    req.argv = cfg_.command;
    req.env = build_worker_env(cfg_, *r.spec, job, static_cast<int>(cpus.size()));
    req.cwd = cfg_.cwd;
    req.defer_exec_check = true;
    if (cfg_.bind_cores) {
      req.cpus = cpus_for_local_rank(cpus, r.spec->local_rank, static_cast<int>(workers_.size()));
    }
    try {
      started = spawn(req);
      r.pid = started.pid;
      r.fds[0] = started.stdout_fd;
      r.fds[1] = started.stderr_fd;
      ++running_;
    } catch (const Error& e) {
      not_started(r, e.what());
    }
  }

  void confirm_worker(Running& r, Spawned& started) {
    if (r.pid <= 0) return;
    try {
      confirm_exec(started);
      listener_.on_started(r.spec->rank, r.pid);
    } catch (const Error& e) {
      r.pid = -1;
      r.fds[0] = r.fds[1] = -1;  // closed by confirm_exec
      --running_;
      not_started(r, e.what());
    }
  }

  void not_started(Running& r, const std::string& why) {
    r.reaped = true;
    listener_.on_output(r.spec->rank, 2, fmt::format("dstrain agent on {}: {}", node_.host, why));
    ExitStatus st;
    st.code = 127;
    listener_.on_exit(r.spec->rank, st);
    carry_out(teardown_.rank_not_started(r.spec->rank, node_.host, Clock::now()));
  }

  // One poll() over the signal pipe, the controller's fd and every worker's pipes.
  void poll_once(const std::function<bool()>& on_control) {
    std::vector<pollfd> pfds;
    pfds.push_back({signals_.fd(), POLLIN, 0});
    if (control_open_) pfds.push_back({control_fd_, POLLIN, 0});
    std::vector<std::pair<Running*, int>> owners;
    for (auto& r : workers_) {
      for (int w = 0; w < 2; ++w) {
        if (r.fds[w] >= 0) {
          pfds.push_back({r.fds[w], POLLIN, 0});
          owners.emplace_back(&r, w);
        }
      }
    }
    const bool control_polled = control_open_;
    int n = ::poll(pfds.data(), pfds.size(), poll_timeout_ms());
    if (n < 0 && errno != EINTR) throw system_error("agent poll: {}", errno_string(errno));
    if (n <= 0) return;
    const size_t base = control_polled ? 2 : 1;
    for (size_t i = 0; i < owners.size(); ++i) {
      if (pfds[base + i].revents != 0) pump(*owners[i].first, owners[i].second, false);
    }
    if (control_polled && pfds[1].revents != 0) {
      // on_control must return true at end of input, so a dead fd is never polled again.
      if (on_control ? on_control() : true) {
        control_open_ = false;
        carry_out(teardown_.stop_requested(stop_signal_, Clock::now()));
      }
    }
    if (pfds[0].revents != 0) {
      for (int sig : signals_.drain()) {
        if (signals_.is_dump(sig)) {
          dump_requested_ = true;
        } else if (sig != SIGCHLD) {
          carry_out(teardown_.signalled(sig, Clock::now()));
        }
      }
    }
  }

  int poll_timeout_ms() const {
    int timeout = 1000;  // a safety net: reap even if a SIGCHLD byte was lost
    if (auto at = teardown_.next_deadline()) {
      timeout = std::min(timeout, Deadline(*at).remaining_ms());
    }
    return timeout;
  }

  void reap() {
    for (auto& r : workers_) {
      if (r.pid <= 0 || r.reaped) continue;
      int st = 0;
      if (::waitpid(r.pid, &st, WNOHANG) != r.pid) continue;
      r.reaped = true;
      --running_;
      ended(r, ExitStatus::from_wait(st));
    }
  }

  void ended(Running& r, const ExitStatus& es) {
    TeardownOrders orders = teardown_.rank_ended(WorkerExit{r.spec->rank, es}, node_.host,
                                                 running_, Clock::now());
    if (orders.kill_group) signal_group(r.pid, SIGKILL);  // leftovers in its group
    pump(r, 0, true);
    pump(r, 1, true);
    listener_.on_exit(r.spec->rank, es);
    if (orders.grace_begins) {
      spdlog::debug("rank {} failed: the other {} local rank(s) get {} ms to exit on their own",
                    r.spec->rank, running_, cfg_.failure_grace.count());
    }
    carry_out(orders);
  }

  // The orders about every worker still running (the ended rank's own are ended()'s).
  void carry_out(const TeardownOrders& orders) {
    if (orders.grace_over) {
      spdlog::debug("failure grace of {} ms over: stopping the {} local rank(s) still running",
                    cfg_.failure_grace.count(), running_);
    }
    if (orders.stop != 0) signal_running(orders.stop);
    if (orders.force != Force::kNone) kill_running(orders.force == Force::kKillTimeout);
  }

  void signal_running(int sig) {
    for (auto& r : workers_) {
      if (r.pid > 0 && !r.reaped) {
        signal_group(r.pid, sig);
        // A stopped worker (SIGSTOP, a debugger let go) would hold the signal until the kill
        // timeout: let it run to handle it.
        signal_group(r.pid, SIGCONT);
      }
    }
  }

  void dump_flight_records() {
    std::vector<pid_t> pids;
    for (auto& r : workers_) {
      if (r.pid > 0 && !r.reaped) pids.push_back(r.pid);
    }
    const int n = request_flight_dumps(pids);
    spdlog::info("flight recorder: asked {} of the {} running rank(s) on {} to dump their records", n, pids.size(),
                 node_.host);
  }

  void kill_running(bool after_kill_timeout) {
    for (auto& r : workers_) {
      if (r.pid > 0 && !r.reaped) {
        if (after_kill_timeout) {
          spdlog::warn("rank {} (pid {}) on {} did not exit within {} ms of SIGTERM: sending SIGKILL",
                       r.spec->rank, r.pid, node_.host, cfg_.kill_timeout.count());
        }
        signal_group(r.pid, SIGKILL);
      }
    }
  }

  void pump(Running& r, int which, bool final) {
    int& fd = r.fds[which];
    if (fd < 0) return;
    char buf[16384];
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) {
        r.lines[which].feed(std::string_view(buf, static_cast<size_t>(n)), [&](std::string_view l) {
          listener_.on_output(r.spec->rank, which + 1, l);
        });
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) || final) {
        r.lines[which].finish([&](std::string_view l) { listener_.on_output(r.spec->rank, which + 1, l); });
        ::close(fd);
        fd = -1;
      }
      return;
    }
  }

  const AgentConfig cfg_;  // the agent's, with this generation's MASTER_PORT
  const NodeSpec& node_;
  AgentListener& listener_;
  SignalPipe& signals_;
  const bool& stop_requested_;
  bool& dump_requested_;
  const int& stop_signal_;
  Teardown teardown_;
  std::vector<Running> workers_;  // this node's, in rank order
  size_t running_ = 0;            // started and not reaped
  int control_fd_ = -1;
  bool control_open_ = false;
};

}  // namespace

namespace {
// Whether process `pid` has a handler for `sig` (the SigCgt mask of /proc/<pid>/status).
bool catches_signal(pid_t pid, int sig) {
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("SigCgt:", 0) != 0) continue;
    const uint64_t mask = std::strtoull(line.c_str() + 7, nullptr, 16);
    return ((mask >> (sig - 1)) & 1) != 0;
  }
  return false;
}
}  // namespace

int request_flight_dumps(const std::vector<pid_t>& pids) {
  int n = 0;
  for (pid_t p : pids) {
    if (catches_signal(p, SignalPipe::kDumpSignal) && ::kill(p, SignalPipe::kDumpSignal) == 0) ++n;
  }
  return n;
}

GenerationResult Agent::run(const std::string& store_addr, int master_port, int restart_count,
                            int control_fd, const std::function<bool()>& on_control) {
  stop_requested_ = false;
  dump_requested_ = false;
  stop_signal_ = SIGTERM;
  AgentConfig cfg = config_;
  cfg.world.master_port = master_port;
  NodeGeneration generation(std::move(cfg), listener_, signals_, stop_requested_, dump_requested_, stop_signal_);
  generation.start_workers(job_env(config_, store_addr, restart_count));
  generation.supervise(control_fd, on_control);
  return generation.finish();
}

}  // namespace ds::launch
