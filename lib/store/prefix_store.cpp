// PrefixStore: prepends the prefix and forwards; timeouts resolve against this object's
// default so a caller's set_default_timeout() on the prefix store is honoured.
#include "store/prefix_store.h"

#include "common/error.h"

namespace ds::store {

PrefixStore::PrefixStore(std::string prefix, Store& inner)
    : prefix_(std::move(prefix)), inner_(&inner) {
  set_default_timeout(inner.default_timeout());
}

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
    : prefix_(std::move(prefix)), owned_(std::move(inner)), inner_(owned_.get()) {
  if (!inner_) throw invalid_argument("PrefixStore '{}': the wrapped store is null", prefix_);
  set_default_timeout(inner_->default_timeout());
}

std::vector<std::string> PrefixStore::full(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(prefix_ + k);
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& value) { inner_->set(full(key), value); }
Bytes PrefixStore::get(const std::string& key, std::optional<Millis> timeout) {
  return inner_->get(full(key), pass_timeout(timeout));
}
int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return inner_->add(full(key), delta);
}
Bytes PrefixStore::compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  return inner_->compare_set(full(key), expected, desired);
}
void PrefixStore::wait(const std::vector<std::string>& keys, std::optional<Millis> timeout) {
  inner_->wait(full(keys), pass_timeout(timeout));
}
bool PrefixStore::check(const std::vector<std::string>& keys) { return inner_->check(full(keys)); }
bool PrefixStore::delete_key(const std::string& key) { return inner_->delete_key(full(key)); }
int64_t PrefixStore::num_keys() { return inner_->num_keys(); }
std::string PrefixStore::describe() const { return inner_->describe(); }

}  // namespace ds::store
