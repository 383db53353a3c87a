// GlooStoreAdapter: byte-vector conversions around the wrapped store.
#include "store/gloo_store_adapter.h"

namespace ds::store {

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_->set(key, Bytes(data.begin(), data.end()));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  Bytes v = store_->get(key);
  return std::vector<char>(v.begin(), v.end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) { store_->wait(keys); }

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  store_->wait(keys, timeout);
}

}  // namespace ds::store
