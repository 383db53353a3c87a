// The batch order of loader.h: window arithmetic, the per-epoch shuffle, state and restore.
#include "data/loader.h"

#include <nlohmann/json.hpp>

#include "common/check.h"
#include "common/error.h"
#include "data/splitmix.h"

namespace ds::rt::data {

namespace {

// SplitMix64's generator (splitmix.h has its finaliser): the shuffle is the same on every
// platform and can be reproduced outside dstrain.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() { return mix64(state += kGamma); }
  // Uniform in [0, bound) without modulo bias: reject the lowest (2^64 mod bound) values.
  uint64_t below(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      uint64_t r = next();
      if (r >= threshold) return r % bound;
    }
  }
};

}  // namespace

// The recipe, exactly: state = mix64(seed) ^ mix64(epoch + kGamma); a = [0, 1, ..., count-1];
// for i = count-1 down to 1: j = below(i + 1); swap(a[i], a[j]).
void shuffle_permutation(uint64_t seed, int64_t epoch, int64_t count, std::vector<int32_t>& out) {
  DS_CHECK(count >= 0 && count <= INT32_MAX, "count {}", count);
  out.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(i);
  SplitMix64 rng{mix64(seed) ^ mix64(static_cast<uint64_t>(epoch) + kGamma)};
  for (int64_t i = count - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
    std::swap(out[i], out[j]);
  }
}

void check_loader_options(const LoaderOptions& o, const std::string& who) {
  auto positive = [&](int64_t v, const char* name) {
    if (v < 1) throw invalid_argument("{}: {} must be at least 1, got {}", who, name, v);
  };
  positive(o.batch_size, "batch_size (B)");
  positive(o.seq_len, "seq_len (T)");
  positive(o.data_parallel_size, "data_parallel_size (N)");
  positive(o.grad_accum_steps, "grad_accum_steps (G)");
  if (o.data_parallel_rank < 0 || o.data_parallel_rank >= o.data_parallel_size) {
    throw invalid_argument("{}: data_parallel_rank {} is outside [0, {})", who, o.data_parallel_rank,
                           o.data_parallel_size);
  }
}

DataLoader::DataLoader(const TokenCorpus& file, const LoaderOptions& options)
    : file_(&file), options_(options) {
  const auto& o = options_;
  check_loader_options(o, "data loader for " + file.path());
  window_tokens_ = o.batch_size * o.seq_len;
  const int64_t n = file.size();
  windows_ = (n - 1) / window_tokens_;
  const int64_t per_step = o.data_parallel_size * o.grad_accum_steps;
  steps_per_epoch_ = windows_ / per_step;
  if (steps_per_epoch_ == 0) {
    throw Error(
        ErrorKind::kInvalidArgument,
        fmt::format("token file {}: {} tokens are too few for one optimizer step: {} ranks x {} "
                    "micro-steps x B*T = {}x{} tokens need at least {} tokens",
                    file.path(), n, o.data_parallel_size, o.grad_accum_steps, o.batch_size,
                    o.seq_len, per_step * window_tokens_ + 1),
        "use a larger corpus, or a smaller batch size, sequence length or accumulation");
  }
}

int64_t DataLoader::window_index(int64_t micro_step, const std::vector<int32_t>* perm) const {
  const int64_t per_epoch = micro_steps_per_epoch();
  const int64_t slot =
      (micro_step % per_epoch) * options_.data_parallel_size + options_.data_parallel_rank;
  return perm != nullptr ? (*perm)[static_cast<size_t>(slot)] : slot;
}

int64_t DataLoader::window_start(int64_t micro_step) const {
  DS_CHECK(micro_step >= 0, "micro_step {}", micro_step);
  if (!options_.shuffle) return window_index(micro_step, nullptr) * window_tokens_;
  const int64_t e = micro_step / micro_steps_per_epoch();
  if (e == perm_epoch_) return window_index(micro_step, &perm_) * window_tokens_;
  std::vector<int32_t> perm;
  shuffle_permutation(options_.seed, e, windows_, perm);
  return window_index(micro_step, &perm) * window_tokens_;
}

