// Document-aware attention (ops.def's attention_gqa_doc_*, data.packing "document"): forward and
// backward against an independent float64 computation with an explicit mask (row t of sequence b
// sees keys [doc_start[b,t], t]), for several document layouts over more than one 64-row block
// (documents starting inside a block, on a block boundary, at row 0, none in a sequence, many short
// ones); a central finite-difference check on a tiny case; null starts bit-identical to the plain
// kernels; bf16 storage against fp32 within bf16's rounding.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/kernels.h"
#include "unit/kernels/grad_check.h"

using namespace ds::rt::cpu;
using ds::test::check_grad;
using ds::test::dot;
using ds::test::randn;

namespace {

struct AttentionDoc : ::testing::Test {
  void SetUp() override { omp_set_num_threads(2); }
};

struct Shape {
  int B, T, NH, KV, hd;
  int st() const { return (NH + 2 * KV) * hd; }
  int os() const { return NH * hd; }
};

// doc_start of every row from the positions of the document tokens of each sequence.
std::vector<int32_t> starts_from(const Shape& s, const std::vector<std::vector<int>>& doc_tokens) {
  std::vector<int32_t> ds(static_cast<size_t>(s.B) * s.T);
  for (int b = 0; b < s.B; b++) {
    int start = 0;
    for (int t = 0; t < s.T; t++) {
      for (int p : doc_tokens[static_cast<size_t>(b)]) {
        if (p == t) start = t;
      }
      ds[static_cast<size_t>(b) * s.T + t] = start;
    }
  }
  return ds;
}

// Float64 attention with the explicit mask, and its gradient of L = sum(out * R).
struct Reference {
  std::vector<double> out, lse, dqkv;
};

Reference reference(const Shape& s, const std::vector<float>& qkv, const std::vector<int32_t>& ds,
                    const std::vector<float>& R) {
  const int st = s.st(), os = s.os(), grp = s.NH / s.KV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.hd));
  Reference r;
  r.out.assign(static_cast<size_t>(s.B) * s.T * os, 0.0);
  r.lse.assign(static_cast<size_t>(s.B) * s.NH * s.T, 0.0);
  r.dqkv.assign(qkv.size(), 0.0);
  auto at = [&](int b, int t, int col) { return static_cast<double>(qkv[(static_cast<size_t>(b) * s.T + t) * st + col]); };
  for (int b = 0; b < s.B; b++) {
    for (int h = 0; h < s.NH; h++) {
      const int g = h / grp, qc = h * s.hd, kc = (s.NH + g) * s.hd, vc = (s.NH + s.KV + g) * s.hd;
      for (int t = 0; t < s.T; t++) {
        const int lo = ds[static_cast<size_t>(b) * s.T + t];
        std::vector<double> p(static_cast<size_t>(t + 1), 0.0);
        double mx = -1e300;
        for (int j = lo; j <= t; j++) {
          double sc = 0;
          for (int d = 0; d < s.hd; d++) sc += at(b, t, qc + d) * at(b, j, kc + d);
          p[j] = sc * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int j = lo; j <= t; j++) sum += std::exp(p[j] - mx);
        r.lse[(static_cast<size_t>(b) * s.NH + h) * s.T + t] = mx + std::log(sum);
        for (int j = lo; j <= t; j++) p[j] = std::exp(p[j] - mx) / sum;
        const size_t orow = (static_cast<size_t>(b) * s.T + t) * os + qc;
        for (int j = lo; j <= t; j++) {
          for (int d = 0; d < s.hd; d++) r.out[orow + d] += p[j] * at(b, j, vc + d);
        }
        // Backward of this row: dp_j = R.v_j, D = R.o, ds_j = p_j (dp_j - D).
        double D = 0;
        for (int d = 0; d < s.hd; d++) D += R[orow + d] * r.out[orow + d];
        for (int j = lo; j <= t; j++) {
          double dp = 0;
          for (int d = 0; d < s.hd; d++) dp += R[orow + d] * at(b, j, vc + d);
          const double dsj = p[j] * (dp - D);
          const size_t qrow = (static_cast<size_t>(b) * s.T + t) * st, krow = (static_cast<size_t>(b) * s.T + j) * st;
          for (int d = 0; d < s.hd; d++) {
            r.dqkv[qrow + qc + d] += scale * dsj * at(b, j, kc + d);
            r.dqkv[krow + kc + d] += scale * dsj * at(b, t, qc + d);
            r.dqkv[krow + vc + d] += p[j] * R[orow + d];
          }
        }
      }
    }
  }
  return r;
}

