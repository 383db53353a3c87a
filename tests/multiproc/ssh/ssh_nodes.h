// Test harness: two loopback SSH "nodes", OpenSSH servers on 127.0.0.2 and 127.0.0.3 (same
// unprivileged port, generated host and user keys, a hostfile with 2 slots each), for the SSH
// launcher tests and the MPI launchers (Open MPI's and Hydra's ssh start their daemons through
// them). Started by the constructor as this test's children (JobProcess: PR_SET_PDEATHSIG) and
// stopped by the destructor, by their pids. skip_reason says why they cannot run (not root, no
// openssh-server). Header-only.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "multiproc/launch/job_process.h"
#include "support/run_command.h"

namespace ds::test {

using namespace std::chrono_literals;

inline bool can_bind(const char* addr, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, addr, &a.sin_addr);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  int port_out = port;
  if (ok && port == 0) {
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port_out = ntohs(a.sin_port);
  }
  ::close(fd);
  return ok && port_out > 0;
}

inline int free_port_on_both() {
  for (int attempt = 0; attempt < 50; ++attempt) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    ::inet_pton(AF_INET, "127.0.0.2", &a.sin_addr);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    int port = ntohs(a.sin_port);
    ::close(fd);
    if (can_bind("127.0.0.3", port) && can_bind("127.0.0.2", port)) return port;
  }
  return -1;
}

inline bool accepts(const char* addr, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, addr, &a.sin_addr);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// Two sshd "nodes" for the whole suite.
struct Nodes {
  TempDir dir;
  int port = -1;
  std::vector<std::unique_ptr<JobProcess>> sshd;
  std::string skip_reason;

  std::string path(const std::string& rel) const { return dir / rel; }

  Nodes() {
    if (::geteuid() != 0) {
      skip_reason = "sshd needs root here (privilege separation)";
      return;
    }
    if (::access("/usr/sbin/sshd", X_OK) != 0 || ::access("/usr/bin/ssh-keygen", X_OK) != 0) {
      skip_reason = "openssh-server (/usr/sbin/sshd) or ssh-keygen not installed";
      return;
    }
    ::mkdir("/run/sshd", 0755);
    for (const char* k : {"host2", "host3", "user", "wrong"}) {
      auto r = test::run_command("ssh-keygen -q -t ed25519 -N '' -C dstrain-test -f " + path(k));
      if (r.exit_code != 0) {
        skip_reason = "ssh-keygen failed: " + r.err;
        return;
      }
    }
    std::ofstream(path("authorized_keys")) << test::slurp(path("user.pub"));
    port = free_port_on_both();
    if (port < 0) {
      skip_reason = "no port free on both 127.0.0.2 and 127.0.0.3";
      return;
    }
    for (const char* n : {"2", "3"}) {
      std::string cfg = path(std::string("sshd_config") + n);
      std::ofstream(cfg) << "ListenAddress 127.0.0." << n << ":" << port << "\n"
                         << "HostKey " << path(std::string("host") + n) << "\n"
                         << "PidFile none\nAuthorizedKeysFile " << path("authorized_keys") << "\n"
                         << "StrictModes no\nUsePAM no\nPasswordAuthentication no\n"
                         << "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
                         << "LogLevel ERROR\nMaxStartups 100\n";
      sshd.push_back(std::make_unique<JobProcess>(
          std::vector<std::string>{"/usr/sbin/sshd", "-D", "-e", "-f", cfg}));
    }
    auto until = std::chrono::steady_clock::now() + 10s;
    while (!(accepts("127.0.0.2", port) && accepts("127.0.0.3", port))) {
      if (std::chrono::steady_clock::now() > until) {
        skip_reason = "sshd did not start: " + sshd[0]->err() + sshd[1]->err();
        return;
      }
      std::this_thread::sleep_for(20ms);
    }
    std::ofstream(path("known_hosts"))
        << "[127.0.0.2]:" << port << " " << test::slurp(path("host2.pub")) << "[127.0.0.3]:" << port
        << " " << test::slurp(path("host3.pub"));
    std::ofstream(path("hostfile"))
        << "# two loopback nodes\n127.0.0.2 slots=2\n127.0.0.3 slots=2\n";
  }

  // An `ssh` for Open MPI's and Hydra's own launchers (plm_rsh_agent, -launcher-exec) that uses
  // these nodes' port, key and known hosts.
  std::string ssh_wrapper() const {
    std::string path = dir / "ssh-wrapper";
    std::ofstream(path) << "#!/bin/sh\nexec ssh -p " << port << " -i " << path_of("user")
                        << " -o UserKnownHostsFile=" << path_of("known_hosts")
                        << " -o StrictHostKeyChecking=yes -o BatchMode=yes \"$@\"\n";
    ::chmod(path.c_str(), 0755);
    return path;
  }
  std::string path_of(const std::string& rel) const { return dir / rel; }

  std::vector<std::string> ssh_flags(const std::string& key = "user",
                                     const std::string& known = "known_hosts") const {
    return {"--ssh-port",        std::to_string(port), "--ssh-key",     path(key),
            "--ssh-known-hosts", path(known),          "--ssh-timeout", "10"};
  }
};

}  // namespace ds::test
