// The cluster starters of remote_job.h: srun (--launcher slurm) or mpirun (openmpi, mpich)
// starts one `dstrain agent` per node; each agent dials back to our control server
// (controller.h). Here: finding and checking the program, its command line, accepting the
// agents within --join-timeout while watching the program, and reaping it at the end.
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <deque>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "launch/cluster.h"
#include "launch/controller.h"
#include "launch/remote_job.h"
#include "launch/slurm.h"

namespace ds::launch {

namespace {

std::string this_hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

// The starter's argv up to (not including) the agent's own.
std::vector<std::string> starter_prefix(const JobSpec& spec, const std::string& job_id) {
  std::vector<std::string> hosts;
  for (const auto& n : spec.world.nodes) hosts.push_back(n.host);
  const std::string count = std::to_string(hosts.size());
  const std::string host_list = fmt::format("{}", fmt::join(hosts, ","));
  std::vector<std::string> cmd;
  if (spec.backend == Backend::kSlurm) {
    // An elastic restart: the lost node's slurmd may be gone with the last step, which Slurm then
    // still counts as running on every node; the new step shares their resources with it.
    std::vector<std::string> extra;
    if (spec.restart_base > 0 && spec.min_nodes > 0) extra.push_back("--overlap");
    cmd = srun_command(find_cluster_program(Backend::kSlurm), hosts, job_id, extra);
  } else if (spec.backend == Backend::kOpenMpi) {
    // -x: mpirun passes only the variables it is told to remote nodes.
    cmd = {find_cluster_program(Backend::kOpenMpi),
           "-np",
           count,
           "-npernode",
           "1",
           "--host",
           host_list,
           "-x",
           "DSTRAIN_JOB_TOKEN"};
  } else {
    // Hydra passes the whole environment on by itself.
    cmd = {find_cluster_program(Backend::kMpich), "-n", count, "-ppn", "1", "-hosts", host_list};
  }
  cmd.insert(cmd.end(), spec.launcher_args.begin(), spec.launcher_args.end());
  return cmd;
}

class ClusterStarter : public AgentStarter {
 public:
  ClusterStarter(const JobSpec& spec, OutputMux& mux) : spec_(spec), mux_(mux) {}
  ~ClusterStarter() override { finish(); }
  bool sends_token() const override { return false; }

  std::vector<std::unique_ptr<AgentChannel>> start(const std::string& job_id,
                                                   const std::string& token) override {
    ControlServer server;
    const std::string addr = spec_.launcher_addr.empty() ? this_hostname() : spec_.launcher_addr;
    SpawnRequest req;
    req.argv = starter_prefix(spec_, job_id);
    name_ = cluster_program_label(spec_.backend);
    for (const auto& a :
         agent_command(spec_, job_id, -1, fmt::format("{}:{}", addr, server.port()))) {
      req.argv.push_back(a);
    }
    for (auto& kv : current_environment()) {
      if (kv.first != "DSTRAIN_JOB_TOKEN") req.env.push_back(std::move(kv));
    }
    req.env.emplace_back("DSTRAIN_JOB_TOKEN", token);
    spdlog::debug("job {}: starting the agents: {}", job_id, fmt::join(req.argv, " "));
    proc_ = spawn(req);
    return accept_agents(server, token);
  }

  std::vector<int> fds() const override {
    std::vector<int> out;
    for (int fd : {proc_.stdout_fd, proc_.stderr_fd}) {
      if (fd >= 0) out.push_back(fd);
    }
    return out;
  }

  void pump() override {
    pump_fd(proc_.stdout_fd, out_lines_);
    pump_fd(proc_.stderr_fd, err_lines_);
  }

  std::optional<std::string> died() override {
    if (!reap(false)) return std::nullopt;
    return fmt::format("{} exited with {} while the job ran{}", name_, status_.describe(),
                       last_words());
  }

  void finish() override {
    if (proc_.pid <= 0) return;
    auto wait_for = [&](Millis d) {
      Deadline dl = Deadline::after(d);
      while (!reap(false) && !dl.expired()) {
        pump();
        ::usleep(20000);
      }
      return reaped_;
    };
    if (!wait_for(spec_.kill_timeout + Millis(5000))) {
      spdlog::warn("{} (pid {}) did not exit after its agents ended: sending SIGTERM", name_,
                   proc_.pid);
      signal_group(proc_.pid, SIGTERM);
      if (!wait_for(Millis(3000))) {
        signal_group(proc_.pid, SIGKILL);
        reap(true);
      }
    }
    pump();
    for (int* fd : {&proc_.stdout_fd, &proc_.stderr_fd}) {
      if (*fd >= 0) ::close(*fd);
      *fd = -1;
    }
    proc_.pid = -1;
  }

