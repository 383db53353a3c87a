// LoRA target names (lora_targets.h). Each family has a small table: a linear layer's path inside a
// block, as Hugging Face names it, and the base tensor it is. A name selects the rows whose path is
// the name or ends in "." + name, which is PEFT's suffix match for a list of target_modules, so
// "c_proj" selects both of GPT-2's projections and "attn.c_proj" only the attention's.
#include "model_spec/lora_targets.h"

#include <fmt/format.h>

#include <algorithm>
#include <span>

#include "common/error.h"
#include "model_spec/family.h"

namespace ds::model_spec {

namespace {

struct LoraRow {
  const char* path;  // inside a block: "self_attn.q_proj"
  ParamId id;
};

constexpr LoraRow kLoraLlamaRows[] = {
    {"self_attn.q_proj", ParamId::kWq},  {"self_attn.k_proj", ParamId::kWk}, {"self_attn.v_proj", ParamId::kWv},
    {"self_attn.o_proj", ParamId::kWo},  {"mlp.gate_proj", ParamId::kWgate}, {"mlp.up_proj", ParamId::kWup},
    {"mlp.down_proj", ParamId::kWdown},
};
constexpr LoraRow kLoraGpt2Rows[] = {
    {"attn.c_attn", ParamId::kQkvw},
    {"attn.c_proj", ParamId::kAttprojw},
    {"mlp.c_fc", ParamId::kFcw},
    {"mlp.c_proj", ParamId::kFcprojw},
};

std::span<const LoraRow> lora_rows(const ModelShape& s) {
  switch (s.family) {
    case ModelFamily::kGpt2: return kLoraGpt2Rows;
    case ModelFamily::kLlama: return kLoraLlamaRows;
    case ModelFamily::kMixtral: return std::span<const LoraRow>(kLoraLlamaRows).first(4);  // attention only
  }
  return {};
}

// The prefix of a block's modules: "model.layers.3." / "transformer.h.3.".
std::string lora_block_prefix(const ModelShape& s, int layer) {
  return s.family == ModelFamily::kGpt2 ? fmt::format("transformer.h.{}.", layer)
                                        : fmt::format("model.layers.{}.", layer);
}

bool lora_suffix_match(std::string_view path, std::string_view name) {
  if (name.empty() || name.size() > path.size()) return false;
  if (path == name) return true;
  return path.ends_with(name) && path[path.size() - name.size() - 1] == '.';
}

std::string lora_leaf(std::string_view path) { return std::string(path.substr(path.rfind('.') + 1)); }

}  // namespace

std::vector<std::string> lora_all_linear_names(const ModelShape& s) {
  std::vector<std::string> out;
  for (const LoraRow& r : lora_rows(s)) {
    const std::string l = lora_leaf(r.path);
    if (std::find(out.begin(), out.end(), l) == out.end()) out.push_back(l);
  }
  return out;
}

std::vector<std::string> lora_target_names(const ModelShape& s) {
  std::vector<std::string> out = lora_all_linear_names(s);
  if (s.family == ModelFamily::kGpt2) {
    out.emplace_back("attn.c_proj");
    out.emplace_back("mlp.c_proj");
  }
  return out;
}

std::vector<ParamId> lora_target_params(const ModelShape& s, const std::string& name) {
  std::vector<ParamId> out;
  for (const LoraRow& r : lora_rows(s)) {
    if (name == kLoraAllLinear || lora_suffix_match(r.path, name)) out.push_back(r.id);
  }
  if (out.empty()) {
    std::string valid;
    for (const std::string& n : lora_target_names(s)) valid += n + ", ";
    throw invalid_argument("\"{}\" names no LoRA target of model.type {} (valid: {}or \"{}\"){}", name,
                           family_of(s).name, valid, kLoraAllLinear,
                           s.family == ModelFamily::kMixtral
                               ? "; a Mixtral's experts and router are not LoRA targets in dstrain"
                               : "");
  }
  return out;
}

std::string lora_module_path(const ModelShape& s, ParamId id, int layer) {
  for (const LoraRow& r : lora_rows(s)) {
    if (r.id == id) return lora_block_prefix(s, layer) + r.path;
  }
  throw invalid_argument("parameter tensor #{} is not a LoRA target of model.type {}", static_cast<int>(id),
                         family_of(s).name);
}

}  // namespace ds::model_spec
