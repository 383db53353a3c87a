// TCP helpers: see socket.h. Everything is plain POSIX (getaddrinfo, poll, non-blocking
// connect), so error paths are explicit and every wait is bounded by a Deadline.
#include "common/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include "common/check.h"
#include "common/error.h"
#include "common/strings.h"

namespace ds::net {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);  // close() is not retried on EINTR on Linux: the fd is gone
  fd_ = fd;
}

std::string HostPort::str() const {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

HostPort parse_host_port(std::string_view text, std::string_view what) {
  std::string_view t = trim(text);
  HostPort hp;
  std::string_view port_text;
  if (!t.empty() && t.front() == '[') {
    size_t close = t.find(']');
    if (close == std::string_view::npos || close + 1 >= t.size() || t[close + 1] != ':') {
      throw invalid_argument("{}: '{}' is not [ipv6]:port", what, text);
    }
    hp.host = std::string(t.substr(1, close - 1));
    port_text = t.substr(close + 2);
  } else {
    size_t colon = t.rfind(':');
    if (colon == std::string_view::npos || colon == 0) {
      throw invalid_argument("{}: '{}' is not host:port (for example 10.0.0.1:29400)", what, text);
    }
    hp.host = std::string(t.substr(0, colon));
    if (hp.host.find(':') != std::string::npos) {
      throw invalid_argument("{}: '{}': write IPv6 addresses as [addr]:port", what, text);
    }
    port_text = t.substr(colon + 1);
  }
  auto port = parse_int(port_text);
  if (!port || *port < 0 || *port > 65535) {
    throw invalid_argument("{}: '{}': port '{}' is not a number in 0..65535", what, text,
                           port_text);
  }
  if (hp.host.empty()) throw invalid_argument("{}: '{}': the host is empty", what, text);
  hp.port = static_cast<int>(*port);
  return hp;
}

namespace {

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { freeaddrinfo(ai); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

// getaddrinfo's status (0 or EAI_*); fills `out` on success.
int try_resolve(const std::string& host, int port, bool passive, AddrInfoPtr* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  const char* node = host.empty() ? nullptr : host.c_str();
  int rc = getaddrinfo(node, service.c_str(), &hints, &res);
  if (rc == 0) out->reset(res);
  return rc;
}

AddrInfoPtr resolve(const std::string& host, int port, bool passive) {
  AddrInfoPtr res;
  int rc = try_resolve(host, port, passive, &res);
  if (rc != 0) throw invalid_argument("cannot resolve host '{}': {}", host, gai_strerror(rc));
  return res;
}

std::string display(const std::string& host, int port) { return HostPort{host, port}.str(); }

int make_socket(const addrinfo* ai) {
  return ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                  ai->ai_protocol);
}

}  // namespace

void set_nonblocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL, 0);
  DS_SYSCHECK(flags, "fcntl(F_GETFL)");
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  DS_SYSCHECK(fcntl(fd, F_SETFL, flags), "fcntl(F_SETFL)");
}

void set_cloexec(int fd) {
  int flags = fcntl(fd, F_GETFD, 0);
  DS_SYSCHECK(flags, "fcntl(F_GETFD)");
  DS_SYSCHECK(fcntl(fd, F_SETFD, flags | FD_CLOEXEC), "fcntl(F_SETFD)");
}

void set_nodelay(int fd) {
  int one = 1;
  DS_SYSCHECK(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one), "setsockopt(TCP_NODELAY)");
}

Fd listen_tcp(const std::string& host, int port, int backlog) {
  AddrInfoPtr res = resolve(host, port, true);
  int last_err = 0;
  for (addrinfo* ai = res.get(); ai; ai = ai->ai_next) {
    Fd fd(make_socket(ai));
    if (!fd) {
      last_err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.get(), backlog) != 0) {
      last_err = errno;
      continue;
    }
    return fd;
  }
  Error e = system_error("cannot listen on {}: {}", display(host, port), errno_string(last_err));
  if (last_err == EADDRINUSE) {
    throw Error(ErrorKind::kSystem, e.what(),
                "another process is using that port; pick another one or 0 for a free port");
  }
  throw e;
}

int local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  DS_SYSCHECK(getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len), "getsockname");
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  throw system_error("getsockname: unexpected address family {}", static_cast<int>(ss.ss_family));
}

