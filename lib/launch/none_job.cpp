// --launcher none: one node of a job whose nodes meet in node 0's store (see none_job.h for the
// keys). The node's ranks run under an in-process Agent; a watcher thread polls the store for
// another node's failure and wakes the agent through a pipe.
#include "launch/none_job.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/socket.h"
#include "common/strings.h"
#include "launch/agent_main.h"
#include "launch/job_summary.h"
#include "launch/teardown.h"
#include "store/tcp_store_client.h"
#include "store/tcp_store_server.h"

namespace ds::launch {

namespace {

using nlohmann::json;
using store::to_bytes;
using store::to_string;

json failure_json(const Failure& f) {
  return {{"rank", f.rank},
          {"host", f.host},
          {"code", f.status.code},
          {"signal", f.status.signal},
          {"what", f.what}};
}
Failure failure_from(const json& j) {
  Failure f;
  f.rank = j.at("rank").get<int>();
  f.host = j.at("host").get<std::string>();
  f.status.code = j.at("code").get<int>();
  f.status.signal = j.at("signal").get<int>();
  f.what = j.at("what").get<std::string>();
  return f;
}

class NoneListener : public AgentListener {
 public:
  NoneListener(OutputMux& mux, std::function<void(int, const ExitStatus&)> on_fail)
      : mux_(mux), on_fail_(std::move(on_fail)) {}
  void on_started(int, pid_t) override {}
  void on_output(int rank, int stream, std::string_view line) override {
    mux_.line(rank, stream, line);
  }
  void on_exit(int rank, const ExitStatus& s) override {
    if (!s.ok()) on_fail_(rank, s);
  }

 private:
  OutputMux& mux_;
  std::function<void(int, const ExitStatus&)> on_fail_;
};

// Polls `key` with its own store connection; once it exists, waits `grace` (unless the
// generation ended) and writes a byte to the pipe the agent watches.
class FailureWatcher {
 public:
  FailureWatcher(store::TcpStoreClientOptions o, std::string key, Millis grace) {
    if (::pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) != 0)
      throw system_error("pipe: {}", errno_string(errno));
    thread_ = std::thread([this, o = std::move(o), key = std::move(key), grace] {
      try {
        store::TcpStoreClient client(o);
        while (!done_ && !client.check({key})) std::this_thread::sleep_for(Millis(100));
        Deadline until = Deadline::after(grace);
        while (!done_ && !until.expired()) std::this_thread::sleep_for(Millis(20));
      } catch (const Error& e) {
        if (!done_) spdlog::warn("lost node 0's store ({}): stopping this node's ranks", e.what());
      }
      if (!done_) (void)!::write(pipe_[1], "x", 1);
    });
  }
  ~FailureWatcher() {
    done_ = true;
    thread_.join();
    ::close(pipe_[0]);
    ::close(pipe_[1]);
  }
  int fd() const { return pipe_[0]; }

 private:
  int pipe_[2] = {-1, -1};
  std::atomic<bool> done_{false};
  std::thread thread_;
};

class NoneNode {
 public:
  NoneNode(const JobSpec& spec, OutputMux& mux) : spec_(spec), mux_(mux), me_(spec.node_rank) {}

  int run() {
    started_ = SteadyClock::now();
    SignalPipe signals(spec_.preempt_signal);
    signals_ = &signals;
    if (me_ == 0) host_store();
    join();
    for (int gen = 0;; ++gen) {
      json verdict = run_generation(gen);
      if (!verdict.at("restart").get<bool>())
        return finish(mux_, outcome_from(verdict.at("outcome"), gen));
      mux_.note(fmt::format("dstrain: {}; restarting every rank ({}/{})",
                            describe_failure(failure_from(verdict.at("outcome").at("failure"))),
                            gen + 1, spec_.max_restarts));
      mux_.restart_marker(gen + 1);
    }
  }

 private:
  std::string key(const std::string& k) const { return "launch/" + k; }
  int nodes() const { return static_cast<int>(spec_.world.nodes.size()); }
  std::string node_name(int n) const {
    return fmt::format("node {} ({})", n, spec_.world.nodes[static_cast<size_t>(n)].host);
  }

