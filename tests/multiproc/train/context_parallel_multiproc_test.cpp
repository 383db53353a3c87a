// Context and sequence parallelism in training, through `dstrain launch` (real processes, the real store and
// collectives, OMP_NUM_THREADS=1 per rank), against the single process of the same model on the
// same global batch (8 sequences of 16 tokens, micro-batch 1, so G = 8/dp micro-batches
// accumulate per step), GPT-2 (learned positions, multi-head) and Llama (RoPE, GQA 4 query heads
// over 2 kv heads):
//   cp 2 ring, cp 2 Ulysses, cp 4 ring at world 4, cp 2 x dp 2 at ZeRO 1 and 3, cp 2 x pp 2,
//   cp 2 x tp 2, cp 2 with activation checkpointing, and cp 2 at bf16 against the bf16 single
//   process; Megatron's sequence parallelism at tp 2 alone, x dp 2 at ZeRO 1 and 2, with
//   recompute, x pp 2, x cp 2 and at bf16;
// 20 steps of loss, gradient norm and validation loss within 1e-5 (1e-4 for the norm; bf16 1e-3
// and 2e-2, as llama_multiproc_test.cpp explains); on every layout `dstrain plan --json`'s bytes
// equal the measured peaks of every rank and tag (--metrics-all-ranks, the whole run), and a cp 2
// rank's activation peak is half the single process's (the issue asks at most 0.6x). A cp 2 ring
// checkpoint resumes at cp 1 x dp 2 and at cp 2 Ulysses on the same curve.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/token_file.h"
#include "multiproc/launch/job_process.h"
#include "multiproc/train/train_job.h"

namespace ds {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using test::JobProcess;
using test::TempDir;

constexpr int kSteps = 20, kSeq = 16;

struct Layout {
  std::string family = "gpt2";
  int cp = 1;
  std::string method = "ring";
  int dp = 1, tp = 1, pp = 1;
  int zero_stage = 0;
  bool checkpointing = false;
  std::string precision = "fp32";
  bool sp = false;  // tensor_parallel.sequence_parallel
  int world() const { return cp * dp * tp * pp; }
  std::string model() const { return family + (precision == "fp32" ? "" : "_" + precision); }
  std::string name() const {
    return model() + "_cp" + std::to_string(cp) + "_" + method + "_dp" + std::to_string(dp) + "_tp" +
           std::to_string(tp) + "_pp" + std::to_string(pp) + "_zero" + std::to_string(zero_stage) +
           (checkpointing ? "_recompute" : "") + (sp ? "_sp" : "");
  }
};
void PrintTo(const Layout& l, std::ostream* os) { *os << l.name(); }

class ContextParallelTraining : public ::testing::TestWithParam<Layout> {
 public:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::vector<uint16_t> toks = test::patterned_tokens(20000, 32);
    rt::data::write_token_file(*dir_ / "train.bin", toks);
    rt::data::write_token_file(*dir_ / "val.bin", std::vector<uint16_t>(toks.begin(), toks.begin() + 4000));
    baselines_ = new std::map<std::string, std::vector<json>>();
  }
  static void TearDownTestSuite() {
    delete baselines_;
    delete dir_;
  }

