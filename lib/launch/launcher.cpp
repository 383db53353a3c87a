// Local and SSH backends of run_job. The local backend runs the Agent in this process and hosts
// the store here; the SSH backend drives one `dstrain agent` per node through the agent protocol
// (agent_protocol.h), all channels in one poll() loop.
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

using SteadyClock = std::chrono::steady_clock;

double seconds_since(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

struct Failure {
  int rank = -1;
  std::string host;
  ExitStatus status;
  std::string what;  // for node-level failures (agent lost): the reason
};

std::string describe_failure(const Failure& f) {
  if (f.rank < 0) return f.what;
  if (f.status.signal != 0) {
    return fmt::format("rank {} on {} was killed by {}", f.rank, f.host, f.status.describe());
  }
  return fmt::format("rank {} on {} exited with {}", f.rank, f.host, f.status.describe());
}

// Prints the summary and returns the job's exit status.
int finish(OutputMux& mux, const std::optional<Failure>& failure, int stop_signal, int world_size,
           int restarts, SteadyClock::time_point t0) {
  std::string after = restarts > 0 ? fmt::format(" after {} restart(s)", restarts) : "";
  if (failure && failure->rank < 0) {
    mux.note(fmt::format("dstrain: job failed{}: {}; every rank was stopped; exit status 1", after,
                         failure->what));
    return 1;
  }
  if (failure) {
    int status = failure->status.shell_status();
    if (status == 0) status = 1;
    mux.note(fmt::format("dstrain: job failed{}: {} (the first failure; every other rank has "
                         "ended, on its own within the failure grace or stopped); exit status {}",
                         after, describe_failure(*failure), status));
    return status;
  }
  if (stop_signal != 0) {
    mux.note(fmt::format("dstrain: job interrupted by {}{}: every rank was stopped; exit status {}",
                         signal_name(stop_signal), after, 128 + stop_signal));
    return 128 + stop_signal;
  }
  spdlog::info("job finished: all {} rank(s) exited 0 in {:.2f} s{}", world_size,
               seconds_since(t0), after);
  return 0;
}

// ---------------------------------------------------------------- local backend

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
  auto t0 = SteadyClock::now();
  ignore_sigpipe();
  SignalPipe signals;
  const NodeSpec& node = spec.world.nodes.front();
  AgentConfig cfg;
  cfg.world = spec.world;
  cfg.node_rank = 0;
  cfg.command = spec.command;
  cfg.job_id = make_job_id();
  cfg.token = make_job_token();
  cfg.user_env = spec.user_env;
  cfg.kill_timeout = spec.kill_timeout;
  cfg.failure_grace = spec.failure_grace;
  cfg.bind_cores = spec.bind_cores;
  cfg.cwd = spec.cwd;

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
  std::optional<Failure> failure;
  for (int restart = 0;; ++restart) {
    GenerationResult r = agent.run(store_addr, master_port, restart);
    if (r.ok()) return finish(mux, std::nullopt, 0, spec.world.world_size(), restart, t0);
    if (r.stop_signal != 0 || !r.first_failure) {
      return finish(mux, std::nullopt, r.stop_signal != 0 ? r.stop_signal : SIGTERM,
                    spec.world.world_size(), restart, t0);
    }
    failure = Failure{r.first_failure->rank, node.host, r.first_failure->status, {}};
    if (restart >= spec.max_restarts) {
      return finish(mux, failure, 0, spec.world.world_size(), restart, t0);
    }
    mux.note(fmt::format("dstrain: {}; restarting every rank ({}/{})", describe_failure(*failure),
                         restart + 1, spec.max_restarts));
    mux.restart_marker(restart + 1);
  }
}

// ---------------------------------------------------------------- SSH backend

struct RemoteNode {
  const NodeSpec* spec = nullptr;
  std::unique_ptr<SshConnection> conn;
  std::string pending;  // bytes queued for the agent's stdin
  std::string in_out, in_err;
  LineSplitter out_lines, err_lines;
  bool gen_done = false;
  bool closed = false;       // channel ended
  bool quitting = false;     // we sent quit
  bool eof_sent = false;
};

class SshJob {
 public:
  SshJob(const JobSpec& spec, OutputMux& mux) : spec_(spec), mux_(mux) {}

