// `dstrain config check` through the real binary: exit codes, the resolved JSON on stdout,
// warnings and every error on stderr.
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/run_command.h"

namespace ds {
namespace {

using test::dstrain;
using test::run_command;
using test::source_path;

// A config file in a fresh temporary directory, removed with the fixture.
class ConfigCli : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ds_config_cli_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  std::string dir_;
};

TEST_F(ConfigCli, ShippedConfigPrintsTheResolvedJson) {
  auto r = run_command(dstrain() + " config check " + source_path("configs/gpt2-tiny-cpu.json") +
                       " --world-size 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["train_batch_size"], 16);
  EXPECT_EQ(j["train_micro_batch_size_per_gpu"], 8);
  EXPECT_EQ(j["gradient_accumulation_steps"], 1);
  EXPECT_EQ(j["model"]["padded_vocab_size"], 256);
  EXPECT_EQ(j["data"]["train"], source_path("data/kjv/train.bin"));
  EXPECT_EQ(j["zero_optimization"]["reduce_bucket_size"], 500000000);  // a default, filled in
  EXPECT_EQ(j["scheduler"]["params"]["total_num_steps"], j["training"]["steps"]);
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("data-parallel 2 x tensor-parallel 1 x pipeline 1; batch 16 = micro 8 x "
                       "accumulation 1 x data-parallel 2"),
            std::string::npos) << r.err;
}

TEST_F(ConfigCli, DefaultWorldSizeIsOne) {
  auto r = run_command(dstrain() + " config check " + source_path("configs/gpt2-tiny-cpu.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["train_batch_size"], 8);
}

TEST_F(ConfigCli, DeepSpeedConfigValidatesWithWarnings) {
  std::string path = write("ds.json", R"({
  "train_batch_size": 16,
  "gradient_accumulation_steps": 2,
  "memory_breakdown": false,
  "fp16": {"enabled": true, "auto_cast": false}
})");
  auto r = run_command(dstrain() + " config check " + path + " --world-size 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["train_micro_batch_size_per_gpu"], 2);
  EXPECT_NE(r.err.find("warning: " + path + ":5: $.fp16.auto_cast: DeepSpeed key accepted but not acted on"),
            std::string::npos) << r.err;
  EXPECT_NE(r.err.find("warning: " + path + ":4: $.memory_breakdown: DeepSpeed key accepted"),
            std::string::npos) << r.err;
  EXPECT_NE(r.err.find("note: valid, but `dstrain train` also needs: model, data.train, training.steps"),
            std::string::npos) << r.err;

  // --train turns the missing sections into errors.
  r = run_command(dstrain() + " config check --train " + path + " --world-size 4");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("error: " + path + ": $.model: missing"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("error: " + path + ": $.training.steps: missing"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
}

TEST_F(ConfigCli, EveryErrorIsPrintedAndTheExitCodeIsTwo) {
  std::string path = write("bad.json", R"({
  "train_micro_batch_size_per_gpu": 4,
  "zero_optimization": {"stage": 4},
  "fp16": {"enabled": true},
  "bf16": {"enabled": true},
  "optimizr": {}
})");
  auto r = run_command(dstrain() + " config check " + path);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_NE(r.err.find("error: " + path + ":3: $.zero_optimization.stage: expected an integer 0-3, got 4\n"),
            std::string::npos) << r.err;
  EXPECT_NE(r.err.find("error: " + path + ":6: $.optimizr: unknown key (did you mean \"optimizer\"?)\n"),
            std::string::npos) << r.err;
  EXPECT_NE(r.err.find("error: " + path + ":5: $.bf16: fp16 and bf16 cannot both be enabled"),
            std::string::npos) << r.err;
  EXPECT_NE(r.err.find("dstrain: 3 errors in " + path), std::string::npos) << r.err;
}

TEST_F(ConfigCli, UnknownDeepSpeedKeysWarnAndStrictMakesThemErrors) {
  std::string path = write("hf.json", R"({
  "train_micro_batch_size_per_gpu": 4,
  "cuda_visible_devices": "0"
})");
  auto r = run_command(dstrain() + " config check " + path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: " + path + ":3: $.cuda_visible_devices: unknown key, ignored as DeepSpeed "
                       "ignores it (an error with --strict)"),
            std::string::npos) << r.err;
  r = run_command(dstrain() + " config check --strict " + path);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("error: " + path + ":3: $.cuda_visible_devices: unknown key"), std::string::npos) << r.err;
  // plan and train take the flag too.
  r = run_command(dstrain() + " plan --help");
  EXPECT_NE(r.out.find("--strict"), std::string::npos) << r.out;
  r = run_command(dstrain() + " train --help");
  EXPECT_NE(r.out.find("--strict"), std::string::npos) << r.out;
}

TEST_F(ConfigCli, SetOverridesKeysAndNamesItselfInErrors) {
  std::string path = write("set.json", R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1}})");
  auto r = run_command(dstrain() + " config check --set zero_optimization.stage=2 " + path +
                       " --set optimizer.params.lr=3e-4 --set training.steps=100");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["zero_optimization"]["stage"], 2);
  EXPECT_DOUBLE_EQ(j["optimizer"]["params"]["lr"].get<double>(), 3e-4) << j["optimizer"].dump();
  EXPECT_EQ(j["training"]["steps"], 100);
  r = run_command(dstrain() + " config check " + path + " --set zero_optimization.stage=7");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("error: " + path + ": $.zero_optimization.stage (from --set zero_optimization.stage=7): "
                       "expected an integer 0-3, got 7"),
            std::string::npos) << r.err;
  r = run_command(dstrain() + " config check " + path + " --set zero_optimization.stage.x=1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--set zero_optimization.stage.x=1: $.zero_optimization.stage is 1, not an object"),
            std::string::npos) << r.err;
  // launch forwards a command after -- as given, --set included.
  r = run_command(dstrain() + " launch --dry-run --nproc-per-node 1 -- dstrain train --config " + path +
                  " --set optimizer.params.lr=3e-4");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE((r.out + r.err).find("--set optimizer.params.lr=3e-4"), std::string::npos) << r.out << r.err;
}

