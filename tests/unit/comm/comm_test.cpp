// Collectives with ranks as threads over one in-memory store, for both CPU backends (shm and
// gloo): closed-form expected values per rank (rank r contributes r + 1 + i % 7), odd sizes,
// sizes the group does not divide, zero length, every dtype, subgroups, async overlap,
// send/recv, and deadline errors that name the missing rank.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "comm/comm.h"
#include "common/half.h"
#include "comm/reduce.h"
#include "comm_test_util.h"
#include "common/error.h"
#include "store/hash_store.h"

namespace ds::rt::comm {
namespace {

using testing::all_dtypes;
using testing::buffer;
using testing::get;
using testing::run_on_threads;
using testing::set;
using testing::value;

class CommTest : public ::testing::TestWithParam<Backend> {
 protected:
  CommOptions options(Millis timeout = Millis(30000)) const {
    CommOptions o;
    o.backend = GetParam();
    o.timeout = timeout;
    o.shm_chunk_bytes = 4096;  // small, so that modest sizes stream through several chunks
    return o;
  }
  std::vector<CommPtr> comms(int n, Millis timeout = Millis(30000)) const {
    return make_thread_comms(n, options(timeout));
  }
};

std::string backend_label(const ::testing::TestParamInfo<Backend>& info) {
  return backend_name(info.param);
}

TEST_P(CommTest, ReportsRankSizeBackendAndHosts) {
  auto cs = comms(3);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(cs[static_cast<size_t>(r)]->rank(), r);
    EXPECT_EQ(cs[static_cast<size_t>(r)]->size(), 3);
    EXPECT_EQ(cs[static_cast<size_t>(r)]->backend(), GetParam());
    EXPECT_EQ(cs[static_cast<size_t>(r)]->name(), "world");
    EXPECT_FALSE(cs[static_cast<size_t>(r)]->host_of(2).empty());
  }
}

// bytes_sent_by_this_process counts what the ring algorithm moves per rank; here the 4 ranks
// are threads of one process, so each collective adds 4 ranks' worth.
TEST_P(CommTest, CountsTheRingAlgorithmsBytesPerRank) {
  auto cs = comms(4);
  std::vector<std::vector<uint8_t>> a(4, std::vector<uint8_t>(4000 * 2)), b(4, std::vector<uint8_t>(4000 * 2));
  const uint64_t before = bytes_sent_by_this_process();
  run_on_threads(cs, [&](Comm& c) {
    auto& x = a[static_cast<size_t>(c.rank())];
    auto& y = b[static_cast<size_t>(c.rank())];
    c.all_reduce(x.data(), 4000, DataType::kBFloat16, ReduceOp::kSum);   // 2 * 3/4 * 8000 B
    c.reduce_scatter(x.data(), y.data(), 1000, DataType::kBFloat16, ReduceOp::kSum);  // 3/4 * 8000 B
    c.all_gather(y.data(), x.data(), 1000, DataType::kBFloat16);          // 3/4 * 8000 B
  });
  EXPECT_EQ(bytes_sent_by_this_process() - before, 4u * (12000 + 6000 + 6000));
  auto one = comms(1);
  const uint64_t mid = bytes_sent_by_this_process();
  one[0]->all_reduce(a[0].data(), 4000, DataType::kBFloat16, ReduceOp::kSum);
  EXPECT_EQ(bytes_sent_by_this_process(), mid) << "a group of one sends nothing";
}

TEST_P(CommTest, AllReduceEveryDtypeAndOpAcrossSizes) {
  for (int n : {1, 2, 3, 4}) {
    auto cs = comms(n);
    run_on_threads(cs, [&](Comm& c) {
      for (DataType t : all_dtypes()) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{1037}, size_t{5000}}) {
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
            auto buf = buffer(t, count);
            for (size_t i = 0; i < count; ++i) set(t, buf.data(), i, value(c.rank(), i));
            c.all_reduce(buf.data(), count, t, op);
            for (size_t i = 0; i < count; ++i) {
              const double base = static_cast<double>(i % 7);
              double want = op == ReduceOp::kSum   ? n * (n + 1) / 2.0 + n * base
                            : op == ReduceOp::kMax ? n + base
                                                   : 1 + base;
              ASSERT_EQ(get(t, buf.data(), i), want)
                  << dtype_name(t) << " " << reduce_op_name(op) << " n=" << n
                  << " count=" << count << " i=" << i << " rank " << c.rank();
            }
            ASSERT_EQ(buf.back(), 0xcd) << "wrote past the end";
          }
        }
      }
    });
  }
}

TEST_P(CommTest, AllReduceInt64KeepsHighBitsAndFloatsMatchAcrossRanks) {
  auto cs = comms(3);
  std::vector<std::vector<float>> results(3);
  run_on_threads(cs, [&](Comm& c) {
    std::vector<int64_t> v(9, (int64_t{1} << 40) + c.rank());
    c.all_reduce(v.data(), v.size(), DataType::kInt64, ReduceOp::kSum);
    for (auto x : v) ASSERT_EQ(x, 3 * (int64_t{1} << 40) + 3);
    // Non-representable sums: every rank must still end with the same bits.
    std::vector<float> f(4099);
    for (size_t i = 0; i < f.size(); ++i) f[i] = 0.1f * static_cast<float>(c.rank() + 1) / (i + 3);
    c.all_reduce(f.data(), f.size(), DataType::kFloat32, ReduceOp::kSum);
    results[static_cast<size_t>(c.rank())] = f;
  });
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
  EXPECT_NEAR(results[0][0], 0.1f * 6 / 3, 1e-6);
}

