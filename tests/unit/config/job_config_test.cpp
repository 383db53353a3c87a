// Job config validation: a table of malformed configs with the exact error each gets, the
// batch triad table, defaults, warnings for DeepSpeed keys dstrain does not act on, duplicate
// keys, path resolution, the JSON round trip, and every shipped config under configs/.
#include "config/job_config.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <gtest/gtest.h>

namespace ds::config {
namespace {

// Every error a config gets, or {} when it is valid.
std::vector<std::string> errors_of(const std::string& text, int world = 1) {
  try {
    parse_job_config(text, "t.json", world);
  } catch (const ConfigError& e) {
    return e.errors();
  }
  return {};
}

// The minimal valid config: the batch triad needs train_batch_size or the micro batch.
const char* kMin = R"({"train_micro_batch_size_per_gpu": 2})";

TEST(JobConfig, MalformedConfigsGetExactErrors) {
  struct Case {
    std::string json;
    int world;
    std::string error;
  };
  const std::string mb = R"("train_micro_batch_size_per_gpu": 2, )";
  const std::string model =
      R"("model": {"n_layer": 4, "n_head": 4, "n_embd": 128, "vocab_size": 256, "seq_len": 64})";
  const std::vector<Case> cases = {
      {"[1]", 1, "t.json:1: $: expected a JSON object at the top level, got [1]"},
      {"{\"a\": 1,}", 1, "t.json:1:9: trailing comma before '}'"},
      {"{" + mb + R"("zero_optimization": {"stage": 4}})", 1,
       "t.json:1: $.zero_optimization.stage: expected an integer 0-3, got 4"},
      {"{" + mb + R"("zero_optimization": {"stage": "2"}})", 1,
       "t.json:1: $.zero_optimization.stage: expected an integer 0-3, got \"2\""},
      {"{" + mb + R"("zero_optimization": {"stgae": 2}})", 1,
       "t.json:1: $.zero_optimization.stgae: unknown key (did you mean \"stage\"?)"},
      {"{" + mb + R"("train_batch_sise": 8})", 1,
       "t.json:1: $.train_batch_sise: unknown key (did you mean \"train_batch_size\"?)"},
      {"{" + mb + R"("modle": {}})", 1, "t.json:1: $.modle: unknown key (did you mean \"model\"?)"},
      {"{" + mb + R"("zero_optimisation": {"stage": 2}})", 1,
       "t.json:1: $.zero_optimisation: unknown key (did you mean \"zero_optimization\"?)"},
      {"{" + mb + R"("training": {"stepz": 2}})", 1,
       "t.json:1: $.training.stepz: unknown key (did you mean \"steps\"?)"},
      // training has 17 keys: more than a message lists (config_reader.cpp).
      {"{" + mb + R"("training": {"xyzzy": 1}})", 1,
       "t.json:1: $.training.xyzzy: unknown key (not a dstrain or DeepSpeed key here; see docs/configuration.md)"},
      {"{" + mb + R"("training": {"checkpoint_asnyc": true}})", 1,
       "t.json:1: $.training.checkpoint_asnyc: unknown key (did you mean \"checkpoint_async\"?)"},
      {R"({"train_micro_batch_size_per_gpu": 0})", 1,
       "t.json:1: $.train_micro_batch_size_per_gpu: expected an integer >= 1, got 0"},
      {R"({"train_batch_size": 6, "train_micro_batch_size_per_gpu": "auto"})", 4,
       "t.json:1: $.train_batch_size: 6 is not divisible by the data-parallel size 4, so no "
       "train_micro_batch_size_per_gpu (\"auto\") divides a rank's share"},
      {"{" + mb + R"("steps_per_print": 0})", 1,
       "t.json:1: $.steps_per_print: expected an integer >= 1, got 0"},
      {"{" + mb + R"("gradient_clipping": -1})", 1,
       "t.json:1: $.gradient_clipping: expected a number >= 0, got -1"},
      {"{" + mb + R"("gradient_clipping": true})", 1,
       "t.json:1: $.gradient_clipping: expected a number >= 0, got true"},
      {"{" + mb + R"("fp16": {"enabled": true}, "bf16": {"enabled": true}})", 1,
       "t.json:1: $.bf16: fp16 and bf16 cannot both be enabled (as in DeepSpeed)"},
      {"{" + mb + R"("fp16": {"enabled": "auto"}})", 1,
       "t.json:1: $.fp16.enabled: \"auto\" needs a value: pass --set fp16.enabled=VALUE"},
      {"{" + mb + R"("fp16": {"min_loss_scale": 0}})", 1,
       "t.json:1: $.fp16.min_loss_scale: expected a number > 0, got 0"},
      {"{" + mb + R"("fp16": {"initial_scale_power": 64}})", 1,
       "t.json:1: $.fp16.initial_scale_power: expected an integer 0-63, got 64"},
      {"{" + mb + R"("fp16": true})", 1, "t.json:1: $.fp16: expected an object, got true"},
      {"{" + mb + R"("bf16": {"enabled": true}, "bfloat16": {"enabled": true}})", 1,
       "t.json:1: $.bfloat16: both \"bf16\" and its old name \"bfloat16\" are given; keep \"bf16\""},
      {"{" + mb + R"("zero_optimization": {"reduce_bucket_size": 1.5}})", 1,
       "t.json:1: $.zero_optimization.reduce_bucket_size: expected an integer >= 1, got 1.5"},
      {"{" + mb + R"("zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})", 1,
       "t.json:1: $.zero_optimization.offload_param.device: \"nvme\" offload is not supported by "
       "dstrain (expected \"none\" or \"cpu\")"},
      {"{" + mb + R"("zero_optimization": {"offload_optimizer": {"device": "gpu"}}})", 1,
       "t.json:1: $.zero_optimization.offload_optimizer.device: expected one of \"none\", \"cpu\", "
       "got \"gpu\""},
      {"{" + mb + R"("optimizer": {"type": "SGD"}})", 1,
       "t.json:1: $.optimizer.type: expected one of \"Adam\", \"AdamW\", \"Lamb\", \"Adagrad\", \"Lion\", "
       "\"OneBitAdam\", \"ZeroOneAdam\", \"OneBitLamb\", got \"SGD\""},
      {"{" + mb + R"("optimizer": {"type": "Lion", "params": {"eps": 1e-8}}})", 1,
       "t.json:1: $.optimizer.params.eps: not a parameter of Lion (DeepSpeed would reject it)"},
      {"{" + mb + R"("optimizer": {"type": "Adam", "params": {"max_coeff": 0.3}}})", 1,
       "t.json:1: $.optimizer.params.max_coeff: not a parameter of Adam (DeepSpeed would reject it)"},
      {"{" + mb + R"("optimizer": {"type": "Lamb", "params": {"max_coeff": 0.3, "min_coeff": 0.5}}})", 1,
       "t.json:1: $.optimizer.params.min_coeff: 0.5 is above max_coeff 0.3: the trust ratio is clamped to "
       "[min_coeff, max_coeff]"},
      {"{" + mb + R"("optimizer": {"type": "OneBitAdam"}, "zero_optimization": {"stage": 1}})", 1,
       "t.json:1: $.zero_optimization.stage: OneBitAdam with ZeRO stage 1: the 1-bit optimizers exchange the "
       "whole momentum and run without ZeRO, as in DeepSpeed (use stage 0)"},
      {"{" + mb + R"("optimizer": {"type": "Lamb", "params": {"amsgrad": true}}})", 1,
       "t.json:1: $.optimizer.params.amsgrad: Lamb has no AMSGrad variant (DeepSpeed refuses it too)"},
      {"{" + mb + R"("optimizer": {"params": {"betas": [0.9]}}})", 1,
       "t.json:1: $.optimizer.params.betas: expected [beta1, beta2] with each in [0, 1), got [0.9]"},
      {"{" + mb + R"("optimizer": {"params": {"eps": 0}}})", 1,
       "t.json:1: $.optimizer.params.eps: expected a number > 0, got 0"},
      {"{" + mb + R"("optimizer": {"params": {"lrr": 0.1}}})", 1,
       "t.json:1: $.optimizer.params.lrr: unknown key (did you mean \"lr\"?)"},
      {"{" + mb + R"("scheduler": {"type": "OneCycle"}})", 1,
       "t.json:1: $.scheduler.type: \"OneCycle\" is a DeepSpeed schedule dstrain does not implement "
       "(expected one of \"WarmupLR\", \"WarmupDecayLR\", \"WarmupCosineLR\")"},
      {"{" + mb + R"("scheduler": {"params": {}}})", 1,
       "t.json:1: $.scheduler: missing \"type\" (expected one of \"WarmupLR\", \"WarmupDecayLR\", "
       "\"WarmupCosineLR\"; omit the section for a constant lr)"},
      {"{" + mb + R"("scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 10, "warmup_max_lr": 0.1}}})",
       1, "t.json:1: $.scheduler.params.warmup_max_lr: not a parameter of WarmupCosineLR (DeepSpeed would reject it)"},
      {"{" + mb + R"("scheduler": {"type": "WarmupLR", "params": {"total_num_steps": 10}}})", 1,
       "t.json:1: $.scheduler.params.total_num_steps: not a parameter of WarmupLR (DeepSpeed would reject it)"},
      {"{" + mb + R"("scheduler": {"type": "WarmupDecayLR", "params": {}}})", 1,
       "t.json:1: $.scheduler.params: WarmupDecayLR needs params.total_num_steps (or training.steps to take it from)"},
      {"{" + mb + R"("scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}})", 1,
       "t.json:1: $.scheduler.params.warmup_num_steps: expected an integer >= 1, got 0"},
      {"{" + mb + R"("scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}})", 1,
       "t.json:1: $.scheduler.params.warmup_type: expected one of \"log\", \"linear\", got \"cosine\""},
      {"{" + mb + R"("pipeline": {"schedule": "interleaved"}})", 1,
       "t.json:1: $.pipeline.schedule: expected one of \"1f1b\", \"gpipe\", got \"interleaved\""},
      {"{" + mb + R"("tensor_parallel": {"size": 2})", 3,
       "t.json:1:69: expected ',' or '}' after a member of an object, got end of input"},
      {"{" + mb + R"("tensor_parallel": {"size": 2}})", 3,
       "t.json:1: $.tensor_parallel: world size 3 is not divisible by tensor_parallel.size x "
       "pipeline.stages = 2 x 1 = 2 (the data-parallel size must be a whole number)"},
      {"{" + mb + R"("pipeline": {"stages": 2}})", 3,
       "t.json:1: $.pipeline: world size 3 is not divisible by tensor_parallel.size x "
       "pipeline.stages = 1 x 2 = 2 (the data-parallel size must be a whole number)"},
      {"{" + mb + R"("pipeline": {"stages": 2}, "zero_optimization": {"stage": 3}})", 2,
       "t.json:1: $.zero_optimization: ZeRO stage 3 cannot be combined with pipeline parallelism "
       "(pipeline.stages = 2), as in DeepSpeed; use stage 0-2 or pipeline.stages 1"},
      {"{" + mb + R"("model": {"n_layer": 4, "n_head": 3, "n_embd": 128, "vocab_size": 256, "seq_len": 64}})", 1,
       "t.json:1: $.model.n_embd: n_embd (128) must be divisible by n_head (3)"},
      {"{" + mb + R"("model": {"n_layer": 4, "n_head": 4, "n_embd": 128, "vocab_size": 256}})", 1,
       "t.json:1: $.model: missing required key \"seq_len\""},
      {"{" + mb + R"("model": {"n_layer": 4, "n_head": 4, "n_embd": 128, "vocab_size": 70000, "seq_len": 64}})", 1,
       "t.json:1: $.model.vocab_size: expected an integer 1-65536, got 70000"},
      {"{" + mb + R"("model": {"type": "mamba", "n_layer": 4, "n_head": 4, "n_embd": 128, "vocab_size": 256, "seq_len": 64}})", 1,
       "t.json:1: $.model.type: expected one of \"gpt2\", \"llama\", \"mixtral\", got \"mamba\""},
      {"{" + mb + R"("model": {"n_layer": 4, "n_head": 4, "n_embd": 128, "vocab_size": 256, "padded_vocab_size": 200, "seq_len": 64}})", 1,
       "t.json:1: $.model.padded_vocab_size: must be >= vocab_size (256), got 200"},
      {"{" + mb + model + R"(, "tensor_parallel": {"size": 8}})", 8,
       "t.json:1: $.model.n_head: n_head (4) must be divisible by tensor_parallel.size (8)"},
      {"{" + mb + R"("model": {"n_layer": 4, "n_head": 5, "n_embd": 320, "vocab_size": 50257, "seq_len": 64}, "tensor_parallel": {"size": 5}})",
       5, "t.json:1: $.model.padded_vocab_size: padded_vocab_size (50304) must be divisible by "
          "tensor_parallel.size (5); set model.padded_vocab_size to a multiple of 5"},
      {"{" + mb + model + R"(, "pipeline": {"stages": 8}})", 8,
       "t.json:1: $.pipeline.stages: pipeline.stages (8) must not exceed model.n_layer (4)"},
      {"{" + mb + R"("data": {"val": "v.bin"}})", 1,
       "t.json:1: $.data: missing required key \"train\" (the training token file)"},
      {"{" + mb + R"("data": {"train": ""}})", 1,
       "t.json:1: $.data.train: expected a token file path or glob (a non-empty string), got \"\""},
      {"{" + mb + R"("data": {"train": 7}})", 1,
       "t.json:1: $.data.train: expected a token file path or glob (a non-empty string), got 7"},
      {"{" + mb + R"("data": {"train": ["a.bin", 3]}})", 1,
       "t.json:1: $.data.train[1]: expected a token file path or glob (a non-empty string), got 3"},
      {"{" + mb + R"("data": {"train": []}})", 1,
       "t.json:1: $.data.train: expected at least one token file path or glob, got []"},
      // Downstream evaluation and the run's tokenizer.
      {"{" + mb + R"("training": {"eval_interval": 5, "eval_tasks": {"task": "hellaswag"}}})", 1,
       "t.json:1: $.training.eval_tasks: expected a list of {\"task\", \"data\", \"limit\"} objects, got "
       "{\"task\":\"hellaswag\"}"},
      {"{" + mb + R"("training": {"eval_interval": 5, "eval_tasks": ["hellaswag"]}})", 1,
       "t.json:1: $.training.eval_tasks[0]: expected an object {\"task\", \"data\", \"limit\"}, got \"hellaswag\""},
      {"{" + mb + R"("training": {"eval_interval": 5, "eval_tasks": [{"data": "h.jsonl"}]}})", 1,
       "t.json:1: $.training.eval_tasks[0]: missing \"task\" (hellaswag or lambada)"},
      {"{" + mb + R"("training": {"eval_interval": 5, "eval_tasks": [{"task": "hellaswag"}]}})", 1,
       "t.json:1: $.training.eval_tasks[0]: missing \"data\" (the task's jsonl file)"},
      {"{" + mb + R"("training": {"eval_interval": 5, "eval_tasks": [{"task": "mmlu", "data": "m.jsonl"}]}})", 1,
       "t.json:1: $.training.eval_tasks[0].task: expected one of \"hellaswag\", \"lambada\", got \"mmlu\""},
      {"{" + mb + R"("training": {"eval_interval": 5, "eval_tasks": [{"task": "lambada", "data": "l.jsonl", "limit": -1}]}})", 1,
       "t.json:1: $.training.eval_tasks[0].limit: expected an integer >= 0, got -1"},
      {"{" + mb + R"("training": {"eval_tasks": [{"task": "lambada", "data": "l.jsonl"}]}})", 1,
       "t.json:1: $.training.eval_tasks: eval_tasks run every training.eval_interval steps: set eval_interval > 0"},
      {"{" + mb + R"("data": {"train": "t.bin", "tokenizer": {"path": "tok"}}})", 1,
       "t.json:1: $.data.tokenizer: missing \"kind\" (byte, gpt2, hf, sentencepiece or llmc)"},
      {"{" + mb + R"("data": {"train": "t.bin", "tokenizer": {"kind": "tiktoken", "path": "tok"}}})", 1,
       "t.json:1: $.data.tokenizer.kind: expected one of \"byte\", \"gpt2\", \"hf\", \"sentencepiece\", \"llmc\", "
       "got \"tiktoken\""},
      {"{" + mb + R"("data": {"train": "t.bin", "tokenizer": {"kind": "gpt2"}}})", 1,
       "t.json:1: $.data.tokenizer.path: the gpt2 tokenizer needs its files: the vocabulary directory (vocab.json + "
       "merges.txt)"},
      {"{" + mb + R"("data": {"train": "t.bin"}, "training": {"eval_interval": 10}})", 1,
       "t.json:1: $.training.eval_interval: eval_interval 10 needs data.val (a validation token file) or training.eval_tasks"},
      // Weighted blends: a list of {"path", "weight"} objects.
      {"{" + mb + R"("data": {"train": [{"path": "a.bin", "weight": 1}, "b.bin"]}})", 1,
       "t.json:1: $.data.train[1]: expected a {\"path\": GLOB, \"weight\": W} object like $.data.train[0] (a "
       "list is all objects, or all paths), got \"b.bin\""},
      {"{" + mb + R"("data": {"train": ["a.bin", {"path": "b.bin", "weight": 1}]}})", 1,
       "t.json:1: $.data.train[1]: expected a token file path or glob like $.data.train[0] (a list is all paths, "
       "or all {\"path\", \"weight\"} objects), got {\"path\":\"b.bin\",\"weight\":1}"},
      {"{" + mb + R"("data": {"train": [{"path": "a.bin", "weight": 1}, {"weight": 1}]}})", 1,
       "t.json:1: $.data.train[1]: missing required key \"path\" (the source's token file path or glob)"},
      {"{" + mb + R"("data": {"train": [{"path": "a.bin"}]}})", 1,
       "t.json:1: $.data.train[0]: missing required key \"weight\" (the source's share, a number >= 0)"},
      {"{" + mb + R"("data": {"train": [{"path": "a.bin", "weight": "0.5"}]}})", 1,
       "t.json:1: $.data.train[0].weight: expected a finite number >= 0, got \"0.5\""},
      {"{" + mb + R"("data": {"train": [{"path": "a.bin", "weight": 1}, {"path": "b.bin", "weight": -0.5}]}})", 1,
       "t.json:1: $.data.train[1].weight: expected a finite number >= 0, got -0.5"},
      {"{" + mb + R"("data": {"train": [{"path": "", "weight": 1}]}})", 1,
       "t.json:1: $.data.train[0].path: expected a token file path or glob (a non-empty string), got \"\""},
      {"{" + mb + R"("data": {"train": [{"path": "a.bin", "weight": 1, "wieght": 2}]}})", 1,
       "t.json:1: $.data.train[0].wieght: unknown key (did you mean \"weight\"?)"},
      {"{" + mb + R"("data": {"train": [{"path": "a.bin", "weight": 1, "epochs": 2}]}})", 1,
       "t.json:1: $.data.train[0].epochs: unknown key (known keys here: path, weight)"},
      {"{" + mb + R"("data": {"train": [{"path": "a.bin", "weight": 0}, {"path": "b.bin", "weight": 0}]}})", 1,
       "t.json:1: $.data.train: the weights of the 2 sources sum to 0; give at least one a positive weight"},
      {"{" + mb + R"("data": {"train": "t.bin", "val": [{"path": "v.bin", "weight": 0}]}})", 1,
       "t.json:1: $.data.val: the weights of the 1 sources sum to 0; give at least one a positive weight"},
      {"{" + mb + R"("data": {"train": [{"path": "a.bin", "weight": 1e999}]}})", 1,
       "t.json:1:86: number 1e999 is out of range"},  // inf never reaches a weight
      {"{" + mb + R"("training": {"checkpoint_interval": 100}})", 1,
       "t.json:1: $.training.checkpoint_interval: checkpoint_interval 100 needs training.checkpoint_dir"},
      {"{" + mb + R"("training": {"device": "tpu"}})", 1,
       "t.json:1: $.training.device: expected one of \"cpu\", \"cuda\", got \"tpu\""},
      {"{" + mb + R"("training": {"comm_timeout": 0}})", 1,
       "t.json:1: $.training.comm_timeout: expected a number > 0, got 0"},
      {"{" + mb + R"("training": {"seed": -1}})", 1,
       "t.json:1: $.training.seed: expected an integer 0-18446744073709551615, got -1"},
      {"{" + mb + R"("training": {"steps": 0}})", 1,
       "t.json:1: $.training.steps: expected an integer >= 1, got 0"},
      {"{" + mb + R"("train_micro_batch_size_per_gpu": 4})", 1,
       "t.json:1: $.train_micro_batch_size_per_gpu: duplicate key \"train_micro_batch_size_per_gpu\" "
       "(first at line 1)"},
  };
  for (const auto& c : cases) {
    auto errors = errors_of(c.json, c.world);
    ASSERT_EQ(errors.size(), 1u) << c.json << "\n  got: "
                                 << (errors.empty() ? "(valid)" : errors[0] + " ... +" +
                                                                       std::to_string(errors.size() - 1));
    EXPECT_EQ(errors[0], c.error) << c.json;
  }
}

