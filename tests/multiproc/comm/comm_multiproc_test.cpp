// Collectives between real forked processes over the real TCP store, for both CPU backends:
// closed-form values for every collective, subgroups, send/recv; and a rank SIGKILLed in the
// middle of a run of collectives gives every survivor an error naming it (no hang).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <thread>

#include "comm/comm.h"
#include "common/error.h"
#include "store/tcp_store_client.h"
#include "store/tcp_store_server.h"
#include "multiproc/comm/forked_ranks.h"

namespace ds::rt::comm {
namespace {

using test::fork_child;
using test::wait_all;

class CommMultiprocTest : public test::ForkedRanksTest<Backend> {
 protected:
  CommPtr connect(int rank, int size, Millis timeout) {
    return test::ForkedRanksTest<Backend>::connect(rank, size, timeout, GetParam());
  }
};

std::string backend_label(const ::testing::TestParamInfo<Backend>& info) {
  return backend_name(info.param);
}


TEST_P(CommMultiprocTest, EveryCollectiveBetweenProcesses) {
  const int n = 3;
  auto status = run_ranks(
      n,
      [&](int r) -> int {
        auto c = connect(r, n, Millis(30000));
        CHILD_CHECK(c->backend() == GetParam());
        // all_reduce, odd size over several shm chunks
        std::vector<float> v(300001);
        for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(r + 1 + i % 7);
        c->all_reduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
        for (size_t i = 0; i < v.size(); ++i) CHILD_CHECK(v[i] == 6.0f + 3.0f * (i % 7));
        // reduce_scatter_v with sizes the group does not divide
        const std::vector<size_t> counts = {7, 0, 100003};
        std::vector<int64_t> in(100010), out(counts[static_cast<size_t>(r)]);
        for (size_t i = 0; i < in.size(); ++i) in[i] = r + 1 + static_cast<int64_t>(i % 7);
        c->reduce_scatter_v(in.data(), out.data(), counts, DataType::kInt64, ReduceOp::kMax);
        const size_t off = r == 0 ? 0 : 7;
        for (size_t i = 0; i < out.size(); ++i) CHILD_CHECK(out[i] == 3 + int64_t((off + i) % 7));
        // all_gather of bytes
        std::vector<uint8_t> mine(1001, static_cast<uint8_t>(r + 1)), all(3003);
        c->all_gather(mine.data(), all.data(), mine.size(), DataType::kUInt8);
        for (size_t i = 0; i < all.size(); ++i) CHILD_CHECK(all[i] == i / 1001 + 1);
        // broadcast from the last rank, bf16
        std::vector<uint16_t> b(5000, r == 2 ? 0x3f80 : 0);
        c->broadcast(b.data(), b.size(), DataType::kBFloat16, 2);
        for (auto x : b) CHILD_CHECK(x == 0x3f80);
        // send/recv around a ring, asynchronously in both directions
        std::vector<int32_t> s(70000, r), got(70000, -1);
        auto sw = c->send_async(s.data(), s.size(), DataType::kInt32, (r + 1) % n, 3);
        c->recv(got.data(), got.size(), DataType::kInt32, (r + n - 1) % n, 3);
        sw->wait();
        for (auto x : got) CHILD_CHECK(x == (r + n - 1) % n);
        // a subgroup of two
        if (r != 1) {
          auto g = c->new_group({0, 2}, "ends");
          int32_t x = r;
          g->all_reduce(&x, 1, DataType::kInt32, ReduceOp::kSum);
          CHILD_CHECK(x == 2);
        }
        c->barrier();
        return 0;
      },
      Millis(60000));
  for (size_t i = 0; i < status.size(); ++i) {
    EXPECT_TRUE(WIFEXITED(status[i]) && WEXITSTATUS(status[i]) == 0)
        << "rank " << i << " status " << status[i];
  }
}

// A reduce_scatter whose part is past 4 MiB writes it with streaming stores (shm: reduce_n_streaming),
// through the staging slots and through registered buffers (the zero-copy path), out of place
// and in place: the same values as the closed form.
TEST_P(CommMultiprocTest, LargeReduceScatterGivesTheSameValues) {
  const int n = 2;
  const size_t part = (size_t{1} << 20) + 3;  // floats per rank: 4 MiB and 12 bytes
  auto status = run_ranks(
      n,
      [&](int r) -> int {
        auto c = connect(r, n, Millis(30000));
        for (const bool registered : {false, true}) {
          for (const bool in_place : {false, true}) {
            float* in = registered ? static_cast<float*>(c->alloc_buffer(n * part * sizeof(float))) : new float[n * part];
            float* out = in_place ? in + r * part
                                  : (registered ? static_cast<float*>(c->alloc_buffer(part * sizeof(float))) : new float[part]);
            for (size_t i = 0; i < n * part; ++i) in[i] = static_cast<float>(r + 1) * static_cast<float>(i % 13);
            c->reduce_scatter(in, out, part, DataType::kFloat32, ReduceOp::kSum);
            for (size_t i = 0; i < part; ++i) CHILD_CHECK(out[i] == 3.0f * static_cast<float>((r * part + i) % 13));
            if (!registered) {
              if (!in_place) delete[] out;
              delete[] in;
            }
          }
        }
        return 0;
      },
      Millis(60000));
  for (int s : status) EXPECT_EQ(s, 0);
}

TEST_P(CommMultiprocTest, KilledRankIsNamedBySurvivors) {
  const int n = 4, victim = 2;
  // Survivors exit 0 when they got an error naming the victim, 20 when the error named someone
  // else, 21 when the loop finished without error.
  auto status = run_ranks(
      n,
      [&](int r) -> int {
        auto c = connect(r, n, Millis(20000));
        std::vector<float> v(1 << 18);
        for (int iter = 0; iter < 100000; ++iter) {
          if (r == victim && iter == 5) ::kill(::getpid(), SIGKILL);
          std::fill(v.begin(), v.end(), 1.0f);
          try {
            c->all_reduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
          } catch (const Error& e) {
            std::string msg = e.what();
            std::fprintf(stderr, "rank %d got: %s\n", r, msg.c_str());
            const bool named = msg.find("rank 2 (") != std::string::npos;
            // Any survivor may be the first to see it; the others learn it from the note.
            return named && e.kind() == ErrorKind::kRemote ? 0 : 20;
          }
          if (v[0] != 4.0f) return 11;
        }
        return 21;
      },
      Millis(60000));
  for (int r = 0; r < n; ++r) {
    if (r == victim) {
      EXPECT_TRUE(WIFSIGNALED(status[static_cast<size_t>(r)]));
      continue;
    }
    EXPECT_TRUE(WIFEXITED(status[static_cast<size_t>(r)]) &&
                WEXITSTATUS(status[static_cast<size_t>(r)]) == 0)
        << "rank " << r << " status " << status[static_cast<size_t>(r)];
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, CommMultiprocTest,
                         ::testing::Values(Backend::kShm, Backend::kGloo), backend_label);

}  // namespace
}  // namespace ds::rt::comm
