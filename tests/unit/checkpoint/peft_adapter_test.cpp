// PEFT adapter directories: the write/read round trip in F32/BF16/F16, an adapter written in
// PEFT's own layout by a hand-rolled Python writer (write_peft_adapter.py) read back with its
// values, and every bad adapter refused with an error naming the file and the key or tensor.
#include "checkpoint/peft_adapter.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "common/error.h"
#include "common/half.h"
#include "support/run_command.h"

namespace ds::rt::ckpt {
namespace {

namespace fs = std::filesystem;

class PeftAdapterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ds_peft_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    return e.what();
  }
  return "<no error>";
}

std::vector<float> ramp(size_t n, float scale, float shift) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = (static_cast<float>(i) - shift) * scale;
  return v;
}

// Two modules of a GPT-2 adapter, r 3: c_attn (in 8, out 24) and mlp.c_proj (in 32, out 8).
PeftAdapter sample_adapter() {
  PeftAdapter ad;
  ad.config.r = 3;
  ad.config.lora_alpha = 6;
  ad.config.lora_dropout = 0.1;
  ad.config.target_modules = {"c_attn", "mlp.c_proj"};
  ad.config.fan_in_fan_out = true;
  ad.config.base_model_name_or_path = "gpt2";
  ad.modules.push_back({"transformer.h.0.attn.c_attn", 8, 24, ramp(3 * 8, 0.013f, 5.5f), ramp(24 * 3, -0.021f, 7)});
  ad.modules.push_back({"transformer.h.1.mlp.c_proj", 32, 8, ramp(3 * 32, 0.0071f, 40), ramp(8 * 3, 0.37f, 1)});
  return ad;
}

float rounded(float v, StDtype d) {
  if (d == StDtype::kBF16) return bf16_to_f32(f32_to_bf16(v));
  if (d == StDtype::kF16) return f16_to_f32(f32_to_f16(v));
  return v;
}

TEST_F(PeftAdapterTest, RoundTripEachDtype) {
  const PeftAdapter ad = sample_adapter();
  for (StDtype d : {StDtype::kF32, StDtype::kBF16, StDtype::kF16}) {
    const std::string dir = path(st_dtype_name(d));
    write_peft_adapter(dir, ad, d);
    const PeftAdapter back = read_peft_adapter(dir);
    EXPECT_EQ(back.config.r, 3);
    EXPECT_EQ(back.config.lora_alpha, 6);
    EXPECT_DOUBLE_EQ(back.config.lora_dropout, 0.1);
    EXPECT_EQ(back.config.target_modules, ad.config.target_modules);
    EXPECT_TRUE(back.config.fan_in_fan_out);
    EXPECT_EQ(back.config.base_model_name_or_path, "gpt2");
    ASSERT_EQ(back.modules.size(), 2u);
    for (size_t m = 0; m < 2; m++) {
      const PeftModuleWeights& w = back.modules[m];
      EXPECT_EQ(w.module, ad.modules[m].module);  // file order is the written order
      EXPECT_EQ(w.in, ad.modules[m].in);
      EXPECT_EQ(w.out, ad.modules[m].out);
      ASSERT_EQ(w.a.size(), ad.modules[m].a.size());
      ASSERT_EQ(w.b.size(), ad.modules[m].b.size());
      for (size_t i = 0; i < w.a.size(); i++) EXPECT_EQ(w.a[i], rounded(ad.modules[m].a[i], d)) << i;
      for (size_t i = 0; i < w.b.size(); i++) EXPECT_EQ(w.b[i], rounded(ad.modules[m].b[i], d)) << i;
    }
    // The files as PEFT reads them: tensor names, dtype, shapes and every config key.
    SafetensorsFile f(dir + "/adapter_model.safetensors");
    const StTensorInfo* a = f.find("base_model.model.transformer.h.0.attn.c_attn.lora_A.weight");
    const StTensorInfo* b = f.find("base_model.model.transformer.h.0.attn.c_attn.lora_B.weight");
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(a->dtype, d);
    EXPECT_EQ(a->shape, (std::vector<int64_t>{3, 8}));
    EXPECT_EQ(b->shape, (std::vector<int64_t>{24, 3}));
    EXPECT_EQ(f.metadata().at("format"), "pt");
    EXPECT_EQ(f.tensors().size(), 4u);
    std::ifstream in(dir + "/adapter_config.json");
    const nlohmann::json j = nlohmann::json::parse(in);
    EXPECT_EQ(j["peft_type"], "LORA");
    EXPECT_EQ(j["task_type"], "CAUSAL_LM");
    EXPECT_EQ(j["r"], 3);
    EXPECT_TRUE(j["lora_alpha"].is_number_integer());  // a whole alpha is written as PEFT does, 6 not 6.0
    EXPECT_EQ(j["lora_alpha"], 6);
    EXPECT_EQ(j["bias"], "none");
    EXPECT_EQ(j["inference_mode"], true);
    EXPECT_EQ(j["fan_in_fan_out"], true);
    EXPECT_TRUE(j["modules_to_save"].is_null());
    EXPECT_EQ(j["init_lora_weights"], true);
    EXPECT_EQ(j["target_modules"], nlohmann::json({"c_attn", "mlp.c_proj"}));
    // No temporary file is left behind.
    for (const auto& e : fs::directory_iterator(dir)) {
      EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
    }
  }
}

