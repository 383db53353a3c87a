// Hugging Face tokenizer.json (hf_tokenizer.h): the GPT-2, Llama-3 and Qwen2 layouts that
// tests/data/hf_tokenizer_make.py writes from GPT-2's vocabulary encode as Hugging Face's own
// JavaScript implementation does (ids in tests/data/hf_cases.json, from tests/data/hf_ids.js);
// the GPT-2 layout encodes as our gpt2 tokenizer; cut points keep the ids; bad files are named.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "data/gpt2_bpe.h"
#include "data/hf_tokenizer.h"
#include "gpt2_vocab.h"
#include "support/run_command.h"
#include "test_dir.h"

namespace ds::rt::data {
namespace {

using json = nlohmann::json;

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The three fixture directories, written once per test program.
class HfFixtures : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!test::have_gpt2_vocab()) return;
    dir_ = new test::TempDir();
    auto r = test::run_command("python3 " + test::source_path("tests/data/hf_tokenizer_make.py") +
                               " " + test::gpt2_vocab_dir() + " " + dir_->path());
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::unique_ptr<HfTokenizer> open(const std::string& kind) {
    return HfTokenizer::from_path(dir_->path() + "/" + kind);
  }
  static test::TempDir* dir_;
};
test::TempDir* HfFixtures::dir_ = nullptr;

json cases() {
  return json::parse(test::read_file(test::source_path("tests/data/hf_cases.json")));
}

// Pseudo-English with code, numbers, CJK, special tokens and newline runs; deterministic.
std::string generated_text(size_t lines, uint32_t seed) {
  static const char* words[] = {
      "the",   "and",  "of",    "To",       "in",         "light",        "God",           "said",
      "12345", "3.14", "don't", "WE'LL",    "naïve",      "café",         "日本語",        "\t",
      "  ",    "(x)",  "{",     "};",       "<|eot_id|>", "<|im_start|>", "<|endoftext|>", "!!",
      "\r\n",  "\n\n", " \n",   "👋🏽", "x2",         "e\u0301"};
  std::mt19937 rng(seed);
  std::string s;
  for (size_t l = 0; l < lines; ++l) {
    const int n = 2 + static_cast<int>(rng() % 12);
    for (int w = 0; w < n; ++w)
      s += std::string(rng() % 3 ? " " : "") + words[rng() % std::size(words)];
    s += rng() % 4 == 0 ? "\n\n" : "\n";
  }
  return s;
}

TEST_F(HfFixtures, IdsEqualHuggingFacesJavaScriptTokenizer) {
  DS_REQUIRE_GPT2_VOCAB();
  const json c = cases();
  for (const char* kind : {"gpt2", "llama3", "qwen2"}) {
    const auto tok = open(kind);
    int n = 0;
    for (const auto& k : c["cases"]) {
      const std::string text = k["text"];
      const auto want = k[kind].get<std::vector<uint32_t>>();
      EXPECT_EQ(tok->encode(text), want) << kind << ": " << json(text).dump();
      if (std::string(kind) != "qwen2") {
        EXPECT_EQ(tok->decode(want), text) << kind;
      }
      ++n;
    }
    EXPECT_GE(n, 180);
  }
}

TEST_F(HfFixtures, QwenNormalizesToNfc) {
  DS_REQUIRE_GPT2_VOCAB();
  const auto qwen = open("qwen2");
  EXPECT_EQ(qwen->encode("cafe\u0301"), qwen->encode("caf\u00e9"));
  EXPECT_EQ(qwen->decode(qwen->encode("cafe\u0301 A\u030a")), "caf\u00e9 \u00c5");
  const auto llama = open("llama3");  // no normalizer: the combining accent stays
  EXPECT_EQ(llama->decode(llama->encode("cafe\u0301")), "cafe\u0301");
}

TEST_F(HfFixtures, Gpt2LayoutEncodesAsTheGpt2Tokenizer) {
  DS_REQUIRE_GPT2_VOCAB();
  const auto hf = open("gpt2");
  const auto gpt2 = Gpt2Tokenizer::from_dir(test::gpt2_vocab_dir());
  EXPECT_EQ(hf->vocab_size(), 50257);
  EXPECT_EQ(hf->document_token(), 50256);
  EXPECT_EQ(hf->pattern_name(), "gpt2");
  const json g = json::parse(test::read_file(test::source_path("tests/data/gpt2_cases.json")));
  for (const auto& k : g["cases"]) {
    const std::string text = k["text"];
    if (text.find("<|endoftext|>") != std::string::npos) continue;  // an added token in hf
    EXPECT_EQ(hf->encode(text), gpt2->encode(text)) << json(text).dump();
  }
  std::string text = generated_text(3000, 7);
  for (size_t p; (p = text.find("<|")) != std::string::npos;) text.replace(p, 2, "<");
  EXPECT_EQ(hf->encode(text), gpt2->encode(text));
  // <|endoftext|> is an added token here, ordinary text for the gpt2 tokenizer.
  EXPECT_EQ(hf->encode("a<|endoftext|>b"), (std::vector<uint32_t>{64, 50256, 65}));
}

