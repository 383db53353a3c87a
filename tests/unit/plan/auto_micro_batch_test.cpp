// train_micro_batch_size_per_gpu "auto" (lib/plan/auto_micro_batch.h): the pick is the plan's.
// Each candidate's peak is held to the plan computed independently (the same config with the
// micro-batch given as a number, and `dstrain plan --json` at that micro-batch); without a
// calibration the pick is the largest that fits, with one the least predicted time; none fitting
// is an error naming the key. Then through the real binary: `config check` says what every "auto"
// became, fails naming each "auto" that needs --set, and `dstrain train` prints the pick and its
// reason and writes the number into its checkpoint's config; `plan --measure` and `plan
// --calibrate` forward --set and --strict.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/strings.h"
#include "config/job_config.h"
#include "plan/auto_micro_batch.h"
#include "plan/calibration.h"
#include "plan/from_config.h"
#include "plan/memory_model.h"
#include "support/run_command.h"

namespace ds::plan {
namespace {

using test::dstrain;
using test::run_command;
using test::source_path;

// The smallest GPT-2 config the repository ships (4 layers, C 128, T 128, V 256, CPU).
const std::string kTiny = "configs/gpt2-tiny-cpu.json";

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

config::JobConfig tiny(int world, std::vector<std::string> sets) {
  config::ParseOptions o;
  o.sets = std::move(sets);
  return config::load_job_config(source_path(kTiny), world, o);
}

// The plan's peak of the tiny config with the micro-batch given as a number: the route that
// knows nothing of "auto".
int64_t plan_peak(int world, std::vector<std::string> sets, int64_t micro) {
  sets.push_back("train_micro_batch_size_per_gpu=" + std::to_string(micro));
  PlanInput in = plan_input_from_config(tiny(world, sets));
  in.layout.num_threads = 1;
  return plan_memory(in.shape, in.layout).peak_total();
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/ds_auto_mb_XXXXXX";
    path_ = mkdtemp(tmpl) ? tmpl : "";
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = path_ + "/" + name;
    std::ofstream(p) << text;
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(AutoMicroBatch, LargestThatFitsIsThePlans) {
  // No train_batch_size: the candidates are the powers of two; accumulation stays 1.
  const std::vector<std::string> sets = {"train_micro_batch_size_per_gpu=auto"};
  config::JobConfig c = tiny(1, sets);
  ASSERT_TRUE(c.auto_micro_batch.pending);
  EXPECT_EQ(c.to_json()["train_micro_batch_size_per_gpu"], "auto");
  const int64_t p4 = plan_peak(1, {}, 4), p8 = plan_peak(1, {}, 8);
  ASSERT_LT(p4, p8);
  AutoMicroBatchRequest r;
  r.memory_bytes = (p4 + p8) / 2;
  r.memory_source = "test";
  const AutoMicroBatchPick pick = pick_micro_batch(c, r);
  EXPECT_EQ(pick.micro_batch, 4) << pick.reason;
  ASSERT_EQ(pick.trials.size(), 11u);  // 1, 2, 4, ..., 1024
  for (const auto& t : pick.trials) {
    if (t.micro_batch > 64) break;
    const int64_t want = plan_peak(1, {}, t.micro_batch);
    EXPECT_EQ(t.peak_bytes, want) << "micro-batch " << t.micro_batch;
    EXPECT_EQ(t.fits, want <= r.memory_bytes) << "micro-batch " << t.micro_batch;
    EXPECT_EQ(t.accumulation, 1);
  }
  EXPECT_TRUE(contains(pick.reason, "largest that fits: 4 (peak ")) << pick.reason;
  EXPECT_TRUE(contains(pick.reason, "; 8 needs ")) << pick.reason;

  // resolve_auto_micro_batch fills the config in, with the note; the resolved JSON holds numbers.
  resolve_auto_micro_batch(c, r);
  EXPECT_FALSE(c.auto_micro_batch.pending);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.train_batch_size, 4);
  EXPECT_EQ(c.to_json()["train_micro_batch_size_per_gpu"], 4);
  ASSERT_FALSE(c.warnings.empty());
  EXPECT_TRUE(contains(c.warnings.back(), "$.train_micro_batch_size_per_gpu (from --set "
                                          "train_micro_batch_size_per_gpu=auto): \"auto\" -> 4: largest that fits"))
      << c.warnings.back();

  // `dstrain plan --json` at 4 and 8 reports the same peaks.
  for (int64_t m : {4, 8}) {
    auto out = run_command(dstrain() + " plan --config " + source_path(kTiny) + " --world-size 1 --threads 1 " +
                           "--set train_micro_batch_size_per_gpu=" + std::to_string(m) + " --json");
    ASSERT_EQ(out.exit_code, 0) << out.err;
    EXPECT_EQ(nlohmann::json::parse(out.out)["peak"]["total"].get<int64_t>(), m == 4 ? p4 : p8);
  }
  // `dstrain plan` on the "auto" config plans the pick, and says so.
  auto out = run_command(dstrain() + " plan --config " + source_path(kTiny) +
                         " --world-size 1 --threads 1 --set train_micro_batch_size_per_gpu=auto --gpu-mem " +
                         std::to_string(r.memory_bytes) + " --json");
  ASSERT_EQ(out.exit_code, 0) << out.err;
  EXPECT_EQ(nlohmann::json::parse(out.out)["layout"]["micro_batch"], 4) << out.out;
  EXPECT_TRUE(contains(out.err, "\"auto\" -> 4: largest that fits: 4")) << out.err;
}

TEST(AutoMicroBatch, FixedTrainBatchSizeGivesTheDivisorsAndDerivesAccumulation) {
  // 2 ranks, train_batch_size 24: a rank's share is 12, so 1, 2, 3, 4, 6, 12.
  const std::vector<std::string> sets = {"train_micro_batch_size_per_gpu=auto", "train_batch_size=24",
                                         "gradient_accumulation_steps=auto"};
  config::JobConfig c = tiny(2, sets);
  ASSERT_TRUE(c.auto_micro_batch.pending);
  EXPECT_EQ(config::auto_micro_batch_candidates(c), (std::vector<int64_t>{1, 2, 3, 4, 6, 12}));
  EXPECT_EQ(c.to_json()["train_batch_size"], 24);
  EXPECT_EQ(c.to_json()["gradient_accumulation_steps"], "auto");
  const std::vector<std::string> fixed = {"train_batch_size=24", "gradient_accumulation_steps=null"};
  auto peak_at = [&](int64_t m) {
    std::vector<std::string> s = fixed;
    s.back() = "gradient_accumulation_steps=" + std::to_string(12 / m);
    return plan_peak(2, s, m);
  };
  AutoMicroBatchRequest r;
  r.memory_bytes = (peak_at(6) + peak_at(12)) / 2;
  r.memory_source = "test";
  const AutoMicroBatchPick pick = resolve_auto_micro_batch(c, r);
  EXPECT_EQ(pick.micro_batch, 6) << pick.reason;
  for (const auto& t : pick.trials) EXPECT_EQ(t.peak_bytes, peak_at(t.micro_batch)) << t.micro_batch;
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.train_batch_size, 24);
  EXPECT_TRUE(contains(c.warnings.back(), "$.gradient_accumulation_steps (from --set gradient_accumulation_steps=auto): "
                                          "\"auto\" -> 2: train_batch_size / (train_micro_batch_size_per_gpu x "
                                          "data-parallel size) = 24 / (6 x 2)"))
      << c.warnings.back();
}

// A calibration of the tiny model whose micro-batch 4 is far cheaper per sequence than 1 and 8.
Calibration odd_calibration(const model_spec::ModelShape& shape) {
  Calibration cal;
  cal.source = "odd.json";
  cal.measured = true;
  cal.cpu = true;
  cal.cores = 0;
  cal.ranks_per_node = 1;
  cal.shape = shape;
  for (auto [b, layer] : std::vector<std::pair<int, double>>{{1, 0.010}, {4, 0.012}, {8, 0.080}}) {
    ComputeSample s;
    s.micro_batch = b;
    s.layer_fwd = layer;
    s.layer_bwd = 2 * layer;
    s.head = layer / 4;
    cal.compute.push_back(s);
  }
  cal.optimizer_rate = 1e9;
  cal.cpu_adam_rate = 1e9;
  return cal;
}

TEST(AutoMicroBatch, CalibratedPickIsTheLeastPredictedTime) {
  const std::vector<std::string> sets = {"train_micro_batch_size_per_gpu=auto", "train_batch_size=16",
                                         "gradient_accumulation_steps=auto"};
  config::JobConfig c = tiny(1, sets);
  const Calibration cal = odd_calibration(c.model.shape);
  AutoMicroBatchRequest r;
  r.memory_bytes = int64_t{64} << 30;  // all fit
  r.memory_source = "test";
  r.calibration = &cal;
  const AutoMicroBatchPick pick = pick_micro_batch(c, r);
  // The least step time, computed here from the plan's inputs at each micro-batch.
  int64_t best = 0;
  double best_s = 0;
  for (int64_t m : {1, 2, 4, 8, 16}) {
    PlanInput in = plan_input_from_config(tiny(1, {"train_batch_size=16", "train_micro_batch_size_per_gpu=" +
                                                                            std::to_string(m),
                                                   "gradient_accumulation_steps=" + std::to_string(16 / m)}));
    const double s = step_time(in.shape, in.layout, cal, comm_types(in.layout.precision, in.grad_precision)).total();
    if (best == 0 || s < best_s) {
      best = m;
      best_s = s;
    }
    bool seen = false;
    for (const auto& t : pick.trials) {
      if (t.micro_batch != m) continue;
      seen = true;
      EXPECT_NEAR(t.step_s, s, 1e-12) << m;
    }
    EXPECT_TRUE(seen) << m;
  }
  EXPECT_EQ(best, 4);  // the calibration makes 4 the fastest, though 16 fits
  EXPECT_EQ(pick.micro_batch, best) << pick.reason;
  EXPECT_TRUE(contains(pick.reason, "fastest by the calibrated model (odd.json): 4 at ")) << pick.reason;

  // Memory still rules: under 4's peak, the fastest of those that fit.
  r.memory_bytes = plan_peak(1, {"train_batch_size=16", "gradient_accumulation_steps=4"}, 4) - 1;
  EXPECT_LT(pick_micro_batch(c, r).micro_batch, 4);
}

TEST(AutoMicroBatch, NothingFitsNamesTheKeyAndTheSmallestPeak) {
  config::JobConfig c = tiny(1, {"train_micro_batch_size_per_gpu=auto"});
  AutoMicroBatchRequest r;
  r.memory_bytes = 1 << 20;
  r.memory_source = "--gpu-mem";
  try {
    pick_micro_batch(c, r);
    FAIL() << "a pick under 1 MiB";
  } catch (const config::ConfigError& e) {
    const std::string m = e.what();
    EXPECT_TRUE(contains(m, "$.train_micro_batch_size_per_gpu")) << m;
    EXPECT_TRUE(contains(m, "no micro-batch fits: the smallest, 1, needs " +
                                ds::format_bytes(static_cast<double>(plan_peak(1, {}, 1))) +
                                " per rank, over the 1.00 MiB the plan sees (--gpu-mem)"))
        << m;
  }
}

TEST(AutoMicroBatch, DerivedWhenTheOtherTwoAreNumbers) {
  config::JobConfig c = tiny(2, {"train_micro_batch_size_per_gpu=auto", "train_batch_size=16",
                                 "gradient_accumulation_steps=2"});
  EXPECT_FALSE(c.auto_micro_batch.pending);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_TRUE(contains(c.warnings.back(), "\"auto\" -> 4: train_batch_size / (gradient_accumulation_steps x "
                                          "data-parallel size) = 16 / (2 x 2)"))
      << c.warnings.back();
}

// ---- through the binary ------------------------------------------------------------------------

// Every "auto" a Hugging Face DeepSpeed config writes, and no --set: the batch keys are the plan's
// and derived, gradient_clipping 1.0; each of the others is named with its --set.
TEST(AutoMicroBatchCli, EveryAutoWithoutSetNamesEachKeyThatNeedsOne) {
  TempDir d;
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(test::read_file(source_path(kTiny)));
  j["train_batch_size"] = "auto";
  j["train_micro_batch_size_per_gpu"] = "auto";
  j["gradient_accumulation_steps"] = "auto";
  j["gradient_clipping"] = "auto";
  j["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", "auto"}, {"betas", "auto"}, {"eps", "auto"},
                                                   {"weight_decay", "auto"}}}};
  j["scheduler"] = {{"type", "WarmupDecayLR"},
                    {"params", {{"warmup_min_lr", "auto"}, {"warmup_max_lr", "auto"}, {"warmup_num_steps", "auto"},
                                {"total_num_steps", "auto"}}}};
  j["data"]["train"] = source_path("data/kjv/train.bin");
  j["data"]["val"] = source_path("data/kjv/val.bin");
  const std::string path = d.write("hf.json", j.dump(2));
  auto r = run_command(dstrain() + " config check " + path + " --gpu-mem 64MiB");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  const std::vector<std::string> need = {"optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps",
                                         "optimizer.params.weight_decay", "scheduler.params.warmup_min_lr",
                                         "scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps",
                                         "scheduler.params.total_num_steps"};
  for (const auto& key : need) {
    EXPECT_TRUE(contains(r.err, ": $." + key + ": \"auto\" needs a value: pass --set " + key + "=VALUE\n"))
        << key << "\n" << r.err;
  }
  for (const std::string key : {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                                "gradient_clipping"}) {
    EXPECT_FALSE(contains(r.err, "--set " + key)) << key << "\n" << r.err;
  }
  EXPECT_TRUE(contains(r.err, "dstrain: 8 errors in " + path)) << r.err;

  // With the --sets, it validates, and each "auto" says what it became.
  std::string sets;
  for (const auto& key : need) {
    sets += " --set " + key + "=" +
            (key == "optimizer.params.betas" ? "[0.9,0.95]" : key == "scheduler.params.warmup_num_steps" ? "10"
                                                          : key == "scheduler.params.total_num_steps" ? "100"
                                                                                                     : "0.001");
  }
  r = run_command(dstrain() + " config check " + path + " --gpu-mem 64MiB" + sets);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = nlohmann::json::parse(r.out);
  const int64_t micro = out["train_micro_batch_size_per_gpu"].get<int64_t>();
  EXPECT_GE(micro, 1);
  EXPECT_EQ(out["train_batch_size"], micro);
  EXPECT_EQ(out["gradient_accumulation_steps"], 1);
  EXPECT_EQ(out["gradient_clipping"], 1.0);
  EXPECT_TRUE(contains(r.err, "$.train_micro_batch_size_per_gpu: \"auto\" -> " + std::to_string(micro) +
                                  ": largest that fits: " + std::to_string(micro) + " (peak "))
      << r.err;
  EXPECT_TRUE(contains(r.err, "of 64.00 MiB per rank, --gpu-mem)")) << r.err;
  EXPECT_TRUE(contains(r.err, "$.train_batch_size: \"auto\" -> " + std::to_string(micro))) << r.err;
  EXPECT_TRUE(contains(r.err, "$.gradient_accumulation_steps: \"auto\" -> 1")) << r.err;
  EXPECT_TRUE(contains(r.err, "$.gradient_clipping: \"auto\" -> 1.0")) << r.err;
}

