// The rank grid of a job: world ranks arranged as pp x dp x cp x tp with tensor-parallel ranks
// adjacent (a TP group stays inside a node), then context-parallel, then data-parallel, then
// pipeline:
//   rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank   (ARCHITECTURE.md, "Topology")
// The order is by traffic per step, heaviest innermost, as Megatron orders tp-cp-dp-pp: tp moves
// activations in every layer, cp moves keys and values (ring) or heads (Ulysses) in every
// attention, dp moves gradients once per step, pp one activation per micro-batch boundary. With
// cp = 1 (no context parallelism) the grid and every rank number are as before.
// One Topology value answers every "who is in my group" question for the runtime and the plan.
//
// Deliberately pure arithmetic: no communication, no environment, no config parsing. Building
// the groups' Comms from these rank lists is the caller's job (every member calls new_group with
// the same list, in the order given here).
#pragma once

#include <vector>

namespace ds::layout {

enum class Axis { kTp, kDp, kPp, kCp };
const char* axis_name(Axis a);  // "tp", "dp", "pp", "cp"

struct Coord {
  int pp = 0, dp = 0, tp = 0, cp = 0;
  bool operator==(const Coord&) const = default;
};

class Topology {
 public:
  // Throws ds::invalid_argument when a size is < 1 or tp * cp * dp * pp != world_size, naming
  // the numbers.
  Topology(int world_size, int tp, int dp, int pp, int cp = 1);

  int world_size() const { return tp_ * cp_ * dp_ * pp_; }
  int tp() const { return tp_; }
  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int cp() const { return cp_; }
  int size(Axis a) const;

  // invalid_argument for a rank or coordinate outside the grid.
  int rank_of(const Coord& c) const;
  Coord coord_of(int rank) const;

  // The world ranks of `rank`'s group along `a`, ordered by that axis' coordinate (so the
  // group-local rank of a member is its index here). `rank` is one of them.
  std::vector<int> group_of(int rank, Axis a) const;
  // Every group along `a`, each as group_of returns it, ordered by the lowest member.
  std::vector<std::vector<int>> groups(Axis a) const;
  // A stable name for rank's group along `a`: "dp" + index of the group among groups(a), e.g.
  // "dp0", "tp3" (used as the Comm subgroup name).
  int group_index(int rank, Axis a) const;
  // The ranks that hold the same parameters as `rank` (same pp and tp coordinates): its dp x cp
  // ranks, ordered by (dp, cp). Gradients are reduced over them (the cp ranks saw other tokens of
  // the same sequences); with cp = 1 it is the dp group.
  std::vector<int> gradient_group(int rank) const;
  // Expert parallelism of size ep (a divisor of dp x cp), carved from the gradient group as
  // Megatron carves it: the gradient group split into consecutive runs of ep ranks. expert_group:
  // rank's run (the experts are split over it; tokens go to their experts by all-to-all);
  // expert_rank: its index there; expert_data_group: the ranks at the same index of every run
  // (they hold the same experts: the experts' gradients are reduced over them). invalid_argument
  // when ep does not divide dp x cp.
  std::vector<int> expert_group(int rank, int ep) const;
  std::vector<int> expert_data_group(int rank, int ep) const;
  int expert_rank(int rank, int ep) const;

 private:
  int tp_, dp_, pp_, cp_;
};

}  // namespace ds::layout
