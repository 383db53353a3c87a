// TcpStoreServer: the job's rendezvous store, hosted by node 0's agent for the job's life (so it
// outlives a crashed rank and serves restarts under a new key prefix). One thread polls the
// listening socket, every client and a shutdown pipe; blocking get/wait requests are parked as
// waiters and answered when their keys appear. The wire format is in tcp_store_protocol.h.
//
// Deliberately not: replicated, persistent, or a general database. A bad client (wrong token,
// garbage, oversized or half-sent frames) loses its own connection, never the server.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>

#include "common/deadline.h"
#include "common/socket.h"
#include "store/tcp_store_protocol.h"

namespace ds::store {

struct TcpStoreServerOptions {
  std::string host = "0.0.0.0";  // interface to bind; "::" for all IPv6
  int port = 0;                  // 0 = a free port picked by the kernel (read back with port())
  std::string token;             // job token clients must prove (empty = empty token, tests only)
  size_t max_frame_bytes = proto::kDefaultMaxFrameBytes;
  size_t max_key_bytes = proto::kDefaultMaxKeyBytes;
  size_t max_keys = proto::kDefaultMaxKeys;
  size_t max_clients = proto::kDefaultMaxClients;
  Millis handshake_timeout{30000};  // connect -> kAuth received
  Millis frame_timeout{60000};      // first byte of a frame -> its last byte
};

// Counters for tests and the agent's log (read while running; eventually consistent).
struct TcpStoreServerStats {
  uint64_t accepted = 0;           // connections accepted
  uint64_t authenticated = 0;      // handshakes passed
  uint64_t auth_failures = 0;      // wrong token or version
  uint64_t protocol_errors = 0;    // connections closed for malformed/oversized/late frames
  uint64_t rejected_clients = 0;   // refused at max_clients
  uint64_t requests = 0;           // requests served
  uint64_t open_connections = 0;   // now
};

// Thread safety: start()/stop() from one owning thread; port(), stats() from any thread.
// The destructor stops the server.
// Fork: the poll thread takes library locks (OpenSSL's HMAC, the allocator, spdlog) at any time,
// so a process hosting a running server may only fork in order to exec (spawn workers with
// fork+exec or posix_spawn; the child must do nothing but async-signal-safe calls before exec),
// as for any multi-threaded process. Tests that fork workers fork them before start().
class TcpStoreServer {
 public:
  explicit TcpStoreServer(TcpStoreServerOptions options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // Binds, raises RLIMIT_NOFILE's soft limit to the hard limit, and starts the poll thread.
  // Throws system_error (port in use, naming host:port) or invalid_usage when already started.
  void start();
  // Stops the poll thread and closes every connection (clients then see "connection closed").
  // Idempotent.
  void stop();

  bool running() const { return running_.load(); }
  int port() const { return port_; }            // the bound port (after start())
  const std::string& host() const { return options_.host; }
  TcpStoreServerStats stats() const;

  class Impl;  // the poll loop's state (tcp_store_server.cpp)

 private:
  TcpStoreServerOptions options_;
  std::unique_ptr<Impl> impl_;  // kept after stop() so stats() stays readable
  net::Fd wake_write_;          // stop() writes a byte here to end the poll loop
  std::thread thread_;
  std::atomic<bool> running_{false};
  int port_ = 0;
};

}  // namespace ds::store
