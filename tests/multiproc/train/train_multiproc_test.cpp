// Data-parallel training with ZeRO stages 0-3 through `dstrain launch` (real processes, the real
// store and collectives, OMP_NUM_THREADS=1 per rank): 20 steps of losses equal the single-process
// run on the same global batch within 1e-5 relative at dp 2 and 4; per-rank peak bytes per tag
// shrink as each stage promises (from rank 0's --metrics-all-ranks fields); resume at dp 2
// continues the curve bit for bit; a dp-2 checkpoint resumed at dp 4 (another stage) continues it;
// a SIGKILLed rank fails the job: the survivors' errors and the launcher's report name it, and
// nothing hangs or stays behind.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/token_file.h"
#include "model_spec/shape.h"
#include "multiproc/launch/job_process.h"
#include "multiproc/train/train_job.h"
#include "layout/partition.h"

namespace ds {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using test::TempDir;

constexpr int kSteps = 20;
constexpr int kLayers = 8, kEmbd = 32, kVocab = 32, kSeq = 16;

void write_tokens(const std::string& path, size_t n) {
  std::vector<uint16_t> toks(n);
  std::mt19937 rng(3);
  for (size_t i = 0; i < n; ++i) {
    toks[i] = static_cast<uint16_t>((i * 5 + i / 7) % 29);
    if (rng() % 20 == 0) toks[i] = static_cast<uint16_t>(rng() % kVocab);
  }
  rt::data::write_token_file(path, toks);
}

class TrainMultiproc : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    write_tokens(*dir_ / "train.bin", 30000);
    // The single-process reference: the same global batch of 8 sequences as 8 micro-batches.
    auto r = run(1, config(0), {});
    ASSERT_EQ(r.rc, 0) << r.err;
    baseline_ = new std::vector<double>(losses(r.metrics));
    ASSERT_EQ(baseline_->size(), static_cast<size_t>(kSteps));
  }
  static void TearDownTestSuite() {
    delete baseline_;
    delete dir_;
  }

  // Global batch 8 sequences of 16 tokens, micro-batch 1: G = 8 / dp.
  static json config(int stage, const std::string& ckpt_dir = "") {
    json training = {{"steps", kSteps}, {"seed", 11}, {"log_interval", 5}};
    if (!ckpt_dir.empty()) {
      training["checkpoint_dir"] = ckpt_dir;
      training["checkpoint_interval"] = 10;
    }
    return {
        {"train_batch_size", 8},
        {"train_micro_batch_size_per_gpu", 1},
        {"gradient_clipping", 1.0},
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
         {{"type", "gpt2"}, {"n_layer", kLayers}, {"n_head", 2}, {"n_embd", kEmbd}, {"vocab_size", kVocab},
          {"seq_len", kSeq}}},
        {"data", {{"train", *dir_ / "train.bin"}}},
        {"training", training},
    };
  }

  using Result = test::TrainJobResult;

  static Result run(int nproc, const json& cfg, std::vector<std::string> extra,
                    std::chrono::seconds timeout = 120s) {
    static int counter = 0;
    return test::run_train_job(dir_->path(), "run" + std::to_string(counter++), nproc, cfg, extra, timeout);
  }

  static std::vector<double> losses(const std::vector<json>& m) {
    std::vector<double> out;
    for (const auto& j : m) out.push_back(j.at("loss").get<double>());
    return out;
  }

  static void expect_curve(const std::vector<json>& m, int first_step, const std::string& what) {
    ASSERT_EQ(m.size(), static_cast<size_t>(kSteps - first_step + 1)) << what;
    for (size_t i = 0; i < m.size(); ++i) {
      const int step = first_step + static_cast<int>(i);
      EXPECT_EQ(m[i].at("step").get<int>(), step);
      double want = (*baseline_)[static_cast<size_t>(step - 1)];
      double got = m[i].at("loss").get<double>();
      EXPECT_LE(std::abs(got - want), 1e-5 * std::abs(want))
          << what << " step " << step << ": " << got << " vs single process " << want;
    }
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::vector<double>* baseline_ = nullptr;
};

// Per-rank peaks (bytes) from rank 0's last metrics line.
std::map<std::string, int64_t> peaks(const json& last, int rank) {
  std::map<std::string, int64_t> out;
  for (const char* tag : {"params", "grads", "optimizer", "comm", "total"}) {
    out[tag] = last.at(std::string("peak_bytes_") + tag + "_rank" + std::to_string(rank)).get<int64_t>();
  }
  return out;
}

