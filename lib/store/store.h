// The rendezvous store interface (after Gloo's rendezvous::Store and PyTorch's c10d Store): a
// small key-value map shared by every rank of a job. Keys are strings, values are bytes. The
// NCCL unique id, Gloo's pairwise address exchange and the runtime's barriers go through it.
//
// Implementations: HashStore (in memory, for N ranks as threads in one process), PrefixStore
// (scopes every key under a prefix: "gen3/", "group/tp0/"), TcpStoreClient (the job's store,
// served by TcpStoreServer in node 0's agent). GlooStoreAdapter makes any of them a
// gloo::rendezvous::Store.
//
// Deliberately not: a database. No persistence, no watches, no listing of keys; values are
// meant to be small (addresses, ids, counters).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/deadline.h"
#include "common/error.h"

namespace ds::store {

using Bytes = std::vector<uint8_t>;

// Wait forever (use with care: prefer a deadline).
inline constexpr Millis kNoTimeout = Millis::max();
// The default timeout of a new store object: 300 s, as c10d's.
inline constexpr Millis kDefaultStoreTimeout{300000};

Bytes to_bytes(std::string_view s);
std::string to_string(const Bytes& b);

// Contract shared by every implementation:
// - Thread safety: every method may be called from any thread. A TcpStoreClient serializes its
//   calls over its one connection (a blocked get() holds up that client's other calls; use one
//   client per thread for independent blocking waits).
// - Timeouts: `timeout` nullopt means default_timeout(); kNoTimeout waits forever. When the
//   timeout passes, a ds::Error of kind kTimeout is thrown naming the store and the missing keys.
// - Failures: a lost connection or a refused request is a ds::Error (kRemote / kSystem); the
//   store object is then unusable (TcpStoreClient) and the caller should give up.
class Store {
 public:
  virtual ~Store() = default;

  // Creates or overwrites `key`. Wakes every get()/wait() blocked on it.
  virtual void set(const std::string& key, const Bytes& value) = 0;

  // Returns the value of `key`, blocking until some rank sets it or the timeout passes.
  virtual Bytes get(const std::string& key, std::optional<Millis> timeout = {}) = 0;

  // Adds `delta` to the integer stored at `key` (created as 0 when absent) and returns the new
  // value. Counters are stored as decimal ASCII text ("42"), so get() reads them back as text.
  // A key holding something else is an invalid_argument error naming the key.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // Atomic compare-and-set. If `key` exists and its value equals `expected`, or `key` does not
  // exist and `expected` is empty, sets it to `desired` and returns `desired`. Otherwise leaves it
  // alone and returns the current value (or `expected` when the key does not exist).
  virtual Bytes compare_set(const std::string& key, const Bytes& expected,
                            const Bytes& desired) = 0;

  // Blocks until every key in `keys` exists or the timeout passes (then: which are missing).
  virtual void wait(const std::vector<std::string>& keys,
                    std::optional<Millis> timeout = {}) = 0;

  // True when every key in `keys` exists now. Never blocks on the keys.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  // Removes `key`; true when it existed.
  virtual bool delete_key(const std::string& key) = 0;

  // Number of keys in the whole store (a PrefixStore counts everything, as c10d does).
  virtual int64_t num_keys() = 0;

  // A short description for error messages: "store at 10.0.0.1:29400", "in-memory store".
  virtual std::string describe() const = 0;

  Millis default_timeout() const { return Millis(default_timeout_ms_.load()); }
  void set_default_timeout(Millis t) { default_timeout_ms_.store(t.count()); }

 protected:
  Millis resolve_timeout(std::optional<Millis> t) const { return t ? *t : default_timeout(); }
  Deadline deadline_for(std::optional<Millis> t) const;

 private:
  std::atomic<int64_t> default_timeout_ms_{kDefaultStoreTimeout.count()};
};

// A one-shot barrier for `world_size` participants named `name`: each adds 1 to "<name>/count";
// the last to arrive sets "<name>/done"; everybody waits for "<name>/done". Each barrier name may
// be used once per store (use names like "step/12" or a PrefixStore per generation). On timeout,
// throws kTimeout: "barrier 'init' on store at h:p: 3/4 workers joined after 30.0 s".
void barrier(Store& store, const std::string& name, int world_size,
             std::optional<Millis> timeout = {});

namespace detail {
// Shared by every implementation, so all stores word their errors alike.
// "<store>: <what> timed out after 30.0 s<who>; missing keys: 'a', 'b' (2 of 3)"
Error wait_timeout(const std::string& store, const std::string& what,
                   const std::vector<std::string>& missing, size_t total, Millis waited,
                   const std::string& who = {});
// add() on a current value (nullopt = absent): the new value, or invalid_argument naming the key.
int64_t apply_add(const std::string& store, const std::string& key, const Bytes* current,
                  int64_t delta);
// compare_set's rule; `current` nullptr = absent. Returns true when `desired` must be stored.
bool compare_set_applies(const Bytes* current, const Bytes& expected);
// "'a', 'b', 'c' and 7 more"
std::string quote_keys(const std::vector<std::string>& keys, size_t max_shown = 8);
}  // namespace detail

}  // namespace ds::store
