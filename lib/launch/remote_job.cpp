// The remote job loop (was the SSH backend's): every agent channel, the starter's output and the
// signal pipe in one poll(); see remote_job.h. A generation's teardown is decided by the teardown
// machine (teardown.h), whose orders become "stop" lines to every agent and, when the kill timeout
// (plus 5 s for the agents' own) passes or a second signal comes, closed connections. Also the
// SSH starter.
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
#include "launch/teardown.h"

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
  std::string lost;  // why this node is lost (its channel broke, its agent went silent); "" if not
  long agent_pid = 0;                 // from its heartbeats; 0 until the first
  SteadyClock::time_point last_heard;  // its last line on the protocol stream
};

class RemoteJob {
 public:
  RemoteJob(const JobSpec& spec, OutputMux& mux, AgentStarter& starter)
      : spec_(spec), mux_(mux), starter_(starter), generation_(teardown_policy()) {}

  RemoteResult run() {
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
    RemoteResult result = loop();
    starter_.finish();
    return result;
  }

 private:
  void send_all(const std::string& msg) {
    for (auto& n : nodes_) {
      if (!n.closed) n.pending += msg;
    }
  }

  // The agents stop their ranks within the kill timeout; 5 s more for their reports to arrive.
  TeardownPolicy teardown_policy() const {
    return TeardownPolicy{spec_.failure_grace, spec_.kill_timeout + Millis(5000),
                          spec_.preempt_signal};
  }

  // The orders of every event but a signal (on_signal's own): a stop goes to every agent; when
  // the kill timeout passes, their connections are closed.
  void carry_out(const TeardownOrders& orders) {
    if (orders.stop != 0) send_all(proto::msg_stop(orders.stop));
    if (orders.force == Force::kKillTimeout) {
      mux_.note(
          "dstrain: some agents did not report within the kill timeout; closing their "
          "connections (their nodes tear down on end of input)");
      quit_all(Millis(1000));
    }
  }

  void node_failed(const std::string& host, const std::string& why) {
    carry_out(generation_.node_failed(Failure{-1, host, {}, why}, SteadyClock::now()));
  }
  void node_failed(RemoteNode& n, const std::string& why) { node_failed(n.spec->host, why); }
  // The node itself is gone (not only a rank or its agent's words): an elastic job may go on
  // without it (launcher.h: --nnodes).
  void node_lost(RemoteNode& n, const std::string& why) {
    if (n.lost.empty()) {
      n.lost = why;
      lost_.push_back(LostNode{n.spec->node_rank, n.spec->host, why, SteadyClock::now()});
    }
    node_failed(n, why);
  }

  void on_rank_exit(RemoteNode& n, int rank, const ExitStatus& st) {
    spdlog::debug("rank {} on {} ended: {}", rank, n.spec->host, st.describe());
    // After a failure the other ranks get the failure grace to exit on their own (the failing
    // node's agent waits the same time before its own teardown); then every node is stopped.
    // The grace is always the others': the failing rank's own agent has not said "done" yet.
    constexpr size_t kOthersRunning = 1;
    carry_out(generation_.rank_ended(WorkerExit{rank, st}, n.spec->host, kOthersRunning,
                                     SteadyClock::now()));
  }

