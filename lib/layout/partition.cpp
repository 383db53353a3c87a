// ZeRO flat partitions and pipeline stage bounds and parts (see partition.h).
//
// Stage bounds by parameters: contiguous ranges, so the best split is a small dynamic programme
// over (stages placed, layers covered) minimising the largest stage's count, O(pp * L^2).
#include "layout/partition.h"

#include <algorithm>
#include <limits>

#include "common/error.h"

namespace ds::layout {

using namespace ds::model_spec;

Partition::Partition(int64_t total, int size) : total_(total), size_(size) {
  if (total < 0 || size < 1) {
    throw invalid_argument("partition: need total >= 0 and size >= 1, got total {} size {}", total, size);
  }
  const int64_t per = (total + size - 1) / size;
  stride_ = (per + kAlignElements - 1) / kAlignElements * kAlignElements;
}

int64_t Partition::begin(int r) const {
  if (r < 0 || r >= size_) throw invalid_argument("partition: rank {} outside [0, {})", r, size_);
  return std::min(total_, stride_ * r);
}

int64_t Partition::count(int r) const { return std::min(stride_, total_ - begin(r)); }

std::vector<size_t> Partition::counts() const { return counts_in(0, total_); }

std::vector<size_t> Partition::counts_in(int64_t lo, int64_t hi) const {
  if (lo < 0 || hi > total_ || lo > hi) {
    throw invalid_argument("partition: range [{}, {}) is not within [0, {})", lo, hi, total_);
  }
  std::vector<size_t> out(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    out[static_cast<size_t>(r)] = static_cast<size_t>(intersect(lo, hi, begin(r), end(r)).size());
  }
  return out;
}

int Partition::owner(int64_t i) const {
  if (i < 0 || i >= total_) throw invalid_argument("partition: element {} outside [0, {})", i, total_);
  return static_cast<int>(i / stride_);
}

Range intersect(int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
  Range r{std::max(a0, b0), std::min(a1, b1)};
  if (r.hi < r.lo) r.hi = r.lo;
  return r;
}

std::vector<int> stage_layer_bounds(const ModelShape& s, int pp, StageSplit split, int tp) {
  s.validate();
  const int L = s.n_layer;
  if (pp < 1) throw invalid_argument("pipeline: {} stages (need at least 1)", pp);
  if (pp > L) {
    throw invalid_argument(
        "pipeline: {} stages but the model has {} layers; every stage needs at least one layer "
        "(hint: use at most {} pipeline stages, or a deeper model)",
        pp, L, L);
  }
  const auto P = static_cast<size_t>(pp);
  std::vector<int> bounds(P + 1, 0);
  if (split == StageSplit::kUniform || pp == 1) {
    for (size_t i = 0; i < P; ++i) {
      bounds[i + 1] = bounds[i] + L / pp + (static_cast<int>(i) < L % pp ? 1 : 0);
    }
    return bounds;
  }
  // The first stage also holds the embeddings, the last the final norm, the lm_head (untied) or
  // its copy of the tied token embedding.
  int64_t first_extra = 0, last_extra = 0;
  for (const auto& t : model_params(s)) {
    const int64_t n = local_numel(t, tp);
    if (t.unit == UnitKind::kTokenEmbedding || t.unit == UnitKind::kPositionEmbedding) first_extra += n;
    if (t.unit == UnitKind::kFinalNorm || (t.unit == UnitKind::kTokenEmbedding && s.tied())) last_extra += n;
  }
  const int64_t layer = layer_param_count(s, tp);
  auto cost = [&](int stage, int a, int b) {
    int64_t c = layer * (b - a);
    if (stage == 0) c += first_extra;
    if (stage == pp - 1) c += last_extra;
    return c;
  };
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  const auto N = static_cast<size_t>(L);
  // best[i][b]: the smallest largest-stage count placing stages 0..i-1 over layers [0, b); a
  // strictly smaller value replaces, so the earliest boundary wins ties.
  std::vector<std::vector<int64_t>> best(P + 1, std::vector<int64_t>(N + 1, kInf));
  std::vector<std::vector<int>> from(P + 1, std::vector<int>(N + 1, -1));
  best[0][0] = 0;
  for (int i = 1; i <= pp; ++i) {
    const auto I = static_cast<size_t>(i);
    for (int b = i; b <= L - (pp - i); ++b) {
      const auto Bb = static_cast<size_t>(b);
      for (int a = i - 1; a < b; ++a) {
        const int64_t prev = best[I - 1][static_cast<size_t>(a)];
        if (prev == kInf) continue;
        const int64_t v = std::max(prev, cost(i - 1, a, b));
        if (v < best[I][Bb]) {
          best[I][Bb] = v;
          from[I][Bb] = a;
        }
      }
    }
  }
  bounds[P] = L;
  for (size_t i = P; i > 0; --i) bounds[i - 1] = from[i][static_cast<size_t>(bounds[i])];
  return bounds;
}

std::vector<ModelPart> partition_stages(const ModelShape& s, int pp, StageSplit split, int tp, int tp_rank) {
  const auto bounds = stage_layer_bounds(s, pp, split, tp);
  std::vector<ModelPart> parts;
  for (int i = 0; i < pp; ++i) {
    const auto I = static_cast<size_t>(i);
    ModelPart p{bounds[I], bounds[I + 1], i == 0, i == pp - 1, tp, tp_rank};
    p.validate(s);
    parts.push_back(p);
  }
  return parts;
}

ZeroGradientBuffers zero_gradient_buffers(const model_spec::ParamLayout& layout, int64_t reduce_bucket_size) {
  ZeroGradientBuffers z;
  int64_t max_unit = 0, rest = 0;
  for (const auto& u : layout.units) {
    if (u.kind == model_spec::UnitKind::kTokenEmbedding) {
      z.token_embedding = u.numel;
      continue;
    }
    max_unit = std::max(max_unit, u.numel);
    rest += u.numel;
  }
  z.bucket = std::max(max_unit, std::min(reduce_bucket_size, rest));
  return z;
}

}  // namespace ds::layout
