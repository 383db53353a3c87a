// One agent's byte channel, as the launcher's poll() loop drives it: an SSH channel (ssh.h) or a
// TCP connection the agent dialled back on (controller.h, for agents that srun or mpirun
// started). Both carry the agent protocol (agent_protocol.h); everything is non-blocking.
#pragma once

#include <string>

namespace ds::launch {

class AgentChannel {
 public:
  virtual ~AgentChannel() = default;
  virtual int socket() const = 0;        // for poll()
  virtual bool wants_write() const = 0;  // the transport waits to write (poll for POLLOUT)
  // Appends what is available on stream 0 (the agent's protocol output) or 1 (its stderr, where
  // the transport has one) to `out`. False at the end of that stream. Throws remote_error when
  // the connection breaks.
  virtual bool read(int stream, std::string* out) = 0;
  virtual size_t write(const std::string& data) = 0;  // bytes taken, possibly 0
  virtual void send_eof() = 0;                        // end of the agent's input
  virtual bool eof() const = 0;
  virtual int exit_status() = 0;                // the agent's status once closed; -1: unknown
  virtual const std::string& name() const = 0;  // for messages
};

}  // namespace ds::launch
