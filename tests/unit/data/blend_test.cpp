// Weighted blends (blend.h): the draw's shares against the weights, the windows of each optimizer
// step at dp 1, 2 and 4, exact resume (mid-step, and at a step boundary across a dp change), each
// source wrapping on its own, shuffle, masks, the state's errors and validation.
//
// Source s holds tokens s*10000 + i, so a window's first input names its source and start.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <numeric>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "data/blend.h"
#include "data/sft.h"
#include "data/token_file.h"
#include "test_dir.h"

namespace ds::rt::data {
namespace {

using test::TempDir;
using Window = BlendLoader::Window;

// Source files in one directory: source s of n_s tokens, token i = s*10000 + i.
struct Sources {
  TempDir dir;
  std::vector<std::string> paths;
  explicit Sources(const std::vector<int>& sizes) {
    for (size_t s = 0; s < sizes.size(); ++s) {
      std::vector<uint16_t> t(static_cast<size_t>(sizes[s]));
      std::iota(t.begin(), t.end(), static_cast<uint16_t>(s * 10000));
      paths.push_back(dir.file("s" + std::to_string(s) + ".bin"));
      write_token_file(paths.back(), t);
    }
  }
  std::vector<WeightedSource> with(const std::vector<double>& weights) const {
    std::vector<WeightedSource> out;
    for (size_t s = 0; s < paths.size(); ++s) out.push_back({paths[s], weights[s]});
    return out;
  }
};

LoaderOptions opts(int64_t B, int64_t T, int64_t N, int64_t r, int64_t G = 1, bool shuffle = false,
                   uint64_t seed = 0) {
  return LoaderOptions{B, T, N, r, G, shuffle, seed};
}

// The next `steps` windows of a loader, read through next() (inputs and targets checked against
// next_window(): consecutive tokens of the window's source).
std::vector<Window> read(BlendLoader& l, int steps) {
  const int64_t bt = l.options().batch_size * l.options().seq_len;
  std::vector<int32_t> in(static_cast<size_t>(bt)), tg(static_cast<size_t>(bt));
  std::vector<Window> out;
  for (int k = 0; k < steps; ++k) {
    const Window w = l.next_window();
    l.next(in.data(), tg.data());
    const int32_t first = w.source * 10000 + static_cast<int32_t>(w.start);
    for (int64_t i = 0; i < bt; ++i) {
      EXPECT_EQ(in[i], first + i);
      EXPECT_EQ(tg[i], first + i + 1);
    }
    out.push_back(w);
  }
  return out;
}

// Every optimizer step's windows over all N ranks (G micro-steps each), as a sorted multiset.
std::vector<std::vector<Window>> steps_of(const std::vector<WeightedSource>& src, int64_t N,
                                          int64_t G, bool shuffle, int steps, uint64_t seed = 3) {
  std::vector<std::vector<Window>> out(static_cast<size_t>(steps));
  for (int64_t r = 0; r < N; ++r) {
    BlendLoader l(src, opts(2, 3, N, r, G, shuffle, seed));
    const auto w = read(l, static_cast<int>(G * steps));
    for (int k = 0; k < G * steps; ++k)
      out[static_cast<size_t>(k / G)].push_back(w[static_cast<size_t>(k)]);
  }
  for (auto& s : out) std::sort(s.begin(), s.end());
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Over the first 10,000 windows every source's share is within 1% (absolute) of its weight. The
// draw is low-discrepancy, so in fact every run of n consecutive windows (n up to 10,000, from the
// start or from window 10^12) holds n * share of each source within a few windows (at most 3.5
// measured), where i.i.d. draws would stray by about sqrt(n) (100 windows at 10,000).
TEST(Blend, SharesFollowTheWeights) {
  for (const std::vector<double>& w :
       {std::vector<double>{0.7, 0.2, 0.1}, std::vector<double>{1, 1},
        std::vector<double>{5, 0, 1, 3, 0}}) {
    const double total = std::accumulate(w.begin(), w.end(), 0.0);
    for (uint64_t seed : {0ULL, 1337ULL, 7ULL, 0xFFFFFFFFFFFFFFFFULL}) {
      const BlendDraw draw(w, seed);
      double worst = 0;  // windows: |count - n * share| at the worst n
      for (int64_t first : {int64_t{1000000000000}, int64_t{0}}) {
        std::vector<int64_t> count(w.size());
        for (int64_t g = first; g < first + 10000; ++g) {
          ++count[static_cast<size_t>(draw.source(g))];
          const auto n = static_cast<double>(g - first + 1);
          for (size_t s = 0; s < w.size(); ++s) {
            worst = std::max(worst, std::abs(static_cast<double>(count[s]) - n * w[s] / total));
          }
        }
        for (size_t s = 0; s < w.size(); ++s) {
          EXPECT_NEAR(count[s] / 10000.0, w[s] / total, 0.01) << "source " << s << " seed " << seed;
          if (w[s] == 0) {
            EXPECT_EQ(count[s], 0) << "a zero-weight source is never drawn";
          }
        }
      }
      for (size_t s = 0; s < w.size(); ++s)
        EXPECT_DOUBLE_EQ(draw.share(static_cast<int>(s)), w[s] / total);
      EXPECT_LE(worst, 4.0) << "seed " << seed;
      std::cout << "weights " << w.size() << " seed " << seed << ": worst " << worst
                << " windows\n";
    }
  }
}

// The same shares through a loader's next(), counted by the windows' tokens.
TEST(Blend, LoaderReadsTheDrawnSources) {
  Sources src({400, 400, 400});
  BlendLoader l(src.with({0.7, 0.2, 0.1}), opts(2, 3, 1, 0));
  std::vector<int> count(3);
  for (const Window& w : read(l, 2000)) ++count[static_cast<size_t>(w.source)];
  EXPECT_NEAR(count[0] / 2000.0, 0.7, 0.01);
  EXPECT_NEAR(count[1] / 2000.0, 0.2, 0.01);
  EXPECT_NEAR(count[2] / 2000.0, 0.1, 0.01);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(l.windows_drawn(s), count[static_cast<size_t>(s)]);
}

TEST(Blend, DrawErrors) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(error_of([] { BlendDraw({}, 0); }), "data blend: no sources");
  EXPECT_EQ(error_of([] {
              BlendDraw({1, -1}, 0);
            }),
            "data blend: source 1 has weight -1; expected a finite number >= 0");
  EXPECT_EQ(error_of([&] {
              BlendDraw({inf, 1}, 0);
            }),
            "data blend: source 0 has weight inf; expected a finite number >= 0");
  EXPECT_EQ(error_of([] {
              BlendDraw({std::nan(""), 1}, 0);
            }),
            "data blend: source 0 has weight nan; expected a finite number >= 0");
  EXPECT_EQ(
      error_of([] {
        BlendDraw({0, 0}, 0);
      }),
      "data blend: the weights of the 2 sources sum to 0; give at least one a positive weight");
}

// One optimizer step reads the same multiset of (source, start) windows at dp 1 (G 4), dp 2 (G 2)
// and dp 4 (G 1), with and without shuffle, through many wraps of the small sources.
TEST(Blend, StepWindowsAreTheSameAtEveryDataParallelSize) {
  Sources src({40, 100, 301});  // W = 6, 16, 50 windows of B*T = 6
  const auto blend = src.with({0.5, 0.3, 0.2});
  for (bool shuffle : {false, true}) {
    const auto one = steps_of(blend, 1, 4, shuffle, 60);
    EXPECT_EQ(steps_of(blend, 2, 2, shuffle, 60), one) << "shuffle " << shuffle;
    EXPECT_EQ(steps_of(blend, 4, 1, shuffle, 60), one) << "shuffle " << shuffle;
  }
}

// Resuming from a saved state reproduces the following windows exactly: mid-step at the same
// layout, and at a step boundary across dp 2 -> dp 1 and dp 2 -> dp 4.
TEST(Blend, ResumeReproducesTheFollowingWindows) {
  Sources src({40, 100, 301});
  const auto blend = src.with({0.5, 0.3, 0.2});
  for (bool shuffle : {false, true}) {
    // Mid-step: dp 2, G 2, saved after 7 micro-steps (inside step 4), through JSON text.
    for (int64_t r = 0; r < 2; ++r) {
      BlendLoader run(blend, opts(2, 3, 2, r, 2, shuffle, 11));
      read(run, 7);
      const auto saved = nlohmann::json::parse(run.state_json().dump());
      EXPECT_EQ(saved["micro_step"], 7);
      EXPECT_EQ(saved["global_window"], 14);
      const auto expect = read(run, 40);
      BlendLoader resumed(blend, opts(2, 3, 2, r, 2, shuffle, 11));
      resumed.restore_json(saved, "manifest.data");
      EXPECT_EQ(resumed.micro_step(), 7);
      EXPECT_EQ(read(resumed, 40), expect) << "shuffle " << shuffle << " rank " << r;
    }
    // Step boundary: 10 steps at dp 2 (G 2), then the rest at dp 1 (G 4) or dp 4 (G 1).
    const auto full = steps_of(blend, 2, 2, shuffle, 25, 11);
    BlendLoader r0(blend, opts(2, 3, 2, 0, 2, shuffle, 11));
    read(r0, 20);
    const nlohmann::json saved = r0.state_json();
    for (auto [N, G] : {std::pair<int64_t, int64_t>{1, 4}, {4, 1}}) {
      std::vector<std::vector<Window>> got(15);
      for (int64_t r = 0; r < N; ++r) {
        BlendLoader l(blend, opts(2, 3, N, r, G, shuffle, 11));
        l.restore_json(saved, "manifest.data");
        EXPECT_EQ(l.micro_step(), 10 * G);
        const auto w = read(l, static_cast<int>(15 * G));
        for (int k = 0; k < 15 * G; ++k)
          got[static_cast<size_t>(k / G)].push_back(w[static_cast<size_t>(k)]);
      }
      for (auto& s : got) std::sort(s.begin(), s.end());
      EXPECT_EQ(got, std::vector<std::vector<Window>>(full.begin() + 10, full.end()))
          << "shuffle " << shuffle << " dp " << N;
    }
    // Inside a step, a dp change is refused.
    BlendLoader mid(blend, opts(2, 3, 2, 0, 2, shuffle, 11));
    read(mid, 3);
    BlendLoader single(blend, opts(2, 3, 1, 0, 4, shuffle, 11));
    EXPECT_EQ(error_of([&] { single.restore_json(mid.state_json(), "m.json: data"); }),
              "m.json: data: cannot resume the data blend with data_parallel_size 1 (saved with "
              "2): the saved "
              "position is inside an optimizer step (micro_step 3, grad_accum_steps 2)");
  }
}

// The c-th window drawn from a source is its window c mod W_s: a source of 3 windows wraps many
// times while one of 50 has not wrapped once, and neither waits for the other or for a step.
TEST(Blend, EachSourceWrapsOnItsOwn) {
  Sources src({19, 301});  // W = 3 and 50 windows of 6 tokens
  BlendLoader l(src.with({1, 1}), opts(2, 3, 1, 0, 3));
  std::vector<int64_t> drawn(2);
  int wraps_of_small = 0;
  for (const Window& w : read(l, 80)) {
    const int64_t c = drawn[static_cast<size_t>(w.source)]++;
    const int64_t W = w.source == 0 ? 3 : 50;
    EXPECT_EQ(w.start, (c % W) * 6) << "draw " << c << " of source " << w.source;
    if (w.source == 0 && c > 0 && c % 3 == 0) ++wraps_of_small;
  }
  EXPECT_GE(wraps_of_small, 10);
  EXPECT_LT(drawn[1], 50) << "the large source has not wrapped";
}

// Shuffle: the same seed gives the same windows, another seed others; each epoch of each source
// reads all of its windows once, in an order of its own.
TEST(Blend, ShuffleIsDeterministicAndAPermutationPerSourceEpoch) {
  Sources src({61, 301});  // W = 10 and 50
  const auto blend = src.with({1, 1});
  BlendLoader a(blend, opts(2, 3, 1, 0, 1, true, 42)), b(blend, opts(2, 3, 1, 0, 1, true, 42)),
      other(blend, opts(2, 3, 1, 0, 1, true, 43));
  const auto wa = read(a, 300), wb = read(b, 300), wo = read(other, 300);
  EXPECT_EQ(wa, wb);
  EXPECT_NE(wa, wo);
  std::map<int, std::vector<int64_t>> per_source;
  for (const Window& w : wa) per_source[w.source].push_back(w.start / 6);
  for (auto& [s, seq] : per_source) {
    const int64_t W = s == 0 ? 10 : 50;
    ASSERT_GE(static_cast<int64_t>(seq.size()), 2 * W) << "source " << s;
    std::vector<int64_t> all(static_cast<size_t>(W));
    std::iota(all.begin(), all.end(), 0);
    std::vector<int64_t> e0(seq.begin(), seq.begin() + W), e1(seq.begin() + W, seq.begin() + 2 * W);
    EXPECT_NE(e0, e1) << "source " << s;
    EXPECT_NE(e0, all) << "source " << s << " is shuffled";
    std::sort(e0.begin(), e0.end());
    std::sort(e1.begin(), e1.end());
    EXPECT_EQ(e0, all) << "source " << s;
    EXPECT_EQ(e1, all) << "source " << s;
  }
}

void write_masked(const std::string& path, int n, int phase) {
  std::vector<uint16_t> t(static_cast<size_t>(n));
  std::vector<uint8_t> m(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    t[static_cast<size_t>(i)] = static_cast<uint16_t>(i % 200);
    m[static_cast<size_t>(i)] = (i / 3 + phase) % 4 == 0 ? 1 : 0;
  }
  write_token_file(path, t);
  MaskFileWriter w(mask_path_for(path));
  w.append(m);
  w.finish();
}

// Masked sources: masked-out targets are -1, and step_counted_targets (before the step, changing
// nothing) equals the targets counted over every rank's windows of the step.
TEST(Blend, MasksAndStepCountedTargets) {
  TempDir dir;
  write_masked(dir.file("a.bin"), 100, 0);
  write_masked(dir.file("b.bin"), 301, 1);
  const std::vector<WeightedSource> blend{{dir.file("a.bin"), 0.6}, {dir.file("b.bin"), 0.4}};
  const int64_t N = 2, G = 3;
  std::vector<BlendLoader> ranks;
  for (int64_t r = 0; r < N; ++r) ranks.emplace_back(blend, opts(2, 3, N, r, G, true, 9));
  EXPECT_TRUE(ranks[0].has_mask());
  std::vector<int32_t> in(6), tg(6);
  for (int step = 0; step < 20; ++step) {
    const int64_t k = ranks[0].micro_step();
    const int64_t predicted = ranks[0].step_counted_targets(k);
    EXPECT_EQ(ranks[1].step_counted_targets(k), predicted);
    EXPECT_EQ(ranks[0].step_counted_targets(k), predicted) << "no position changed";
    int64_t counted = 0, ignored = 0;
    for (int g = 0; g < G; ++g) {
      for (auto& l : ranks) {
        l.next(in.data(), tg.data());
        for (int32_t t : tg) (t == -1 ? ignored : counted) += 1;
      }
    }
    EXPECT_EQ(counted, predicted) << "step " << step;
    EXPECT_GT(ignored, 0);
  }
  // One source with masks and one without: refused, naming the one that differs.
  Sources plain({100});
  const std::string msg = error_of([&] {
    BlendLoader({{dir.file("a.bin"), 1}, {plain.paths[0], 1}}, opts(2, 3, 1, 0));
  });
  EXPECT_EQ(msg, "data blend source 1 (" + plain.paths[0] + ") has no loss masks but source 0 (" +
                     dir.file("a.bin") + ") has; every source of a blend must have them, or none");
  // Without masks every target counts.
  Sources two({100, 100});
  BlendLoader l(two.with({1, 1}), opts(2, 3, 2, 0, 3));
  EXPECT_FALSE(l.has_mask());
  EXPECT_EQ(l.step_counted_targets(0), 2 * 3 * 6);
}

TEST(Blend, SourceTooSmallOrBadOptions) {
  Sources src({100, 6});  // the second holds 6 tokens: no window of 2*3 + 1
  EXPECT_EQ(error_of([&] {
              BlendLoader(src.with({1, 1}), opts(2, 3, 1, 0));
            }),
            "data blend source 1 (" + src.paths[1] +
                "): 6 tokens are too few for one window of B*T + 1 = 2x3 + 1 = 7 tokens");
  EXPECT_EQ(error_of([&] {
              BlendLoader(src.with({1, 0}), opts(1, 5, 2, 2));
            }),
            "data blend: data_parallel_rank 2 is outside [0, 2)");
  EXPECT_EQ(
      error_of([&] {
        BlendLoader(src.with({0, 0}), opts(1, 5, 1, 0));
      }),
      "data blend: the weights of the 2 sources sum to 0; give at least one a positive weight");
}

// The state's checks: what differs is named, with both values; one corpus's state and a blend's
// are not interchangeable.
TEST(Blend, StateErrors) {
  Sources src({100, 301});
  const auto blend = src.with({0.5, 0.5});
  BlendLoader l(blend, opts(2, 3, 1, 0, 2, false, 5));
  read(l, 6);
  const nlohmann::json s = l.state_json();
  EXPECT_EQ(s["blend"], true);
  EXPECT_EQ(s["sources"][0]["path"], src.paths[0]);
  EXPECT_EQ(s["sources"][1]["num_tokens"], 301);
  EXPECT_EQ(s["sources"][0]["windows_drawn"].get<int64_t>() +
                s["sources"][1]["windows_drawn"].get<int64_t>(),
            6);
  auto restore = [&](const nlohmann::json& j, const std::vector<WeightedSource>& b = {},
                     LoaderOptions o = opts(2, 3, 1, 0, 2, false, 5)) {
    return error_of([&] {
      BlendLoader fresh(b.empty() ? blend : b, o);
      fresh.restore_json(j, "m.json: data");
    });
  };
  EXPECT_EQ(restore(s), "(no error)");
  // Paths may move: only weight and num_tokens identify a source.
  auto moved = s;
  moved["sources"][0]["path"] = "/elsewhere/a.bin";
  EXPECT_EQ(restore(moved), "(no error)");
  EXPECT_EQ(restore(s, src.with({0.5, 0.25})),
            "m.json: data: cannot resume the data blend: the saved data position has sources[1] (" +
                src.paths[1] + ") weight = 0.5, this run has 0.25");
  Sources bigger({100, 302});
  EXPECT_EQ(restore(s, {{bigger.paths[0], 0.5}, {bigger.paths[1], 0.5}}),
            "m.json: data: cannot resume the data blend: the saved data position has sources[1] (" +
                bigger.paths[1] + ") num_tokens = 301, this run has 302");
  EXPECT_EQ(restore(s, {{src.paths[0], 0.5}, {src.paths[1], 0.5}, {src.paths[0], 1}}),
            "m.json: data: cannot resume the data blend: the saved data position has the number of "
            "sources = 2, "
            "this run has 3");
  EXPECT_EQ(restore(s, {}, opts(2, 3, 1, 0, 3, false, 5)),
            "m.json: data: cannot resume the data blend: the saved data position has windows per "
            "optimizer step "
            "(data_parallel_size x grad_accum_steps) = 2, this run has 3");
  EXPECT_EQ(restore(s, {}, opts(2, 3, 1, 0, 2, true, 5)),
            "m.json: data: cannot resume the data blend: the saved data position has shuffle = "
            "false, this run "
            "has true");
  EXPECT_EQ(restore(s, {}, opts(2, 3, 1, 0, 2, false, 6)),
            "m.json: data: cannot resume the data blend: the saved data position has seed = 5, "
            "this run has 6");
  auto tampered = s;
  tampered["sources"][0]["windows_drawn"] = s["sources"][0]["windows_drawn"].get<int64_t>() + 1;
  tampered["sources"][1]["windows_drawn"] = s["sources"][1]["windows_drawn"].get<int64_t>() - 1;
  EXPECT_EQ(restore(tampered), fmt::format("m.json: data.sources[0].windows_drawn: the checkpoint "
                                           "says {}, but the blend's draw gives {} "
                                           "windows of this source before global window 6",
                                           tampered["sources"][0]["windows_drawn"].get<int64_t>(),
                                           s["sources"][0]["windows_drawn"].get<int64_t>()));
  auto unbalanced = s;
  unbalanced["sources"][0]["windows_drawn"] = 100;
  EXPECT_NE(restore(unbalanced).find("inconsistent saved position"), std::string::npos)
      << restore(unbalanced);
  auto missing = s;
  missing["sources"][1].erase("num_tokens");
  EXPECT_EQ(restore(missing), "m.json: data.sources[1].num_tokens: expected an integer (missing)");
  missing = s;
  missing.erase("global_window");
  EXPECT_EQ(restore(missing), "m.json: data.global_window: expected an integer (missing)");

  // One corpus's state into a blend, and a blend's into one corpus.
  TokenCorpus one(src.paths[1]);
  DataLoader single(one, opts(2, 3, 1, 0, 2, false, 5));
  EXPECT_EQ(restore(single.state_json()),
            "m.json: data: the checkpoint's data position is of one corpus, but this run reads a "
            "weighted blend "
            "of 2 sources");
  EXPECT_EQ(error_of([&] { single.restore_json(s, "m.json: data"); }),
            "m.json: data: the checkpoint's data position is of a weighted blend of sources, but "
            "this run reads "
            "one corpus (" +
                src.paths[1] + ")");
  // DataLoader's state_json is LoaderState::to_json, byte for byte.
  EXPECT_EQ(single.state_json().dump(), single.state().to_json().dump());
}

// Validation: from g = 0 every evaluation; a source the evaluation would wrap is refused by name.
TEST(Blend, Validation) {
  Sources src({100, 301});  // W = 16 and 50
  auto v = blend_validation_loader(src.with({1, 1}), 2, 3, 2, 1, 10);
  std::vector<int32_t> in(6), tg(6);
  std::vector<int32_t> first;
  for (int pass = 0; pass < 2; ++pass) {
    v->begin();
    std::vector<int32_t> got;
    for (int k = 0; k < v->eval_steps(); ++k) {
      v->next(in.data(), tg.data());
      got.push_back(in[0]);
    }
    if (pass == 0) first = got;
    EXPECT_EQ(got, first);
  }
  // Rank 1 reads the odd global windows: the same as a loader at G 1, no shuffle, seed 0.
  BlendLoader same(src.with({1, 1}), opts(2, 3, 2, 1, 1, false, 0));
  std::vector<int32_t> expect;
  for (int k = 0; k < 10; ++k) {
    same.next(in.data(), tg.data());
    expect.push_back(in[0]);
  }
  EXPECT_EQ(first, expect);
  // 40 steps x 2 ranks = 80 windows draw about 40 from the first source, which holds 16.
  const std::string msg = error_of([&] {
    blend_validation_loader(src.with({1, 1}), 2, 3, 2, 0, 40);
  });
  EXPECT_NE(
      msg.find("validation blend source 0 (" + src.paths[0] + "): 100 tokens hold 16 windows"),
      std::string::npos)
      << msg;
  EXPECT_NE(msg.find("it would wrap within one evaluation"), std::string::npos) << msg;
}

}  // namespace
}  // namespace ds::rt::data
