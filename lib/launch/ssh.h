// SSH with libssh2: connect with a timeout, check the host key against known_hosts, authenticate
// with a public key, run one command on one channel, then move its bytes without blocking so
// the launcher multiplexes every node in one poll() loop.
//
// Host keys: an unknown host is an error unless accept_new_host_keys (then its key is appended
// to known_hosts); a host whose key changed is always an error. Keys: with explicit `keys`, only
// those; otherwise ssh-agent (when SSH_AUTH_SOCK is set), then ~/.ssh/id_ed25519, id_ecdsa,
// id_rsa. Passphrase-protected key files are not supported (use ssh-agent for those).
//
// Thread safety: one SshConnection per thread at a time; connect() calls for different hosts
// may run in parallel threads (libssh2_init is done once, thread-safely).
// Deliberately not: an SSH client. No PTY, no port forwarding, no password authentication.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "launch/agent_channel.h"

namespace ds::launch {

struct SshOptions {
  std::string user;                 // empty: the local user name
  int port = 22;
  std::vector<std::string> keys;    // private key files; empty: agent, then ~/.ssh defaults
  std::string known_hosts;          // empty: ~/.ssh/known_hosts
  bool accept_new_host_keys = false;
  Millis connect_timeout{10000};    // TCP connect + handshake + authentication + exec
};

// "'abc'", with embedded single quotes handled: for building remote shell command lines.
std::string shell_quote(const std::string& word);
std::string shell_join(const std::vector<std::string>& words);

class SshConnection : public AgentChannel {
 public:
  // Connects to host, verifies the host key, authenticates, opens a session channel and runs
  // `command` through the remote user's shell. Everything within options.connect_timeout.
  // Throws ds::Error naming user@host:port: timeout_error (no answer), system_error (refused,
  // unreachable), remote_error (host key unknown or changed, authentication failed) with hints.
  static std::unique_ptr<SshConnection> open(const std::string& host, const SshOptions& options,
                                             const std::string& command);
  ~SshConnection() override;
  SshConnection(const SshConnection&) = delete;
  SshConnection& operator=(const SshConnection&) = delete;

  // After open(): everything below is non-blocking.
  int socket() const override { return sock_; }
  // Whether libssh2 waits to read / write the socket (for poll events).
  bool wants_read() const;
  bool wants_write() const override;

  // Reads what is available from stdout (stream 0) or stderr (stream 1) into `out` (appended).
  // Returns false at end of that stream's data (the remote closed the channel). Throws
  // remote_error when the connection breaks.
  bool read(int stream, std::string* out) override;
  // Writes as much of `data` as the window allows; returns the number of bytes taken.
  size_t write(const std::string& data) override;
  // Sends EOF on the command's stdin (ignored if it cannot be sent now).
  void send_eof() override;
  bool eof() const override;
  // The remote command's exit status once the channel closed: code, or 128+signal; -1 unknown.
  int exit_status() override;

  const std::string& name() const override { return name_; }  // "user@host:port"

 private:
  SshConnection() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int sock_ = -1;
  std::string name_;
};

}  // namespace ds::launch
