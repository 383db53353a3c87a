// The section walker's getters (config_reader.h). Each getter checks one value against what the
// key expects and words the error the same way for every section: "expected <what>, got <value>".
// The Hugging Face Trainer's "auto" placeholder, where a section has no rule of its own for it
// (config_top_level.cpp has the batch triad's and gradient_clipping's), is an error asking for
// the value on the command line: `"auto" needs a value: pass --set optimizer.params.lr=VALUE`.
// Integer ranges read "an integer >= lo" when the top is only the type's limit.
#include "config/config_reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "common/strings.h"

namespace ds::config::detail {

namespace {

bool is_auto(const Json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

// The dotted key --set takes for a JSON path: "$.optimizer.params.lr" -> "optimizer.params.lr".
std::string set_key(const std::string& path) { return path.size() > 2 ? path.substr(2) : path; }


std::string int_range_text(int64_t lo, int64_t hi) {
  if (hi >= kI32Max) return fmt::format("an integer >= {}", lo);
  return fmt::format("an integer {}-{}", lo, hi);
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The value of an integer key, or nullopt when it is not a whole number that fits int64.
std::optional<int64_t> whole_number(const Json& v) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(kI64Max)) {
      return std::nullopt;
    }
    return v.get<int64_t>();
  }
  if (v.is_number_float()) {
    // DeepSpeed configs write sizes as 5e8; accept floats that are whole numbers.
    double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) {
      return static_cast<int64_t>(d);
    }
  }
  return std::nullopt;
}

// The objects DeepSpeed reads with dict.get, so that it ignores keys it does not know: the top
// level and these sections (their own keys; not `optimizer.params` or `scheduler.params`, which
// DeepSpeed passes to a constructor as keyword arguments, where an unknown one is a TypeError).
// Every other DeepSpeed section is a pydantic model with extra="forbid" in DeepSpeed
// (DeepSpeedConfigModel: zero_optimization and its offload sections, fp16, bf16, the monitors,
// ...) and refuses an unknown key, as dstrain's own sections (model, data, training, ...) do.
const char* const kLenientObjects[] = {"$", "$.activation_checkpointing", "$.checkpoint", "$.pipeline",
                                       "$.optimizer", "$.scheduler", "$.flops_profiler"};

bool deepspeed_object(const std::string& path) {
  for (const char* p : kLenientObjects) {
    if (path == p) return true;
  }
  return false;
}

// A probable typo: a known key at most this many edits away keeps an unknown key an error even
// where DeepSpeed would ignore it ("optimizr", "zero_optimisation").
constexpr size_t kTypoEdits = 2;

}  // namespace

bool auto_needs_value(ReadContext& ctx, const std::string& path, const Json& v) {
  if (!is_auto(v)) return false;
  ctx.error(path, fmt::format("\"auto\" needs a value: pass --set {}=VALUE", set_key(path)));
  return true;
}

