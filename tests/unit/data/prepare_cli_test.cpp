// `dstrain data prepare` through the real binary: token counts, the split, the files' contents,
// and its errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "data/token_file.h"
#include "data/gpt2_bpe.h"
#include "data/hf_tokenizer.h"
#include "data/tokenizer.h"
#include "gpt2_vocab.h"
#include "support/run_command.h"
#include "test_dir.h"

namespace ds::rt::data {
namespace {

using test::dstrain;
using test::run_command;
using test::TempDir;

void write_text(const std::string& path, const std::string& text) {
  test::write_bytes(path, text.data(), text.size());
}

TEST(DataPrepare, SplitsTheConcatenatedText) {
  TempDir dir;
  // 60 + 40 = 100 bytes; val = the last 10.
  const std::string a(60, 'a'), b = std::string(30, 'b') + "0123456789";
  write_text(dir.file("a.txt"), a);
  write_text(dir.file("b.txt"), b);
  const std::string out = dir.file("out");
  auto r = run_command(dstrain() + " data prepare --input " + dir.file("a.txt") + " " +
                       dir.file("b.txt") + " --output " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(out + "/train.bin: 90 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(out + "/val.bin: 10 tokens"), std::string::npos) << r.out;

  TokenFile train(out + "/train.bin", kByteVocabSize), val(out + "/val.bin", kByteVocabSize);
  EXPECT_EQ(decode_bytes(train.tokens()), a + std::string(30, 'b'));
  EXPECT_EQ(decode_bytes(val.tokens()), "0123456789");
}

TEST(DataPrepare, ValFractionOptionAndZero) {
  TempDir dir;
  write_text(dir.file("t.txt"), std::string(1000, 'x'));
  auto r = run_command(dstrain() + " data prepare --input " + dir.file("t.txt") + " --output " +
                       dir.file("o") + " --val-fraction 0.25");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(TokenFile(dir.file("o/train.bin")).size(), 750);
  EXPECT_EQ(TokenFile(dir.file("o/val.bin")).size(), 250);

  r = run_command(dstrain() + " data prepare --input " + dir.file("t.txt") + " --output " +
                  dir.file("z") + " --val-fraction 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(TokenFile(dir.file("z/train.bin")).size(), 1000);
  EXPECT_FALSE(std::filesystem::exists(dir.file("z/val.bin")));
}

TEST(DataPrepare, Errors) {
  TempDir dir;
  auto r = run_command(dstrain() + " data prepare --input " + dir.file("missing.txt") +
                       " --output " + dir.file("o"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("data prepare: input " + dir.file("missing.txt") + ": no such file"),
            std::string::npos)
      << r.err;

  write_text(dir.file("empty.txt"), "");
  r = run_command(dstrain() + " data prepare --input " + dir.file("empty.txt") + " --output " +
                  dir.file("o"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("hold no text: empty corpus"), std::string::npos) << r.err;

  write_text(dir.file("t.txt"), "abc");
  r = run_command(dstrain() + " data prepare --input " + dir.file("t.txt") + " --output " +
                  dir.file("o") + " --val-fraction 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--val-fraction 1 is outside [0, 1)"), std::string::npos) << r.err;

  r = run_command(dstrain() + " data prepare --output " + dir.file("o"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--input"), std::string::npos) << r.err;
}

std::vector<uint32_t> ids_of(const TokenFile& f) {
  std::vector<uint32_t> out;
  for (int64_t i = 0; i < f.size(); ++i) out.push_back(f.token(i));
  return out;
}

TEST(DataPrepare, Gpt2WithShardsAndInspect) {
  DS_REQUIRE_GPT2_VOCAB();
  TempDir dir;
  const std::string a = "Hello world. It's 2024!\n\nIn the beginning", b = "God created\n";
  write_text(dir.file("a.txt"), a);
  write_text(dir.file("b.txt"), b);
  const std::string base = dstrain() + " data prepare --tokenizer gpt2 --vocab " +
                           test::gpt2_vocab_dir() + " --input " + dir.file("a.txt") + " " +
                           dir.file("b.txt") + " --val-fraction 0 --no-progress";
  auto r = run_command(base + " --output " + dir.file("one") + " --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto gpt2 = Gpt2Tokenizer::from_dir(test::gpt2_vocab_dir());
  std::vector<uint32_t> expected = {kGpt2EndOfText};
  gpt2->encode(a, expected);
  expected.push_back(kGpt2EndOfText);
  gpt2->encode(b, expected);
  EXPECT_EQ(ids_of(TokenFile(dir.file("one/train.bin"))), expected);
  EXPECT_TRUE(std::filesystem::exists(dir.file("one/gpt2_tokenizer.bin")));
  // Shards of 5 tokens, 3 threads, tiny chunks: the same stream.
  r = run_command(base + " --output " + dir.file("sh") + " --threads 3 --chunk-bytes 3 --shard-tokens 5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t shards = (expected.size() + 4) / 5;
  std::vector<uint32_t> joined;
  for (size_t k = 0; k < shards; ++k) {
    const auto part = ids_of(TokenFile(dir.file(fmt::format("sh/train_{:06d}.bin", k))));
    EXPECT_EQ(part.size(), k + 1 < shards ? 5u : expected.size() - 5 * (shards - 1));
    joined.insert(joined.end(), part.begin(), part.end());
  }
  EXPECT_EQ(joined, expected);
  // A second run with larger shards removes the stale ones a glob would pick up.
  r = run_command(base + " --output " + dir.file("sh") + " --shard-tokens 1000");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("removed stale shard " + dir.file("sh/train_000001.bin")), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir.file("sh/train_000001.bin")));
  r = run_command(dstrain() + " data inspect " + dir.file("one/train.bin") + " --tokens 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("format: uint16 (llm.c, magic 20240520 version 1)"), std::string::npos);
  EXPECT_NE(r.out.find("tokens: " + std::to_string(expected.size())), std::string::npos);
  EXPECT_NE(r.out.find("first 3 ids: [50256, 15496, 995]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(beside the file): \"<|endoftext|>Hello world\""), std::string::npos) << r.out;
}

// A Llama-3-layout tokenizer.json (tests/data/hf_tokenizer_make.py): <|begin_of_text|> before
// each document, special tokens in the text kept, the same ids on 3 threads with tiny chunks.
TEST(DataPrepare, HfTokenizerJsonAndInspect) {
  DS_REQUIRE_GPT2_VOCAB();
  TempDir dir;
  auto r = run_command("python3 " + test::source_path("tests/data/hf_tokenizer_make.py") + " " +
                       test::gpt2_vocab_dir() + " " + dir.file("hf"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string a = "Hello world.\nIt's 2024!<|eot_id|>\n\nIn the beginning\n", b = "God created 12345\n";
  write_text(dir.file("a.txt"), a);
  write_text(dir.file("b.txt"), b);
  const std::string base = dstrain() + " data prepare --tokenizer hf --vocab " + dir.file("hf/llama3") +
                           " --input " + dir.file("a.txt") + " " + dir.file("b.txt") +
                           " --val-fraction 0 --no-progress";
  r = run_command(base + " --output " + dir.file("one") + " --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto hf = HfTokenizer::from_path(dir.file("hf/llama3"));
  std::vector<uint32_t> expected = {50257};
  hf->encode(a, expected);
  expected.push_back(50257);
  hf->encode(b, expected);
  EXPECT_EQ(ids_of(TokenFile(dir.file("one/train.bin"))), expected);
  EXPECT_NE(std::find(expected.begin(), expected.end(), 50261u), expected.end());  // <|eot_id|>
  r = run_command(base + " --output " + dir.file("many") + " --threads 3 --chunk-bytes 5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ids_of(TokenFile(dir.file("many/train.bin"))), expected);
  r = run_command(dstrain() + " data inspect " + dir.file("one/train.bin") + " --tokens 3 --tokenizer hf --vocab " +
                  dir.file("hf/llama3/tokenizer.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"<|begin_of_text|>Hello world\""), std::string::npos) << r.out;
  r = run_command(dstrain() + " data prepare --tokenizer hf --vocab " + dir.file("nowhere") + " --input " +
                  dir.file("a.txt") + " --output " + dir.file("x"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("nowhere is neither a directory holding tokenizer.json"), std::string::npos) << r.err;
}

// A GPT-2-style vocabulary of 70,000 tokens (the 256 bytes, then filler) goes to uint32 files.
TEST(DataPrepare, VocabularyOver65536WritesUint32) {
  TempDir dir;
  std::string vocab = "{";
  for (int b = 0; b < 256; ++b) {
    const char32_t c = gpt2_byte_to_unicode(static_cast<uint8_t>(b));
    std::string key = c < 0x80 ? std::string(1, static_cast<char>(c))
                               : std::string{char(0xC0 | (c >> 6)), char(0x80 | (c & 0x3F))};
    if (key == "\"" || key == "\\") key = "\\" + key;
    vocab += fmt::format("\"{}\": {}, ", key, b);
  }
  for (int i = 256; i < 70000; ++i) vocab += fmt::format("\"<f{}>\": {}, ", i, i);
  vocab += "\"<|endoftext|>\": 70000}";
  std::filesystem::create_directories(dir.file("v"));
  write_text(dir.file("v/vocab.json"), vocab);
  write_text(dir.file("v/merges.txt"), "#version: 0.2\n");
  write_text(dir.file("t.txt"), "abc");
  auto r = run_command(dstrain() + " data prepare --tokenizer gpt2 --vocab " + dir.file("v") +
                       " --input " + dir.file("t.txt") + " --output " + dir.file("o") +
                       " --val-fraction 0 --no-progress");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  TokenFile f(dir.file("o/train.bin"));
  EXPECT_EQ(f.format(), TokenFormat::kU32);
  EXPECT_EQ(ids_of(f), (std::vector<uint32_t>{70000, 'a', 'b', 'c'}));
}

TEST(DataPrepare, SentencePieceTrainedAgreesWithSpmEncode) {
  TempDir dir;
  std::string text;
  const char* words[] = {"light", "darkness", "waters", "firmament", "evening", "morning", "day"};
  for (int i = 0; i < 3000; ++i) text += std::string(words[i % 7]) + (i % 9 == 0 ? ".\n" : " ");
  write_text(dir.file("t.txt"), text);
  auto r = run_command(dstrain() + " data prepare --tokenizer sentencepiece --train-vocab 280 "
                       "--model-type unigram --input " + dir.file("t.txt") + " --output " +
                       dir.file("o") + " --val-fraction 0 --no-progress --threads 2 --chunk-bytes 100");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_command("spm_encode --model=" + dir.file("o/tokenizer.model") + " --output_format=id < " +
                  dir.file("t.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<uint32_t> theirs = {1};  // BOS before the document
  std::istringstream in(r.out);
  for (uint32_t id; in >> id;) theirs.push_back(id);
  EXPECT_EQ(ids_of(TokenFile(dir.file("o/train.bin"))), theirs);
}

TEST(DataPrepare, TokenizerErrors) {
  TempDir dir;
  write_text(dir.file("t.txt"), "abc");
  const std::string in = dstrain() + " data prepare --input " + dir.file("t.txt") + " --output " +
                         dir.file("o");
  auto r = run_command(in + " --tokenizer gpt2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("tokenizer gpt2 needs its vocabulary directory"), std::string::npos) << r.err;
  r = run_command(in + " --tokenizer gpt2 --vocab " + dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("holds neither vocab.json + merges.txt nor encoder.json + vocab.bpe"),
            std::string::npos) << r.err;
  r = run_command(in + " --tokenizer sentencepiece");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("needs exactly one of --model FILE"), std::string::npos) << r.err;
  r = run_command(in + " --train-vocab 100");
  EXPECT_NE(r.err.find("--train-vocab needs --tokenizer sentencepiece"), std::string::npos) << r.err;
  write_text(dir.file("big.txt"), std::string(2000, 'x'));
  r = run_command(dstrain() + " data inspect " + dir.file("big.txt"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("token file " + dir.file("big.txt") + ": wrong magic"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace ds::rt::data
