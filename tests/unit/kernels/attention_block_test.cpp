// Ring attention's pieces (cpu/kernels.h: attention_block_forward, attention_merge,
// attention_block_backward) against the unsplit grouped-query attention: the sequence is cut into
// uneven chunks, every query chunk meets every key chunk (blocks wholly in the causal future see
// no key), the partial results are merged by their lse, and the merged output, lse, dq, dk and dv
// equal the unsplit kernel's at every position. Also in a context-parallel order: rank r of N
// holding chunks r and 2N-1-r (Megatron's causal load balance), its blocks visited in ring order.
// And 16-bit inputs run the fp32 arithmetic on the converted values.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/kernels.h"
#include "layout/context_parallel.h"
#include "unit/kernels/grad_check.h"

using namespace ds::rt;
using namespace ds::rt::cpu;
using ds::test::randn;

namespace {

// The block kernels' per-thread tiles for every OpenMP thread (ops.def: attention_block_*).
std::vector<float> tiles(int Tq, int Tk, int hd) {
  return std::vector<float>(attention_block_scratch_floats(Tq, Tk, hd) * static_cast<size_t>(omp_get_max_threads()));
}

struct Shape {
  int B, NH, KV, hd;
  int stride() const { return (NH + 2 * KV) * hd; }
};

// Rows [a, b) of a (B, T, width) buffer.
std::vector<float> rows(const std::vector<float>& x, int B, int T, int width, int a, int b, int col = 0, int n = -1) {
  if (n < 0) n = width;
  std::vector<float> out(static_cast<size_t>(B) * (b - a) * n);
  for (int bb = 0; bb < B; bb++) {
    for (int t = a; t < b; t++) {
      for (int i = 0; i < n; i++) {
        out[(static_cast<size_t>(bb) * (b - a) + (t - a)) * n + i] = x[(static_cast<size_t>(bb) * T + t) * width + col + i];
      }
    }
  }
  return out;
}

// The kv block of positions [a, b): the k heads then the v heads of each row.
std::vector<float> kv_rows(const std::vector<float>& qkv, const Shape& s, int T, int a, int b) {
  const int kvw = 2 * s.KV * s.hd;
  return rows(qkv, s.B, T, s.stride(), a, b, s.NH * s.hd, kvw);
}

// lse rows [a, b) of a (B, NH, T) buffer.
std::vector<float> lse_rows(const std::vector<float>& l, int B, int NH, int T, int a, int b) {
  std::vector<float> out(static_cast<size_t>(B) * NH * (b - a));
  for (int r = 0; r < B * NH; r++) {
    for (int t = a; t < b; t++) out[static_cast<size_t>(r) * (b - a) + (t - a)] = l[static_cast<size_t>(r) * T + t];
  }
  return out;
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want, float tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < got.size(); i++) {
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]) / (1.0 + std::fabs(want[i])));
  }
  EXPECT_LT(worst, tol) << what;
}

struct Reference {
  std::vector<float> qkv, out, lse, dout, dqkv;
};

Reference unsplit(const Shape& s, int T) {
  Reference r;
  r.qkv = randn(static_cast<size_t>(s.B) * T * s.stride(), 11);
  r.out.resize(static_cast<size_t>(s.B) * T * s.NH * s.hd);
  r.lse.resize(static_cast<size_t>(s.B) * s.NH * T);
  r.dout = randn(r.out.size(), 12);
  r.dqkv.resize(r.qkv.size());
  std::vector<float> scratch(attention_scratch_floats(T, s.hd) * 4);
  attention_gqa_forward(r.out.data(), r.lse.data(), r.qkv.data(), scratch.data(), s.B, T, s.NH, s.KV, s.hd);
  attention_gqa_backward(r.dqkv.data(), r.dout.data(), r.qkv.data(), r.out.data(), r.lse.data(), scratch.data(), s.B,
                         T, s.NH, s.KV, s.hd);
  return r;
}

