// 16-bit training measured against fp32 and against itself (issue 14), through `dstrain launch`
// with real processes and collectives:
//   - curves: the README's model (configs/gpt2-tiny-cpu.json) on the King James Bible for 200
//     steps on 2 ranks at fp32, bf16 and fp16 (loss scale 2^12, no step skipped): every step's
//     loss within 2% of fp32's, the final loss no worse than fp32's by more than 2%;
//   - memory: on that run the params, grads and activations peaks at bf16 are at most 0.52x their
//     fp32 peaks (2-byte storage; the plan's exactness is tests/multiproc/plan's);
//   - ZeRO: stages 0-3 at dp 4 in bf16 follow the single-process bf16 curve within what the
//     reduction order allows (one bf16 rounding flip, 2^-8 relative, can move a loss by ~1e-3);
//   - resume: a bf16 run checkpointed at step 10 and resumed ends bit for bit where the
//     uninterrupted run ends (losses and every checkpoint byte).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/token_file.h"
#include "multiproc/launch/job_process.h"
#include "multiproc/train/train_job.h"

namespace ds {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using nlohmann::json;
using test::TempDir;

json load_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

std::string kjv(const char* file) { return std::string(DS_SOURCE_DIR) + "/data/kjv/" + file; }

// ---- Curves and memory on the README's model and real text -------------------------------

class PrecisionCurves : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(kjv("train.bin")) || !fs::exists(kjv("val.bin"))) {
      GTEST_FAIL() << "data/kjv/{train,val}.bin are missing: run scripts/prepare-kjv.sh (scripts/test.sh does)";
    }
    dir_ = new TempDir();
    runs_ = new std::map<std::string, test::TrainJobResult>();
    for (const char* p : {"fp32", "bf16", "fp16"}) {
      json cfg = load_json(std::string(DS_SOURCE_DIR) + "/configs/gpt2-tiny-cpu.json");
      cfg["data"] = {{"train", kjv("train.bin")}, {"val", kjv("val.bin")}};
      cfg["training"]["log_interval"] = 10;
      if (std::string(p) == "bf16") cfg[p] = {{"enabled", true}};
      // fp16 from a loss scale of 2^12: at DeepSpeed's default 2^16, steps 18-20 overflow and
      // are skipped (as DeepSpeed skips them), which delays the curve by three steps (11% above
      // fp32 at step 21, within 2% again from step 45; final 2.2559 vs 2.2545). Overflow
      // handling has its own test (TrainMultiproc.SixteenBitPrecision...).
      if (std::string(p) == "fp16") cfg[p] = {{"enabled", true}, {"initial_scale_power", 12}};
      (*runs_)[p] = test::run_train_job(dir_->path(), p, 2, cfg, {}, 900s);
    }
  }
  static void TearDownTestSuite() {
    delete runs_;
    delete dir_;
  }
  static const test::TrainJobResult& run(const std::string& p) { return runs_->at(p); }

  static inline TempDir* dir_ = nullptr;
  static inline std::map<std::string, test::TrainJobResult>* runs_ = nullptr;
};

TEST_F(PrecisionCurves, SixteenBitLossCurvesStayWithinTwoPercentOfFp32) {
  const auto& ref = run("fp32");
  ASSERT_EQ(ref.rc, 0) << ref.err;
  ASSERT_EQ(ref.metrics.size(), 200u);  // every step
  for (const char* p : {"bf16", "fp16"}) {
    const auto& r = run(p);
    ASSERT_EQ(r.rc, 0) << p << "\n" << r.err;
    ASSERT_EQ(r.metrics.size(), ref.metrics.size()) << p;
    double worst = 0;
    for (size_t i = 0; i < r.metrics.size(); ++i) {
      const double want = ref.metrics[i].at("loss").get<double>();
      const double got = r.metrics[i].at("loss").get<double>();
      worst = std::max(worst, std::abs(got - want) / want);
      EXPECT_LE(std::abs(got - want), 0.02 * want) << p << " step " << r.metrics[i].at("step");
    }
    const double final_ref = ref.metrics.back().at("loss").get<double>();
    const double final_16 = r.metrics.back().at("loss").get<double>();
    EXPECT_LE(final_16, final_ref * 1.02) << p << ": the final loss is worse than fp32's by more than 2%";
    for (const auto& m : r.metrics) EXPECT_FALSE(m.at("skipped").get<bool>()) << p << " step " << m.at("step");
    // The loss fell: the run trained.
    EXPECT_LT(final_16, 0.6 * r.metrics.front().at("loss").get<double>()) << p;
    std::cout << p << ": final loss " << final_16 << " (fp32 " << final_ref << "), worst gap " << 100 * worst
              << "%\n";
  }
}

TEST_F(PrecisionCurves, Bf16StoresParamsGradsAndActivationsInAtMostHalfTheBytes) {
  const auto& f = run("fp32");
  const auto& b = run("bf16");
  ASSERT_EQ(f.rc, 0) << f.err;
  ASSERT_EQ(b.rc, 0) << b.err;
  ASSERT_FALSE(f.metrics.empty());
  ASSERT_FALSE(b.metrics.empty());
  for (const char* tag : {"params", "grads", "activations"}) {
    const std::string key = std::string("peak_bytes_") + tag;
    const double fp32 = f.metrics.back().at(key).get<double>();
    const double bf16 = b.metrics.back().at(key).get<double>();
    EXPECT_GT(bf16, 0) << tag;
    EXPECT_LE(bf16, 0.52 * fp32) << tag << ": bf16 " << bf16 << " B vs fp32 " << fp32 << " B";
    std::cout << tag << ": bf16/fp32 = " << bf16 / fp32 << "\n";
  }
  // fp32's optimizer holds m and v; bf16's adds the fp32 master: 12 bytes per element, not 8.
  const double opt32 = f.metrics.back().at("peak_bytes_optimizer").get<double>();
  const double opt16 = b.metrics.back().at("peak_bytes_optimizer").get<double>();
  EXPECT_NEAR(opt16 / opt32, 1.5, 0.01);
}

