// The builtin chat templates (chat.h's ChatTemplate) and the lookup `--chat-template NAME` uses.
//
//   plain (the default)  per message: "<role>: " (not trained), then the content and a "\n"
//                        terminator, both trained for an assistant message and not otherwise:
//                          "user: What is 2+2?\n"  "assistant: " + "4\n" (trained)
//                        roles: system, user, assistant
//   llama3               Meta's Llama-3 instruct format: "<|begin_of_text|>", then per message
//                        "<|start_header_id|>{role}<|end_header_id|>\n\n" (not trained), the
//                        content and "<|eot_id|>" (both trained for an assistant message only);
//                        roles: system, user, assistant, ipython
// The special markers are text; a tokenizer without them as single tokens (GPT-2's, the byte
// tokenizer) encodes them as ordinary text, and the mask still follows the segments.
// Not here: Jinja templates from a tokenizer_config.json (jinja_chat_template.cpp), the JSONL
// reading and the mask files (sft.h).
#pragma once

#include <memory>
#include <string>

#include "data/chat.h"

namespace ds::rt::data {

// "plain", "llama3", or "jinja:<tokenizer_config.json>" / "jinja:<model directory>" (its
// tokenizer_config.json's chat_template, jinja_chat_template.h). Throws ds::Error (invalid
// argument) naming the unknown name and the known ones.
std::unique_ptr<ChatTemplate> open_chat_template(const std::string& name);

}  // namespace ds::rt::data
