// Control connections for agents that a cluster's launcher started (srun for --launcher slurm,
// mpirun for openmpi/mpich): each agent dials back to `dstrain launch`, proves the job token and
// then speaks the agent protocol (agent_protocol.h) over that TCP connection, exactly as an SSH
// agent does over its channel. srun's and mpirun's own stdin/stdout are then only a process
// starter's: their stdin handling differs (Hydra feeds rank 0 alone), their output is merged.
//
// Handshake, right after connect (binary, fixed sizes):
//   launcher -> agent  32 random bytes (nonce)
//   agent -> launcher  u32 node rank (little-endian), then
//                      HMAC-SHA256(key = job token, kControlContext || nonce), 32 bytes
//   launcher -> agent  1 byte: 1 accepted, 0 refused (then the launcher closes)
// The token never crosses the wire (the agent has it from DSTRAIN_JOB_TOKEN, which srun and
// mpirun pass on); the env values of .dstrain_env and --env cross it only after the handshake.
// A refused or half-done handshake drops that connection only.
//
// Deliberately not: encrypted. Like the store, traffic is authenticated, not secret.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "common/deadline.h"
#include "common/socket.h"
#include "launch/agent_channel.h"

namespace ds::launch {

inline constexpr std::string_view kControlContext = "dstrain-control-auth-v1:";
inline constexpr Millis kControlHandshakeTimeout{5000};

// An agent's control connection, non-blocking.
class SocketChannel : public AgentChannel {
 public:
  SocketChannel(net::Fd fd, std::string name) : fd_(std::move(fd)), name_(std::move(name)) {}
  int socket() const override { return fd_.get(); }
  bool wants_write() const override { return false; }
  bool read(int stream, std::string* out) override;  // stream 1 (stderr) is always empty
  size_t write(const std::string& data) override;
  void send_eof() override;
  bool eof() const override { return eof_; }
  int exit_status() override { return -1; }
  const std::string& name() const override { return name_; }

 private:
  net::Fd fd_;
  std::string name_;
  bool eof_ = false;
};

class ControlServer {
 public:
  // Listens on every interface, on `port` (0: a free one). Throws system_error naming the port.
  explicit ControlServer(int port = 0);
  int port() const { return port_; }
  int fd() const { return listener_.get(); }  // readable when an agent connects

  // Accepts one waiting connection and runs its handshake (at most kControlHandshakeTimeout).
  // Returns the node rank it proved and its channel; nullopt (with a warning logged) for a
  // wrong token, a rank outside 0..num_nodes-1, or a connection that broke off.
  std::optional<std::pair<int, std::unique_ptr<AgentChannel>>> accept_one(const std::string& token,
                                                                          int num_nodes);

 private:
  net::Fd listener_;
  int port_ = 0;
};

// The agent's side: connects to `controller` (retrying until `deadline`), proves `token` and
// announces `node_rank`. Returns the connected, non-blocking socket. Throws timeout_error (no
// launcher there in time) or remote_error (refused: wrong token or rank), naming the address.
net::Fd dial_controller(const net::HostPort& controller, const std::string& token, int node_rank,
                        Deadline deadline);

}  // namespace ds::launch