void DataLoader::ensure_permutation(int64_t epoch) {
  if (perm_epoch_ == epoch) return;
  shuffle_permutation(options_.seed, epoch, windows_, perm_);
  perm_epoch_ = epoch;
}

void DataLoader::next(int32_t* inputs, int32_t* targets) {
  if (options_.shuffle) ensure_permutation(epoch());
  const int64_t start =
      window_index(micro_step_, options_.shuffle ? &perm_ : nullptr) * window_tokens_;
  DS_CHECK(start + window_tokens_ + 1 <= file_->size(), "window at {} past the end ({} tokens)",
           start, file_->size());
  file_->copy(start, window_tokens_, inputs);
  file_->copy(start + 1, window_tokens_, targets);
  file_->apply_mask(start + 1, window_tokens_, targets);
  ++micro_step_;
}

int64_t DataLoader::step_counted_targets(int64_t micro_step) {
  const auto& o = options_;
  DS_CHECK(micro_step >= 0 && micro_step % o.grad_accum_steps == 0, "micro_step {} with G {}", micro_step,
           o.grad_accum_steps);
  const int64_t windows = o.data_parallel_size * o.grad_accum_steps;
  if (!file_->has_mask()) return windows * window_tokens_;
  // A step never crosses an epoch, so one permutation serves all its windows.
  if (o.shuffle) ensure_permutation(micro_step / micro_steps_per_epoch());
  const int64_t first_slot = (micro_step % micro_steps_per_epoch()) * o.data_parallel_size;
  int64_t n = 0;
  for (int64_t s = first_slot; s < first_slot + windows; ++s) {
    const int64_t w = o.shuffle ? perm_[static_cast<size_t>(s)] : s;
    n += file_->counted(w * window_tokens_ + 1, window_tokens_);
  }
  return n;
}

LoaderState DataLoader::state() const {
  LoaderState s;
  s.micro_step = micro_step_;
  s.epoch = epoch();
  s.position = window_start(micro_step_);
  s.windows_consumed = micro_step_ * options_.data_parallel_size;
  s.batch_size = options_.batch_size;
  s.seq_len = options_.seq_len;
  s.data_parallel_size = options_.data_parallel_size;
  s.grad_accum_steps = options_.grad_accum_steps;
  s.shuffle = options_.shuffle;
  s.seed = options_.seed;
  s.num_tokens = file_->size();
  return s;
}

void DataLoader::restore(const LoaderState& s) {
  const auto& o = options_;
  auto same = [&](const char* name, auto saved, auto now) {
    if (saved != now) {
      throw Error(ErrorKind::kInvalidArgument,
                  fmt::format("data loader for {}: cannot resume: the saved data position has "
                              "{} = {}, this run has {}",
                              file_->path(), name, saved, now),
                  "resume with the data and batch settings the checkpoint was written with");
    }
  };
  same("num_tokens", s.num_tokens, file_->size());
  same("batch_size", s.batch_size, o.batch_size);
  same("seq_len", s.seq_len, o.seq_len);
  same("shuffle", s.shuffle, o.shuffle);
  same("seed", s.seed, o.seed);
  same("windows per optimizer step (data_parallel_size x grad_accum_steps)",
       s.data_parallel_size * s.grad_accum_steps, o.data_parallel_size * o.grad_accum_steps);
  if (s.micro_step < 0 || s.windows_consumed != s.micro_step * s.data_parallel_size) {
    throw invalid_argument("data loader for {}: cannot resume: inconsistent saved position "
                           "(micro_step {}, windows_consumed {}, data_parallel_size {})",
                           file_->path(), s.micro_step, s.windows_consumed,
                           s.data_parallel_size);
  }
  if (s.data_parallel_size == o.data_parallel_size) {
    micro_step_ = s.micro_step;
    return;
  }
  if (s.micro_step % s.grad_accum_steps != 0) {
    throw invalid_argument("data loader for {}: cannot resume with data_parallel_size {} "
                           "(saved with {}): the saved position is inside an optimizer step "
                           "(micro_step {}, grad_accum_steps {})",
                           file_->path(), o.data_parallel_size, s.data_parallel_size,
                           s.micro_step, s.grad_accum_steps);
  }
  micro_step_ = s.micro_step / s.grad_accum_steps * o.grad_accum_steps;
}

