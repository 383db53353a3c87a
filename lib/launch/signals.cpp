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
struct sigaction g_previous[sizeof kSignals / sizeof kSignals[0]];

extern "C" void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  if (g_write_fd >= 0) (void)!::write(g_write_fd, &b, 1);
  errno = saved;
}

}  // namespace

SignalPipe::SignalPipe() {
  DS_CHECK(g_write_fd < 0, "only one SignalPipe per process");
  int fds[2];
  DS_SYSCHECK(::pipe2(fds, O_CLOEXEC | O_NONBLOCK), "pipe for signals");
  g_read_fd = fds[0];
  g_write_fd = fds[1];
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | (kSignals[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
    ::sigaction(kSignals[i], &sa, &g_previous[i]);
  }
}

SignalPipe::~SignalPipe() {
  for (size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &g_previous[i], nullptr);
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
