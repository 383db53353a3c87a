// What a run shows of itself, through real `dstrain train` runs (alone and under `dstrain launch`)
// on a tiny model: the wall-clock breakdown adds up to the step time (one process, ZeRO-2 over two
// ranks, a two-stage pipeline), MFU and TFLOP/s equal the formula for the config's peak;
// TensorBoard event files, read back by an independent Python reader (its own CRC-32C and
// protobuf decoder), and the CSV monitor's files hold the --metrics values step by step
// (training.eval_tasks' scores included); an
// unwritable output_path stops the run before training, a monitor that fails to write later
// warns once and training continues; `dstrain sample` is deterministic for a seed, greedy
// sampling from a checkpoint trained on a repeated string reproduces it (from the checkpoint and
// from its llm.c export), training.sample_interval prints samples, and a config for another model
// is an error naming both.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/token_file.h"
#include "multiproc/launch/job_process.h"
#include "multiproc/train/train_job.h"
#include "support/run_command.h"

namespace ds {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using test::TempDir;

constexpr int kLayers = 2, kEmbd = 32, kVocab = 64, kSeq = 16, kHeads = 2;

class Monitors : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::vector<uint16_t> toks(20000);
    std::mt19937 rng(5);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>(rng() % kVocab);
    rt::data::write_token_file(dir_->path() + "/train.bin", toks);
    rt::data::write_token_file(dir_->path() + "/val.bin", std::vector<uint16_t>(toks.begin(), toks.begin() + 4000));
  }
  static void TearDownTestSuite() { delete dir_; }

  // Global batch 8 sequences of 16 tokens, micro-batch 2.
  static json config(int steps, int dp = 1) {
    return {
        {"train_batch_size", 8},
        {"train_micro_batch_size_per_gpu", 2},
        {"wall_clock_breakdown", true},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}}}}},
        {"model",
         {{"type", "gpt2"}, {"n_layer", kLayers}, {"n_head", kHeads}, {"n_embd", kEmbd}, {"vocab_size", kVocab},
          {"seq_len", kSeq}}},
        {"data", {{"train", dir_->path() + "/train.bin"}, {"val", dir_->path() + "/val.bin"}}},
        {"training", {{"steps", steps}, {"seed", 3}, {"log_interval", 2}, {"eval_interval", 3}, {"eval_steps", 2}}},
    };
  }

  static test::TrainJobResult run(int nproc, const json& cfg, std::vector<std::string> extra = {}) {
    static int counter = 0;
    return test::run_train_job(dir_->path(), "run" + std::to_string(counter++), nproc, cfg, extra, 120s);
  }

  static void expect_breakdown_sums(const test::TrainJobResult& r, const std::string& what) {
    ASSERT_EQ(r.rc, 0) << what << "\n" << r.err;
    ASSERT_FALSE(r.metrics.empty()) << what;
    const char* phases[] = {"data",  "forward",   "backward",      "reduce",      "gather",
                            "stats", "optimizer", "pipeline_wait", "context_wait", "expert_wait"};
    for (const auto& m : r.metrics) {
      double sum = 0;
      for (const char* p : phases) {
        const std::string key = std::string("time_") + p + "_ms";
        ASSERT_TRUE(m.contains(key)) << what << ": " << key << " missing in " << m.dump();
        EXPECT_GE(m[key].get<double>(), 0) << what << " " << key;
        sum += m[key].get<double>();
      }
      const double step_ms = m.at("ms_per_step").get<double>();
      EXPECT_NEAR(sum, step_ms, 0.1 * step_ms) << what << " step " << m.at("step");
      EXPECT_GT(m.at("time_forward_ms").get<double>(), 0) << what;
      EXPECT_GT(m.at("time_backward_ms").get<double>(), 0) << what;
    }
    EXPECT_NE(r.out.find("time (ms) | data "), std::string::npos) << what << ": no breakdown line\n" << r.out;
  }

  static TempDir* dir_;
};
TempDir* Monitors::dir_ = nullptr;

TEST_F(Monitors, BreakdownSumsToStepTime) {
  expect_breakdown_sums(run(1, config(6)), "one process, 4 accumulation steps");
}