TEST(JobConfig, EveryErrorIsReportedWithItsLine) {
  const std::string text = R"({
  "train_batch_size": 30,
  "train_micro_batch_size_per_gpu": 4,
  "zero_optimization": {
    "stage": 5,
    "overlap_com": true
  },
  "optimizer": {"type": "SGD"},
  "train_micro_batch_size_per_gpu": 4
})";
  auto errors = errors_of(text, 2);
  ASSERT_EQ(errors.size(), 5u);
  EXPECT_EQ(errors[0], "t.json:9: $.train_micro_batch_size_per_gpu: duplicate key "
                       "\"train_micro_batch_size_per_gpu\" (first at line 3)");
  EXPECT_EQ(errors[1], "t.json:5: $.zero_optimization.stage: expected an integer 0-3, got 5");
  EXPECT_EQ(errors[2], "t.json:6: $.zero_optimization.overlap_com: unknown key (did you mean \"overlap_comm\"?)");
  EXPECT_EQ(errors[3], "t.json:8: $.optimizer.type: expected one of \"Adam\", \"AdamW\", \"Lamb\", \"Adagrad\", "
                       "\"Lion\", \"OneBitAdam\", \"ZeroOneAdam\", \"OneBitLamb\", got \"SGD\"");
  EXPECT_EQ(errors[4], "t.json:2: $.train_batch_size: 30 is not divisible by "
                       "train_micro_batch_size_per_gpu x data-parallel size = 4 x 2 = 8, so "
                       "gradient_accumulation_steps cannot be derived");
  try {
    parse_job_config(text, "t.json", 2);
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_EQ(std::string(e.what()).rfind("5 errors in t.json:\n  t.json:9: ", 0), 0u) << e.what();
  }
}

