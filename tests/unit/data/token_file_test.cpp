// Token files: round trip through the writer and the mmap reader, byte layout against llm.c's
// format, and every bad input with its exact message.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <iterator>
#include <vector>

#include "common/error.h"
#include "data/token_file.h"
#include "test_dir.h"

namespace ds::rt::data {
namespace {

using test::TempDir;
using test::write_bytes;

// A header + payload as llm.c writes it, with fields we can corrupt.
std::vector<char> raw_file(int32_t magic, int32_t version, int32_t count,
                           const std::vector<uint16_t>& tokens) {
  std::vector<char> bytes(1024 + tokens.size() * 2, 0);
  int32_t h[3] = {magic, version, count};
  std::memcpy(bytes.data(), h, sizeof(h));
  if (!tokens.empty()) std::memcpy(bytes.data() + 1024, tokens.data(), tokens.size() * 2);
  return bytes;
}

std::string error_of(const std::string& path, int64_t vocab = 0) {
  try {
    TokenFile f(path, vocab);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TokenFile, RoundTripAndLayout) {
  TempDir dir;
  const std::string path = dir.file("t.bin");
  std::vector<uint16_t> tokens = {0, 1, 255, 256, 65535, 42, 7};
  write_token_file(path, tokens);
  EXPECT_EQ(std::filesystem::file_size(path), 1024u + 2 * tokens.size());
  // No temporary left behind.
  int entries = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);

  TokenFile f(path);
  EXPECT_EQ(f.size(), 7);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(std::vector<uint16_t>(f.tokens().begin(), f.tokens().end()), tokens);

  // The bytes are exactly llm.c's: magic, version, count, zeros, little-endian uint16.
  auto expect = raw_file(20240520, 1, 7, tokens);
  std::ifstream in(path, std::ios::binary);
  std::vector<char> got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, expect);

  // A file written by hand in llm.c's layout reads the same.
  write_bytes(dir.file("llmc.bin"), expect.data(), expect.size());
  TokenFile g(dir.file("llmc.bin"));
  EXPECT_EQ(std::vector<uint16_t>(g.tokens().begin(), g.tokens().end()), tokens);