TEST_F(Monitors, BreakdownSumsToStepTimeWithZero2) {
  json cfg = config(6, 2);
  cfg["zero_optimization"] = {{"stage", 2}, {"overlap_comm", true}, {"reduce_bucket_size", 3000}};
  const auto r = run(2, cfg);
  expect_breakdown_sums(r, "ZeRO-2 over 2 ranks");
  for (const auto& m : r.metrics) {
    EXPECT_GT(m.at("time_reduce_comm_ms").get<double>(), 0) << "the dp group ran reductions";
    EXPECT_GE(m.at("time_gather_comm_ms").get<double>(), 0);
    // The straggler report's input: every rank's compute time (forward + backward) of the step;
    // rank 0's is its own breakdown's.
    for (const char* key : {"time_compute_ms_rank0", "time_compute_ms_rank1"}) {
      ASSERT_TRUE(m.contains(key)) << key << " missing in " << m.dump();
      EXPECT_GT(m.at(key).get<double>(), 0) << key;
    }
    EXPECT_NEAR(m.at("time_compute_ms_rank0").get<double>(),
                m.at("time_forward_ms").get<double>() + m.at("time_backward_ms").get<double>(), 1e-6);
  }
}

TEST_F(Monitors, BreakdownSumsToStepTimeWithPipeline) {
  json cfg = config(6, 1);
  cfg["pipeline"] = {{"stages", 2}};
  const auto r = run(2, cfg);
  expect_breakdown_sums(r, "2 pipeline stages");
  double waits = 0;
  for (const auto& m : r.metrics) waits += m.at("time_pipeline_wait_ms").get<double>();
  EXPECT_GT(waits, 0) << "the first stage waits for the last one's gradients";
}

TEST_F(Monitors, MfuEqualsTheFormula) {
  json cfg = config(4);
  cfg["training"]["peak_tflops"] = 0.25;
  cfg.erase("wall_clock_breakdown");
  const auto r = run(1, cfg);
  ASSERT_EQ(r.rc, 0) << r.err;
  // GPT-2's parameters for this shape by hand (padded vocabulary 128), then 6N + 6LCT.
  const double C = kEmbd, L = kLayers, T = kSeq, Vp = 128;
  const double layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
  const double n = Vp * C + T * C + L * layer + 2 * C;
  const double flops_per_token = 6 * n + 6 * L * C * T;
  const double tokens = 8.0 * kSeq;
  ASSERT_EQ(r.metrics.size(), 4u);
  for (const auto& m : r.metrics) {
    const double seconds = m.at("ms_per_step").get<double>() / 1000;
    const double tflops = flops_per_token * tokens / seconds / 1e12;
    EXPECT_NEAR(m.at("tflops").get<double>(), tflops, 1e-9 * tflops);
    EXPECT_NEAR(m.at("mfu").get<double>(), tflops / 0.25, 1e-9 * tflops);
    EXPECT_FALSE(m.contains("time_forward_ms")) << "no breakdown unless wall_clock_breakdown";
  }
  EXPECT_NE(r.out.find("MFU against 0.25 TFLOP/s per rank (training.peak_tflops)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| MFU "), std::string::npos) << r.out;
}

TEST_F(Monitors, MfuAgainstAMeasuredPeakOnTheCpu) {
  const auto r = run(1, config(2));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("(measured: a fp32 512x768x1536 matmul at start-up"), std::string::npos) << r.out;
  for (const auto& m : r.metrics) EXPECT_GT(m.at("mfu").get<double>(), 0);
}

// The scalars a monitor must hold for one metrics record: DeepSpeed's tags and ours.
std::vector<std::pair<std::string, double>> expected_scalars(const json& m) {
  const std::string p = "Train/Samples/";
  std::vector<std::pair<std::string, double>> out = {{p + "train_loss", m["loss"]}, {p + "lr", m["lr"]},
                                                     {p + "loss_scale", m["loss_scale"]}};
  const double fwd = m["time_forward_ms"], bwd = m["time_backward_ms"], red = m["time_reduce_ms"];
  out.push_back({p + "elapsed_time_ms_forward", fwd});
  out.push_back({p + "elapsed_time_ms_backward", bwd + red});
  out.push_back({p + "elapsed_time_ms_backward_inner", bwd});
  out.push_back({p + "elapsed_time_ms_backward_allreduce", red});
  out.push_back({p + "elapsed_time_ms_step", m["time_optimizer_ms"]});
  for (const char* k : {"grad_norm", "tokens_per_s", "tflops", "mfu", "val_loss"}) {
    if (m.contains(k)) out.push_back({p + k, m[k]});
  }
  for (const auto& [k, v] : m.items()) {
    if (k.rfind("peak_bytes_", 0) == 0) out.push_back({p + k, v.get<double>()});
  }
  for (const auto& [k, v] : m.items()) {  // training.eval_tasks' scores
    if (k.rfind("eval_", 0) == 0) out.push_back({p + k, v.get<double>()});
  }
  return out;
}