TEST(JobConfig, BatchTriadResolvesAsDeepSpeed) {
  struct Case {
    int64_t tbs, mbs, gas;  // 0 = absent
    int world, tp, pp;
    int64_t want_tbs, want_mbs, want_gas;  // when valid
    std::string error;                     // else: the error after "t.json:1: "
  };
  const std::vector<Case> cases = {
      {32, 4, 0, 1, 1, 1, 32, 4, 8, ""},
      {32, 4, 0, 2, 1, 1, 32, 4, 4, ""},
      {32, 0, 2, 4, 1, 1, 32, 4, 2, ""},
      {0, 4, 2, 4, 1, 1, 32, 4, 2, ""},
      {32, 0, 0, 4, 1, 1, 32, 8, 1, ""},
      {0, 4, 0, 4, 1, 1, 16, 4, 1, ""},
      {32, 4, 2, 4, 1, 1, 32, 4, 2, ""},
      {0, 4, 2, 8, 2, 2, 16, 4, 2, ""},  // dp = 8 / (2 x 2) = 2
      {16, 4, 2, 8, 2, 2, 16, 4, 2, ""},
      {32, 4, 2, 2, 1, 1, 0, 0, 0,
       "$.train_batch_size: 32 != train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
       "data-parallel size = 4 x 2 x 2 = 16"},
      {30, 4, 0, 2, 1, 1, 0, 0, 0,
       "$.train_batch_size: 30 is not divisible by train_micro_batch_size_per_gpu x data-parallel "
       "size = 4 x 2 = 8, so gradient_accumulation_steps cannot be derived"},
      {4, 4, 0, 2, 1, 1, 0, 0, 0,
       "$.train_batch_size: 4 is not divisible by train_micro_batch_size_per_gpu x data-parallel "
       "size = 4 x 2 = 8, so gradient_accumulation_steps cannot be derived"},
      {30, 0, 4, 1, 1, 1, 0, 0, 0,
       "$.train_batch_size: 30 is not divisible by gradient_accumulation_steps x data-parallel "
       "size = 4 x 1 = 4, so train_micro_batch_size_per_gpu cannot be derived"},
      {33, 0, 0, 2, 1, 1, 0, 0, 0,
       "$.train_batch_size: 33 is not divisible by the data-parallel size 2, so "
       "train_micro_batch_size_per_gpu cannot be derived (gradient_accumulation_steps defaults to 1)"},
      {0, 0, 4, 1, 1, 1, 0, 0, 0,
       "$: either train_batch_size or train_micro_batch_size_per_gpu must be given (as in DeepSpeed)"},
      {0, 0, 0, 1, 1, 1, 0, 0, 0,
       "$: either train_batch_size or train_micro_batch_size_per_gpu must be given (as in DeepSpeed)"},
  };
  for (const auto& c : cases) {
    nlohmann::json j = nlohmann::json::object();
    if (c.tbs) j["train_batch_size"] = c.tbs;
    if (c.mbs) j["train_micro_batch_size_per_gpu"] = c.mbs;
    if (c.gas) j["gradient_accumulation_steps"] = c.gas;
    j["tensor_parallel"] = {{"size", c.tp}};
    j["pipeline"] = {{"stages", c.pp}};
    std::string text = j.dump();
    if (c.error.empty()) {
      JobConfig cfg = parse_job_config(text, "t.json", c.world);
      EXPECT_EQ(cfg.train_batch_size, c.want_tbs) << text << " world " << c.world;
      EXPECT_EQ(cfg.train_micro_batch_size_per_gpu, c.want_mbs) << text << " world " << c.world;
      EXPECT_EQ(cfg.gradient_accumulation_steps, c.want_gas) << text << " world " << c.world;
      EXPECT_EQ(cfg.train_batch_size,
                cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps *
                    cfg.data_parallel_size);
      EXPECT_EQ(cfg.data_parallel_size, c.world / (c.tp * c.pp));
      EXPECT_EQ(cfg.world_size, c.world);
    } else {
      auto errors = errors_of(text, c.world);
      ASSERT_EQ(errors.size(), 1u) << text;
      EXPECT_EQ(errors[0], "t.json:1: " + c.error) << text;
    }
  }
}

TEST(JobConfig, DefaultsAreFilledIn) {
  JobConfig c = parse_job_config(kMin, "t.json", 4);
  EXPECT_EQ(c.path, "t.json");
  EXPECT_EQ(c.world_size, 4);
  EXPECT_EQ(c.data_parallel_size, 4);
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 2);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_EQ(c.gradient_clipping, 0);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 0);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_EQ(c.fp16.min_loss_scale, 1);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_TRUE(c.zero.contiguous_gradients);
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_TRUE(c.zero.reduce_scatter);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero.allgather_bucket_size, 500000000);
  EXPECT_EQ(c.zero.offload_optimizer.device, "none");
  EXPECT_EQ(c.zero.offload_param.device, "none");
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 50000000);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 100000);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 1000000000);
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_EQ(c.optimizer.lr, 1e-3);
  EXPECT_EQ(c.optimizer.beta1, 0.9);
  EXPECT_EQ(c.optimizer.beta2, 0.999);
  EXPECT_EQ(c.optimizer.eps, 1e-8);
  EXPECT_EQ(c.optimizer.weight_decay, 0.01);
  EXPECT_TRUE(c.optimizer.adam_w_mode);
  EXPECT_EQ(c.scheduler.type, "");
  EXPECT_FALSE(c.activation_checkpointing.enabled);
  EXPECT_EQ(c.pipeline.stages, 1);
  EXPECT_EQ(c.pipeline.partition, layout::StageSplit::kParameters);
  EXPECT_EQ(c.pipeline.schedule, layout::PipelineSchedule::k1F1B);
  EXPECT_EQ(c.tensor_parallel.size, 1);
  EXPECT_FALSE(c.has_model);
  EXPECT_FALSE(c.has_data);
  EXPECT_EQ(c.training.steps, 0);
  EXPECT_EQ(c.training.seed, 1337u);
  EXPECT_EQ(c.training.eval_interval, 0);
  EXPECT_EQ(c.training.eval_steps, 20);
  EXPECT_EQ(c.training.log_interval, 1);
  EXPECT_EQ(c.training.checkpoint_interval, 0);
  EXPECT_EQ(c.training.keep_last, 0);
  EXPECT_FALSE(c.training.checkpoint_async);
  EXPECT_EQ(c.training.device, "cpu");
  EXPECT_EQ(c.training.comm_timeout, 60);
  EXPECT_TRUE(c.warnings.empty());

  auto j = c.to_json();
  EXPECT_EQ(j["train_batch_size"], 8);
  EXPECT_EQ(j["zero_optimization"]["offload_param"]["device"], "none");
  EXPECT_EQ(j["optimizer"]["params"]["betas"], nlohmann::json::array({0.9, 0.999}));
  EXPECT_TRUE(j["scheduler"].is_null());
  EXPECT_TRUE(j["model"].is_null());
  EXPECT_TRUE(j["data"].is_null());
  EXPECT_TRUE(j["training"]["steps"].is_null());
  EXPECT_TRUE(j["training"]["checkpoint_dir"].is_null());
  // Gradients default to the storage type (fp32 here).
  EXPECT_EQ(j["data_types"]["grad_accum_dtype"], "fp32");
  EXPECT_EQ(j["communication_data_type"], "fp32");
  EXPECT_EQ(j["wall_clock_breakdown"], false);
  EXPECT_EQ(j["training"]["peak_tflops"], 0.0);
  EXPECT_EQ(j["tensorboard"]["enabled"], false);
  EXPECT_EQ(j["csv_monitor"]["job_name"], "DeepSpeedJobName");
  EXPECT_EQ(j["context_parallel"].dump(), R"({"size":1,"method":"ring"})");
  EXPECT_EQ(j["expert_parallel"].dump(), R"({"size":1})");
  EXPECT_TRUE(j["lora"].is_null());
  EXPECT_EQ(j.size(), 25u);
}