 protected:
  static json config(const Layout& l, const std::string& ckpt_dir = "") {
    json training = {{"steps", kSteps}, {"seed", 7}, {"log_interval", 5}, {"eval_interval", 10}, {"eval_steps", 8 / l.dp}};
    if (!ckpt_dir.empty()) {
      training["checkpoint_dir"] = ckpt_dir;
      training["checkpoint_interval"] = 10;
    }
    const json model =
        l.family == "gpt2"
            ? json{{"type", "gpt2"}, {"n_layer", 4}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 32}, {"seq_len", kSeq}}
            : json{{"type", "llama"}, {"n_layer", 4},         {"n_head", 4},        {"n_kv_head", 2},
                   {"n_embd", 32},    {"intermediate_size", 48}, {"vocab_size", 32}, {"seq_len", kSeq}};
    json c = {
        {"train_batch_size", 8},
        {"train_micro_batch_size_per_gpu", 1},
        {"gradient_clipping", 0.5},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}, {"weight_decay", 0.1}}}}},
        {"zero_optimization", {{"stage", l.zero_stage}, {"reduce_bucket_size", 3000}, {"allgather_bucket_size", 2000}}},
        {"pipeline", {{"stages", l.pp}}},
        {"tensor_parallel", {{"size", l.tp}, {"sequence_parallel", l.sp}}},
        {"context_parallel", {{"size", l.cp}, {"method", l.method}}},
        {"activation_checkpointing", {{"enabled", l.checkpointing}}},
        {"model", model},
        {"data", {{"train", *dir_ / "train.bin"}, {"val", *dir_ / "val.bin"}}},
        {"training", training},
    };
    if (l.precision == "bf16") c["bf16"] = {{"enabled", true}};
    return c;
  }

  static test::TrainJobResult run(const Layout& l, const json& cfg, std::vector<std::string> extra) {
    static int counter = 0;
    return test::run_train_job(dir_->path(), "run" + std::to_string(counter++), l.world(), cfg, extra, 240s);
  }

  // The single process's 20 steps for this layout's model (run once per model).
  static const std::vector<json>& baseline(const Layout& l) {
    auto it = baselines_->find(l.model());
    if (it != baselines_->end()) return it->second;
    Layout one;
    one.family = l.family;
    one.precision = l.precision;
    auto r = run(one, config(one), {});
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(r.metrics.size(), static_cast<size_t>(kSteps)) << r.err;
    return baselines_->emplace(l.model(), r.metrics).first->second;
  }

  static double tolerance(const Layout& l, const std::string& key) {
    if (l.precision == "fp32") return key == "grad_norm" ? 1e-4 : 1e-5;
    return key == "grad_norm" ? 2e-2 : 1e-3;
  }

  static void expect_curve(const Layout& l, const std::vector<json>& m, int first_step, const std::string& what) {
    test::expect_curve_matches(baseline(l), m, first_step, [&](const std::string& key) { return tolerance(l, key); },
                               what);
  }

  // `dstrain plan --json`'s ranks for a config.
  static json plan_ranks(const Layout& l, const json& cfg) {
    static int counter = 0;
    const std::string path = *dir_ / ("plan" + std::to_string(counter++) + ".json");
    std::ofstream(path) << cfg.dump(2);
    return test::plan_ranks(path, l.world());
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::map<std::string, std::vector<json>>* baselines_ = nullptr;
};

TEST_P(ContextParallelTraining, TwentyStepsMatchTheSingleProcessAndThePlan) {
  const Layout l = GetParam();
  const json cfg = config(l);
  auto r = run(l, cfg, {"--metrics-all-ranks"});
  ASSERT_EQ(r.rc, 0) << l.name() << "\n" << r.err;
  expect_curve(l, r.metrics, 1, l.name());
  ASSERT_FALSE(r.metrics.empty());
  const json& real = r.metrics.back();  // every rank's peaks over the whole run
  test::expect_plan_equals_peaks(plan_ranks(l, cfg), real, l.world(), l.name());
  std::cout << l.name() << ": rank 0 activations " << real.at("peak_bytes_activations_rank0").get<int64_t>()
            << " B, total " << real.at("peak_bytes_total_rank0").get<int64_t>() << " B\n";
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ContextParallelTraining,
    ::testing::Values(Layout{"gpt2", 2}, Layout{"gpt2", 2, "ulysses"}, Layout{"gpt2", 4},
                      Layout{"gpt2", 2, "ring", 2, 1, 1, 1}, Layout{"gpt2", 2, "ring", 1, 1, 2, 0},
                      Layout{"gpt2", 2, "ring", 1, 2, 1, 0}, Layout{"llama", 2}, Layout{"llama", 2, "ulysses"},
                      Layout{"llama", 4}, Layout{"llama", 2, "ring", 2, 1, 1, 3},
                      Layout{"llama", 2, "ulysses", 2, 1, 1, 1}, Layout{"llama", 2, "ring", 1, 2, 1, 0},
                      Layout{"llama", 2, "ring", 1, 1, 2, 1}, Layout{"llama", 2, "ring", 1, 1, 1, 0, true},
                      Layout{"llama", 2, "ulysses", 1, 1, 1, 0, false, "bf16"},
                      Layout{"llama", 2, "ring", 1, 1, 1, 0, false, "bf16"}),
    [](const ::testing::TestParamInfo<Layout>& i) { return i.param.name(); });

