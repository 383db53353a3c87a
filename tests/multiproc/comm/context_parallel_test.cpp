// Context parallelism's attention between real forked processes, against the unsplit
// grouped-query attention of the single process: every rank builds the same whole sequence (same
// seed), keeps its rows, runs the forward and backward over a cp group of N = 2 and 4 on both CPU
// backends, and its rows of the output, lse and dqkv equal the unsplit kernel's.
// - Ring (parallel/ring_attention.h): the two load-balanced chunks r and 2N-1-r.
// - Ulysses (parallel/ulysses_attention.h): the contiguous part r; its lse is head-sharded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "multiproc/comm/forked_ranks.h"
#include "parallel/ring_attention.h"
#include "parallel/ulysses_attention.h"
#include "unit/kernels/grad_check.h"

namespace ds::rt::comm {
namespace {

using Param = std::tuple<Backend, int>;  // backend, cp size

class ContextParallelTest : public test::ForkedRanksTest<Param> {};

// The rows of the rank's chunks, in its order (chunk r, then chunk 2N-1-r), of a (B,T,w) buffer.
std::vector<float> my_rows(const std::vector<float>& x, int B, int T, int w, int r, int n, int C) {
  std::vector<float> out(static_cast<size_t>(B) * 2 * C * w);
  for (int b = 0; b < B; b++) {
    for (int k = 0; k < 2; k++) {
      const int p0 = parallel::ring_chunk_position(r, n, k, C);
      for (int i = 0; i < C; i++) {
        for (int j = 0; j < w; j++) {
          out[((static_cast<size_t>(b) * 2 * C) + k * C + i) * w + j] = x[(static_cast<size_t>(b) * T + p0 + i) * w + j];
        }
      }
    }
  }
  return out;
}

// The same for an lse buffer (B,NH,T).
std::vector<float> my_lse(const std::vector<float>& l, int B, int NH, int T, int r, int n, int C) {
  std::vector<float> out(static_cast<size_t>(B) * NH * 2 * C);
  for (int bh = 0; bh < B * NH; bh++) {
    for (int k = 0; k < 2; k++) {
      const int p0 = parallel::ring_chunk_position(r, n, k, C);
      for (int i = 0; i < C; i++) out[static_cast<size_t>(bh) * 2 * C + k * C + i] = l[static_cast<size_t>(bh) * T + p0 + i];
    }
  }
  return out;
}

bool near(const std::vector<float>& got, const std::vector<float>& want, double tol) {
  if (got.size() != want.size()) return false;
  for (size_t i = 0; i < got.size(); i++) {
    if (!(std::fabs(got[i] - want[i]) <= tol * (1.0 + std::fabs(want[i])))) {
      std::fprintf(stderr, "element %zu: %g, expected %g\n", i, got[i], want[i]);
      return false;
    }
  }
  return true;
}

TEST_P(ContextParallelTest, RingEqualsTheUnsplitKernel) {
  const auto [backend, n] = GetParam();
  const int B = 2, NH = 4, KV = 2, hd = 8, C = 3, T = 2 * n * C, w = (NH + 2 * KV) * hd, ow = NH * hd;
  auto status = run_ranks(
      n,
      [&, backend = backend, n = n](int r) -> int {
        // The single process's answer on the whole sequence.
        const auto qkv = ds::test::randn(static_cast<size_t>(B) * T * w, 21), dout = ds::test::randn(static_cast<size_t>(B) * T * ow, 22);
        std::vector<float> out(dout.size()), lse(static_cast<size_t>(B) * NH * T), dqkv(qkv.size());
        std::vector<float> scratch(cpu::attention_scratch_floats(T, hd) * 4);
        cpu::attention_gqa_forward(out.data(), lse.data(), qkv.data(), scratch.data(), B, T, NH, KV, hd);
        cpu::attention_gqa_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), scratch.data(), B, T, NH,
                                    KV, hd);
        // The ring over the cp group.
        auto c = connect(r, n, Millis(30000), backend);
        parallel::RingAttention ring(*c, parallel::RingShape{B, C, NH, KV, hd}, 4, Allocator::process());
        const auto q = my_rows(qkv, B, T, w, r, n, C), dO = my_rows(dout, B, T, ow, r, n, C);
        std::vector<float> o(dO.size()), l(static_cast<size_t>(B) * NH * 2 * C), dq(q.size());
        ring.forward(o.data(), l.data(), q.data());
        CHILD_CHECK(near(o, my_rows(out, B, T, ow, r, n, C), 1e-5));
        CHILD_CHECK(near(l, my_lse(lse, B, NH, T, r, n, C), 1e-5));
        ring.backward(dq.data(), dO.data(), q.data(), o.data(), l.data());
        CHILD_CHECK(near(dq, my_rows(dqkv, B, T, w, r, n, C), 1e-4));
        return 0;
      },
      Millis(60000));
  for (int s : status) EXPECT_EQ(s, 0);
}

