#include "launch/signals.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>

#include "common/check.h"
#include "common/error.h"

namespace ds::launch {

namespace {

int g_write_fd = -1;
int g_read_fd = -1;
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};

extern "C" void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  if (g_write_fd >= 0) (void)!::write(g_write_fd, &b, 1);
  errno = saved;
}

}  // namespace

SignalPipe::SignalPipe(int extra_signal) : signals_(std::begin(kSignals), std::end(kSignals)) {
  DS_CHECK(g_write_fd < 0, "only one SignalPipe per process");
  int fds[2];
  DS_SYSCHECK(::pipe2(fds, O_CLOEXEC | O_NONBLOCK), "pipe for signals");
  g_read_fd = fds[0];
  g_write_fd = fds[1];
  if (extra_signal != 0 && std::find(signals_.begin(), signals_.end(), extra_signal) == signals_.end()) {
    signals_.push_back(extra_signal);
  }
  if (extra_signal != kDumpSignal) {
    signals_.push_back(kDumpSignal);
    dump_caught_ = true;
  }
  previous_.resize(signals_.size());
  for (size_t i = 0; i < signals_.size(); ++i) {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | (signals_[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
    ::sigaction(signals_[i], &sa, &previous_[i]);
  }
}

SignalPipe::~SignalPipe() {
  for (size_t i = 0; i < signals_.size(); ++i) ::sigaction(signals_[i], &previous_[i], nullptr);
  ::close(g_write_fd);
  ::close(g_read_fd);
  g_write_fd = g_read_fd = -1;
}

int SignalPipe::fd() const { return g_read_fd; }

std::vector<int> SignalPipe::drain() {
  std::vector<int> out;
  unsigned char buf[64];
  for (;;) {
    ssize_t n = ::read(g_read_fd, buf, sizeof buf);
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      int s = buf[i];
      if (s == SIGCHLD && std::find(out.begin(), out.end(), SIGCHLD) != out.end()) continue;
      out.push_back(s);
    }
  }
  return out;
}

}  // namespace ds::launch