TEST_F(PeftAdapterTest, WriterRefusesABadAdapterAndWritesNothing) {
  PeftAdapter ad = sample_adapter();
  ad.modules[1].b.pop_back();
  EXPECT_NE(error_of([&] { write_peft_adapter(path("bad"), ad, StDtype::kF32); })
                .find("module transformer.h.1.mlp.c_proj (in 32, out 8, r 3) has 96 A and 23 B values; expected "
                      "96 and 24"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(path("bad/adapter_model.safetensors")));
  ad = sample_adapter();
  ad.modules[1].module = ad.modules[0].module;
  EXPECT_NE(error_of([&] { write_peft_adapter(path("bad"), ad, StDtype::kF32); }).find("given twice"),
            std::string::npos);
  ad = sample_adapter();
  ad.config.r = 0;
  EXPECT_NE(error_of([&] { write_peft_adapter(path("bad"), ad, StDtype::kF32); }).find("r must be >= 1, got 0"),
            std::string::npos);
}

void check_python_adapter(const PeftAdapter& ad) {
  EXPECT_EQ(ad.config.r, 4);
  EXPECT_EQ(ad.config.lora_alpha, 16);
  EXPECT_DOUBLE_EQ(ad.config.lora_dropout, 0.05);
  EXPECT_EQ(ad.config.target_modules, (std::vector<std::string>{"v_proj", "q_proj"}));
  EXPECT_FALSE(ad.config.fan_in_fan_out);
  EXPECT_EQ(ad.config.base_model_name_or_path, "TinyLlama/TinyLlama-1.1B");
  const std::vector<std::pair<std::string, int64_t>> want = {{"model.layers.0.self_attn.q_proj", 8},
                                                             {"model.layers.0.self_attn.v_proj", 4},
                                                             {"model.layers.1.self_attn.q_proj", 8},
                                                             {"model.layers.1.self_attn.v_proj", 4}};
  ASSERT_EQ(ad.modules.size(), want.size());
  for (size_t m = 0; m < want.size(); m++) {
    const PeftModuleWeights& w = ad.modules[m];
    EXPECT_EQ(w.module, want[m].first);
    EXPECT_EQ(w.in, 8);
    EXPECT_EQ(w.out, want[m].second);
    ASSERT_EQ(w.a.size(), 4u * 8);
    ASSERT_EQ(w.b.size(), static_cast<size_t>(want[m].second * 4));
    for (size_t i = 0; i < w.a.size(); i++) {
      EXPECT_EQ(w.a[i], static_cast<float>((static_cast<int>(i % 7) - 3) * 0.125 + static_cast<double>(m)));
    }
    for (size_t i = 0; i < w.b.size(); i++) {
      EXPECT_EQ(w.b[i], static_cast<float>((static_cast<int>(i % 5) - 2) * 0.25 - static_cast<double>(m)));
    }
  }
}

TEST_F(PeftAdapterTest, ReadsAnAdapterInPeftsLayout) {
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  for (const std::string mode : {"", "default"}) {
    const std::string dir = path("py" + mode);
    const auto r = ds::test::run_command("/usr/bin/python3 " +
                                         ds::test::source_path("tests/unit/checkpoint/write_peft_adapter.py") + " " +
                                         dir + " " + mode);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    SCOPED_TRACE(mode);
    check_python_adapter(read_peft_adapter(dir));
  }
}

// ---- bad adapters ---------------------------------------------------------------------------

using PeftJson = nlohmann::ordered_json;

PeftJson good_config() {
  return PeftJson{{"peft_type", "LORA"}, {"r", 3}, {"lora_alpha", 6}, {"target_modules", {"c_attn"}}};
}

void write_config(const std::string& dir, const PeftJson& j) {
  std::ofstream(dir + "/adapter_config.json") << j.dump();
}

// An adapter directory holding `tensors` (and the config above).
std::string adapter_with(const std::string& dir, const std::vector<StTensorOut>& tensors,
                         const PeftJson& config = good_config()) {
  fs::create_directories(dir);
  write_safetensors(dir + "/adapter_model.safetensors", tensors, {{"format", "pt"}});
  write_config(dir, config);
  return dir;
}

StTensorOut tensor(const std::string& name, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return {name, StDtype::kF32, shape, std::vector<float>(static_cast<size_t>(n), 0.5f)};
}

const std::string kA = "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight";
const std::string kB = "base_model.model.transformer.h.0.attn.c_attn.lora_B.weight";

TEST_F(PeftAdapterTest, RankDifferingFromTheTensorsNamesTheTensor) {
  const std::string dir = adapter_with(path("r"), {tensor(kA, {4, 8}), tensor(kB, {24, 4})});
  const std::string e = error_of([&] { read_peft_adapter(dir); });
  EXPECT_NE(e.find(dir + "/adapter_model.safetensors: tensor '" + kA + "' has shape [4, 8], but " + dir +
                   "/adapter_config.json has r = 3: lora_A must be (3, in)"),
            std::string::npos)
      << e;
  // B's rank is its columns.
  const std::string dir2 = adapter_with(path("rb"), {tensor(kA, {3, 8}), tensor(kB, {24, 2})});
  EXPECT_NE(error_of([&] { read_peft_adapter(dir2); })
                .find("tensor '" + kB + "' has shape [24, 2], but " + dir2 +
                      "/adapter_config.json has r = 3: lora_B must be (out, 3)"),
            std::string::npos);
  // Not a matrix.
  const std::string dir3 = adapter_with(path("1d"), {tensor(kA, {3}), tensor(kB, {24, 3})});
  EXPECT_NE(error_of([&] { read_peft_adapter(dir3); }).find("has shape [3], but"), std::string::npos);
}

TEST_F(PeftAdapterTest, ModuleWithOneHalf) {
  const std::string dir =
      adapter_with(path("half"), {tensor(kA, {3, 8}), tensor(kB, {24, 3}),
                                  tensor("base_model.model.transformer.h.1.attn.c_attn.lora_A.weight", {3, 8})});
  EXPECT_NE(error_of([&] { read_peft_adapter(dir); })
                .find(dir + "/adapter_model.safetensors: module transformer.h.1.attn.c_attn has "
                            "base_model.model.transformer.h.1.attn.c_attn.lora_A.weight but no "
                            "base_model.model.transformer.h.1.attn.c_attn.lora_B.weight"),
            std::string::npos);
  // Both spellings of one half.
  const std::string dir2 = adapter_with(
      path("twice"), {tensor(kA, {3, 8}), tensor(kB, {24, 3}),
                      tensor("base_model.model.transformer.h.0.attn.c_attn.lora_A.default.weight", {3, 8})});
  EXPECT_NE(error_of([&] { read_peft_adapter(dir2); }).find("are both lora_A of module transformer.h.0.attn.c_attn"),
            std::string::npos);
}

TEST_F(PeftAdapterTest, TensorsThatAreNotLoraWeights) {
  for (const std::string name : {"transformer.h.0.attn.c_attn.lora_A.weight",  // no base_model.model.
                                 "base_model.model.transformer.h.0.attn.c_attn.lora_magnitude_vector",
                                 "base_model.model.lm_head.weight", "base_model.model..lora_A.weight"}) {
    const std::string dir = adapter_with(path("stray"), {tensor(kA, {3, 8}), tensor(kB, {24, 3}), tensor(name, {3})});
    EXPECT_NE(error_of([&] { read_peft_adapter(dir); })
                  .find(dir + "/adapter_model.safetensors: tensor '" + name + "' is not a LoRA weight"),
              std::string::npos)
        << name;
    fs::remove_all(dir);
  }
  const std::string empty = adapter_with(path("empty"), {});
  EXPECT_NE(error_of([&] { read_peft_adapter(empty); }).find("holds no LoRA weights"), std::string::npos);
}

TEST_F(PeftAdapterTest, BadConfigNamesTheKey) {
  struct Case {
    std::function<void(PeftJson&)> edit;
    std::string error;
  };
  const std::vector<Case> cases = {
      {[](PeftJson& j) { j["peft_type"] = "IA3"; }, "\"peft_type\" is \"IA3\": dstrain reads LoRA adapters (\"LORA\")"},
      {[](PeftJson& j) { j.erase("peft_type"); }, "no \"peft_type\""},
      {[](PeftJson& j) { j.erase("r"); }, "no \"r\""},
      {[](PeftJson& j) { j["r"] = 0; }, "\"r\": expected an integer >= 1, got 0"},
      {[](PeftJson& j) { j["r"] = "8"; }, "\"r\": expected an integer >= 1, got \"8\""},
      {[](PeftJson& j) { j["lora_alpha"] = -1; }, "\"lora_alpha\": expected a number > 0, got -1"},
      {[](PeftJson& j) { j["lora_dropout"] = 1; }, "\"lora_dropout\": expected a number >= 0 and < 1, got 1"},
      {[](PeftJson& j) { j["target_modules"] = PeftJson::array(); }, "\"target_modules\": expected a non-empty list"},
      {[](PeftJson& j) { j["target_modules"] = {"q_proj", 3}; }, "\"target_modules\"[1]: expected a module name"},
      {[](PeftJson& j) { j.erase("target_modules"); }, "\"target_modules\": expected a non-empty list of module "
                                                       "names, got nothing"},
      {[](PeftJson& j) { j["fan_in_fan_out"] = "yes"; }, "\"fan_in_fan_out\": expected true or false"},
      {[](PeftJson& j) { j["use_dora"] = true; }, "\"use_dora\" is true: DoRA"},
      {[](PeftJson& j) { j["use_rslora"] = true; }, "\"use_rslora\" is true"},
      {[](PeftJson& j) { j["bias"] = "lora_only"; }, "\"bias\" is \"lora_only\""},
      {[](PeftJson& j) { j["modules_to_save"] = {"lm_head"}; }, "\"modules_to_save\" is [\"lm_head\"]"},
      {[](PeftJson& j) { j["rank_pattern"] = {{"q_proj", 8}}; }, "\"rank_pattern\" is"},
  };
  const std::string dir = adapter_with(path("cfg"), {tensor(kA, {3, 8}), tensor(kB, {24, 3})});
  EXPECT_EQ(read_peft_adapter(dir).modules.size(), 1u);  // the base case is good
  for (const Case& c : cases) {
    PeftJson j = good_config();
    c.edit(j);
    write_config(dir, j);
    const std::string e = error_of([&] { read_peft_adapter(dir); });
    EXPECT_NE(e.find(dir + "/adapter_config.json: " + c.error), std::string::npos) << e;
  }
  std::ofstream(dir + "/adapter_config.json") << "{\"r\": ";
  EXPECT_NE(error_of([&] { read_peft_adapter(dir); }).find("adapter_config.json: expected a JSON object"),
            std::string::npos);
  // PEFT's defaults for absent keys: lora_alpha 8, lora_dropout 0; a string target_modules.
  write_config(dir, PeftJson{{"peft_type", "LORA"}, {"r", 3}, {"target_modules", "c_attn"}});
  const PeftAdapter ad = read_peft_adapter(dir);
  EXPECT_EQ(ad.config.lora_alpha, 8);
  EXPECT_EQ(ad.config.lora_dropout, 0);
  EXPECT_EQ(ad.config.target_modules, std::vector<std::string>{"c_attn"});
}

TEST_F(PeftAdapterTest, MissingFilesNameTheFile) {
  const std::string dir = path("nothing");
  fs::create_directories(dir);
  EXPECT_NE(error_of([&] { read_peft_adapter(dir); })
                .find("PEFT adapter " + dir + ": no file " + dir + "/adapter_config.json"),
            std::string::npos);
  write_config(dir, good_config());
  EXPECT_NE(error_of([&] { read_peft_adapter(dir); }).find("no file " + dir + "/adapter_model.safetensors"),
            std::string::npos);
  std::ofstream(dir + "/adapter_model.bin") << "pickle";
  try {
    read_peft_adapter(dir);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(e.hint().find("safe_serialization=True"), std::string::npos) << e.hint();
  }
  EXPECT_NE(error_of([&] { read_peft_adapter(path("absent")); }).find("no file"), std::string::npos);
}

}  // namespace
}  // namespace ds::rt::ckpt