TEST_F(ConfigCli, WorldSizeTheLayoutCannotUseIsAnError) {
  std::string path = write("tp.json", R"({"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"size": 2}})");
  auto r = run_command(dstrain() + " config check " + path + " --world-size 3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("world size 3 is not divisible by tensor_parallel.size x pipeline.stages = 2 x 1 = 2"),
            std::string::npos) << r.err;
}

TEST_F(ConfigCli, BadInvocationsExitWithClearErrors) {
  auto r = run_command(dstrain() + " config check /nonexistent/x.json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("cannot read config /nonexistent/x.json: No such file or directory"),
            std::string::npos) << r.err;

  r = run_command(dstrain() + " config check " + source_path("configs/gpt2-tiny-cpu.json") +
                  " --world-size 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("world size must be at least 1, got 0"), std::string::npos) << r.err;

  r = run_command(dstrain() + " config check --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--world-size"), std::string::npos) << r.out;
}

TEST_F(ConfigCli, LoraSectionIsPrintedResolved) {
  const std::string model = R"("model": {"type": "llama", "n_layer": 2, "n_head": 4, "n_embd": 64, )"
                            R"("vocab_size": 300, "seq_len": 32, "intermediate_size": 176})";
  std::filesystem::create_directories(dir_ + "/ad");
  write("ad/adapter_config.json", R"({"peft_type": "LORA", "r": 4, "lora_alpha": 16, "target_modules": )"
                                  R"(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]})");
  std::string path = write("lora.json", R"({"train_micro_batch_size_per_gpu": 2, )" + model +
                                            R"(, "lora": {"r": 4, "target_modules": "all-linear", "init_from": "ad"}})");
  auto r = run_command(dstrain() + " config check " + path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out)["lora"];
  EXPECT_EQ(j["r"], 4);
  EXPECT_EQ(j["alpha"], 16);  // with init_from and no alpha: the adapter's (read when the config is)
  EXPECT_EQ(j["target_modules"],
            nlohmann::json({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
  EXPECT_EQ(j["init_from"], dir_ + "/ad");
  path = write("bad.json", R"({"train_micro_batch_size_per_gpu": 2, )" + model +
                               R"(, "lora": {"r": 4, "target_modules": ["w1"]}})");
  r = run_command(dstrain() + " config check " + path);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("$.lora.target_modules[0]: \"w1\" names no LoRA target of model.type llama"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace ds
