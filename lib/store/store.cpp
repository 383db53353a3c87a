// Shared pieces of every Store: byte/string conversion, deadlines, the barrier, and the wording
// of timeout and add() errors (so the in-memory and TCP stores fail alike).
#include "store/store.h"

#include "common/socket.h"
#include "common/strings.h"

namespace ds::store {

Bytes to_bytes(std::string_view s) { return Bytes(s.begin(), s.end()); }
std::string to_string(const Bytes& b) { return std::string(b.begin(), b.end()); }

Deadline Store::deadline_for(std::optional<Millis> t) const {
  Millis m = resolve_timeout(t);
  // kNoTimeout, and anything beyond a century (which would overflow the clock), waits forever.
  if (m >= Millis(int64_t{100} * 365 * 24 * 3600 * 1000)) return Deadline::never();
  if (m.count() < 0) m = Millis(0);
  return Deadline::after(m);
}

void barrier(Store& store, const std::string& name, int world_size,
             std::optional<Millis> timeout) {
  if (world_size <= 0) {
    throw invalid_argument("barrier '{}' on {}: world size must be positive, got {}", name,
                           store.describe(), world_size);
  }
  const std::string count_key = name + "/count";
  const std::string done_key = name + "/done";
  int64_t joined = store.add(count_key, 1);
  if (joined > world_size) {
    throw Error(ErrorKind::kInvalidUsage,
                fmt::format("barrier '{}' on {}: {} workers joined a barrier for {}", name,
                            store.describe(), joined, world_size),
                "each barrier name may be used once per store; use a fresh name (e.g. with a "
                "step number) or a PrefixStore per restart generation");
  }
  if (joined == world_size) store.set(done_key, to_bytes("1"));
  Millis t = timeout.value_or(store.default_timeout());
  try {
    store.wait({done_key}, t);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kTimeout) throw;
    std::string count = "?";
    try {
      count = std::to_string(store.add(count_key, 0));
    } catch (const Error&) {
      // keep "?": the store itself may be what failed
    }
    throw Error(ErrorKind::kTimeout,
                fmt::format("barrier '{}' on {}: {}/{} workers joined after {}", name,
                            store.describe(), count, world_size, net::format_seconds(t)),
                "the missing workers may have crashed, hung or never started; check their "
                "output above");
  }
}

namespace detail {

std::string quote_keys(const std::vector<std::string>& keys, size_t max_shown) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < max_shown; ++i) {
    if (i) out += ", ";
    out += "'" + keys[i] + "'";
  }
  if (keys.size() > max_shown) out += fmt::format(" and {} more", keys.size() - max_shown);
  return out;
}

Error wait_timeout(const std::string& store, const std::string& what,
                   const std::vector<std::string>& missing, size_t total, Millis waited,
                   const std::string& who) {
  std::string msg = fmt::format("{}: {} timed out after {}{}", store, what,
                                net::format_seconds(waited), who);
  if (total == 1 && missing.size() == 1) {
    msg += fmt::format("; key '{}' was never set", missing[0]);
  } else if (!missing.empty()) {
    msg += fmt::format("; missing keys: {} ({} of {})", quote_keys(missing), missing.size(), total);
  }
  return Error(ErrorKind::kTimeout, msg,
               "the rank that sets these keys may have crashed or not started; raise the timeout "
               "if it is only slow");
}

int64_t apply_add(const std::string& store, const std::string& key, const Bytes* current,
                  int64_t delta) {
  int64_t value = 0;
  if (current) {
    auto parsed = parse_int(std::string_view(reinterpret_cast<const char*>(current->data()),
                                             current->size()));
    if (!parsed) {
      throw invalid_argument("{}add on key '{}': its value ({} bytes) is not a decimal integer",
                             store.empty() ? "" : store + ": ", key, current->size());
    }
    value = *parsed;
  }
  int64_t result = 0;
  if (__builtin_add_overflow(value, delta, &result)) {
    throw invalid_argument("{}add of {} to key '{}' (value {}) overflows int64",
                           store.empty() ? "" : store + ": ", delta, key, value);
  }
  return result;
}

bool compare_set_applies(const Bytes* current, const Bytes& expected) {
  if (!current) return expected.empty();
  return *current == expected;
}

}  // namespace detail
}  // namespace ds::store
