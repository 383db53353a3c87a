// HashStore: one mutex and one condition variable over a std::map. Waiters sleep on the
// condition variable until any write, then re-check their keys.
#include "store/hash_store.h"

#include "common/check.h"

namespace ds::store {

void HashStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    map_[key] = value;
  }
  cv_.notify_all();
}

Bytes HashStore::get(const std::string& key, std::optional<Millis> timeout) {
  Deadline deadline = deadline_for(timeout);
  std::unique_lock<std::mutex> lock(mu_);
  auto present = [&] { return map_.count(key) > 0; };
  if (deadline.is_never()) {
    cv_.wait(lock, present);
  } else if (!cv_.wait_until(lock, deadline.at(), present)) {
    throw detail::wait_timeout(describe(), fmt::format("get of key '{}'", key), {key}, 1,
                               resolve_timeout(timeout));
  }
  return map_.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    result = detail::apply_add(describe(), key, it == map_.end() ? nullptr : &it->second, delta);
    map_[key] = to_bytes(std::to_string(result));
  }
  cv_.notify_all();
  return result;
}

Bytes HashStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = map_.find(key);
  const Bytes* current = it == map_.end() ? nullptr : &it->second;
  if (detail::compare_set_applies(current, expected)) {
    map_[key] = desired;
    lock.unlock();
    cv_.notify_all();
    return desired;
  }
  return current ? *current : expected;
}

void HashStore::wait(const std::vector<std::string>& keys, std::optional<Millis> timeout) {
  Deadline deadline = deadline_for(timeout);
  std::unique_lock<std::mutex> lock(mu_);
  auto all_present = [&] {
    for (const auto& k : keys) {
      if (!map_.count(k)) return false;
    }
    return true;
  };
  if (deadline.is_never()) {
    cv_.wait(lock, all_present);
    return;
  }
  if (cv_.wait_until(lock, deadline.at(), all_present)) return;
  std::vector<std::string> missing;
  for (const auto& k : keys) {
    if (!map_.count(k)) missing.push_back(k);
  }
  std::string what = keys.size() == 1 ? fmt::format("wait for key '{}'", keys[0])
                                      : fmt::format("wait for {} keys", keys.size());
  throw detail::wait_timeout(describe(), what, missing, keys.size(), resolve_timeout(timeout));
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& k : keys) {
    if (!map_.count(k)) return false;
  }
  return true;
}

bool HashStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return map_.erase(key) > 0;
}

int64_t HashStore::num_keys() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(map_.size());
}

}  // namespace ds::store
