// Hung-rank detection: each training rank publishes its progress counter (common/progress.h)
// under "beacon/<world rank>" in the job's store, once a second when it moved, from a thread of
// its own (ProgressBeacon). A rank waiting in a collective reads the beacons of the ranks it waits
// for (PeerProgress) and fails, naming the rank and its host, as soon as one of them has not
// moved for the Comm's timeout: a stopped process (SIGSTOP), a rank stuck in a kernel, or one on
// a node that vanished without closing its sockets. A rank whose beacon moves is slow, not hung:
// the wait goes on (up to kMaxSlowFactor x the timeout, the backstop for a rank that lives but
// never arrives, e.g. mismatched collectives).
//
// Without a beacon (a Comm used outside a training run, the tests' thread ranks) a peer is
// judged by the plain timeout, as before.
// Thread safety: ProgressBeacon runs its own thread; PeerProgress is used by one waiter at a time
// (its Comm's), and never blocks long (store reads of a few keys, at most once a second).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "store/store.h"

namespace ds::rt::comm {

inline constexpr int kMaxSlowFactor = 10;
std::string beacon_key(int world_rank);  // "beacon/<world rank>"

class ProgressBeacon {
 public:
  // Publishes under `store` (the job's world key space) until destroyed. `interval`: how often.
  ProgressBeacon(std::shared_ptr<store::Store> store, int world_rank, Millis interval = Millis(1000));
  ~ProgressBeacon();
  ProgressBeacon(const ProgressBeacon&) = delete;
  ProgressBeacon& operator=(const ProgressBeacon&) = delete;

 private:
  void loop();
  std::shared_ptr<store::Store> store_;
  std::string key_;
  Millis interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

class PeerProgress {
 public:
  using Clock = std::chrono::steady_clock;
  explicit PeerProgress(std::shared_ptr<store::Store> store) : store_(std::move(store)) {}

  // Reads the beacons of `world_ranks` (at most once a second) and remembers when each last moved.
  void poll(const std::vector<int>& world_ranks);
  // Of `world_ranks`, those with a beacon that has not moved for `quiet` (as of the last poll).
  std::vector<int> stale(const std::vector<int>& world_ranks, Millis quiet) const;
  // Whether every one of `world_ranks` has a beacon (else the plain timeout applies).
  bool all_have_beacons(const std::vector<int>& world_ranks) const;

 private:
  struct Seen {
    std::string value;
    Clock::time_point changed;
  };
  std::shared_ptr<store::Store> store_;
  std::map<int, Seen> seen_;
  Clock::time_point next_poll_{};
};

}  // namespace ds::rt::comm
