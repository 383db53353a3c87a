// A weighted blend's batch order (blend.h): the Weyl draw of each global window's source, the
// per-source counters that place it inside its source, state and restore.
//
// The counters are the only state besides the micro-step: c_s at the first global window of the
// current micro-step. next() walks the micro-step's N windows (one draw each), reads the one of
// this rank and counts all of them, so every rank holds the same counters without talking.
#include "data/blend.h"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "common/check.h"
#include "common/error.h"
#include "data/splitmix.h"

namespace ds::rt::data {

namespace {

constexpr uint64_t kBlendSalt = 0x626C656E64ULL;  // "blend" in ASCII
constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

// floor(2^64 * f) for f in [0, 1], saturating at 2^64 - 1.
uint64_t scale_to_u64(double f) {
  if (!(f > 0)) return 0;
  if (f >= 1) return kMax;
  const double x = std::ldexp(f, 64);
  return x >= 18446744073709551615.0 ? kMax : static_cast<uint64_t>(x);
}

}  // namespace

BlendDraw::BlendDraw(const std::vector<double>& weights, uint64_t seed)
    : offset_(mix64(seed ^ kBlendSalt)) {
  if (weights.empty()) throw invalid_argument("data blend: no sources");
  double total = 0;
  for (size_t s = 0; s < weights.size(); ++s) {
    const double w = weights[s];
    if (!std::isfinite(w) || w < 0) {
      throw invalid_argument("data blend: source {} has weight {}; expected a finite number >= 0",
                             s, w);
    }
    total += w;
    if (w > 0) last_positive_ = static_cast<int>(s);
  }
  if (!(total > 0)) {
    throw invalid_argument(
        "data blend: the weights of the {} sources sum to 0; give at least one a positive weight",
        weights.size());
  }
  double cum = 0;
  for (size_t s = 0; s < weights.size(); ++s) {
    cum += weights[s];
    thresholds_.push_back(static_cast<int>(s) >= last_positive_ ? kMax : scale_to_u64(cum / total));
    shares_.push_back(weights[s] / total);
  }
}

int BlendDraw::source(int64_t g) const {
  DS_CHECK(g >= 0, "global window {}", g);
  const uint64_t u = offset_ + static_cast<uint64_t>(g) * kGamma;
  for (size_t s = 0; s < thresholds_.size(); ++s) {
    if (u < thresholds_[s]) return static_cast<int>(s);
  }
  return last_positive_;  // u = 2^64 - 1
}

namespace {

std::vector<double> weights_of(const std::vector<WeightedSource>& sources) {
  std::vector<double> w;
  for (const auto& s : sources) w.push_back(s.weight);
  return w;
}

}  // namespace

BlendLoader::BlendLoader(const std::vector<WeightedSource>& sources, const LoaderOptions& options,
                         int64_t vocab_size)
    : options_(options), draw_(weights_of(sources), options.seed) {
  const auto& o = options_;
  check_loader_options(o, "data blend");
  window_tokens_ = o.batch_size * o.seq_len;
  sources_.resize(sources.size());
  for (size_t s = 0; s < sources.size(); ++s) {
    Source& src = sources_[s];
    src.path = sources[s].path;
    src.weight = sources[s].weight;
    src.corpus = std::make_unique<TokenCorpus>(src.path, vocab_size);
    src.windows = (src.corpus->size() - 1) / window_tokens_;
    src.shuffle_seed = mix64(o.seed ^ mix64(kBlendSalt + 1 + s));
    if (src.windows < 1) {
      throw Error(
          ErrorKind::kInvalidArgument,
          fmt::format(
              "data blend source {} ({}): {} tokens are too few for one window of B*T + 1 = "
              "{}x{} + 1 = {} tokens",
              s, src.corpus->path(), src.corpus->size(), o.batch_size, o.seq_len,
              window_tokens_ + 1),
          "give the source more tokens, or use a smaller batch size or sequence length");
    }
    if (src.corpus->has_mask() != sources_[0].corpus->has_mask()) {
      throw invalid_argument(
          "data blend source {} ({}) {} loss masks but source 0 ({}) {}; every source of a "
          "blend must have them, or none",
          s, src.corpus->path(), src.corpus->has_mask() ? "has" : "has no",
          sources_[0].corpus->path(), sources_[0].corpus->has_mask() ? "has" : "has none");
    }
  }
  masked_ = sources_[0].corpus->has_mask();
}

int64_t BlendLoader::window_start(int s, int64_t c) {
  Source& src = sources_[static_cast<size_t>(s)];
  const int64_t i = c % src.windows;
  if (!options_.shuffle) return i * window_tokens_;
  const int64_t e = c / src.windows;
  const size_t slot = static_cast<size_t>(e & 1);
  if (src.perm_epoch[slot] != e) {
    shuffle_permutation(src.shuffle_seed, e, src.windows, src.perms[slot]);
    src.perm_epoch[slot] = e;
  }
  return src.perms[slot][static_cast<size_t>(i)] * window_tokens_;
}

void BlendLoader::next(int32_t* inputs, int32_t* targets) {
  const int64_t N = options_.data_parallel_size, r = options_.data_parallel_rank;
  for (int64_t j = 0; j < N; ++j) {
    const int s = draw_.source(global_ + j);
    Source& src = sources_[static_cast<size_t>(s)];
    if (j == r) {
      const int64_t start = window_start(s, src.drawn);
      DS_CHECK(start + window_tokens_ + 1 <= src.corpus->size(),
               "window at {} past the end ({} tokens)", start, src.corpus->size());
      src.corpus->copy(start, window_tokens_, inputs);
      src.corpus->copy(start + 1, window_tokens_, targets);
      src.corpus->apply_mask(start + 1, window_tokens_, targets);
    }
    ++src.drawn;
  }
  global_ += N;
  ++micro_step_;
}

BlendLoader::Window BlendLoader::next_window() {
  const int64_t r = options_.data_parallel_rank;
  const int s = draw_.source(global_ + r);
  int64_t c = sources_[static_cast<size_t>(s)].drawn;
  for (int64_t j = 0; j < r; ++j) c += draw_.source(global_ + j) == s ? 1 : 0;
  return {s, window_start(s, c)};
}

int64_t BlendLoader::step_counted_targets(int64_t micro_step) {
  const auto& o = options_;
  DS_CHECK(micro_step == micro_step_ && micro_step % o.grad_accum_steps == 0,
           "micro_step {} (at {}) with G {}", micro_step, micro_step_, o.grad_accum_steps);
  const int64_t windows = o.data_parallel_size * o.grad_accum_steps;
  if (!masked_) return windows * window_tokens_;
  std::vector<int64_t> drawn;
  for (const auto& src : sources_) drawn.push_back(src.drawn);
  int64_t n = 0;
  for (int64_t g = global_; g < global_ + windows; ++g) {
    const int s = draw_.source(g);
    const int64_t start = window_start(s, drawn[static_cast<size_t>(s)]++);
    n += sources_[static_cast<size_t>(s)].corpus->counted(start + 1, window_tokens_);
  }
  return n;
}

void BlendLoader::recount(int64_t global) {
  for (auto& src : sources_) src.drawn = 0;
  for (int64_t g = 0; g < global; ++g) ++sources_[static_cast<size_t>(draw_.source(g))].drawn;
  global_ = global;
}

void BlendLoader::reset() {
  micro_step_ = 0;
  recount(0);
}

nlohmann::json BlendLoader::state_json() const {
  const auto& o = options_;
  nlohmann::json sources = nlohmann::json::array();
  for (const auto& src : sources_) {
    sources.push_back({{"path", src.path},
                       {"weight", src.weight},
                       {"num_tokens", src.corpus->size()},
                       {"windows_drawn", src.drawn}});
  }
  return nlohmann::json{{"blend", true},
                        {"micro_step", micro_step_},
                        {"global_window", global_},
                        {"batch_size", o.batch_size},
                        {"seq_len", o.seq_len},
                        {"data_parallel_size", o.data_parallel_size},
                        {"grad_accum_steps", o.grad_accum_steps},
                        {"shuffle", o.shuffle},
                        {"seed", o.seed},
                        {"sources", sources}};
}

namespace {

int64_t int_at(const nlohmann::json& j, const std::string& where, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) {
    throw invalid_argument("{}.{}: expected an integer{}", where, key,
                           it == j.end() ? " (missing)" : "");
  }
  return it->get<int64_t>();
}

}  // namespace

