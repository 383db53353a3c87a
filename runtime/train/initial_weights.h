// A fresh run's initial weights, the same whatever the layout: from an llm.c checkpoint or Hugging
// Face safetensors (model.init_from or --init-from), else random from training.seed (model/init.h, a function of
// each element's place in the whole model). Each rank fills its optimizer range
// (OptimizerState::init_from_f32: the master copy, the model's rounded values, ZeRO's gathers of
// the rest). Runs inside the model device's scope.
#pragma once

#include <cstdint>
#include <string>

#include "core/allocator.h"
#include "parallel/engine.h"
#include "train/optimizer_state.h"

namespace ds::rt::train {

// The part's fp32 values (param_layout(shape, part).total) from a weights file: Hugging Face
// safetensors (a directory or a .safetensors file, or any path of a family without llm.c's
// format), else llm.c's checkpoint. The one place that chooses the format.
void load_weights_file(const std::string& path, const model_spec::ModelShape& shape,
                       const model_spec::ModelPart& part, float* dst);

// `init_from`: an llm.c checkpoint (families with one), Hugging Face safetensors (a directory or a
// .safetensors file; checkpoint/hf_safetensors.h), or "" for random weights from `seed`.
void init_weights(parallel::Engine& engine, OptimizerState& state, const std::string& init_from, uint64_t seed,
                  Allocator& alloc);

}  // namespace ds::rt::train
