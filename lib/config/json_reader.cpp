// A small recursive-descent JSON parser that tracks lines and columns. nlohmann's own parser
// would do the grammar, but it reports neither the line of a value nor duplicate keys with their
// position, and both are what a config user needs to find a mistake.
#include "config/json_reader.h"

#include <charconv>
#include <cstdint>
#include <limits>

#include <fmt/format.h>

#include "common/error.h"

namespace ds::config {

namespace {

constexpr int kMaxDepth = 128;

bool is_plain_key(std::string_view key) {
  if (key.empty()) return false;
  for (char c : key) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Parser {
 public:
  Parser(std::string_view text, const std::string& source, JsonDocument& doc,
         std::vector<std::string>* dups)
      : s_(text), source_(source), doc_(doc), dups_(dups) {}

  void parse() {
    skip_ws();
    if (i_ >= s_.size()) fail("empty input: expected a JSON value (a config is a JSON object)");
    doc_.lines["$"] = line_;
    doc_.value = value("$", 0);
    skip_ws();
    if (i_ < s_.size()) fail("unexpected content after the end of the JSON value");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    size_t col = i_ - line_start_ + 1;
    throw invalid_argument("{}:{}:{}: {}", source_, line_, col, what);
  }

  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  bool at_end() const { return i_ >= s_.size(); }

  std::string describe_here() const {
    if (at_end()) return "end of input";
    unsigned char c = static_cast<unsigned char>(s_[i_]);
    if (c < 0x20 || c >= 0x7F) return fmt::format("byte 0x{:02x}", c);
    return fmt::format("'{}'", static_cast<char>(c));
  }

  void skip_ws() {
    while (i_ < s_.size()) {
      char c = s_[i_];
      if (c == '\n') {
        ++line_;
        ++i_;
        line_start_ = i_;
      } else if (c == ' ' || c == '\t' || c == '\r') {
        ++i_;
      } else if (c == '/' && i_ + 1 < s_.size() && (s_[i_ + 1] == '/' || s_[i_ + 1] == '*')) {
        fail("comments are not allowed in JSON");
      } else {
        break;
      }
    }
  }

  nlohmann::ordered_json value(const std::string& path, int depth) {
    if (depth > kMaxDepth) fail(fmt::format("nesting deeper than {} levels", kMaxDepth));
    char c = peek();
    switch (c) {
      case '{': return object(path, depth);
      case '[': return array(path, depth);
      case '"': return nlohmann::ordered_json(string());
      case 't': literal("true"); return true;
      case 'f': literal("false"); return false;
      case 'n': literal("null"); return nullptr;
      default:
        if (c == '-' || (c >= '0' && c <= '9')) return number();
        if (c == '\'') fail("strings must use double quotes");
        if (c == 'N' || c == 'I') fail("NaN and Infinity are not JSON numbers");
        fail(fmt::format("expected a JSON value, got {}", describe_here()));
    }
  }

  void literal(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) {
      fail(fmt::format("expected a JSON value, got {}", describe_here()));
    }
    i_ += word.size();
  }

  nlohmann::ordered_json object(const std::string& path, int depth) {
    ++i_;  // '{'
    nlohmann::ordered_json obj = nlohmann::ordered_json::object();
    skip_ws();
    if (peek() == '}') {
      ++i_;
      return obj;
    }
    for (;;) {
      skip_ws();
      if (peek() != '"') {
        if (peek() == '}') fail("trailing comma before '}'");
        if (peek() == '\'') fail("keys must be strings in double quotes");
        fail(fmt::format("expected a string key in double quotes, got {}", describe_here()));
      }
      int key_line = line_;
      std::string key = string();
      std::string child = json_path_child(path, key);
      skip_ws();
      if (peek() != ':') fail(fmt::format("expected ':' after key \"{}\", got {}", key, describe_here()));
      ++i_;
      skip_ws();
      bool duplicate = obj.contains(key);
      if (duplicate) {
        std::string msg = fmt::format("{}:{}: {}: duplicate key \"{}\" (first at line {})", source_,
                                      key_line, child, key, doc_.line_of(child));
        if (!dups_) throw invalid_argument("{}", msg);
        dups_->push_back(std::move(msg));
        // Parse and drop the second value; its nested lines must not overwrite the first's.
        JsonDocument scratch;
        std::swap(scratch.lines, doc_.lines);
        value(child, depth + 1);
        std::swap(scratch.lines, doc_.lines);
      } else {
        doc_.lines[child] = key_line;
        obj[key] = value(child, depth + 1);
      }
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() == '}') {
        ++i_;
        return obj;
      }
      fail(fmt::format("expected ',' or '}}' after a member of an object, got {}", describe_here()));
    }
  }

