// Weighted blends of data sources (Megatron's `--data-path 0.7 a 0.3 b`): which source, and which
// window of it, every data-parallel rank reads at every micro-step.
//
// Legend as in loader.h: B = micro-batch size per rank, T = sequence length, N = data-parallel
// size, r = data-parallel rank, G = gradient accumulation steps, k = this rank's micro-step
// counted from the start of training. Sources s = 0..S-1 with weights w_s >= 0 (sum > 0).
//
// - Each source is its own corpus (corpus.h: a path or glob, many shards read as one stream,
//   loss masks beside the files). A window is B*T+1 tokens of one source, starting at a multiple
//   of B*T as in loader.h; W_s = floor((n_s - 1) / (B*T)) windows fit in source s, and every
//   source must hold at least one.
// - Global window index: micro-step k of rank r reads window g = k*N + r. One optimizer step
//   (G micro-steps of all N ranks) reads g in [j*N*G, (j+1)*N*G), so every layout with the same
//   N*G (dp 1 with G 4, dp 2 with G 2, dp 4 with G 1) reads the same windows in each step.
// - The draw: the source of window g depends on (seed, g) alone. A Weyl sequence
//     u_g = offset + g * 0x9E3779B97F4A7C15   (uint64 arithmetic, mod 2^64; the constant is
//                                             2^64 / golden ratio, SplitMix64's increment)
//     offset = mix64(seed ^ 0x626C656E64)     (splitmix.h's finaliser; the constant is "blend")
//   and thresholds t_s = floor(2^64 * (w_0 + ... + w_s) / sum w), with t_s = 2^64 - 1 from the
//   last source of positive weight on; the source is the first s with u_g < t_s (the last source
//   of positive weight when u_g = 2^64 - 1). A zero-weight source has t_s = t_{s-1} and is never
//   drawn.
// - Why this draw: each u_g alone is uniform over the offset, so P(source s) = w_s / sum w
//   exactly; and the golden ratio (the irrational hardest to approximate by fractions) makes
//   g * 2^64/phi a low-discrepancy sequence, so over any n consecutive windows every source's
//   realised share is within O(log n / n) of its weight (a few windows in 10,000), where i.i.d.
//   draws would miss by 1% at 10,000 windows a few percent of the time. The shares are what the
//   config says at every scale a run looks at, not only on average.
// - Position inside a source: c_s(g) = the number of windows j < g drawn from source s. Window g
//   reads window c mod W_s of its source (c = c_s(g)): each source wraps on its own, whenever it
//   runs out, independent of the others and of optimizer steps. With `shuffle`, epoch
//   e = c / W_s of source s reads perm[c mod W_s] instead, perm = shuffle_permutation(
//   mix64(seed ^ mix64(0x626C656E64 + 1 + s)), e, W_s) (loader.h's recipe, a seed per source).
// - Every rank advances the counters through all N windows of each micro-step (one hash each),
//   so the counters, like everything above, depend on g only: a rank needs no communication.
//
// Checkpoints (state_json, the manifest's "data"):
//   {"blend": true, "micro_step": k, "global_window": k*N, "batch_size": B, "seq_len": T,
//    "data_parallel_size": N, "grad_accum_steps": G, "shuffle": bool, "seed": s,
//    "sources": [{"path", "weight", "num_tokens", "windows_drawn": c_s(k*N)}, ...]}
// Restoring is exact with the same sources (count, weights and token counts: paths may move),
// B, T, shuffle, seed and N*G; N and G may differ (a data-parallel resize keeping the global
// batch) at an optimizer-step boundary. The counters are recomputed from the draw and checked
// against windows_drawn. A single corpus's position (loader.h) is refused by name, and the reverse.
//
// Not here: blending by documents or tokens rather than windows, per-source epochs as a budget
// (Megatron's "number of samples"), weights that change during a run.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "data/corpus.h"
#include "data/loader.h"

namespace ds::rt::data {

// One source of a blend: a path or glob (corpus.h) and its weight (>= 0, any scale).
struct WeightedSource {
  std::string path;
  double weight = 0;
};

// The source of every global window (pure: no files, no state). Thread-safe (const).
class BlendDraw {
 public:
  // Throws ds::Error (invalid argument) for no weights, a negative or non-finite weight, or
  // weights that sum to 0.
  BlendDraw(const std::vector<double>& weights, uint64_t seed);
  // The source of global window g >= 0, in [0, size()).
  int source(int64_t g) const;
  int size() const { return static_cast<int>(thresholds_.size()); }
  // w_s / sum w.
  double share(int s) const { return shares_[static_cast<size_t>(s)]; }