TEST_P(ContextParallelTest, UlyssesEqualsTheUnsplitKernel) {
  const auto [backend, n] = GetParam();
  const int B = 2, NH = 8, KV = 4, hd = 8, T = 12, Tl = T / n, w = (NH + 2 * KV) * hd, ow = NH * hd;
  auto status = run_ranks(
      n,
      [&, backend = backend, n = n](int r) -> int {
        const auto qkv = ds::test::randn(static_cast<size_t>(B) * T * w, 31), dout = ds::test::randn(static_cast<size_t>(B) * T * ow, 32);
        std::vector<float> out(dout.size()), lse(static_cast<size_t>(B) * NH * T), dqkv(qkv.size());
        std::vector<float> scratch(cpu::attention_scratch_floats(T, hd));
        cpu::attention_gqa_forward(out.data(), lse.data(), qkv.data(), scratch.data(), B, T, NH, KV, hd);
        cpu::attention_gqa_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), scratch.data(), B, T, NH,
                                    KV, hd);
        auto part = [&](const std::vector<float>& x, int width) {  // rows [r Tl, (r+1) Tl) of each sequence
          std::vector<float> y(static_cast<size_t>(B) * Tl * width);
          for (int b = 0; b < B; b++) {
            std::copy_n(x.begin() + (static_cast<int64_t>(b) * T + static_cast<int64_t>(r) * Tl) * width, Tl * width,
                        y.begin() + static_cast<int64_t>(b) * Tl * width);
          }
          return y;
        };
        auto c = connect(r, n, Millis(30000), backend);
        // Heads that do not divide over the group are refused by name.
        try {
          parallel::UlyssesAttention bad(*c, parallel::UlyssesShape{B, T, NH, n / 2, hd}, 4, Allocator::process());
          CHILD_CHECK(false);
        } catch (const ds::Error& e) {
          CHILD_CHECK(std::string(e.what()).find("kv heads (" + std::to_string(n / 2) + ")") != std::string::npos);
        }
        parallel::UlyssesAttention ulysses(*c, parallel::UlyssesShape{B, T, NH, KV, hd}, 4, Allocator::process());
        const auto q = part(qkv, w), dO = part(dout, ow);
        std::vector<float> o(dO.size()), lh(static_cast<size_t>(B) * (NH / n) * T), dq(q.size());
        ulysses.forward(o.data(), lh.data(), q.data());
        CHILD_CHECK(near(o, part(out, ow), 1e-5));
        // The lse of my heads, [r NH/n, (r+1) NH/n), over the whole sequence.
        std::vector<float> want_l(lh.size());
        for (int b = 0; b < B; b++) {
          std::copy_n(lse.begin() + (static_cast<int64_t>(b) * NH + static_cast<int64_t>(r) * (NH / n)) * T, (NH / n) * T,
                      want_l.begin() + static_cast<int64_t>(b) * (NH / n) * T);
        }
        CHILD_CHECK(near(lh, want_l, 1e-5));
        ulysses.backward(dq.data(), dO.data(), q.data(), o.data(), lh.data());
        CHILD_CHECK(near(dq, part(dqkv, w), 1e-4));
        return 0;
      },
      Millis(60000));
  for (int s : status) EXPECT_EQ(s, 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, ContextParallelTest,
                         ::testing::Combine(::testing::Values(Backend::kShm, Backend::kGloo), ::testing::Values(2, 4)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::string(backend_name(std::get<0>(info.param))) + "_cp" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace ds::rt::comm