TEST_P(CommTest, ReduceScatterEvenAndInPlace) {
  const int n = 4;
  auto cs = comms(n);
  run_on_threads(cs, [&](Comm& c) {
    for (DataType t : all_dtypes()) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{333}, size_t{2000}}) {
        auto in = buffer(t, count * n);
        for (size_t i = 0; i < count * n; ++i) set(t, in.data(), i, value(c.rank(), i));
        auto out = buffer(t, count);
        c.reduce_scatter(in.data(), out.data(), count, t, ReduceOp::kSum);
        for (size_t i = 0; i < count; ++i) {
          const size_t g = c.rank() * count + i;
          ASSERT_EQ(get(t, out.data(), i), n * (n + 1) / 2.0 + n * static_cast<double>(g % 7))
              << dtype_name(t) << " count " << count << " i " << i;
        }
        ASSERT_EQ(out.back(), 0xcd);
        // In place: output == input + rank * count.
        c.reduce_scatter(in.data(), in.data() + c.rank() * count * dtype_size(t), count, t,
                         ReduceOp::kMax);
        for (size_t i = 0; i < count; ++i) {
          const size_t g = c.rank() * count + i;
          ASSERT_EQ(get(t, in.data(), g), n + static_cast<double>(g % 7));
        }
      }
    }
  });
}

TEST_P(CommTest, ReduceScatterAndAllGatherWithPerRankCounts) {
  const int n = 3;
  auto cs = comms(n);
  // Sizes the group does not divide, including an empty part and parts over several chunks.
  const std::vector<size_t> counts = {1500, 0, 2701};
  const size_t total = 4201;
  run_on_threads(cs, [&](Comm& c) {
    size_t off = 0;
    for (int q = 0; q < c.rank(); ++q) off += counts[static_cast<size_t>(q)];
    const size_t mine = counts[static_cast<size_t>(c.rank())];
    for (DataType t : {DataType::kFloat32, DataType::kBFloat16, DataType::kInt32}) {
      auto in = buffer(t, total);
      for (size_t i = 0; i < total; ++i) set(t, in.data(), i, value(c.rank(), i));
      auto out = buffer(t, mine);
      c.reduce_scatter_v(in.data(), out.data(), counts, t, ReduceOp::kSum);
      for (size_t i = 0; i < mine; ++i) {
        ASSERT_EQ(get(t, out.data(), i), 6 + 3 * static_cast<double>((off + i) % 7));
      }
      // all_gather_v of rank-specific values, then in place.
      auto mine_buf = buffer(t, mine);
      for (size_t i = 0; i < mine; ++i) set(t, mine_buf.data(), i, value(c.rank(), i));
      auto all = buffer(t, total);
      c.all_gather_v(mine_buf.data(), all.data(), counts, t);
      size_t o = 0;
      for (int q = 0; q < n; ++q) {
        for (size_t i = 0; i < counts[static_cast<size_t>(q)]; ++i) {
          ASSERT_EQ(get(t, all.data(), o + i), value(q, i)) << "from rank " << q;
        }
        o += counts[static_cast<size_t>(q)];
      }
      ASSERT_EQ(all.back(), 0xcd);
      auto all2 = buffer(t, total);
      std::memcpy(all2.data() + off * dtype_size(t), mine_buf.data(), mine * dtype_size(t));
      c.all_gather_v(all2.data() + off * dtype_size(t), all2.data(), counts, t);
      ASSERT_EQ(0, std::memcmp(all.data(), all2.data(), total * dtype_size(t)));
    }
  });
}

TEST_P(CommTest, AllGatherEveryDtype) {
  const int n = 4;
  auto cs = comms(n);
  run_on_threads(cs, [&](Comm& c) {
    for (DataType t : all_dtypes()) {
      for (size_t count : {size_t{0}, size_t{5}, size_t{3001}}) {
        auto in = buffer(t, count);
        for (size_t i = 0; i < count; ++i) set(t, in.data(), i, value(c.rank(), i));
        auto out = buffer(t, count * n);
        c.all_gather(in.data(), out.data(), count, t);
        for (int q = 0; q < n; ++q) {
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(get(t, out.data(), q * count + i), value(q, i)) << dtype_name(t);
          }
        }
        ASSERT_EQ(out.back(), 0xcd);
      }
    }
  });
}

TEST_P(CommTest, BroadcastFromEveryRoot) {
  const int n = 3;
  auto cs = comms(n);
  run_on_threads(cs, [&](Comm& c) {
    for (int root = 0; root < n; ++root) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{10007}}) {
        std::vector<int32_t> v(count, -1);
        if (c.rank() == root) {
          for (size_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>(root * 100000 + i);
        }
        c.broadcast(v.data(), count, DataType::kInt32, root);
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(v[i], static_cast<int32_t>(root * 100000 + i));
      }
    }
  });
}

