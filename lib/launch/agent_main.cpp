// The remote agent's driver: reads the controller's lines from stdin, writes events to stdout.
#include "launch/agent_main.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/socket.h"
#include "common/strings.h"
#include "launch/agent_protocol.h"
#include "launch/output.h"
#include "store/tcp_store_server.h"

namespace ds::launch {

int resolve_master_port(int port, const std::string& host) {
  if (port == 0) {
    net::Fd fd = net::listen_tcp("0.0.0.0", 0, 1);
    return net::local_port(fd.get());
  }
  if (!net::port_is_free("0.0.0.0", port)) {
    throw Error(ErrorKind::kSystem,
                fmt::format("MASTER_PORT {} is in use on {} ({}:{} already has a listener)", port,
                            host, host, port),
                "pick another with --master-port N, or --master-port 0 for a free one");
  }
  return port;
}

namespace {

// Every protocol line goes through here, from the main thread and the heartbeat thread: one line
// at a time, never interleaved.
std::mutex g_out_mu;

void write_out(int fd, const std::string& s) {
  std::lock_guard<std::mutex> lock(g_out_mu);
  std::string_view v = s;
  while (!v.empty()) {
    ssize_t n = ::write(fd, v.data(), v.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, 1000);
        continue;
      }
      return;  // the controller is gone; stdin EOF will tell us
    }
    v.remove_prefix(static_cast<size_t>(n));
  }
}

// Lines from the controller (stdin or the control socket), read without blocking.
class StdinLines {
 public:
  explicit StdinLines(int fd) : fd_(fd) {
    int fl = ::fcntl(fd_, F_GETFL);
    if (fl >= 0) ::fcntl(fd_, F_SETFL, fl | O_NONBLOCK);
  }
  int fd() const { return fd_; }
  void pump() {
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n > 0) {
        split_.feed(std::string_view(buf, static_cast<size_t>(n)),
                    [&](std::string_view l) { lines_.emplace_back(l); });
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) eof_ = true;
      return;
    }
  }
  bool next(std::string* line) {
    if (lines_.empty()) return false;
    *line = std::move(lines_.front());
    lines_.pop_front();
    return true;
  }
  bool eof() const { return eof_; }

 private:
  int fd_;
  LineSplitter split_;
  std::deque<std::string> lines_;
  bool eof_ = false;
};

class ProtocolListener : public AgentListener {
 public:
  explicit ProtocolListener(int fd) : fd_(fd) {}
  void on_started(int rank, pid_t pid) override { write_out(fd_, proto::msg_started(rank, pid)); }
  void on_output(int rank, int stream, std::string_view line) override {
    write_out(fd_, proto::msg_out(rank, stream, line));
  }
  void on_exit(int rank, const ExitStatus& status) override { write_out(fd_, proto::msg_exit(rank, status)); }

 private:
  int fd_;
};

// Writes "beat <pid>" every kAgentBeatInterval until destroyed (agent_protocol.h: heartbeats).
class Heartbeat {
 public:
  explicit Heartbeat(int fd) : fd_(fd), thread_([this] { loop(); }) {}
  ~Heartbeat() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void loop() {
    const std::string beat = proto::msg_beat(static_cast<long>(::getpid()));
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      lock.unlock();
      write_out(fd_, beat);
      lock.lock();
      cv_.wait_for(lock, proto::kAgentBeatInterval, [this] { return stop_; });
    }
  }
  int fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

enum class Wait { kLine, kEof, kSignal, kTimeout };

// Waits for the next stdin line, a terminating signal, or the deadline.
Wait next_line(StdinLines& in, SignalPipe& sig, Deadline deadline, std::string* line, int* signal) {
  for (;;) {
    if (in.next(line)) return Wait::kLine;
    if (in.eof()) return Wait::kEof;
    pollfd p[2] = {{in.fd(), POLLIN, 0}, {sig.fd(), POLLIN, 0}};
    int n = ::poll(p, 2, deadline.remaining_ms());
    if (n < 0 && errno != EINTR) throw system_error("agent poll: {}", errno_string(errno));
    if (p[1].revents != 0) {
      for (int s : sig.drain()) {
        if (s != SIGCHLD && !sig.is_dump(s)) {  // no ranks to dump between generations
          *signal = s;
          return Wait::kSignal;
        }
      }
    }
    if (p[0].revents != 0) in.pump();
    if (n == 0 && deadline.expired()) return Wait::kTimeout;
  }
}

}  // namespace

