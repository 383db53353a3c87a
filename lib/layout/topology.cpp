#include "layout/topology.h"

#include <algorithm>

#include "common/error.h"

namespace ds::layout {

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::kTp: return "tp";
    case Axis::kDp: return "dp";
    case Axis::kPp: return "pp";
    case Axis::kCp: return "cp";
  }
  return "?";
}

Topology::Topology(int world_size, int tp, int dp, int pp, int cp) : tp_(tp), dp_(dp), pp_(pp), cp_(cp) {
  if (tp < 1 || dp < 1 || pp < 1 || cp < 1) {
    throw invalid_argument("topology: sizes must be >= 1, got tp {} cp {} dp {} pp {}", tp, cp, dp, pp);
  }
  const long long n = static_cast<long long>(tp) * cp * dp * pp;
  if (n != world_size) {
    if (cp == 1) {
      throw invalid_argument("topology: tp {} x dp {} x pp {} = {} ranks, but the world has {}", tp, dp, pp, n,
                             world_size);
    }
    throw invalid_argument("topology: tp {} x cp {} x dp {} x pp {} = {} ranks, but the world has {}", tp, cp, dp,
                           pp, n, world_size);
  }
}

int Topology::size(Axis a) const {
  switch (a) {
    case Axis::kTp: return tp_;
    case Axis::kDp: return dp_;
    case Axis::kPp: return pp_;
    case Axis::kCp: return cp_;
  }
  return 0;
}

int Topology::rank_of(const Coord& c) const {
  if (c.tp < 0 || c.tp >= tp_ || c.dp < 0 || c.dp >= dp_ || c.pp < 0 || c.pp >= pp_ || c.cp < 0 || c.cp >= cp_) {
    if (cp_ == 1 && c.cp == 0) {
      throw invalid_argument("topology: coordinate (pp {}, dp {}, tp {}) is outside the grid "
                             "pp {} x dp {} x tp {}",
                             c.pp, c.dp, c.tp, pp_, dp_, tp_);
    }
    throw invalid_argument("topology: coordinate (pp {}, dp {}, cp {}, tp {}) is outside the grid "
                           "pp {} x dp {} x cp {} x tp {}",
                           c.pp, c.dp, c.cp, c.tp, pp_, dp_, cp_, tp_);
  }
  return ((c.pp * dp_ + c.dp) * cp_ + c.cp) * tp_ + c.tp;
}

Coord Topology::coord_of(int rank) const {
  if (rank < 0 || rank >= world_size()) {
    throw invalid_argument("topology: rank {} is outside [0, {})", rank, world_size());
  }
  Coord c;
  c.tp = rank % tp_;
  c.cp = (rank / tp_) % cp_;
  c.dp = (rank / (tp_ * cp_)) % dp_;
  c.pp = rank / (tp_ * cp_ * dp_);
  return c;
}

std::vector<int> Topology::group_of(int rank, Axis a) const {
  Coord c = coord_of(rank);
  std::vector<int> out;
  for (int i = 0; i < size(a); ++i) {
    Coord m = c;
    if (a == Axis::kTp) m.tp = i;
    if (a == Axis::kDp) m.dp = i;
    if (a == Axis::kPp) m.pp = i;
    if (a == Axis::kCp) m.cp = i;
    out.push_back(rank_of(m));
  }
  return out;
}

std::vector<int> Topology::gradient_group(int rank) const {
  const Coord c = coord_of(rank);
  std::vector<int> out;
  for (int d = 0; d < dp_; ++d) {
    for (int k = 0; k < cp_; ++k) out.push_back(rank_of(Coord{c.pp, d, c.tp, k}));
  }
  return out;
}

namespace {
void check_ep(int ep, int dp, int cp) {
  if (ep < 1 || (dp * cp) % ep != 0) {
    throw invalid_argument("topology: expert-parallel size {} must divide the data-parallel x context-parallel ranks "
                           "({} x {})",
                           ep, dp, cp);
  }
}
}  // namespace

int Topology::expert_rank(int rank, int ep) const {
  check_ep(ep, dp_, cp_);
  const auto g = gradient_group(rank);
  return static_cast<int>(std::find(g.begin(), g.end(), rank) - g.begin()) % ep;
}

std::vector<int> Topology::expert_group(int rank, int ep) const {
  check_ep(ep, dp_, cp_);
  const auto g = gradient_group(rank);
  const int at = static_cast<int>(std::find(g.begin(), g.end(), rank) - g.begin());
  return std::vector<int>(g.begin() + at / ep * ep, g.begin() + at / ep * ep + ep);
}

std::vector<int> Topology::expert_data_group(int rank, int ep) const {
  const int e = expert_rank(rank, ep);
  const auto g = gradient_group(rank);
  std::vector<int> out;
  for (size_t i = static_cast<size_t>(e); i < g.size(); i += static_cast<size_t>(ep)) out.push_back(g[i]);
  return out;
}

std::vector<std::vector<int>> Topology::groups(Axis a) const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world_size(); ++r) {
    auto g = group_of(r, a);
    if (g.front() == r || std::find(out.begin(), out.end(), g) == out.end()) {
      if (std::find(out.begin(), out.end(), g) == out.end()) out.push_back(std::move(g));
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return x.front() < y.front(); });
  return out;
}

int Topology::group_index(int rank, Axis a) const {
  auto all = groups(a);
  auto g = group_of(rank, a);
  return static_cast<int>(std::find(all.begin(), all.end(), g) - all.begin());
}

}  // namespace ds::layout
