// The batch order (loader.h): window positions for N = 1, 2, 4 against hand-computed starts,
// including the wrap, shuffle determinism and layout independence, exact resume.
//
// The corpus is token[i] = i, so a window's first input is its start.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "data/loader.h"
#include "test_dir.h"

namespace ds::rt::data {
namespace {

using test::TempDir;

struct Corpus {
  TempDir dir;
  std::string path = dir.file("corpus.bin");
  explicit Corpus(int n) {
    std::vector<uint16_t> t(static_cast<size_t>(n));
    std::iota(t.begin(), t.end(), uint16_t{0});
    write_token_file(path, t);
  }
};

LoaderOptions opts(int64_t B, int64_t T, int64_t N, int64_t r, int64_t G = 1,
                   bool shuffle = false, uint64_t seed = 0) {
  return LoaderOptions{B, T, N, r, G, shuffle, seed};
}

// Window starts for the next `steps` micro-steps, read through next() (and checked against
// window_start()), with the inputs/targets contents verified.
std::vector<int64_t> starts(DataLoader& l, int steps) {
  const int64_t bt = l.options().batch_size * l.options().seq_len;
  std::vector<int32_t> in(static_cast<size_t>(bt)), tg(static_cast<size_t>(bt));
  std::vector<int64_t> out;
  for (int s = 0; s < steps; ++s) {
    const int64_t expect = l.window_start(l.micro_step());
    l.next(in.data(), tg.data());
    for (int64_t i = 0; i < bt; ++i) {
      EXPECT_EQ(in[i], expect + i);
      EXPECT_EQ(tg[i], expect + i + 1);
    }
    out.push_back(in[0]);
  }
  return out;
}

using V = std::vector<int64_t>;

// B = 2, T = 3 (B*T = 6), n = 40 tokens: W = floor(39 / 6) = 6 windows at 0, 6, ..., 30 (the
// window at 30 ends with token 36; one at 36 would need token 42).
TEST(Loader, OneRank) {
  Corpus c(40);
  TokenCorpus f(c.path);
  DataLoader l(f, opts(2, 3, 1, 0));
  EXPECT_EQ(l.windows_in_file(), 6);
  EXPECT_EQ(l.steps_per_epoch(), 6);
  EXPECT_EQ(starts(l, 8), (V{0, 6, 12, 18, 24, 30, 0, 6}));
  EXPECT_EQ(l.epoch(), 1);
}

TEST(Loader, TwoRanks) {
  Corpus c(40);
  TokenCorpus f(c.path);
  // S = 2 windows per step, E = 3 steps per epoch. First epoch: (k*2 + r)*6.
  DataLoader r0(f, opts(2, 3, 2, 0)), r1(f, opts(2, 3, 2, 1));
  EXPECT_EQ(r0.steps_per_epoch(), 3);
  EXPECT_EQ(starts(r0, 5), (V{0, 12, 24, 0, 12}));
  EXPECT_EQ(starts(r1, 5), (V{6, 18, 30, 6, 18}));
}

TEST(Loader, FourRanksWrapTogether) {
  Corpus c(40);
  TokenCorpus f(c.path);
  // S = 4, E = floor(6 / 4) = 1. At k = 1 ranks 0 and 1 would still fit (24, 30) but ranks 2
  // and 3 would not (36, 42): every rank starts over.
  std::vector<V> got;
  for (int r = 0; r < 4; ++r) {
    DataLoader l(f, opts(2, 3, 4, r));
    got.push_back(starts(l, 3));
  }
  EXPECT_EQ(got[0], (V{0, 0, 0}));
  EXPECT_EQ(got[1], (V{6, 6, 6}));
  EXPECT_EQ(got[2], (V{12, 12, 12}));
  EXPECT_EQ(got[3], (V{18, 18, 18}));
}

TEST(Loader, FourRanksExactFit) {
  // n = 49: W = floor(48 / 6) = 8, E = 2: windows 0..7, the last (42) ends on the last token.
  Corpus c(49);
  TokenCorpus f(c.path);
  DataLoader r3(f, opts(2, 3, 4, 3));
  EXPECT_EQ(starts(r3, 3), (V{18, 42, 18}));
  DataLoader r0(f, opts(2, 3, 4, 0));
  EXPECT_EQ(starts(r0, 3), (V{0, 24, 0}));
}

TEST(Loader, AccumulationWrapsAtStepBoundary) {
  Corpus c(40);
  TokenCorpus f(c.path);
  // N = 2, G = 2: S = 4, E = 1, two micro-steps per epoch. Micro-step k reads (k*N + r)*6
  // within the epoch; the wrap never splits a step.
  DataLoader r0(f, opts(2, 3, 2, 0, 2)), r1(f, opts(2, 3, 2, 1, 2));
  EXPECT_EQ(starts(r0, 4), (V{0, 12, 0, 12}));
  EXPECT_EQ(starts(r1, 4), (V{6, 18, 6, 18}));
}

TEST(Loader, LlmcFormulaInFirstEpoch) {
  Corpus c(4000);
  TokenCorpus f(c.path);
  for (int64_t N : {1, 2, 4}) {
    for (int64_t r = 0; r < N; ++r) {
      DataLoader l(f, opts(4, 8, N, r));
      const int64_t per_epoch = l.micro_steps_per_epoch();
      for (int64_t k = 0; k < per_epoch; ++k) {
        ASSERT_EQ(l.window_start(k), (k * N + r) * 32) << "N " << N << " r " << r << " k " << k;
      }
      EXPECT_EQ(l.window_start(per_epoch), r * 32);
    }
  }
}

TEST(Loader, ShufflePermutationMatchesDocumentedRecipe) {
  // Values from an independent Python implementation of the recipe in loader.cpp
  // (SplitMix64, Fisher-Yates from the top): /usr/bin/python3 tests/unit/data/shuffle_reference.py
  std::vector<int32_t> p;
  shuffle_permutation(1337, 0, 10, p);
  EXPECT_EQ(p, (std::vector<int32_t>{9, 8, 4, 0, 3, 7, 6, 5, 2, 1}));
  shuffle_permutation(1337, 1, 10, p);
  EXPECT_EQ(p, (std::vector<int32_t>{2, 5, 6, 8, 0, 3, 7, 1, 4, 9}));
  shuffle_permutation(0, 0, 7, p);
  EXPECT_EQ(p, (std::vector<int32_t>{0, 4, 3, 5, 1, 6, 2}));
}

TEST(Loader, ShuffleDeterministicPerEpochAndSeed) {
  Corpus c(1000);  // B*T = 6: W = 166 windows
  TokenCorpus f(c.path);
  DataLoader a(f, opts(2, 3, 1, 0, 1, true, 42)), b(f, opts(2, 3, 1, 0, 1, true, 42)),
      other(f, opts(2, 3, 1, 0, 1, true, 43));
  const V sa = starts(a, 2 * 166), sb = starts(b, 2 * 166), so = starts(other, 166);
  EXPECT_EQ(sa, sb);
  EXPECT_NE(V(sa.begin(), sa.begin() + 166), so);
  // Each epoch reads every window exactly once, in a different order.
  V e0(sa.begin(), sa.begin() + 166), e1(sa.begin() + 166, sa.end());
  EXPECT_NE(e0, e1);
  std::sort(e0.begin(), e0.end());
  std::sort(e1.begin(), e1.end());
  V all(166);
  for (int i = 0; i < 166; ++i) all[i] = i * 6;
  EXPECT_EQ(e0, all);
  EXPECT_EQ(e1, all);
}

// The global batch of a step is the same set of windows, in the same rank-major order, whether
// it is read by N ranks with G micro-steps or by one process with N*G micro-steps; the tensor
// and pipeline layout do not enter the loader at all.
TEST(Loader, DataParallelLayoutIndependence) {
  Corpus c(1000);  // W = floor(999 / 12) = 83; with S = 4, E = 20 (windows 80..82 unused)
  TokenCorpus f(c.path);
  for (bool shuffle : {false, true}) {
    DataLoader single(f, opts(3, 4, 1, 0, 4, shuffle, 7));
    const V one = starts(single, 4 * 45);  // crosses two epoch boundaries
    for (auto [N, G] : {std::pair<int64_t, int64_t>{2, 2}, {4, 1}}) {
      std::vector<V> ranks;
      for (int64_t r = 0; r < N; ++r) {
        DataLoader l(f, opts(3, 4, N, r, G, shuffle, 7));
        ranks.push_back(starts(l, static_cast<int>(G * 45)));
      }
      for (int64_t k = 0; k < G * 45; ++k) {
        for (int64_t r = 0; r < N; ++r) {
          ASSERT_EQ(ranks[r][k], one[k * N + r]) << "shuffle " << shuffle << " N " << N
                                                   << " k " << k << " r " << r;
        }
      }
    }
  }
}

TEST(Loader, StateRoundTripResumesIdentically) {
  Corpus c(1000);
  TokenCorpus f(c.path);
  for (bool shuffle : {false, true}) {
    auto o = opts(2, 3, 2, 1, 3, shuffle, 99);
    DataLoader run(f, o);
    starts(run, 250);  // past the first epoch (E*G = 27*3 = 81 micro-steps)
    const nlohmann::json saved = nlohmann::json::parse(run.state().to_json().dump());
    EXPECT_EQ(saved["micro_step"], 250);
    EXPECT_EQ(saved["epoch"], 3);
    EXPECT_EQ(saved["windows_consumed"], 500);
    EXPECT_EQ(saved["position"], run.window_start(250));
    const V expect = starts(run, 100);

    DataLoader resumed(f, o);
    resumed.restore(LoaderState::from_json(saved, "manifest.data"));
    EXPECT_EQ(resumed.micro_step(), 250);
    EXPECT_EQ(starts(resumed, 100), expect);
  }
}

TEST(Loader, ResumeWithDifferentDataParallelSizeSameGlobalBatch) {
  Corpus c(1000);
  TokenCorpus f(c.path);
  // Saved by rank 0 of N = 2, G = 1 after 30 steps; resumed by one process with G = 2.
  DataLoader r0(f, opts(2, 3, 2, 0, 1, true, 5)), r1(f, opts(2, 3, 2, 1, 1, true, 5));
  starts(r0, 30);
  starts(r1, 30);
  DataLoader single(f, opts(2, 3, 1, 0, 2, true, 5));
  single.restore(r0.state());
  EXPECT_EQ(single.micro_step(), 60);
  const V a = starts(r0, 20), b = starts(r1, 20), s = starts(single, 40);
  for (int k = 0; k < 20; ++k) {
    EXPECT_EQ(s[2 * k], a[k]);
    EXPECT_EQ(s[2 * k + 1], b[k]);
  }
}

TEST(Loader, ResumeRejectsADifferentStream) {
  Corpus c(1000);
  TokenCorpus f(c.path);
  DataLoader l(f, opts(2, 3, 1, 0, 1, false, 0));
  starts(l, 3);
  const LoaderState s = l.state();
  auto message = [&](LoaderOptions o) {
    DataLoader other(f, o);
    try {
      other.restore(s);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(message(opts(4, 3, 1, 0)), "data loader for " + c.path +
                                           ": cannot resume: the saved data position has "
                                           "batch_size = 2, this run has 4");
  EXPECT_EQ(message(opts(2, 3, 1, 0, 1, true, 0)),
            "data loader for " + c.path +
                ": cannot resume: the saved data position has shuffle = false, this run has true");
  EXPECT_EQ(message(opts(2, 3, 2, 0)),
            "data loader for " + c.path +
                ": cannot resume: the saved data position has windows per optimizer step "
                "(data_parallel_size x grad_accum_steps) = 1, this run has 2");
  EXPECT_EQ(message(opts(2, 3, 1, 0)), "(no error)");

  nlohmann::json j = s.to_json();
  j.erase("micro_step");
  try {
    LoaderState::from_json(j, "ckpt/manifest.json: data.train");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "ckpt/manifest.json: data.train.micro_step: expected an integer (missing)");
  }
}

TEST(Loader, TooSmallForOneStep) {
  Corpus c(24);
  TokenCorpus f(c.path);
  EXPECT_NO_THROW(DataLoader(f, opts(1, 23, 1, 0)));  // 23 + 1 tokens: exactly one window
  try {
    DataLoader l(f, opts(2, 3, 4, 0));  // W = 3 < S = 4
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "token file " + c.path +
                  ": 24 tokens are too few for one optimizer step: 4 ranks x 1 micro-steps x "
                  "B*T = 2x3 tokens need at least 25 tokens");
  }
  try {
    DataLoader l(f, opts(2, 3, 2, 2));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "data loader for " + c.path + ": data_parallel_rank 2 is outside [0, 2)");
  }
  EXPECT_THROW(DataLoader(f, opts(0, 3, 1, 0)), Error);
}

TEST(Loader, ValidationReadsFromTheStartEveryTime) {
  Corpus c(100);
  TokenCorpus f(c.path);
  ValidationLoader v(f, 2, 3, 2, 1, 4);  // rank 1 of 2: windows 1, 3, 5, 7
  std::vector<int32_t> in(6), tg(6);
  for (int pass = 0; pass < 2; ++pass) {
    v.begin();
    V got;
    for (int s = 0; s < v.eval_steps(); ++s) {
      v.next(in.data(), tg.data());
      got.push_back(in[0]);
    }
    EXPECT_EQ(got, (V{6, 18, 30, 42}));
  }
  try {
    ValidationLoader too_many(f, 2, 3, 2, 0, 9);  // W = 16: 8 rounds of 2 ranks
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "validation data " + c.path +
                  ": 100 tokens hold 8 eval steps of 2 ranks x B*T = 2x3 tokens, fewer than "
                  "eval_steps = 9");
  }
}

}  // namespace
}  // namespace ds::rt::data