  void host_store() {
    master_port_ = resolve_master_port(spec_.world.master_port, spec_.world.nodes[0].host);
    store::TcpStoreServerOptions so;
    so.port = spec_.store_port;
    so.token = spec_.token;
    server_ = std::make_unique<store::TcpStoreServer>(so);
    server_->start();
  }

  store::TcpStoreClientOptions client_options(Millis connect_timeout) const {
    store::TcpStoreClientOptions o;
    o.host = spec_.world.master_addr;
    o.port = spec_.store_port;
    o.token = spec_.token;
    o.connect_timeout = connect_timeout;
    return o;
  }

  // Every node says it is here; node 0 waits for them all and says go (or why not).
  void join() {
    const std::string at = fmt::format("{}:{}", spec_.world.master_addr, spec_.store_port);
    try {
      store_ = std::make_shared<store::TcpStoreClient>(client_options(spec_.join_timeout));
    } catch (const Error& e) {
      throw Error(
          e.kind(),
          fmt::format("{}: cannot join node 0's store at {}: {}", node_name(me_), at, e.what()),
          "start node 0 (--node-rank 0), and give every node the same --master-addr, --store-port "
          "and DSTRAIN_JOB_TOKEN; raise --join-timeout when nodes start far apart");
    }
    store_->set(key(fmt::format("node/{}", me_)),
                to_bytes(spec_.world.nodes[static_cast<size_t>(me_)].host));
    if (me_ == 0) return announce_go();
    std::string go = to_string(store_->get(key("go"), 2 * spec_.join_timeout));
    if (starts_with(go, "abort ")) throw remote_error("node 0 ended the job: {}", go.substr(6));
    auto f = split(go, ' ');
    if (f.size() != 3 || !parse_int(f[1]))
      throw remote_error("node 0's store holds a malformed start key");
    master_port_ = static_cast<int>(*parse_int(f[1]));
    job_id_ = f[2];
  }

  void announce_go() {
    std::vector<std::string> keys;
    for (int n = 0; n < nodes(); ++n) keys.push_back(key(fmt::format("node/{}", n)));
    try {
      store_->wait(keys, spec_.join_timeout);
    } catch (const Error&) {
      std::vector<std::string> missing;
      for (int n = 0; n < nodes(); ++n) {
        if (!store_->check({keys[static_cast<size_t>(n)]})) missing.push_back(node_name(n));
      }
      std::string why = fmt::format("{} did not join within {}", fmt::join(missing, ", "),
                                    net::format_seconds(spec_.join_timeout));
      store_->set(key("go"), to_bytes("abort " + why));
      throw Error(
          ErrorKind::kTimeout, why,
          "start `dstrain launch --launcher none --node-rank N` on every node of the hostfile, "
          "with node 0's address as --master-addr; raise --join-timeout when they start far apart");
    }
    job_id_ = make_job_id();
    store_->set(key("go"), to_bytes(fmt::format("ok {} {}", master_port_, job_id_)));
  }

  json run_generation(int gen);
  json decide(int gen);
  JobOutcome outcome_from(const json& o, int restarts) const;

