// The Mixtral model (a mixture of experts) under the parallel layouts, through `dstrain launch`
// (real processes, the real store and collectives, OMP_NUM_THREADS=1 per rank), against the single
// process on the same global batch (8 sequences, micro-batch 1, so G = 8/dp micro-batches
// accumulate per step). Every layout here keeps the micro-batches whole, so the load-balancing
// loss (router_aux_loss_coef 0.05, over each micro-batch's layers) is the single process's:
//   tp 2 (experts sharded as the dense MLP), pp 2 (the router statistics travel with the
//   activations and their gradient), tp 2 x pp 2, ZeRO 1-3 at dp 2 and 4, recompute in a pipeline,
//   and bf16 at tp 2 and pp 2;
// 20 steps of loss, aux loss, gradient norm and validation loss within 1e-5 (1e-4 for the norm;
// bf16 1e-3 and 2e-2), and `dstrain plan --json`'s bytes equal every rank's measured peaks, every
// tag.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "data/token_file.h"
#include "multiproc/launch/job_process.h"
#include "multiproc/train/safetensors_all.h"
#include "multiproc/train/train_job.h"

namespace ds {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using test::TempDir;

constexpr int kSteps = 20;
constexpr int kLayers = 4, kHeads = 4, kEmbd = 32, kInter = 24, kExperts = 4, kVocab = 32, kSeq = 16;

struct Layout {
  int tp = 1, pp = 1, dp = 1;
  int zero_stage = 0;
  bool checkpointing = false;
  std::string precision = "fp32";
  int ep = 1;  // expert parallelism, carved from the dp (x cp) ranks
  int cp = 1;  // context parallelism (ring): splits micro-batches, so the aux loss's weight is 0
  int world() const { return tp * pp * dp * cp; }
  double coef() const { return cp > 1 ? 0.0 : 0.05; }
  std::string model() const { return precision + (coef() == 0.0 ? "_coef0" : ""); }
  std::string name() const {
    return "tp" + std::to_string(tp) + "_pp" + std::to_string(pp) + "_dp" + std::to_string(dp) +
           (cp > 1 ? "_cp" + std::to_string(cp) : "") + (ep > 1 ? "_ep" + std::to_string(ep) : "") + "_zero" +
           std::to_string(zero_stage) + "_" + precision +
           (checkpointing ? "_recompute" : "");
  }
};
void PrintTo(const Layout& l, std::ostream* os) { *os << l.name(); }

class MixtralLayouts : public ::testing::TestWithParam<Layout> {
 public:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::vector<uint16_t> toks = test::patterned_tokens(20000, kVocab);
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
    json c = {
        {"train_batch_size", 8},
        {"train_micro_batch_size_per_gpu", 1},
        {"gradient_clipping", 0.5},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}, {"weight_decay", 0.1}}}}},
        {"zero_optimization", {{"stage", l.zero_stage}, {"reduce_bucket_size", 3000}, {"allgather_bucket_size", 2000}}},
        {"pipeline", {{"stages", l.pp}}},
        {"tensor_parallel", {{"size", l.tp}}},
        {"expert_parallel", {{"size", l.ep}}},
        {"context_parallel", {{"size", l.cp}}},
        {"activation_checkpointing", {{"enabled", l.checkpointing}}},
        {"model",
         {{"type", "mixtral"}, {"n_layer", kLayers}, {"n_head", kHeads}, {"n_kv_head", 2}, {"n_embd", kEmbd},
          {"intermediate_size", kInter}, {"num_local_experts", kExperts}, {"num_experts_per_tok", 2},
          {"router_aux_loss_coef", l.coef()}, {"vocab_size", kVocab}, {"seq_len", kSeq}}},
        {"data", {{"train", *dir_ / "train.bin"}, {"val", *dir_ / "val.bin"}}},
        {"training",
         {{"steps", kSteps}, {"seed", 7}, {"log_interval", 5}, {"eval_interval", 10}, {"eval_steps", 8 / l.dp}}},
    };
    if (l.precision == "bf16") c["bf16"] = {{"enabled", true}};
    if (!ckpt_dir.empty()) {
      c["training"]["checkpoint_dir"] = ckpt_dir;
      c["training"]["checkpoint_interval"] = 10;
    }
    return c;
  }

  static test::TrainJobResult run(const Layout& l, const json& cfg, std::vector<std::string> extra) {
    static int counter = 0;
    return test::run_train_job(dir_->path(), "run" + std::to_string(counter++), l.world(), cfg, extra, 240s);
  }

  static const std::vector<json>& baseline(const Layout& l) {
    auto it = baselines_->find(l.model());
    if (it != baselines_->end()) return it->second;
    Layout one;
    one.precision = l.precision;
    one.cp = 1;
    json cfg = config(one);
    cfg["model"]["router_aux_loss_coef"] = l.coef();
    auto r = run(one, cfg, {});
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(r.metrics.size(), static_cast<size_t>(kSteps)) << r.err;
    return baselines_->emplace(l.model(), r.metrics).first->second;
  }

  static double tolerance(const Layout& l, const std::string& key) {
    if (l.precision == "fp32") return key == "grad_norm" ? 1e-4 : 1e-5;
    return key == "grad_norm" ? 2e-2 : 1e-3;
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::map<std::string, std::vector<json>>* baselines_ = nullptr;
};