TEST_F(TrainMultiproc, EveryStageMatchesTheSingleProcessCurveAndShrinksMemoryAsPromised) {
  model_spec::ModelShape shape;
  shape.n_layer = kLayers;
  shape.n_head = 2;
  shape.n_embd = kEmbd;
  shape.vocab_size = kVocab;
  shape.padded_vocab_size = 128;  // the config's default padding (multiple of 128)
  shape.seq_len = kSeq;
  auto layout = model_spec::param_layout(shape, model_spec::ModelPart::whole(shape));
  const int64_t P = layout.total, F = 4;  // fp32
  const int64_t wte = layout.units.front().numel, layer = layout.layer_numel;

  for (int dp : {2, 4}) {
    std::map<int, std::vector<std::map<std::string, int64_t>>> by_stage;
    for (int stage = 0; stage <= 3; ++stage) {
      std::string what = "dp " + std::to_string(dp) + " stage " + std::to_string(stage);
      auto r = run(dp, config(stage), {"--metrics-all-ranks"});
      ASSERT_EQ(r.rc, 0) << what << "\n" << r.err;
      expect_curve(r.metrics, 1, what);
      layout::Partition part(P, dp);
      for (int q = 0; q < dp; ++q) {
        auto pk = peaks(r.metrics.back(), q);
        by_stage[stage].push_back(pk);
        const int64_t mine = part.count(q);
        SCOPED_TRACE(what + " rank " + std::to_string(q));
        // Optimizer states (exp_avg, exp_avg_sq): all P at stage 0, the partition from stage 1.
        EXPECT_EQ(pk["optimizer"], 2 * F * (stage == 0 ? P : mine));
        // Gradients: all P at stages 0/1; from stage 2 the partition plus the two bucket
        // buffers (overlap_comm; 20000 elements, at least one layer) and the token embedding's.
        const int64_t cap = std::max<int64_t>(layer, 20000);
        EXPECT_EQ(pk["grads"], stage < 2 ? F * P : F * (mine + 2 * cap + wte));
        // Parameters: all P below stage 3; at 3 the partition, the resident final LayerNorm
        // (<= 100 elements) and the gathered units (at most 26000 live, plus the one asked for).
        if (stage < 3) {
          EXPECT_EQ(pk["params"], F * P);
        } else {
          EXPECT_GE(pk["params"], F * (mine + 2 * kEmbd + layer));
          EXPECT_LE(pk["params"], F * (mine + 2 * kEmbd + 26000 + std::max(layer, wte)));
        }
      }
    }
    for (int q = 0; q < dp; ++q) {
      EXPECT_LE(by_stage[1][q]["optimizer"] * dp, by_stage[0][q]["optimizer"] + 2 * F * layout::kAlignElements * dp)
          << "rank " << q;
      EXPECT_LT(by_stage[2][q]["grads"], by_stage[1][q]["grads"]) << "rank " << q;
      EXPECT_LT(by_stage[3][q]["params"], by_stage[2][q]["params"]) << "rank " << q;
      EXPECT_LT(by_stage[3][q]["total"], by_stage[0][q]["total"]) << "rank " << q;
    }
  }
}

TEST_F(TrainMultiproc, ResumeAtTheSameSizeContinuesTheCurveBitForBit) {
  std::string ck = *dir_ / "ckpt_resume";
  auto full = run(2, config(2, *dir_ / "ckpt_full"), {});
  ASSERT_EQ(full.rc, 0) << full.err;
  auto first = run(2, config(2, ck), {"--max-steps", "10"});
  ASSERT_EQ(first.rc, 0) << first.err;
  ASSERT_EQ(first.metrics.size(), 10u);
  ASSERT_TRUE(std::filesystem::exists(ck + "/step_00000010/rank_00001.bin"));
  auto manifest = json::parse(test::slurp(ck + "/step_00000010/manifest.json"));
  EXPECT_EQ(manifest["layout"]["data_parallel_size"], 2);
  EXPECT_EQ(manifest["layout"]["zero_stage"], 2);
  EXPECT_EQ(manifest["layout"]["partitions"].size(), 2u);
  auto second = run(2, config(2, ck), {"--resume"});
  ASSERT_EQ(second.rc, 0) << second.err;
  ASSERT_EQ(second.metrics.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(second.metrics[i]["step"], 11 + static_cast<int>(i));
    EXPECT_EQ(second.metrics[i]["loss"].get<double>(), full.metrics[10 + i]["loss"].get<double>())
        << "step " << 11 + i;
  }
  expect_curve(second.metrics, 11, "resumed dp 2");
}

TEST_F(TrainMultiproc, ACheckpointFromDp2ResumesAtDp4) {
  std::string ck = *dir_ / "ckpt_repartition";
  auto first = run(2, config(1, ck), {"--max-steps", "10"});
  ASSERT_EQ(first.rc, 0) << first.err;
  auto second = run(4, config(3, ck), {"--resume"});
  ASSERT_EQ(second.rc, 0) << second.err;
  EXPECT_NE((second.out + second.err).find("re-partitioning checkpoint"), std::string::npos) << second.out;
  expect_curve(second.metrics, 11, "dp 2 stage 1 -> dp 4 stage 3");
}

