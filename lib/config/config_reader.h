// The walker every config section's reader uses, internal to lib/config (callers outside it use
// job_config.h). A `Section` is one JSON object being read: each typed getter declares its key
// known, checks type and range and records an error with the key's JSON path and line in the
// `ReadContext`; `ignored()` declares DeepSpeed keys accepted with a warning; `finish()` turns
// every key not declared into an "unknown key" warning or error (see finish()).
//
// Not a schema language: each section's reader (config_sections.h) is plain code calling these
// getters in the order its keys are declared, which is also the order of its messages and of the
// keys that "unknown key" lists. Thread-compatible; a ReadContext belongs to one parse.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/json_reader.h"

namespace ds::config::detail {

using Json = nlohmann::ordered_json;

constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

// A value for a message: its JSON text, cut to 60 characters.
std::string show(const Json& v);

// `p` against the directory of the config at `config_path`, lexically (no filesystem access);
// absolute paths, "" and a config without a path leave `p` as written.
std::string resolve_path(const std::string& config_path, const std::string& p);

// The file format's null for an unset string ("" in the structs).
Json string_or_null(const std::string& s);

// Where one parse collects its messages, each "file:line: $.json.path: what".
struct ReadContext {
  const JsonDocument& doc;
  std::string source;  // the file name in messages ("<config>" without one)
  std::vector<std::string> errors;
  std::vector<std::string> warnings;
  // --strict: an unknown key is an error in every section, not only in dstrain's own.
  bool strict = false;
  // The JSON paths --set gave, each with its flag ("optimizer.params.lr=3e-4"): a message about
  // one of them, or a value under it, names the flag instead of a line of the file.
  std::vector<std::pair<std::string, std::string>> set_paths;

  // "file:line: $.path", with the line of the path or, for a key the file does not have (a rule
  // about a resolved default), of its nearest enclosing object.
  std::string where(const std::string& path) const;
  void error(const std::string& path, const std::string& msg);
  void warn(const std::string& path, const std::string& msg);
};

// Hugging Face's "auto" placeholder where dstrain has no rule of its own for the key: records
// `$.a.b: "auto" needs a value: pass --set a.b=VALUE` and returns true when `v` is "auto".
// The getters below call it; readers of their own (arrays, objects) call it first.
bool auto_needs_value(ReadContext& ctx, const std::string& path, const Json& v);

// One JSON object being read. Getters return true when the key is present and valid (and set
// `out`); false when absent (out untouched) or invalid (an error is recorded).
class Section {
 public:
  Section(ReadContext& ctx, const Json* obj, std::string path)
      : ctx_(ctx), obj_(obj), path_(std::move(path)) {}

  bool present() const { return obj_ != nullptr; }
  const std::string& path() const { return path_; }
  std::string child(std::string_view key) const { return json_path_child(path_, key); }
  bool has(const std::string& key) const { return obj_ && obj_->contains(key); }
  // True when `key` is present with the value null.
  bool raw_is_null(const std::string& key) const;

  // Declares `key` known and returns its value, or null when absent.
  const Json* raw(const std::string& key);

  // An integer in [lo, hi]; whole floats (5e8, as DeepSpeed configs write sizes) are accepted.
  bool get_int(const std::string& key, int64_t& out, int64_t lo, int64_t hi);
  bool get_int(const std::string& key, int& out, int64_t lo, int64_t hi = kI32Max);
  bool get_u64(const std::string& key, uint64_t& out);
  // lo_open: lo itself is not allowed ("> lo").
  bool get_number(const std::string& key, double& out, double lo, double hi = kInf,
                  bool lo_open = false);
  bool get_bool(const std::string& key, bool& out);
  // nullable: null is accepted and means "not set" (out becomes "").
  bool get_string(const std::string& key, std::string& out, bool nullable = false);
  // A path string: non-empty, resolved against the config file's directory.
  bool get_path(const std::string& key, std::string& out, const std::string& config_path,
                bool nullable);
  // One of `choices`; case_insensitive matches are normalized to the listed spelling.
  bool get_choice(const std::string& key, std::string& out,
                  const std::vector<std::string>& choices, bool case_insensitive = false);

  // A nested object. Absent (or null when nullable) gives an absent Section; a non-object is an
  // error and also gives an absent Section.
  Section section(const std::string& key, bool nullable = false);

  // DeepSpeed keys accepted and not acted on: a warning for each one present.
  void ignored(const std::vector<std::string>& keys);

  // Every key not declared known: in DeepSpeed's sections (the top level, zero_optimization,
  // optimizer, ...) a warning, as DeepSpeed ignores it, unless a known key is at most two edits
  // away (a probable typo) or the parse is strict; in dstrain's own sections (model, data,
  // training, lora, context_parallel, expert_parallel), which DeepSpeed never reads, always an
  // error. Errors suggest the closest known key.
  void finish();

 private:
  std::string join_keys() const;

  ReadContext& ctx_;
  const Json* obj_;
  std::string path_;
  std::vector<std::string> known_;
};

}  // namespace ds::config::detail
