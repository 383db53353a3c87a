// This process's progress counter: bumped at the points where a training rank visibly moves on
// (each model layer's forward and backward, each chunk of memory touched at start-up, each wait
// iteration inside a collective, each file chunk written), read by the progress beacon
// (runtime/comm/beacon.h) that lets the peers tell a slow rank from a stopped or stuck one.
// A rank whose counter has not moved for the job's comm_timeout is hung.
//
// bump() is one relaxed atomic increment: cheap enough for any loop outside a kernel's body.
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>

namespace ds::progress {

inline std::atomic<uint64_t>& counter() {
  static std::atomic<uint64_t> c{0};
  return c;
}
inline void bump() { counter().fetch_add(1, std::memory_order_relaxed); }
inline uint64_t count() { return counter().load(std::memory_order_relaxed); }

}  // namespace ds::progress