TEST_P(CommTest, BarrierAndSubgroups) {
  auto cs = comms(4);
  run_on_threads(cs, [&](Comm& c) {
    c.barrier();
    // Two disjoint subgroups, and one that reorders its members.
    const bool odd = c.rank() % 2 == 1;
    auto pair = c.new_group(odd ? std::vector<int>{1, 3} : std::vector<int>{0, 2},
                            odd ? "odd" : "even");
    ASSERT_EQ(pair->size(), 2);
    ASSERT_EQ(pair->rank(), c.rank() / 2);
    std::vector<float> v(1001, static_cast<float>(c.rank()));
    pair->all_reduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
    for (float x : v) ASSERT_EQ(x, odd ? 4.0f : 2.0f);
    if (c.rank() != 1) {
      auto three = c.new_group({3, 0, 2}, "three");
      ASSERT_EQ(three->size(), 3);
      const int want_rank = c.rank() == 3 ? 0 : c.rank() == 0 ? 1 : 2;
      ASSERT_EQ(three->rank(), want_rank);
      std::vector<int32_t> g(3, -1);
      int32_t mine = c.rank();
      three->all_gather(&mine, g.data(), 1, DataType::kInt32);
      EXPECT_EQ(g, (std::vector<int32_t>{3, 0, 2}));
    }
    c.barrier();
    // A name is used once per Comm.
    EXPECT_THROW(c.new_group({0, 1, 2, 3}, odd ? "odd" : "even"), Error);
  });
}

TEST_P(CommTest, AsyncCallsOverlapAndCompleteInIssueOrder) {
  auto cs = comms(3);
  run_on_threads(cs, [&](Comm& c) {
    std::vector<std::vector<float>> bufs(5, std::vector<float>(20000));
    std::vector<WorkPtr> works;
    for (size_t k = 0; k < bufs.size(); ++k) {
      std::fill(bufs[k].begin(), bufs[k].end(), static_cast<float>(c.rank() + k));
      works.push_back(c.all_reduce_async(bufs[k].data(), bufs[k].size(), DataType::kFloat32,
                                         ReduceOp::kSum));
    }
    // "Compute" while the communication thread works.
    double acc = 0;
    for (int i = 0; i < 200000; ++i) acc += i * 0.5;
    EXPECT_GT(acc, 0);
    std::vector<int32_t> g(3);
    int32_t mine = c.rank() * 7;
    auto gw = c.all_gather_async(&mine, g.data(), 1, DataType::kInt32);
    auto bw = c.barrier_async();
    bw->wait();
    EXPECT_TRUE(gw->done());  // issued before the barrier, so finished before it
    for (size_t k = 0; k < bufs.size(); ++k) {
      works[k]->wait();
      EXPECT_TRUE(works[k]->done());
      for (float x : bufs[k]) ASSERT_EQ(x, 3.0f + 3.0f * k);
    }
    gw->wait();
    EXPECT_EQ(g, (std::vector<int32_t>{0, 7, 14}));
  });
}

TEST_P(CommTest, SendRecvBetweenPairsBothDirectionsWithTags) {
  auto cs = comms(4);
  run_on_threads(cs, [&](Comm& c) {
    const int peer = c.rank() ^ 1;
    const size_t n = 300001;  // over a MiB
    std::vector<int32_t> out(n), in(n, -1), small_in(3, -1);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(c.rank() * 1000000 + i);
    std::vector<int32_t> small_out = {c.rank(), c.rank() + 1, c.rank() + 2};
    // Both sides send first: must not deadlock.
    auto s1 = c.send_async(out.data(), n, DataType::kInt32, peer, 5);
    auto s2 = c.send_async(small_out.data(), 3, DataType::kInt32, peer, 9);
    c.recv(small_in.data(), 3, DataType::kInt32, peer, 9);  // tag 9 first, though sent second
    c.recv(in.data(), n, DataType::kInt32, peer, 5);
    s1->wait();
    s2->wait();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(in[i], static_cast<int32_t>(peer * 1000000 + i));
    EXPECT_EQ(small_in, (std::vector<int32_t>{peer, peer + 1, peer + 2}));
    // Two messages with the same tag arrive in order; a zero-length message is fine.
    int32_t a = c.rank() * 10 + 1, b = c.rank() * 10 + 2, ra = 0, rb = 0;
    if (c.rank() % 2 == 0) {
      c.send(&a, 1, DataType::kInt32, peer, 1);
      c.send(&b, 1, DataType::kInt32, peer, 1);
      c.send(nullptr, 0, DataType::kInt32, peer, 2);
    } else {
      c.recv(&ra, 1, DataType::kInt32, peer, 1);
      c.recv(&rb, 1, DataType::kInt32, peer, 1);
      c.recv(nullptr, 0, DataType::kInt32, peer, 2);
      EXPECT_EQ(ra, peer * 10 + 1);
      EXPECT_EQ(rb, peer * 10 + 2);
    }
    c.barrier();
  });
}