// data_types.grad_accum_dtype and communication_data_type: one gradient type, the storage type by
// default, fp32 on request; DeepSpeed's dtype names.
TEST(JobConfig, GradientTypesDefaultToTheStorageTypeAndAgree) {
  auto with = [](const std::string& extra) {
    return parse_job_config(R"({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true})" + extra + "}", "t.json", 1);
  };
  EXPECT_EQ(with("").gradient_dtype(), layout::Precision::kBf16);
  EXPECT_EQ(with(R"(, "data_types": {"grad_accum_dtype": "fp32"})").gradient_dtype(), layout::Precision::kFp32);
  EXPECT_EQ(with(R"(, "communication_data_type": "float32")").gradient_dtype(), layout::Precision::kFp32);
  EXPECT_EQ(with(R"(, "communication_data_type": "BF16")").gradient_dtype(), layout::Precision::kBf16);
  EXPECT_EQ(with(R"(, "communication_data_type": null)").gradient_dtype(), layout::Precision::kBf16);
  EXPECT_EQ(errors_of(R"({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true},
    "data_types": {"grad_accum_dtype": "fp32"}, "communication_data_type": "bf16"})"),
            std::vector<std::string>{"t.json:2: $.communication_data_type: bf16 differs from "
                                     "data_types.grad_accum_dtype fp32: dstrain accumulates and reduces gradients "
                                     "in one type; give one of the two, or the same value"});
  EXPECT_EQ(errors_of(R"({"train_micro_batch_size_per_gpu": 2, "data_types": {"grad_accum_dtype": "bf16"}})"),
            std::vector<std::string>{"t.json:1: $.data_types.grad_accum_dtype: bf16 gradients with fp32 storage: "
                                     "gradients are kept in the storage type or in fp32"});
  EXPECT_EQ(errors_of(R"({"train_micro_batch_size_per_gpu": 2, "data_types": {"grad_acum_dtype": "fp32"}})").size(), 1u);
}

TEST(JobConfig, ResolvedValuesFollowDeepSpeed) {
  // overlap_comm defaults to true for ZeRO stage 3 only.
  EXPECT_TRUE(parse_job_config(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3}})", "", 1)
                  .zero.overlap_comm);
  EXPECT_FALSE(parse_job_config(
                   R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "overlap_comm": false}})", "", 1)
                   .zero.overlap_comm);
  // "Adam" is AdamW unless adam_w_mode is false; "AdamW" always is.
  auto adam = parse_job_config(R"({"train_batch_size": 8, "optimizer": {"type": "adam"}})", "", 1);
  EXPECT_EQ(adam.optimizer.type, "Adam");
  EXPECT_TRUE(adam.optimizer.adam_w_mode);
  auto l2 = parse_job_config(
      R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})", "", 1);
  EXPECT_FALSE(l2.optimizer.adam_w_mode);
  auto adamw = parse_job_config(
      R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})", "t.json", 1);
  EXPECT_TRUE(adamw.optimizer.adam_w_mode);
  ASSERT_EQ(adamw.warnings.size(), 1u);
  EXPECT_EQ(adamw.warnings[0].rfind("t.json:1: $.optimizer.params.adam_w_mode: ignored: \"AdamW\"", 0), 0u);
  // WarmupLR's peak defaults to the optimizer's lr (current DeepSpeed); WarmupDecayLR's to 0.001.
  auto wl = parse_job_config(
      R"({"train_batch_size": 8, "optimizer": {"params": {"lr": 0.0006}}, "scheduler": {"type": "WarmupLR"}})", "", 1);
  EXPECT_EQ(wl.scheduler.type, "WarmupLR");
  EXPECT_EQ(wl.scheduler.warmup_max_lr, 0.0006);
  EXPECT_EQ(wl.scheduler.warmup_min_lr, 0);
  EXPECT_EQ(wl.scheduler.warmup_num_steps, 1000);
  EXPECT_EQ(wl.scheduler.warmup_type, "log");
  auto wd = parse_job_config(
      R"({"train_batch_size": 8, "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 5000}}})", "", 1);
  EXPECT_EQ(wd.scheduler.warmup_max_lr, 0.001);
  EXPECT_EQ(wd.scheduler.total_num_steps, 5000);
  // WarmupCosineLR takes total_num_steps from training.steps when absent.
  auto wc = parse_job_config(
      R"({"train_batch_size": 8, "scheduler": {"type": "WarmupCosineLR"}, "training": {"steps": 300}})", "", 1);
  EXPECT_EQ(wc.scheduler.total_num_steps, 300);
  EXPECT_EQ(wc.scheduler.warmup_min_ratio, 0);
  EXPECT_EQ(wc.scheduler.cos_min_ratio, 0.0001);
  // Sizes written as floats, as DeepSpeed configs do.
  auto z = parse_job_config(R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 2e8}})", "", 1);
  EXPECT_EQ(z.zero.reduce_bucket_size, 200000000);
  // padded_vocab_size: rounded up to a multiple of 128 when absent.
  const char* gpt2 = R"({"train_batch_size": 8, "model": {"n_layer": 12, "n_head": 12, "n_embd": 768,
      "vocab_size": 50257, "seq_len": 1024}})";
  EXPECT_EQ(parse_job_config(gpt2, "", 1).model.shape.padded_vocab_size, 50304);
  EXPECT_EQ(parse_job_config(gpt2, "", 1).model.type, "gpt2");
  // DeepSpeed's tensor_parallel.autotp_size is read as size (0 = off).
  EXPECT_EQ(parse_job_config(R"({"train_batch_size": 8, "tensor_parallel": {"autotp_size": 2}})", "", 2)
                .tensor_parallel.size, 2);
  EXPECT_EQ(parse_job_config(R"({"train_batch_size": 8, "tensor_parallel": {"autotp_size": 0}})", "", 2)
                .tensor_parallel.size, 1);
}

TEST(JobConfig, EveryDeepSpeedOptimizerTypeReadsWithItsDefaultsAndRoundTrips) {
  auto parse = [](const std::string& opt) {
    return parse_job_config(R"({"train_batch_size": 8, "optimizer": )" + opt + "}", "t.json", 1);
  };
  const auto adagrad = parse(R"({"type": "adagrad"})");
  EXPECT_EQ(adagrad.optimizer.type, "Adagrad");
  EXPECT_EQ(adagrad.optimizer.lr, 1e-2);  // DeepSpeedCPUAdagrad's defaults
  EXPECT_EQ(adagrad.optimizer.eps, 1e-10);
  EXPECT_EQ(adagrad.optimizer.weight_decay, 0);
  const auto lamb = parse(R"({"type": "Lamb", "params": {"lr": 1e-3, "bias_correction": false, "max_coeff": 0.3,
                            "min_coeff": 0.01, "max_grad_norm": 1.0}})");
  EXPECT_FALSE(lamb.optimizer.bias_correction);
  EXPECT_EQ(lamb.optimizer.max_coeff, 0.3);
  ASSERT_EQ(lamb.warnings.size(), 1u);  // max_grad_norm: accepted, not acted on
  EXPECT_NE(lamb.warnings[0].find("$.optimizer.params.max_grad_norm"), std::string::npos);
  // DeepSpeedExamples' spellings of the 1-bit ones, with their communication keys accepted.
  const auto onebit = parse(R"({"type": "OnebitAdam", "params": {"lr": 4e-4, "freeze_step": 23000,
                              "cuda_aware": false, "comm_backend_name": "nccl"}})");
  EXPECT_EQ(onebit.optimizer.type, "OneBitAdam");
  EXPECT_EQ(onebit.optimizer.freeze_step, 23000);
  EXPECT_TRUE(onebit.optimizer.onebit());
  const auto zo = parse(R"({"type": "ZeroOneAdam", "params": {"var_freeze_step": 100, "local_step_clipper": 8}})");
  EXPECT_EQ(zo.optimizer.var_freeze_step, 100);
  EXPECT_EQ(zo.optimizer.local_step_clipper, 8);
  EXPECT_EQ(zo.optimizer.var_update_scaler, 16);
  const auto ol = parse(R"({"type": "OnebitLamb", "params": {"coeff_beta": 0.8, "factor_max": 3.0}})");
  EXPECT_EQ(ol.optimizer.type, "OneBitLamb");
  EXPECT_EQ(ol.optimizer.coeff_beta, 0.8);
  const auto lion = parse(R"({"type": "Lion", "params": {"betas": [0.95, 0.98]}})");
  EXPECT_EQ(lion.optimizer.beta1, 0.95);
  for (const auto* c : {&adagrad, &lamb, &onebit, &zo, &ol, &lion}) {
    const auto back = parse_job_config(c->to_json().dump(), "", 1);
    EXPECT_EQ(back.to_json(), c->to_json()) << c->optimizer.type;
  }
}

