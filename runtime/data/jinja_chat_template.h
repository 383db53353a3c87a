// A Hugging Face tokenizer_config.json's "chat_template" (a Jinja template) as a ChatTemplate
// (chat.h), run by a small Jinja interpreter written for chat templates: enough for Llama-3's and
// Qwen2's real templates and ones written like them. Rendering is as transformers does it:
// trim_blocks and lstrip_blocks on, the variables messages (a list of {role, content}),
// bos_token, eos_token (tokenizer_config.json's, "" when null) and add_generation_prompt.
//
// The subset: text; {{ expr }}; {% set name = expr %}; {% for name in expr %}...{% endfor %}
// with loop.index0, loop.index, loop.first, loop.last, loop.length; {% if %}/{% elif %}/
// {% else %}/{% endif %}; {# comments #}; whitespace control {%- -%} {{- -}}. Expressions:
// string literals ('..' or ".." with \n \t \' \" \\ escapes), integers, true/false/none, names,
// x.attr, x['key'], x[0], + (numbers, strings, lists), ~ (concatenation as strings), == != < <=
// > >=, in / not in, and, or, not, `a if c else b`, `is [not] defined/none/string`, the filters
// trim and length, and raise_exception(msg), which throws ds::Error naming the template and the
// conversation. Any other tag (macro, call, include, ...) is a ds::Error when the template is
// read; any other filter, test, function or method (tojson, a .strip() call, namespace(), ...)
// is one when it runs (so an unused tools branch may hold them), each naming it and the line.
//
// Segments (chat.h): the conversation is rendered for messages[0..i] for each i; the text message
// i adds is its segment, trainable iff its role is "assistant". For an assistant message, the
// conversation up to it rendered with add_generation_prompt = true gives where the assistant's
// header ends; the header becomes a non-trainable segment of its own. A template whose rendering
// of messages[0..i] does not extend that of messages[0..i-1] is an error naming the message.
// Roles: system, user and assistant, and any other role the template names in a string literal
// (e.g. 'tool'); another role is an error naming it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/chat.h"

namespace ds::rt::data {

class JinjaChatTemplate final : public ChatTemplate {
 public:
  // Parses `source` (the template). `name` is what name() returns and errors call it. Throws
  // ds::Error (invalid argument) naming `name`, the line and the construct for a template
  // outside the subset.
  JinjaChatTemplate(const std::string& source, std::string bos_token, std::string eos_token,
                    std::string name);
  ~JinjaChatTemplate() override;

  std::string name() const override { return name_; }
  std::vector<ChatSegment> render(const std::vector<ChatMessage>& messages,
                                  const std::string& where) const override;

  // The template's text for `messages` (may be empty), as transformers' apply_chat_template
  // with tokenize=False. Throws ds::Error naming `where` for raise_exception and for run-time
  // errors (a string added to a number, an undefined value indexed, ...).
  std::string render_text(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          const std::string& where) const;

  struct Program;  // the parsed template (jinja_chat_template.cpp)

 private:
  std::unique_ptr<Program> program_;
  std::string bos_, eos_, name_;
  std::vector<std::string> roles_;  // the roles render() accepts
};

// Reads `tokenizer_config_path`'s chat_template (a string, or a list of {name, template} from
// which "default" is taken) and bos_token / eos_token (strings or {"content": ...}). name() is
// "jinja:<path>". Throws ds::Error (invalid argument) naming the file and key when there is no
// chat_template, and as the constructor does.
std::unique_ptr<ChatTemplate> open_jinja_chat_template(const std::string& tokenizer_config_path);

}  // namespace ds::rt::data