TEST_F(HfFixtures, SpecialTokensAndDocumentToken) {
  DS_REQUIRE_GPT2_VOCAB();
  const auto llama = open("llama3");
  EXPECT_EQ(llama->vocab_size(), 50262);
  EXPECT_EQ(llama->document_token(), 50257);  // <|begin_of_text|>
  EXPECT_EQ(llama->eos_token(), 50261);       // <|eot_id|>
  EXPECT_EQ(llama->token_id("<|start_header_id|>"), 50259u);
  EXPECT_EQ(llama->pattern_name(), "llama3");
  EXPECT_EQ(llama->decode(std::vector<uint32_t>{50257, 15496}), "<|begin_of_text|>Hello");
  const auto qwen = open("qwen2");
  EXPECT_EQ(qwen->vocab_size(), 50259);
  EXPECT_EQ(qwen->document_token(), 50256);  // no BOS: <|endoftext|>
  EXPECT_EQ(qwen->eos_token(), 50258);       // {"content": "<|im_end|>"}
  EXPECT_EQ(qwen->pattern_name(), "qwen2");
  const auto via_open = open_tokenizer({"hf", dir_->path() + "/llama3/tokenizer.json"});
  EXPECT_EQ(via_open->name(), "hf");
  EXPECT_EQ(via_open->document_token(), 50257);
  EXPECT_THROW(open_tokenizer({"hf", ""}), Error);
  EXPECT_NE(error_of([&] {
              open_tokenizer({"hf", dir_->path() + "/none"});
            }).find("/none is neither a directory"),
            std::string::npos);
  std::string id_error = error_of([&] { llama->decode(std::vector<uint32_t>{1, 50262}); });
  EXPECT_NE(id_error.find("token 50262 at index 1"), std::string::npos) << id_error;
}

TEST_F(HfFixtures, CutPointsKeepTheIds) {
  DS_REQUIRE_GPT2_VOCAB();
  const std::string text = generated_text(2000, 11);
  for (const char* kind : {"gpt2", "llama3", "qwen2"}) {
    const auto tok = open(kind);
    const auto whole = tok->encode(text);
    std::vector<uint32_t> parts;
    size_t start = 0, cuts = 0;
    for (size_t from = 1;;) {
      const size_t c = tok->cut_point(text, from);
      if (c == std::string_view::npos) break;
      ASSERT_GT(c, start);
      ASSERT_LT(c, text.size());
      tok->encode(std::string_view(text).substr(start, c - start), parts);
      start = c, from = c + 1 + (c * 7919) % 200, ++cuts;
    }
    tok->encode(std::string_view(text).substr(start), parts);
    EXPECT_GT(cuts, 50u) << kind;
    EXPECT_EQ(parts, whole) << kind;
  }
  // Never inside an added token, even one that starts after a newline.
  const auto llama = open("llama3");
  EXPECT_EQ(llama->cut_point("a\n<|eot_id|>b\nc", 1), 2u);
  const auto gpt2 = open("gpt2");
  EXPECT_EQ(gpt2->cut_point("<|endoftext|>ab.", 1), 15u);
}

// A small valid tokenizer.json: the 256 byte tokens, "ab" and one merge.
json small_tokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    const char32_t c = gpt2_byte_to_unicode(static_cast<uint8_t>(b));
    std::string key;
    if (c < 0x80)
      key.push_back(static_cast<char>(c));
    else
      key += {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
    vocab[key] = b;
  }
  vocab["ab"] = 256;
  return {{"version", "1.0"},
          {"added_tokens", json::array({{{"id", 257}, {"content", "<|x|>"}, {"special", true}}})},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             json::array(
                 {{{"type", "Split"},
                   {"pattern", {{"Regex", kHfLlama3Pattern}}},
                   {"behavior", "Isolated"},
                   {"invert", false}},
                  {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"a b"})}}}};
}

std::string parse_error(const json& j, const std::string& config = "") {
  return error_of(
      [&] { HfTokenizer::parse(j.dump(), config, "t/tokenizer.json", "t/tokenizer_config.json"); });
}