template <typename S>
std::vector<S> stored(const std::vector<float>& x) {
  std::vector<S> y(x.size());
  for (size_t i = 0; i < x.size(); i++) y[i] = ds::rt::from_f32<S>(x[i]);
  return y;
}

}  // namespace

TEST_F(AttentionDoc, MatchesFloat64ReferenceWithExplicitMask) {
  struct Case {
    Shape s;
    std::vector<std::vector<int>> docs;  // document token positions of each sequence
  };
  const std::vector<Case> cases = {
      // A document starting inside the second block, one on a block boundary, none at all.
      {{3, 150, 4, 2, 8}, {{0, 37, 64, 100}, {}, {5, 128, 129, 149}}},
      // Many short documents (SFT-like), multi-query.
      {{2, 70, 4, 1, 4}, {{0, 3, 7, 8, 20, 33, 40, 41, 42, 60, 69}, {1, 2, 66}}},
      // Multi-head (KV = NH), a single document from row 0.
      {{1, 65, 3, 3, 8}, {{0}}},
  };
  for (const auto& c : cases) {
    const Shape& s = c.s;
    const auto ds = starts_from(s, c.docs);
    auto qkv = randn(static_cast<size_t>(s.B) * s.T * s.st(), 21);
    const auto R = randn(static_cast<size_t>(s.B) * s.T * s.os(), 22);
    std::vector<float> out(R.size()), lse(static_cast<size_t>(s.B) * s.NH * s.T), dqkv(qkv.size());
    std::vector<float> scratch(attention_scratch_floats(s.T, s.hd, 4));
    attention_gqa_doc_forward(out.data(), lse.data(), qkv.data(), ds.data(), scratch.data(), s.B, s.T, s.NH, s.KV,
                              s.hd);
    attention_gqa_doc_backward(dqkv.data(), R.data(), qkv.data(), out.data(), lse.data(), ds.data(), scratch.data(),
                               s.B, s.T, s.NH, s.KV, s.hd);
    const Reference ref = reference(s, qkv, ds, R);
    const std::string what = "T=" + std::to_string(s.T) + " KV=" + std::to_string(s.KV);
    for (size_t i = 0; i < out.size(); i++) ASSERT_NEAR(out[i], ref.out[i], 2e-5) << what << " out " << i;
    for (size_t i = 0; i < lse.size(); i++) ASSERT_NEAR(lse[i], ref.lse[i], 2e-5) << what << " lse " << i;
    for (size_t i = 0; i < dqkv.size(); i++) ASSERT_NEAR(dqkv[i], ref.dqkv[i], 5e-5) << what << " dqkv " << i;
  }
}

TEST_F(AttentionDoc, GradientMatchesFiniteDifferences) {
  const Shape s{2, 9, 2, 1, 4};
  const auto ds = starts_from(s, {{0, 4, 5}, {3}});
  auto qkv = randn(static_cast<size_t>(s.B) * s.T * s.st(), 31);
  const auto R = randn(static_cast<size_t>(s.B) * s.T * s.os(), 32);
  std::vector<float> out(R.size()), lse(static_cast<size_t>(s.B) * s.NH * s.T), dqkv(qkv.size());
  std::vector<float> scratch(attention_scratch_floats(s.T, s.hd, 4));
  attention_gqa_doc_forward(out.data(), lse.data(), qkv.data(), ds.data(), scratch.data(), s.B, s.T, s.NH, s.KV, s.hd);
  attention_gqa_doc_backward(dqkv.data(), R.data(), qkv.data(), out.data(), lse.data(), ds.data(), scratch.data(), s.B,
                             s.T, s.NH, s.KV, s.hd);
  auto loss = [&] {
    std::vector<float> o(R.size()), l(lse.size());
    attention_gqa_doc_forward(o.data(), l.data(), qkv.data(), ds.data(), scratch.data(), s.B, s.T, s.NH, s.KV, s.hd);
    return dot(o.data(), R);
  };
  check_grad("doc attention dqkv", qkv, dqkv, loss, {}, 400);
}

