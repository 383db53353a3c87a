// Grad norms and clipping as PyTorch's clip_grad_norm_, split into partial sums the way ZeRO
// will all-reduce them; inf/nan detection.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/typed.h"
#include "optim/clip.h"

namespace ds::rt::optim {
namespace {

// The norms are CPU kernels; the clipping coefficient is the optimizer's.
using cpu::all_finite;
using cpu::scale_in_place;
using cpu::sum_of_squares;

// training.sync_norm_once: the sums of several spans at once are each span's sum, bit for bit,
// in every storage type and in a mix of them (on a GPU they come back in one copy per type).
TEST(Clip, SumsOfSquaresOfSpansAreEachSpansSum) {
  const int64_t n = 70001;  // past the parallel threshold, and odd
  std::vector<float> g(n);
  for (int64_t i = 0; i < n; ++i) g[i] = std::sin(0.001f * static_cast<float>(i)) * (i % 7 == 0 ? 30.f : 1.f);
  std::vector<bf16> h(n);
  cpu::convert(h.data(), g.data(), n);
  for (DType t : {DType::kF32, DType::kBF16}) {
    void* base = t == DType::kF32 ? static_cast<void*>(g.data()) : static_cast<void*>(h.data());
    const TypedPtr x(base, t);
    const std::vector<std::pair<TypedPtr, int64_t>> spans = {{x, 40000}, {x + 40000, 0}, {x + 40000, 30001}, {x + 5, 3}};
    const std::vector<double> sums = kern::typed::sums_of_squares(spans);
    ASSERT_EQ(sums.size(), spans.size());
    for (size_t i = 0; i < spans.size(); ++i) {
      EXPECT_EQ(sums[i], kern::typed::sum_of_squares(spans[i].first, spans[i].second)) << "span " << i;
    }
  }
  EXPECT_TRUE(kern::typed::sums_of_squares({}).empty());
  const std::vector<std::pair<TypedPtr, int64_t>> mixed = {{TypedPtr(g.data(), DType::kF32), 50000},
                                                           {TypedPtr(h.data(), DType::kBF16), 60000},
                                                           {TypedPtr(g.data() + 7, DType::kF32), 3}};
  const std::vector<double> sums = kern::typed::sums_of_squares(mixed);
  for (size_t i = 0; i < mixed.size(); ++i) {
    EXPECT_EQ(sums[i], kern::typed::sum_of_squares(mixed[i].first, mixed[i].second)) << "mixed span " << i;
  }
}

TEST(Clip, NormOfSpansCombinesPartials) {
  // 3-4-12: the norm of {3, 4} is 5, with 12 it is 13.
  std::vector<float> a = {3.f, 4.f}, b = {12.f};
  const double partial = sum_of_squares(a.data(), 2) + sum_of_squares(b.data(), 1);
  EXPECT_EQ(std::sqrt(partial), 13.0);

  // A large buffer: the parallel path equals a serial double sum closely, and shards add up.
  const int64_t n = 300000;
  std::vector<float> g(n);
  double ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    g[i] = 0.001f * static_cast<float>((i * 7919) % 2001 - 1000);
    ref += static_cast<double>(g[i]) * g[i];
  }
  EXPECT_NEAR(sum_of_squares(g.data(), n), ref, 1e-9 * ref);
  const double shards = sum_of_squares(g.data(), 100000) +
                        sum_of_squares(g.data() + 100000, 150001) +
                        sum_of_squares(g.data() + 250001, n - 250001);
  EXPECT_NEAR(shards, ref, 1e-9 * ref);
}

TEST(Clip, CoefficientAsPyTorch) {
  // torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied when < 1.
  EXPECT_DOUBLE_EQ(clip_coefficient(13.0, 1.0), 1.0 / (13.0 + 1e-6));
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_EQ(clip_coefficient(13.0, 0.0), 1.0);  // gradient_clipping = 0: off
  EXPECT_EQ(clip_coefficient(std::numeric_limits<double>::infinity(), 1.0), 1.0);

  std::vector<float> a = {3.f, 4.f, 12.f};
  const double norm = std::sqrt(sum_of_squares(a.data(), 3));
  scale_in_place(a.data(), 3, static_cast<float>(clip_coefficient(norm, 1.0)));
  EXPECT_NEAR(std::sqrt(sum_of_squares(a.data(), 3)), 1.0, 1e-6);
  EXPECT_NEAR(a[2], 12.0 / 13.0, 1e-6);
}

TEST(Clip, InfAndNanAreOverflow) {
  std::vector<float> g(100000, 0.5f);
  EXPECT_TRUE(all_finite(g.data(), static_cast<int64_t>(g.size())));
  EXPECT_TRUE(std::isfinite(sum_of_squares(g.data(), static_cast<int64_t>(g.size()))));
  g[77777] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(all_finite(g.data(), static_cast<int64_t>(g.size())));
  EXPECT_FALSE(std::isfinite(sum_of_squares(g.data(), static_cast<int64_t>(g.size()))));
  g[77777] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(all_finite(g.data(), static_cast<int64_t>(g.size())));
  EXPECT_FALSE(std::isfinite(sum_of_squares(g.data(), static_cast<int64_t>(g.size()))));
  float big = 3e38f;  // finite, and its square is finite in double
  EXPECT_TRUE(all_finite(&big, 1));
  EXPECT_TRUE(std::isfinite(sum_of_squares(&big, 1)));
}

}  // namespace
}  // namespace ds::rt::optim
