// `dstrain check --hostfile H`: before a job, for every host: reachable over SSH (host key and
// authentication), dstrain present at the expected path with our version, GPUs vs slots, and the
// master port free. Prints a table; exits 0 only when every host passes.
//
// Deliberately not: a fixer. It reports what is wrong and how to fix it, and changes nothing
// (except known_hosts under --ssh-accept-new-host-keys, as `launch` would).
#include <poll.h>

#include <filesystem>
#include <iostream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common/error.h"
#include "config/hostfile.h"
#include "dstrain/build_info.h"
#include "launch/ssh.h"

namespace ds::cli {

namespace {

struct CheckOptions {
  std::string hostfile;
  std::string include, exclude;
  int master_port = 29500;
  int ssh_port = 22;
  std::string ssh_user;
  std::vector<std::string> ssh_keys;
  std::string known_hosts;
  bool accept_new_host_keys = false;
  double ssh_timeout_s = 10.0;
  std::string remote_dstrain;
};

void setup_check(CLI::App& sub, CheckOptions& o) {
  sub.add_option("--hostfile,-H", o.hostfile, "DeepSpeed-style hostfile")->required();
  sub.add_option("--include,-i", o.include, "only these hosts/slots (DeepSpeed syntax)");
  sub.add_option("--exclude,-e", o.exclude, "all but these hosts/slots");
  sub.add_option("--master-port", o.master_port, "the MASTER_PORT the job will use (default 29500)");
  sub.add_option("--ssh-port", o.ssh_port, "SSH port of every node (default 22)");
  sub.add_option("--ssh-user", o.ssh_user, "SSH user on every node (default: yours)");
  sub.add_option("--ssh-key", o.ssh_keys, "private key file (repeatable)")->allow_extra_args(false);
  sub.add_option("--ssh-known-hosts", o.known_hosts, "known_hosts file (default ~/.ssh/known_hosts)");
  sub.add_flag("--ssh-accept-new-host-keys", o.accept_new_host_keys,
               "trust and record host keys not yet in known_hosts");
  sub.add_option("--ssh-timeout", o.ssh_timeout_s, "seconds to reach each host (default 10)");
  sub.add_option("--remote-dstrain", o.remote_dstrain,
                 "path of dstrain on the nodes (default: the same path as this one)");
}

struct HostResult {
  std::string host;
  int slots = 0;
  std::string ssh = "-", dstrain = "-", version = "-", gpus = "-", port = "-";
  std::vector<std::string> problems;
};

std::string self_path() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("dstrain") : p.string();
}

void probe(const CheckOptions& o, const launch::SshOptions& ssh, const std::string& remote,
           HostResult& r) {
  std::unique_ptr<launch::SshConnection> c;
  std::vector<std::string> cmd = {remote, "agent", "--probe", "--master-port",
                                  std::to_string(o.master_port)};
  try {
    c = launch::SshConnection::open(r.host, ssh, "exec " + launch::shell_join(cmd));
  } catch (const Error& e) {
    r.ssh = "FAIL";
    r.problems.push_back(e.what() + (e.hint().empty() ? "" : " (hint: " + e.hint() + ")"));
    return;
  }
  r.ssh = "ok";
  std::string out, err;
  Deadline deadline = Deadline::after(Millis(static_cast<int64_t>(o.ssh_timeout_s * 1000)));
  try {
    for (;;) {
      bool open = c->read(0, &out);
      bool open_err = c->read(1, &err);
      if (!open || !open_err || c->eof()) break;
      if (deadline.expired()) {
        r.dstrain = "FAIL";
        r.problems.push_back(fmt::format("{}: `dstrain agent --probe` did not answer in time", r.host));
        return;
      }
      pollfd p{c->socket(), POLLIN, 0};
      ::poll(&p, 1, 50);
    }
  } catch (const Error& e) {
    r.dstrain = "FAIL";
    r.problems.push_back(e.what());
    return;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(out);
  } catch (const nlohmann::json::exception&) {
    r.dstrain = "FAIL";
    r.problems.push_back(fmt::format("{}: {} did not run (is dstrain installed there? pass "
                                     "--remote-dstrain PATH){}",
                                     r.host, remote, err.empty() ? "" : ": " + err.substr(0, 200)));
    return;
  }
  r.dstrain = "ok";
  r.version = j.value("version", "?");
  if (r.version != DSTRAIN_VERSION) {
    r.problems.push_back(fmt::format("{}: dstrain {} there, {} here: install the same version",
                                     r.host, r.version, DSTRAIN_VERSION));
  }
  int gpus = j.value("gpus", 0);
  r.gpus = fmt::format("{}/{}", gpus, r.slots);
  if (gpus > 0 && gpus < r.slots) {
    r.problems.push_back(fmt::format("{}: {} slot(s) in the hostfile but only {} GPU(s)", r.host,
                                     r.slots, gpus));
  } else if (gpus == 0) {
    r.gpus += " (cpu)";
  }
  bool free = j.value("master_port_free", false);
  r.port = free ? "free" : "IN USE";
  if (!free) {
    r.problems.push_back(fmt::format("{}: MASTER_PORT {} is in use there: pick another with "
                                     "--master-port", r.host, o.master_port));
  }
}

int run_check(const CheckOptions& o) {
  config::ResourceFilter filter{o.include, o.exclude, -1, -1};
  auto nodes = config::apply_filters(config::load_hostfile(o.hostfile), filter);
  launch::SshOptions ssh;
  ssh.port = o.ssh_port;
  ssh.user = o.ssh_user;
  ssh.keys = o.ssh_keys;
  ssh.known_hosts = o.known_hosts;
  ssh.accept_new_host_keys = o.accept_new_host_keys;
  ssh.connect_timeout = Millis(static_cast<int64_t>(o.ssh_timeout_s * 1000));
  std::string remote = o.remote_dstrain.empty() ? self_path() : o.remote_dstrain;

  std::vector<HostResult> results(nodes.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < nodes.size(); ++i) {
    results[i].host = nodes[i].host;
    results[i].slots = static_cast<int>(nodes[i].slots.size());
    threads.emplace_back([&, i] { probe(o, ssh, remote, results[i]); });
  }
  for (auto& t : threads) t.join();

  size_t w = 4;
  for (const auto& r : results) w = std::max(w, r.host.size());
  std::cout << fmt::format("{:<{}}  {:<4}  {:<7}  {:<8}  {:<10}  {}\n", "HOST", w, "SSH", "DSTRAIN",
                           "VERSION", "GPUS/SLOTS", fmt::format("PORT {}", o.master_port));
  bool ok = true;
  for (const auto& r : results) {
    std::cout << fmt::format("{:<{}}  {:<4}  {:<7}  {:<8}  {:<10}  {}\n", r.host, w, r.ssh,
                             r.dstrain, r.version, r.gpus, r.port);
    ok = ok && r.problems.empty();
  }
  for (const auto& r : results) {
    for (const auto& p : r.problems) std::cout << "problem: " << p << "\n";
  }
  std::cout << (ok ? fmt::format("all {} host(s) ready\n", results.size())
                   : std::string("some hosts are not ready\n"));
  return ok ? 0 : 1;
}

}  // namespace

void add_check_command(CLI::App& app, std::vector<Command>& out) {
  auto opts = std::make_shared<CheckOptions>();
  auto* sub = app.add_subcommand("check", "check every host of a hostfile before a job: SSH, "
                                          "dstrain version, GPUs, master port");
  setup_check(*sub, *opts);
  out.push_back({sub, [opts] { return run_check(*opts); }});
}

}  // namespace ds::cli