// all_to_all_v with counts that differ per pair (zero included, and a rank that sends itself
// nothing): rank r sends (r + 2q) % 5 * 1000 + q elements to rank q (over a MiB in all for 4
// ranks), element i of that part being r * 1e6 + q * 1e4 + i % 9999; every rank gets exactly what
// each peer sent it, in source order; then a counts exchange of one int64 per rank.
TEST_P(CommTest, AllToAllWithPerPairCounts) {
  auto cs = comms(4);
  run_on_threads(cs, [&](Comm& c) {
    const int n = c.size(), r = c.rank();
    auto count = [](int from, int to) { return static_cast<size_t>(((from + 2 * to) % 5) * 1000 + (from == to ? 0 : to)); };
    std::vector<size_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) {
      send[static_cast<size_t>(q)] = count(r, q);
      recv[static_cast<size_t>(q)] = count(q, r);
    }
    std::vector<int32_t> in, out;
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < send[static_cast<size_t>(q)]; ++i) in.push_back(r * 1000000 + q * 10000 + static_cast<int>(i % 9999));
    }
    size_t total = 0;
    for (size_t x : recv) total += x;
    out.assign(total, -1);
    c.all_to_all_v(in.data(), send, out.data(), recv, DataType::kInt32);
    size_t at = 0;
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < recv[static_cast<size_t>(q)]; ++i, ++at) {
        ASSERT_EQ(out[at], q * 1000000 + r * 10000 + static_cast<int>(i % 9999)) << "from " << q << " at " << i;
      }
    }
    // The counts exchange itself: one int64 to each rank.
    std::vector<int64_t> mine(static_cast<size_t>(n)), theirs(static_cast<size_t>(n), -1);
    for (int q = 0; q < n; ++q) mine[static_cast<size_t>(q)] = static_cast<int64_t>(count(r, q));
    const std::vector<size_t> ones(static_cast<size_t>(n), 1);
    c.all_to_all_v(mine.data(), ones, theirs.data(), ones, DataType::kInt64);
    for (int q = 0; q < n; ++q) EXPECT_EQ(theirs[static_cast<size_t>(q)], static_cast<int64_t>(count(q, r)));
    c.barrier();
  });
  // Mismatched own counts are refused before anything is sent.
  std::vector<int32_t> v(8);
  const std::vector<size_t> send = {1, 0, 0, 0}, recv = {2, 0, 0, 0}, short_counts = {1, 1};
  EXPECT_THROW(cs[0]->all_to_all_v(v.data(), send, v.data() + 4, recv, DataType::kInt32), Error);
  EXPECT_THROW(cs[0]->all_to_all_v(v.data(), short_counts, v.data() + 4, short_counts, DataType::kInt32), Error);
}

// The context-parallel ring's step: every rank's block goes to the next rank, at 2 and 3 ranks,
// with two exchanges in flight at once (the ring's backward has its K/V and dK/dV blocks moving
// together), blocks larger than the shm staging slots, and an all_reduce issued between them.
TEST_P(CommTest, RingExchangeMovesEachBlockToTheNextRank) {
  for (int n : {2, 3}) {
    auto cs = comms(n);
    run_on_threads(cs, [&](Comm& c) {
      const int r = c.rank(), prev = (r + n - 1) % n;
      const size_t big = (size_t{5} << 20) / 4 + 3, small = 1000;
      std::vector<float> a(big), a_got(big, -1.0f);
      std::vector<int32_t> b(small), b_got(small, -1);
      for (size_t i = 0; i < big; ++i) a[i] = static_cast<float>(r * 1000003 + static_cast<int>(i % 1000003));
      for (size_t i = 0; i < small; ++i) b[i] = r * 100000 + static_cast<int32_t>(i);
      WorkPtr wa = c.ring_exchange_async(a.data(), a_got.data(), big, DataType::kFloat32);
      WorkPtr wb = c.ring_exchange_async(b.data(), b_got.data(), small, DataType::kInt32);
      float one = 1.0f;
      c.all_reduce(&one, 1, DataType::kFloat32, ReduceOp::kSum);
      wb->wait();
      wa->wait();
      EXPECT_TRUE(wa->done());
      EXPECT_EQ(one, static_cast<float>(n));
      for (size_t i = 0; i < big; ++i) {
        ASSERT_EQ(a_got[i], static_cast<float>(prev * 1000003 + static_cast<int>(i % 1000003))) << "rank " << r << " at " << i;
      }
      for (size_t i = 0; i < small; ++i) ASSERT_EQ(b_got[i], prev * 100000 + static_cast<int32_t>(i));
      c.barrier();
    });
  }
}

// A rank that never joins the all-to-all is named by the ranks that wait for its part.
TEST_P(CommTest, AllToAllTimeoutNamesTheMissingRank) {
  auto cs = comms(3, Millis(30000));
  std::vector<std::string> errors(3);
  run_on_threads(cs, [&](Comm& c) {
    if (c.rank() == 2) return;
    std::vector<float> in(30, 1.0f), out(30);
    const std::vector<size_t> counts = {10, 10, 10};
    CallOptions call;
    call.timeout = Millis(400);
    try {
      c.all_to_all_v(in.data(), counts, out.data(), counts, DataType::kFloat32, call);
      ADD_FAILURE() << "rank " << c.rank() << " did not time out";
    } catch (const Error& e) {
      errors[static_cast<size_t>(c.rank())] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[static_cast<size_t>(r)].find("rank 2"), std::string::npos) << errors[static_cast<size_t>(r)];
  }
}

TEST_P(CommTest, ArgumentErrorsAreCaughtBeforeCommunicating) {
  auto cs = comms(2);
  Comm& c = *cs[0];
  std::vector<float> v(8);
  EXPECT_THROW(c.broadcast(v.data(), 8, DataType::kFloat32, 2), Error);
  EXPECT_THROW(c.send(v.data(), 8, DataType::kFloat32, 0, 0), Error);  // to itself
  EXPECT_THROW(c.send(v.data(), 8, DataType::kFloat32, 1, -1), Error);
  EXPECT_THROW(c.all_reduce(nullptr, 8, DataType::kFloat32, ReduceOp::kSum), Error);
  // Overlapping, but not in place.
  EXPECT_THROW(c.all_gather(v.data() + 1, v.data(), 4, DataType::kFloat32), Error);
  std::vector<size_t> bad_counts = {1, 2, 3};
  EXPECT_THROW(c.all_gather_v(v.data(), v.data(), bad_counts, DataType::kFloat32), Error);
  CallOptions zero;
  zero.timeout = Millis(0);
  EXPECT_THROW(c.barrier(zero), Error);
  try {
    c.broadcast(v.data(), 8, DataType::kFloat32, 7);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("root 7"), std::string::npos) << e.what();
  }
  // Nothing was communicated: the group still works.
  run_on_threads(cs, [](Comm& x) { x.barrier(); });
}

