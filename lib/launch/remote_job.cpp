// The remote job loop (was the SSH backend's): every agent channel, the starter's output and the
// signal pipe in one poll(); see remote_job.h. Also the SSH starter.
#include "launch/remote_job.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>

#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "common/strings.h"
#include "launch/agent_protocol.h"
#include "launch/job_summary.h"
#include "launch/signals.h"

namespace ds::launch {

namespace {

double seconds_since(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

class SshStarter : public AgentStarter {
 public:
  explicit SshStarter(const JobSpec& spec) : spec_(spec) {}
  bool sends_token() const override { return true; }

  // One thread per node for connect + host key + authentication + exec, so N nodes take as long
  // as the slowest.
  std::vector<std::unique_ptr<AgentChannel>> start(const std::string& job_id,
                                                   const std::string&) override {
    size_t count = spec_.world.nodes.size();
    std::vector<std::unique_ptr<AgentChannel>> channels(count);
    std::vector<std::exception_ptr> errors(count);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < count; ++i) {
      threads.emplace_back([&, i] {
        try {
          std::string cmd = "exec " + shell_join(agent_command(spec_, job_id, static_cast<int>(i)));
          channels[i] = SshConnection::open(spec_.world.nodes[i].host, spec_.ssh, cmd);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < count; ++i) {
      // Returning closes every connection that did open: those agents see EOF.
      if (errors[i]) std::rethrow_exception(errors[i]);
    }
    return channels;
  }

  // Over a second connection, since the first one's agent no longer reads: SIGKILL works on a
  // stopped process, and the workers follow it (PR_SET_PDEATHSIG).
  void kill_agent(size_t node, long pid) override {
    if (pid <= 0 || node >= spec_.world.nodes.size()) return;
    const std::string& host = spec_.world.nodes[node].host;
    try {
      auto c = SshConnection::open(host, spec_.ssh, fmt::format("kill -KILL {}", pid));
      std::string ignored;
      const Deadline dl = Deadline::after(Millis(5000));
      while (!dl.expired() && c->read(0, &ignored) && !c->eof()) {
        std::this_thread::sleep_for(Millis(20));
      }
    } catch (const Error& e) {
      spdlog::warn("could not kill the unresponsive agent (pid {}) on {}: {}", pid, host, e.what());
    }
  }

 private:
  const JobSpec& spec_;
};

struct RemoteNode {
  const NodeSpec* spec = nullptr;
  std::unique_ptr<AgentChannel> conn;
  std::string pending;  // bytes queued for the agent's input
  std::string in_out, in_err;
  LineSplitter out_lines, err_lines;
  bool gen_done = false;
  bool closed = false;    // channel ended
  bool quitting = false;  // we sent quit
  bool eof_sent = false;
  long agent_pid = 0;                 // from its heartbeats; 0 until the first
  SteadyClock::time_point last_heard;  // its last line on the protocol stream
};

class RemoteJob {
 public:
  RemoteJob(const JobSpec& spec, OutputMux& mux, AgentStarter& starter)
      : spec_(spec), mux_(mux), starter_(starter) {}

  int run() {
    t0_ = SteadyClock::now();
    ignore_sigpipe();
    SignalPipe signals(spec_.preempt_signal);
    signals_ = &signals;
    job_id_ = make_job_id();
    const std::string token = spec_.token.empty() ? make_job_token() : spec_.token;
    auto channels = starter_.start(job_id_, token);
    spdlog::debug("job {}: {} agent(s) up in {:.3f} s", job_id_, channels.size(),
                  seconds_since(t0_));
    nodes_.resize(channels.size());
    for (size_t i = 0; i < channels.size(); ++i) {
      nodes_[i].spec = &spec_.world.nodes[i];
      nodes_[i].conn = std::move(channels[i]);
      nodes_[i].last_heard = SteadyClock::now();
      if (starter_.sends_token()) nodes_[i].pending += proto::msg_token(token);
      for (const auto& [k, v] : spec_.user_env) nodes_[i].pending += proto::msg_env(k, v);
    }
    int status = loop();
    starter_.finish();
    return status;
  }

 private:
  void send_all(const std::string& msg) {
    for (auto& n : nodes_) {
      if (!n.closed) n.pending += msg;
    }
  }

  void stop_all(int first_signal = SIGTERM) {
    if (stopping_) return;
    stopping_ = true;
    stop_deadline_ = Deadline::after(spec_.kill_timeout + Millis(5000));
    send_all(proto::msg_stop(first_signal));
  }

  void node_failed(RemoteNode& n, const std::string& why) {
    if (!failure_ && !interrupted_) failure_ = Failure{-1, n.spec->host, {}, why};
    stop_all();
  }

  void on_rank_exit(RemoteNode& n, int rank, const ExitStatus& st) {
    spdlog::debug("rank {} on {} ended: {}", rank, n.spec->host, st.describe());
    Failure f{rank, n.spec->host, st, {}};
    if (is_preemption(f)) ++preempted_ranks_;
    if (st.ok() || failure_ || stopping_) return;
    failure_ = f;
    // The other ranks get the failure grace to exit on their own (the failing node's agent
    // waits the same time before its own teardown); then every node is stopped.
    if (spec_.failure_grace.count() > 0) {
      grace_until_ = Deadline::after(spec_.failure_grace);
    } else {
      stop_all();
    }
  }

  void handle_line(RemoteNode& n, const std::string& line) {
    n.last_heard = SteadyClock::now();
    using K = proto::AgentMessage::Kind;
    proto::AgentMessage m = proto::parse_agent_message(line, spec_.world.world_size());
    switch (m.kind) {
      case K::kOut: return mux_.line(m.rank, m.stream, m.text);
      case K::kExit: return on_rank_exit(n, m.rank, m.status);
      case K::kStarted: spdlog::debug("rank {} on {}: pid {}", m.rank, n.spec->host, m.pid); return;
      case K::kDone: n.gen_done = true; return;
      case K::kBeat: n.agent_pid = m.pid; return;
      case K::kStore:
        store_addr_ = fmt::format("{}:{}", spec_.world.master_addr, m.store_port);
        master_port_ = m.master_port;
        spdlog::debug("job {}: store at {}, MASTER_PORT {}", job_id_, store_addr_, master_port_);
        send_all(proto::msg_start(store_addr_, master_port_, restart_));
        return;
      case K::kFatal:
        return node_failed(n, fmt::format("node {} ({}): {}", n.spec->node_rank, n.spec->host, m.text));
      case K::kMalformed:
        return node_failed(n, fmt::format("node {} ({}): the agent broke the protocol: {}", n.spec->node_rank,
                                          n.spec->host, m.text));
      case K::kText:
        // Not the protocol: a login shell's or a missing program's words. Show them as they are.
        mux_.note(fmt::format("[agent {}] {}", n.spec->host, line));
        return;
    }
  }

  void channel_closed(RemoteNode& n) {
    n.closed = true;
    flush_lines(n);
    if (n.quitting) return;
    int st = n.conn->exit_status();
    std::string code = st >= 0 ? fmt::format(" (exit status {})", st) : "";
    std::string hint = st == 127
                           ? fmt::format(": is dstrain installed at {} there? try `dstrain check`",
                                         spec_.remote_dstrain)
                           : "";
    node_failed(n, fmt::format("the agent on {} ended unexpectedly{}{}", n.spec->host, code, hint));
  }

  // Moves bytes in both directions for one node.
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
      if (!open || n.conn->eof()) channel_closed(n);
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
    n.err_lines.finish(
        [&](std::string_view l) { mux_.note(fmt::format("[agent {}] {}", n.spec->host, l)); });
  }

  // Agents silent past the agent timeout (agent_protocol.h: heartbeats) fail the job, naming the
  // node; each is killed by other means, and its channel closed so nothing waits on it.
  void check_heartbeats() {
    const auto now = SteadyClock::now();
    for (size_t i = 0; i < nodes_.size(); ++i) {
      RemoteNode& n = nodes_[i];
      if (n.closed || n.agent_pid == 0 || now - n.last_heard < spec_.agent_timeout) continue;
      const double quiet = std::chrono::duration<double>(now - n.last_heard).count();
      node_failed(n, fmt::format("the agent on node {} ({}, pid {}) sent nothing for {:.1f} s, not even its "
                                 "heartbeat: it is stopped or hung, or that node or its network is gone",
                                 n.spec->node_rank, n.spec->host, n.agent_pid, quiet));
      starter_.kill_agent(i, n.agent_pid);
      n.closed = true;
    }
  }

  bool all(bool RemoteNode::*flag) const {
    for (const auto& n : nodes_) {
      if (!(n.*flag) && !n.closed) return false;
    }
    return true;
  }
  bool all_open() const {
    for (const auto& n : nodes_) {
      if (n.closed) return false;
    }
    return true;
  }
  bool preempted() const { return preempted_ranks_ == spec_.world.world_size(); }

  // A generation is over (every live agent said "done"): restart it, or quit.
  void generation_over() {
    bool restart = failure_ && !interrupted_ && failure_->rank >= 0 && !is_preemption(*failure_) &&
                   !preempted() && restart_ < spec_.max_restarts && all_open();
    if (!restart) return quit_all(Millis(3000));
    mux_.note(fmt::format("dstrain: {}; restarting every rank ({}/{})", describe_failure(*failure_),
                          restart_ + 1, spec_.max_restarts));
    ++restart_;
    mux_.restart_marker(restart_);
    failure_.reset();
    stopping_ = false;
    preempted_ranks_ = 0;
    grace_until_ = Deadline::never();
    for (auto& n : nodes_) n.gen_done = false;
    send_all(proto::msg_start(store_addr_, master_port_, restart_));
  }

  void on_signal(int sig) {
    if (sig == SIGCHLD) return;
    if (interrupted_ && sig != SIGINT) return;  // a repeated SIGTERM: let the ranks checkpoint
    if (interrupted_ || quit_sent_) {
      mux_.note(fmt::format("dstrain: {} again: closing every connection now", signal_name(sig)));
      nodes_.clear();
      forced_ = true;
      return;
    }
    interrupted_ = true;
    interrupt_signal_ = sig;
    mux_.note(fmt::format("dstrain: {}: stopping every rank (again to force)", signal_name(sig)));
    if (store_addr_.empty()) return quit_all(Millis(1000));
    stop_all(sig == spec_.preempt_signal ? sig : SIGTERM);
  }

  void poll_once() {
    std::vector<pollfd> pfds;
    pfds.push_back({signals_->fd(), POLLIN, 0});
    for (int fd : starter_.fds()) pfds.push_back({fd, POLLIN, 0});
    const size_t first_node = pfds.size();
    for (auto& n : nodes_) {
      short ev = POLLIN;
      if (!n.closed && (n.conn->wants_write() || !n.pending.empty())) ev |= POLLOUT;
      pfds.push_back({n.closed ? -1 : n.conn->socket(), ev, 0});
    }
    int rc = ::poll(pfds.data(), pfds.size(), 100);
    if (rc < 0 && errno != EINTR) throw system_error("launcher poll: {}", errno_string(errno));
    if (rc <= 0) return;
    bool starter_ready = false;
    for (size_t i = 1; i < first_node; ++i) starter_ready = starter_ready || pfds[i].revents != 0;
    if (starter_ready) starter_.pump();
    if (pfds[0].revents != 0) {
      for (int sig : signals_->drain()) {
        on_signal(sig);
        if (forced_) return;
      }
    }
  }

  int loop() {
    for (;;) {
      for (auto& n : nodes_) pump(n);
      check_heartbeats();
      if (!quit_sent_ && !store_addr_.empty() && all(&RemoteNode::gen_done)) generation_over();
      // Failed before the store was up (node 0's agent could not start): nothing runs yet.
      if (!quit_sent_ && failure_ && store_addr_.empty()) quit_all(Millis(3000));
      if (!quit_sent_) {
        if (auto why = starter_.died()) {
          if (!failure_ && !interrupted_) failure_ = Failure{-1, "", {}, *why};
          if (store_addr_.empty()) quit_all(Millis(1000));
          stop_all();
        }
      }
      if (failure_ && !stopping_ && !quit_sent_ && grace_until_.expired()) stop_all();
      if (stopping_ && !quit_sent_ && stop_deadline_.expired()) {
        mux_.note(
            "dstrain: some agents did not report within the kill timeout; closing their "
            "connections (their nodes tear down on end of input)");
        quit_all(Millis(1000));
      }
      if (quit_sent_ && (all(&RemoteNode::closed) || quit_deadline_.expired())) break;
      poll_once();
      if (forced_) return 128 + interrupt_signal_;
    }
    nodes_.clear();
    JobOutcome o;
    o.failure = failure_;
    o.stop_signal = interrupted_ ? interrupt_signal_ : 0;
    o.preempted = preempted();
    o.world_size = spec_.world.world_size();
    o.restarts = restart_;
    o.started = t0_;
    return finish(mux_, o);
  }

  void quit_all(Millis wait) {
    for (auto& n : nodes_) {
      if (n.closed) continue;
      n.pending += proto::msg_quit();
      n.quitting = true;
    }
    quit_sent_ = true;
    quit_deadline_ = Deadline::after(wait);
  }

  const JobSpec& spec_;
  OutputMux& mux_;
  AgentStarter& starter_;
  SignalPipe* signals_ = nullptr;
  std::vector<RemoteNode> nodes_;
  std::string job_id_;
  std::string store_addr_;
  int master_port_ = 0;
  int restart_ = 0;
  int preempted_ranks_ = 0;  // of this generation: ranks that exited kPreemptedExitCode
  bool stopping_ = false;
  bool quit_sent_ = false;
  bool forced_ = false;  // a second Ctrl-C: every connection closed at once
  Deadline quit_deadline_ = Deadline::never();
  Deadline stop_deadline_ = Deadline::never();
  Deadline grace_until_ = Deadline::never();  // after a rank failure: when to stop every node
  bool interrupted_ = false;
  int interrupt_signal_ = 0;
  std::optional<Failure> failure_;
  SteadyClock::time_point t0_;
};

}  // namespace

std::unique_ptr<AgentStarter> make_ssh_starter(const JobSpec& spec) {
  return std::make_unique<SshStarter>(spec);
}

int run_remote_job(const JobSpec& spec, OutputMux& mux, AgentStarter& starter) {
  RemoteJob job(spec, mux, starter);
  return job.run();
}

}  // namespace ds::launch
