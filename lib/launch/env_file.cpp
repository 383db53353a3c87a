#include "launch/env_file.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/strings.h"

namespace ds::launch {

namespace {
bool valid_name(std::string_view key) {
  if (key.empty() || std::isdigit(static_cast<unsigned char>(key[0]))) return false;
  for (char c : key) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}
}  // namespace

EnvList parse_env_file(std::string_view text, const std::string& path) {
  EnvList out;
  int lineno = 0;
  for (const auto& raw : split(text, '\n')) {
    ++lineno;
    std::string_view line = raw;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::string_view t = trim(line);
    if (t.empty() || t.front() == '#') continue;
    if (starts_with(t, "export ")) t = trim(t.substr(7));
    auto eq = t.find('=');
    if (eq == std::string_view::npos) {
      // The line may be a secret pasted without its key: do not echo it.
      throw invalid_argument("{}:{}: expected KEY=VALUE (the line has no '=')", path, lineno);
    }
    std::string key(trim(t.substr(0, eq)));
    if (!valid_name(key)) {
      throw invalid_argument("{}:{}: the text before '=' is not a valid environment variable name "
                             "(letters, digits and '_', not starting with a digit)",
                             path, lineno);
    }
    out.emplace_back(key, std::string(t.substr(eq + 1)));
  }
  return out;
}

EnvList load_env_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return {};
  std::ifstream in(path);
  if (!in) throw system_error("cannot read {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_env_file(ss.str(), path);
}

}  // namespace ds::launch