TEST_P(CommTest, TimeoutNamesTheRankThatNeverCame) {
  auto cs = comms(3, Millis(30000));
  std::vector<std::string> errors(3);
  run_on_threads(cs, [&](Comm& c) {
    if (c.rank() == 2) return;  // never joins the collective
    std::vector<float> v(100, 1.0f);
    CallOptions call;
    call.timeout = Millis(400);
    try {
      c.all_reduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum, call);
      ADD_FAILURE() << "rank " << c.rank() << " did not time out";
    } catch (const Error& e) {
      errors[static_cast<size_t>(c.rank())] = e.what();
      // The second call fails at once with the first error.
      try {
        c.barrier();
        ADD_FAILURE() << "barrier on a broken comm returned";
      } catch (const Error& again) {
        EXPECT_NE(std::string(again.what()).find("unusable"), std::string::npos) << again.what();
      }
    }
  });
  // At least one of the waiting ranks waited on rank 2 directly; the other may name rank 2 or
  // the rank it was waiting on, or the first rank's published failure.
  bool named = false;
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(errors[static_cast<size_t>(r)]);
    EXPECT_NE(errors[static_cast<size_t>(r)].find("all_reduce on group 'world'"), std::string::npos);
    named = named || errors[static_cast<size_t>(r)].find("rank 2") != std::string::npos;
  }
  EXPECT_TRUE(named) << errors[0] << "\n" << errors[1];
}

TEST_P(CommTest, SetupTimeoutNamesTheRanksThatNeverJoined) {
  auto st = std::make_shared<store::HashStore>();
  CommOptions o = options(Millis(300));
  try {
    make_world_comm(st, 0, 3, o);
    FAIL() << "setup without the peers returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
    EXPECT_NE(std::string(e.what()).find("ranks 1, 2 never joined"), std::string::npos) << e.what();
  }
}

TEST_P(CommTest, PeerClosingItsCommIsNamed) {
  auto cs = comms(2);
  std::string error;
  std::thread waiter([&] {
    std::vector<float> v(10, 1.0f);
    CallOptions call;
    call.timeout = Millis(20000);
    try {
      cs[0]->all_reduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum, call);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(Millis(100));
  cs[1].reset();  // rank 1 goes away without joining
  waiter.join();
  EXPECT_NE(error.find("rank 1"), std::string::npos) << error;
}

TEST_P(CommTest, RegisteredBuffersGiveTheSameResults) {
  const int n = 3;
  auto cs = comms(n);
  run_on_threads(cs, [&](Comm& c) {
    const size_t count = 70003;  // odd, over the zero-copy threshold (256 KiB)
    auto* a = static_cast<float*>(c.alloc_buffer(count * n * sizeof(float)));
    auto* b = static_cast<float*>(c.alloc_buffer(count * n * sizeof(float)));
    ASSERT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
    for (int round = 0; round < 2; ++round) {  // the same buffers reused
      for (size_t i = 0; i < count; ++i) a[i] = static_cast<float>(value(c.rank(), i) + round);
      c.all_reduce(a, count, DataType::kFloat32, ReduceOp::kSum);
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(a[i], 6.0f + 3.0f * static_cast<float>(i % 7) + 3.0f * round) << i;
      }
    }
    // reduce_scatter from a registered input into a plain output, then in place.
    for (size_t i = 0; i < count * n; ++i) a[i] = static_cast<float>(value(c.rank(), i));
    std::vector<float> out(count);
    c.reduce_scatter(a, out.data(), count, DataType::kFloat32, ReduceOp::kMax);
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(out[i], 3.0f + static_cast<float>((c.rank() * count + i) % 7));
    }
    c.reduce_scatter(a, a + c.rank() * count, count, DataType::kFloat32, ReduceOp::kSum);
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(a[c.rank() * count + i], 6.0f + 3.0f * static_cast<float>((c.rank() * count + i) % 7));
    }
    // all_gather_v from a registered input with an empty piece; then in place in b.
    const std::vector<size_t> counts = {7, 0, 70001};
    const size_t mine = counts[static_cast<size_t>(c.rank())];
    for (size_t i = 0; i < mine; ++i) a[i] = static_cast<float>(value(c.rank(), i));
    std::vector<float> all(70008, -1.0f);
    c.all_gather_v(a, all.data(), counts, DataType::kFloat32);
    size_t off = 0;
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < counts[static_cast<size_t>(q)]; ++i) {
        ASSERT_EQ(all[off + i], static_cast<float>(value(q, i)));
      }
      off += counts[static_cast<size_t>(q)];
    }
    const size_t my_off = c.rank() == 0 ? 0 : 7;
    for (size_t i = 0; i < mine; ++i) b[my_off + i] = static_cast<float>(value(c.rank(), i));
    c.all_gather_v(b + my_off, b, counts, DataType::kFloat32);
    for (size_t i = 0; i < 70008; ++i) ASSERT_EQ(b[i], all[i]) << i;
    // Below the threshold the staging path runs, on registered buffers too.
    for (size_t i = 0; i < 100; ++i) a[i] = static_cast<float>(c.rank());
    c.all_reduce(a, 100, DataType::kFloat32, ReduceOp::kSum);
    for (size_t i = 0; i < 100; ++i) ASSERT_EQ(a[i], 3.0f);
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, CommTest, ::testing::Values(Backend::kShm, Backend::kGloo),
                         backend_label);