TEST_P(MixtralLayouts, TwentyStepsMatchTheSingleProcessAndThePlan) {
  const Layout l = GetParam();
  static int plan_counter = 0;
  const json cfg = config(l);
  auto r = run(l, cfg, {"--metrics-all-ranks"});
  ASSERT_EQ(r.rc, 0) << l.name() << "\n" << r.err;
  const auto& base = baseline(l);
  test::expect_curve_matches(base, r.metrics, 1, [&](const std::string& key) { return tolerance(l, key); }, l.name());
  // The load-balancing loss is reported on every step and follows the single process's (a cp rank
  // computes it over its own rows: there only the loss curve, with the aux loss's weight 0).
  ASSERT_EQ(r.metrics.size(), base.size());
  double worst = 0;
  for (size_t i = 0; i < base.size() && l.cp == 1; i++) {
    ASSERT_TRUE(r.metrics[i].contains("aux_loss")) << l.name();
    const double want = base[i].at("aux_loss").get<double>(), got = r.metrics[i].at("aux_loss").get<double>();
    worst = std::max(worst, std::fabs(got - want) / want);
    EXPECT_NEAR(got, want, tolerance(l, "loss") * want) << l.name() << " step " << i + 1;
  }
  std::cout << l.name() << ": aux_loss worst relative difference " << worst << "\n";
  const std::string cfg_path = *dir_ / ("plan" + std::to_string(plan_counter++) + ".json");
  std::ofstream(cfg_path) << cfg.dump(2);
  const json ranks = test::plan_ranks(cfg_path, l.world());
  const int exact = test::expect_plan_equals_peaks(ranks, r.metrics.back(), l.world(), l.name());
  std::cout << l.name() << ": plan == measured peak on " << exact << " of " << 8 * l.world() << " (rank, tag) pairs\n";
}

Layout bf16(Layout l) {
  l.precision = "bf16";
  return l;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, MixtralLayouts,
    ::testing::Values(Layout{2, 1, 1, 0}, Layout{1, 2, 1, 0}, Layout{2, 2, 1, 0}, Layout{1, 1, 2, 1},
                      Layout{1, 1, 2, 2}, Layout{1, 1, 4, 3}, Layout{1, 2, 2, 1, true}, bf16(Layout{2, 1, 1, 0}),
                      bf16(Layout{1, 2, 1, 0})),
    [](const ::testing::TestParamInfo<Layout>& i) { return i.param.name(); });

Layout ep(Layout l, int n) {
  l.ep = n;
  return l;
}

// Expert parallelism: ep 2 alone, over dp 4 with ZeRO 1-3 (the experts partitioned over their
// expert-data-parallel pairs), with tp 2, with pp 2, ep 4 at world 4 (one expert a rank), with
// recompute, and at bf16.
INSTANTIATE_TEST_SUITE_P(
    Experts, MixtralLayouts,
    ::testing::Values(ep(Layout{1, 1, 2, 0}, 2), ep(Layout{1, 1, 4, 1}, 2), ep(Layout{1, 1, 4, 2}, 2),
                      ep(Layout{1, 1, 4, 3}, 2), ep(Layout{2, 1, 2, 0}, 2), ep(Layout{1, 2, 2, 0}, 2),
                      ep(Layout{1, 1, 4, 0}, 4), ep(Layout{1, 1, 2, 1, true}, 2), ep(bf16(Layout{1, 1, 2, 0}), 2),
                      [] {  // context parallelism 2 with the experts over its two ranks
                        Layout l = ep(Layout{1, 1, 1, 1}, 2);
                        l.cp = 2;
                        return l;
                      }()),
    [](const ::testing::TestParamInfo<Layout>& i) { return i.param.name(); });

class MixtralCheckpoints : public MixtralLayouts {};