TEST_F(Monitors, TensorBoardAndCsvHoldTheMetrics) {
  namespace fs = std::filesystem;
  json cfg = config(6);
  cfg["fp16"] = {{"enabled", true}};
  cfg["tensorboard"] = {{"enabled", true}, {"output_path", dir_->path() + "/tb"}, {"job_name", "job1"}};
  cfg["csv_monitor"] = {{"enabled", true}, {"output_path", dir_->path() + "/csv"}, {"job_name", "job1"}};
  // A downstream task's scores at the evaluation steps too (bytes below the vocabulary of 64).
  std::ofstream(dir_->path() + "/lambada.jsonl") << "{\"text\": \"12 34 56 78\"}\n{\"text\": \"1, 2, 3, 4\"}\n";
  cfg["training"]["eval_tasks"] = {{{"task", "lambada"}, {"data", dir_->path() + "/lambada.jsonl"}}};
  const auto r = run(1, cfg);
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_EQ(r.metrics.size(), 6u);

  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir_->path() + "/tb/job1")) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  const std::string name = files[0].filename().string();
  EXPECT_TRUE(std::regex_match(name, std::regex(R"(events\.out\.tfevents\.\d{10}\.[^.]+.*\.\d+)"))) << name;
  const auto read = test::run_command("/usr/bin/python3 " + std::string(DS_SOURCE_DIR) +
                                      "/tests/multiproc/monitors/read_tfevents.py " + files[0].string());
  ASSERT_EQ(read.exit_code, 0) << read.err;
  const json tb = json::parse(read.out);
  EXPECT_EQ(tb["file_version"], "brain.Event:2");
  ASSERT_EQ(tb["events"].size(), r.metrics.size());
  for (size_t i = 0; i < r.metrics.size(); ++i) {
    const json& m = r.metrics[i];
    const json& ev = tb["events"][i];
    EXPECT_EQ(ev["step"].get<int64_t>(), m["step"].get<int64_t>() * 8) << "the step is the sample count";
    const auto want = expected_scalars(m);
    EXPECT_EQ(ev["values"].size(), want.size()) << ev.dump();
    for (const auto& [tag, v] : want) {
      ASSERT_TRUE(ev["values"].contains(tag)) << tag << " at step " << m["step"];
      EXPECT_EQ(ev["values"][tag].get<float>(), static_cast<float>(v)) << tag << " at step " << m["step"];
    }
  }
  EXPECT_TRUE(tb["events"][2]["values"].contains("Train/Samples/val_loss"));
  EXPECT_FALSE(tb["events"][1]["values"].contains("Train/Samples/val_loss"));
  EXPECT_TRUE(tb["events"][2]["values"].contains("Train/Samples/eval_lambada_acc"));
  EXPECT_TRUE(tb["events"][2]["values"].contains("Train/Samples/eval_lambada_ppl"));
  EXPECT_FALSE(tb["events"][1]["values"].contains("Train/Samples/eval_lambada_acc"));

  // CSV: one file per tag, DeepSpeed's header, the exact metrics values (a val_loss row only at
  // evaluation steps).
  std::map<std::string, std::vector<std::pair<int64_t, double>>> rows;
  for (const auto& m : r.metrics) {
    for (const auto& [tag, v] : expected_scalars(m)) rows[tag].push_back({m["step"].get<int64_t>() * 8, v});
  }
  for (const auto& [tag, want] : rows) {
    std::string file = tag;
    std::replace(file.begin(), file.end(), '/', '_');
    std::ifstream in(dir_->path() + "/csv/job1/" + file + ".csv");
    ASSERT_TRUE(in) << file;
    std::string line;
    std::getline(in, line);
    EXPECT_EQ(line, "step," + tag.substr(tag.rfind('/') + 1));
    for (const auto& [samples, v] : want) {
      ASSERT_TRUE(std::getline(in, line)) << file;
      const size_t comma = line.find(',');
      EXPECT_EQ(std::stoll(line.substr(0, comma)), samples) << file;
      EXPECT_EQ(std::stod(line.substr(comma + 1)), v) << file << ": " << line;
    }
    EXPECT_FALSE(std::getline(in, line)) << file << " has more rows than steps";
  }
}