TEST_P(CommTest, LargeGathersAndBroadcastsAreExact) {
  // Outputs over 4 MiB: the shm backend writes them with streaming stores, staged and zero-copy.
  const int n = 3;
  auto cs = comms(n);
  run_on_threads(cs, [&](Comm& c) {
    const std::vector<size_t> counts = {400001, 350003, 400007};
    const size_t total = 400001 + 350003 + 400007;
    const size_t mine = counts[static_cast<size_t>(c.rank())];
    auto check = [&](const float* all, const char* what) {
      size_t off = 0;
      for (int q = 0; q < n; ++q) {
        for (size_t i = 0; i < counts[static_cast<size_t>(q)]; ++i) {
          ASSERT_EQ(all[off + i], static_cast<float>(value(q, i)))
              << what << " on rank " << c.rank() << ": rank " << q << "'s element " << i;
        }
        off += counts[static_cast<size_t>(q)];
      }
    };
    std::vector<float> in(mine), out(total, -1.0f);
    for (size_t i = 0; i < mine; ++i) in[i] = static_cast<float>(value(c.rank(), i));
    c.all_gather_v(in.data(), out.data(), counts, DataType::kFloat32);
    check(out.data(), "staged all_gather_v");
    auto* rin = static_cast<float*>(c.alloc_buffer(400007 * sizeof(float)));  // same on every rank
    auto* rout = static_cast<float*>(c.alloc_buffer(total * sizeof(float)));
    std::copy(in.begin(), in.end(), rin);
    c.all_gather_v(rin, rout, counts, DataType::kFloat32);
    check(rout, "registered all_gather_v");
    std::vector<float> b(total, static_cast<float>(c.rank()));
    if (c.rank() == 1) std::copy(out.begin(), out.end(), b.begin());
    c.broadcast(b.data(), total, DataType::kFloat32, 1);
    check(b.data(), "broadcast");
  });
}

TEST(CommBackend, ParseAndNames) {
  EXPECT_EQ(parse_backend("shm", "x"), Backend::kShm);
  EXPECT_EQ(parse_backend("gloo", "x"), Backend::kGloo);
  EXPECT_EQ(parse_backend("auto", "x"), Backend::kAuto);
  EXPECT_THROW(parse_backend("mpi", "DSTRAIN_COMM_BACKEND"), Error);
  EXPECT_STREQ(dtype_name(DataType::kBFloat16), "bf16");
  EXPECT_EQ(dtype_size(DataType::kInt64), 8u);
}

TEST(CommBackend, CountLayoutGivesOffsetsTotalAndLargest) {
  const std::vector<size_t> counts = {3, 0, 5, 2};
  CountLayout l = count_layout(counts);
  EXPECT_EQ(l.offsets, (std::vector<size_t>{0, 3, 3, 8}));
  EXPECT_EQ(l.total, 10u);
  EXPECT_EQ(l.largest, 5u);
  CountLayout empty = count_layout(std::vector<size_t>{0, 0});
  EXPECT_EQ(empty.offsets, (std::vector<size_t>{0, 0}));
  EXPECT_EQ(empty.total, 0u);
  EXPECT_EQ(empty.largest, 0u);
}

TEST(CommBackend, AutoPicksShmOnOneHost) {
  CommOptions o;
  o.timeout = Millis(20000);
  auto cs = make_thread_comms(2, o);
  EXPECT_EQ(cs[0]->backend(), requested_backend(o) == Backend::kAuto ? Backend::kShm
                                                                       : requested_backend(o));
}

TEST(CommShm, MismatchedCollectivesNameBothCalls) {
  CommOptions o;
  o.backend = Backend::kShm;
  o.timeout = Millis(20000);
  auto cs = make_thread_comms(2, o);
  std::vector<std::string> errors(2);
  run_on_threads(cs, [&](Comm& c) {
    std::vector<float> v(10, 1.0f), out(10);
    try {
      c.barrier();  // op #0 agrees
      if (c.rank() == 0) {
        c.all_reduce(v.data(), 10, DataType::kFloat32, ReduceOp::kSum);
      } else {
        c.all_gather(v.data(), out.data(), 5, DataType::kFloat32);
      }
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidUsage);
      errors[static_cast<size_t>(c.rank())] = e.what();
    }
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("is in a different collective"), std::string::npos) << e;
    EXPECT_NE(e.find("all_reduce #1 (fp32, 10 elements, sum)"), std::string::npos) << e;
    EXPECT_NE(e.find("all_gather #1 (fp32, 10 elements)"), std::string::npos) << e;
  }
}