// 16-bit training with data parallelism: bf16 at stage 3 follows the single-process bf16 curve
// (within bf16's resolution); an fp16 overflow (a real inf in the fp16 gradient buffer) on rank 0's
// partition alone skips the step on every rank (otherwise the ranks'
// weights would part and the curve would leave the single-process one).
TEST_F(TrainMultiproc, SixteenBitPrecisionAndAnOverflowOnOneRankSkipEverywhere) {
  auto bf = config(3);
  bf["bf16"] = {{"enabled", true}};
  auto one = run(1, bf, {});
  auto two = run(2, bf, {});
  ASSERT_EQ(one.rc, 0) << one.err;
  ASSERT_EQ(two.rc, 0) << two.err;
  ASSERT_EQ(two.metrics.size(), one.metrics.size());
  for (size_t i = 0; i < one.metrics.size(); ++i) {
    double want = one.metrics[i]["loss"].get<double>();
    // bf16 parameters: a last-bit difference of the fp32 sums (another summation order) can flip
    // a bf16 rounding (2^-8 relative), so the curves agree to 1e-3 here, not 1e-5.
    EXPECT_LE(std::abs(two.metrics[i]["loss"].get<double>() - want), 1e-3 * want) << "bf16 step " << i + 1;
  }
  auto fp = config(2);
  fp["fp16"] = {{"enabled", true}, {"initial_scale_power", 8}};
  auto f1 = run(1, fp, {"--test-inject-inf-at-step", "3"});
  auto f2 = run(2, fp, {"--test-inject-inf-at-step", "3"});
  ASSERT_EQ(f1.rc, 0) << f1.err;
  ASSERT_EQ(f2.rc, 0) << f2.err;
  ASSERT_EQ(f2.metrics.size(), static_cast<size_t>(kSteps));
  EXPECT_TRUE(f2.metrics[2]["skipped"].get<bool>());
  EXPECT_FALSE(f2.metrics[3]["skipped"].get<bool>());
  for (size_t i = 0; i < f1.metrics.size(); ++i) {
    double want = f1.metrics[i]["loss"].get<double>();
    EXPECT_EQ(f2.metrics[i]["skipped"], f1.metrics[i]["skipped"]) << "fp16 step " << i + 1;
    EXPECT_EQ(f2.metrics[i]["loss_scale"], f1.metrics[i]["loss_scale"]) << "fp16 step " << i + 1;
    // fp16 gradients: dp 2 sums the two ranks' fp16 gradients in fp32 and rounds once, the single
    // process adds each micro-batch into its fp16 buffer; roundings differ (2^-11 relative).
    EXPECT_LE(std::abs(f2.metrics[i]["loss"].get<double>() - want), 1e-3 * want) << "fp16 step " << i + 1;
  }
}

TEST_F(TrainMultiproc, AKilledRankFailsTheJobNamingIt) {
  // 4 ranks, rank 2 SIGKILLs itself in step 3: the survivors' next collective fails naming it,
  // they exit on their own within the launcher's failure grace, and the launcher reports rank 2.
  auto r = run(4, config(2), {"--test-kill-rank", "2", "--test-kill-at-step", "3"}, 90s);
  ASSERT_NE(r.rc, -1) << "the job hung\n" << r.err;
  EXPECT_EQ(r.rc, 128 + SIGKILL) << "the exit status is the first failure's (rank 2's)\n" << r.err;
  std::string all = r.out + r.err;
  EXPECT_NE(all.find("rank 2 on localhost was killed by signal 9 (SIGKILL)"), std::string::npos) << all;
  // A survivor's own error names the dead peer, e.g.
  // [rank 0] dstrain: error: ... all_reduce on group 'world' (rank 0 of 4): rank 2 (host) died ...
  std::regex survivor(R"(\[rank [013]\] [^\n]*rank 2 [^\n]*died)");
  EXPECT_TRUE(std::regex_search(all, survivor)) << all;
  // Nothing of this job is left running: no live process has the suite's directory (where every
  // config path is) on its command line.
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = test::slurp(e.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(dir_->path()) != std::string::npos && test::pid_alive(std::stoi(name))) {
      left.push_back(name + ": " + cmdline);
    }
  }
  std::string listing;
  for (const auto& l : left) listing += l + "\n";
  EXPECT_TRUE(left.empty()) << "still running after the job ended:\n" << listing;
}

}  // namespace
}  // namespace ds
