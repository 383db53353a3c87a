// Weighted blends (data/blend.h) through the real trainer and launcher: a tiny GPT-2 on a 2-source
// blend (shuffled; the small source wraps about twice in 10 steps), validated on a 2-source
// validation blend. dp 2 (G 1) follows dp 1 (G 2) within 1e-5 relative (the same windows in every
// step); a dp-2 run checkpointed at step 4 and resumed continues the uninterrupted run bit for
// bit; the same checkpoint resumed at dp 1 continues the dp-1 curve (within 1e-5); a blend's
// checkpoint resumed by a run that reads one corpus is refused by name.
#include <filesystem>
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
using test::TempDir;

constexpr int kSteps = 10, kSeq = 16, kVocab = 32;

void write_tokens(const std::string& path, size_t n, int mul, int div, int mod, unsigned seed) {
  std::vector<uint16_t> toks(n);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n; ++i) {
    toks[i] = static_cast<uint16_t>((i * mul + i / div) % mod);
    if (rng() % 16 == 0) toks[i] = static_cast<uint16_t>(rng() % kVocab);
  }
  rt::data::write_token_file(path, toks);
}

class BlendTraining : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    // B*T = 32 tokens a window: the web source holds 93 windows, the code source 3 (the 20 windows
    // of 10 steps draw about 6 from it: it wraps about twice, in a new shuffled order each time).
    write_tokens(*dir_ / "web.bin", 3000, 5, 7, 29, 1);
    write_tokens(*dir_ / "code.bin", 100, 3, 3, 31, 2);
    write_tokens(*dir_ / "web_val.bin", 800, 5, 7, 29, 3);
    write_tokens(*dir_ / "code_val.bin", 400, 3, 3, 31, 4);
    for (int dp : {1, 2}) {
      auto r = run(dp, config(dp), {});
      ASSERT_EQ(r.rc, 0) << r.err;
      ASSERT_EQ(r.metrics.size(), static_cast<size_t>(kSteps));
      (dp == 1 ? dp1_ : dp2_) = new std::vector<json>(r.metrics);
    }
  }
  static void TearDownTestSuite() {
    delete dp1_;
    delete dp2_;
    delete dir_;
  }

 protected:
  // Global batch 4 sequences of 16 tokens, micro-batch 2: G = 2 / dp.
  static json config(int dp, const std::string& ckpt_dir = "") {
    json training = {{"steps", kSteps},
                     {"seed", 5},
                     {"log_interval", 1},
                     {"eval_interval", 5},
                     {"eval_steps", 4 / dp}};
    if (!ckpt_dir.empty()) {
      training["checkpoint_dir"] = ckpt_dir;
      training["checkpoint_interval"] = 4;
    }
    return {
        {"train_batch_size", 4},
        {"train_micro_batch_size_per_gpu", 2},
        {"gradient_clipping", 1.0},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}, {"weight_decay", 0.1}}}}},
        {"model",
         {{"type", "gpt2"},
          {"n_layer", 2},
          {"n_head", 2},
          {"n_embd", 32},
          {"vocab_size", kVocab},
          {"seq_len", kSeq}}},
        {"data",
         {{"train", json::array({{{"path", "web.bin"}, {"weight", 0.7}},
                                 {{"path", "code.bin"}, {"weight", 0.3}}})},
          {"val", json::array({{{"path", "web_val.bin"}, {"weight", 1}},
                               {{"path", "code_val.bin"}, {"weight", 1}}})},
          {"shuffle", true}}},
        {"training", training},
    };
  }
  static test::TrainJobResult run(int nproc, const json& cfg,
                                  const std::vector<std::string>& extra) {
    static int counter = 0;
    return test::run_train_job(dir_->path(), "run" + std::to_string(counter++), nproc, cfg, extra,
                               240s);
  }
  static void expect_bitwise(const std::vector<json>& m, const std::vector<json>& base,
                             int first_step, const std::string& what) {
    ASSERT_EQ(m.size(), base.size() - static_cast<size_t>(first_step - 1)) << what;
    for (size_t i = 0; i < m.size(); ++i) {
      const json& want = base[static_cast<size_t>(first_step - 1) + i];
      EXPECT_EQ(m[i].at("step"), want.at("step")) << what;
      EXPECT_EQ(m[i].at("loss").get<double>(), want.at("loss").get<double>())
          << what << " step " << want.at("step");
      if (want.contains("val_loss")) {
        EXPECT_EQ(m[i].at("val_loss").get<double>(), want.at("val_loss").get<double>()) << what;
      }
    }
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::vector<json>* dp1_ = nullptr;
  static inline std::vector<json>* dp2_ = nullptr;
};

TEST_F(BlendTraining, Dp2FollowsDp1) {
  ASSERT_NE(dp2_, nullptr);
  test::expect_curve_matches(
      *dp1_, *dp2_, 1, [](const std::string& key) { return key == "grad_norm" ? 1e-4 : 1e-5; },
      "blend dp 2 (G 1) against dp 1 (G 2)");
  EXPECT_TRUE((*dp1_)[4].contains("val_loss"));
}

TEST_F(BlendTraining, ResumeIsBitExactAndAcrossDp2ToDp1) {
  ASSERT_NE(dp2_, nullptr);
  const std::string ck = *dir_ / "ckpt";
  auto first = run(2, config(2, ck), {"--max-steps", "6"});
  ASSERT_EQ(first.rc, 0) << first.err;
  const std::string step4 = ck + "/step_00000004";
  ASSERT_TRUE(std::filesystem::exists(step4 + "/manifest.json"));
  const auto data = json::parse(test::slurp(step4 + "/manifest.json")).at("data");
  EXPECT_EQ(data.at("blend"), true);
  EXPECT_EQ(data.at("micro_step"), 4);
  EXPECT_EQ(data.at("global_window"), 8);
  ASSERT_EQ(data.at("sources").size(), 2u);
  EXPECT_EQ(data["sources"][0]["windows_drawn"].get<int>() +
                data["sources"][1]["windows_drawn"].get<int>(),
            8);
  EXPECT_EQ(data["sources"][1]["num_tokens"], 100);

  // The same layout, from step 4: bit for bit the uninterrupted run.
  auto same = run(2, config(2), {"--resume-from", step4});
  ASSERT_EQ(same.rc, 0) << same.err;
  expect_bitwise(same.metrics, *dp2_, 5, "dp 2 resumed at step 5");

  // dp 2 -> dp 1 (G 1 -> 2, the same global batch): the dp-1 curve.
  auto one = run(1, config(1), {"--resume-from", step4});
  ASSERT_EQ(one.rc, 0) << one.err;
  test::expect_curve_matches(
      *dp1_, one.metrics, 5,
      [](const std::string& key) { return key == "grad_norm" ? 1e-4 : 1e-5; },
      "dp 2 checkpoint resumed at dp 1");

  // A run that reads one corpus refuses the blend's position.
  json plain = config(1);
  plain["data"] = {{"train", "web.bin"}};
  plain["training"].erase("eval_interval");
  auto refused = run(1, plain, {"--resume-from", step4});
  EXPECT_NE(refused.rc, 0);
  EXPECT_NE(
      refused.err.find(
          "the checkpoint's data position is of a weighted blend of sources, but this run reads "
          "one corpus"),
      std::string::npos)
      << refused.err;
}

}  // namespace
}  // namespace ds