TEST(CommShm, RegisteredOnSomeRanksOnlyIsAnError) {
  CommOptions o;
  o.backend = Backend::kShm;
  o.timeout = Millis(20000);
  auto cs = make_thread_comms(2, o);
  std::vector<std::string> errors(2);
  run_on_threads(cs, [&](Comm& c) {
    const size_t n = 100000;  // over the zero-copy threshold (256 KiB)
    auto* reg = static_cast<float*>(c.alloc_buffer(n * sizeof(float)));
    std::vector<float> plain(n, 1.0f);
    try {
      c.all_reduce(c.rank() == 0 ? reg : plain.data(), n, DataType::kFloat32, ReduceOp::kSum);
    } catch (const Error& e) {
      errors[static_cast<size_t>(c.rank())] = e.what();
    }
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("registered buffer"), std::string::npos) << e;
    EXPECT_NE(e.find("different collective"), std::string::npos) << e;
  }
}

TEST(CommShm, RegisteredBuffersOfDifferentSizesAreAnError) {
  CommOptions o;
  o.backend = Backend::kShm;
  o.timeout = Millis(20000);
  auto cs = make_thread_comms(2, o);
  std::vector<std::string> errors(2);
  run_on_threads(cs, [&](Comm& c) {
    try {
      c.alloc_buffer(c.rank() == 0 ? 100000 : 50000);
    } catch (const Error& e) {
      errors[static_cast<size_t>(c.rank())] = e.what();
    }
  });
  for (const auto& e : errors) EXPECT_NE(e.find("every rank must pass the same size"), std::string::npos) << e;
}

TEST(CommReduce, StreamingCopyEqualsMemcpyAtEveryAlignmentAndSize) {
  std::vector<uint8_t> src(70000), dst(70100);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + i / 251);
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{4095},
                       size_t{16384}, size_t{16384 + 77}, size_t{65536 + 100}}) {
    for (size_t so : {0, 1, 13}) {
      for (size_t dof : {0, 5, 64}) {
        std::fill(dst.begin(), dst.end(), uint8_t{0xee});
        copy_streaming(dst.data() + dof, src.data() + so, bytes);
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= dof && i < dof + bytes;
          ASSERT_EQ(dst[i], inside ? src[i - dof + so] : uint8_t{0xee})
              << "bytes " << bytes << " src+" << so << " dst+" << dof << " at " << i;
        }
      }
    }
  }
}

// Every op, 1 to 4 of `src`'s sources, `count`s around the kernels' 16-element steps, the given
// element offsets, through reduce_n, reduce_n_streaming and reduce_n in place: the bits of a
// scalar loop in fp32 (load each element, apply left to right, round once with `store`), and
// nothing written outside the output. Outputs not in place start (off * shift) % mod elements
// into a buffer filled with `fill`.
template <typename S, typename Load, typename Store>
void expect_reductions_equal_the_scalar_loop(DataType dtype, const std::vector<std::vector<S>>& src, Load load,
                                             Store store, std::initializer_list<size_t> offsets, size_t shift,
                                             size_t mod, S fill) {
  const size_t kMax = src[0].size() - 64;
  auto scalar = [](ReduceOp op, float a, float b) {
    if (op == ReduceOp::kSum) return a + b;
    if (op == ReduceOp::kMax) return b > a ? b : a;
    return b < a ? b : a;
  };
  // Which NaN survives when two meet (the sign, the payload) follows the order of an addition's
  // operands, which C++ leaves to the compiler (it may swap them in the loop below): two NaNs are
  // the same result; every other value is held bit for bit.
  auto same_bits = [&](const S& x, const S& y) {
    return std::memcmp(&x, &y, sizeof(S)) == 0 || (std::isnan(load(x)) && std::isnan(load(y)));
  };
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    for (int n = 1; n <= 4; ++n) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{100}, kMax}) {
        for (size_t off : offsets) {
          for (int mode = 0; mode < 3; ++mode) {  // 0: reduce_n, 1: streaming, 2: in place
            std::vector<S> want(count);
            for (size_t i = 0; i < count; ++i) {
              float a = load(src[0][off + i]);
              for (int k = 1; k < n; ++k) a = scalar(op, a, load(src[static_cast<size_t>(k)][off + i]));
              want[i] = store(a);
            }
            std::vector<std::vector<S>> copy = src;  // in place writes into source 0
            std::vector<S> out(kMax + 64, fill);
            S* dst = mode == 2 ? copy[0].data() + off : out.data() + (off * shift) % mod;
            std::vector<const void*> srcs;
            for (int k = 0; k < n; ++k) srcs.push_back(copy[static_cast<size_t>(k)].data() + off);
            if (mode == 1) {
              reduce_n_streaming(dtype, op, dst, srcs.data(), n, count);
            } else {
              reduce_n(dtype, op, dst, srcs.data(), n, count);
            }
            for (size_t i = 0; i < count; ++i) {
              ASSERT_TRUE(same_bits(dst[i], want[i]))
                  << "op " << static_cast<int>(op) << " n " << n << " count " << count << " off " << off
                  << " mode " << mode << " at " << i;
            }
            if (mode != 2) {
              const size_t d0 = static_cast<size_t>(dst - out.data());
              for (size_t i = 0; i < out.size(); ++i) {
                if (i < d0 || i >= d0 + count) {
                  ASSERT_TRUE(same_bits(out[i], fill)) << "wrote outside at " << i;
                }
              }
            }
          }
        }
      }
    }
  }
}

