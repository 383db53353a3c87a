// The self-pipe trick: SIGINT, SIGTERM, SIGHUP, SIGCHLD and an optional preemption signal
// (--preempt-signal, e.g. SIGUSR1) become bytes on a pipe that the launcher's and the agent's
// poll() loops watch next to their pipes and sockets.
//
// The flight recorder's dump signal (SIGUSR2, runtime/comm/flight_recorder.h) is caught too,
// unless it is the preemption signal: `kill -USR2` of the launcher or an agent asks the ranks to
// dump their records (is_dump), it stops nothing.
//
// One per process (the handlers are process-wide). Deliberately not: signalfd (it needs the
// signals blocked in every thread, including threads that libraries start).
#pragma once

#include <signal.h>

#include <vector>

namespace ds::launch {

class SignalPipe {
 public:
  // Installs the handlers (SA_RESTART), for `extra_signal` too when it is not 0. Restores the
  // previous handlers on destruction.
  explicit SignalPipe(int extra_signal = 0);
  ~SignalPipe();
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  int fd() const;  // readable when a signal arrived
  // The signals that arrived since the last call, in order (SIGCHLD at most once per call).
  std::vector<int> drain();
  // True for the dump signal (kDumpSignal, when it is not the preemption signal).
  bool is_dump(int sig) const { return sig == kDumpSignal && dump_caught_; }
  static constexpr int kDumpSignal = SIGUSR2;

 private:
  std::vector<int> signals_;
  std::vector<struct sigaction> previous_;
  bool dump_caught_ = false;
};

}  // namespace ds::launch