  const JobSpec& spec_;
  OutputMux& mux_;
  const int me_;
  SignalPipe* signals_ = nullptr;
  std::unique_ptr<store::TcpStoreServer> server_;
  std::shared_ptr<store::TcpStoreClient> store_;
  int master_port_ = 0;
  std::string job_id_;
  SteadyClock::time_point started_;
};

// Runs this node's ranks for one generation, reports, and returns node 0's verdict.
json NoneNode::run_generation(int gen) {
  const std::string failure_key = key(fmt::format("gen{}/failure", gen));
  AgentConfig cfg = agent_config(spec_, me_);
  cfg.job_id = job_id_;
  cfg.token = spec_.token;
  const std::string host = spec_.world.nodes[static_cast<size_t>(me_)].host;
  auto publish = [&](const Failure& f) {
    store_->compare_set(failure_key, {}, to_bytes(failure_json(f).dump()));
  };
  NoneListener listener(mux_, [&](int rank, const ExitStatus& s) {
    publish(Failure{rank, host, s, {}});
  });
  Agent agent(cfg, listener, *signals_);
  GenerationResult r;
  {
    FailureWatcher watcher(client_options(Millis(10000)), failure_key, spec_.failure_grace);
    auto on_control = [&] {
      char b[16];
      (void)!::read(watcher.fd(), b, sizeof b);
      return true;
    };
    r = agent.run(fmt::format("{}:{}", spec_.world.master_addr, spec_.store_port), master_port_,
                  gen, watcher.fd(), on_control);
  }
  if (r.stop_signal != 0 && !r.first_failure) {
    publish(Failure{
        -1,
        host,
        {},
        fmt::format("{} was interrupted by {}", node_name(me_), signal_name(r.stop_signal))});
  }
  int preempted = 0;
  for (const auto& e : r.exits)
    preempted += is_preemption(Failure{e.rank, host, e.status, {}}) ? 1 : 0;
  json done = {{"preempted", preempted}, {"stop_signal", r.stop_signal}};
  store_->set(key(fmt::format("gen{}/done/{}", gen, me_)), to_bytes(done.dump()));
  json verdict = me_ == 0 ? decide(gen)
                          : json::parse(to_string(store_->get(
                                key(fmt::format("gen{}/next", gen)),
                                spec_.kill_timeout + spec_.failure_grace + Millis(60000))));
  store_->set(key(fmt::format("gen{}/ack/{}", gen, me_)), to_bytes("1"));
  if (me_ == 0 && !verdict.at("restart").get<bool>()) {
    std::vector<std::string> acks;
    for (int n = 0; n < nodes(); ++n) acks.push_back(key(fmt::format("gen{}/ack/{}", gen, n)));
    try {
      store_->wait(acks, Millis(10000));  // keep the store up until every node read the verdict
    } catch (const Error& e) {
      spdlog::warn("not every node read the job's outcome: {}", e.what());
    }
  }
  return verdict;
}

// Node 0: every node's report of generation `gen` -> restart, or the job's outcome.
json NoneNode::decide(int gen) {
  std::vector<std::string> keys;
  for (int n = 0; n < nodes(); ++n) keys.push_back(key(fmt::format("gen{}/done/{}", gen, n)));
  json outcome = {{"failure", nullptr}, {"stop_signal", 0}, {"preempted", false}};
  int preempted = 0;
  try {
    store_->wait(keys, spec_.kill_timeout + spec_.failure_grace + Millis(30000));
    for (const auto& k : keys) {
      json d = json::parse(to_string(store_->get(k)));
      preempted += d.at("preempted").get<int>();
      if (d.at("stop_signal").get<int>() != 0) outcome["stop_signal"] = d.at("stop_signal");
    }
  } catch (const Error& e) {
    outcome["failure"] = failure_json(Failure{
        -1, "", {}, fmt::format("not every node reported the end of its ranks: {}", e.what())});
  }
  if (outcome["failure"].is_null() && store_->check({key(fmt::format("gen{}/failure", gen))})) {
    outcome["failure"] =
        json::parse(to_string(store_->get(key(fmt::format("gen{}/failure", gen)))));
  }
  outcome["preempted"] = preempted == spec_.world.world_size();
  const bool restart = restart_after(outcome_from(outcome, gen), gen, spec_.max_restarts);
  json verdict = {{"restart", restart}, {"outcome", outcome}};
  store_->set(key(fmt::format("gen{}/next", gen)), to_bytes(verdict.dump()));
  return verdict;
}

JobOutcome NoneNode::outcome_from(const json& o, int restarts) const {
  JobOutcome out;
  if (!o.at("failure").is_null()) out.failure = failure_from(o.at("failure"));
  out.stop_signal = o.at("stop_signal").get<int>();
  out.preempted = o.at("preempted").get<bool>();
  out.world_size = spec_.world.world_size();
  out.restarts = restarts;
  out.started = started_;
  return out;
}

}  // namespace

int run_none_node(const JobSpec& spec, OutputMux& mux) {
  if (spec.token.empty()) {
    throw Error(
        ErrorKind::kInvalidUsage,
        "--launcher none needs the job token in DSTRAIN_JOB_TOKEN on every node",
        "create one with `dstrain token` and give every node the same value (e.g. a Kubernetes "
        "secret as an environment variable)");
  }
  if (spec.node_rank < 0 || spec.node_rank >= static_cast<int>(spec.world.nodes.size())) {
    throw invalid_argument("--node-rank {} is outside the hostfile's {} node(s)", spec.node_rank,
                           spec.world.nodes.size());
  }
  ignore_sigpipe();
  NoneNode node(spec, mux);
  return node.run();
}

}  // namespace ds::launch
