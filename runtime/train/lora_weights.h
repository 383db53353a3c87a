// The weights of a LoRA run (model_spec/lora_spec.h): the frozen base and the adapters.
//   base      the model's own parameters [0, adapter_begin) of its layout, outside ZeRO and the
//             optimizer: from model.init_from (llm.c's or Hugging Face's file, read as the
//             model without adapters), else random from training.seed exactly as a run without
//             LoRA would start. Loaded at every start, resume included (checkpoints hold the
//             adapters' state only).
//   adapters  the optimizer's region: from lora.init_from (PEFT's adapter directory), else PEFT's
//             initialisation from training.seed (A Kaiming-uniform, B zero).
//   exports   PEFT's files of the trained adapters (--export-adapter DIR), and the merged model
//             W + (alpha / r) B A in the family's own formats (--export-safetensors,
//             --export-llmc), computed from the whole model's fp32 values on rank 0.
// Collective where the engine's calls are (the exports). Runs in the model device's scope.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/peft_adapter.h"
#include "core/allocator.h"
#include "model_spec/shape.h"
#include "parallel/engine.h"
#include "train/optimizer_state.h"

namespace ds::rt::train {

// The model without its adapters: `shape` with LoRA off (its layout is the base region's).
model_spec::ModelShape lora_base_shape(const model_spec::ModelShape& shape);

void init_lora_base(parallel::Engine& engine, const std::string& init_from, uint64_t seed, Allocator& alloc);
// `adapter_dir`: a PEFT adapter directory, or "" for fresh adapters from `seed`.
void init_lora_adapters(parallel::Engine& engine, OptimizerState& state, const std::string& adapter_dir, uint64_t seed,
                        Allocator& alloc);

// From the whole LoRA model's values (param_layout(shape, whole)): the base model's values
// (param_layout(lora_base_shape(shape), whole)) with every adapted W replaced by W + (alpha/r) B A.
std::vector<float> merge_lora(const model_spec::ModelShape& shape, const float* whole);
// The adapters of the whole LoRA model's values, as PEFT's files hold them.
ckpt::PeftAdapter peft_adapter_of(const model_spec::ModelShape& shape, const float* whole,
                                  const std::vector<std::string>& target_modules, const std::string& base_model);

}  // namespace ds::rt::train
