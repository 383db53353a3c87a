// Small TCP helpers for the control plane (the rendezvous store, the launcher, the agent):
// an owning file descriptor, listening on host:port (port 0 picks a free port), connecting with a
// deadline and jittered exponential backoff, reading and writing exact byte counts with a
// deadline, and host:port parsing.
//
// Deliberately not: an event loop, TLS, or a general networking library. Every blocking call
// takes a Deadline; every error names the peer ("store at 10.0.0.1:29400") and the OS reason.
// Sockets are IPv4 or IPv6, whatever getaddrinfo resolves first that works.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/deadline.h"

namespace ds::net {

// Owns one file descriptor; closes it on destruction. Move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);  // closes the current descriptor (EINTR ignored)

 private:
  int fd_ = -1;
};

// "host:port" or "[v6addr]:port". Throws invalid_argument naming `what` ("DSTRAIN_STORE") and
// the text when the port is missing or outside 0..65535.
struct HostPort {
  std::string host;
  int port = 0;
  std::string str() const;  // "host:port", brackets around IPv6 literals
};
HostPort parse_host_port(std::string_view text, std::string_view what);

// Binds and listens on host:port (host "" or "0.0.0.0" = all IPv4 interfaces, "::" = all IPv6).
// Port 0 lets the kernel pick a free port: read it back with local_port(). SO_REUSEADDR is set,
// the socket is close-on-exec and non-blocking. A port in use throws a system error naming
// host:port ("address already in use") with a hint.
Fd listen_tcp(const std::string& host, int port, int backlog = 4096);

// The local port a socket is bound to.
int local_port(int fd);

// True when host:port can be bound right now (nothing listening there). Racy by nature: only
// for early, friendly errors ("--master-port 29500 is in use on node0").
bool port_is_free(const std::string& host, int port);

struct ConnectOptions {
  Millis initial_backoff{20};  // first retry after ~this (jittered +-50 %)
  Millis max_backoff{1000};    // backoff doubles up to this
  std::string peer_name;       // used in messages, e.g. "store"; defaults to "host:port"
};

// Connects to host:port, retrying refused/unreachable/timed-out attempts with jittered
// exponential backoff until `deadline` (so N workers started together do not hammer a server
// that is still starting). Returns a connected, non-blocking, close-on-exec socket with
// TCP_NODELAY. Throws timeout_error when the deadline passes ("could not connect to store at
// h:p within 30.0 s after 12 attempts: Connection refused") with a hint, or invalid_argument
// when the host does not resolve.
Fd connect_tcp(const std::string& host, int port, Deadline deadline,
               const ConnectOptions& options = {});

void set_nonblocking(int fd, bool on = true);
void set_cloexec(int fd);
void set_nodelay(int fd);

// Writes all `n` bytes (poll + send with MSG_NOSIGNAL, so a closed peer is an error, never
// SIGPIPE). Works on blocking and non-blocking sockets. Throws timeout_error when the deadline
// passes and remote_error when the peer is gone; messages name `peer`.
void write_exact(int fd, const void* data, size_t n, Deadline deadline, std::string_view peer);

// Reads exactly `n` bytes. Returns false when the peer closed cleanly before the first byte
// (an orderly EOF at a message boundary); works on blocking and non-blocking sockets (MSG_DONTWAIT
// + poll); throws remote_error on EOF in the middle, on a reset,
// and timeout_error when the deadline passes. Messages name `peer`.
bool read_exact(int fd, void* data, size_t n, Deadline deadline, std::string_view peer);

// Waits until `fd` is readable (or has hung up). False when the deadline passed first.
bool wait_readable(int fd, Deadline deadline);

// Raises the soft RLIMIT_NOFILE to the hard limit (servers with thousands of connections).
// Returns the new soft limit. Never throws; on failure returns the current soft limit.
uint64_t raise_open_file_limit();

// Seconds with one decimal, for messages: "30.0 s".
std::string format_seconds(Millis d);

}  // namespace ds::net