 private:
  // Accepts agents until every node has one, watching the starter; throws naming the nodes that
  // did not join within --join-timeout, or the starter's exit and last lines.
  std::vector<std::unique_ptr<AgentChannel>> accept_agents(ControlServer& server,
                                                           const std::string& token) {
    const int count = static_cast<int>(spec_.world.nodes.size());
    std::vector<std::unique_ptr<AgentChannel>> channels(static_cast<size_t>(count));
    int joined = 0;
    Deadline deadline = Deadline::after(spec_.join_timeout);
    while (joined < count) {
      if (reap(false)) {
        pump();
        throw Error(ErrorKind::kRemote,
                    fmt::format("{} exited with {} before {}{}", name_, status_.describe(),
                                missing(channels), last_words()),
                    hint());
      }
      if (deadline.expired()) {
        throw Error(ErrorKind::kTimeout,
                    fmt::format("{} did not join within {}{}", missing(channels),
                                net::format_seconds(spec_.join_timeout), last_words()),
                    "is the cluster busy (raise --join-timeout), or can the nodes reach this host? "
                    "(--launcher-addr)");
      }
      std::vector<pollfd> p = {{server.fd(), POLLIN, 0}};
      for (int fd : fds()) p.push_back({fd, POLLIN, 0});
      ::poll(p.data(), p.size(), std::min(100, deadline.remaining_ms()));
      pump();
      if (p[0].revents == 0) continue;
      auto got = server.accept_one(token, count);
      if (!got) continue;
      auto& slot = channels[static_cast<size_t>(got->first)];
      if (slot) {
        spdlog::warn("a second agent claimed node {}: refused", got->first);
        continue;
      }
      slot = std::move(got->second);
      ++joined;
    }
    return channels;
  }

  std::string missing(const std::vector<std::unique_ptr<AgentChannel>>& channels) const {
    std::vector<std::string> names;
    for (size_t i = 0; i < channels.size(); ++i) {
      if (!channels[i]) names.push_back(fmt::format("node {} ({})", i, spec_.world.nodes[i].host));
    }
    return fmt::format("the agent(s) of {}", fmt::join(names, ", "));
  }

  std::string hint() const {
    if (spec_.backend == Backend::kSlurm)
      return "see srun's message above; are the nodes in this allocation?";
    return "see mpirun's message above (as root, Open MPI wants --launcher-args "
           "--allow-run-as-root)";
  }

  std::string last_words() const {
    if (last_.empty()) return "";
    return fmt::format(" ({} said: {})", name_, fmt::join(last_, " | "));
  }

  void pump_fd(int& fd, LineSplitter& lines) {
    if (fd < 0) return;
    char buf[8192];
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) {
        lines.feed(std::string_view(buf, static_cast<size_t>(n)),
                   [&](std::string_view l) { note(l); });
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        lines.finish([&](std::string_view l) { note(l); });
        ::close(fd);
        fd = -1;
      }
      return;
    }
  }

  void note(std::string_view line) {
    mux_.note(fmt::format("[{}] {}", name_, line));
    last_.emplace_back(line);
    if (last_.size() > 4) last_.pop_front();
  }

  // True once the starter has exited (then status_ holds how).
  bool reap(bool block) {
    if (reaped_) return true;
    if (proc_.pid <= 0) return false;
    int st = 0;
    pid_t r = ::waitpid(proc_.pid, &st, block ? 0 : WNOHANG);
    if (r != proc_.pid) return false;
    reaped_ = true;
    status_ = ExitStatus::from_wait(st);
    signal_group(proc_.pid, SIGKILL);  // anything it left in its group
    return true;
  }

  const JobSpec& spec_;
  OutputMux& mux_;
  std::string name_;
  Spawned proc_;
  bool reaped_ = false;
  ExitStatus status_;
  LineSplitter out_lines_, err_lines_;
  std::deque<std::string> last_;
};

}  // namespace

std::unique_ptr<AgentStarter> make_cluster_starter(const JobSpec& spec, OutputMux& mux) {
  return std::make_unique<ClusterStarter>(spec, mux);
}

}  // namespace ds::launch