  nlohmann::ordered_json array(const std::string& path, int depth) {
    ++i_;  // '['
    nlohmann::ordered_json arr = nlohmann::ordered_json::array();
    skip_ws();
    if (peek() == ']') {
      ++i_;
      return arr;
    }
    for (size_t n = 0;; ++n) {
      skip_ws();
      if (peek() == ']') fail("trailing comma before ']'");
      std::string child = json_path_index(path, n);
      doc_.lines[child] = line_;
      arr.push_back(value(child, depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() == ']') {
        ++i_;
        return arr;
      }
      fail(fmt::format("expected ',' or ']' after an array element, got {}", describe_here()));
    }
  }

  uint32_t hex4() {
    if (i_ + 4 > s_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[i_];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
      else fail("invalid hex digit in \\u escape");
      ++i_;
    }
    return v;
  }

  // Validates one UTF-8 sequence starting at i_ and appends it.
  void utf8_char(std::string& out) {
    auto b0 = static_cast<unsigned char>(s_[i_]);
    int len = 0;
    uint32_t cp = 0;
    if (b0 >= 0xC2 && b0 <= 0xDF) { len = 2; cp = b0 & 0x1F; }
    else if (b0 >= 0xE0 && b0 <= 0xEF) { len = 3; cp = b0 & 0x0F; }
    else if (b0 >= 0xF0 && b0 <= 0xF4) { len = 4; cp = b0 & 0x07; }
    else fail("invalid UTF-8 in string");
    if (i_ + static_cast<size_t>(len) > s_.size()) fail("invalid UTF-8 in string");
    for (int k = 1; k < len; ++k) {
      auto b = static_cast<unsigned char>(s_[i_ + static_cast<size_t>(k)]);
      if ((b & 0xC0) != 0x80) fail("invalid UTF-8 in string");
      cp = (cp << 6) | (b & 0x3F);
    }
    bool overlong = (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
    if (overlong || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      fail("invalid UTF-8 in string");
    }
    out.append(s_.substr(i_, static_cast<size_t>(len)));
    i_ += static_cast<size_t>(len);
  }

  std::string string() {
    ++i_;  // opening quote
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      auto c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') {
        ++i_;
        return out;
      }
      if (c == '\n') fail("unterminated string (newline inside a string)");
      if (c < 0x20) fail(fmt::format("control character 0x{:02x} inside a string (escape it)", c));
      if (c >= 0x80) {
        utf8_char(out);
        continue;
      }
      if (c != '\\') {
        out += static_cast<char>(c);
        ++i_;
        continue;
      }
      ++i_;
      if (at_end()) fail("unterminated string");
      char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.substr(i_, 2) != "\\u") fail("unpaired UTF-16 surrogate in \\u escape");
            i_ += 2;
            uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("unpaired UTF-16 surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("unpaired UTF-16 surrogate in \\u escape");
          }
          append_utf8(out, cp);
          break;
        }
        default:
          --i_;
          fail(fmt::format("invalid escape '\\{}' in string", e));
      }
    }
  }

  nlohmann::ordered_json number() {
    size_t start = i_;
    auto digits = [&] {
      size_t d = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return i_ - d;
    };
    if (peek() == '-') ++i_;
    if (peek() == '0') {
      ++i_;
      if (peek() >= '0' && peek() <= '9') fail("numbers must not have leading zeros");
    } else if (digits() == 0) {
      fail(fmt::format("expected a digit, got {}", describe_here()));
    }
    bool integral = true;
    if (peek() == '.') {
      integral = false;
      ++i_;
      if (digits() == 0) fail(fmt::format("expected a digit after '.', got {}", describe_here()));
    }
    if (peek() == 'e' || peek() == 'E') {
      integral = false;
      ++i_;
      if (peek() == '+' || peek() == '-') ++i_;
      if (digits() == 0) fail(fmt::format("expected a digit in the exponent, got {}", describe_here()));
    }
    std::string_view text = s_.substr(start, i_ - start);
    const char* b = text.data();
    const char* e = text.data() + text.size();
    if (integral) {
      int64_t v = 0;
      auto r = std::from_chars(b, e, v);
      if (r.ec == std::errc() && r.ptr == e) return v;
      uint64_t u = 0;
      r = std::from_chars(b, e, u);
      if (r.ec == std::errc() && r.ptr == e) return u;
      // Too large for 64 bits: keep it as a double, as other JSON readers do.
    }
    double d = 0;
    auto r = std::from_chars(b, e, d);
    if (r.ec == std::errc::result_out_of_range) {
      i_ = start;
      fail(fmt::format("number {} is out of range", text));
    }
    if (r.ec != std::errc() || r.ptr != e) {
      i_ = start;
      fail(fmt::format("malformed number {}", text));
    }
    return d;
  }

  std::string_view s_;
  const std::string& source_;
  JsonDocument& doc_;
  std::vector<std::string>* dups_;
  size_t i_ = 0;
  int line_ = 1;
  size_t line_start_ = 0;
};

}  // namespace

std::string json_path_child(const std::string& parent, std::string_view key) {
  if (is_plain_key(key)) return fmt::format("{}.{}", parent, key);
  return fmt::format("{}[{}]", parent, nlohmann::json(std::string(key)).dump());
}

std::string json_path_index(const std::string& parent, size_t index) {
  return fmt::format("{}[{}]", parent, index);
}

int JsonDocument::line_of(const std::string& path) const {
  auto it = lines.find(path);
  return it == lines.end() ? 0 : it->second;
}

JsonDocument parse_json(std::string_view text, const std::string& source,
                        std::vector<std::string>* duplicate_errors) {
  JsonDocument doc;
  Parser(text, source, doc, duplicate_errors).parse();
  return doc;
}

}  // namespace ds::config
