// The plan held to reality on every rank of real multi-process jobs: `dstrain launch` runs
// `dstrain train --metrics-all-ranks` for 2 steps of a tiny model (OMP_NUM_THREADS=1 per rank),
// and each rank's measured peak bytes per allocator tag (rank 0's last metrics line) must equal
// plan::predicted_rank_memory for that rank exactly (to the byte), for data parallelism with ZeRO 0-3, tensor
// parallelism, pipelines (1F1B and GPipe, uniform and parameter partitions), their combinations
// and activation checkpointing; at 16 bits the same for GPT-2 and a few Llama layouts. Prints the
// worst relative difference of every layout.
//
// Not here: the single-process layouts (tests/unit/plan/held_to_reality_test.cpp), the losses of
// these layouts (tests/multiproc/train).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "config/job_config.h"
#include "multiproc/launch/job_process.h"
#include "multiproc/train/train_job.h"
#include "plan/from_config.h"

namespace ds {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using test::TempDir;


struct Layout {
  std::string name;
  int tp = 1, pp = 1, dp = 1;
  json zero = json{{"stage", 0}};
  std::string schedule = "1f1b";
  std::string partition = "uniform";
  bool checkpointing = false;
  std::string precision = "fp32";  // "bf16" / "fp16": 2-byte storage
  std::string grad_accum = "";     // data_types.grad_accum_dtype when not empty
  bool llama = false;              // the Llama model (GQA, SwiGLU, RMSNorm) instead of GPT-2
  std::string optimizer = "AdamW";  // optimizer.type: its state (and the 1-bit buffers) per element
  bool async_checkpoint = false;    // training.checkpoint_async, a checkpoint every step: the staging tag
  int world() const { return tp * pp * dp; }
};
// gtest lists a parameter by this (ctest's test names carry it), not by its bytes.
void PrintTo(const Layout& l, std::ostream* os) { *os << l.name; }

class PlanMultiproc : public ::testing::TestWithParam<Layout> {
 public:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    // An llm.c token file: 256 int32 header (magic, version, count), then uint16 tokens.
    std::ofstream f(*dir_ / "train.bin", std::ios::binary);
    const int32_t n = 8192;
    int32_t header[256] = {20240520, 1, n};
    f.write(reinterpret_cast<const char*>(header), sizeof(header));
    for (int32_t i = 0; i < n; ++i) {
      const auto t = static_cast<uint16_t>((i * 7919 + i / 3) % 32);
      f.write(reinterpret_cast<const char*>(&t), sizeof(t));
    }
  }
  static void TearDownTestSuite() { delete dir_; }

 protected:
  // 4 layers (pp 2 splits them), C = 32, micro-batch 2 of 16 tokens, 4 micro-batches per step on
  // every data-parallel rank (1F1B keeps 2 in flight on the first of 2 stages).
  static json config(const Layout& l) {
    json c = base_config(l);
    if (l.precision == "bf16") c["bf16"] = {{"enabled", true}};
    if (l.precision == "fp16") c["fp16"] = {{"enabled", true}};
    if (!l.grad_accum.empty()) c["data_types"] = {{"grad_accum_dtype", l.grad_accum}};
    if (l.async_checkpoint) {
      c["training"]["checkpoint_dir"] = *dir_ / (l.name + "_checkpoints");
      c["training"]["checkpoint_interval"] = 1;
      c["training"]["checkpoint_async"] = true;
    }
    return c;
  }
  static json gpt2_model() {
    return {{"type", "gpt2"}, {"n_layer", 4}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 32}, {"seq_len", 16}};
  }
  static json llama_model() {
    return {{"type", "llama"}, {"n_layer", 4},  {"n_head", 4},     {"n_kv_head", 2},
            {"n_embd", 32},    {"intermediate_size", 48}, {"vocab_size", 32}, {"seq_len", 16}};
  }
  static json base_config(const Layout& l) {
    return {
        {"train_micro_batch_size_per_gpu", 2},
        {"gradient_accumulation_steps", 4},
        {"optimizer", {{"type", l.optimizer}, {"params", {{"lr", 0.001}}}}},
        {"zero_optimization", l.zero},
        {"pipeline", {{"stages", l.pp}, {"schedule", l.schedule}, {"partition", l.partition}}},
        {"tensor_parallel", {{"size", l.tp}}},
        {"activation_checkpointing", {{"enabled", l.checkpointing}}},
        {"model", l.llama ? llama_model() : gpt2_model()},
        {"data", {{"train", *dir_ / "train.bin"}, {"shuffle", false}}},
        {"training", {{"steps", 2}, {"log_interval", 1}, {"device", "cpu"}}},
    };
  }

  static inline TempDir* dir_ = nullptr;
};