// ---- ZeRO at dp 4 and resume, on a small model and synthetic tokens -----------------------

constexpr int kSteps = 20;

class PrecisionLayouts : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::vector<uint16_t> toks(30000);
    std::mt19937 rng(5);
    for (size_t i = 0; i < toks.size(); ++i) {
      toks[i] = static_cast<uint16_t>((i * 5 + i / 7) % 29);
      if (rng() % 20 == 0) toks[i] = static_cast<uint16_t>(rng() % 32);
    }
    rt::data::write_token_file(*dir_ / "train.bin", toks);
  }
  static void TearDownTestSuite() { delete dir_; }

  // Global batch 8 sequences of 16 tokens, micro-batch 1: G = 8 / dp.
  static json config(int stage, const std::string& ckpt_dir = "") {
    json training = {{"steps", kSteps}, {"seed", 11}, {"log_interval", 1}};
    if (!ckpt_dir.empty()) {
      training["checkpoint_dir"] = ckpt_dir;
      training["checkpoint_interval"] = 10;
    }
    return {
        {"train_batch_size", 8},
        {"train_micro_batch_size_per_gpu", 1},
        {"gradient_clipping", 1.0},
        {"bf16", {{"enabled", true}}},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}, {"weight_decay", 0.1}}}}},
        {"zero_optimization",
         {{"stage", stage},
          {"overlap_comm", true},
          {"reduce_bucket_size", 20000},
          {"allgather_bucket_size", 10000},
          {"stage3_prefetch_bucket_size", 13000},
          {"stage3_param_persistence_threshold", 100},
          {"stage3_max_live_parameters", 26000}}},
        {"model",
         {{"type", "gpt2"}, {"n_layer", 4}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 32}, {"seq_len", 16}}},
        {"data", {{"train", *dir_ / "train.bin"}}},
        {"training", training},
    };
  }
  static test::TrainJobResult run(int nproc, const json& cfg, const std::vector<std::string>& extra = {}) {
    static int counter = 0;
    return test::run_train_job(dir_->path(), "run" + std::to_string(counter++), nproc, cfg, extra, 180s);
  }
  static inline TempDir* dir_ = nullptr;
};

TEST_F(PrecisionLayouts, EveryZeroStageAtDp4FollowsTheSingleProcessBf16Curve) {
  const auto one = run(1, config(0));
  ASSERT_EQ(one.rc, 0) << one.err;
  ASSERT_EQ(one.metrics.size(), static_cast<size_t>(kSteps));
  for (int stage = 0; stage <= 3; ++stage) {
    const auto r = run(4, config(stage));
    ASSERT_EQ(r.rc, 0) << "stage " << stage << "\n" << r.err;
    ASSERT_EQ(r.metrics.size(), one.metrics.size()) << "stage " << stage;
    for (size_t i = 0; i < r.metrics.size(); ++i) {
      const double want = one.metrics[i].at("loss").get<double>();
      const double got = r.metrics[i].at("loss").get<double>();
      EXPECT_LE(std::abs(got - want), 2e-3 * want) << "ZeRO " << stage << " dp 4, step " << i + 1 << ": " << got
                                                    << " vs single process " << want;
    }
  }
}

std::map<std::string, std::string> checkpoint_bytes(const std::string& step_dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(step_dir)) {
    if (e.path().extension() != ".bin") continue;
    std::ifstream in(e.path(), std::ios::binary);
    out[e.path().filename().string()] = std::string(std::istreambuf_iterator<char>(in), {});
  }
  return out;
}

TEST_F(PrecisionLayouts, Bf16ResumeIsBitExact) {
  const std::string full_dir = *dir_ / "ckpt_full", part_dir = *dir_ / "ckpt_part";
  const auto full = run(2, config(2, full_dir));
  ASSERT_EQ(full.rc, 0) << full.err;
  const auto first = run(2, config(2, part_dir), {"--max-steps", "10"});
  ASSERT_EQ(first.rc, 0) << first.err;
  const auto second = run(2, config(2, part_dir), {"--resume"});
  ASSERT_EQ(second.rc, 0) << second.err;
  ASSERT_EQ(second.metrics.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(second.metrics[i].at("step"), 11 + static_cast<int>(i));
    EXPECT_EQ(second.metrics[i].at("loss").get<double>(), full.metrics[10 + i].at("loss").get<double>())
        << "step " << 11 + i;
  }
  // The step-20 checkpoints (fp32 master, m, v and the bf16 parameters of both ranks) are equal
  // byte for byte.
  const auto a = checkpoint_bytes(full_dir + "/step_00000020");
  const auto b = checkpoint_bytes(part_dir + "/step_00000020");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), a.size());
  for (const auto& [name, bytes] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(bytes == b.at(name)) << name << " differs after the resume";
  }
}

}  // namespace
}  // namespace ds