  void handle_line(RemoteNode& n, const std::string& line) {
    using K = proto::AgentMessage::Kind;
    proto::AgentMessage m = proto::parse_agent_message(line, spec_.world.world_size());
    n.last_heard = SteadyClock::now();
    switch (m.kind) {
      case K::kBeat: n.agent_pid = m.pid; return;
      case K::kOut: return mux_.line(m.rank, m.stream, m.text);
      case K::kExit: return on_rank_exit(n, m.rank, m.status);
      case K::kStarted: spdlog::debug("rank {} on {}: pid {}", m.rank, n.spec->host, m.pid); return;
      case K::kDone: n.gen_done = true; return;
      case K::kStore:
        store_addr_ = fmt::format("{}:{}", spec_.world.master_addr, m.store_port);
        master_port_ = m.master_port;
        spdlog::debug("job {}: store at {}, MASTER_PORT {}", job_id_, store_addr_, master_port_);
        send_all(proto::msg_start(store_addr_, master_port_, spec_.restart_base + restart_));
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
    node_lost(n, fmt::format("the agent on {} ended unexpectedly{}{}", n.spec->host, code, hint));
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
      if (!n.quitting) node_lost(n, e.what());
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
      node_lost(n, fmt::format("the agent on node {} ({}, pid {}) sent nothing for {:.1f} s, not even its "
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
  // The job as the current generation leaves it (a restart starts a fresh generation).
  JobOutcome outcome() const {
    JobOutcome o;
    o.failure = generation_.first_failure();
    o.stop_signal = generation_.interrupt_signal();
    o.preempted = generation_.preempted_ranks() == spec_.world.world_size();
    o.world_size = spec_.world.world_size();
    o.restarts = restart_;
    o.started = t0_;
    return o;
  }

  // A generation is over (every live agent said "done"): restart it, or quit. A restart needs
  // every agent still connected.
  void generation_over() {
    const JobOutcome o = outcome();
    if (!restart_after(o, restart_, spec_.max_restarts) || !all_open()) {
      return quit_all(Millis(3000));
    }
    mux_.note(fmt::format("dstrain: {}; restarting every rank ({}/{})",
                          describe_failure(*o.failure), restart_ + 1, spec_.max_restarts));
    ++restart_;
    mux_.restart_marker(spec_.restart_base + restart_);
    generation_ = Teardown(teardown_policy());
    for (auto& n : nodes_) n.gen_done = false;
    send_all(proto::msg_start(store_addr_, master_port_, spec_.restart_base + restart_));
  }

  void on_signal(int sig) {
    if (sig == SIGCHLD) return;
    if (signals_->is_dump(sig)) {
      mux_.note("dstrain: SIGUSR2: asking every rank to dump its flight record");
      send_all(proto::msg_dump());
      return;
    }
    TeardownOrders orders = generation_.signalled(sig, SteadyClock::now());
    if (orders.force == Force::kAtOnce) {
      mux_.note(fmt::format("dstrain: {} again: closing every connection now", signal_name(sig)));
      nodes_.clear();
      forced_ = true;
      return;
    }
    if (!orders.interrupted) return;  // a repeated SIGTERM: let the ranks checkpoint
    mux_.note(fmt::format("dstrain: {}: stopping every rank (again to force)", signal_name(sig)));
    // Before the store is up no generation runs: there is nothing to stop.
    if (store_addr_.empty()) return quit_all(Millis(1000));
    carry_out(orders);
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

  // The starter process (srun, mpirun) died under the job: a node-level failure.
  void check_starter() {
    auto why = starter_.died();
    if (!why) return;
    TeardownOrders orders = generation_.node_failed(Failure{-1, "", {}, *why}, SteadyClock::now());
    if (store_addr_.empty()) quit_all(Millis(1000));
    carry_out(orders);
  }

  RemoteResult loop() {
    for (;;) {
      for (auto& n : nodes_) pump(n);
      check_heartbeats();
      if (!quitting() && !store_addr_.empty() && all(&RemoteNode::gen_done)) generation_over();
      // Failed before the store was up (node 0's agent could not start): nothing runs yet.
      if (!quitting() && generation_.first_failure() && store_addr_.empty()) quit_all(Millis(3000));
      if (!quitting()) check_starter();
      carry_out(generation_.tick(SteadyClock::now()));
      if (quitting() && (all(&RemoteNode::closed) || quit_deadline_.expired())) break;
      poll_once();
      if (forced_) {
        RemoteResult r{outcome(), lost_, true};
        return r;
      }
    }
    nodes_.clear();
    return RemoteResult{outcome(), lost_, false};
  }

  // Every agent is told to quit; the job ends when their connections close or after `wait`.
  void quit_all(Millis wait) {
    for (auto& n : nodes_) {
      if (n.closed) continue;
      n.pending += proto::msg_quit();
      n.quitting = true;
    }
    generation_.begin_closing();
    quit_deadline_ = Deadline::after(wait);
  }
  bool quitting() const { return generation_.closing(); }

  const JobSpec& spec_;
  OutputMux& mux_;
  AgentStarter& starter_;
  SignalPipe* signals_ = nullptr;
  std::vector<RemoteNode> nodes_;
  std::string job_id_;
  std::string store_addr_;
  int master_port_ = 0;
  int restart_ = 0;
  std::vector<LostNode> lost_;
  Teardown generation_;  // the current generation's teardown; closing once quit was sent
  bool forced_ = false;  // a second Ctrl-C: every connection closed at once
  Deadline quit_deadline_ = Deadline::never();
  SteadyClock::time_point t0_;
};

}  // namespace

std::unique_ptr<AgentStarter> make_ssh_starter(const JobSpec& spec) {
  return std::make_unique<SshStarter>(spec);
}

RemoteResult run_remote_attempt(const JobSpec& spec, OutputMux& mux, AgentStarter& starter) {
  RemoteJob job(spec, mux, starter);
  return job.run();
}

int run_remote_job(const JobSpec& spec, OutputMux& mux, AgentStarter& starter) {
  const RemoteResult r = run_remote_attempt(spec, mux, starter);
  if (r.forced) return 128 + r.outcome.stop_signal;
  return finish(mux, r.outcome);
}

}  // namespace ds::launch
