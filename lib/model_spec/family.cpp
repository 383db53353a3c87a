// The registered families (family.h).
#include "model_spec/family.h"

namespace ds::model_spec {

namespace {

const FamilyDescription kGpt2Family{
    ModelFamily::kGpt2,
    "gpt2",
    NormKind::kLayerNorm,
    PositionKind::kLearned,
    MlpKind::kGelu,
    false,
    LayerRoles{ParamId::kLn1w, ParamId::kLn1b, ParamId::kQkvw, ParamId::kQkvb, ParamId::kAttprojw,
               ParamId::kAttprojb, ParamId::kLn2w, ParamId::kLn2b, ParamId::kFcw, ParamId::kFcb,
               ParamId::kFcprojw, ParamId::kFcprojb, ParamId::kLnfw, ParamId::kLnfb},
    &gpt2_params,
    &gpt2_activations,
};

const FamilyDescription kLlamaFamily{
    ModelFamily::kLlama,
    "llama",
    NormKind::kRmsNorm,
    PositionKind::kRope,
    MlpKind::kSwiGlu,
    true,
    LayerRoles{ParamId::kAttnNorm, std::nullopt, ParamId::kWq, std::nullopt, ParamId::kWo, std::nullopt,
               ParamId::kMlpNorm, std::nullopt, ParamId::kWgate, std::nullopt, ParamId::kWdown, std::nullopt,
               ParamId::kLnfw, std::nullopt},
    &llama_params,
    &llama_activations,
};

}  // namespace

const FamilyDescription& family_of(ModelFamily f) { return f == ModelFamily::kLlama ? kLlamaFamily : kGpt2Family; }

int kv_heads(const ModelShape& s) { return family_of(s).grouped_query ? s.n_kv_head : s.n_head; }

int mlp_width(const ModelShape& s) {
  return family_of(s).mlp == MlpKind::kSwiGlu ? s.intermediate_size : 4 * s.n_embd;
}

}  // namespace ds::model_spec
