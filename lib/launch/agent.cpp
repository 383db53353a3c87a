// The agent's supervision loop. One poll() over: the signal pipe (SIGCHLD reaps, SIGINT/TERM/HUP
// tear down), the controller's fd, and every worker's stdout and stderr pipe.
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

}  // namespace

GenerationResult Agent::run(const std::string& store_addr, int master_port, int restart_count,
                            int control_fd, const std::function<bool()>& on_control) {
  stop_requested_ = false;
  stop_signal_ = SIGTERM;
  GenerationResult result;
  const NodeSpec& node = config_.world.nodes.at(static_cast<size_t>(config_.node_rank));
  World world = config_.world;
  world.master_port = master_port;
  AgentConfig cfg = config_;
  cfg.world = world;

  JobEnv job;
  job.store_addr = store_addr;
  job.job_id = config_.job_id;
  job.job_token = config_.token;
  job.restart_count = restart_count;
  job.user_env = config_.user_env;

  std::vector<int> cpus = available_cpus();
  std::vector<Running> workers;
  workers.reserve(node.slots.size());
  for (const auto& w : world.workers) {
    if (w.node_rank != config_.node_rank) continue;
    workers.emplace_back();
    workers.back().spec = &w;
  }

  bool tearing_down = false;
  std::optional<Deadline> kill_at;
  std::optional<Deadline> grace_until;  // set by the first failure when a grace period applies
  bool killed = false;
  bool interrupted = false;  // a signal reached the agent: the next one SIGKILLs at once
  // `first` is SIGTERM, or the preemption signal the agent or its controller received.
  auto begin_teardown = [&](int first = SIGTERM) {
    if (tearing_down) return;
    tearing_down = true;
    kill_at = Deadline::after(config_.kill_timeout);
    for (auto& r : workers) {
      if (r.pid > 0 && !r.reaped) {
        signal_group(r.pid, first);
        // A stopped worker (SIGSTOP, a debugger let go) would hold the signal until the kill
        // timeout: let it run to handle it.
        signal_group(r.pid, SIGCONT);
      }
    }
  };

  // Spawn every worker of this node: fork them all, then confirm each exec (so N workers start
  // in parallel rather than one exec after another).
  size_t running = 0;
  auto spawn_failed = [&](Running& r, const std::string& why) {
    r.reaped = true;
    listener_.on_output(r.spec->rank, 2, fmt::format("dstrain agent on {}: {}", node.host, why));
    ExitStatus st;
    st.code = 127;
    listener_.on_exit(r.spec->rank, st);
    result.exits.push_back({r.spec->rank, st});
    if (!result.first_failure) result.first_failure = WorkerExit{r.spec->rank, st};
    begin_teardown();
  };
  std::vector<Spawned> started(workers.size());
  for (size_t i = 0; i < workers.size() && !tearing_down; ++i) {
    Running& r = workers[i];
    SpawnRequest req;
    req.argv = config_.command;
    req.env = build_worker_env(cfg, *r.spec, job, static_cast<int>(cpus.size()));
    req.cwd = config_.cwd;
    req.defer_exec_check = true;
    if (config_.bind_cores) {
      req.cpus = cpus_for_local_rank(cpus, r.spec->local_rank, static_cast<int>(workers.size()));
    }
    try {
      started[i] = spawn(req);
      r.pid = started[i].pid;
      r.fds[0] = started[i].stdout_fd;
      r.fds[1] = started[i].stderr_fd;
      ++running;
    } catch (const Error& e) {
      spawn_failed(r, e.what());
    }
  }
  for (size_t i = 0; i < workers.size(); ++i) {
    Running& r = workers[i];
    if (r.pid <= 0) continue;
    try {
      confirm_exec(started[i]);
      listener_.on_started(r.spec->rank, r.pid);
    } catch (const Error& e) {
      r.pid = -1;
      r.fds[0] = r.fds[1] = -1;  // closed by confirm_exec
      --running;
      spawn_failed(r, e.what());
    }
  }

  auto pump = [&](Running& r, int which, bool final) {
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
  };

  auto reap = [&] {
    for (auto& r : workers) {
      if (r.pid <= 0 || r.reaped) continue;
      int st = 0;
      pid_t p = ::waitpid(r.pid, &st, WNOHANG);
      if (p != r.pid) continue;
      r.reaped = true;
      --running;
      ExitStatus es = ExitStatus::from_wait(st);
      if (tearing_down || !es.ok()) signal_group(r.pid, SIGKILL);  // leftovers in its group
      pump(r, 0, true);
      pump(r, 1, true);
      listener_.on_exit(r.spec->rank, es);
      result.exits.push_back({r.spec->rank, es});
      if (!es.ok() && !tearing_down && !result.first_failure) {
        result.first_failure = WorkerExit{r.spec->rank, es};
        if (config_.failure_grace.count() > 0 && running > 0) {
          spdlog::debug("rank {} failed: the other {} local rank(s) get {} ms to exit on their own",
                        r.spec->rank, running, config_.failure_grace.count());
          grace_until = Deadline::after(config_.failure_grace);
        } else {
          begin_teardown();
        }
      }
    }
  };

  bool control_open = control_fd >= 0;
  while (running > 0) {
    if (stop_requested_ && !tearing_down) {
      result.stopped_by_controller = true;
      begin_teardown(stop_signal_);
    }
    std::vector<pollfd> pfds;
    pfds.push_back({signals_.fd(), POLLIN, 0});
    if (control_open) pfds.push_back({control_fd, POLLIN, 0});
    std::vector<std::pair<Running*, int>> owners;
    for (auto& r : workers) {
      for (int w = 0; w < 2; ++w) {
        if (r.fds[w] >= 0) {
          pfds.push_back({r.fds[w], POLLIN, 0});
          owners.emplace_back(&r, w);
        }
      }
    }
    int timeout = 1000;  // a safety net: reap even if a SIGCHLD byte was lost
    if (kill_at && !killed) timeout = std::min(timeout, kill_at->remaining_ms());
    if (grace_until && !tearing_down) timeout = std::min(timeout, grace_until->remaining_ms());
    int n = ::poll(pfds.data(), pfds.size(), timeout);
    if (n < 0 && errno != EINTR) throw system_error("agent poll: {}", errno_string(errno));
    size_t base = control_open ? 2 : 1;
    if (n > 0) {
      for (size_t i = 0; i < owners.size(); ++i) {
        if (pfds[base + i].revents != 0) pump(*owners[i].first, owners[i].second, false);
      }
      if (control_open && pfds[1].revents != 0) {
        // on_control must return true at end of input, so a dead fd is never polled again.
        bool stop = on_control ? on_control() : true;
        if (stop) {
          control_open = false;
          if (!tearing_down) result.stopped_by_controller = true;
          begin_teardown(stop_signal_);
        }
      }
      if (pfds[0].revents != 0) {
        for (int sig : signals_.drain()) {
          if (sig == SIGCHLD) continue;
          if (sig == SIGINT && tearing_down && interrupted && !killed) {
            // A second Ctrl-C: do not wait for the kill timeout. (A repeated SIGTERM does not
            // force: Slurm and srun may both deliver one, and the workers may be writing their
            // preemption checkpoint.)
            killed = true;
            for (auto& r : workers) {
              if (r.pid > 0 && !r.reaped) signal_group(r.pid, SIGKILL);
            }
          }
          interrupted = true;
          // In the grace period after a failure, the failure stays the job's outcome.
          if (!tearing_down && !result.first_failure) result.stop_signal = sig;
          begin_teardown(sig == config_.preempt_signal ? sig : SIGTERM);
        }
      }
    }
    reap();
    if (grace_until && !tearing_down && running > 0 && grace_until->expired()) {
      spdlog::debug("failure grace of {} ms over: stopping the {} local rank(s) still running",
                    config_.failure_grace.count(), running);
      begin_teardown();
    }
    if (kill_at && !killed && kill_at->expired()) {
      killed = true;
      for (auto& r : workers) {
        if (r.pid > 0 && !r.reaped) {
          spdlog::warn("rank {} (pid {}) on {} did not exit within {} ms of SIGTERM: sending SIGKILL",
                       r.spec->rank, r.pid, node.host, config_.kill_timeout.count());
          signal_group(r.pid, SIGKILL);
        }
      }
    }
  }
  for (auto& r : workers) {
    pump(r, 0, true);
    pump(r, 1, true);
  }
  return result;
}

}  // namespace ds::launch
