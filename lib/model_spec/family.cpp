// The registered families (family.h).
#include "model_spec/family.h"

namespace ds::model_spec {

namespace {

const FamilyDescription kGpt2Family{
    ModelFamily::kGpt2,
    "gpt2",
    "GPT-2",
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
    "Llama",
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

const FamilyDescription* const kFamilies[] = {&kGpt2Family, &kLlamaFamily};

}  // namespace

const FamilyDescription* find_family(std::string_view name) {
  for (const FamilyDescription* f : kFamilies) {
    if (name == f->name) return f;
  }
  return nullptr;
}

std::string family_names() {
  std::string out;
  for (const FamilyDescription* f : kFamilies) out += (out.empty() ? "" : ", ") + std::string(f->name);
  return out;
}

std::string describe_shape(const ModelShape& s) {
  const FamilyDescription& f = family_of(s);
  std::string out = std::string(f.display_name) + " L=" + std::to_string(s.n_layer) + " NH=" + std::to_string(s.n_head);
  if (f.grouped_query) out += " KV=" + std::to_string(s.n_kv_head);
  if (f.mlp == MlpKind::kSwiGlu) out += " I=" + std::to_string(s.intermediate_size);
  if (f.grouped_query && s.tie_embeddings) out += " tied";
  return out + " C=" + std::to_string(s.n_embd) + " V=" + std::to_string(s.vocab_size) + " (Vp " +
         std::to_string(s.padded_vocab_size) + ") T=" + std::to_string(s.seq_len);
}

const FamilyDescription& family_of(ModelFamily f) { return f == ModelFamily::kLlama ? kLlamaFamily : kGpt2Family; }

int kv_heads(const ModelShape& s) { return family_of(s).grouped_query ? s.n_kv_head : s.n_head; }

int mlp_width(const ModelShape& s) {
  return family_of(s).mlp == MlpKind::kSwiGlu ? s.intermediate_size : 4 * s.n_embd;
}

}  // namespace ds::model_spec