std::string show(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string resolve_path(const std::string& config_path, const std::string& p) {
  namespace fs = std::filesystem;
  if (p.empty() || config_path.empty()) return p;
  fs::path fp(p);
  if (fp.is_absolute()) return p;
  fs::path base = fs::path(config_path).parent_path();
  if (base.empty()) return fp.lexically_normal().string();
  return (base / fp).lexically_normal().string();
}

Json string_or_null(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }

std::string ReadContext::where(const std::string& path) const {
  // The last --set at or above `path` wins, as it was applied last.
  for (auto it = set_paths.rbegin(); it != set_paths.rend(); ++it) {
    const std::string& sp = it->first;
    const bool under = path.size() > sp.size() && path.compare(0, sp.size(), sp) == 0 &&
                       (path[sp.size()] == '.' || path[sp.size()] == '[');
    if (path == sp || under) return fmt::format("{}: {} (from --set {})", source, path, it->second);
  }
  std::string p = path;
  int line = doc.line_of(p);
  while (line == 0) {
    size_t cut = p.find_last_of(".[");
    if (cut == std::string::npos || cut <= 1) break;  // not "$": line 1 says nothing
    p.resize(cut);
    line = doc.line_of(p);
  }
  if (line > 0) return fmt::format("{}:{}: {}", source, line, path);
  return fmt::format("{}: {}", source, path);
}

void ReadContext::error(const std::string& path, const std::string& msg) {
  errors.push_back(where(path) + ": " + msg);
}

void ReadContext::warn(const std::string& path, const std::string& msg) {
  warnings.push_back(where(path) + ": " + msg);
}

bool Section::raw_is_null(const std::string& key) const {
  if (!obj_) return false;
  auto it = obj_->find(key);
  return it != obj_->end() && it->is_null();
}

const Json* Section::raw(const std::string& key) {
  known_.push_back(key);
  if (!obj_) return nullptr;
  auto it = obj_->find(key);
  return it == obj_->end() ? nullptr : &*it;
}

bool Section::get_int(const std::string& key, int64_t& out, int64_t lo, int64_t hi) {
  const Json* v = raw(key);
  if (!v) return false;
  if (auto_needs_value(ctx_, child(key), *v)) return false;
  std::optional<int64_t> n = whole_number(*v);
  if (!n) {
    ctx_.error(child(key), fmt::format("expected {}, got {}", int_range_text(lo, hi), show(*v)));
    return false;
  }
  if (*n < lo || *n > hi) {
    if (*n > hi && hi >= kI32Max) {
      ctx_.error(child(key), fmt::format("expected an integer {}-{}, got {}", lo, hi, show(*v)));
    } else {
      ctx_.error(child(key), fmt::format("expected {}, got {}", int_range_text(lo, hi), show(*v)));
    }
    return false;
  }
  out = *n;
  return true;
}

bool Section::get_int(const std::string& key, int& out, int64_t lo, int64_t hi) {
  int64_t v = 0;
  if (!get_int(key, v, lo, std::min(hi, kI32Max))) return false;
  out = static_cast<int>(v);
  return true;
}

bool Section::get_u64(const std::string& key, uint64_t& out) {
  const Json* v = raw(key);
  if (!v) return false;
  if (auto_needs_value(ctx_, child(key), *v)) return false;
  if (v->is_number_unsigned()) {
    out = v->get<uint64_t>();
    return true;
  }
  if (v->is_number_integer() && v->get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(v->get<int64_t>());
    return true;
  }
  ctx_.error(child(key), fmt::format("expected an integer 0-{}, got {}",
                                     std::numeric_limits<uint64_t>::max(), show(*v)));
  return false;
}

bool Section::get_number(const std::string& key, double& out, double lo, double hi,
                         bool lo_open) {
  const Json* v = raw(key);
  if (!v) return false;
  std::string expect;
  if (hi == kInf) {
    expect = fmt::format("a number {} {}", lo_open ? ">" : ">=", lo);
  } else {
    expect = fmt::format("a number from {} to {}", lo, hi);
  }
  if (auto_needs_value(ctx_, child(key), *v)) return false;
  if (!v->is_number()) {
    ctx_.error(child(key), fmt::format("expected {}, got {}", expect, show(*v)));
    return false;
  }
  double d = v->get<double>();
  if (!(lo_open ? d > lo : d >= lo) || d > hi) {
    ctx_.error(child(key), fmt::format("expected {}, got {}", expect, show(*v)));
    return false;
  }
  out = d;
  return true;
}

bool Section::get_bool(const std::string& key, bool& out) {
  const Json* v = raw(key);
  if (!v) return false;
  if (auto_needs_value(ctx_, child(key), *v)) return false;
  if (!v->is_boolean()) {
    ctx_.error(child(key), fmt::format("expected true or false, got {}", show(*v)));
    return false;
  }
  out = v->get<bool>();
  return true;
}

bool Section::get_string(const std::string& key, std::string& out, bool nullable) {
  const Json* v = raw(key);
  if (!v) return false;
  if (nullable && v->is_null()) {
    out.clear();
    return true;
  }
  if (!v->is_string()) {
    ctx_.error(child(key), fmt::format("expected a string{}, got {}", nullable ? " or null" : "",
                                       show(*v)));
    return false;
  }
  out = v->get<std::string>();
  return true;
}

bool Section::get_path(const std::string& key, std::string& out, const std::string& config_path,
                       bool nullable) {
  std::string s;
  if (!get_string(key, s, nullable)) return false;
  if (s.empty() && !(nullable && raw_is_null(key))) {
    ctx_.error(child(key), "expected a non-empty path, got \"\"");
    return false;
  }
  out = resolve_path(config_path, s);
  return true;
}

bool Section::get_choice(const std::string& key, std::string& out,
                         const std::vector<std::string>& choices, bool case_insensitive) {
  const Json* v = raw(key);
  if (!v) return false;
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : ", ") + Json(c).dump();
  if (!v->is_string()) {
    ctx_.error(child(key), fmt::format("expected one of {}, got {}", list, show(*v)));
    return false;
  }
  std::string s = v->get<std::string>();
  for (const auto& c : choices) {
    if (s == c || (case_insensitive && lower(s) == lower(c))) {
      out = c;
      return true;
    }
  }
  if (auto_needs_value(ctx_, child(key), *v)) return false;
  ctx_.error(child(key), fmt::format("expected one of {}, got {}", list, show(*v)));
  return false;
}

Section Section::section(const std::string& key, bool nullable) {
  const Json* v = raw(key);
  if (!v || (nullable && v->is_null())) return Section(ctx_, nullptr, child(key));
  if (!v->is_object()) {
    ctx_.error(child(key), fmt::format("expected an object{}, got {}", nullable ? " or null" : "",
                                       show(*v)));
    return Section(ctx_, nullptr, child(key));
  }
  return Section(ctx_, v, child(key));
}

void Section::ignored(const std::vector<std::string>& keys) {
  for (const auto& k : keys) {
    if (raw(k)) ctx_.warn(child(k), "DeepSpeed key accepted but not acted on by dstrain");
  }
}

void Section::finish() {
  if (!obj_) return;
  for (auto it = obj_->begin(); it != obj_->end(); ++it) {
    const std::string& k = it.key();
    bool known = false;
    for (const auto& kk : known_) known = known || kk == k;
    if (known) continue;
    auto near = closest_match(k, known_);
    const bool typo = near && edit_distance(k, *near) <= kTypoEdits;
    if (!ctx_.strict && !typo && deepspeed_object(path_)) {
      ctx_.warn(child(k), fmt::format("unknown key, ignored as DeepSpeed ignores it{} (an error "
                                      "with --strict)",
                                      near ? fmt::format(" (did you mean \"{}\"?)", *near) : ""));
      continue;
    }
    if (near) {
      ctx_.error(child(k), fmt::format("unknown key (did you mean \"{}\"?)", *near));
    } else if (known_.size() > 16) {
      ctx_.error(child(k), "unknown key (not a dstrain or DeepSpeed key here; see "
                           "docs/configuration.md)");
    } else {
      ctx_.error(child(k), fmt::format("unknown key (known keys here: {})", join_keys()));
    }
  }
}

std::string Section::join_keys() const {
  std::string out;
  std::vector<std::string> seen;
  for (const auto& k : known_) {
    if (std::find(seen.begin(), seen.end(), k) != seen.end()) continue;  // raw() twice
    seen.push_back(k);
    out += (out.empty() ? "" : ", ") + k;
  }
  return out;
}

}  // namespace ds::config::detail