// The fp32 reductions (fused AVX2 kernels where the CPU has them) give the bits of a scalar
// left-to-right loop: NaN, infinities and signed zeros among the values, heads and tails around
// every alignment.
TEST(CommReduce, Fp32ReductionsEqualAScalarLoopBitForBit) {
  std::vector<std::vector<float>> src(4, std::vector<float>(5000 + 64));
  const float specials[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, -3.5f};
  for (size_t k = 0; k < src.size(); ++k) {
    for (size_t i = 0; i < src[k].size(); ++i) {
      src[k][i] = (i * 31 + k * 7) % 97 == 0 ? specials[(i + k) % 8]
                                             : static_cast<float>((i * 2654435761u + k * 40503u) % 20011) / 7.3f - 1300.0f;
    }
  }
  expect_reductions_equal_the_scalar_loop(
      DataType::kFloat32, src, [](float x) { return x; }, [](float x) { return x; }, {0, 1, 3, 9}, 5, 16, 7.0f);
}

// Four sources of 3064 16-bit patterns spread over the whole range, one in 89 of them one of the
// ten `specials`.
std::vector<std::vector<uint16_t>> sixteen_bit_sources(const std::array<uint16_t, 10>& specials) {
  std::vector<std::vector<uint16_t>> src(4, std::vector<uint16_t>(3000 + 64));
  for (size_t k = 0; k < src.size(); ++k) {
    for (size_t i = 0; i < src[k].size(); ++i) {
      src[k][i] = (i * 31 + k * 7) % 89 == 0 ? specials[(i + k) % 10]
                                             : static_cast<uint16_t>((i * 2654435761u + k * 40503u) >> 7);
    }
  }
  return src;
}

// The bf16 reductions: fp32 accumulation left to right, one rounding to nearest even, NaN made
// quiet; ties, NaN payloads, infinities and overflow to infinity among the values.
TEST(CommReduce, Bf16ReductionsEqualAScalarLoopBitForBit) {
  const auto src = sixteen_bit_sources({0x7fc1, 0xff81, 0x7f80, 0xff80, 0x0000, 0x8000, 0x7f7f, 0xff7f, 0x0001, 0x3f81});
  expect_reductions_equal_the_scalar_loop(DataType::kBFloat16, src, bf16_to_f32, f32_to_bf16, {0, 1, 5, 17}, 3, 32,
                                          uint16_t{0x1234});
}

// The fp16 reductions (F16C): fp32 accumulation left to right, one rounding to nearest even,
// NaN stored as f32_to_f16 stores it (sign | 0x7e00, whatever the payload, signalling or quiet);
// subnormals, ties, infinities and sums past 65504 among the values.
TEST(CommReduce, Fp16ReductionsEqualAScalarLoopBitForBit) {
  const auto src = sixteen_bit_sources({0x7e01, 0xfd01, 0x7c01, 0x7c00, 0xfc00, 0x0000, 0x8000, 0x7bff, 0x0001, 0x83ff});
  expect_reductions_equal_the_scalar_loop(DataType::kFloat16, src, f16_to_f32, f32_to_f16, {0, 1, 5, 17}, 3, 32,
                                          uint16_t{0x1234});
  // A NaN is stored as f32_to_f16 stores it, whatever its payload: 32 of them (past one vector).
  std::vector<uint16_t> nans(32), ones(32, 0x3c00), out(32);
  for (size_t i = 0; i < nans.size(); ++i) nans[i] = static_cast<uint16_t>((i % 2 ? 0xfc00 : 0x7c00) | (1 + 37 * i % 0x3ff));
  const void* one[1] = {nans.data()};
  const void* two[2] = {nans.data(), ones.data()};  // max keeps the first operand when one is NaN
  reduce_n(DataType::kFloat16, ReduceOp::kSum, out.data(), one, 1, nans.size());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], f32_to_f16(f16_to_f32(nans[i]))) << i;
  reduce_n(DataType::kFloat16, ReduceOp::kMax, out.data(), two, 2, nans.size());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], i % 2 ? 0xfe00 : 0x7e00) << i;
}

TEST(CommReduce, HalfConversionsRoundToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);               // overflow -> inf
  EXPECT_EQ(f32_to_f16(5.9604645e-08f), 0x0001);     // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x0001), 5.9604645e-08f);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);  // tie -> even
  EXPECT_EQ(f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  for (int i = -2048; i <= 2048; ++i) {
    ASSERT_EQ(f16_to_f32(f32_to_f16(static_cast<float>(i))), static_cast<float>(i));
  }
  // bf16 of a sum rounds once: 256 + 1 + 1 accumulated in fp32 is 258 (bf16 has 8 bits).
  uint16_t a[1] = {f32_to_bf16(256.0f)}, b[1] = {f32_to_bf16(1.0f)}, c[1] = {f32_to_bf16(1.0f)};
  const void* srcs[3] = {a, b, c};
  uint16_t out[1];
  reduce_n(DataType::kBFloat16, ReduceOp::kSum, out, srcs, 3, 1);
  EXPECT_EQ(bf16_to_f32(out[0]), 258.0f);
}

}  // namespace
}  // namespace ds::rt::comm
