#include "model_spec/named_shapes.h"

#include <array>

#include "common/error.h"

namespace ds::model_spec {

namespace {

ModelShape llama_shape(int L, int NH, int KV, int C, int I, int V, int maxT) {
  ModelShape s{L, NH, C, V, V, maxT};
  s.family = ModelFamily::kLlama;
  s.n_kv_head = KV;
  s.intermediate_size = I;
  return s;
}

ModelShape mixtral_shape(int L, int NH, int KV, int C, int I, int E, int k, int V, int maxT) {
  ModelShape s = llama_shape(L, NH, KV, C, I, V, maxT);
  s.family = ModelFamily::kMixtral;
  s.num_local_experts = E;
  s.num_experts_per_tok = k;
  return s;
}

const std::array<NamedShape, 8>& table() {
  static const std::array<NamedShape, 8> t = {{
      {"124m", "GPT-2 124M (llm.c's shape, Vp 50304)", ModelShape::gpt2_124m()},
      {"350m", "GPT-2 350M (llm.c's shape, Vp 50304)", ModelShape{24, 16, 1024, 50257, 50304, 1024}},
      {"llama-1b", "a Llama of TinyLlama-1.1B's shape (GQA 32/4, SwiGLU 5632, V 32000)",
       llama_shape(22, 32, 4, 2048, 5632, 32000, 2048)},
      {"mixtral-0.9b",
       "a 12-layer Mixtral: C 1024, GQA 16/4, 8 experts of SwiGLU 2816, top 2, V 32000 (0.93B parameters, 0.30B "
       "active)",
       mixtral_shape(12, 16, 4, 1024, 2816, 8, 2, 32000, 2048)},
      {"step-s", "step_bench S: a 4-layer GPT-2, C 256, V 4096", ModelShape{4, 4, 256, 4096, 4096, 128}},
      {"step-m", "step_bench M: a 6-layer GPT-2, C 384, GPT-2's vocabulary",
       ModelShape{6, 6, 384, 50304, 50304, 256}},
      {"step-l", "step_bench L: a 4-layer Llama, C 256, GQA 4/2, SwiGLU 704, V 4096",
       llama_shape(4, 4, 2, 256, 704, 4096, 128)},
      {"step-moe", "step_bench MoE: the L row with every MLP 8 experts of its size, top 2 (a 4-layer Mixtral)",
       mixtral_shape(4, 4, 2, 256, 704, 8, 2, 4096, 128)},
  }};
  return t;
}

}  // namespace

std::span<const NamedShape> named_shapes() { return table(); }

std::string named_shape_names() {
  std::string s;
  for (const NamedShape& n : table()) s += (s.empty() ? "" : ", ") + std::string(n.name);
  return s;
}

const NamedShape& named_shape(std::string_view name, std::string_view what_asks) {
  for (const NamedShape& n : table()) {
    if (name == n.name) return n;
  }
  throw invalid_argument("{}: no model shape named '{}' (named shapes: {})", what_asks, name, named_shape_names());
}

}  // namespace ds::model_spec
