// LoRA's target names (PEFT's `target_modules`) for each family: which base weight tensors a name
// selects, and the Hugging Face module path PEFT stores an adapted tensor's A and B under. The
// config checks `lora.target_modules` with these; the model adapts the tensors they select; the
// adapter files (runtime/checkpoint/peft_adapter.h) name modules with lora_module_path.
//
// Names are PEFT's, matched as PEFT matches a list: a name selects every module whose path ends in
// it at a "." boundary. Llama: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
// Mixtral: the four attention ones only (its MLP is the experts, which dstrain does not adapt);
// GPT-2: c_attn, c_proj (both attn.c_proj and mlp.c_proj, as PEFT's suffix match), c_fc, and
// attn.c_proj / mlp.c_proj to pick one. "all-linear" is every linear layer of a block (PEFT's
// meaning: all but the lm_head).
//
// Pure: no runtime types, no config types. Throws ds::Error (invalid argument) on a bad name.
#pragma once

#include <string>
#include <vector>

#include "model_spec/shape.h"

namespace ds::model_spec {

inline constexpr const char* kLoraAllLinear = "all-linear";

// The base weight tensors a LoRA target name selects for the family of `s` (kWq, kWk, kWv, kWo,
// kWgate, kWup, kWdown for llama/mixtral; kQkvw, kAttprojw, kFcw, kFcprojw for gpt2), in the
// family's parameter order. "all-linear" selects them all. Throws invalid_argument naming the name
// and listing the valid ones when it selects nothing.
std::vector<ParamId> lora_target_params(const ModelShape& s, const std::string& name);
// The valid names (without "all-linear"), for messages: "q_proj", "k_proj", ...
std::vector<std::string> lora_target_names(const ModelShape& s);
// What "all-linear" expands to, as PEFT writes it into adapter_config.json: the last component of
// every adapted module's name, once each (GPT-2: c_attn, c_proj, c_fc).
std::vector<std::string> lora_all_linear_names(const ModelShape& s);
// The HF module path of base tensor `id` at `layer` as PEFT names it after "base_model.model.":
// llama "model.layers.3.self_attn.q_proj", gpt2 "transformer.h.3.attn.c_attn". invalid_argument
// when `id` is not a LoRA target of the family.
std::string lora_module_path(const ModelShape& s, ParamId id, int layer);

}  // namespace ds::model_spec
