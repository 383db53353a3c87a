// The batch order: which tokens every data-parallel rank reads at every micro-step, as llm.c's
// data loader has it, made exact for any number of ranks and for resuming.
//
// Legend: B = micro-batch size per rank, T = sequence length, N = data-parallel size,
// r = data-parallel rank, G = gradient accumulation steps (micro-steps per optimizer step),
// n = tokens in the file, k = this rank's micro-step counted from the start of training across
// steps, accumulation and epochs.
//
// A window is B*T+1 consecutive tokens; window w starts at token w*B*T (windows overlap by the
// one token that is the last target of w and the first input of w+1). Inputs are the window's
// first B*T tokens, targets its last B*T (shifted by one), each read row-major as (B, T).
//   W = floor((n - 1) / (B*T))   windows that fit entirely in the file
//   S = N*G                      windows one optimizer step reads across all ranks
//   E = floor(W / S)             optimizer steps per epoch
// Within an epoch, micro-step k_e = k mod (E*G) of rank r reads slot k_e*N + r, so in the first
// epoch that is the window starting at token (k*N + r)*B*T (llm.c's order). "The next windows
// would run past the end" means: the next optimizer step's S windows (every rank, every
// accumulation micro-step) do not all fit in the file; then every rank starts over from its
// first window together, at the same micro-step. The wrap therefore happens at an optimizer-step
// boundary and never splits a step across epochs, and it depends only on n, B, T and N*G: a
// single process with G' = N*G reads exactly the same windows per step as N ranks with G.
// With shuffle on, slot s of epoch e reads window perm_e[s] instead, where perm_e is a
// permutation of all W windows drawn from (seed, e) alone (see loader.cpp): the same on every
// rank and independent of the tensor/pipeline layout and of N and G.
//
// The corpus may be many shards (corpus.h): n is their total, and windows read across shard
// boundaries, so a corpus split into shards gives the same batches as the unsplit file. Several
// corpora mixed by weight are blend.h's; BatchReader below is what the trainer sees of either.
//
// Loss masks (sft.h): when the corpus has masks, a target whose token is masked out is -1
// (kIgnoreTarget) in the targets next() fills; step_counted_targets says how many targets of a
// whole optimizer step count, from the masks of all its N*G windows (no collective needed).
//
// Not here: sequence packing across documents, attention masks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "data/corpus.h"

namespace ds::rt::data {

struct LoaderOptions {
  int64_t batch_size = 0;        // B, sequences per micro-batch on this rank
  int64_t seq_len = 0;           // T
  int64_t data_parallel_size = 1;  // N
  int64_t data_parallel_rank = 0;  // r, in [0, N)
  int64_t grad_accum_steps = 1;    // G, micro-steps per optimizer step (where epochs may wrap)
  bool shuffle = false;
  uint64_t seed = 0;
};

// Throws ds::Error (invalid argument) "<who>: ..." for B, T, N, G < 1 or a rank outside [0, N).
void check_loader_options(const LoaderOptions& o, const std::string& who);

// Where a loader is: enough to resume exactly. Serialised into checkpoints as JSON (to_json):
//   {"micro_step": k, "epoch": e, "position": first token of the next window,
//    "windows_consumed": k*N, "batch_size": B, "seq_len": T, "data_parallel_size": N,
//    "grad_accum_steps": G, "shuffle": bool, "seed": s, "num_tokens": n}
// Only micro_step (with the options) determines the position; the rest is recorded so a restore
// can check it resumes the same stream.
struct LoaderState {
  int64_t micro_step = 0;
  int64_t epoch = 0;
  int64_t position = 0;
  int64_t windows_consumed = 0;
  int64_t batch_size = 0;
  int64_t seq_len = 0;
  int64_t data_parallel_size = 0;
  int64_t grad_accum_steps = 0;
  bool shuffle = false;
  uint64_t seed = 0;
  int64_t num_tokens = 0;

  nlohmann::json to_json() const;
  // Throws ds::Error naming `where` (a JSON path) and the missing or malformed key.
  static LoaderState from_json(const nlohmann::json& j, const std::string& where);
};

// What the trainer and checkpoints need of a training-data reader, so they hold either this
// file's DataLoader (one corpus) or blend.h's BlendLoader (a weighted blend of corpora). One
// reader per rank; not thread-safe. Every method may throw ds::Error as its implementation says.
class BatchReader {
 public:
  virtual ~BatchReader() = default;
  // Fills inputs[B*T] and targets[B*T] (row-major (B, T)) with this rank's next micro-batch and
  // advances by one micro-step; masked-out targets are -1 (kIgnoreTarget).
  virtual void next(int32_t* inputs, int32_t* targets) = 0;
  // Micro-steps read since the start of training (or since reset()).
  virtual int64_t micro_step() const = 0;
  // The targets that count in the optimizer step starting at `micro_step` (a multiple of G):
  // over its G micro-steps and all N ranks' windows; N*G*B*T without masks. A blend answers
  // only at its current position (micro_step == micro_step()), as the trainer asks.
  virtual int64_t step_counted_targets(int64_t micro_step) = 0;
  // Whether the data has loss masks (sft.h).
  virtual bool has_mask() const = 0;
  // Back to micro-step 0.
  virtual void reset() = 0;
  // The position as the checkpoint manifest's "data" JSON, and back: restore_json throws
  // ds::Error (invalid argument) naming `where` (the manifest) and the field that differs.
  virtual nlohmann::json state_json() const = 0;
  virtual void restore_json(const nlohmann::json& j, const std::string& where) = 0;
};

// Reads micro-batches of one rank from a corpus. Not thread-safe (one loader per rank). The
// TokenCorpus must outlive the loader and stay where it is (the loader keeps its address). The only allocation is the shuffle permutation (W int32),
// made once per epoch; next() allocates nothing.
class DataLoader final : public BatchReader {
 public:
  // Throws ds::Error (invalid argument) for B, T, N, G < 1, a rank outside [0, N), or a file too
  // small for one optimizer step (fewer than N*G*B*T + 1 tokens), naming the file.
  DataLoader(const TokenCorpus& file, const LoaderOptions& options);