TEST(JobConfig, SkipSpikesIsABoolOrItsThresholdAndWindow) {
  auto parse = [](const std::string& v) {
    return parse_job_config(R"({"train_batch_size": 8, "training": {"skip_spikes": )" + v + "}}", "t.json", 1);
  };
  EXPECT_FALSE(parse_job_config(R"({"train_batch_size": 8})", "", 1).training.skip_spikes.enabled);
  const auto on = parse("true");
  EXPECT_TRUE(on.training.skip_spikes.enabled);
  EXPECT_EQ(on.training.skip_spikes.threshold, 5.0);
  EXPECT_EQ(on.training.skip_spikes.window, 128);
  const auto set = parse(R"({"threshold": 3.5, "window": 32})");
  EXPECT_TRUE(set.training.skip_spikes.enabled);
  EXPECT_EQ(set.training.skip_spikes.threshold, 3.5);
  EXPECT_EQ(set.training.skip_spikes.window, 32);
  EXPECT_EQ(parse_job_config(set.to_json().dump(), "", 1).to_json(), set.to_json());
  EXPECT_EQ(errors_of(R"({"train_batch_size": 8, "training": {"skip_spikes": {"window": 1}}})", 1),
            std::vector<std::string>{"t.json:1: $.training.skip_spikes.window: expected an integer 2-1000000, got 1"});
  EXPECT_EQ(errors_of(R"({"train_batch_size": 8, "training": {"skip_spikes": 5}})", 1),
            std::vector<std::string>{"t.json:1: $.training.skip_spikes: expected true, false or {\"threshold\": K, "
                                     "\"window\": N}, got 5"});
}

TEST(JobConfig, CheckpointAsyncIsABoolThatNeedsACheckpointDir) {
  const auto on = parse_job_config(
      R"({"train_batch_size": 8, "training": {"checkpoint_dir": "ck", "checkpoint_interval": 5, "checkpoint_async": true}})",
      "t.json", 1);
  EXPECT_TRUE(on.training.checkpoint_async);
  EXPECT_TRUE(on.warnings.empty());
  EXPECT_EQ(on.to_json()["training"]["checkpoint_async"], true);
  EXPECT_EQ(parse_job_config(on.to_json().dump(), "", 1).to_json(), on.to_json());
  const auto alone = parse_job_config(R"({"train_batch_size": 8, "training": {"checkpoint_async": true}})", "t.json", 1);
  ASSERT_EQ(alone.warnings.size(), 1u);
  EXPECT_NE(alone.warnings[0].find("$.training.checkpoint_async: checkpoint_async does nothing without "
                                   "training.checkpoint_dir"),
            std::string::npos)
      << alone.warnings[0];
  const auto errs = errors_of(R"({"train_batch_size": 8, "training": {"checkpoint_async": "yes"}})", 1);
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_EQ(errs[0].rfind("t.json:1: $.training.checkpoint_async: expected", 0), 0u) << errs[0];
}

TEST(JobConfig, TheStepSyncOptionsAreBools) {
  const auto def = parse_job_config(R"({"train_batch_size": 8})", "t.json", 1);
  EXPECT_TRUE(def.training.sync_loss_once);
  EXPECT_TRUE(def.training.sync_norm_once);
  const auto off = parse_job_config(
      R"({"train_batch_size": 8, "training": {"sync_loss_once": false, "sync_norm_once": false}})", "t.json", 1);
  EXPECT_FALSE(off.training.sync_loss_once);
  EXPECT_FALSE(off.training.sync_norm_once);
  EXPECT_EQ(off.to_json()["training"]["sync_norm_once"], false);
  EXPECT_EQ(parse_job_config(off.to_json().dump(), "", 1).to_json(), off.to_json());
  const auto errs = errors_of(R"({"train_batch_size": 8, "training": {"sync_loss_once": 1}})", 1);
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_EQ(errs[0].rfind("t.json:1: $.training.sync_loss_once: expected", 0), 0u) << errs[0];
}

// training.cuda_graph: a bool, and refused by name where a graph of the step cannot hold it.
TEST(JobConfig, TheCudaGraphIsOneGpuRankWithoutHostWorkInTheMicroBatch) {
  const auto on = parse_job_config(R"({"train_batch_size": 8, "training": {"device": "cuda", "cuda_graph": true}})",
                                   "t.json", 1);
  EXPECT_TRUE(on.training.cuda_graph);
  EXPECT_FALSE(parse_job_config(R"({"train_batch_size": 8})", "t.json", 1).training.cuda_graph);
  EXPECT_EQ(parse_job_config(on.to_json().dump(), "", 1).to_json(), on.to_json());
  auto only = [](const std::string& text, int world) {
    const auto errs = errors_of(text, world);
    EXPECT_EQ(errs.size(), 1u) << text;
    return errs.empty() ? std::string() : errs[0];
  };
  const std::string prefix = "t.json:1: $.training.cuda_graph: a CUDA graph of the step: ";
  EXPECT_EQ(only(R"({"train_batch_size": 8, "training": {"cuda_graph": true}})", 1),
            prefix + "it needs training.device \"cuda\" (it is \"cpu\")");
  EXPECT_EQ(only(R"({"train_batch_size": 8, "training": {"device": "cuda", "cuda_graph": true}})", 2),
            prefix + "one rank only (the world has 2): with more, the micro-batch waits on collectives that other "
                     "ranks join, which no graph of one rank can hold");
  EXPECT_EQ(only(R"({"train_batch_size": 8, "training": {"device": "cuda", "cuda_graph": true},
      "model": {"type": "mixtral", "n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "seq_len": 64,
                "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 128}})", 1)
                .rfind("t.json:1: $.training.cuda_graph: a CUDA graph of the step: not with a mixture of experts", 0),
            0u);
  EXPECT_EQ(only(R"({"train_batch_size": 8, "training": {"device": "cuda", "cuda_graph": true},
      "model": {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "seq_len": 64},
      "lora": {"r": 4, "dropout": 0.1, "target_modules": "all-linear"}})", 1),
            prefix + "not with lora.dropout 0.1: dropout's keys change every step");
  EXPECT_EQ(only(R"({"train_batch_size": 8, "training": {"device": "cuda", "cuda_graph": true},
      "data": {"train": "t.bin", "packing": "document", "document_token": 3}})", 1),
            prefix + "not with data.packing \"document\": the document starts are found on the host from each "
                     "micro-batch's tokens");
  EXPECT_EQ(only(R"({"train_batch_size": 8, "training": {"cuda_graph": "yes"}})", 1)
                .rfind("t.json:1: $.training.cuda_graph: expected", 0),
            0u);
}

TEST(JobConfig, DeepSpeedKeysWeDoNotActOnAreWarnings) {
  const std::string text = R"({
  "train_batch_size": 16,
  "wall_clock_breakdown": false,
  "flops_profiler": {"enabled": true, "profile_step": 1},
  "tensorboard": {"enabled": true, "output_path": "tb/"},
  "bfloat16": {"enabled": true},
  "zero_optimization": {"stage": 1, "allgather_partitions": true, "offload_param": {"device": "cpu"}},
  "activation_checkpointing": {"partition_activations": true},
  "checkpoint": {"tag_validation": "Warn"},
  "pipeline": {"stages": "auto", "seed_layers": false},
  "scheduler": {"type": "WarmupLR", "params": {"last_batch_iteration": -1}}
})";
  JobConfig c = parse_job_config(text, "ds.json", 2);
  const std::vector<std::string> want = {
      "ds.json:6: $.bfloat16: old DeepSpeed name for \"bf16\"; read as \"bf16\"",
      "ds.json:7: $.zero_optimization.allgather_partitions: DeepSpeed key accepted but not acted on by dstrain",
      "ds.json:7: $.zero_optimization.offload_param: ignored with ZeRO stage 1 (parameter offload "
      "needs stage 3, as in DeepSpeed)",
      "ds.json:8: $.activation_checkpointing.partition_activations: DeepSpeed key accepted but not "
      "acted on by dstrain",
      "ds.json:10: $.pipeline.stages: DeepSpeed's \"auto\" read as 1 (dstrain needs an explicit stage count)",
      "ds.json:10: $.pipeline.seed_layers: DeepSpeed key accepted but not acted on by dstrain",
      "ds.json:9: $.checkpoint.tag_validation: DeepSpeed key accepted but not acted on by dstrain",
      "ds.json:11: $.scheduler.params.last_batch_iteration: DeepSpeed key accepted but not acted on "
      "by dstrain (resuming restores the step from the checkpoint)",
      "ds.json:4: $.flops_profiler: DeepSpeed key accepted but not acted on by dstrain",
  };
  EXPECT_EQ(c.warnings, want);
  // Read: dstrain acts on them.
  EXPECT_FALSE(c.wall_clock_breakdown);
  EXPECT_TRUE(c.tensorboard.enabled);
  EXPECT_EQ(c.tensorboard.output_path, "tb/");  // against the config's directory (none here)
  EXPECT_EQ(c.tensorboard.job_name, "DeepSpeedJobName");
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_EQ(c.zero.offload_param.device, "none");
  EXPECT_EQ(c.pipeline.stages, 1);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
}