  // Moving keeps the mapping valid.
  TokenFile moved(std::move(g));
  EXPECT_EQ(moved.size(), 7);
  EXPECT_EQ(moved.tokens()[4], 65535);
}

TEST(TokenFile, OverwriteIsAtomicReplacement) {
  TempDir dir;
  const std::string path = dir.file("t.bin");
  write_token_file(path, std::vector<uint16_t>{1, 2, 3});
  TokenFile before(path);
  write_token_file(path, std::vector<uint16_t>{9, 8});
  // The old mapping still sees the old file (rename replaced the directory entry only).
  EXPECT_EQ(before.tokens()[2], 3);
  TokenFile after(path);
  EXPECT_EQ(after.size(), 2);
}

TEST(TokenFile, MissingFile) {
  TempDir dir;
  const std::string path = dir.file("nope.bin");
  try {
    TokenFile f(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "token file " + path + ": no such file");
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(e.hint().find("dstrain data prepare"), std::string::npos);
  }
}

TEST(TokenFile, TruncatedHeader) {
  TempDir dir;
  const std::string path = dir.file("short.bin");
  auto bytes = raw_file(20240520, 1, 0, {});
  write_bytes(path, bytes.data(), 100);
  EXPECT_EQ(error_of(path), "token file " + path +
                                ": truncated header: the file has 100 bytes, the header alone "
                                "is 1024 bytes (256 int32)");
  write_bytes(path, bytes.data(), 0);
  EXPECT_EQ(error_of(path), "token file " + path +
                                ": truncated header: the file has 0 bytes, the header alone is "
                                "1024 bytes (256 int32)");
}

TEST(TokenFile, WrongMagic) {
  TempDir dir;
  const std::string path = dir.file("m.bin");
  auto bytes = raw_file(12345, 1, 2, {1, 2});
  write_bytes(path, bytes.data(), bytes.size());
  EXPECT_EQ(error_of(path),
            "token file " + path + ": wrong magic 12345, expected 20240520 (llm.c token file, uint16) or 20240801 (uint32)");
  // An llm.c model checkpoint passed by mistake says so in the hint.
  bytes = raw_file(20240326, 3, 2, {1, 2});
  write_bytes(path, bytes.data(), bytes.size());
  try {
    TokenFile f(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "token file " + path + ": wrong magic 20240326, expected 20240520 (llm.c token file, uint16) or 20240801 (uint32)");
    EXPECT_EQ(e.hint(), "this is an llm.c model checkpoint, not a token file");
  }
}

TEST(TokenFile, WrongVersion) {
  TempDir dir;
  const std::string path = dir.file("v.bin");
  auto bytes = raw_file(20240520, 2, 2, {1, 2});
  write_bytes(path, bytes.data(), bytes.size());
  EXPECT_EQ(error_of(path), "token file " + path + ": unsupported version 2, expected 1");
}

TEST(TokenFile, CountDisagreesWithSize) {
  TempDir dir;
  const std::string path = dir.file("c.bin");
  auto bytes = raw_file(20240520, 1, 5, {1, 2, 3});  // says 5, holds 3
  write_bytes(path, bytes.data(), bytes.size());
  EXPECT_EQ(error_of(path), "token file " + path +
                                ": the header says 5 tokens (1034 bytes with the header) but the "
                                "file has 1030 bytes");
  bytes = raw_file(20240520, 1, 3, {1, 2, 3});
  write_bytes(path, bytes.data(), bytes.size() - 1);  // a torn last token
  EXPECT_EQ(error_of(path), "token file " + path +
                                ": the header says 3 tokens (1030 bytes with the header) but the "
                                "file has 1029 bytes");
  bytes = raw_file(20240520, 1, -4, {});
  write_bytes(path, bytes.data(), bytes.size());
  EXPECT_EQ(error_of(path), "token file " + path +
                                ": the header says -4 tokens (1016 bytes with the header) but the "
                                "file has 1024 bytes");
}

TEST(TokenFile, EmptyCorpus) {
  TempDir dir;
  const std::string path = dir.file("e.bin");
  auto bytes = raw_file(20240520, 1, 0, {});
  write_bytes(path, bytes.data(), bytes.size());
  EXPECT_EQ(error_of(path), "token file " + path + ": empty corpus (the header says 0 tokens)");
  try {
    write_token_file(path, {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "token file " + path + ": refusing to write an empty corpus (0 tokens)");
  }
}

TEST(TokenFile, TokenOutsideVocab) {
  TempDir dir;
  const std::string path = dir.file("vocab.bin");
  write_token_file(path, std::vector<uint16_t>{10, 255, 256, 300, 3});
  EXPECT_EQ(error_of(path, 256), "token file " + path +
                                     ": token 256 at index 2 is >= the model's vocab_size 256");
  EXPECT_EQ(error_of(path, 301), "(no error)");
  TokenFile f(path);  // no vocab given: no check
  EXPECT_THROW(f.check_vocab(100), Error);
  EXPECT_NO_THROW(f.check_vocab(65536));
  try {
    f.check_vocab(0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "token file " + path + ": vocab_size 0 is out of range (at least 1)");
  }
}

TEST(TokenFile, WriterReportsUnwritableDirectory) {
  TempDir dir;
  const std::string path = dir.file("missing-dir/t.bin");
  try {
    write_token_file(path, std::vector<uint16_t>{1});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kSystem);
    EXPECT_NE(std::string(e.what()).find("token file " + path + ": cannot create"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ds::rt::data

namespace ds::rt::data {
namespace {

TEST(TokenFile, Uint32FormatIsLlmcsLlama3Layout) {
  TempDir dir;
  const std::string path = dir.file("u32.bin");
  const std::vector<uint32_t> tokens = {0, 65535, 65536, 128255, 7};
  write_token_file(path, tokens, TokenFormat::kU32);
  EXPECT_EQ(std::filesystem::file_size(path), 1024u + 4 * tokens.size());
  std::ifstream in(path, std::ios::binary);
  int32_t h[3];
  in.read(reinterpret_cast<char*>(h), sizeof(h));
  EXPECT_EQ(h[0], 20240801);
  EXPECT_EQ(h[1], 7);
  EXPECT_EQ(h[2], 5);
  TokenFile f(path, 128256);
  EXPECT_EQ(f.format(), TokenFormat::kU32);
  EXPECT_EQ(std::vector<uint32_t>(f.tokens32().begin(), f.tokens32().end()), tokens);
  EXPECT_EQ(f.max_token(), 128255u);
  std::vector<int32_t> out(3);
  f.copy(1, 3, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{65535, 65536, 128255}));
  EXPECT_EQ(error_of(path, 100000), "token file " + path +
                                        ": token 128255 at index 3 is >= the model's vocab_size 100000");
  EXPECT_EQ(token_format_for_vocab(65536), TokenFormat::kU16);
  EXPECT_EQ(token_format_for_vocab(65537), TokenFormat::kU32);
}

TEST(TokenFile, Uint16IsNeverTruncated) {
  TempDir dir;
  const std::string path = dir.file("narrow.bin");
  try {
    write_token_file(path, std::vector<uint32_t>{1, 2, 70000}, TokenFormat::kU16);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "token file " + path +
                                         ": token 70000 at index 2 does not fit llm.c's uint16 "
                                         "format (ids up to 65535)");
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  {
    TokenFileWriter w(path, TokenFormat::kU16);
    w.append(std::vector<uint32_t>{1, 2});
    EXPECT_THROW(w.append(std::vector<uint32_t>{3, 65536}), Error);
  }  // destroyed unfinished: no file, no temporary
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(TokenFile, StreamingWriterAppendsInOrder) {
  TempDir dir;
  const std::string path = dir.file("s.bin");
  TokenFileWriter w(path, TokenFormat::kU16);
  w.append(std::vector<uint32_t>{5, 6});
  w.append(std::vector<uint32_t>{});
  w.append(std::vector<uint32_t>{7});
  EXPECT_FALSE(std::filesystem::exists(path));  // only the temporary until finish()
  w.finish();
  TokenFile f(path);
  EXPECT_EQ(std::vector<uint16_t>(f.tokens().begin(), f.tokens().end()),
            (std::vector<uint16_t>{5, 6, 7}));
  TokenFileWriter empty(dir.file("e.bin"), TokenFormat::kU32);
  EXPECT_THROW(empty.finish(), Error);
}

}  // namespace
}  // namespace ds::rt::data