void BlendLoader::restore_json(const nlohmann::json& j, const std::string& where) {
  const auto& o = options_;
  if (!j.is_object()) {
    throw invalid_argument("{}: expected an object with the data blend's position, got {}", where,
                           j.type_name());
  }
  auto blend = j.find("blend");
  if (blend == j.end() || *blend != true) {
    throw Error(
        ErrorKind::kInvalidArgument,
        fmt::format(
            "{}: the checkpoint's data position is of one corpus, but this run reads a weighted "
            "blend of {} sources",
            where, sources_.size()),
        "resume with the config's data.train as it was: a path, a glob or a list of them");
  }
  const int64_t micro_step = int_at(j, where, "micro_step");
  const int64_t global = int_at(j, where, "global_window");
  const int64_t N = int_at(j, where, "data_parallel_size");
  const int64_t G = int_at(j, where, "grad_accum_steps");
  auto it = j.find("shuffle");
  if (it == j.end() || !it->is_boolean())
    throw invalid_argument("{}.shuffle: expected true or false", where);
  const bool shuffle = it->get<bool>();
  it = j.find("seed");
  if (it == j.end() || !it->is_number_unsigned()) {
    throw invalid_argument("{}.seed: expected a non-negative integer", where);
  }
  const uint64_t seed = it->get<uint64_t>();
  if (N < 1 || G < 1)
    throw invalid_argument("{}: data_parallel_size and grad_accum_steps must be at least 1", where);
  auto same = [&](const std::string& name, auto saved, auto now) {
    if (saved != now) {
      throw Error(
          ErrorKind::kInvalidArgument,
          fmt::format(
              "{}: cannot resume the data blend: the saved data position has {} = {}, this run "
              "has {}",
              where, name, saved, now),
          "resume with the data and batch settings the checkpoint was written with");
    }
  };
  same("batch_size", int_at(j, where, "batch_size"), o.batch_size);
  same("seq_len", int_at(j, where, "seq_len"), o.seq_len);
  same("shuffle", shuffle, o.shuffle);
  same("seed", seed, o.seed);
  same("windows per optimizer step (data_parallel_size x grad_accum_steps)", N * G,
       o.data_parallel_size * o.grad_accum_steps);
  it = j.find("sources");
  if (it == j.end() || !it->is_array())
    throw invalid_argument("{}.sources: expected a list of sources", where);
  const nlohmann::json& saved = *it;
  same("the number of sources", saved.size(), sources_.size());
  std::vector<int64_t> drawn;
  for (size_t s = 0; s < sources_.size(); ++s) {
    const std::string at = fmt::format("{}.sources[{}]", where, s);
    const nlohmann::json& e = saved[s];
    if (!e.is_object()) throw invalid_argument("{}: expected an object, got {}", at, e.type_name());
    auto w = e.find("weight");
    if (w == e.end() || !w->is_number()) throw invalid_argument("{}.weight: expected a number", at);
    const std::string name = fmt::format("sources[{}] ({})", s, sources_[s].path);
    same(name + " weight", w->get<double>(), sources_[s].weight);
    same(name + " num_tokens", int_at(e, at, "num_tokens"), sources_[s].corpus->size());
    drawn.push_back(int_at(e, at, "windows_drawn"));
  }
  int64_t sum = 0;
  for (int64_t d : drawn) sum += d;
  if (micro_step < 0 || global != micro_step * N || sum != global) {
    throw invalid_argument(
        "{}: cannot resume the data blend: inconsistent saved position (micro_step {}, "
        "global_window {}, data_parallel_size {}, windows_drawn summing to {})",
        where, micro_step, global, N, sum);
  }
  int64_t k = micro_step;
  if (N != o.data_parallel_size) {
    if (micro_step % G != 0) {
      throw invalid_argument(
          "{}: cannot resume the data blend with data_parallel_size {} (saved with {}): the "
          "saved position is inside an optimizer step (micro_step {}, grad_accum_steps {})",
          where, o.data_parallel_size, N, micro_step, G);
    }
    k = micro_step / G * o.grad_accum_steps;
  }
  recount(global);
  for (size_t s = 0; s < sources_.size(); ++s) {
    if (sources_[s].drawn != drawn[s]) {
      throw invalid_argument(
          "{}.sources[{}].windows_drawn: the checkpoint says {}, but the blend's draw gives {} "
          "windows of this source before global window {}",
          where, s, drawn[s], sources_[s].drawn, global);
    }
  }
  micro_step_ = k;
  DS_CHECK(global_ == k * o.data_parallel_size, "global window {} at micro-step {}", global_, k);
}