// DeepSpeed's tests/torch_compile configs (until 2026) carried fp16's loss-scaling keys inside bf16;
// DeepSpeed <= 0.17.0 ignored them: warnings here. Any other unknown bf16 key stays an error.
// DeepSpeed ignores a key it does not know; so does dstrain in DeepSpeed's sections, with a
// warning naming its path. A probable typo (a known key two edits away or less), an unknown key in
// dstrain's own sections, and any unknown key under --strict stay errors.
TEST(JobConfig, UnknownDeepSpeedKeysAreWarningsUnlessTyposOrStrict) {
  const std::string text = R"({
  "train_micro_batch_size_per_gpu": 2,
  "cuda_visible_devices": "0,1",
  "optimizer": {"type": "AdamW", "my_fusion": true},
  "activation_checkpointing": {"xyzzy": true}
})";
  JobConfig c = parse_job_config(text, "w.json", 1);
  const std::vector<std::string> want = {
      "w.json:4: $.optimizer.my_fusion: unknown key, ignored as DeepSpeed "
      "ignores it (an error with --strict)",
      "w.json:5: $.activation_checkpointing.xyzzy: unknown key, ignored as DeepSpeed ignores it "
      "(an error with --strict)",
      "w.json:3: $.cuda_visible_devices: unknown key, ignored as DeepSpeed ignores it (an error "
      "with --strict)",
  };
  EXPECT_EQ(c.warnings, want);
  // Where DeepSpeed's pydantic models forbid extra keys (zero_optimization, fp16, bf16, the
  // monitors) and in the params DeepSpeed passes to a constructor, an unknown key is an error.
  EXPECT_EQ(errors_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 1, "my_bucket_tuning": true}})"),
            std::vector<std::string>{"t.json:1: $.zero_optimization.my_bucket_tuning: unknown key (not a dstrain or "
                                     "DeepSpeed key here; see docs/configuration.md)"});
  EXPECT_EQ(errors_of(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "xyzzy": 1}}})").size(),
            1u);

  ParseOptions strict;
  strict.strict = true;
  try {
    parse_job_config(text, "w.json", 1, strict);
    FAIL() << "--strict accepted unknown keys";
  } catch (const ConfigError& e) {
    const std::vector<std::string> errs = {
        "w.json:4: $.optimizer.my_fusion: unknown key (known keys here: type, params, legacy_fusion)",
        "w.json:5: $.activation_checkpointing.xyzzy: unknown key (known keys here: enabled, mode, "
        "partition_activations, contiguous_memory_optimization, cpu_checkpointing, "
        "number_checkpoints, synchronize_checkpoint_boundary, profile)",
        "w.json:3: $.cuda_visible_devices: unknown key (not a dstrain or DeepSpeed key here; see "
        "docs/configuration.md)",
    };
    EXPECT_EQ(e.errors(), errs);
  }

  // A typo stays an error without --strict; its suggestion is the known key.
  EXPECT_EQ(errors_of(R"({"train_batch_size": 8, "optimizr": {"type": "AdamW"}})"),
            std::vector<std::string>{"t.json:1: $.optimizr: unknown key (did you mean \"optimizer\"?)"});
  // dstrain's own sections are strict: DeepSpeed never reads them.
  EXPECT_EQ(errors_of(R"({"train_batch_size": 8, "data": {"train": "t.bin", "cuda_visible_devices": 1}})"),
            std::vector<std::string>{"t.json:1: $.data.cuda_visible_devices: unknown key (known keys here: "
                                     "train, val, shuffle, packing, document_token, tokenizer)"});
}

// --set KEY=VALUE edits the JSON before validation: values are JSON when they parse, else strings;
// objects on the way are created; a message about a set value names its path and the flag.
TEST(JobConfig, SetOverridesAreAppliedBeforeValidation) {
  const std::string text = R"({
  "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
  "zero_optimization": {"stage": 1}
})";
  ParseOptions o;
  o.sets = {"optimizer.params.lr=3e-4", "zero_optimization.stage=2", "training.steps=100",
            "optimizer.type=Adam", "zero_optimization.offload_optimizer={\"device\": \"cpu\"}",
            "steps_per_print=5"};
  JobConfig c = parse_job_config(text, "s.json", 1, o);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.optimizer.type, "Adam");
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_EQ(c.zero.offload_optimizer.device, "cpu");
  EXPECT_EQ(c.training.steps, 100);
  EXPECT_EQ(c.steps_per_print, 5);

  auto errors_with = [&](std::vector<std::string> sets) {
    ParseOptions p;
    p.sets = std::move(sets);
    try {
      parse_job_config(text, "s.json", 1, p);
    } catch (const ConfigError& e) {
      return e.errors();
    }
    return std::vector<std::string>{};
  };
  EXPECT_EQ(errors_with({"optimizer.params.lr=fast"}),
            std::vector<std::string>{"s.json: $.optimizer.params.lr (from --set optimizer.params.lr=fast): "
                                     "expected a number >= 0, got \"fast\""});
  EXPECT_EQ(errors_with({"zero_optimization.stage.x=1"}),
            std::vector<std::string>{"--set zero_optimization.stage.x=1: $.zero_optimization.stage is 1, "
                                     "not an object, so it has no key \"x\""});
  EXPECT_EQ(errors_with({"optimizer.params.lr"}),
            std::vector<std::string>{"--set optimizer.params.lr: expected KEY=VALUE, KEY a dotted path of "
                                     "keys (optimizer.params.lr=3e-4)"});
  EXPECT_EQ(errors_with({"a..b=1"}).size(), 1u);
}

// Hugging Face's "auto": the batch triad's train_batch_size and gradient_accumulation_steps are
// derived as when absent, gradient_clipping is 1.0, each with a warning saying what it became;
// any other "auto" needs --set, and every unfilled one is named.
TEST(JobConfig, AutoValuesAreDerivedOrNeedSet) {
  JobConfig c = parse_job_config(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": "auto", "gradient_clipping": "auto"})", "a.json", 4);
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  const std::vector<std::string> want = {
      "a.json:2: $.gradient_clipping: \"auto\" -> 1.0: the Hugging Face Trainer's default max_grad_norm",
      "a.json:1: $.train_batch_size: \"auto\" -> 8: train_micro_batch_size_per_gpu x "
      "gradient_accumulation_steps x data-parallel size = 2 x 1 x 4",
      "a.json:2: $.gradient_accumulation_steps: \"auto\" -> 1: without train_batch_size, one "
      "micro-batch per step (as when absent)",
  };
  EXPECT_EQ(c.warnings, want);
  c = parse_job_config(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": "auto"})", "a.json", 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);

  const std::string hf = R"({
  "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                "warmup_num_steps": "auto", "total_num_steps": "auto"}},
  "fp16": {"enabled": "auto"},
  "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}
})";
  try {
    parse_job_config(hf, "hf.json", 1);
    FAIL() << "unfilled \"auto\" accepted";
  } catch (const ConfigError& e) {
    std::string all;
    for (const auto& err : e.errors()) all += err + "\n";
    for (const std::string key : {"fp16.enabled", "zero_optimization.reduce_bucket_size", "optimizer.params.lr",
                                  "optimizer.params.betas", "optimizer.params.eps",
                                  "optimizer.params.weight_decay", "scheduler.params.warmup_min_lr",
                                  "scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps",
                                  "scheduler.params.total_num_steps"}) {
      EXPECT_NE(all.find(": $." + key + ": \"auto\" needs a value: pass --set " + key + "=VALUE\n"),
                std::string::npos) << key << "\n" << all;
    }
    EXPECT_EQ(e.errors().size(), 10u) << all;
  }
  ParseOptions o;
  o.sets = {"optimizer.params.lr=3e-4", "optimizer.params.betas=[0.9, 0.95]", "optimizer.params.eps=1e-8",
            "optimizer.params.weight_decay=0.1", "scheduler.params.warmup_min_lr=0",
            "scheduler.params.warmup_max_lr=3e-4", "scheduler.params.warmup_num_steps=10",
            "scheduler.params.total_num_steps=100", "fp16.enabled=false",
            "zero_optimization.reduce_bucket_size=5e8"};
  c = parse_job_config(hf, "hf.json", 1, o);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.95);
  EXPECT_EQ(c.scheduler.total_num_steps, 100);
  EXPECT_FALSE(c.fp16.enabled);
}

TEST(JobConfig, Fp16LossScalingKeysInsideBf16AreWarnings) {
  JobConfig c = parse_job_config(R"({"train_batch_size": 8,
  "bf16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 500, "hysteresis": 2,
           "min_loss_scale": 1, "initial_scale_power": 15}})", "tc.json", 1);
  ASSERT_EQ(c.warnings.size(), 5u);
  EXPECT_EQ(c.warnings[0], "tc.json:2: $.bf16.loss_scale: fp16's loss-scaling key inside bf16, ignored: bf16 needs "
                           "no loss scaling (DeepSpeed 0.17.0 and older ignore it too; DeepSpeed 0.17.1 and newer "
                           "reject it, so remove it)");
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_EQ(errors_of(R"({"train_batch_size": 8, "bf16": {"enabled": true, "loss_scal": 0}})"),
            std::vector<std::string>{"t.json:1: $.bf16.loss_scal: unknown key (did you mean \"loss_scale\"?)"});
}

TEST(JobConfig, DeprecatedZeroFormsAreReadAsDeepSpeedReadsThem) {
  JobConfig b = parse_job_config(R"({"train_batch_size": 8, "zero_optimization": true})", "t.json", 1);
  EXPECT_EQ(b.zero.stage, 1);
  ASSERT_EQ(b.warnings.size(), 1u);
  EXPECT_EQ(b.warnings[0], "t.json:1: $.zero_optimization: deprecated DeepSpeed form; read as {\"stage\": 1}");
  JobConfig c = parse_job_config(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "cpu_offload": true, "cpu_offload_use_pin_memory": true}})",
      "t.json", 1);
  EXPECT_EQ(c.zero.offload_optimizer.device, "cpu");
  EXPECT_TRUE(c.zero.offload_optimizer.pin_memory);
  EXPECT_EQ(c.warnings.size(), 2u);
}

