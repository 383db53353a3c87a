// Loss masks (SFT data, data/sft.h) under every parallel layout, through `dstrain launch` (real
// processes, the real store and collectives): dp 2 with accumulation (the step's count summed over
// micro-steps and ranks), dp 2 with ZeRO-1, tp 2 (the vocabulary-parallel loss), pp 2 (the last
// stage's loss, both schedules), cp 2 (ring and Ulysses: each rank holds part of each sequence)
// and tp 2 x pp 2: 10 steps of loss, gradient norm and validation loss equal the single process
// on the same masked data within 1e-5 relative (1e-4 for the norm, as the layout tests). The
// mask is uneven (windows count from a few to most of their targets), so a per-micro-batch or
// per-rank mean would differ.
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/sft.h"
#include "data/token_file.h"
#include "multiproc/launch/job_process.h"
#include "multiproc/train/train_job.h"

namespace ds {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using test::TempDir;

constexpr int kSteps = 10, kSeq = 16;

struct Layout {
  int tp = 1, pp = 1, dp = 1, cp = 1;
  int zero_stage = 0;
  std::string schedule = "1f1b";
  std::string cp_method = "ring";
  int world() const { return tp * pp * dp * cp; }
  std::string name() const {
    return "tp" + std::to_string(tp) + "_pp" + std::to_string(pp) + "_dp" + std::to_string(dp) + "_cp" +
           std::to_string(cp) + "_zero" + std::to_string(zero_stage) + "_" + schedule + "_" + cp_method;
  }
};

void write_masked(const std::string& bin, const std::vector<uint16_t>& toks, const std::vector<uint8_t>& mask) {
  rt::data::write_token_file(bin, toks);
  rt::data::MaskFileWriter w(rt::data::mask_path_for(bin));
  w.append(mask);
  w.finish();
}

class SftLayouts : public ::testing::TestWithParam<Layout> {
 public:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::vector<uint16_t> toks(12000);
    std::vector<uint8_t> mask(toks.size());
    std::mt19937 rng(5);
    for (size_t i = 0; i < toks.size(); ++i) {
      toks[i] = static_cast<uint16_t>((i * 7 + i / 5) % 31);
      if (rng() % 16 == 0) toks[i] = static_cast<uint16_t>(rng() % 32);
      // Runs of counted tokens of uneven length, a few windows nearly empty.
      mask[i] = (i / 11) % 5 < (i / 160) % 4 || rng() % 9 == 0 ? 1 : 0;
    }
    write_masked(*dir_ / "train.bin", toks, mask);
    write_masked(*dir_ / "val.bin", std::vector<uint16_t>(toks.begin(), toks.begin() + 4000),
                 std::vector<uint8_t>(mask.begin(), mask.begin() + 4000));
    auto r = run(Layout{}, config(Layout{}));
    ASSERT_EQ(r.rc, 0) << r.err;
    ASSERT_EQ(r.metrics.size(), static_cast<size_t>(kSteps));
    baseline_ = new std::vector<json>(r.metrics);
  }
  static void TearDownTestSuite() {
    delete baseline_;
    delete dir_;
  }

 protected:
  // Global batch 8 sequences of 16 tokens, micro-batch 1: G = 8 / dp.
  static json config(const Layout& l) {
    return {
        {"train_batch_size", 8},
        {"train_micro_batch_size_per_gpu", 1},
        {"gradient_clipping", 0.5},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}, {"weight_decay", 0.1}}}}},
        {"zero_optimization", {{"stage", l.zero_stage}}},
        {"pipeline", {{"stages", l.pp}, {"schedule", l.schedule}}},
        {"tensor_parallel", {{"size", l.tp}}},
        {"context_parallel", {{"size", l.cp}, {"method", l.cp_method}}},
        {"model",
         {{"type", "gpt2"}, {"n_layer", 4}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 32}, {"seq_len", kSeq}}},
        {"data", {{"train", *dir_ / "train.bin"}, {"val", *dir_ / "val.bin"}}},
        {"training",
         {{"steps", kSteps}, {"seed", 7}, {"log_interval", 1}, {"eval_interval", 5}, {"eval_steps", 8 / l.dp}}},
    };
  }
  static test::TrainJobResult run(const Layout& l, const json& cfg) {
    static int counter = 0;
    return test::run_train_job(dir_->path(), "run" + std::to_string(counter++), l.world(), cfg, {}, 240s);
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::vector<json>* baseline_ = nullptr;
};

TEST_P(SftLayouts, MatchesTheSingleProcess) {
  const Layout l = GetParam();
  ASSERT_NE(baseline_, nullptr);
  auto r = run(l, config(l));
  ASSERT_EQ(r.rc, 0) << r.err;
  test::expect_curve_matches(*baseline_, r.metrics, 1,
                             [](const std::string& key) { return key == "grad_norm" ? 1e-4 : 1e-5; }, l.name());
  // Every rank counts the same targets for the step (from the masks of all its windows).
  for (size_t i = 0; i < r.metrics.size(); ++i) {
    EXPECT_EQ(r.metrics[i].at("counted_tokens"), (*baseline_)[i].at("counted_tokens")) << l.name() << " step " << i;
  }
}

Layout make(int tp, int pp, int dp, int cp, int zero = 0, std::string schedule = "1f1b", std::string m = "ring") {
  Layout l;
  l.tp = tp, l.pp = pp, l.dp = dp, l.cp = cp, l.zero_stage = zero, l.schedule = std::move(schedule);
  l.cp_method = std::move(m);
  return l;
}

INSTANTIATE_TEST_SUITE_P(Layouts, SftLayouts,
                         ::testing::Values(make(1, 1, 2, 1), make(1, 1, 2, 1, 1), make(2, 1, 1, 1),
                                           make(1, 2, 1, 1), make(1, 2, 1, 1, 0, "gpipe"), make(1, 1, 1, 2),
                                           make(1, 1, 1, 2, 0, "1f1b", "ulysses"), make(2, 2, 1, 1)),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace ds
