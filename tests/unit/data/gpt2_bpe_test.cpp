// GPT-2's BPE against known ids: tests/data/gpt2_cases.json holds ids computed by the npm package
// gpt-3-encoder@1.1.4's own JavaScript encoder (tests/data/gpt2_ids.js). Then both file layouts,
// round trips on arbitrary and invalid UTF-8, cut points, the pre-tokeniser alone, and bad files.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "data/gpt2_bpe.h"
#include "data/gpt2_pretokenize.h"
#include "gpt2_vocab.h"
#include "support/run_command.h"
#include "test_dir.h"

namespace ds::rt::data {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

const Gpt2Tokenizer& gpt2() {
  static const auto tok = Gpt2Tokenizer::from_dir(test::gpt2_vocab_dir());
  return *tok;
}

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Gpt2Bpe, KnownIdsFromTheJavaScriptEncoder) {
  DS_REQUIRE_GPT2_VOCAB();
  const auto j = nlohmann::json::parse(test::read_file(test::source_path("tests/data/gpt2_cases.json")));
  ASSERT_GE(j["cases"].size(), 20u);
  for (const auto& c : j["cases"]) {
    const std::string text = c["text"];
    const auto expected = c["ids"].get<std::vector<uint32_t>>();
    EXPECT_EQ(gpt2().encode(text), expected) << nlohmann::json(text).dump();
    EXPECT_EQ(gpt2().decode(expected), text);
  }
  EXPECT_EQ(gpt2().encode("Hello world"), (std::vector<uint32_t>{15496, 995}));
}

TEST(Gpt2Bpe, VocabularyAndEndOfText) {
  DS_REQUIRE_GPT2_VOCAB();
  EXPECT_EQ(gpt2().vocab_size(), kGpt2VocabSize);
  EXPECT_EQ(gpt2().document_token(), kGpt2EndOfText);
  EXPECT_EQ(gpt2().merge_count(), 50000);
  EXPECT_EQ(gpt2().decode(std::vector<uint32_t>{kGpt2EndOfText}), "<|endoftext|>");
  EXPECT_EQ(gpt2().token_bytes(995), " world");
}

TEST(Gpt2Bpe, HuggingFaceLayoutGivesTheSameTokenizer) {
  DS_REQUIRE_GPT2_VOCAB();
  TempDir dir;
  fs::copy_file(test::gpt2_vocab_dir() + "/encoder.json", dir.file("vocab.json"));
  fs::copy_file(test::gpt2_vocab_dir() + "/vocab.bpe", dir.file("merges.txt"));
  const auto hf = Gpt2Tokenizer::from_dir(dir.path());
  const std::string text = "The quick brown fox's 42 jumps\n\n  over 日本 🎉";
  EXPECT_EQ(hf->encode(text), gpt2().encode(text));
  EXPECT_EQ(hf->vocab_size(), kGpt2VocabSize);
}

// Random strings of code points from many scripts and classes (valid UTF-8).
std::string random_utf8(std::mt19937& rng, size_t chars) {
  static const std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x20, 0x7E}, {0x09, 0x0D}, {0xA0, 0x24F}, {0x300, 0x36F}, {0x391, 0x3C9}, {0x410, 0x44F},
      {0x5D0, 0x5EA}, {0x620, 0x64A}, {0x900, 0x97F}, {0x2000, 0x206F}, {0x3000, 0x303F},
      {0x4E00, 0x4FFF}, {0xAC00, 0xAD00}, {0x1F300, 0x1F64F}, {0x1D400, 0x1D4FF}, {0x85, 0x85}};
  std::string s;
  for (size_t i = 0; i < chars; ++i) {
    const auto& r = ranges[rng() % ranges.size()];
    const char32_t c = r.first + static_cast<char32_t>(rng() % (r.second - r.first + 1));
    if (c < 0x80) s.push_back(static_cast<char>(c));
    else if (c < 0x800) s += {char(0xC0 | (c >> 6)), char(0x80 | (c & 0x3F))};
    else if (c < 0x10000)
      s += {char(0xE0 | (c >> 12)), char(0x80 | ((c >> 6) & 0x3F)), char(0x80 | (c & 0x3F))};
    else
      s += {char(0xF0 | (c >> 18)), char(0x80 | ((c >> 12) & 0x3F)),
            char(0x80 | ((c >> 6) & 0x3F)), char(0x80 | (c & 0x3F))};
  }
  return s;
}

TEST(Gpt2Bpe, RoundTripsArbitraryAndInvalidUtf8) {
  DS_REQUIRE_GPT2_VOCAB();
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    const std::string text = random_utf8(rng, 1 + rng() % 200);
    ASSERT_EQ(gpt2().decode(gpt2().encode(text)), text);
  }
  for (int i = 0; i < 300; ++i) {  // arbitrary bytes: mostly invalid UTF-8
    std::string bytes(1 + rng() % 200, '\0');
    for (auto& b : bytes) b = static_cast<char>(rng());
    ASSERT_EQ(gpt2().decode(gpt2().encode(bytes)), bytes);
  }
  // Specific invalid forms: lone continuation, overlong, surrogate, > U+10FFFF, truncated.
  for (const std::string& bad : std::vector<std::string>{"\x80", "a\xC0\xAFz", "\xED\xA0\x80", "\xF4\x90\x80\x80", "ok\xE2\x82",
                          "\xFF\xFE words", std::string("nul\0byte", 8)}) {
    EXPECT_EQ(gpt2().decode(gpt2().encode(bad)), bad);
  }
}

