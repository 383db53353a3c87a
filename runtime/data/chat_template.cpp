// The builtin chat templates, plain and llama3 (chat_template.h), and the name lookup.
#include "data/chat_template.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <string_view>

#include <fmt/format.h>

#include "data/jinja_chat_template.h"

#include "common/error.h"

namespace ds::rt::data {

namespace {

template <size_t N>
void check_role(const ChatMessage& m, const std::array<std::string_view, N>& roles,
                const std::string& template_name, const std::string& where) {
  if (std::find(roles.begin(), roles.end(), m.role) == roles.end()) {
    throw invalid_argument("{}: role \"{}\" is not known to the {} chat template (expected one of: {})",
                           where, m.role, template_name, fmt::join(roles, ", "));
  }
}

void check_not_empty(const std::vector<ChatMessage>& messages, const std::string& where) {
  if (messages.empty()) throw invalid_argument("{}: empty conversation (no messages)", where);
}

class PlainTemplate final : public ChatTemplate {
 public:
  std::string name() const override { return "plain"; }
  std::vector<ChatSegment> render(const std::vector<ChatMessage>& messages,
                                  const std::string& where) const override {
    static constexpr std::array<std::string_view, 3> kRoles{"system", "user", "assistant"};
    check_not_empty(messages, where);
    std::vector<ChatSegment> out;
    for (const ChatMessage& m : messages) {
      check_role(m, kRoles, name(), where);
      const bool train = m.role == "assistant";
      out.push_back({m.role + ": ", false});
      out.push_back({m.content + "\n", train});
    }
    return out;
  }
};

class Llama3Template final : public ChatTemplate {
 public:
  std::string name() const override { return "llama3"; }
  std::vector<ChatSegment> render(const std::vector<ChatMessage>& messages,
                                  const std::string& where) const override {
    static constexpr std::array<std::string_view, 4> kRoles{"system", "user", "assistant", "ipython"};
    check_not_empty(messages, where);
    std::vector<ChatSegment> out{{"<|begin_of_text|>", false}};
    for (const ChatMessage& m : messages) {
      check_role(m, kRoles, name(), where);
      const bool train = m.role == "assistant";
      out.push_back({"<|start_header_id|>" + m.role + "<|end_header_id|>\n\n", false});
      out.push_back({m.content, train});
      out.push_back({"<|eot_id|>", train});
    }
    return out;
  }
};

}  // namespace

std::unique_ptr<ChatTemplate> open_chat_template(const std::string& name) {
  if (name == "plain") return std::make_unique<PlainTemplate>();
  if (name == "llama3") return std::make_unique<Llama3Template>();
  // A tokenizer_config.json's Jinja template (jinja_chat_template.h): "jinja:<file>", or
  // "jinja:<dir>" for the directory's tokenizer_config.json (a Hugging Face model directory).
  if (name.rfind("jinja:", 0) == 0) {
    std::string path = name.substr(6);
    if (std::filesystem::is_directory(path)) path = (std::filesystem::path(path) / "tokenizer_config.json").string();
    return open_jinja_chat_template(path);
  }
  throw invalid_argument("chat template \"{}\": unknown (expected plain, llama3, or jinja:<tokenizer_config.json or "
                         "model directory>)",
                         name);
}

}  // namespace ds::rt::data
