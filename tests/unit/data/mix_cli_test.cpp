// `dstrain data mix` through the real binary: a blend's weights and realised shares as JSON (no
// token file exists: the draw needs only the config), the table, a config that is not a blend,
// and its errors.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "data/blend.h"
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

TEST(DataMix, JsonOfABlend) {
  TempDir dir;
  write_text(dir.file("c.json"), R"({"train_micro_batch_size_per_gpu": 2,
    "data": {"train": [{"path": "web/*.bin", "weight": 7}, {"path": "code.bin", "weight": 2},
                       {"path": "/abs/books.bin", "weight": 1}, {"path": "none.bin", "weight": 0}]},
    "training": {"seed": 99}})");
  auto r = run_command(dstrain() + " data mix --config " + dir.file("c.json") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 1u) << r.out;
  const auto& s = j.at("sources");
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].at("path"), dir.file("web/*.bin"));
  EXPECT_EQ(s[1].at("path"), dir.file("code.bin"));
  EXPECT_EQ(s[2].at("path"), "/abs/books.bin");
  const double weights[] = {0.7, 0.2, 0.1, 0};
  // The shares are the draw's over the first 10,000 windows with training.seed, exactly.
  const BlendDraw draw({7, 2, 1, 0}, 99);
  int count[4] = {};
  for (int64_t g = 0; g < 10000; ++g) ++count[draw.source(g)];
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(s[i].size(), 3u);
    EXPECT_DOUBLE_EQ(s[i].at("weight").get<double>(), weights[i]);
    EXPECT_DOUBLE_EQ(s[i].at("share").get<double>(), count[i] / 10000.0);
    EXPECT_NEAR(s[i].at("share").get<double>(), weights[i], 0.01);
  }
  EXPECT_EQ(count[3], 0);

  r = run_command(dstrain() + " data mix --config " + dir.file("c.json") + " --windows 100");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(dir.file("c.json") + ": 4 sources, the first 100 windows (seed 99)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(dir.file("code.bin")), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0.7000"), std::string::npos) << r.out;
}

TEST(DataMix, OneCorpusIsOneSource) {
  TempDir dir;
  write_text(dir.file("c.json"),
             R"({"train_micro_batch_size_per_gpu": 2, "data": {"train": "t.bin"}})");
  auto r = run_command(dstrain() + " data mix --config " + dir.file("c.json") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out),
            nlohmann::json::parse(R"({"sources": [{"path": ")" + dir.file("t.bin") +
                                  R"(", "weight": 1.0, "share": 1.0}]})"));
}

TEST(DataMix, Errors) {
  TempDir dir;
  write_text(dir.file("nodata.json"), R"({"train_micro_batch_size_per_gpu": 2})");
  auto r = run_command(dstrain() + " data mix --config " + dir.file("nodata.json"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("data mix: " + dir.file("nodata.json") + ": $.data.train: missing"),
            std::string::npos)
      << r.err;
  write_text(
      dir.file("zero.json"),
      R"({"train_micro_batch_size_per_gpu": 2, "data": {"train": [{"path": "a", "weight": 0}]}})");
  r = run_command(dstrain() + " data mix --config " + dir.file("zero.json"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("$.data.train: the weights of the 1 sources sum to 0"), std::string::npos)
      << r.err;
  write_text(dir.file("ok.json"),
             R"({"train_micro_batch_size_per_gpu": 2, "data": {"train": "t.bin"}})");
  r = run_command(dstrain() + " data mix --config " + dir.file("ok.json") + " --windows 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("data mix: --windows must be at least 1, got 0"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace ds::rt::data