TEST_F(AttentionDoc, NullStartsAreThePlainKernelBitForBit) {
  const Shape s{2, 130, 4, 2, 8};
  const auto qkv = randn(static_cast<size_t>(s.B) * s.T * s.st(), 41);
  const auto R = randn(static_cast<size_t>(s.B) * s.T * s.os(), 42);
  std::vector<float> o1(R.size()), o2(R.size()), l1(static_cast<size_t>(s.B) * s.NH * s.T), l2(l1.size());
  std::vector<float> d1(qkv.size()), d2(qkv.size());
  std::vector<float> scratch(attention_scratch_floats(s.T, s.hd, 4));
  attention_gqa_forward(o1.data(), l1.data(), qkv.data(), scratch.data(), s.B, s.T, s.NH, s.KV, s.hd);
  attention_gqa_doc_forward(o2.data(), l2.data(), qkv.data(), nullptr, scratch.data(), s.B, s.T, s.NH, s.KV, s.hd);
  attention_gqa_backward(d1.data(), R.data(), qkv.data(), o1.data(), l1.data(), scratch.data(), s.B, s.T, s.NH, s.KV,
                         s.hd);
  attention_gqa_doc_backward(d2.data(), R.data(), qkv.data(), o2.data(), l2.data(), nullptr, scratch.data(), s.B, s.T,
                             s.NH, s.KV, s.hd);
  for (size_t i = 0; i < o1.size(); i++) ASSERT_EQ(o1[i], o2[i]) << i;
  for (size_t i = 0; i < l1.size(); i++) ASSERT_EQ(l1[i], l2[i]) << i;
  for (size_t i = 0; i < d1.size(); i++) ASSERT_EQ(d1[i], d2[i]) << i;
  // Starts that are all 0 (one document per sequence) give the same numbers as no documents.
  const std::vector<int32_t> zeros(static_cast<size_t>(s.B) * s.T, 0);
  attention_gqa_doc_forward(o2.data(), l2.data(), qkv.data(), zeros.data(), scratch.data(), s.B, s.T, s.NH, s.KV,
                            s.hd);
  for (size_t i = 0; i < o1.size(); i++) ASSERT_EQ(o1[i], o2[i]) << i;
}

TEST_F(AttentionDoc, Bf16StorageFollowsFp32) {
  using ds::rt::bf16;
  const Shape s{2, 80, 4, 2, 16};
  const auto ds = starts_from(s, {{0, 10, 64, 65}, {30}});
  auto qkv = randn(static_cast<size_t>(s.B) * s.T * s.st(), 51);
  const auto R = randn(static_cast<size_t>(s.B) * s.T * s.os(), 52);
  for (auto& v : qkv) v = ds::rt::to_f32(ds::rt::from_f32<bf16>(v));  // the same inputs for both
  std::vector<float> out(R.size()), lse(static_cast<size_t>(s.B) * s.NH * s.T), dqkv(qkv.size());
  std::vector<float> scratch(attention_scratch_floats(s.T, s.hd, 2));
  attention_gqa_doc_forward(out.data(), lse.data(), qkv.data(), ds.data(), scratch.data(), s.B, s.T, s.NH, s.KV, s.hd);
  attention_gqa_doc_backward(dqkv.data(), R.data(), qkv.data(), out.data(), lse.data(), ds.data(), scratch.data(), s.B,
                             s.T, s.NH, s.KV, s.hd);
  const auto q16 = stored<bf16>(qkv), r16 = stored<bf16>(R);
  std::vector<bf16> o16(R.size()), d16(qkv.size());
  std::vector<float> l16(lse.size());
  attention_gqa_doc_forward(o16.data(), l16.data(), q16.data(), ds.data(), scratch.data(), s.B, s.T, s.NH, s.KV, s.hd);
  attention_gqa_doc_backward(d16.data(), r16.data(), q16.data(), o16.data(), l16.data(), ds.data(), scratch.data(), s.B,
                             s.T, s.NH, s.KV, s.hd);
  for (size_t i = 0; i < out.size(); i++) ASSERT_NEAR(ds::rt::to_f32(o16[i]), out[i], 2e-2) << "out " << i;
  for (size_t i = 0; i < lse.size(); i++) ASSERT_NEAR(l16[i], lse[i], 2e-2) << "lse " << i;
  for (size_t i = 0; i < dqkv.size(); i++) {
    ASSERT_NEAR(ds::rt::to_f32(d16[i]), dqkv[i], 3e-2 + 2e-2 * std::fabs(dqkv[i])) << "dqkv " << i;
  }
}
