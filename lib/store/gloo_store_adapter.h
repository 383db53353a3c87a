// GlooStoreAdapter: makes any ds::store::Store a gloo::rendezvous::Store, so
// gloo::rendezvous::Context::connectFullMesh exchanges its pair addresses through the job's
// store (usually a PrefixStore per process group over the TcpStoreClient).
//
// Deliberately not: a Gloo transport. Only the rendezvous goes through the store.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "store/store.h"

namespace ds::store {

// Gloo's interface (Debian's libgloo 0.0~git20220518) has set, get (blocking, no timeout
// argument) and wait(keys[, timeout]). get() and wait(keys) use the wrapped store's default
// timeout. Errors propagate as ds::Error (Gloo's rendezvous lets exceptions through).
// Thread safety: as the wrapped store.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  explicit GlooStoreAdapter(ds::store::Store& store) : store_(&store) {}
  explicit GlooStoreAdapter(std::shared_ptr<ds::store::Store> store)
      : owned_(std::move(store)), store_(owned_.get()) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<ds::store::Store> owned_;
  ds::store::Store* store_;
};

}  // namespace ds::store