TEST(JobConfig, RelativePathsAreRelativeToTheConfigFile) {
  const char* text = R"({"train_batch_size": 8,
    "model": {"n_layer": 2, "n_head": 2, "n_embd": 64, "vocab_size": 256, "seq_len": 32, "init_from": "w.bin"},
    "data": {"train": "../data/kjv/train.bin", "val": "/abs/val.bin"},
    "training": {"checkpoint_dir": "ckpt/run1"}})";
  JobConfig c = parse_job_config(text, "configs/x.json", 1);
  using Paths = std::vector<std::string>;
  EXPECT_EQ(c.data.train, Paths{"data/kjv/train.bin"});
  EXPECT_EQ(c.data.val, Paths{"/abs/val.bin"});
  EXPECT_EQ(c.model.init_from, "configs/w.bin");
  EXPECT_EQ(c.training.checkpoint_dir, "configs/ckpt/run1");
  EXPECT_EQ(parse_job_config(text, "/srv/job/x.json", 1).data.train, Paths{"/srv/data/kjv/train.bin"});
  EXPECT_EQ(parse_job_config(text, "x.json", 1).data.train, Paths{"../data/kjv/train.bin"});
  const char* shards = R"({"train_batch_size": 8,
    "data": {"train": ["s/train_*.bin", "/abs/extra.bin"], "val": "s/val_*.bin"}})";
  JobConfig sc = parse_job_config(shards, "configs/x.json", 1);
  EXPECT_EQ(sc.data.train, (Paths{"configs/s/train_*.bin", "/abs/extra.bin"}));
  EXPECT_EQ(sc.data.val, Paths{"configs/s/val_*.bin"});
  EXPECT_EQ(parse_job_config(text, "", 1).model.init_from, "w.bin");
}

// A weighted blend: every path resolved against the config's directory, weights as given; the
// resolved config writes the list of objects back and re-reads to the same config; a blend
// counts as training data (and as validation data for eval_interval).
TEST(JobConfig, EvalTasksAndTokenizerResolveAndRoundTrip) {
  const char* text = R"({"train_batch_size": 8,
    "data": {"train": "t.bin", "tokenizer": {"kind": "gpt2", "path": "gpt2"}},
    "training": {"steps": 10, "eval_interval": 5,
                 "eval_tasks": [{"task": "hellaswag", "data": "hs/val.jsonl", "limit": 100},
                                {"task": "lambada", "data": "/abs/l.jsonl"}]}})";
  JobConfig c = parse_job_config(text, "configs/x.json", 1);
  EXPECT_EQ(c.data.tokenizer_kind, "gpt2");
  EXPECT_EQ(c.data.tokenizer_path, "configs/gpt2");
  ASSERT_EQ(c.training.eval_tasks.size(), 2u);
  EXPECT_EQ(c.training.eval_tasks[0].task, "hellaswag");
  EXPECT_EQ(c.training.eval_tasks[0].data, "configs/hs/val.jsonl");
  EXPECT_EQ(c.training.eval_tasks[0].limit, 100);
  EXPECT_EQ(c.training.eval_tasks[1].data, "/abs/l.jsonl");
  EXPECT_EQ(c.training.eval_tasks[1].limit, 0);
  const auto j = c.to_json();
  EXPECT_EQ(j["data"]["tokenizer"].dump(), R"({"kind":"gpt2","path":"configs/gpt2"})");
  EXPECT_EQ(j["training"]["eval_tasks"].dump(),
            R"([{"task":"hellaswag","data":"configs/hs/val.jsonl","limit":100},)"
            R"({"task":"lambada","data":"/abs/l.jsonl","limit":0}])");
  EXPECT_EQ(parse_job_config(j.dump(), "", 1).to_json(), j);
  // eval_interval with eval_tasks and no data.val is a valid evaluation.
  EXPECT_NO_THROW(parse_job_config(text, "x.json", 1));
}