TEST(AutoMicroBatchCli, ConfigCheckWithACalibrationAndWithoutAModel) {
  TempDir d;
  config::JobConfig c = tiny(1, {});
  const std::string cal = d.write("odd.json", calibration_json(odd_calibration(c.model.shape), {"t", "cpu", "shm", 1}).dump(2));
  auto r = run_command(dstrain() + " config check " + source_path(kTiny) +
                       " --set train_micro_batch_size_per_gpu=auto --set train_batch_size=16 --set gradient_accumulation_steps=auto "
                       "--gpu-mem 1GiB "
                       "--calibration " + cal);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["train_micro_batch_size_per_gpu"], 4);
  EXPECT_TRUE(contains(r.err, "\"auto\" -> 4: fastest by the calibrated model (" + cal + "): 4 at ")) << r.err;

  // A DeepSpeed config without a model: valid, the micro-batch left to the run.
  const std::string ds = d.write("ds.json", R"({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 2})");
  r = run_command(dstrain() + " config check " + ds + " --world-size 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["train_micro_batch_size_per_gpu"], "auto");
  EXPECT_EQ(j["train_batch_size"], "auto");
  EXPECT_EQ(j["gradient_accumulation_steps"], 2);
  EXPECT_TRUE(contains(r.err, "$.train_micro_batch_size_per_gpu: \"auto\": picked by the plan when the run starts"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "batch auto = micro auto x accumulation 2 x data-parallel 2")) << r.err;

  // Nothing fits: exit 2, the key, the smallest micro-batch's peak.
  r = run_command(dstrain() + " config check " + source_path(kTiny) +
                  " --set train_micro_batch_size_per_gpu=auto --gpu-mem 1MiB");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "$.train_micro_batch_size_per_gpu (from --set train_micro_batch_size_per_gpu=auto): "
                              "\"auto\": no micro-batch fits: the smallest, 1, needs "))
      << r.err;
}