namespace {

AgentConfig config_of(const AgentProcessOptions& o, const std::string& token) {
  const std::string& host = o.world.nodes.at(static_cast<size_t>(o.node_rank)).host;
  AgentConfig cfg;
  cfg.world = o.world;
  cfg.node_rank = o.node_rank;
  cfg.command = o.command;
  cfg.job_id = o.job_id;
  cfg.token = token;
  cfg.kill_timeout = o.kill_timeout;
  cfg.failure_grace = o.failure_grace;
  cfg.bind_cores = o.bind_cores;
  cfg.preempt_signal = o.preempt_signal;
  if (!o.cwd.empty()) {
    std::error_code ec;
    if (std::filesystem::is_directory(o.cwd, ec)) {
      cfg.cwd = o.cwd;
    } else {
      spdlog::warn("agent on {}: working directory {} does not exist here; workers start in {}",
                   host, o.cwd, std::filesystem::current_path(ec).string());
    }
  }
  return cfg;
}

// One generation (a "start" line): runs the node's workers until they end or the controller
// stops them. Returns the agent process's exit status when it must end now, else nullopt.
std::optional<int> run_generation(const proto::LauncherMessage& start, AgentConfig& cfg, StdinLines& in,
                                  SignalPipe& signals, ProtocolListener& listener, int out_fd) {
  bool quit = false;
  Agent agent(cfg, listener, signals);
  auto on_control = [&] {
    in.pump();
    std::string l;
    bool stop = false;
    while (in.next(&l)) {
      if (auto sig = proto::parse_stop(l)) {
        agent.set_stop_signal(*sig);
        stop = true;
      }
      if (l == "quit") stop = quit = true;
      if (l == "dump") agent.request_flight_dumps();
    }
    if (in.eof()) stop = quit = true;
    return stop;
  };
  GenerationResult r = agent.run(start.store_addr, start.master_port, start.restart_count, in.fd(), on_control);
  write_out(out_fd, proto::msg_done());
  if (r.stop_signal != 0) return 128 + r.stop_signal;
  if (quit) return 0;
  return std::nullopt;
}

}  // namespace

int run_agent_process(const AgentProcessOptions& o) {
  ignore_sigpipe();
  SignalPipe signals(o.preempt_signal);
  StdinLines in(o.in_fd);
  const Heartbeat heartbeat(o.out_fd);
  const std::string& host = o.world.nodes.at(static_cast<size_t>(o.node_rank)).host;
  auto fatal = [&](const std::string& why) {
    write_out(o.out_fd, proto::msg_fatal(why));
    return 1;
  };

  std::string line;
  int sig = 0;
  std::string token = o.token;
  if (token.empty()) {
    Wait w = next_line(in, signals, Deadline::after(o.token_timeout), &line, &sig);
    if (w == Wait::kSignal) return 128 + sig;
    auto m = w == Wait::kLine ? proto::parse_launcher_message(line) : proto::LauncherMessage{};
    if (m.kind != proto::LauncherMessage::Kind::kToken) {
      return fatal(fmt::format("agent on {}: expected the job token on stdin within {}", host,
                               net::format_seconds(o.token_timeout)));
    }
    token = m.token;
  }
  AgentConfig cfg = config_of(o, token);

  std::unique_ptr<store::TcpStoreServer> server;
  if (o.serve_store) {
    try {
      int master_port = resolve_master_port(o.world.master_port, host);
      store::TcpStoreServerOptions so;
      so.port = o.store_port;
      so.token = cfg.token;
      server = std::make_unique<store::TcpStoreServer>(so);
      server->start();
      write_out(o.out_fd, proto::msg_store(server->port(), master_port));
    } catch (const Error& e) {
      return fatal(fmt::format("{}{}", e.what(), e.hint().empty() ? "" : " (hint: " + e.hint() + ")"));
    }
  }

  ProtocolListener listener(o.out_fd);
  for (;;) {
    Wait w = next_line(in, signals, Deadline::never(), &line, &sig);
    if (w == Wait::kSignal) return 128 + sig;
    if (w == Wait::kEof) return 0;
    if (w != Wait::kLine) continue;
    using K = proto::LauncherMessage::Kind;
    proto::LauncherMessage m = proto::parse_launcher_message(line);
    if (m.kind == K::kQuit) return 0;
    if (m.kind == K::kMalformed) return fatal("agent: " + m.error);
    if (m.kind == K::kStop) {
      write_out(o.out_fd, proto::msg_done());
      continue;
    }
    if (m.kind == K::kDump) continue;  // between generations: no ranks to dump
    if (m.kind == K::kEnv) {
      cfg.user_env.emplace_back(m.key, m.value);
      continue;
    }
    if (m.kind == K::kStart) {
      if (auto status = run_generation(m, cfg, in, signals, listener, o.out_fd)) return *status;
      continue;
    }
    spdlog::warn("agent on {}: ignoring unknown message from the launcher", host);
  }
}

}  // namespace ds::launch