TEST_P(PlanMultiproc, EveryRanksPeakPerTagMatchesThePlan) {
  const Layout l = GetParam();
  const std::string cfg_path = *dir_ / (l.name + ".json");  // run_train_job writes it there
  const auto r = test::run_train_job(dir_->path(), l.name, l.world(), config(l), {"--metrics-all-ranks"}, 120s);
  ASSERT_EQ(r.rc, 0) << l.name << "\n" << r.err;
  ASSERT_FALSE(r.metrics.empty()) << l.name << ": no metrics";
  const json& real = r.metrics.back();
  const std::string last = real.dump();
  ASSERT_EQ(real.at("step").get<int>(), 2);

  const config::JobConfig cfg = config::load_job_config(cfg_path, l.world());
  double worst = 0;
  std::string worst_at;
  for (int q = 0; q < l.world(); ++q) {
    const plan::RankMemory planned = plan::predicted_rank_memory(cfg, q, 1);
    const auto want = plan::tag_bytes(planned);
    // The staging is there exactly when the config asks for it.
    EXPECT_EQ(want.at("checkpoint") > 0, l.async_checkpoint) << l.name << " rank " << q;
    std::map<std::string, int64_t> measured;
    for (const char* tag : plan::kTagNames) {
      const std::string key = std::string("peak_bytes_") + tag + "_rank" + std::to_string(q);
      ASSERT_TRUE(real.contains(key)) << l.name << ": " << key << " missing in " << last;
      measured[tag] = real.at(key).get<int64_t>();
    }
    for (const char* tag : plan::kTagNames) {
      const double d = plan::relative_difference(want.at(tag), measured.at(tag));
      EXPECT_EQ(want.at(tag), measured.at(tag)) << l.name << " rank " << q << " " << tag << ": planned "
                                          << want.at(tag) << " B, measured " << measured.at(tag) << " B\n"
                                          << plan::describe_prediction(planned, measured);
      if (std::fabs(d) > std::fabs(worst)) {
        worst = d;
        worst_at = fmt::format("rank {} {}", q, tag);
      }
    }
  }
  std::cout << fmt::format("{}: {} rank(s), worst plan-vs-measured difference {:+.4f}% ({})\n", l.name,
                           l.world(), 100.0 * worst, worst == 0 ? "every tag exact" : worst_at);
}

Layout data_parallel(int dp, int stage) {
  Layout l{"dp" + std::to_string(dp) + "_zero" + std::to_string(stage), 1, 1, dp};
  // Small buckets so every ZeRO buffer exists: ZeRO-1/2 all-gather staging (2000 elements per rank
  // < a partition), ZeRO-2/3 two overlapped reduce buckets, ZeRO-3 prefetch and persistent units.
  l.zero = {{"stage", stage},
            {"overlap_comm", true},
            {"reduce_bucket_size", 5000},
            {"allgather_bucket_size", 2000},
            {"stage3_prefetch_bucket_size", 15000},
            {"stage3_param_persistence_threshold", 100},
            {"stage3_max_live_parameters", 30000}};
  return l;
}

// The layout at 16 bits: every 2-byte tag (params, grads, activations, comm buffers) and the
// fp32 statistics and optimizer state, held to the plan the same way.
Layout sixteen(Layout l, const std::string& precision = "bf16", const std::string& grad_accum = "") {
  l.name += "_" + precision + (grad_accum.empty() ? "" : "_grads_" + grad_accum);
  l.precision = precision;
  l.grad_accum = grad_accum;
  return l;
}

