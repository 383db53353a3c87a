// PEFT's LoRA adapter directory, read and written: adapter_config.json (peft.LoraConfig's fields)
// and adapter_model.safetensors (each adapted module's lora_A and lora_B), the files
// `peft.PeftModel.from_pretrained(base, DIR)` loads and `model.save_pretrained(DIR)` writes.
//
// Tensor names: base_model.model.<module>.lora_A.weight (r, in) and .lora_B.weight (out, r), with
// <module> the Hugging Face module path ("model.layers.0.self_attn.q_proj",
// "transformer.h.0.attn.c_attn"; model_spec::lora_module_path). A is (r, in) and B (out, r) for
// GPT-2's Conv1D too (fan_in_fan_out only changes how PEFT merges the update into the base).
//
// Not here: which dstrain tensor a module is (model_spec/lora_targets.h), the adapters' math, or
// comparing an adapter against the config's lora section (the runtime does both). Adapters PEFT can
// write but dstrain does not run are refused when read, naming the key: DoRA (use_dora), rsLoRA's
// scaling (use_rslora), trained biases (bias other than "none"), modules_to_save, and per-module
// ranks or alphas (rank_pattern, alpha_pattern).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"

namespace ds::rt::ckpt {

struct PeftAdapterConfig {
  int r = 0;
  double lora_alpha = 0;  // absent from the file: 8, PEFT's default
  double lora_dropout = 0;
  std::vector<std::string> target_modules;  // as written in the file (a string there: one entry)
  bool fan_in_fan_out = false;              // PEFT sets it for GPT-2's Conv1D
  std::string base_model_name_or_path;      // null or absent: ""
};

// One adapted module: A (r x in), B (out x r), fp32, row-major.
struct PeftModuleWeights {
  std::string module;  // the HF module path after "base_model.model.", e.g. "model.layers.0.self_attn.q_proj"
  int64_t in = 0, out = 0;
  std::vector<float> a, b;
};

struct PeftAdapter {
  PeftAdapterConfig config;
  std::vector<PeftModuleWeights> modules;
};

// Reads DIR/adapter_config.json and DIR/adapter_model.safetensors. Checks: peft_type "LORA"; r an
// integer >= 1; target_modules a list of strings (or one string); the unsupported features above
// off; every tensor named base_model.model.<module>.lora_A.weight / .lora_B.weight (".lora_A.
// default.weight", as some PEFT versions write, is accepted and ".default" stripped); each module
// has both; A is (r, in) and B is (out, r) with r the config's; F32/BF16/F16 tensors (widened to
// fp32 exactly). Modules in file order (the first of their two tensors in the data section).
// Throws invalid_argument naming the file and the key or tensor (a missing file included: it
// names the file and what the directory must hold).
PeftAdapter read_peft_adapter(const std::string& dir);

// Writes both files atomically (temporary name, then rename; atomic_file.h) into `dir` (created if
// missing): adapter_model.safetensors first, with the tensors in `dtype` (F32 / BF16 / F16, 16 bits
// rounded to nearest even) named base_model.model.<module>.lora_A.weight / lora_B.weight, module by
// module, A before B, metadata {"format": "pt"}; then adapter_config.json as
// peft.PeftModel.from_pretrained loads it: peft_type "LORA", task_type "CAUSAL_LM", r, lora_alpha,
// lora_dropout, target_modules, fan_in_fan_out, bias "none", inference_mode true,
// base_model_name_or_path (null when ""), modules_to_save null, init_lora_weights true.
// invalid_argument (nothing written) when r < 1, a module name is empty or repeated, or a module's
// a / b do not hold r x in / out x r values.
void write_peft_adapter(const std::string& dir, const PeftAdapter& adapter, StDtype dtype);

}  // namespace ds::rt::ckpt