TEST_F(Monitors, UnwritableOutputPathIsAnErrorBeforeTraining) {
  std::ofstream(dir_->path() + "/a_file") << "x";
  json cfg = config(3);
  cfg["tensorboard"] = {{"enabled", true}, {"output_path", dir_->path() + "/a_file/tb"}};
  auto r = run(1, cfg);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("$.tensorboard.output_path: cannot create the directory " + dir_->path() +
                       "/a_file/tb/DeepSpeedJobName"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(r.metrics.empty()) << "no step ran";
  cfg.erase("tensorboard");
  cfg["csv_monitor"] = {{"enabled", true}, {"output_path", dir_->path() + "/a_file"}, {"job_name", "j"}};
  r = run(1, cfg);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("$.csv_monitor.output_path: cannot create the directory"), std::string::npos) << r.err;
}

// A file-size limit (RLIMIT_FSIZE) stops the event file's growth after a few steps: the writer
// warns once, the run trains to its last step and exits 0.
TEST_F(Monitors, AMonitorThatCannotWriteWarnsOnceAndTrainingContinues) {
  json cfg = config(30);
  cfg["tensorboard"] = {{"enabled", true}, {"output_path", dir_->path() + "/tb_full"}};
  cfg["training"]["log_interval"] = 30;
  const std::string cfg_path = dir_->path() + "/full.json";
  std::ofstream(cfg_path) << cfg.dump();
  const auto r = test::run_command("ulimit -f 8; exec env -u RANK -u WORLD_SIZE -u DSTRAIN_STORE OMP_NUM_THREADS=1 " +
                                   std::string(DS_DSTRAIN_BIN) + " train -c " + cfg_path);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("step 30/30"), std::string::npos) << r.out;
  const std::string warn = "training continues without the tensorboard event file";
  const size_t at = r.out.find(warn);
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(warn, at + 1), std::string::npos) << "warned once\n" << r.out;
  EXPECT_NE(r.out.find("warning: cannot write " + dir_->path() + "/tb_full/DeepSpeedJobName/events.out.tfevents."),
            std::string::npos)
      << r.out;
}

class Sampling : public ::testing::Test {
 protected:
  static constexpr const char* kText = "the quick brown fox jumps over the lazy dog. ";
  // A byte-level model trained to recite kText, checkpointed and exported once for the suite.
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::string text;
    while (text.size() < 20000) text += kText;
    std::vector<uint16_t> toks(text.begin(), text.end());
    rt::data::write_token_file(dir_->path() + "/text.bin", toks);
    json cfg = model_config(400);
    cfg["training"]["checkpoint_dir"] = dir_->path() + "/ckpt";
    cfg["training"]["checkpoint_interval"] = 400;
    cfg["training"]["sample_interval"] = 200;
    auto r = test::run_train_job(dir_->path(), "recite", 1, cfg, {"--export-llmc", dir_->path() + "/recite.llmc"}, 300s);
    ASSERT_EQ(r.rc, 0) << r.err;
    train_out_ = new std::string(r.out);
    final_loss_ = r.metrics.back()["loss"].get<double>();
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete train_out_;
  }
  static json model_config(int steps, int layers = 2) {
    return {
        {"train_micro_batch_size_per_gpu", 8},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}, {"weight_decay", 0.0}}}}},
        {"model",
         {{"type", "gpt2"}, {"n_layer", layers}, {"n_head", 4}, {"n_embd", 64}, {"vocab_size", 256}, {"seq_len", 64}}},
        {"data", {{"train", dir_->path() + "/text.bin"}}},
        {"training", {{"steps", steps}, {"seed", 5}, {"log_interval", 40}}},
    };
  }
  static test::CommandResult sample(const std::string& args) {
    return test::run_command("OMP_NUM_THREADS=1 " + std::string(DS_DSTRAIN_BIN) + " sample " + args);
  }
  static TempDir* dir_;
  static std::string* train_out_;
  static double final_loss_;
};
TempDir* Sampling::dir_ = nullptr;
std::string* Sampling::train_out_ = nullptr;
double Sampling::final_loss_ = 0;

