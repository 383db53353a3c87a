// LoRA target names: what each family's names select (PEFT's suffix match: GPT-2's "c_proj" is
// both projections), "all-linear", the module paths PEFT names adapters by (checked against the
// families' Hugging Face tensor names where dstrain has them), and the errors for other names.
#include "model_spec/lora_targets.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "model_spec/family.h"
#include "model_spec/named_shapes.h"

namespace ms = ds::model_spec;
using P = ms::ParamId;

namespace {

ms::ModelShape shape_of(ms::ModelFamily f) {
  ms::ModelShape s = ms::named_shape("step-l", "test").shape;  // a Llama
  s.family = f;
  if (f == ms::ModelFamily::kMixtral) s = ms::named_shape("step-moe", "test").shape;
  if (f == ms::ModelFamily::kGpt2) s = ms::named_shape("step-s", "test").shape;
  return s;
}

std::string error_of(const ms::ModelShape& s, const std::string& name) {
  try {
    ms::lora_target_params(s, name);
  } catch (const ds::Error& e) {
    EXPECT_EQ(e.kind(), ds::ErrorKind::kInvalidArgument);
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(LoraTargets, LlamaNames) {
  const ms::ModelShape s = shape_of(ms::ModelFamily::kLlama);
  EXPECT_EQ(ms::lora_target_params(s, "q_proj"), std::vector<P>{P::kWq});
  EXPECT_EQ(ms::lora_target_params(s, "down_proj"), std::vector<P>{P::kWdown});
  EXPECT_EQ(ms::lora_target_params(s, "self_attn.v_proj"), std::vector<P>{P::kWv});  // a longer suffix
  EXPECT_EQ(ms::lora_target_params(s, "all-linear"),
            (std::vector<P>{P::kWq, P::kWk, P::kWv, P::kWo, P::kWgate, P::kWup, P::kWdown}));
  EXPECT_EQ(ms::lora_target_names(s), (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                "up_proj", "down_proj"}));
  EXPECT_EQ(ms::lora_all_linear_names(s), ms::lora_target_names(s));
  EXPECT_EQ(ms::lora_module_path(s, P::kWq, 3), "model.layers.3.self_attn.q_proj");
  EXPECT_EQ(ms::lora_module_path(s, P::kWup, 0), "model.layers.0.mlp.up_proj");
  EXPECT_EQ(error_of(s, "c_attn"),
            "\"c_attn\" names no LoRA target of model.type llama (valid: q_proj, k_proj, v_proj, o_proj, gate_proj, "
            "up_proj, down_proj, or \"all-linear\")");
  EXPECT_NE(error_of(s, "proj"), "<no error>");  // a suffix only at a "." boundary
  EXPECT_NE(error_of(s, "lm_head"), "<no error>");
  EXPECT_NE(error_of(s, ""), "<no error>");
  EXPECT_THROW(ms::lora_module_path(s, P::kAttnNorm, 0), ds::Error);
}

TEST(LoraTargets, ModulePathsAreTheHfTensorNames) {
  for (ms::ModelFamily f : {ms::ModelFamily::kLlama, ms::ModelFamily::kMixtral}) {
    const ms::ModelShape s = shape_of(f);
    const ms::HfFormat& hf = *ms::family_of(s).hf;
    for (P id : ms::lora_target_params(s, "all-linear")) {
      EXPECT_EQ(ms::lora_module_path(s, id, 2) + ".weight", hf.tensor_name(id, 2, 0));
    }
  }
}

TEST(LoraTargets, MixtralIsAttentionOnly) {
  const ms::ModelShape s = shape_of(ms::ModelFamily::kMixtral);
  EXPECT_EQ(ms::lora_target_params(s, "all-linear"), (std::vector<P>{P::kWq, P::kWk, P::kWv, P::kWo}));
  EXPECT_EQ(ms::lora_all_linear_names(s), (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj"}));
  EXPECT_EQ(error_of(s, "gate_proj"),
            "\"gate_proj\" names no LoRA target of model.type mixtral (valid: q_proj, k_proj, v_proj, o_proj, or "
            "\"all-linear\"); a Mixtral's experts and router are not LoRA targets in dstrain");
  EXPECT_NE(error_of(s, "w1"), "<no error>");
  EXPECT_THROW(ms::lora_module_path(s, P::kExpertW13, 0), ds::Error);
}

TEST(LoraTargets, Gpt2NamesArePefts) {
  const ms::ModelShape s = shape_of(ms::ModelFamily::kGpt2);
  EXPECT_EQ(ms::lora_target_params(s, "c_attn"), std::vector<P>{P::kQkvw});
  EXPECT_EQ(ms::lora_target_params(s, "c_proj"), (std::vector<P>{P::kAttprojw, P::kFcprojw}));  // PEFT's suffix match
  EXPECT_EQ(ms::lora_target_params(s, "attn.c_proj"), std::vector<P>{P::kAttprojw});
  EXPECT_EQ(ms::lora_target_params(s, "mlp.c_proj"), std::vector<P>{P::kFcprojw});
  EXPECT_EQ(ms::lora_target_params(s, "c_fc"), std::vector<P>{P::kFcw});
  EXPECT_EQ(ms::lora_target_params(s, "all-linear"), (std::vector<P>{P::kQkvw, P::kAttprojw, P::kFcw, P::kFcprojw}));
  EXPECT_EQ(ms::lora_all_linear_names(s), (std::vector<std::string>{"c_attn", "c_proj", "c_fc"}));
  EXPECT_EQ(ms::lora_target_names(s),
            (std::vector<std::string>{"c_attn", "c_proj", "c_fc", "attn.c_proj", "mlp.c_proj"}));
  EXPECT_EQ(ms::lora_module_path(s, P::kQkvw, 3), "transformer.h.3.attn.c_attn");
  EXPECT_EQ(ms::lora_module_path(s, P::kAttprojw, 0), "transformer.h.0.attn.c_proj");
  EXPECT_EQ(ms::lora_module_path(s, P::kFcw, 1), "transformer.h.1.mlp.c_fc");
  EXPECT_EQ(ms::lora_module_path(s, P::kFcprojw, 1), "transformer.h.1.mlp.c_proj");
  EXPECT_EQ(error_of(s, "q_proj"),
            "\"q_proj\" names no LoRA target of model.type gpt2 (valid: c_attn, c_proj, c_fc, attn.c_proj, "
            "mlp.c_proj, or \"all-linear\")");
  EXPECT_NE(error_of(s, "wte"), "<no error>");
  EXPECT_THROW(ms::lora_module_path(s, P::kQkvb, 0), ds::Error);
}
