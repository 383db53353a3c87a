// Partition arithmetic: every total and group size up to small bounds, aligned boundaries, the
// last rank getting less (or nothing), range shares for the _v collectives.
#include "layout/partition.h"

#include <numeric>

#include <gtest/gtest.h>

#include "common/error.h"

namespace ds::layout {
namespace {

TEST(Partition, CoversEveryElementOnceWithAlignedBoundaries) {
  for (int64_t total = 0; total <= 300; ++total) {
    for (int size = 1; size <= 9; ++size) {
      Partition p(total, size);
      EXPECT_EQ(p.stride() % kAlignElements, 0);
      EXPECT_GE(p.stride() * size, total);
      int64_t next = 0;
      for (int r = 0; r < size; ++r) {
        EXPECT_EQ(p.begin(r), next) << total << "/" << size << " rank " << r;
        EXPECT_EQ(p.begin(r) % kAlignElements == 0 || p.count(r) == 0, true);
        EXPECT_GE(p.count(r), 0);
        EXPECT_LE(p.count(r), p.stride());
        if (r + 1 < size && p.count(r + 1) > 0) {
          EXPECT_EQ(p.count(r), p.stride());
        }
        for (int64_t i = p.begin(r); i < p.end(r); ++i) EXPECT_EQ(p.owner(i), r);
        next = p.end(r);
      }
      EXPECT_EQ(next, total);
      auto c = p.counts();
      EXPECT_EQ(static_cast<int64_t>(std::accumulate(c.begin(), c.end(), size_t{0})), total);
    }
  }
}

TEST(Partition, RangeSharesAreContiguousInRankOrder) {
  Partition p(100, 3);  // stride 48: [0,48) [48,96) [96,100)
  EXPECT_EQ(p.stride(), 48);
  EXPECT_EQ(p.count(2), 4);
  EXPECT_EQ(p.counts_in(40, 98), (std::vector<size_t>{8, 48, 2}));
  EXPECT_EQ(p.counts_in(50, 50), (std::vector<size_t>{0, 0, 0}));
  EXPECT_EQ(p.counts_in(0, 100), p.counts());
  Partition tiny(5, 4);  // everything on rank 0, the others empty
  EXPECT_EQ(tiny.counts(), (std::vector<size_t>{5, 0, 0, 0}));
  EXPECT_EQ(tiny.begin(3), 5);
  EXPECT_THROW(p.counts_in(90, 101), Error);
  EXPECT_THROW(Partition(10, 0), Error);
  EXPECT_THROW(p.begin(3), Error);
  auto r = intersect(0, 10, 5, 20);
  EXPECT_EQ(r.lo, 5);
  EXPECT_EQ(r.hi, 10);
  EXPECT_EQ(intersect(0, 3, 5, 9).size(), 0);
}

}  // namespace
}  // namespace ds::layout
