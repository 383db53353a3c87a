// The registered families (family.h).
#include "model_spec/family.h"

#include <cstdint>
#include <limits>

#include "common/error.h"
#include "model_spec/gpt2_spec.h"
#include "model_spec/llama_spec.h"
#include "model_spec/mixtral_spec.h"

namespace ds::model_spec {

namespace {

// Function-local statics: the descriptions hold vectors, built on first use (no static
// initialisation order to depend on).
const HfFormat kGpt2Hf{"GPT2LMHeadModel", "gpt2", &gpt2_hf_name, &gpt2_hf_config, /*pieces=*/nullptr,
                       &gpt2_hf_transposed, &gpt2_hf_ignored, "transformer.", &gpt2_hf_checks};

const FamilyDescription& gpt2_family() {
  static const FamilyDescription f{
    ModelFamily::kGpt2,
    "gpt2",
    "GPT-2",
    NormKind::kLayerNorm,
    PositionKind::kLearned,
    MlpKind::kGelu,
    /*grouped_query=*/false,
    /*head_always_tied=*/true,
    LayerRoles{ParamId::kLn1w, ParamId::kLn1b, ParamId::kQkvw, ParamId::kQkvb, ParamId::kAttprojw,
               ParamId::kAttprojb, ParamId::kLn2w, ParamId::kLn2b, ParamId::kFcw, ParamId::kFcb,
               ParamId::kFcprojw, ParamId::kFcprojb, ParamId::kLnfw, ParamId::kLnfb, std::nullopt},
    &gpt2_params,
    &gpt2_activations,
    /*keys=*/{},
    /*vocab_multiple=*/128,  // llm.c pads 50257 to 50304
    /*max_vocab_size=*/65536,
    /*resolve=*/nullptr,
    /*check=*/nullptr,
    &check_gpt2_tp,
    /*llmc_checkpoint=*/true,
    &kGpt2Hf,
  };
  return f;
}

// Llama's own keys, shared by the families built on its attention.
std::vector<FamilyKey> llama_keys() {
  return {int_key("n_kv_head", &ModelShape::n_kv_head, false, "grouped-query attention's kv heads; default n_head"),
          int_key("intermediate_size", &ModelShape::intermediate_size, true, "the SwiGLU width"),
          number_key("rope_theta", &ModelShape::rope_theta, 0.0, std::numeric_limits<double>::infinity(),
                     "the rotary base"),
          number_key("norm_eps", &ModelShape::norm_eps, 0.0, 1.0, "RMSNorm's epsilon"),
          bool_key("tie_embeddings", &ModelShape::tie_embeddings, "lm_head shares the token embedding")};
}

const HfFormat kLlamaHf{"LlamaForCausalLM", "llama", &llama_hf_name, &llama_hf_config};

const FamilyDescription& llama_family() {
  static const FamilyDescription f{
    ModelFamily::kLlama,
    "llama",
    "Llama",
    NormKind::kRmsNorm,
    PositionKind::kRope,
    MlpKind::kSwiGlu,
    /*grouped_query=*/true,
    /*head_always_tied=*/false,
    LayerRoles{ParamId::kAttnNorm, std::nullopt, ParamId::kWq, std::nullopt, ParamId::kWo, std::nullopt,
               ParamId::kMlpNorm, std::nullopt, ParamId::kWgate, std::nullopt, ParamId::kWdown, std::nullopt,
               ParamId::kLnfw, std::nullopt, std::nullopt},
    &llama_params,
    &llama_activations,
    llama_keys(),
    /*vocab_multiple=*/1,  // Hugging Face does not pad
    /*max_vocab_size=*/std::numeric_limits<int32_t>::max(),
    &resolve_llama,
    &check_llama,
    &check_llama_tp,
    /*llmc_checkpoint=*/false,
    &kLlamaHf,
  };
  return f;
}

const HfFormat kMixtralHf{"MixtralForCausalLM", "mixtral", &mixtral_hf_name, &mixtral_hf_config, &mixtral_hf_pieces};

const FamilyDescription& mixtral_family() {
  static const FamilyDescription f{
    ModelFamily::kMixtral,
    "mixtral",
    "Mixtral",
    NormKind::kRmsNorm,
    PositionKind::kRope,
    MlpKind::kMoe,
    /*grouped_query=*/true,
    /*head_always_tied=*/false,
    LayerRoles{ParamId::kAttnNorm, std::nullopt, ParamId::kWq, std::nullopt, ParamId::kWo, std::nullopt,
               ParamId::kMlpNorm, std::nullopt, ParamId::kExpertW13, std::nullopt, ParamId::kExpertW2, std::nullopt,
               ParamId::kLnfw, std::nullopt, ParamId::kRouter},
    &mixtral_params,
    &mixtral_activations,
    [] {
      std::vector<FamilyKey> k = llama_keys();
      k[1].what = "each expert's SwiGLU width";
      k.push_back(int_key("num_local_experts", &ModelShape::num_local_experts, true, "the experts of each layer"));
      k.push_back(int_key("num_experts_per_tok", &ModelShape::num_experts_per_tok, false,
                          "the experts each token is routed to; default 2"));
      k.push_back(nonnegative_key("router_aux_loss_coef", &ModelShape::router_aux_loss_coef,
                                  "the load-balancing loss's weight; default 0.02"));
      return k;
    }(),
    /*vocab_multiple=*/1,
    /*max_vocab_size=*/std::numeric_limits<int32_t>::max(),
    &resolve_llama,
    &check_mixtral,
    &check_llama_tp,
    /*llmc_checkpoint=*/false,
    &kMixtralHf,
  };
  return f;
}

}  // namespace

int hf_pieces(const HfFormat& hf, ParamId id, const ModelShape& s) { return hf.pieces != nullptr ? hf.pieces(id, s) : 1; }
bool hf_transposed(const HfFormat& hf, ParamId id) { return hf.transposed != nullptr && hf.transposed(id); }

FamilyKey nonnegative_key(const char* key, double ModelShape::*field, const char* what) {
  FamilyKey k = number_key(key, field, 0.0, std::numeric_limits<double>::infinity(), what);
  k.lo_open = false;
  return k;
}

FamilyKey int_key(const char* key, int ModelShape::*field, bool required, const char* what) {
  FamilyKey k{key, FamilyKey::Kind::kInt, required, what};
  k.int_field = field;
  k.lo = 1;
  k.hi = std::numeric_limits<int32_t>::max();
  return k;
}
FamilyKey number_key(const char* key, double ModelShape::*field, double lo_open, double hi, const char* what) {
  FamilyKey k{key, FamilyKey::Kind::kNumber, false, what};
  k.number_field = field;
  k.lo = lo_open;
  k.hi = hi;
  return k;
}
FamilyKey bool_key(const char* key, bool ModelShape::*field, const char* what) {
  FamilyKey k{key, FamilyKey::Kind::kBool, false, what};
  k.bool_field = field;
  return k;
}

const std::vector<const FamilyDescription*>& all_families() {
  static const std::vector<const FamilyDescription*> families{&gpt2_family(), &llama_family(),
                                                              &mixtral_family()};
  return families;
}

const FamilyDescription* find_family(std::string_view name) {
  for (const FamilyDescription* f : all_families()) {
    if (name == f->name) return f;
  }
  return nullptr;
}

const FamilyDescription& llmc_family() {
  for (const FamilyDescription* f : all_families()) {
    if (f->llmc_checkpoint) return *f;
  }
  throw invalid_usage("no registered family has llm.c's checkpoint format");
}

std::string family_names() {
  std::string out;
  for (const FamilyDescription* f : all_families()) out += (out.empty() ? "" : ", ") + std::string(f->name);
  return out;
}

std::string describe_shape(const ModelShape& s) {
  const FamilyDescription& f = family_of(s);
  std::string out = std::string(f.display_name) + " L=" + std::to_string(s.n_layer) + " NH=" + std::to_string(s.n_head);
  if (f.grouped_query) out += " KV=" + std::to_string(s.n_kv_head);
  if (f.mlp != MlpKind::kGelu) out += " I=" + std::to_string(s.intermediate_size);
  if (f.mlp == MlpKind::kMoe) {
    out += " E=" + std::to_string(s.num_local_experts) + " top-" + std::to_string(s.num_experts_per_tok);
  }
  if (f.grouped_query && s.tie_embeddings) out += " tied";
  return out + " C=" + std::to_string(s.n_embd) + " V=" + std::to_string(s.vocab_size) + " (Vp " +
         std::to_string(s.padded_vocab_size) + ") T=" + std::to_string(s.seq_len);
}

const FamilyDescription& family_of(ModelFamily f) {
  for (const FamilyDescription* d : all_families()) {
    if (d->family == f) return *d;
  }
  throw invalid_usage("model family #{} is not registered (model_spec/family.cpp)", static_cast<int>(f));
}

int kv_heads(const ModelShape& s) { return family_of(s).grouped_query ? s.n_kv_head : s.n_head; }

int mlp_width(const ModelShape& s) {
  return family_of(s).mlp == MlpKind::kGelu ? 4 * s.n_embd : s.intermediate_size;
}

}  // namespace ds::model_spec
