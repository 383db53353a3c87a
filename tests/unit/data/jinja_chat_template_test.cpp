// Chat templates from tokenizer_config.json (jinja_chat_template.h): Llama-3's and Qwen2's real
// templates render as @huggingface/jinja renders them (texts in tests/data/hf_cases.json, from
// tests/data/hf_ids.js), the segments split where the assistant's turns start and end, the Jinja
// subset's whitespace control and expressions match Jinja's, and constructs outside it are named.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "data/jinja_chat_template.h"
#include "support/run_command.h"
#include "test_dir.h"

namespace ds::rt::data {
namespace {

using json = nlohmann::json;

// The real templates, as Meta-Llama-3-8B-Instruct's and Qwen2-7B-Instruct's
// tokenizer_config.json hold them.
const char* kLlama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
const char* kQwen2 =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::vector<ChatMessage> messages_of(const json& j) {
  std::vector<ChatMessage> out;
  for (const auto& m : j) out.push_back({m["role"], m["content"]});
  return out;
}

std::string joined(const std::vector<ChatSegment>& segs) {
  std::string s;
  for (const auto& g : segs) s += g.text;
  return s;
}

TEST(JinjaChatTemplate, RealTemplatesRenderAsHuggingFacesJinja) {
  const json cases = json::parse(test::read_file(test::source_path("tests/data/hf_cases.json")));
  const JinjaChatTemplate llama(kLlama3, "<|begin_of_text|>", "<|eot_id|>", "llama3");
  const JinjaChatTemplate qwen(kQwen2, "", "<|im_end|>", "qwen2");
  int n = 0;
  for (const auto& c : cases["chats"]) {
    const JinjaChatTemplate& t = c["kind"] == "llama3" ? llama : qwen;
    const auto msgs = messages_of(c["messages"]);
    for (size_t i = 0; i < msgs.size(); ++i) {
      const std::vector<ChatMessage> upto(msgs.begin(),
                                          msgs.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      const std::vector<ChatMessage> before(msgs.begin(),
                                            msgs.begin() + static_cast<std::ptrdiff_t>(i));
      EXPECT_EQ(t.render_text(upto, false, "x"), c["prefixes"][i].get<std::string>())
          << t.name() << i;
      EXPECT_EQ(t.render_text(before, true, "x"), c["gen"][i].get<std::string>()) << t.name() << i;
    }
    const auto segs = t.render(msgs, "chat.jsonl:1");
    EXPECT_EQ(joined(segs), c["text"].get<std::string>());
    ++n;
  }
  EXPECT_EQ(n, 4);
}

TEST(JinjaChatTemplate, SegmentsSplitAtTheAssistantTurns) {
  const JinjaChatTemplate llama(kLlama3, "<|begin_of_text|>", "<|eot_id|>", "llama3");
  const std::vector<ChatMessage> chat = {{"system", "Be brief."},
                                         {"user", "Hi"},
                                         {"assistant", "  Hello.\n"},
                                         {"user", "Bye"},
                                         {"assistant", "Bye!"}};
  const auto s = llama.render(chat, "chat.jsonl:3");
  ASSERT_EQ(s.size(), 7u);
  EXPECT_EQ(s[0].text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>");
  EXPECT_EQ(s[1].text, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
  EXPECT_EQ(s[2].text, "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(s[3].text, "Hello.<|eot_id|>");  // |trim
  EXPECT_EQ(s[6].text, "Bye!<|eot_id|>");
  const std::vector<bool> trainable = {false, false, false, true, false, false, true};
  for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(s[i].trainable, trainable[i]) << i;

  const JinjaChatTemplate qwen(kQwen2, "", "<|im_end|>", "qwen2");
  const auto q = qwen.render({{"user", "Hi"}, {"assistant", "Hello"}}, "w");
  ASSERT_EQ(q.size(), 3u);
  EXPECT_EQ(q[0].text,
            "<|im_start|>system\nYou are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(q[1].text, "<|im_start|>assistant\n");
  EXPECT_FALSE(q[1].trainable);
  EXPECT_EQ(q[2].text, "Hello<|im_end|>\n");
  EXPECT_TRUE(q[2].trainable);
}

// Expected texts from @huggingface/jinja 0.5.13 (booleans aside: Python prints True).
TEST(JinjaChatTemplate, SubsetMatchesJinja) {
  const std::vector<ChatMessage> msgs = {{"user", "hi"}, {"assistant", "yo"}};
  auto render = [&](const std::string& src) {
    return JinjaChatTemplate(src, "", "", "t").render_text(msgs, false, "w");
  };
  EXPECT_EQ(render("a  {%- if true -%}  x  {%- endif %} b"), "ax b");
  EXPECT_EQ(render("line1\n    {% if true %}\n    yes\n    {% endif %}\nend"),
            "line1\n    yes\nend");
  EXPECT_EQ(render("{# comment #}\n{% set x = 'v' %}{{ x ~ 1 }}|{{ 'ab' if x == 'v' else 'cd' }}|"
                   "{{ ' pad ' | trim }}|{{ messages | length }}"),
            "v1|ab|pad|2");
  EXPECT_EQ(
      render(
          "{% for m in messages %}{{ loop.index }}:{{ m.role }}{% if not loop.last %},{% endif %}"
          "{% endfor %}"),
      "1:user,2:assistant");
  EXPECT_EQ(
      render(
          "{% for m in messages %}{% set y = m.role %}{% endfor %}[{{ y }}]{% if x is defined %}D"
          "{% endif %}{% if messages[0].content is string %}S{% endif %}{{ messages[-1]['role'] "
          "}}"),
      "[]Sassistant");
  EXPECT_EQ(render("{{ 'a' ~ \"b\\n\" }}{% if messages[0]['role'] != 'system' and 'x' not in 'abc' "
                   "or false %}"
                   "T{% else %}F{% endif %}"),
            "ab\nT");
  EXPECT_EQ(
      render("{% if 1 > 2 %}a{% elif messages[1].role == 'assistant' %}b{% else %}c{% endif %}"),
      "b");
  EXPECT_EQ(render("{{ true }}{{ none }}{{ 3 + 4 }}{{ -1 + 3 }}"), "TrueNone72");
  // Slices (Llama-3.1 drops a system message with messages[1:]) and more tests.
  EXPECT_EQ(
      render(
          "{% for m in messages[1:] %}{{ m.role }}{% endfor %}|{{ 'abcdef'[1:-2] }}|{{ 'abc'[:1] }}"
          "{{ 'abc'[5:] }}|{% for m in messages[:-1] %}{{ m.content }}{% endfor %}"),
      "assistant|bcd|a|hi");
  EXPECT_EQ(
      render(
          "{% if messages[0] is mapping and messages is sequence and 3 is number %}ok{% endif %}"),
      "ok");
}

// A template in the style of Llama-3.1's (its system block, messages[1:], tool branches that use
// filters outside the subset): the expected texts are @huggingface/jinja 0.5.13's rendering.
const char* kLlama31Style = R"JINJA({{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)JINJA";

TEST(JinjaChatTemplate, Llama31StyleTemplate) {
  const JinjaChatTemplate t(kLlama31Style, "<|begin_of_text|>", "<|eot_id|>", "llama31");
  const std::vector<ChatMessage> chat = {
      {"system", " Be brief. "}, {"user", "Hi"}, {"assistant", "Hello."}};
  const std::string head =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
      "December "
      "2023\nToday Date: 26 Jul 2024\n\nBe "
      "brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi"
      "<|eot_id|>";
  EXPECT_EQ(t.render_text(chat, false, "w"),
            head + "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>");
  EXPECT_EQ(t.render_text({chat[0], chat[1]}, true, "w"),
            head + "<|start_header_id|>assistant<|end_header_id|>\n\n");
  const auto segs = t.render(chat, "w");
  ASSERT_EQ(segs.size(), 4u);
  EXPECT_EQ(segs[3].text, "Hello.<|eot_id|>");
  EXPECT_TRUE(segs[3].trainable);
  EXPECT_FALSE(segs[2].trainable);
  // A tool message takes the branch that needs |tojson: named, with the template's line.
  const std::string err = error_of([&] { t.render({chat[1], {"tool", "42"}}, "chat.jsonl:5"); });
  EXPECT_NE(
      err.find("chat.jsonl:5: chat template llama31: line 60: the filter |tojson is not supported"),
      std::string::npos)
      << err;
}

TEST(JinjaChatTemplate, OutsideTheSubsetIsNamed) {
  auto parse_error = [](const std::string& src) {
    return error_of([&] { JinjaChatTemplate(src, "", "", "t.json"); });
  };
  auto has = [](const std::string& err, const char* part) {
    EXPECT_NE(err.find(part), std::string::npos) << "want '" << part << "' in: " << err;
  };
  has(parse_error("x\n{% macro f() %}{% endmacro %}"),
      "line 2: the tag {% macro %} is not supported");
  auto run_error = [](const std::string& src) {
    return error_of([&] {
      JinjaChatTemplate(src, "", "", "t.json").render({{"user", "a"}}, "c.jsonl:2");
    });
  };
  has(run_error("{{ messages | tojson(indent=2) }}"),
      "c.jsonl:2: chat template t.json: line 1: the filter |tojson is not supported");
  has(run_error("\n{{ messages[0].content.strip() }}"),
      "line 2: the method .strip() is not supported");
  has(run_error("{% set ns = namespace(a=1) %}"), "the function namespace() is not supported");
  has(run_error("{% if messages is callable %}{% endif %}"),
      "the test `is callable` is not supported");
  has(parse_error("{{ messages[::2] }}"), "slices with a step are not supported");
  // Unused branches may hold what is not supported (Qwen2.5's tools branch uses tojson).
  EXPECT_EQ(
      error_of([] {
        JinjaChatTemplate(
            "{% if tools %}{{ tools | tojson }}{% endif %}{% for t in tools %}x{% endfor %}ok", "",
            "", "t")
            .render({{"user", "a"}}, "w");
      }),
      "(no error)");
  has(parse_error("{% for m in messages %}x"), "has no {% endfor %}");
  has(parse_error("{% if true %}x"), "has no {% endif %}");
  has(parse_error("{{ 'open }}"), "not closed");
  has(parse_error("{{ [1, 2] }}"), "list literals are not supported");
  has(parse_error("{{ messages[] }}"), "expected an index, got ']'");
  has(parse_error("{{ 123456789012345678901234 }}"),
      "the integer 123456789012345678901234 is too large");
  has(parse_error("{{ 2 * 3 }}"), "the operator '*' is not supported");

  const JinjaChatTemplate raising(
      "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools: ' + m.role) }}"
      "{% endif %}{{ m.content }}{% endfor %}",
      "", "", "jinja:cfg.json");
  has(error_of([&] {
        raising.render({{"user", "a"}, {"tool", "b"}}, "chat.jsonl:7");
      }),
      "chat.jsonl:7: chat template jinja:cfg.json: line 1: the template raised an exception: no "
      "tools: tool");
  has(error_of([&] {
        raising.render({{"robot", "a"}}, "chat.jsonl:8");
      }),
      "chat.jsonl:8: message 0: the role \"robot\" is not one");
  has(error_of([&] { raising.render({}, "chat.jsonl:9"); }), "chat.jsonl:9: an empty conversation");
  has(error_of([&] {
        JinjaChatTemplate("{{ messages[0] + 1 }}", "", "", "t").render({{"user", "a"}}, "w");
      }),
      "cannot apply '+' to a dict and an integer");
  // Not incremental: the last message is rendered first.
  const JinjaChatTemplate reversed(
      "{{ messages[-1].content }}{% for m in messages %}{{ m.content }}{% endfor %}", "", "",
      "rev");
  has(error_of([&] {
        reversed.render({{"user", "a"}, {"assistant", "b"}}, "w");
      }),
      "does not extend the text for messages 0..0");
}

TEST(JinjaChatTemplate, OpensTokenizerConfig) {
  test::TempDir dir;
  const std::string path = dir.file("tokenizer_config.json");
  std::ofstream(path)
      << json{{"bos_token", {{"content", "<s>"}}},
              {"eos_token", "</s>"},
              {"chat_template",
               "{{ bos_token }}{% for m in messages %}{{ m.content }}{% if m.role == "
               "'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"}}
             .dump();
  const auto t = open_jinja_chat_template(path);
  EXPECT_EQ(t->name(), "jinja:" + path);
  const auto s = t->render({{"user", "a"}, {"assistant", "b"}}, "w");
  EXPECT_EQ(joined(s), "<s>ab</s>");
  EXPECT_TRUE(s.back().trainable);
  std::ofstream(path) << json{{"chat_template",
                               json::array({{{"name", "default"}, {"template", "{{ 'd' }}"}},
                                            {{"name", "tool_use"}, {"template", "{{ 't' }}"}}})}}
                             .dump();
  EXPECT_EQ(joined(open_jinja_chat_template(path)->render({{"user", "a"}}, "w")), "d");
  std::ofstream(path) << json{{"bos_token", "<s>"}}.dump();
  EXPECT_NE(error_of([&] { open_jinja_chat_template(path); }).find("there is no chat_template key"),
            std::string::npos);
}

}  // namespace
}  // namespace ds::rt::data

namespace ds::rt::data {
namespace {

// Random edits of the real templates either work or throw ds::Error: never another exception,
// a crash or a hang (a cheap stand-in for a fuzz target).
TEST(JinjaChatTemplate, MutatedTemplatesFailCleanly) {
  const std::string pieces[] = {"{{",    "}}",     "{%",   "%}", "{%-",  "-%}",  "{#",   "#}",
                                "'",     "\"",     "[",    "]",  "(",    ")",    "|",    ".",
                                ":",     "-",      "+",    "~",  "not ", " in ", " if ", " else ",
                                "endif", "endfor", "loop", "1",  "99999"};
  std::mt19937 rng(3);
  int ok = 0, errors = 0;
  for (int k = 0; k < 3000; ++k) {
    std::string src = k % 2 ? kLlama3 : kQwen2;
    for (int e = 1 + static_cast<int>(rng() % 3); e > 0; --e) {
      const size_t at = rng() % (src.size() + 1);
      if (rng() % 2)
        src.insert(at, pieces[rng() % std::size(pieces)]);
      else
        src.erase(at, 1 + rng() % 4);
    }
    try {
      const JinjaChatTemplate t(src, "<s>", "</s>", "mutated");
      t.render({{"system", "s"}, {"user", "u"}, {"assistant", "a"}}, "w");
      ++ok;
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(ok, 0);
  EXPECT_GT(errors, 0);
}

}  // namespace
}  // namespace ds::rt::data