TEST(Gpt2Bpe, CutPointsDoNotChangeTheIds) {
  DS_REQUIRE_GPT2_VOCAB();
  std::mt19937 rng(11);
  const std::string words[] = {"the", " cat", "'s", "  ", "\n", "\n\n", "42", " 7", "!", "?!",
                               "日本", " é", "\t", "'re", "x", "  y", "🎉", "\xC3"};
  for (int round = 0; round < 200; ++round) {
    std::string text;
    for (int k = 0; k < 40; ++k) text += words[rng() % std::size(words)];
    const auto whole = gpt2().encode(text);
    std::vector<uint32_t> parts;
    size_t start = 0;
    for (size_t cut = gpt2().cut_point(text, 1 + rng() % 8); cut != std::string::npos;
         cut = gpt2().cut_point(text, cut + 1 + rng() % 8)) {
      gpt2().encode(std::string_view(text).substr(start, cut - start), parts);
      start = cut;
    }
    gpt2().encode(std::string_view(text).substr(start), parts);
    ASSERT_EQ(parts, whole) << nlohmann::json(text).dump();
  }
}

TEST(Gpt2PreTokenize, PiecesFollowThePattern) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(gpt2_pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(gpt2_pieces("a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(gpt2_pieces("x\n\ny"), (V{"x", "\n", "\n", "y"}));
  EXPECT_EQ(gpt2_pieces("end  "), (V{"end", "  "}));
  EXPECT_EQ(gpt2_pieces("it's 're''s"), (V{"it", "'s", " '", "re", "''", "s"}));
  EXPECT_EQ(gpt2_pieces("x12 3.5"), (V{"x", "12", " 3", ".", "5"}));
  EXPECT_EQ(gpt2_pieces(" !? a"), (V{" !?", " a"}));
  // U+0085 (NEL) is White_Space; combining marks (Mn) are symbols, not letters.
  EXPECT_EQ(gpt2_pieces("a\xC2\x85\xC2\x85" "b"), (V{"a", "\xC2\x85", "\xC2\x85", "b"}));
  EXPECT_EQ(gpt2_pieces("e\xCC\x81t"), (V{"e", "\xCC\x81", "t"}));
  EXPECT_EQ(gpt2_pieces("\xFF" "a"), (V{"\xFF", "a"}));
}

// A tiny vocabulary in GPT-2's alphabet: the 256 byte tokens (ids 0..255) plus `extra`.
std::string tiny_vocab(const std::vector<std::string>& extra) {
  nlohmann::json j = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) {
    const char32_t c = gpt2_byte_to_unicode(static_cast<uint8_t>(b));
    std::string key;
    if (c < 0x80) key.push_back(static_cast<char>(c));
    else key += {char(0xC0 | (c >> 6)), char(0x80 | (c & 0x3F))};
    j[key] = b;
  }
  for (size_t i = 0; i < extra.size(); ++i) j[extra[i]] = 256 + i;
  return j.dump();
}

TEST(Gpt2Bpe, TinyVocabularyMergesInRankOrder) {
  const auto tok = Gpt2Tokenizer::parse(tiny_vocab({"ab", "abc", "bc", "<|endoftext|>"}),
                                        "#version: 0.2\nb c\na b\nab c\n", "v.json", "m.txt");
  EXPECT_EQ(tok->vocab_size(), 260);
  EXPECT_EQ(tok->document_token(), 259);
  EXPECT_EQ(tok->encode("abc"), (std::vector<uint32_t>{'a', 258}));  // "b c" ranks first
  EXPECT_EQ(tok->encode("ab"), (std::vector<uint32_t>{256}));
}

TEST(Gpt2Bpe, BadFilesAreNamed) {
  const std::string v = tiny_vocab({"ab"});
  auto parse = [&](std::string vocab, std::string merges) {
    return error_of([&] { Gpt2Tokenizer::parse(vocab, merges, "dir/vocab.json", "dir/merges.txt"); });
  };
  EXPECT_NE(parse("{\"a\": 1,\n \"b\": }", "").find("dir/vocab.json: not valid JSON at line 2"),
            std::string::npos) << parse("{\"a\": 1,\n \"b\": }", "");
  EXPECT_NE(parse("[1, 2]", "").find("expected a JSON object"), std::string::npos);
  EXPECT_NE(parse("{\"a\": \"x\"}", "").find("token \"a\": expected an id in [0, 1)"),
            std::string::npos);
  EXPECT_NE(parse("{\"a\": 0, \"b\": 0}", "").find("id 0 is given twice"), std::string::npos);
  EXPECT_NE(parse("{\"a\": 0}", "").find("the byte token for byte 0"), std::string::npos);
  EXPECT_NE(parse(v, "a b\nq z\n").find("dir/merges.txt:2: merge \"q z\": the merged token \"qz\" "
                                        "is not in the vocabulary dir/vocab.json"),
            std::string::npos) << parse(v, "a b\nq z\n");
  EXPECT_NE(parse(v, "a b\nab zz\n").find("dir/merges.txt:2: merge \"ab zz\": token \"zz\" is not"),
            std::string::npos);
  EXPECT_NE(parse(v, "a b c\n").find("dir/merges.txt:1: expected two tokens"), std::string::npos);
  TempDir dir;
  EXPECT_NE(error_of([&] { Gpt2Tokenizer::from_dir(dir.path()); })
                .find("holds neither vocab.json + merges.txt nor encoder.json + vocab.bpe"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Gpt2Tokenizer::from_dir(dir.file("nope")); }).find("is not a directory"),
            std::string::npos);
}

TEST(Gpt2Bpe, DecodeNamesABadId) {
  const auto tok = Gpt2Tokenizer::parse(tiny_vocab({}), "", "v", "m");
  EXPECT_NE(error_of([&] { tok->decode(std::vector<uint32_t>{1, 256}); })
                .find("token 256 at index 1 is outside the vocabulary (0..255)"),
            std::string::npos);
}

}  // namespace
}  // namespace ds::rt::data
