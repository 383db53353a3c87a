// HashStore: the in-memory Store, for N ranks running as threads of one process (fast tests,
// and the runtime's single-process mode). Same semantics as the TCP store, including blocking
// get()/wait() with timeouts (a condition variable, no polling).
//
// Deliberately not: shared between processes. Fork-based tests use TcpStoreServer.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "store/store.h"

namespace ds::store {

// Thread-safe; one mutex guards the map.
class HashStore : public Store {
 public:
  HashStore() = default;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::optional<Millis> timeout = {}) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, std::optional<Millis> timeout = {}) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  std::string describe() const override { return "in-memory store"; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Bytes> map_;
};

}  // namespace ds::store
