// PrefixStore: scopes every key of another store under a prefix, so a restarted job
// ("gen3/") or a process group ("group/tp0/") gets a fresh key space on the same server.
//
// Deliberately not: isolation. num_keys() counts the whole underlying store, and nothing stops
// another prefix from reading these keys.
#pragma once

#include <memory>

#include "store/store.h"

namespace ds::store {

// Thread safety and timeouts as the wrapped store. The wrapped store must outlive this object
// (reference constructor) or is shared (shared_ptr constructor). The prefix is used verbatim:
// pass "gen3/" with its separator. Nested PrefixStores compose ("a/" + "b/" -> "a/b/key").
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, Store& inner);
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::optional<Millis> timeout = {}) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, std::optional<Millis> timeout = {}) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  std::string describe() const override;

  const std::string& prefix() const { return prefix_; }

 private:
  std::string full(const std::string& key) const { return prefix_ + key; }
  std::vector<std::string> full(const std::vector<std::string>& keys) const;
  // An explicit timeout of ours, else our own default (not the inner store's).
  std::optional<Millis> pass_timeout(std::optional<Millis> t) const { return resolve_timeout(t); }

  std::string prefix_;
  std::shared_ptr<Store> owned_;
  Store* inner_;
};

}  // namespace ds::store