  // Fills inputs[B*T] and targets[B*T] (row-major (B, T)) with this rank's next micro-batch and
  // advances by one micro-step. Buffers are the caller's; their size is the caller's contract.
  void next(int32_t* inputs, int32_t* targets) override;

  // First token of the window this rank reads at micro-step k (pure: no state changes).
  int64_t window_start(int64_t micro_step) const;

  // The targets that count in the optimizer step starting at micro-step k (a multiple of G):
  // over its G micro-steps and all N ranks' windows, B*T targets each; N*G*B*T without masks.
  int64_t step_counted_targets(int64_t micro_step) override;

  int64_t micro_step() const override { return micro_step_; }
  bool has_mask() const override { return file_->has_mask(); }
  int64_t epoch() const { return micro_step_ / micro_steps_per_epoch(); }
  int64_t windows_in_file() const { return windows_; }          // W
  int64_t steps_per_epoch() const { return steps_per_epoch_; }  // E (optimizer steps)
  int64_t micro_steps_per_epoch() const { return steps_per_epoch_ * options_.grad_accum_steps; }
  const LoaderOptions& options() const { return options_; }

  // Back to micro-step 0 (epoch 0).
  void reset() override { micro_step_ = 0; }

  LoaderState state() const;
  // Resumes at `s`. Exact when B, T, the corpus (token count), shuffle and seed are the same and
  // the global step size N*G is the same; N and G themselves may differ (a data-parallel resize
  // that keeps the global batch) if `s` is at an optimizer-step boundary. Anything else throws
  // ds::Error (invalid argument) naming the field that differs and both values.
  void restore(const LoaderState& s);
  // state().to_json(), and restore(LoaderState::from_json(j, where)); a blend's position
  // (blend.h, "blend": true) is refused by name.
  nlohmann::json state_json() const override;
  void restore_json(const nlohmann::json& j, const std::string& where) override;

 private:
  int64_t window_index(int64_t micro_step, const std::vector<int32_t>* perm) const;
  void ensure_permutation(int64_t epoch);

  const TokenCorpus* file_;
  LoaderOptions options_;
  int64_t window_tokens_ = 0;  // B*T
  int64_t windows_ = 0;        // W
  int64_t steps_per_epoch_ = 0;
  int64_t micro_step_ = 0;
  int64_t perm_epoch_ = -1;  // epoch perm_ was drawn for
  std::vector<int32_t> perm_;
};

// perm_e for shuffling: a permutation of [0, count) drawn from (seed, epoch) by Fisher-Yates with
// SplitMix64 (loader.cpp documents the exact recipe). Written into `out` (resized).
void shuffle_permutation(uint64_t seed, int64_t epoch, int64_t count, std::vector<int32_t>& out);

// Validation batches: eval_steps micro-batches of N ranks from the start of the data, in the
// sequential order (no shuffle, G = 1), restarted by begin() for every evaluation. The reader is a
// DataLoader over one corpus, or a weighted blend's (blend.h: blend_validation_loader).
class ValidationLoader {
 public:
  // Throws ds::Error (invalid argument) naming the file when it holds fewer than eval_steps
  // rounds of N windows, or eval_steps < 1.
  ValidationLoader(const TokenCorpus& file, int64_t batch_size, int64_t seq_len,
                   int64_t data_parallel_size, int64_t data_parallel_rank, int64_t eval_steps);
  // Any reader already set up for G = 1 and checked to hold eval_steps micro-steps.
  ValidationLoader(std::unique_ptr<BatchReader> reader, int64_t eval_steps);
  void begin() { loader_->reset(); }
  void next(int32_t* inputs, int32_t* targets) { loader_->next(inputs, targets); }
  int64_t eval_steps() const { return eval_steps_; }
  bool has_mask() const { return loader_->has_mask(); }

 private:
  std::unique_ptr<BatchReader> loader_;
  int64_t eval_steps_;
};

}  // namespace ds::rt::data
