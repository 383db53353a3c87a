// Shards as one corpus: globs and lists in sorted order, copies across shard boundaries, the
// loader's batches equal to the unsplit file's (with shuffle, across epochs, and on resume), and
// the errors for a glob that matches nothing, a file named twice and an empty shard.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "data/corpus.h"
#include "data/loader.h"
#include "test_dir.h"

namespace ds::rt::data {
namespace {

using test::TempDir;

std::vector<uint16_t> iota_tokens(size_t n) {
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>((i * 7919) % 50000);
  return t;
}

// Writes `all` unsplit to DIR/all.bin and split at `cuts` to DIR/shard_<k>.bin (written in
// reverse order, so that sorting, not creation order, decides).
void write_split(const TempDir& dir, const std::vector<uint16_t>& all, std::vector<size_t> cuts) {
  write_token_file(dir.file("all.bin"), all);
  cuts.insert(cuts.begin(), 0);
  cuts.push_back(all.size());
  for (size_t k = cuts.size() - 1; k-- > 0;) {
    std::span<const uint16_t> part(all.data() + cuts[k], cuts[k + 1] - cuts[k]);
    write_token_file(dir.file("shard_" + std::to_string(k) + ".bin"), part);
  }
}

std::string error_of(const std::vector<std::string>& sources) {
  try {
    TokenCorpus c(sources);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TokenCorpus, GlobIsSortedAndCopiesCrossBoundaries) {
  TempDir dir;
  const auto all = iota_tokens(1000);
  write_split(dir, all, {300, 301, 777});
  TokenCorpus c(dir.file("shard_*.bin"));
  ASSERT_EQ(c.files().size(), 4u);
  EXPECT_EQ(c.files()[0].path(), dir.file("shard_0.bin"));
  EXPECT_EQ(c.size(), 1000);
  std::vector<int32_t> out(1000);
  c.copy(0, 1000, out.data());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), all.begin()));
  c.copy(299, 3, out.data());  // spans three shards, one of them a single token
  EXPECT_EQ(out[0], all[299]);
  EXPECT_EQ(out[2], all[301]);
  // A list in any order reads sorted; a list may mix paths and globs.
  TokenCorpus listed({dir.file("shard_3.bin"), dir.file("shard_[01].bin"), dir.file("shard_2.bin")});
  EXPECT_EQ(listed.files()[3].path(), dir.file("shard_3.bin"));
  EXPECT_EQ(listed.size(), 1000);
}

TEST(TokenCorpus, ShardsGiveTheUnsplitBatchesAndResumeAcrossABoundary) {
  TempDir dir;
  const auto all = iota_tokens(5000);
  write_split(dir, all, {1234, 3001});  // not window-aligned
  TokenCorpus one(dir.file("all.bin")), shards(dir.file("shard_*.bin"));
  for (bool shuffle : {false, true}) {
    LoaderOptions o{4, 16, 2, 1, 3, shuffle, 99};
    DataLoader a(one, o), b(shards, o);
    std::vector<int32_t> ia(64), ta(64), ib(64), tb(64);
    for (int k = 0; k < 3 * b.micro_steps_per_epoch(); ++k) {  // three epochs
      a.next(ia.data(), ta.data());
      b.next(ib.data(), tb.data());
      ASSERT_EQ(ia, ib) << k;
      ASSERT_EQ(ta, tb) << k;
    }
    // Resume a fresh loader on the shards at a micro-step whose window crosses 1234.
    DataLoader fresh(shards, o);
    int64_t k = 0;
    while (!(fresh.window_start(k) < 1234 && fresh.window_start(k) + 65 > 1234)) ++k;
    DataLoader saved(shards, o);
    for (int64_t i = 0; i < k; ++i) saved.next(ib.data(), tb.data());
    fresh.restore(LoaderState::from_json(saved.state().to_json(), "state"));
    fresh.next(ia.data(), ta.data());
    saved.next(ib.data(), tb.data());
    EXPECT_EQ(ia, ib);
    EXPECT_EQ(ta, tb);
  }
}

TEST(TokenCorpus, BadSourcesAreNamed) {
  TempDir dir;
  write_token_file(dir.file("a.bin"), std::vector<uint16_t>{1, 2, 3});
  EXPECT_EQ(error_of({dir.file("nothing_*.bin")}),
            "token files " + dir.file("nothing_*.bin") + ": the pattern matches no file");
  EXPECT_EQ(error_of({dir.file("a.bin"), dir.file("a*.bin")}),
            "token files: " + dir.file("a.bin") + " is named twice (by a path or a glob)");
  // An empty shard (llm.c header, 0 tokens).
  std::vector<char> header(1024, 0);
  const int32_t h[3] = {20240520, 1, 0};
  std::memcpy(header.data(), h, sizeof(h));
  test::write_bytes(dir.file("b.bin"), header.data(), header.size());
  EXPECT_EQ(error_of({dir.file("*.bin")}),
            "token file " + dir.file("b.bin") + ": empty corpus (the header says 0 tokens)");
  EXPECT_EQ(error_of({}), "token files: no file given");
}

}  // namespace
}  // namespace ds::rt::data