TEST_F(Sampling, GreedyReproducesTheTrainedString) {
  ASSERT_LT(final_loss_, 0.1) << "the model did not learn the string";
  const std::string want = std::string("the quick") + std::string(kText).substr(9) + kText;
  for (const std::string& from : {"--checkpoint " + dir_->path() + "/ckpt", "--checkpoint " + dir_->path() +
                                      "/ckpt/step_00000400", "--init-from " + dir_->path() + "/recite.llmc"}) {
    const auto r = sample(from + " --prompt 'the quick' --tokens 50 --top-k 1");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, want.substr(0, 9 + 50) + "\n") << from;
    EXPECT_NE(r.err.find("byte-level tokenizer"), std::string::npos) << r.err;
  }
}

TEST_F(Sampling, DeterministicForASeed) {
  const std::string args = "--checkpoint " + dir_->path() + "/ckpt --tokens 40 --temperature 1.5 ";
  const auto a = sample(args + "--seed 7"), b = sample(args + "--seed 7");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.out.size(), 40u + 1) << "40 bytes and a newline";
}

TEST_F(Sampling, SampleIntervalPrintsSamplesWhileTraining) {
  EXPECT_NE(train_out_->find("sample at step 200:\n---\n"), std::string::npos) << *train_out_;
  EXPECT_NE(train_out_->find("sample at step 400:\n---\n"), std::string::npos) << *train_out_;
}

TEST_F(Sampling, ACheckpointForAnotherModelIsAnError) {
  const std::string other = dir_->path() + "/other.json";
  std::ofstream(other) << model_config(10, 3).dump();
  const auto r = sample("--checkpoint " + dir_->path() + "/ckpt --config " + other + " --tokens 4");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("holds GPT-2 (L=2 H=4 C=64 V=256 Vp=256 T=64), but " + other +
                       "'s model is GPT-2 (L=3 H=4 C=64 V=256 Vp=256 T=64)"),
            std::string::npos)
      << r.err;
  const auto none = sample("--checkpoint " + dir_->path() + " --tokens 4");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.err.find("is not a dstrain checkpoint: no manifest.json and no latest"), std::string::npos) << none.err;
  const auto both = sample("--tokens 4");
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("needs exactly one of --checkpoint DIR and --init-from FILE"), std::string::npos) << both.err;
}

// A Llama checkpoint samples as a GPT-2's does (model/generate.h serves every family; its unit test
// holds the cache to the training forward): any prompt, the requested number of bytes, the same
// text for the same seed, and samples while it trains; its weights exported as Hugging Face
// safetensors sample the same text. (Before the generator served every family
// this was an error naming the model.)
TEST_F(Sampling, ALlamaCheckpointSamplesAndSamplesWhileTraining) {
  json cfg = model_config(4);
  cfg["model"] = {{"type", "llama"}, {"n_layer", 2}, {"n_head", 4}, {"n_kv_head", 2}, {"n_embd", 64},
                  {"intermediate_size", 176}, {"vocab_size", 256}, {"seq_len", 64}};
  cfg["training"]["checkpoint_dir"] = dir_->path() + "/llama_ckpt";
  cfg["training"]["checkpoint_interval"] = 4;
  cfg["training"]["sample_interval"] = 2;
  const std::string hf = dir_->path() + "/llama_hf";
  auto t = test::run_train_job(dir_->path(), "llama", 1, cfg, {"--export-safetensors", hf}, 120s);
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_NE(t.out.find("sample at step 2:\n---\n"), std::string::npos) << t.out;
  const std::string opts = " --prompt 'the' --tokens 12 --seed 3";
  const std::string from_checkpoint = "--checkpoint " + dir_->path() + "/llama_ckpt" + opts;
  const auto a = sample(from_checkpoint), b = sample(from_checkpoint);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.out.substr(0, 3), "the");
  EXPECT_EQ(a.out.size(), 3u + 12 + 1) << "the prompt, 12 bytes and a newline";
  // The same weights exported as Hugging Face safetensors (fp32) sample the same text.
  const auto h = sample("--init-from " + hf + " --config " + dir_->path() + "/llama.json" + opts);
  ASSERT_EQ(h.exit_code, 0) << h.err;
  EXPECT_EQ(h.out, a.out);
  const auto no_config = sample("--init-from " + hf + opts);
  EXPECT_EQ(no_config.exit_code, 2);
  EXPECT_NE(no_config.err.find("Hugging Face safetensors need --config FILE"), std::string::npos) << no_config.err;
}

}  // namespace
}  // namespace ds
