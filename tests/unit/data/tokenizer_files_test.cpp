// llm.c's tokenizer file (round trip; a file in llm.c's own script layout, written by
// tests/data/llmc_write_tokenizer.py, decodes as our GPT-2 does; bad files named), SentencePiece
// (a model we train encodes like spm_encode, round-trips), and the parallel encoder (ids
// independent of threads, chunk and read sizes; the split).
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "data/encode_pipeline.h"
#include "data/gpt2_bpe.h"
#include "data/llmc_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"
#include "gpt2_vocab.h"
#include "support/run_command.h"
#include "test_dir.h"

namespace ds::rt::data {
namespace {

using test::TempDir;

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void write_text(const std::string& path, const std::string& text) {
  test::write_bytes(path, text.data(), text.size());
}

// Pseudo-English with code-like lines, deterministic.
std::string generated_text(size_t lines, uint32_t seed) {
  static const char* words[] = {"the", "and", "of", "to", "in", "light", "was", "God", "said",
                                "let", "there", "be", "earth", "waters", "x", "return", "int",
                                "for", "(i", "=", "0;", "i++)", "{", "}", "42", "3.14", "don't",
                                "we'll", "naïve", "café", "日本", "\t", "  "};
  std::mt19937 rng(seed);
  std::string s;
  for (size_t l = 0; l < lines; ++l) {
    const int n = 3 + static_cast<int>(rng() % 12);
    for (int w = 0; w < n; ++w) s += std::string(w ? " " : "") + words[rng() % std::size(words)];
    s += rng() % 5 == 0 ? ".\n\n" : "\n";
  }
  return s;
}

TEST(LlmcTokenizer, LlmcsOwnLayoutDecodesAsOurGpt2) {
  DS_REQUIRE_GPT2_VOCAB();
  TempDir dir;
  const std::string theirs = dir.file("gpt2_tokenizer.bin");
  auto r = test::run_command("python3 " + test::source_path("tests/data/llmc_write_tokenizer.py") +
                             " " + test::gpt2_vocab_dir() + "/encoder.json " + theirs);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto llmc = LlmcTokenizer::from_file(theirs);
  const auto gpt2 = Gpt2Tokenizer::from_dir(test::gpt2_vocab_dir());
  EXPECT_EQ(llmc->vocab_size(), 50257);
  EXPECT_EQ(llmc->document_token(), 50256);
  for (uint32_t id = 0; id < 50257; ++id) ASSERT_EQ(llmc->tokens()[id], gpt2->token_bytes(id)) << id;
  EXPECT_EQ(llmc->decode(std::vector<uint32_t>{15496, 995}), "Hello world");
  // Ours is byte for byte theirs.
  write_llmc_tokenizer(dir.file("ours.bin"), *gpt2);
  EXPECT_EQ(test::read_file(dir.file("ours.bin")), test::read_file(theirs));
}

TEST(LlmcTokenizer, RoundTripAndBadFiles) {
  LlmcTokenizer tok({"a", "bc", "\xFF", "<eot>"}, 3);
  TempDir dir;
  write_llmc_tokenizer(dir.file("t.bin"), tok);
  const auto back = LlmcTokenizer::from_file(dir.file("t.bin"));
  EXPECT_EQ(back->tokens(), tok.tokens());
  EXPECT_EQ(back->document_token(), 3);
  EXPECT_EQ(back->decode(std::vector<uint32_t>{1, 0, 2, 3}), "bca\xFF<eot>");
  EXPECT_THROW(back->encode("x"), Error);
  const std::string good = test::read_file(dir.file("t.bin"));
  auto parse = [](const std::string& bytes) {
    return error_of([&] { LlmcTokenizer::parse(bytes, "f.bin"); });
  };
  EXPECT_EQ(parse(good.substr(0, 100)), "llm.c tokenizer f.bin: truncated header: 100 bytes, the header alone is 1024");
  std::string bad = good;
  bad[0] = 1;
  EXPECT_NE(parse(bad).find("wrong magic"), std::string::npos);
  EXPECT_EQ(parse(good.substr(0, good.size() - 2)),
            "llm.c tokenizer f.bin: token 3 needs 5 bytes, the file ends after 3");
  EXPECT_EQ(parse(good + "zz"), "llm.c tokenizer f.bin: 2 bytes after the last of 4 tokens");
  bad = good;
  bad[1024] = 0;
  EXPECT_EQ(parse(bad), "llm.c tokenizer f.bin: token 0 has length 0");
  bad = good;
  bad[12] = 9;  // EOT id 9 of 4
  EXPECT_EQ(parse(bad), "llm.c tokenizer f.bin: EOT id 9 is outside the vocabulary (0..3)");
  bad = good;
  bad[4] = 1;  // version 1 means GPT-2's 50257 tokens
  EXPECT_NE(parse(bad).find("vocab size 4 is invalid (version 1 means GPT-2's 50257)"),
            std::string::npos);
}

// One model for the SentencePiece tests, trained once on generated text.
struct SpmFixture {
  TempDir dir;
  std::string text_path, model;
  SpmFixture() {
    text_path = dir.file("train.txt");
    write_text(text_path, generated_text(4000, 3));
    SentencePieceTraining t;
    t.inputs = {text_path};
    t.model_prefix = dir.file("m");
    t.vocab_size = 400;
    t.model_type = "bpe";
    train_sentencepiece(t);
    model = dir.file("m.model");
  }
};

const SpmFixture& spm() {
  static const SpmFixture f;
  return f;
}

TEST(SentencePiece, AgreesWithSpmEncodeAndRoundTrips) {
  const auto tok = SentencePieceTokenizer::from_file(spm().model);
  EXPECT_EQ(tok->vocab_size(), 400);
  EXPECT_EQ(tok->document_token(), 1);  // <s>
  const std::string text = generated_text(300, 99);  // unseen lines, same words
  write_text(spm().dir.file("probe.txt"), text);
  auto r = test::run_command("spm_encode --model=" + spm().model + " --output_format=id < " +
                             spm().dir.file("probe.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<uint32_t> theirs;
  std::istringstream in(r.out);
  for (uint32_t id; in >> id;) theirs.push_back(id);
  ASSERT_GT(theirs.size(), 1000u);
  EXPECT_EQ(tok->encode(text), theirs);
  // Round trip of a line (the normaliser maps tabs and runs of spaces to one space).
  const std::string line = "let there be light and the earth was 42";
  EXPECT_EQ(tok->decode(tok->encode(line)), line);
  EXPECT_EQ(tok->decode(tok->encode("日本 café")), "日本 café");  // byte fallback keeps all
  EXPECT_NE(error_of([&] { tok->decode(std::vector<uint32_t>{400}); })
                .find("token 400 at index 0 is outside the vocabulary (0..399)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { SentencePieceTokenizer::from_file(spm().text_path); })
                .find("sentencepiece model " + spm().text_path + ": cannot load"),
            std::string::npos);
  EXPECT_NE(error_of([&] { SentencePieceTokenizer::parse("garbage", "g.model"); })
                .find("sentencepiece model g.model: cannot load"),
            std::string::npos);
}

TEST(SentencePiece, UnigramTrainsAndTooSmallAVocabIsNamed) {
  TempDir dir;
  SentencePieceTraining t;
  t.inputs = {spm().text_path};
  t.model_prefix = dir.file("u");
  t.vocab_size = 340;  // unigram's most for this text is 353
  t.model_type = "unigram";
  train_sentencepiece(t);
  const auto tok = SentencePieceTokenizer::from_file(dir.file("u.model"));
  EXPECT_EQ(tok->decode(tok->encode("in the waters")), "in the waters");
  t.vocab_size = 20;  // below the 256 byte pieces plus the characters
  EXPECT_NE(error_of([&] { train_sentencepiece(t); }).find("sentencepiece training (unigram"),
            std::string::npos);
}

std::vector<uint32_t> encode_with(const Tokenizer& tok, const std::vector<std::string>& files,
                                  EncodeOptions o, std::vector<uint32_t>* part1 = nullptr) {
  std::vector<uint32_t> out;
  encode_files(tok, files, o, [&](std::span<const uint32_t> t, int part) {
    auto& dst = part == 0 || part1 == nullptr ? out : *part1;
    dst.insert(dst.end(), t.begin(), t.end());
  });
  return out;
}

TEST(EncodePipeline, IdsDoNotDependOnThreadsChunksOrReads) {
  DS_REQUIRE_GPT2_VOCAB();
  TempDir dir;
  const std::string a = generated_text(3000, 5), b = generated_text(500, 6);
  write_text(dir.file("a.txt"), a);
  write_text(dir.file("b.txt"), b);
  const auto gpt2 = Gpt2Tokenizer::from_dir(test::gpt2_vocab_dir());
  const auto sp = SentencePieceTokenizer::from_file(spm().model);
  for (const Tokenizer* tok : {static_cast<const Tokenizer*>(gpt2.get()),
                               static_cast<const Tokenizer*>(sp.get())}) {
    std::vector<uint32_t> expected = {static_cast<uint32_t>(tok->document_token())};
    tok->encode(a, expected);
    expected.push_back(static_cast<uint32_t>(tok->document_token()));
    tok->encode(b, expected);
    for (auto [threads, chunk, read] : {std::tuple{1, 1 << 20, 0}, std::tuple{3, 1000, 0},
                                        std::tuple{2, 37, 4096}, std::tuple{4, 5000, 777}}) {
      EncodeOptions o{threads, static_cast<size_t>(chunk), static_cast<size_t>(read), -1};
      ASSERT_EQ(encode_with(*tok, {dir.file("a.txt"), dir.file("b.txt")}, o), expected)
          << tok->name() << " threads " << threads << " chunk " << chunk << " read " << read;
    }
  }
}

TEST(EncodePipeline, SplitsAtTheFirstCutAfterTheByte) {
  TempDir dir;
  write_text(dir.file("a.txt"), std::string(60, 'a'));
  write_text(dir.file("b.txt"), std::string(40, 'b'));
  ByteTokenizer bytes;
  std::vector<uint32_t> val;
  EncodeOptions o{2, 7, 16, 90};
  const auto train = encode_with(bytes, {dir.file("a.txt"), dir.file("b.txt")}, o, &val);
  EXPECT_EQ(train.size(), 90u);
  EXPECT_EQ(val, std::vector<uint32_t>(10, 'b'));
  o.split_byte = 60;  // exactly at the second file
  val.clear();
  EXPECT_EQ(encode_with(bytes, {dir.file("a.txt"), dir.file("b.txt")}, o, &val).size(), 60u);
  EXPECT_EQ(val.size(), 40u);
  EXPECT_NE(error_of([&] { encode_with(bytes, {dir.file("none.txt")}, o); })
                .find("data: input " + dir.file("none.txt")),
            std::string::npos);
}

}  // namespace
}  // namespace ds::rt::data
