// The lora section: keys and PEFT's defaults, target names checked against model.type's family,
// "all-linear" expanded, init_from standing in for r / alpha / target_modules, the JSON round trip,
// and every bad value named by its JSON path.
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>

#include "config/job_config.h"

namespace ds::config {
namespace {

std::vector<std::string> errors_of(const std::string& text) {
  try {
    parse_job_config(text, "t.json", 1);
  } catch (const ConfigError& e) {
    return e.errors();
  }
  return {};
}

const std::string kGpt2 = R"("model": {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "seq_len": 32})";
const std::string kLlama =
    R"("model": {"type": "llama", "n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 300, "seq_len": 32, )"
    R"("intermediate_size": 176})";
const std::string kMixtral =
    R"("model": {"type": "mixtral", "n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 300, "seq_len": 32, )"
    R"("intermediate_size": 176, "num_local_experts": 4})";

// A config with `model` and the lora section `lora` (its body, without braces).
std::string with_lora(const std::string& model, const std::string& lora) {
  return R"({"train_micro_batch_size_per_gpu": 2, )" + model + R"(, "lora": {)" + lora + "}}";
}

TEST(LoraConfig, KeysAndPeftDefaults) {
  const JobConfig none = parse_job_config(R"({"train_micro_batch_size_per_gpu": 2, )" + kGpt2 + "}", "t.json", 1);
  EXPECT_FALSE(none.lora.enabled);
  EXPECT_TRUE(none.to_json()["lora"].is_null());

  const JobConfig c = parse_job_config(with_lora(kLlama, R"("r": 8, "target_modules": ["q_proj", "v_proj"])"),
                                       "configs/x.json", 1);
  EXPECT_TRUE(c.lora.enabled);
  EXPECT_EQ(c.lora.r, 8);
  EXPECT_EQ(c.lora.alpha, 8);  // PEFT's lora_alpha default
  EXPECT_EQ(c.lora.dropout, 0);
  EXPECT_EQ(c.lora.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(c.lora.init_from, "");

  // Every key given: the adapter directory is not read here (the runtime checks it against the file).
  const JobConfig d = parse_job_config(
      with_lora(kLlama, R"("r": 16, "alpha": 32, "dropout": 0.05, "target_modules": ["self_attn.o_proj", "down_proj"], )"
                        R"("init_from": "../adapters/run1")"),
      "configs/x.json", 1);
  EXPECT_EQ(d.lora.r, 16);
  EXPECT_EQ(d.lora.alpha, 32);
  EXPECT_EQ(d.lora.dropout, 0.05);
  EXPECT_EQ(d.lora.target_modules, (std::vector<std::string>{"self_attn.o_proj", "down_proj"}));
  EXPECT_EQ(d.lora.init_from, "adapters/run1");  // against the config's directory, as model.init_from
  EXPECT_EQ(parse_job_config(with_lora(kLlama, R"("r": 1, "alpha": 2, "target_modules": ["q_proj"], "init_from": "/abs/a")"),
                             "configs/x.json", 1)
                .lora.init_from,
            "/abs/a");
}

TEST(LoraConfig, AllLinearExpandsForTheFamily) {
  auto targets = [](const std::string& model) {
    return parse_job_config(with_lora(model, R"("r": 4, "target_modules": "all-linear")"), "t.json", 1)
        .lora.target_modules;
  };
  EXPECT_EQ(targets(kLlama), (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                        "up_proj", "down_proj"}));
  EXPECT_EQ(targets(kMixtral), (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj"}));
  EXPECT_EQ(targets(kGpt2), (std::vector<std::string>{"c_attn", "c_proj", "c_fc"}));
}

TEST(LoraConfig, Gpt2Names) {
  for (const std::string list : {R"(["c_attn"])", R"(["c_attn", "c_proj", "c_fc"])", R"(["attn.c_proj", "mlp.c_proj"])",
                                 R"(["mlp.c_proj", "c_fc"])"}) {
    EXPECT_TRUE(errors_of(with_lora(kGpt2, R"("r": 4, "target_modules": )" + list)).empty()) << list;
  }
}

// A PEFT adapter directory of the given adapter_config.json text, in a fresh temporary directory.
std::string adapter_dir(const std::string& name, const std::string& config_json) {
  const auto dir = std::filesystem::temp_directory_path() / ("dstrain-lora-config-" + name);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "adapter_config.json") << config_json;
  return dir.string();
}

TEST(LoraConfig, InitFromStandsInForTheAdaptersKeys) {
  const std::string ad = adapter_dir(
      "a", R"({"peft_type": "LORA", "r": 4, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]})");
  const JobConfig c = parse_job_config(with_lora(kLlama, R"("init_from": ")" + ad + R"(")"), "configs/x.json", 1);
  EXPECT_TRUE(c.lora.enabled);
  EXPECT_EQ(c.lora.r, 4);       // from the adapter's adapter_config.json
  EXPECT_EQ(c.lora.alpha, 16);  // likewise: not PEFT's default, which could disagree with the adapter
  EXPECT_EQ(c.lora.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(c.lora.init_from, ad);
  EXPECT_EQ(c.model.shape.lora.r, 4);  // the model's view
  EXPECT_EQ(c.model.shape.lora.alpha, 16);
  // null is absent.
  const JobConfig n = parse_job_config(
      with_lora(kLlama, R"("r": null, "alpha": null, "target_modules": null, "init_from": ")" + ad + R"(")"), "t.json", 1);
  EXPECT_EQ(n.lora.r, 4);
  // The resolved config reads back, with and without init_from.
  for (const JobConfig& cfg :
       {c, parse_job_config(with_lora(kGpt2, R"("r": 2, "alpha": 3.5, "dropout": 0.1, "target_modules": "all-linear")"),
                            "t.json", 1)}) {
    const auto j = cfg.to_json();
    const JobConfig again = parse_job_config(j.dump(), "", 1);
    EXPECT_EQ(again.to_json(), j);
    EXPECT_EQ(again.lora.r, cfg.lora.r);
    EXPECT_EQ(again.lora.alpha, cfg.lora.alpha);
    EXPECT_EQ(again.lora.target_modules, cfg.lora.target_modules);
  }
  // An adapter that kept "all-linear" as written: the family's names, equal to the config's expansion.
  const std::string all = adapter_dir("all", R"({"peft_type": "LORA", "r": 2, "target_modules": "all-linear"})");
  const JobConfig a = parse_job_config(with_lora(kGpt2, R"("init_from": ")" + all + R"(")"), "t.json", 1);
  EXPECT_EQ(a.lora.target_modules, (std::vector<std::string>{"c_attn", "c_proj", "c_fc"}));
  EXPECT_TRUE(errors_of(with_lora(kGpt2, R"("target_modules": "all-linear", "init_from": ")" + all + R"(")")).empty());
  // A value the config gives and the adapter contradicts, and an adapter that is not there: named.
  const auto e1 = errors_of(with_lora(kLlama, R"("r": 8, "init_from": ")" + ad + R"(")"));
  ASSERT_EQ(e1.size(), 1u);
  EXPECT_NE(e1[0].find("$.lora.r: r is 8 but the adapter " + ad + "/adapter_config.json has r 4"), std::string::npos)
      << e1[0];
  const auto e2 = errors_of(with_lora(kLlama, R"("init_from": "/nonexistent/adapter")"));
  ASSERT_EQ(e2.size(), 1u);
  EXPECT_NE(e2[0].find("$.lora.init_from: cannot read /nonexistent/adapter/adapter_config.json"), std::string::npos)
      << e2[0];
}

TEST(LoraConfig, ErrorsNameTheJsonPath) {
  struct Case {
    std::string json;
    std::string error;
  };
  const std::vector<Case> cases = {
      {with_lora(kLlama, R"("target_modules": ["q_proj"])"), "t.json:1: $.lora: missing required key \"r\" (the adapters' rank)"},
      {with_lora(kLlama, R"("r": 8)"), "t.json:1: $.lora: missing required key \"target_modules\" (a list of module "
                                       "names, or \"all-linear\")"},
      {with_lora(kLlama, R"("r": 0, "target_modules": ["q_proj"])"),
       "t.json:1: $.lora.r: expected an integer >= 1, got 0"},
      {with_lora(kLlama, R"("r": 2.5, "target_modules": ["q_proj"])"),
       "t.json:1: $.lora.r: expected an integer >= 1, got 2.5"},
      {with_lora(kLlama, R"("r": 8, "alpha": 0, "target_modules": ["q_proj"])"),
       "t.json:1: $.lora.alpha: expected a number > 0, got 0"},
      {with_lora(kLlama, R"("r": 8, "alpha": "auto", "target_modules": ["q_proj"])"),
       "t.json:1: $.lora.alpha: \"auto\" needs a value: pass --set lora.alpha=VALUE"},
      {with_lora(kLlama, R"("r": 8, "dropout": 1, "target_modules": ["q_proj"])"),
       "t.json:1: $.lora.dropout: expected a number >= 0 and < 1, got 1"},
      {with_lora(kLlama, R"("r": 8, "dropout": -0.1, "target_modules": ["q_proj"])"),
       "t.json:1: $.lora.dropout: expected a number >= 0 and < 1, got -0.1"},
      {with_lora(kLlama, R"("r": 8, "target_modules": [])"),
       "t.json:1: $.lora.target_modules: expected a non-empty list of module names or \"all-linear\", got []"},
      {with_lora(kLlama, R"("r": 8, "target_modules": "q_proj")"),
       "t.json:1: $.lora.target_modules: expected a non-empty list of module names or \"all-linear\", got "
       "\"q_proj\" (a list of one name is written [\"q_proj\"])"},
      {with_lora(kLlama, R"("r": 8, "target_modules": ["q_proj", 3])"),
       "t.json:1: $.lora.target_modules[1]: expected a module name (a non-empty string), got 3"},
      {with_lora(kLlama, R"("r": 8, "target_modules": ["q_proj", "all-linear"])"),
       "t.json:1: $.lora.target_modules[1]: \"all-linear\" stands alone: write \"target_modules\": \"all-linear\""},
      {with_lora(kLlama, R"("r": 8, "target_modules": ["q_proj", "c_attn"])"),
       "t.json:1: $.lora.target_modules[1]: \"c_attn\" names no LoRA target of model.type llama (valid: q_proj, "
       "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or \"all-linear\")"},
      {with_lora(kMixtral, R"("r": 8, "target_modules": ["up_proj"])"),
       "t.json:1: $.lora.target_modules[0]: \"up_proj\" names no LoRA target of model.type mixtral (valid: q_proj, "
       "k_proj, v_proj, o_proj, or \"all-linear\"); a Mixtral's experts and router are not LoRA targets in dstrain"},
      {with_lora(kGpt2, R"("r": 8, "target_modules": ["q_proj"])"),
       "t.json:1: $.lora.target_modules[0]: \"q_proj\" names no LoRA target of model.type gpt2 (valid: c_attn, "
       "c_proj, c_fc, attn.c_proj, mlp.c_proj, or \"all-linear\")"},
      {with_lora(kLlama, R"("r": 8, "target_modules": ["q_proj", "v_proj", "q_proj"])"),
       "t.json:1: $.lora.target_modules[2]: \"q_proj\" is listed twice (first at target_modules[0])"},
      {with_lora(kGpt2, R"("r": 8, "target_modules": ["attn.c_proj", "c_proj"])"),
       "t.json:1: $.lora.target_modules[1]: \"c_proj\" selects attn.c_proj, which target_modules[0] "
       "\"attn.c_proj\" already selects"},
      {with_lora(kLlama, R"("r": 8, "target_modules": ["q_proj"], "lora_alpha": 16)"),
       "t.json:1: $.lora.lora_alpha: unknown key (PEFT's lora_alpha is \"alpha\" here)"},
      {with_lora(kLlama, R"("r": 8, "target_modules": ["q_proj"], "lora_dropout": 0.1)"),
       "t.json:1: $.lora.lora_dropout: unknown key (PEFT's lora_dropout is \"dropout\" here)"},
      {with_lora(kLlama, R"("r": 8, "target_modules": ["q_proj"], "init_from": "")"),
       "t.json:1: $.lora.init_from: expected a non-empty path, got \"\""},
      {R"({"train_micro_batch_size_per_gpu": 2, "lora": {"r": 8, "target_modules": ["q_proj"]}})",
       "t.json:1: $.lora: LoRA needs a model section (the base model whose modules it adapts)"},
      {R"({"train_micro_batch_size_per_gpu": 2, )" + kGpt2 + R"(, "lora": [8]})",
       "t.json:1: $.lora: expected an object or null, got [8]"},
  };
  for (const auto& c : cases) {
    const auto errs = errors_of(c.json);
    ASSERT_EQ(errs.size(), 1u) << c.json << "\n" << (errs.empty() ? "" : errs[0] + "\n" + errs.back());
    EXPECT_EQ(errs[0], c.error) << c.json;
  }
}

TEST(LoraConfig, ABadModelTypeGivesOneMessage) {
  const auto errs = errors_of(
      R"({"train_micro_batch_size_per_gpu": 2, "model": {"type": "bert", "n_layer": 2, "n_head": 4, "n_embd": 64, )"
      R"("vocab_size": 256, "seq_len": 32}, "lora": {"r": 4, "target_modules": ["q_proj"]}})");
  ASSERT_EQ(errs.size(), 1u) << errs[0];
  EXPECT_NE(errs[0].find("$.model.type"), std::string::npos) << errs[0];
}

TEST(LoraConfig, LinesPointAtTheKey) {
  const std::string text = "{\n  \"train_micro_batch_size_per_gpu\": 2,\n  " + kLlama +
                           ",\n  \"lora\": {\n    \"r\": 4,\n    \"target_modules\": [\n      \"q_proj\",\n"
                           "      \"w1\"\n    ]\n  }\n}\n";
  const auto errs = errors_of(text);
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_EQ(errs[0].substr(0, 38), "t.json:8: $.lora.target_modules[1]: \"w");
}

}  // namespace
}  // namespace ds::config
