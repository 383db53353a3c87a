// Test harness: a real two-node Slurm cluster on this machine. munged, slurmctld and two slurmd
// (`slurmd -N n1`, `-N n2`, the multiple-slurmd mode of Debian's slurm-wlm) run from a fresh
// directory with a slurm.conf written here (free ports, proctrack/linuxproc, task/none, nodes
// n[1-2] on this host at 127.0.0.1, a 5 s credential lifetime and a 1 s scheduler so a requeued
// job comes back within seconds). Everything is started as this test's children (JobProcess:
// own process group, PR_SET_PDEATHSIG) and stopped by its pids: the destructor cancels every job,
// waits for the queue to drain, SIGKILLs any slurmstepd left of this cluster (found by the
// SLURM_CONF in its environment), then the daemons. Skips (skip_reason) where it cannot run:
// not root, or slurm-wlm/munge not installed. Header-only.
//
// Node names n1/n2 do not resolve here; jobs pass MASTER_ADDR=127.0.0.1 (--master-addr), as the
// docs say a cluster whose node names do not resolve must.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "multiproc/launch/job_process.h"
#include "support/run_command.h"

namespace ds::test {

inline int free_tcp_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

class SlurmCluster {
 public:
  SlurmCluster() {
    using namespace std::chrono_literals;
    if (::geteuid() != 0) {
      skip_reason = "slurmd and munged need root here";
      return;
    }
    for (const char* bin : {"/usr/sbin/munged", "/usr/sbin/mungekey", "/usr/sbin/slurmctld",
                            "/usr/sbin/slurmd", "/usr/bin/srun", "/usr/bin/sbatch"}) {
      if (::access(bin, X_OK) != 0) {
        skip_reason = std::string(bin) +
                      " is not installed (scripts/install-deps.sh installs slurm-wlm and munge)";
        return;
      }
    }
    conf = dir / "slurm.conf";
    auto key = run_command("/usr/sbin/mungekey -c -k " + (dir / "munge.key"));
    if (key.exit_code != 0) {
      skip_reason = "mungekey failed: " + key.err;
      return;
    }
    daemons_.push_back(std::make_unique<JobProcess>(std::vector<std::string>{
        "/usr/sbin/munged", "-F", "-f", "-S", dir / "munge.sock",
        "--key-file=" + (dir / "munge.key"), "--pid-file=" + (dir / "munged.pid"),
        "--seed-file=" + (dir / "munged.seed"), "--log-file=" + (dir / "munged.log")}));
    if (!wait_for([&] { return std::filesystem::exists(dir / "munge.sock"); }, 10s)) {
      skip_reason = "munged did not start: " + daemons_.back()->err();
      return;
    }
    write_conf();
    std::vector<std::string> env = {"SLURM_CONF=" + conf};
    daemons_.push_back(std::make_unique<JobProcess>(
        std::vector<std::string>{"/usr/sbin/slurmctld", "-D", "-f", conf}, dir.path(), env));
    for (const char* node : {"n1", "n2"}) {
      std::filesystem::create_directories(dir / (std::string("spool-") + node));
      daemons_.push_back(std::make_unique<JobProcess>(
          std::vector<std::string>{"/usr/sbin/slurmd", "-D", "-N", node, "-f", conf}, dir.path(),
          env));
    }
    if (!wait_for([&] { return run("sinfo -h -N -o %T").out == "idle\nidle\n"; }, 30s)) {
      skip_reason = "the Slurm cluster did not come up: " + run("sinfo -N").out +
                    daemons_[1]->err() + daemons_[2]->err();
    }
  }

  ~SlurmCluster() {
    using namespace std::chrono_literals;
    if (!conf.empty() && skip_reason.empty()) {
      run("scancel --full --quiet --user=root");
      wait_for([&] { return run("squeue -h").out.empty(); }, 15s);
    }
    for (pid_t p : stepd_pids()) ::kill(p, SIGKILL);
    while (!daemons_.empty()) daemons_.pop_back();  // SIGKILL each daemon's group, reap it
  }

  // The pid of node `node`'s slurmd ("n1" or "n2").
  pid_t slurmd_pid(const std::string& node) const { return daemons_.at(node == "n1" ? 2 : 3)->pid(); }

  // `cmd` (a shell command line) with SLURM_CONF pointing at this cluster.
  CommandResult run(const std::string& cmd) const {
    return run_command("SLURM_CONF=" + conf + " " + cmd);
  }
  std::vector<std::string> env() const { return {"SLURM_CONF=" + conf}; }

  // "JobState=COMPLETED" -> "COMPLETED" for job `id` ("" when slurmctld forgot it).
  std::string job_field(const std::string& id, const std::string& field) const {
    std::string out = run("scontrol -o show job " + id).out;
    auto at = out.find(field + "=");
    if (at == std::string::npos) return "";
    at += field.size() + 1;
    return out.substr(at, out.find_first_of(" \n", at) - at);
  }

  // The slurmstepd processes of this cluster (their environment names our slurm.conf).
  std::vector<pid_t> stepd_pids() const {
    std::vector<pid_t> out;
    if (conf.empty()) return out;
    for (const auto& e : std::filesystem::directory_iterator("/proc")) {
      const std::string name = e.path().filename();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      if (slurp(e.path() / "comm").rfind("slurmstepd", 0) != 0) continue;
      std::string environ = slurp(e.path() / "environ");
      if (environ.find("SLURM_CONF=" + conf) != std::string::npos) out.push_back(std::stoi(name));
    }
    return out;
  }

  template <class F>
  static bool wait_for(F ready, std::chrono::milliseconds timeout) {
    auto until = std::chrono::steady_clock::now() + timeout;
    while (!ready()) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return true;
  }

  TempDir dir;
  std::string conf;
  std::string skip_reason;

 private:
  void write_conf() {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const std::string d = dir.path();
    std::ofstream(conf)
        << "ClusterName=dstest\n"
        << "SlurmctldHost=" << host << "(127.0.0.1)\n"
        << "SlurmctldPort=" << free_tcp_port() << "\n"
        << "SlurmUser=root\nSlurmdUser=root\n"
        << "AuthType=auth/munge\nCredType=cred/munge\n"
        << "AuthInfo=socket=" << d << "/munge.sock,cred_expire=5\n"
        << "StateSaveLocation=" << d << "\nSlurmdSpoolDir=" << d << "/spool-%n\n"
        << "SlurmctldPidFile=" << d << "/slurmctld.pid\nSlurmdPidFile=" << d << "/slurmd-%n.pid\n"
        << "SlurmctldLogFile=" << d << "/slurmctld.log\nSlurmdLogFile=" << d << "/slurmd-%n.log\n"
        << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\n"
        << "SwitchType=switch/none\nSelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
        << "SchedulerType=sched/backfill\nSchedulerParameters=sched_interval=1,bf_interval=1\n"
        << "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
        << "JobCompType=jobcomp/none\nMailProg=/bin/true\nReturnToService=2\n"
        << "SlurmdParameters=config_overrides\nKillWait=60\nMinJobAge=600\nInactiveLimit=0\n"
        << "NodeName=n1 NodeHostname=" << host
        << " NodeAddr=127.0.0.1 CPUs=4 RealMemory=1000 Port=" << free_tcp_port() << "\n"
        << "NodeName=n2 NodeHostname=" << host
        << " NodeAddr=127.0.0.1 CPUs=4 RealMemory=1000 Port=" << free_tcp_port() << "\n"
        << "PartitionName=main Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP "
           "OverSubscribe=YES\n";
  }

  std::vector<std::unique_ptr<JobProcess>> daemons_;
};

}  // namespace ds::test