// `dstrain train` picks, says so in its first lines, trains at the pick, and its checkpoint's
// config holds the number.
TEST(AutoMicroBatchCli, TrainPrintsThePickAndWritesTheNumber) {
  TempDir d;
  const int64_t p4 = plan_peak(1, {}, 4), p8 = plan_peak(1, {}, 8);
  auto r = run_command("OMP_NUM_THREADS=1 " + dstrain() + " train --config " + source_path(kTiny) +
                       " --set train_micro_batch_size_per_gpu=auto --set training.eval_interval=0" +
                       " --set training.checkpoint_dir=" + d.path() + "/ckpt --set training.checkpoint_interval=2" +
                       " --max-steps 2 --gpu-mem " + std::to_string((p4 + p8) / 2));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "dstrain: warning: ")) << r.err;
  EXPECT_TRUE(contains(r.err, "$.train_micro_batch_size_per_gpu (from --set train_micro_batch_size_per_gpu=auto): "
                              "\"auto\" -> 4: largest that fits: 4 (peak "))
      << r.err;
  EXPECT_TRUE(contains(r.err, "; 8 needs ")) << r.err;
  const auto manifest = nlohmann::json::parse(test::read_file(d.path() + "/ckpt/step_00000002/manifest.json"));
  EXPECT_EQ(manifest["config"]["train_micro_batch_size_per_gpu"], 4);
  EXPECT_EQ(manifest["config"]["train_batch_size"], 4);
}

