// Strict JSON reading for config files: RFC 8259 JSON (no comments, no trailing commas, no NaN,
// valid UTF-8 only), with the line of every value remembered by its JSON path, so that later
// validation can say `configs/x.json:7: $.zero_optimization.stage: ...`. Duplicate keys are
// errors (DeepSpeed rejects them too), not "last one wins" as in most JSON libraries.
//
// Not a general JSON library: it builds an nlohmann::ordered_json (object keys keep file order)
// and nothing else; it never writes JSON.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace ds::config {

// A JSON path in the `$.a.b[2]` notation used in every message. Keys that are not plain
// identifiers ([A-Za-z0-9_-]) are written as `$["a key"]`.
std::string json_path_child(const std::string& parent, std::string_view key);
std::string json_path_index(const std::string& parent, size_t index);

struct JsonDocument {
  nlohmann::ordered_json value;
  // 1-based line of every value (for object members: the line of the key), by JSON path.
  std::unordered_map<std::string, int> lines;

  // The line of `path`, or 0 when unknown (a path the file does not contain).
  int line_of(const std::string& path) const;
};

// Parses `text`; `source` (a file name) only appears in messages.
// Syntax errors throw ds::Error (invalid argument) "source:line:col: what was expected".
// Duplicate keys: when `duplicate_errors` is null the first one throws; otherwise each one adds
// "source:line: $.path: duplicate key 'k' (first at line N)" to it, the first value is kept and
// parsing continues, so a caller can report every fault at once.
// Nesting deeper than 128 levels is an error (no stack exhaustion on hostile input).
JsonDocument parse_json(std::string_view text, const std::string& source,
                        std::vector<std::string>* duplicate_errors = nullptr);

}  // namespace ds::config