std::unique_ptr<ValidationLoader> blend_validation_loader(
    const std::vector<WeightedSource>& sources, int64_t batch_size, int64_t seq_len,
    int64_t data_parallel_size, int64_t data_parallel_rank, int64_t eval_steps,
    int64_t vocab_size) {
  auto loader = std::make_unique<BlendLoader>(
      sources,
      LoaderOptions{batch_size, seq_len, data_parallel_size, data_parallel_rank, 1, false, 0},
      vocab_size);
  if (eval_steps < 1)
    throw invalid_argument("validation blend: eval_steps must be at least 1, got {}", eval_steps);
  const int64_t windows = eval_steps * data_parallel_size;
  std::vector<int64_t> drawn(sources.size());
  for (int64_t g = 0; g < windows; ++g) ++drawn[static_cast<size_t>(loader->draw().source(g))];
  for (size_t s = 0; s < sources.size(); ++s) {
    const int64_t have = loader->windows_in_source(static_cast<int>(s));
    if (drawn[s] > have) {
      throw Error(
          ErrorKind::kInvalidArgument,
          fmt::format(
              "validation blend source {} ({}): {} tokens hold {} windows of B*T + 1 = {}x{} + 1 "
              "tokens, but eval_steps x ranks = {}x{} windows draw {} from it (weight share "
              "{:.4g}): it would wrap within one evaluation",
              s, loader->corpus(static_cast<int>(s)).path(),
              loader->corpus(static_cast<int>(s)).size(), have, batch_size, seq_len, eval_steps,
              data_parallel_size, drawn[s], loader->draw().share(static_cast<int>(s))),
          "lower training.eval_steps, or give that source more validation tokens or a smaller "
          "weight");
    }
  }
  return std::make_unique<ValidationLoader>(std::move(loader), eval_steps);
}

}  // namespace ds::rt::data