// Every query chunk against every key chunk, in the order `order` gives for each query chunk;
// compared with the unsplit kernel.
void check_split(const Shape& s, const std::vector<int>& cuts, const std::vector<std::vector<int>>& orders) {
  const int T = cuts.back(), C = static_cast<int>(cuts.size()) - 1;
  const Reference ref = unsplit(s, T);
  const int ow = s.NH * s.hd, kvw = 2 * s.KV * s.hd;
  std::vector<std::vector<float>> dkv(static_cast<size_t>(C));
  for (int c = 0; c < C; c++) dkv[static_cast<size_t>(c)].assign(static_cast<size_t>(s.B) * (cuts[c + 1] - cuts[c]) * kvw, 0.0f);
  for (int cq = 0; cq < C; cq++) {
    const int a = cuts[cq], b = cuts[cq + 1], Tq = b - a;
    const auto q = rows(ref.qkv, s.B, T, s.stride(), a, b);
    std::vector<float> out(static_cast<size_t>(s.B) * Tq * ow, 0.0f),
        lse(static_cast<size_t>(s.B) * s.NH * Tq, -std::numeric_limits<float>::infinity());
    std::vector<float> part(out.size()), part_lse(lse.size());
    for (int ck : orders[static_cast<size_t>(cq)]) {
      const int ka = cuts[ck], kb = cuts[ck + 1];
      const auto kv = kv_rows(ref.qkv, s, T, ka, kb);
      attention_block_forward(part.data(), part_lse.data(), q.data(), kv.data(), tiles(Tq, kb - ka, s.hd).data(), s.B,
                              Tq, kb - ka, s.NH, s.KV, s.hd, a, ka);
      attention_merge(out.data(), lse.data(), part.data(), part_lse.data(), s.B, Tq, s.NH, s.hd);
    }
    expect_near(out, rows(ref.out, s.B, T, ow, a, b), 2e-6f, "merged output");
    expect_near(lse, lse_rows(ref.lse, s.B, s.NH, T, a, b), 2e-6f, "merged lse");
    // Backward from the merged output and lse (the unsplit kernel's, equal to them).
    const auto o = rows(ref.out, s.B, T, ow, a, b), dO = rows(ref.dout, s.B, T, ow, a, b);
    std::vector<float> dq(o.size(), 0.0f);
    for (int ck : orders[static_cast<size_t>(cq)]) {
      const int ka = cuts[ck], kb = cuts[ck + 1];
      const auto kv = kv_rows(ref.qkv, s, T, ka, kb);
      attention_block_backward(dq.data(), dkv[static_cast<size_t>(ck)].data(), dO.data(), q.data(), kv.data(),
                               o.data(), lse.data(), tiles(Tq, kb - ka, s.hd).data(), s.B, Tq, kb - ka, s.NH, s.KV, s.hd,
                               a, ka);
    }
    expect_near(dq, rows(ref.dqkv, s.B, T, s.stride(), a, b, 0, ow), 1e-5f, "dq");
  }
  for (int c = 0; c < C; c++) {
    expect_near(dkv[static_cast<size_t>(c)], kv_rows(ref.dqkv, s, T, cuts[c], cuts[c + 1]), 1e-5f, "dk and dv");
  }
}

std::vector<std::vector<int>> every_chunk(int C) {
  std::vector<int> all;
  for (int c = 0; c < C; c++) all.push_back(c);
  return std::vector<std::vector<int>>(static_cast<size_t>(C), all);
}

}  // namespace

TEST(AttentionBlock, UnevenChunksMatchTheUnsplitKernel) {
  check_split({2, 4, 2, 8}, {0, 3, 7, 13}, every_chunk(3));   // GQA, chunks of 3, 4 and 6
  check_split({1, 3, 3, 16}, {0, 5, 6, 11}, every_chunk(3));  // multi-head, a chunk of one
}

TEST(AttentionBlock, LoadBalancedRingOrderMatchesTheUnsplitKernel) {
  // N = 2 ranks, 4 chunks of 4: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2. Each query
  // chunk meets the key chunks in the order the ring brings them to its rank (its own first).
  const std::vector<std::vector<int>> order = {{0, 3, 1, 2}, {1, 2, 0, 3}, {2, 1, 3, 0}, {3, 0, 2, 1}};
  check_split({2, 4, 1, 8}, {0, 4, 8, 12, 16}, order);
}