INSTANTIATE_TEST_SUITE_P(
    SixteenBit, PlanMultiproc,
    ::testing::Values(sixteen(data_parallel(2, 0)), sixteen(data_parallel(2, 1)), sixteen(data_parallel(2, 2)),
                      sixteen(data_parallel(2, 3)), sixteen(data_parallel(4, 2)),
                      sixteen(data_parallel(2, 2), "bf16", "fp32"), sixteen(data_parallel(2, 1), "fp16"),
                      sixteen(Layout{"tp2", 2, 1, 1}), sixteen(Layout{"pp2_1f1b", 1, 2, 1}),
                      sixteen(Layout{"pp4_zero2_checkpointing", 1, 4, 1,
                                     json{{"stage", 2}, {"reduce_bucket_size", 3000}}, "1f1b", "uniform", true}),
                      sixteen(Layout{"tp2_pp2_dp2_zero2", 2, 2, 2, json{{"stage", 2}, {"reduce_bucket_size", 3000}}}),
                      sixteen(Layout{"tp2_dp2_zero3", 2, 1, 2,
                                     json{{"stage", 3}, {"stage3_param_persistence_threshold", 100},
                                          {"stage3_prefetch_bucket_size", 10000}}})),
    [](const ::testing::TestParamInfo<Layout>& i) { return i.param.name; });

Layout with_optimizer(Layout l, const std::string& type) {
  l.name = type + "_" + l.name;
  l.optimizer = type;
  return l;
}

// Each optimizer's state: Lion's and Adagrad's one moment, LAMB's two, 0/1 Adam's accumulator,
// 1-bit LAMB's fresh variance and last momentum, and the 1-bit error feedback and messages at dp 2
// and 4 (the 1-bit ones run at ZeRO stage 0).
INSTANTIATE_TEST_SUITE_P(
    Optimizers, PlanMultiproc,
    ::testing::Values(with_optimizer(data_parallel(2, 1), "Lion"), with_optimizer(data_parallel(2, 2), "Adagrad"),
                      with_optimizer(sixteen(data_parallel(2, 1)), "Lamb"),
                      with_optimizer(data_parallel(2, 0), "OneBitAdam"),
                      with_optimizer(sixteen(data_parallel(4, 0)), "OneBitAdam"),
                      with_optimizer(data_parallel(2, 0), "ZeroOneAdam"),
                      with_optimizer(data_parallel(2, 0), "OneBitLamb")),
    [](const ::testing::TestParamInfo<Layout>& i) { return i.param.name; });

Layout llama(Layout l) {
  l.name = "llama_" + l.name;
  l.llama = true;
  return l;
}

// Llama at bf16 (GQA's smaller k/v, SwiGLU's width, fp32 rstd, lse, scratch and RoPE tables):
// one process, tp 2 (one kv head per rank), ZeRO-2 at dp 2, pp 2.
INSTANTIATE_TEST_SUITE_P(
    LlamaSixteenBit, PlanMultiproc,
    ::testing::Values(llama(sixteen(Layout{"single", 1, 1, 1})), llama(sixteen(Layout{"tp2", 2, 1, 1})),
                      llama(sixteen(data_parallel(2, 2))), llama(sixteen(Layout{"pp2_1f1b", 1, 2, 1}))),
    [](const ::testing::TestParamInfo<Layout>& i) { return i.param.name; });

Layout async_checkpoint(Layout l) {
  l.name = "async_checkpoint_" + l.name;
  l.async_checkpoint = true;
  return l;
}

// training.checkpoint_async: every rank's host staging buffer (tag checkpoint) is its checkpoint
// partition (params, fp32 master at 16 bits, the moments), and the checkpoints written every
// step change no other tag.
INSTANTIATE_TEST_SUITE_P(
    AsyncCheckpoint, PlanMultiproc,
    ::testing::Values(async_checkpoint(data_parallel(2, 1)), async_checkpoint(sixteen(data_parallel(2, 2))),
                      async_checkpoint(Layout{"tp2_pp2", 2, 2, 1}),
                      async_checkpoint(with_optimizer(data_parallel(2, 0), "Lion"))),
    [](const ::testing::TestParamInfo<Layout>& i) { return i.param.name; });