 private:
  uint64_t offset_ = 0;
  std::vector<uint64_t> thresholds_;  // t_s
  std::vector<double> shares_;
  int last_positive_ = 0;
};

// A blend's batch order for one rank. Owns its sources' corpora. Not thread-safe (one per rank);
// next() allocates nothing except a source's shuffle permutation (W_s int32) when it enters an
// epoch (two are kept per source, so a step that crosses an epoch does not redraw them).
class BlendLoader final : public BatchReader {
 public:
  // Opens every source (vocab_size > 0 checks every token). Throws ds::Error (invalid argument)
  // for B, T, N, G < 1, a rank outside [0, N), what BlendDraw throws, a source too small for one
  // window of B*T+1 tokens (naming its path and both sizes), and sources that disagree on loss
  // masks (naming the first that differs from source 0).
  BlendLoader(const std::vector<WeightedSource>& sources, const LoaderOptions& options,
              int64_t vocab_size = 0);

  void next(int32_t* inputs, int32_t* targets) override;
  int64_t micro_step() const override { return micro_step_; }
  // Only at the current position (micro_step == micro_step(), a multiple of G): the counted
  // targets of the step's N*G windows over all sources; changes no position.
  int64_t step_counted_targets(int64_t micro_step) override;
  bool has_mask() const override { return masked_; }
  void reset() override;
  nlohmann::json state_json() const override;
  void restore_json(const nlohmann::json& j, const std::string& where) override;

  // Where a window lies: its source and its first token in that source's corpus.
  struct Window {
    int source = 0;
    int64_t start = 0;
    bool operator==(const Window&) const = default;
    bool operator<(const Window& o) const {
      return source != o.source ? source < o.source : start < o.start;
    }
  };
  // The window the next next() of this rank reads (changes no position).
  Window next_window();

  int num_sources() const { return static_cast<int>(sources_.size()); }
  const TokenCorpus& corpus(int s) const { return *sources_[static_cast<size_t>(s)].corpus; }
  // W_s, the windows of source s.
  int64_t windows_in_source(int s) const { return sources_[static_cast<size_t>(s)].windows; }
  // c_s at the current global window k*N.
  int64_t windows_drawn(int s) const { return sources_[static_cast<size_t>(s)].drawn; }
  int64_t global_window() const { return global_; }  // k*N
  const BlendDraw& draw() const { return draw_; }
  const LoaderOptions& options() const { return options_; }

 private:
  struct Source {
    std::string path;  // as configured (a path or glob)
    double weight = 0;
    std::unique_ptr<TokenCorpus> corpus;
    int64_t windows = 0;  // W_s
    uint64_t shuffle_seed = 0;
    int64_t drawn = 0;                          // c_s(global_)
    std::array<int64_t, 2> perm_epoch{-1, -1};  // the epochs perms[e & 1] was drawn for
    std::array<std::vector<int32_t>, 2> perms;
  };
  // First token, in its source, of the c-th window drawn from source s.
  int64_t window_start(int s, int64_t c);
  void recount(int64_t global);  // every c_s at `global`, from the draw

  LoaderOptions options_;
  BlendDraw draw_;
  std::vector<Source> sources_;
  int64_t window_tokens_ = 0;  // B*T
  bool masked_ = false;
  int64_t micro_step_ = 0;
  int64_t global_ = 0;  // k*N: the first global window of this micro-step
};

// Validation on a blend: the blend's windows from g = 0 in the sequential order within each source
// (G = 1, no shuffle, seed 0), restarted at every evaluation, as ValidationLoader over one corpus.
// Throws ds::Error (invalid argument) for eval_steps < 1, what BlendLoader throws, and, naming the
// source, a source that the first eval_steps*N windows would draw more than W_s times (it would
// wrap within one evaluation).
std::unique_ptr<ValidationLoader> blend_validation_loader(
    const std::vector<WeightedSource>& sources, int64_t batch_size, int64_t seq_len,
    int64_t data_parallel_size, int64_t data_parallel_rank, int64_t eval_steps,
    int64_t vocab_size = 0);

}  // namespace ds::rt::data
