// The progress beacon and its readers (beacon.h).
#include "comm/beacon.h"

#include <fmt/format.h>

#include "common/progress.h"

namespace ds::rt::comm {

std::string beacon_key(int world_rank) { return fmt::format("beacon/{}", world_rank); }

ProgressBeacon::ProgressBeacon(std::shared_ptr<store::Store> store, int world_rank, Millis interval)
    : store_(std::move(store)), key_(beacon_key(world_rank)), interval_(interval) {
  thread_ = std::thread([this] { loop(); });
}

ProgressBeacon::~ProgressBeacon() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ProgressBeacon::loop() {
  uint64_t last = ~uint64_t{0};
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const uint64_t now = progress::count();
    if (now != last) {
      lock.unlock();
      try {
        store_->set(key_, store::to_bytes(std::to_string(now)));
        last = now;
      } catch (...) {
        // The store is gone or busy: the peers judge this rank by the plain timeout meanwhile.
      }
      lock.lock();
    }
    cv_.wait_for(lock, interval_, [this] { return stop_; });
  }
}

void PeerProgress::poll(const std::vector<int>& world_ranks) {
  const auto now = Clock::now();
  if (now < next_poll_ || !store_) return;
  next_poll_ = now + Millis(1000);
  std::vector<std::string> keys;
  for (int r : world_ranks) keys.push_back(beacon_key(r));
  try {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!store_->check({keys[i]})) continue;
      std::string v = store::to_string(store_->get(keys[i], Millis(2000)));
      auto it = seen_.find(world_ranks[i]);
      if (it == seen_.end()) {
        seen_[world_ranks[i]] = Seen{std::move(v), now};
      } else if (it->second.value != v) {
        it->second = Seen{std::move(v), now};
      }
    }
  } catch (...) {
    // A store that does not answer tells nothing about the peers.
  }
}

std::vector<int> PeerProgress::stale(const std::vector<int>& world_ranks, Millis quiet) const {
  std::vector<int> out;
  const auto now = Clock::now();
  for (int r : world_ranks) {
    auto it = seen_.find(r);
    if (it != seen_.end() && now - it->second.changed >= quiet) out.push_back(r);
  }
  return out;
}

bool PeerProgress::all_have_beacons(const std::vector<int>& world_ranks) const {
  for (int r : world_ranks) {
    if (seen_.find(r) == seen_.end()) return false;
  }
  return !world_ranks.empty();
}

}  // namespace ds::rt::comm