INSTANTIATE_TEST_SUITE_P(
    Layouts, PlanMultiproc,
    ::testing::Values(data_parallel(2, 0), data_parallel(2, 1), data_parallel(2, 2), data_parallel(2, 3),
                      data_parallel(4, 0), data_parallel(4, 1), data_parallel(4, 2), data_parallel(4, 3),
                      Layout{"tp2", 2, 1, 1},
                      Layout{"pp2_1f1b", 1, 2, 1},
                      Layout{"pp4_zero2_checkpointing", 1, 4, 1, json{{"stage", 2}, {"reduce_bucket_size", 3000}},
                             "1f1b", "uniform", true},
                      Layout{"tp2_pp2_dp2_zero2", 2, 2, 2, json{{"stage", 2}, {"reduce_bucket_size", 3000}}},
                      Layout{"tp2_pp2_gpipe_parameters", 2, 2, 1, json{{"stage", 0}}, "gpipe", "parameters"},
                      Layout{"pp2_dp2_zero1", 1, 2, 2, json{{"stage", 1}, {"allgather_bucket_size", 2000}}},
                      Layout{"pp2_dp2_zero1_checkpointing", 1, 2, 2, json{{"stage", 1}}, "1f1b", "uniform", true},
                      Layout{"tp2_dp2_zero3", 2, 1, 2,
                             json{{"stage", 3}, {"stage3_param_persistence_threshold", 100},
                                  {"stage3_prefetch_bucket_size", 10000}}}),
    [](const ::testing::TestParamInfo<Layout>& i) { return i.param.name; });

// train_micro_batch_size_per_gpu "auto" on 2 data-parallel ranks (ZeRO-2): every rank picks the
// same micro-batch, the largest the plan fits in --gpu-mem (4 here, the limit between 4's and 8's
// peak), and trains at it: each rank's measured peak per tag is the plan's at micro-batch 4.
class PlanMultiprocAuto : public PlanMultiproc {};

TEST_F(PlanMultiprocAuto, EveryRankTrainsThePlansPick) {
  const Layout l = data_parallel(2, 2);
  json c = base_config(l);
  c["train_micro_batch_size_per_gpu"] = "auto";
  c["gradient_accumulation_steps"] = "auto";
  c["train_batch_size"] = "auto";
  auto at = [&](int micro) {
    json fixed = base_config(l);
    fixed["train_micro_batch_size_per_gpu"] = micro;
    fixed["gradient_accumulation_steps"] = 1;
    return config::parse_job_config(fixed.dump(), "", l.world());
  };
  auto peak = [&](const config::JobConfig& cfg) {
    int64_t p = 0;
    for (int q = 0; q < l.world(); ++q) p = std::max(p, plan::predicted_rank_memory(cfg, q, 1).total());
    return p;
  };
  const config::JobConfig four = at(4);
  const int64_t limit = (peak(four) + peak(at(8))) / 2;
  const auto r = test::run_train_job(dir_->path(), "auto_dp2", l.world(), c,
                                     {"--metrics-all-ranks", "--gpu-mem", std::to_string(limit)}, 120s);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("\"auto\" -> 4: largest that fits: 4 (peak "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("$.train_batch_size: \"auto\" -> 8: "), std::string::npos) << r.err;
  ASSERT_FALSE(r.metrics.empty());
  const json& real = r.metrics.back();
  for (int q = 0; q < l.world(); ++q) {
    const auto want = plan::tag_bytes(plan::predicted_rank_memory(four, q, 1));
    for (const char* tag : plan::kTagNames) {
      const std::string key = std::string("peak_bytes_") + tag + "_rank" + std::to_string(q);
      ASSERT_TRUE(real.contains(key)) << key;
      EXPECT_EQ(real.at(key).get<int64_t>(), want.at(tag)) << "rank " << q << " " << tag;
    }
  }
}

}  // namespace
}  // namespace ds