nlohmann::json DataLoader::state_json() const { return state().to_json(); }

void DataLoader::restore_json(const nlohmann::json& j, const std::string& where) {
  if (j.is_object() && j.contains("blend")) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{}: the checkpoint's data position is of a weighted blend of sources, but "
                            "this run reads one corpus ({})",
                            where, file_->path()),
                "resume with the config's data.train as it was: a list of {\"path\", \"weight\"} objects");
  }
  restore(LoaderState::from_json(j, where));
}

nlohmann::json LoaderState::to_json() const {
  return nlohmann::json{{"micro_step", micro_step},
                        {"epoch", epoch},
                        {"position", position},
                        {"windows_consumed", windows_consumed},
                        {"batch_size", batch_size},
                        {"seq_len", seq_len},
                        {"data_parallel_size", data_parallel_size},
                        {"grad_accum_steps", grad_accum_steps},
                        {"shuffle", shuffle},
                        {"seed", seed},
                        {"num_tokens", num_tokens}};
}

LoaderState LoaderState::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) {
    throw invalid_argument("{}: expected an object with the data loader position, got {}", where,
                           j.type_name());
  }
  auto int_at = [&](const char* key) -> int64_t {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer()) {
      throw invalid_argument("{}.{}: expected an integer{}", where, key,
                             it == j.end() ? " (missing)" : "");
    }
    return it->get<int64_t>();
  };
  LoaderState s;
  s.micro_step = int_at("micro_step");
  s.epoch = int_at("epoch");
  s.position = int_at("position");
  s.windows_consumed = int_at("windows_consumed");
  s.batch_size = int_at("batch_size");
  s.seq_len = int_at("seq_len");
  s.data_parallel_size = int_at("data_parallel_size");
  s.grad_accum_steps = int_at("grad_accum_steps");
  s.num_tokens = int_at("num_tokens");
  auto it = j.find("shuffle");
  if (it == j.end() || !it->is_boolean()) {
    throw invalid_argument("{}.shuffle: expected true or false", where);
  }
  s.shuffle = it->get<bool>();
  it = j.find("seed");
  if (it == j.end() || !it->is_number_unsigned()) {
    throw invalid_argument("{}.seed: expected a non-negative integer", where);
  }
  s.seed = it->get<uint64_t>();
  if (s.data_parallel_size < 1 || s.grad_accum_steps < 1) {
    throw invalid_argument("{}: data_parallel_size and grad_accum_steps must be at least 1", where);
  }
  return s;
}

ValidationLoader::ValidationLoader(const TokenCorpus& file, int64_t batch_size, int64_t seq_len,
                                   int64_t data_parallel_size, int64_t data_parallel_rank,
                                   int64_t eval_steps)
    : eval_steps_(eval_steps) {
  auto loader = std::make_unique<DataLoader>(
      file, LoaderOptions{batch_size, seq_len, data_parallel_size, data_parallel_rank, 1, false, 0});
  if (eval_steps < 1) {
    throw invalid_argument("validation data {}: eval_steps must be at least 1, got {}",
                           file.path(), eval_steps);
  }
  if (eval_steps > loader->micro_steps_per_epoch()) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("validation data {}: {} tokens hold {} eval steps of {} ranks x B*T = "
                            "{}x{} tokens, fewer than eval_steps = {}",
                            file.path(), file.size(), loader->micro_steps_per_epoch(),
                            data_parallel_size, batch_size, seq_len, eval_steps),
                "lower eval_steps or prepare a larger validation split (--val-fraction)");
  }
  loader_ = std::move(loader);
}

ValidationLoader::ValidationLoader(std::unique_ptr<BatchReader> reader, int64_t eval_steps)
    : loader_(std::move(reader)), eval_steps_(eval_steps) {
  DS_CHECK(loader_ != nullptr && eval_steps >= 1, "eval_steps {}", eval_steps);
}

}  // namespace ds::rt::data