  int run() {
    t0_ = SteadyClock::now();
    ignore_sigpipe();
    SignalPipe signals;
    signals_ = &signals;
    job_id_ = make_job_id();
    std::string token = make_job_token();
    connect_all();
    for (auto& n : nodes_) {
      n.pending += proto::msg_token(token);
      for (const auto& [k, v] : spec_.user_env) n.pending += proto::msg_env(k, v);
    }
    return loop();
  }

 private:
  void connect_all() {
    size_t count = spec_.world.nodes.size();
    nodes_.resize(count);
    std::vector<std::exception_ptr> errors(count);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < count; ++i) {
      nodes_[i].spec = &spec_.world.nodes[i];
      threads.emplace_back([this, i, &errors] {
        try {
          std::string cmd = "exec " + shell_join(agent_command(spec_, job_id_, static_cast<int>(i)));
          nodes_[i].conn = SshConnection::open(nodes_[i].spec->host, spec_.ssh, cmd);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < count; ++i) {
      if (errors[i]) {
        nodes_.clear();  // closes every connection that did open: those agents see EOF
        std::rethrow_exception(errors[i]);
      }
    }
    spdlog::debug("job {}: connected to {} node(s) in {:.3f} s", job_id_, count, seconds_since(t0_));
  }

  void send_all(const std::string& msg) {
    for (auto& n : nodes_) {
      if (!n.closed) n.pending += msg;
    }
  }

  void stop_all() {
    if (stopping_) return;
    stopping_ = true;
    stop_deadline_ = Deadline::after(spec_.kill_timeout + Millis(5000));
    send_all(proto::msg_stop());
  }

  void node_failed(RemoteNode& n, const std::string& why) {
    if (!failure_ && !interrupted_) {
      failure_ = Failure{-1, n.spec->host, {}, why};
    }
    stop_all();
  }

  void handle_line(RemoteNode& n, const std::string& line) {
    auto f = proto::split_fields(line, 4);
    const std::string& verb = f[0];
    if (verb == "out" && f.size() == 4) {
      auto rank = parse_int(f[1]);
      if (rank) mux_.line(static_cast<int>(*rank), f[2] == "2" ? 2 : 1, proto::unescape(f[3]));
    } else if (verb == "exit" && f.size() == 4) {
      auto rank = parse_int(f[1]);
      auto val = parse_int(f[3]);
      if (!rank || !val) return;
      ExitStatus st;
      (f[2] == "signal" ? st.signal : st.code) = static_cast<int>(*val);
      spdlog::debug("rank {} on {} ended: {}", *rank, n.spec->host, st.describe());
      if (!st.ok() && !failure_ && !stopping_) {
        failure_ = Failure{static_cast<int>(*rank), n.spec->host, st, {}};
        // The other ranks get the failure grace to exit on their own (the failing node's agent
        // waits the same time before its own teardown); then every node is stopped.
        if (spec_.failure_grace.count() > 0) {
          grace_until_ = Deadline::after(spec_.failure_grace);
        } else {
          stop_all();
        }
      }
    } else if (verb == "started") {
      spdlog::debug("rank {} on {}: pid {}", f.size() > 1 ? f[1] : "?", n.spec->host,
                    f.size() > 2 ? f[2] : "?");
    } else if (verb == "done") {
      n.gen_done = true;
    } else if (verb == "store" && f.size() >= 3) {
      auto sp = parse_int(f[1]);
      auto mp = parse_int(f[2]);
      if (!sp || !mp) return node_failed(n, "node 0's agent sent a malformed store line");
      store_addr_ = fmt::format("{}:{}", n.spec->host, *sp);
      master_port_ = static_cast<int>(*mp);
      spdlog::debug("job {}: store at {}, MASTER_PORT {}", job_id_, store_addr_, master_port_);
      send_all(proto::msg_start(store_addr_, master_port_, restart_));
    } else if (verb == "fatal") {
      std::string msg = proto::unescape(line.size() > 6 ? line.substr(6) : "");
      node_failed(n, fmt::format("node {} ({}): {}", n.spec->node_rank, n.spec->host, msg));
    } else {
      // Not the protocol: a login shell's or a missing program's words. Show them as they are.
      mux_.note(fmt::format("[agent {}] {}", n.spec->host, line));
    }
  }

  // Moves bytes in both directions for one node; false when its channel is over.
  void pump(RemoteNode& n) {
    if (n.closed) return;
    try {
      if (!n.pending.empty()) n.pending.erase(0, n.conn->write(n.pending));
      if (n.pending.empty() && n.quitting && !n.eof_sent) {
        n.conn->send_eof();
        n.eof_sent = true;
      }
      bool open = true;
      for (int round = 0; round < 8; ++round) {
        size_t before = n.in_out.size() + n.in_err.size();
        open = n.conn->read(0, &n.in_out);
        bool open_err = n.conn->read(1, &n.in_err);
        open = open && open_err;
        if (n.in_out.size() + n.in_err.size() == before) break;
        drain_lines(n);
      }
      drain_lines(n);
      if (!open || n.conn->eof()) {
        n.closed = true;
        flush_lines(n);
        if (!n.quitting) {
          int st = n.conn->exit_status();
          node_failed(n, fmt::format("the agent on {} ended unexpectedly (exit status {}{})",
                                     n.spec->host, st,
                                     st == 127 ? fmt::format(": is dstrain installed at {} there? "
                                                             "try `dstrain check`",
                                                             spec_.remote_dstrain)
                                               : std::string()));
        }
      }
    } catch (const Error& e) {
      n.closed = true;
      if (!n.quitting) node_failed(n, e.what());
    }
  }

  void drain_lines(RemoteNode& n) {
    if (!n.in_out.empty()) {
      std::string data;
      data.swap(n.in_out);
      n.out_lines.feed(data, [&](std::string_view l) { handle_line(n, std::string(l)); });
    }
    if (!n.in_err.empty()) {
      std::string data;
      data.swap(n.in_err);
      n.err_lines.feed(data, [&](std::string_view l) {
        mux_.note(fmt::format("[agent {}] {}", n.spec->host, l));
      });
    }
  }
  void flush_lines(RemoteNode& n) {
    n.out_lines.finish([&](std::string_view l) { handle_line(n, std::string(l)); });
    n.err_lines.finish([&](std::string_view l) { mux_.note(fmt::format("[agent {}] {}", n.spec->host, l)); });
  }

  bool all(bool RemoteNode::*flag) const {
    for (const auto& n : nodes_) {
      if (!(n.*flag) && !n.closed) return false;
    }
    return true;
  }

  int loop() {
    bool quit_sent = false;
    std::optional<Deadline> quit_deadline;
    for (;;) {
      for (auto& n : nodes_) pump(n);
      // A generation is over when every live agent said "done" (or its channel is gone).
      if (!quit_sent && !store_addr_.empty() && all(&RemoteNode::gen_done)) {
        bool failed = failure_.has_value();
        if (failed && !interrupted_ && failure_->rank >= 0 && restart_ < spec_.max_restarts &&
            all_open()) {
          mux_.note(fmt::format("dstrain: {}; restarting every rank ({}/{})",
                                describe_failure(*failure_), restart_ + 1, spec_.max_restarts));
          ++restart_;
          mux_.restart_marker(restart_);
          failure_.reset();
          stopping_ = false;
          grace_until_ = Deadline::never();
          for (auto& n : nodes_) n.gen_done = false;
          send_all(proto::msg_start(store_addr_, master_port_, restart_));
          continue;
        }
        quit_all();
        quit_sent = true;
        quit_deadline = Deadline::after(Millis(3000));
      }
      if (!quit_sent && failure_ && store_addr_.empty()) {
        // Failed before the store was up (node 0's agent could not start): nothing runs yet.
        quit_all();
        quit_sent = true;
        quit_deadline = Deadline::after(Millis(3000));
      }
      if (failure_ && !stopping_ && !quit_sent && grace_until_.expired()) stop_all();
      if (stopping_ && !quit_sent && stop_deadline_.expired()) {
        mux_.note("dstrain: some agents did not report within the kill timeout; closing their "
                  "connections (their nodes tear down on end of input)");
        quit_all();
        quit_sent = true;
        quit_deadline = Deadline::after(Millis(1000));
      }
      if (quit_sent && (all(&RemoteNode::closed) || quit_deadline->expired())) break;

      std::vector<pollfd> pfds;
      pfds.push_back({signals_->fd(), POLLIN, 0});
      for (auto& n : nodes_) {
        short ev = POLLIN;
        if (!n.closed && (n.conn->wants_write() || !n.pending.empty())) ev |= POLLOUT;
        pfds.push_back({n.closed ? -1 : n.conn->socket(), ev, 0});
      }
      int rc = ::poll(pfds.data(), pfds.size(), 100);
      if (rc < 0 && errno != EINTR) throw system_error("launcher poll: {}", errno_string(errno));
      if (rc > 0 && pfds[0].revents != 0) {
        for (int sig : signals_->drain()) {
          if (sig == SIGCHLD) continue;
          if (interrupted_ || quit_sent) {
            mux_.note(fmt::format("dstrain: {} again: closing every connection now", signal_name(sig)));
            nodes_.clear();
            return 128 + interrupt_signal_;
          }
          interrupted_ = true;
          interrupt_signal_ = sig;
          mux_.note(fmt::format("dstrain: {}: stopping every rank (again to force)", signal_name(sig)));
          if (store_addr_.empty()) {
            quit_all();
            quit_sent = true;
            quit_deadline = Deadline::after(Millis(1000));
          } else {
            stop_all();
          }
        }
      }
    }
    nodes_.clear();
    if (failure_) return finish(mux_, failure_, 0, spec_.world.world_size(), restart_, t0_);
    return finish(mux_, std::nullopt, interrupted_ ? interrupt_signal_ : 0, spec_.world.world_size(),
                  restart_, t0_);
  }

  bool all_open() const {
    for (const auto& n : nodes_) {
      if (n.closed) return false;
    }
    return true;
  }

  void quit_all() {
    for (auto& n : nodes_) {
      if (n.closed) continue;
      n.pending += proto::msg_quit();
      n.quitting = true;
    }
  }

  const JobSpec& spec_;
  OutputMux& mux_;
  SignalPipe* signals_ = nullptr;
  std::vector<RemoteNode> nodes_;
  std::string job_id_;
  std::string store_addr_;
  int master_port_ = 0;
  int restart_ = 0;
  bool stopping_ = false;
  Deadline stop_deadline_ = Deadline::never();
  Deadline grace_until_ = Deadline::never();  // after a rank failure: when to stop every node
  bool interrupted_ = false;
  int interrupt_signal_ = 0;
  std::optional<Failure> failure_;
  SteadyClock::time_point t0_;
};

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

std::vector<std::string> agent_command(const JobSpec& spec, const std::string& job_id,
                                       int node_rank) {
  std::vector<std::string> cmd = {spec.remote_dstrain};
  if (!spec.agent_log_level.empty()) {
    cmd.push_back("--log-level");
    cmd.push_back(spec.agent_log_level);
  }
  cmd.insert(cmd.end(), {"agent", "--job-id", job_id, "--node-rank", std::to_string(node_rank),
                         "--world", proto::world_to_json(spec.world), "--kill-timeout-ms",
                         std::to_string(spec.kill_timeout.count()), "--failure-grace-ms",
                         std::to_string(spec.failure_grace.count())});
  if (spec.bind_cores) cmd.push_back("--bind-cores-to-rank");
  if (!spec.cwd.empty()) {
    cmd.push_back("--cwd");
    cmd.push_back(spec.cwd);
  }
  if (node_rank == 0) {
    cmd.push_back("--serve-store");
    cmd.push_back("--store-port");
    cmd.push_back(std::to_string(spec.store_port));
  }
  cmd.push_back("--");
  cmd.insert(cmd.end(), spec.command.begin(), spec.command.end());
  return cmd;
}

int run_job(const JobSpec& spec) {
  OutputMux mux(spec.output);
  bool local = spec.backend == Backend::kLocal ||
               (spec.backend == Backend::kAuto && spec.world.nodes.size() == 1 &&
                is_local_host(spec.world.nodes.front().host));
  if (local) {
    if (spec.world.nodes.size() != 1 || !is_local_host(spec.world.nodes.front().host)) {
      throw invalid_usage("--launcher local runs a single local node; this job has {} node(s) "
                          "starting with '{}': use --launcher ssh",
                          spec.world.nodes.size(), spec.world.nodes.front().host);
    }
    return run_local(spec, mux);
  }
  SshJob job(spec, mux);
  return job.run();
}

}  // namespace ds::launch
