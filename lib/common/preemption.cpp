// The preemption flag: one sig_atomic_t written by the handler, read by the training loop.
#include "common/preemption.h"

#include <string.h>

#include <atomic>
#include <cctype>

#include "common/check.h"
#include "common/error.h"
#include "common/strings.h"

namespace ds::preempt {

namespace {

volatile sig_atomic_t g_signal = 0;
std::atomic<bool> g_guard_alive{false};

extern "C" void on_preempt_signal(int sig) {
  g_signal = sig;
}

}  // namespace

Guard::Guard(const std::vector<int>& extra) {
  DS_CHECK(!g_guard_alive.exchange(true), "only one preemption guard at a time");
  signals_.push_back(SIGTERM);
  for (int s : extra) {
    if (s != 0 && s != SIGTERM) signals_.push_back(s);
  }
  previous_.resize(signals_.size());
  for (size_t i = 0; i < signals_.size(); ++i) {
    struct sigaction sa {};
    sa.sa_handler = on_preempt_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(signals_[i], &sa, &previous_[i]);
  }
}

Guard::~Guard() {
  for (size_t i = 0; i < signals_.size(); ++i) {
    ::sigaction(signals_[i], &previous_[i], nullptr);
  }
  g_guard_alive = false;
}

bool requested() {
  return g_signal != 0;
}
int signal_received() {
  return g_signal;
}
void reset() {
  g_signal = 0;
}

int parse_signal(const std::string& text, const std::string& origin) {
  std::string t(trim(text));
  if (auto n = parse_int(t)) {
    if (*n > 0 && *n < NSIG) return static_cast<int>(*n);
  } else {
    std::string name;
    for (char c : t) name.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
    if (starts_with(name, "SIG")) name = name.substr(3);
    for (int s = 1; s < NSIG; ++s) {
      const char* abbrev = sigabbrev_np(s);
      if (abbrev != nullptr && name == abbrev) return s;
    }
  }
  throw Error(ErrorKind::kInvalidArgument, fmt::format("{}: '{}' is not a signal", origin, text),
              "name one as SIGUSR1, USR1 or its number (10)");
}

}  // namespace ds::preempt
