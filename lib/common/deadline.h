// Deadlines for every blocking call: a point on the steady clock, or none (wait forever).
#pragma once

#include <chrono>
#include <limits>

namespace ds {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

class Deadline {
 public:
  static Deadline never() { return Deadline(Clock::time_point::max()); }
  static Deadline after(Millis d) { return Deadline(Clock::now() + d); }
  explicit Deadline(Clock::time_point at) : at_(at) {}

  bool is_never() const { return at_ == Clock::time_point::max(); }
  bool expired() const { return !is_never() && Clock::now() >= at_; }
  // Milliseconds left, clamped to [0, INT_MAX]; INT_MAX for never (suits poll()).
  int remaining_ms() const {
    if (is_never()) return std::numeric_limits<int>::max();
    auto left = std::chrono::duration_cast<Millis>(at_ - Clock::now()).count();
    if (left <= 0) return 0;
    if (left > std::numeric_limits<int>::max()) return std::numeric_limits<int>::max();
    return static_cast<int>(left);
  }
  Clock::time_point at() const { return at_; }

 private:
  Clock::time_point at_;
};

}  // namespace ds