TEST(HfTokenizer, SmallFileEncodes) {
  const auto tok = HfTokenizer::parse(small_tokenizer().dump(), "", "t.json", "c.json");
  EXPECT_EQ(tok->vocab_size(), 258);
  EXPECT_EQ(tok->document_token(), -1);
  EXPECT_EQ(tok->encode("ab<|x|>ba"), (std::vector<uint32_t>{256, 257, 'b', 'a'}));
  json pairs = small_tokenizer();
  pairs["model"]["merges"] = json::array({json::array({"a", "b"})});
  EXPECT_EQ(HfTokenizer::parse(pairs.dump(), "", "t", "c")->encode("xab"),
            (std::vector<uint32_t>{'x', 256}));
}

TEST(HfTokenizer, BadFilesAreNamed) {
  auto expect = [](const std::string& err, std::initializer_list<const char*> parts) {
    for (const char* p : parts)
      EXPECT_NE(err.find(p), std::string::npos) << "want '" << p << "' in: " << err;
  };
  json j = small_tokenizer();
  j["model"]["type"] = "WordPiece";
  expect(parse_error(j), {"t/tokenizer.json", "model.type", "\"WordPiece\" is not supported"});
  j["model"]["type"] = "Unigram";
  expect(parse_error(j), {"model.type", "Unigram"});
  j = small_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+|\\s+";
  expect(parse_error(j), {"t/tokenizer.json", "pre_tokenizer.pretokenizers[0].pattern.Regex",
                          "\\\\w+|\\\\s+", "Llama-3's", "Qwen2's", "\\\\p{N}{1,3}"});
  j = small_tokenizer();
  j["model"].erase("vocab");
  expect(parse_error(j), {"t/tokenizer.json", "model.vocab: missing"});
  j = small_tokenizer();
  j["model"]["merges"] = json::array({"a b", "a zz"});
  expect(parse_error(j), {"t/tokenizer.json", "model.merges[1]", "\"zz\"", "not in model.vocab"});
  j["model"]["merges"] = json::array({"b a"});
  expect(parse_error(j), {"model.merges[0]", "the merged token \"ba\""});
  j["model"]["merges"] = json::array({"a b c"});
  expect(parse_error(j), {"model.merges[0]", "two tokens"});
  j = small_tokenizer();
  j["added_tokens"][0]["id"] = 4000000000LL;
  expect(parse_error(j),
         {"added_tokens[0].id", "expected a token id in [0, 16777216), got 4000000000"});
  j = small_tokenizer();
  j["normalizer"] = {{"type", "NFKC"}};
  expect(parse_error(j), {"normalizer.type", "NFKC"});
  j = small_tokenizer();
  j["added_tokens"][0]["lstrip"] = true;
  expect(parse_error(j), {"added_tokens[0].lstrip"});
  j = small_tokenizer();
  j["model"]["vocab"].erase("a");
  expect(parse_error(j), {"model.vocab", "byte token for byte 97"});
  j = small_tokenizer();
  j["decoder"] = {{"type", "Metaspace"}};
  expect(parse_error(j), {"decoder"});
  j = small_tokenizer();
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  expect(parse_error(j), {"pre_tokenizer.type", "Metaspace"});
  j = small_tokenizer();
  j["post_processor"] = {{"type", "BertProcessing"}};
  expect(parse_error(j), {"post_processor.type", "BertProcessing"});
  expect(parse_error(small_tokenizer(), R"({"bos_token": "<nope>"})"),
         {"t/tokenizer_config.json", "bos_token", "<nope>"});
  expect(error_of([] { HfTokenizer::parse("{\"model\": ", "", "t/tokenizer.json", "c"); }),
         {"t/tokenizer.json", "not valid JSON"});
  expect(parse_error(small_tokenizer(), R"({"bos_token": {"content": "<|x|>"}})"), {"(no error)"});
}

}  // namespace
}  // namespace ds::rt::data

namespace ds::rt::data {
namespace {

// Random edits of a small tokenizer.json either load (and then encode and decode) or throw
// ds::Error: never another exception or a crash.
TEST(HfTokenizer, MutatedFilesFailCleanly) {
  const std::string base = small_tokenizer().dump();
  const std::string pieces[] = {"\"",   "{",  "}",           "[",       "]",       ",", ":", "null",
                                "true", "-1", "99999999999", "\"BPE\"", "\\u0000", "0", " "};
  std::mt19937 rng(5);
  int ok = 0, errors = 0;
  for (int k = 0; k < 1500; ++k) {
    std::string j = base;
    for (int e = 1 + static_cast<int>(rng() % 3); e > 0; --e) {
      const size_t at = rng() % (j.size() + 1);
      if (rng() % 2)
        j.insert(at, pieces[rng() % std::size(pieces)]);
      else
        j.erase(at, 1 + rng() % 4);
    }
    try {
      const auto tok = HfTokenizer::parse(j, "", "m.json", "c.json");
      const auto ids = tok->encode("ab<|x|> cd\n\n12 'S");
      tok->decode(ids);
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