// The plan's count of the ring's scratch (layout::ring_attention_scratch) holds the kernels'
// per-thread tiles at a chunk's T / 2n tokens, for every thread.
TEST(AttentionBlock, TheRingScratchCountsTheKernelsTiles) {
  for (const auto& [T, n, hd] : {std::tuple{1536, 2, 32}, std::tuple{96, 4, 8}, std::tuple{20, 2, 64}}) {
    ds::layout::CpAttentionShape a;
    a.B = 2, a.T = T, a.NH = 4, a.KV = 2, a.hd = hd, a.n = n, a.storage_bytes = 2;
    a.num_threads = 0;
    const int64_t base = ds::layout::ring_attention_scratch(a).workspace;
    a.num_threads = 3;
    const int C = T / (2 * n);
    EXPECT_EQ(ds::layout::ring_attention_scratch(a).workspace - base,
              static_cast<int64_t>(3 * 4 * attention_block_scratch_floats(C, C, hd)))
        << T << " " << n << " " << hd;
  }
}

TEST(AttentionBlock, AFutureBlockSeesNoKey) {
  const Shape s{1, 2, 1, 4};
  const auto qkv = randn(static_cast<size_t>(3) * s.stride(), 3), kv = randn(static_cast<size_t>(2) * 2 * s.KV * s.hd, 4);
  std::vector<float> out(static_cast<size_t>(3) * s.NH * s.hd, 7.0f), lse(static_cast<size_t>(s.NH) * 3);
  attention_block_forward(out.data(), lse.data(), qkv.data(), kv.data(), tiles(3, 2, s.hd).data(), 1, 3, 2, s.NH, s.KV,
                          s.hd, 0, 3);
  for (float v : out) EXPECT_EQ(v, 0.0f);
  for (float l : lse) EXPECT_EQ(l, -std::numeric_limits<float>::infinity());
  // Merging it changes nothing.
  std::vector<float> acc = randn(out.size(), 5), acc_lse = randn(lse.size(), 6);
  const auto acc0 = acc, lse0 = acc_lse;
  attention_merge(acc.data(), acc_lse.data(), out.data(), lse.data(), 1, 3, s.NH, s.hd);
  EXPECT_EQ(acc, acc0);
  EXPECT_EQ(acc_lse, lse0);
}

TEST(AttentionBlock, SixteenBitInputsRunTheFp32ArithmeticOnTheirValues) {
  const Shape s{2, 4, 2, 8};
  const int Tq = 5, Tk = 6;
  auto qkv = randn(static_cast<size_t>(s.B) * Tq * s.stride(), 1), kv = randn(static_cast<size_t>(s.B) * Tk * 2 * s.KV * s.hd, 2);
  std::vector<bf16> qkv16(qkv.size()), kv16(kv.size());
  convert(qkv16.data(), qkv.data(), static_cast<int64_t>(qkv.size()));
  convert(kv16.data(), kv.data(), static_cast<int64_t>(kv.size()));
  convert(qkv.data(), qkv16.data(), static_cast<int64_t>(qkv.size()));  // the values bf16 holds
  convert(kv.data(), kv16.data(), static_cast<int64_t>(kv.size()));
  const size_t on = static_cast<size_t>(s.B) * Tq * s.NH * s.hd, ln = static_cast<size_t>(s.B) * s.NH * Tq;
  std::vector<float> o32(on), l32(ln), o16(on), l16(ln);
  auto t = tiles(Tq, Tk, s.hd);
  attention_block_forward(o32.data(), l32.data(), qkv.data(), kv.data(), t.data(), s.B, Tq, Tk, s.NH, s.KV, s.hd, 4, 2);
  attention_block_forward(o16.data(), l16.data(), qkv16.data(), kv16.data(), t.data(), s.B, Tq, Tk, s.NH, s.KV, s.hd, 4,
                          2);
  EXPECT_EQ(o32, o16);
  EXPECT_EQ(l32, l16);
}
