// Chat and instruction examples as text with trainable spans: the one interface between chat
// templates (which render messages to text) and the SFT data path (which tokenizes the text and
// writes a per-token loss mask). A template renders a conversation into an ordered list of
// segments; a segment's `trainable` says whether its tokens count in the loss (an assistant
// message's content and its end-of-turn marker) or not (headers, system and user turns, BOS).
// The SFT path tokenizes each segment on its own and concatenates the ids, so every mask
// boundary is a token boundary.
//
// Implementations:
//   builtin templates "plain" and "llama3"            runtime/data/chat_template.cpp
//   a tokenizer_config.json's Jinja "chat_template"   runtime/data/jinja_chat_template.cpp
// Not here: tokenization (tokenizer.h), token and mask files (token_file.h, sft.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace ds::rt::data {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant" (a template may know others)
  std::string content;
};

struct ChatSegment {
  std::string text;
  bool trainable = false;  // its tokens count in the loss
};

class ChatTemplate {
 public:
  virtual ~ChatTemplate() = default;
  // "plain", "llama3", or "jinja:<file>" for a tokenizer_config.json's template.
  virtual std::string name() const = 0;
  // The conversation as segments, in order; their concatenation is the rendered text.
  // Throws ds::Error (invalid argument) naming `where` (e.g. "chat.jsonl:12") and the role
  // for a role the template does not know, and for an empty conversation.
  virtual std::vector<ChatSegment> render(const std::vector<ChatMessage>& messages,
                                          const std::string& where) const = 0;
};

}  // namespace ds::rt::data