// `plan --calibrate` on a config whose micro-batch is "auto" measures every size up to its cap
// (16), not only the placeholder 1, so that the calibrated pick has samples to choose among; its
// ranks read the config with the plan's --set (here the lr "auto" needs one) and --strict.
TEST(AutoMicroBatchCli, CalibrateMeasuresEverySizeForAnAutoMicroBatch) {
  TempDir d;
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(test::read_file(source_path(kTiny)));
  j["train_micro_batch_size_per_gpu"] = "auto";
  j["optimizer"]["params"]["lr"] = "auto";
  j["data"]["train"] = source_path("data/kjv/train.bin");
  j["data"]["val"] = source_path("data/kjv/val.bin");
  const std::string path = d.write("auto.json", j.dump(2));
  auto r = run_command("OMP_NUM_THREADS=1 " + dstrain() + " plan --calibrate --config " + path +
                       " --strict --set optimizer.params.lr=1e-3 -o " + d.path() + "/cal.json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const CalibrationFile f = read_calibration(d.path() + "/cal.json");
  std::vector<int> sizes;
  for (const auto& s : f.cal.compute) sizes.push_back(s.micro_batch);
  EXPECT_EQ(sizes, (std::vector<int>{1, 2, 4, 8, 16}));
}

// `plan --recommend --measure` runs its layouts with the plan's --set (and --strict): a config
// whose lr is "auto" is measured once --set fills it in.
TEST(AutoMicroBatchCli, MeasureForwardsSetAndStrict) {
  TempDir d;
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(test::read_file(source_path(kTiny)));
  j["optimizer"]["params"]["lr"] = "auto";
  j["data"]["train"] = source_path("data/kjv/train.bin");
  j["data"]["val"] = source_path("data/kjv/val.bin");
  const std::string path = d.write("lr_auto.json", j.dump(2));
  auto r = run_command("OMP_NUM_THREADS=1 " + dstrain() + " plan --recommend --measure --top 1 --measure-steps 2 --config " +
                       path + " --world-size 1 --gpu-mem 8GiB --strict --set optimizer.params.lr=3e-4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = nlohmann::json::parse(r.out);
  EXPECT_FALSE(contains(r.err, "failed")) << r.err;
  ASSERT_FALSE(out["recommendations"].empty()) << r.out;
  EXPECT_GT(out["recommendations"][0]["measured_ms"].get<double>(), 0) << r.out;
}

}  // namespace
}  // namespace ds::plan