bool port_is_free(const std::string& host, int port) {
  try {
    listen_tcp(host, port, 1);
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::string format_seconds(Millis d) {
  return fmt::format("{:.1f} s", static_cast<double>(d.count()) / 1000.0);
}

namespace {

// One non-blocking connect attempt bounded by `deadline`; returns the errno on failure.
int try_connect(const addrinfo* ai, Deadline deadline, Fd* out) {
  Fd fd(make_socket(ai));
  if (!fd) return errno;
  if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) return errno;
    pollfd p{fd.get(), POLLOUT, 0};
    for (;;) {
      int rc = ::poll(&p, 1, deadline.remaining_ms());
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0) return errno;
      if (rc == 0) return ETIMEDOUT;
      break;
    }
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
    if (err != 0) return err;
  }
  set_nodelay(fd.get());
  *out = std::move(fd);
  return 0;
}

}  // namespace

Fd connect_tcp(const std::string& host, int port, Deadline deadline,
               const ConnectOptions& options) {
  std::string peer = options.peer_name.empty()
                         ? display(host, port)
                         : fmt::format("{} at {}", options.peer_name, display(host, port));
  auto start = Clock::now();
  thread_local std::mt19937_64 rng(std::random_device{}());
  Millis backoff = options.initial_backoff;
  int attempts = 0;
  std::string last_error = "no attempt made";
  for (;;) {
    AddrInfoPtr res;
    int rc = try_resolve(host, port, false, &res);
    if (rc == EAI_AGAIN) {
      last_error = fmt::format("cannot resolve host '{}': {}", host, gai_strerror(rc));
    } else if (rc != 0) {
      throw invalid_argument("{}: cannot resolve host '{}': {}", peer, host, gai_strerror(rc));
    }
    for (addrinfo* ai = res.get(); ai; ai = ai->ai_next) {
      ++attempts;
      Fd fd;
      int err = try_connect(ai, deadline, &fd);
      if (err == 0) return fd;
      last_error = errno_string(err);
      if (deadline.expired()) break;
    }
    if (deadline.expired()) break;
    // Jitter in [0.5, 1.5) x backoff, so workers started together spread out.
    std::uniform_real_distribution<double> jitter(0.5, 1.5);
    auto sleep = Millis(static_cast<int64_t>(static_cast<double>(backoff.count()) * jitter(rng)));
    sleep = std::min<Millis>(sleep, Millis(deadline.remaining_ms()));
    std::this_thread::sleep_for(sleep);
    backoff = std::min<Millis>(backoff * 2, options.max_backoff);
    if (deadline.expired()) break;
  }
  auto waited = std::chrono::duration_cast<Millis>(Clock::now() - start);
  throw Error(ErrorKind::kTimeout,
              fmt::format("could not connect to {} within {} after {} attempt{}: {}", peer,
                          format_seconds(waited), attempts, attempts == 1 ? "" : "s",
                          last_error),
              "check that the address is right and that the server is running and reachable "
              "(firewall, interface)");
}

bool wait_readable(int fd, Deadline deadline) {
  pollfd p{fd, POLLIN, 0};
  for (;;) {
    int rc = ::poll(&p, 1, deadline.remaining_ms());
    if (rc < 0 && errno == EINTR) continue;
    DS_SYSCHECK(rc, "poll");
    return rc > 0;
  }
}

void write_exact(int fd, const void* data, size_t n, Deadline deadline, std::string_view peer) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < n) {
    ssize_t w = ::send(fd, p + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      done += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pf{fd, POLLOUT, 0};
      int rc = ::poll(&pf, 1, deadline.remaining_ms());
      if (rc < 0 && errno == EINTR) continue;
      DS_SYSCHECK(rc, "poll");
      if (rc == 0) throw timeout_error("sending to {}: timed out ({} of {} bytes sent)", peer, done, n);
      continue;
    }
    int err = errno;
    throw remote_error("sending to {}: {}", peer, errno_string(err));
  }
}

bool read_exact(int fd, void* data, size_t n, Deadline deadline, std::string_view peer) {
  auto* p = static_cast<uint8_t*>(data);
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::recv(fd, p + done, n - done, MSG_DONTWAIT);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {
      if (done == 0) return false;
      throw remote_error("{} closed the connection in the middle of a message ({} of {} bytes)",
                         peer, done, n);
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd pf{fd, POLLIN, 0};
      int rc = ::poll(&pf, 1, deadline.remaining_ms());
      if (rc < 0 && errno == EINTR) continue;
      DS_SYSCHECK(rc, "poll");
      if (rc == 0) throw timeout_error("reading from {}: timed out", peer);
      continue;
    }
    int err = errno;
    throw remote_error("reading from {}: {}", peer, errno_string(err));
  }
  return true;
}

uint64_t raise_open_file_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit want = rl;
    want.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &want) == 0) return want.rlim_cur;
  }
  return rl.rlim_cur;
}

}  // namespace ds::net