Layout sp(Layout l) {
  l.sp = true;
  return l;
}

// Megatron's sequence parallelism: tp 2 alone, with dp 2 at ZeRO 1 (the norms' gradients
// accumulate over 4 micro-batches before their tp sum) and ZeRO 2 (summed every micro-batch),
// with recompute, a pipeline and cp 2; at bf16.
INSTANTIATE_TEST_SUITE_P(
    SequenceParallel, ContextParallelTraining,
    ::testing::Values(sp(Layout{"gpt2", 1, "ring", 1, 2}), sp(Layout{"llama", 1, "ring", 1, 2}),
                      sp(Layout{"gpt2", 1, "ring", 2, 2, 1, 1}), sp(Layout{"llama", 1, "ring", 2, 2, 1, 2}),
                      sp(Layout{"gpt2", 1, "ring", 1, 2, 1, 0, true}), sp(Layout{"llama", 1, "ring", 1, 2, 2, 1}),
                      sp(Layout{"gpt2", 2, "ring", 1, 2}), sp(Layout{"llama", 2, "ring", 1, 2}),
                      sp(Layout{"llama", 1, "ring", 1, 2, 1, 0, false, "bf16"})),
    [](const ::testing::TestParamInfo<Layout>& i) { return i.param.name(); });

// Same micro-batch and sequence: a cp 2 rank keeps half the single process's activations; at tp 2
// sequence parallelism keeps less than tp 2 alone (the residual stream and the norms split too).
TEST_F(ContextParallelTraining, HalfTheActivationsPerRankAtCpTwo) {
  for (const char* family : {"gpt2", "llama"}) {
    Layout one, two;
    one.family = two.family = family;
    two.cp = 2;
    const int64_t a1 = plan_ranks(one, config(one))[0].at("activations").get<int64_t>();
    const int64_t a2 = plan_ranks(two, config(two))[0].at("activations").get<int64_t>();
    EXPECT_LE(static_cast<double>(a2), 0.6 * static_cast<double>(a1)) << family;
    std::cout << family << ": activations per rank at cp 1 " << a1 << " B, at cp 2 " << a2 << " B ("
              << static_cast<double>(a2) / static_cast<double>(a1) << "x)\n";
    Layout tp2 = one;
    tp2.tp = 2;
    const Layout tp2sp = sp(tp2);
    const int64_t t = plan_ranks(tp2, config(tp2))[0].at("activations").get<int64_t>();
    const int64_t ts = plan_ranks(tp2sp, config(tp2sp))[0].at("activations").get<int64_t>();
    EXPECT_LT(ts, t) << family;
    std::cout << family << ": activations per rank at tp 2 " << t << " B, with sequence parallelism " << ts << " B\n";
  }
}

// A cp 2 ring checkpoint at step 10 resumes at cp 1 x dp 2 (ZeRO 1: the partitions of the dp x cp
// group re-read for the dp group) and at cp 2 Ulysses, on the single process's curve.
TEST_F(ContextParallelTraining, ACheckpointResumesAtAnotherContextParallelLayout) {
  Layout ring;
  ring.family = "llama";
  ring.cp = 2;
  ring.zero_stage = 1;
  const std::string ckpt = *dir_ / "ckpt-cp2";
  auto a = run(ring, config(ring, ckpt), {"--max-steps", "10"});
  ASSERT_EQ(a.rc, 0) << a.err;
  std::filesystem::copy(ckpt, *dir_ / "ckpt-cp2-u", std::filesystem::copy_options::recursive);
  Layout dp2;
  dp2.family = "llama";
  dp2.dp = 2;
  dp2.zero_stage = 1;
  auto b = run(dp2, config(dp2, ckpt), {"--resume"});
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_NE((b.out + b.err).find("context-parallel 2"), std::string::npos) << b.out << b.err;
  expect_curve(dp2, b.metrics, 11, "cp2 ring resumed at cp1 x dp2");
  Layout u = ring;
  u.method = "ulysses";
  auto c = run(u, config(u, *dir_ / "ckpt-cp2-u"), {"--resume"});
  ASSERT_EQ(c.rc, 0) << c.err;
  expect_curve(u, c.metrics, 11, "cp2 ring resumed at cp2 Ulysses");
}

}  // namespace
}  // namespace ds