TEST(JobConfig, BlendsResolveAndRoundTrip) {
  const char* text = R"({"train_batch_size": 8,
    "model": {"n_layer": 2, "n_head": 2, "n_embd": 64, "vocab_size": 256, "seq_len": 32},
    "data": {"train": [{"path": "web/*.bin", "weight": 0.7}, {"path": "/abs/code.bin", "weight": 3},
                       {"weight": 0, "path": "books.bin"}],
             "val": [{"path": "web_val.bin", "weight": 1}]},
    "training": {"steps": 10, "eval_interval": 5}})";
  JobConfig c = parse_job_config(text, "configs/x.json", 1);
  EXPECT_NO_THROW(require_training_sections(c));
  EXPECT_TRUE(c.data.train.empty());
  EXPECT_TRUE(c.data.val.empty());
  ASSERT_EQ(c.data.train_blend.size(), 3u);
  EXPECT_EQ(c.data.train_blend[0].path, "configs/web/*.bin");
  EXPECT_EQ(c.data.train_blend[0].weight, 0.7);
  EXPECT_EQ(c.data.train_blend[1].path, "/abs/code.bin");
  EXPECT_EQ(c.data.train_blend[1].weight, 3.0);
  EXPECT_EQ(c.data.train_blend[2].path, "configs/books.bin");
  EXPECT_EQ(c.data.train_blend[2].weight, 0.0);
  ASSERT_EQ(c.data.val_blend.size(), 1u);
  EXPECT_EQ(c.data.val_blend[0].path, "configs/web_val.bin");
  const auto j = c.to_json();
  EXPECT_EQ(j["data"]["train"].dump(),
            R"([{"path":"configs/web/*.bin","weight":0.7},{"path":"/abs/code.bin","weight":3.0},)"
            R"({"path":"configs/books.bin","weight":0.0}])");
  EXPECT_EQ(j["data"]["val"].dump(), R"([{"path":"configs/web_val.bin","weight":1.0}])");
  JobConfig again = parse_job_config(j.dump(), "", 1);
  EXPECT_EQ(again.to_json(), j);
  EXPECT_TRUE(again.data.train.empty());
  EXPECT_EQ(again.data.train_blend.size(), 3u);
  // The existing forms stay as they were.
  JobConfig one = parse_job_config(R"({"train_batch_size": 8, "data": {"train": ["a.bin", "b.bin"]}})", "", 1);
  EXPECT_TRUE(one.data.train_blend.empty());
  EXPECT_EQ(one.to_json()["data"]["train"].dump(), R"(["a.bin","b.bin"])");
}

TEST(JobConfig, TrainingSectionsAreRequiredOnlyForTraining) {
  JobConfig ds_only = parse_job_config(kMin, "t.json", 1);
  try {
    require_training_sections(ds_only);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    const std::vector<std::string> want = {
        "t.json: $.model: missing (dstrain train needs the model shape)",
        "t.json: $.data.train: missing (dstrain train needs a training token file)",
        "t.json: $.training.steps: missing (dstrain train needs the number of steps)"};
    EXPECT_EQ(e.errors(), want);
  }
}

TEST(JobConfig, WorldSizeMustBePositive) {
  try {
    parse_job_config(kMin, "t.json", 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "world size must be at least 1, got 0");
  }
}

TEST(JobConfig, MissingFileNamesIt) {
  try {
    load_job_config("/nonexistent/x.json", 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot read config /nonexistent/x.json: No such file or directory");
    EXPECT_EQ(e.exit_code(), 2);
  }
}

// The tensor x pipeline product of a config file, read raw, to pick world sizes that fit it.
int model_parallel_size(const std::string& path) {
  std::ifstream in(path);
  auto j = nlohmann::json::parse(in);
  int tp = j.contains("tensor_parallel") ? j["tensor_parallel"].value("size", 1) : 1;
  int pp = j.contains("pipeline") ? j["pipeline"].value("stages", 1) : 1;
  return tp * pp;
}

TEST(JobConfig, EveryShippedConfigValidatesAndRoundTrips) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(DS_SOURCE_DIR) / "configs";
  int n = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    ++n;
    const std::string path = entry.path().string();
    const int mp = model_parallel_size(path);
    for (int k : {1, 2, 4}) {
      const int world = mp * k;
      JobConfig c;
      try {
        c = load_job_config(path, world);
        require_training_sections(c);
      } catch (const Error& e) {
        ADD_FAILURE() << path << " world " << world << ": " << e.what();
        continue;
      }
      EXPECT_EQ(c.train_batch_size,
                c.train_micro_batch_size_per_gpu * c.gradient_accumulation_steps * c.data_parallel_size);
      // The resolved JSON is itself a valid config that resolves to the same thing.
      auto j = c.to_json();
      JobConfig again = parse_job_config(j.dump(), "", world);
      EXPECT_EQ(again.to_json(), j) << path;
      for (const auto& w : c.warnings) EXPECT_NE(w.find(": $."), std::string::npos) << w;
    }
  }
  EXPECT_GE(n, 5) << "shipped configs in " << dir;
}

TEST(JobConfig, TheMainJobConfigIsTheTinyByteLevelModel) {
  JobConfig c = load_job_config(std::string(DS_SOURCE_DIR) + "/configs/gpt2-tiny-cpu.json", 2);
  EXPECT_EQ(c.model.shape.vocab_size, 256);
  EXPECT_EQ(c.model.shape.padded_vocab_size, 256);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 8);
  EXPECT_EQ(c.train_batch_size, 16);
  EXPECT_EQ(c.training.device, "cpu");
  EXPECT_EQ(c.data.train, std::vector<std::string>{std::string(DS_SOURCE_DIR) + "/data/kjv/train.bin"});
  EXPECT_EQ(c.data.val, std::vector<std::string>{std::string(DS_SOURCE_DIR) + "/data/kjv/val.bin"});
  EXPECT_TRUE(c.warnings.empty());
}


// Mutated configs (bytes deleted, inserted, replaced, duplicated) never crash or hang the
// parser: each one is either valid or a ds::Error with a message naming the file.
TEST(JobConfig, MutatedConfigsFailCleanly) {
  std::ifstream in(std::string(DS_SOURCE_DIR) + "/configs/gpt2-small-fp16-deepspeed.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string base = ss.str();
  ASSERT_FALSE(base.empty());
  std::mt19937 rng(1234);
  const std::string alphabet = "{}[]\":,.-+eE0123456789 \n\\tnulltruefalse\x80\xff";
  int valid = 0, invalid = 0;
  for (int iter = 0; iter < 800; ++iter) {
    std::string text = base;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !text.empty(); ++e) {
      size_t at = rng() % text.size();
      switch (rng() % 4) {
        case 0: text.erase(at, 1 + rng() % 8); break;
        case 1: text.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
        case 2: text[at] = alphabet[rng() % alphabet.size()]; break;
        default: text.insert(at, text.substr(at, rng() % 40)); break;
      }
    }
    for (int world : {1, 3}) {
      try {
        JobConfig c = parse_job_config(text, "m.json", world);
        (void)c.to_json().dump();
        ++valid;
      } catch (const ConfigError& e) {
        ++invalid;
        ASSERT_FALSE(e.errors().empty());
        for (const auto& err : e.errors()) ASSERT_EQ(err.rfind("m.json", 0), 0u) << err;
      }
    }
  }
  // Both outcomes occur (whitespace or digit edits stay valid), so both paths are exercised.
  EXPECT_GT(invalid, 800) << valid << " valid";
  EXPECT_GT(valid, 5) << invalid << " invalid";
}


TEST(JobConfig, ContextParallelSplitsTheWorldAndNamesWhatDoesNotDivide) {
  const std::string model = R"("model": {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "seq_len": 64})";
  // 8 ranks = tp 2 x cp 2 x dp 2; the batch triad counts the dp ranks (they read other sequences).
  auto c = parse_job_config(R"({"train_micro_batch_size_per_gpu": 2, "tensor_parallel": {"size": 2},
      "context_parallel": {"size": 2}, )" + model + "}",
                            "", 8);
  EXPECT_EQ(c.context_parallel.size, 2);
  EXPECT_EQ(c.context_parallel.method, layout::CpMethod::kRing);
  EXPECT_EQ(c.data_parallel_size, 2);
  EXPECT_EQ(c.train_batch_size, 4);
  // The resolved config round-trips with its method.
  EXPECT_EQ(c.to_json()["context_parallel"]["method"], "ring");
  EXPECT_EQ(parse_job_config(c.to_json().dump(), "", 8).context_parallel.size, 2);
  // DeepSpeed-Ulysses' sequence_parallel_size N is Ulysses over N ranks.
  auto u = parse_job_config(R"({"train_batch_size": 4, "sequence_parallel_size": 2})", "", 4);
  EXPECT_EQ(u.context_parallel.size, 2);
  EXPECT_EQ(u.context_parallel.method, layout::CpMethod::kUlysses);
  EXPECT_EQ(u.data_parallel_size, 2);
  EXPECT_EQ(errors_of(R"({"train_batch_size": 4, "sequence_parallel_size": 2, "context_parallel": {"size": 2}})", 4)
                .at(0),
            "t.json:1: $.sequence_parallel_size: both DeepSpeed's \"sequence_parallel_size\" and "
            "\"context_parallel\" are given; keep \"context_parallel\" (sequence_parallel_size N means {\"size\": N, "
            "\"method\": \"ulysses\"})");
  // The ring needs 2 x cp to divide the sequence; Ulysses cp, and the heads.
  EXPECT_EQ(errors_of(R"({"train_batch_size": 2, "context_parallel": {"size": 3},
      "model": {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "seq_len": 64}})", 3),
            std::vector<std::string>{"t.json:2: $.model.seq_len: the sequence length 64 is not divisible by 2 x "
                                     "context_parallel.size = 6 (the ring gives each rank two equal chunks) "
                                     "(context_parallel.method \"ring\")"});
  EXPECT_EQ(errors_of(R"({"train_batch_size": 1, "context_parallel": {"size": 8, "method": "ulysses"},
      "model": {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "seq_len": 64}})", 8),
            std::vector<std::string>{"t.json:2: $.model.n_head: 4 query heads are not divisible by "
                                     "context_parallel.size 8 (Ulysses splits the heads over the cp ranks; use "
                                     "method \"ring\", or a size that divides them)"});
  EXPECT_EQ(errors_of(R"({"train_batch_size": 1, "context_parallel": {"size": 2, "method": "ulysses"},
      "model": {"type": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 1, "n_embd": 64, "intermediate_size": 128,
                "vocab_size": 256, "seq_len": 64}})", 2).size(), 1u);
  EXPECT_EQ(errors_of(R"({"train_batch_size": 1, "context_parallel": {"size": 2, "method": "zigzag"}})", 2).size(), 1u);
  EXPECT_EQ(errors_of(R"({"train_batch_size": 1, "context_parallel": {"size": 3}})", 4).at(0),
            "t.json:1: $.context_parallel: world size 4 is not divisible by tensor_parallel.size x "
            "context_parallel.size x pipeline.stages = 1 x 3 x 1 = 3 (the data-parallel size must be a whole number)");
}


TEST(JobConfig, ActivationCheckpointingModeIsFullOrSelective) {
  auto full = parse_job_config(R"({"train_batch_size": 2, "activation_checkpointing": {"enabled": true}})", "", 1);
  EXPECT_EQ(full.activation_checkpointing.mode, "full");
  EXPECT_TRUE(full.activation_checkpointing.full());
  auto sel = parse_job_config(
      R"({"train_batch_size": 2, "activation_checkpointing": {"enabled": true, "mode": "selective"}})", "", 1);
  EXPECT_FALSE(sel.activation_checkpointing.full());  // no layer is recomputed
  EXPECT_EQ(sel.to_json()["activation_checkpointing"]["mode"], "selective");
  EXPECT_EQ(errors_of(R"({"train_batch_size": 2, "activation_checkpointing": {"mode": "some"}})").size(), 1u);
}


TEST(JobConfig, SequenceParallelNeedsTensorParallelismAndEqualShares) {
  const std::string model = R"("model": {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "seq_len": 6})";
  auto c = parse_job_config(R"({"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"size": 2,
      "sequence_parallel": true}, )" + model + "}", "", 2);
  EXPECT_TRUE(c.tensor_parallel.sequence_parallel);
  EXPECT_EQ(c.to_json()["tensor_parallel"]["sequence_parallel"], true);
  EXPECT_EQ(errors_of(R"({"train_batch_size": 2, "tensor_parallel": {"sequence_parallel": true}})", 2),
            std::vector<std::string>{"t.json:1: $.tensor_parallel.sequence_parallel: sequence parallelism splits the "
                                     "activations over the tensor-parallel ranks: it needs tensor_parallel.size > 1 "
                                     "(it is 1)"});
  // 1 x 6 tokens do not split over 4 tp ranks.
  EXPECT_EQ(errors_of(R"({"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"size": 4, "sequence_parallel": true},
      "model": {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "seq_len": 6}})", 4),
            std::vector<std::string>{"t.json:1: $.tensor_parallel.sequence_parallel: a rank's micro-batch of "
                                     "train_micro_batch_size_per_gpu x model.seq_len / context_parallel.size = 6 tokens "
                                     "is not divisible by tensor_parallel.size 4 (sequence parallelism gives each tp "
                                     "rank an equal share)"});
}

}  // namespace
TEST(JobConfig, DocumentPackingNeedsItsTokenAndNamesBothKeys) {
  const std::string model = R"("model": {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "seq_len": 64})";
  auto c = parse_job_config(R"({"train_micro_batch_size_per_gpu": 1, "data": {"train": "t.bin", "packing": "document",
      "document_token": 10}, )" + model + "}", "", 1);
  EXPECT_EQ(c.data.packing, Packing::kDocument);
  EXPECT_EQ(c.data.document_token, 10);
  EXPECT_EQ(c.to_json()["data"]["packing"], "document");
  EXPECT_EQ(parse_job_config(c.to_json().dump(), "", 1).data.document_token, 10);
  // The default is today's packing, and it round-trips as "none".
  auto d = parse_job_config(R"({"train_micro_batch_size_per_gpu": 1, "data": {"train": "t.bin"}})", "", 1);
  EXPECT_EQ(d.data.packing, Packing::kNone);
  EXPECT_EQ(d.to_json()["data"]["packing"], "none");
  EXPECT_EQ(errors_of(R"({"train_micro_batch_size_per_gpu": 1, "data": {"train": "t.bin", "packing": "document"}})"),
            std::vector<std::string>{
                "t.json:1: $.data.document_token: data.packing \"document\" needs data.document_token, the token "
                "that begins each document (GPT-2's <|endoftext|> is 50256, a SentencePiece model's BOS its id; "
                "`dstrain data inspect FILE` shows a file's first ids)"});
  EXPECT_EQ(errors_of(R"({"train_micro_batch_size_per_gpu": 1, "data": {"train": "t.bin", "document_token": 3}})"),
            std::vector<std::string>{
                "t.json:1: $.data.document_token: data.document_token (3) is read only with data.packing "
                "\"document\" (packing is \"none\"); set data.packing to \"document\" or remove the key"});
  EXPECT_EQ(errors_of(R"({"train_micro_batch_size_per_gpu": 1, "data": {"train": "t.bin", "packing": "docs"}})"),
            std::vector<std::string>{
                "t.json:1: $.data.packing: expected one of \"none\", \"document\", got \"docs\""});
  EXPECT_EQ(errors_of(R"({"train_micro_batch_size_per_gpu": 1, "data": {"train": "t.bin", "packing": "document",
      "document_token": -2}})").size(), 1u);
  EXPECT_EQ(errors_of(R"({"train_micro_batch_size_per_gpu": 1, "data": {"train": "t.bin", "packing": "document",
      "document_token": 256}, )" + model + "}"),
            std::vector<std::string>{"t.json:2: $.data.document_token: data.document_token 256 is outside "
                                     "model.vocab_size (256): need a token of the vocabulary"});
  EXPECT_EQ(errors_of(R"({"train_micro_batch_size_per_gpu": 1, "context_parallel": {"size": 2},
      "data": {"train": "t.bin", "packing": "document", "document_token": 1}})", 2),
            std::vector<std::string>{
                "t.json:2: $.data.packing: data.packing \"document\" does not run with context_parallel.size 2 yet "
                "(the ring and Ulysses attentions have no document mask); set context_parallel.size to 1 or "
                "data.packing to \"none\""});
}

}  // namespace ds::config