// training.checkpoint_async with experts (ep 2 over dp 2, ZeRO 1): every rank's staging buffer
// holds its dense and its expert partitions, as the plan's checkpoint tag says, to the byte.
TEST_F(MixtralCheckpoints, AsyncStagingHoldsTheExpertRegionAsPlanned) {
  const Layout l = ep(Layout{1, 1, 2, 1}, 2);
  json cfg = config(l, *dir_ / "ckpt-async-ep2");
  cfg["training"]["checkpoint_async"] = true;
  auto r = run(l, cfg, {"--metrics-all-ranks", "--max-steps", "10"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string cfg_path = *dir_ / "plan-async-ep2.json";
  std::ofstream(cfg_path) << cfg.dump(2);
  const json ranks = test::plan_ranks(cfg_path, l.world());
  for (const json& rank : ranks) EXPECT_GT(rank.at("checkpoint").get<int64_t>(), 0);
  const int exact = test::expect_plan_equals_peaks(ranks, r.metrics.back(), l.world(), l.name() + " async");
  EXPECT_EQ(exact, 8 * l.world());
}

// A checkpoint of ep 2 (ZeRO 1 over dp 2: the experts partitioned over their pairs) resumes on one
// process (ep 1) and one of ep 1 (dp 4, ZeRO 2) at ep 4 (one expert a rank, ZeRO 3): every
// expert resharded, the curve the single process's.
TEST_F(MixtralCheckpoints, ExpertsReshardAcrossExpertParallelSizes) {
  const std::string a_dir = *dir_ / "ckpt-ep2", b_dir = *dir_ / "ckpt-ep1";
  const Layout ep2 = ep(Layout{1, 1, 4, 1}, 2), one;
  auto a = run(ep2, config(ep2, a_dir), {"--max-steps", "10"});
  ASSERT_EQ(a.rc, 0) << a.err;
  auto b = run(one, config(one, a_dir), {"--resume"});
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_NE((b.out + b.err).find("resharding checkpoint"), std::string::npos) << b.out << b.err;
  test::expect_curve_matches(baseline(one), b.metrics, 11, [&](const std::string& key) { return tolerance(one, key); },
                             "ep2 resumed at ep1");
  const Layout dp4{1, 1, 4, 2};
  auto c = run(dp4, config(dp4, b_dir), {"--max-steps", "10"});
  ASSERT_EQ(c.rc, 0) << c.err;
  const Layout ep4 = ep(Layout{1, 1, 4, 3}, 4);
  auto d = run(ep4, config(ep4, b_dir), {"--resume"});
  ASSERT_EQ(d.rc, 0) << d.err;
  test::expect_curve_matches(baseline(one), d.metrics, 11, [&](const std::string& key) { return tolerance(one, key); },
                             "ep1 resumed at ep4");
}

// --export-safetensors from ep 2 x tp 2 (ZeRO 2) writes exactly the single process's weights in
// HF Mixtral's names (each expert's w1, w2, w3), and a run starting from them has the single
// process's first loss.
TEST_F(MixtralCheckpoints, SafetensorsExportFromExpertPartsIsTheWholeModel) {
  const std::string one = *dir_ / "hf-single", parts = *dir_ / "hf-parts";
  const Layout single, split = ep(Layout{2, 1, 2, 2}, 2);
  auto a = run(single, config(single), {"--max-steps", "0", "--export-safetensors", one});
  ASSERT_EQ(a.rc, 0) << a.err;
  auto b = run(split, config(split), {"--max-steps", "0", "--export-safetensors", parts});
  ASSERT_EQ(b.rc, 0) << b.err;
  const auto wa = test::read_safetensors_all(one), wb = test::read_safetensors_all(parts);
  EXPECT_EQ(wa.size(), 2u + (7u + 3u * kExperts) * kLayers + 1u);  // embed, layers (router, experts), norm, lm_head
  EXPECT_EQ(wa, wb);
  EXPECT_EQ(wa.at("model.layers.1.block_sparse_moe.experts.3.w2.weight").size(), static_cast<size_t>(kEmbd * kInter));
  const json hf = json::parse(test::slurp(one + "/config.json"));
  EXPECT_EQ(hf["architectures"][0], "MixtralForCausalLM");
  EXPECT_EQ(hf["num_local_experts"], kExperts);
  json cfg = config(split);
  cfg["model"]["init_from"] = parts;
  cfg["training"]["seed"] = 99;
  cfg["training"]["steps"] = 1;
  auto c = run(split, cfg, {});
  ASSERT_EQ(c.rc, 0) << c.err;
  ASSERT_FALSE(c.metrics.empty());
  const double want = baseline(single)[0].at("loss").get<double>();
  EXPECT_LE(std::abs(c.metrics[0].at("loss").get<double>() - want), 1e-5 * want);
}

}  // namespace
}  // namespace ds
