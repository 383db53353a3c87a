// `dstrain data prepare` through the real binary: token counts, the split, the files' contents,
// and its errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "data/token_file.h"
#include "data/tokenizer.h"
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

}  // namespace
}  // namespace ds::rt::data
