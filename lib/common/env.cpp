#include "common/env.h"

#include <cstdlib>
#include <cstring>

#include "common/check.h"
#include "common/error.h"
#include "common/strings.h"

namespace ds::env {

namespace {
#define DS_ENV_ROW(name, def, desc) KnobInfo{name, def, desc},
const KnobInfo kKnobs[] = {DS_ENV_KNOBS(DS_ENV_ROW)};
#undef DS_ENV_ROW

const KnobInfo& find(const char* name) {
  for (const auto& k : kKnobs) {
    if (std::strcmp(k.name, name) == 0) return k;
  }
  DS_CHECK(false, "environment variable {} is not in DS_ENV_KNOBS", name);
  return kKnobs[0];
}
}  // namespace

std::optional<std::string> get(const char* name) {
  (void)find(name);
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

std::string get_or_default(const char* name) {
  const auto& k = find(name);
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return k.default_value;
  return v;
}

int64_t get_int(const char* name) {
  std::string v = get_or_default(name);
  auto n = parse_int(trim(v));
  if (!n) throw invalid_argument("environment variable {}='{}' is not an integer", name, v);
  return *n;
}

const KnobInfo* knobs(size_t* count) {
  *count = sizeof(kKnobs) / sizeof(kKnobs[0]);
  return kKnobs;
}

}  // namespace ds::env
