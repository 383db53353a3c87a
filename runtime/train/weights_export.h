// Writing a run's weights in its family's formats (model_spec/family.h): one llm.c checkpoint
// (dstrain train --export-llmc, families with llmc_checkpoint) or Hugging Face safetensors with a
// config.json (--export-safetensors, families with an HfFormat), from any layout.
// Collective over the world:
//   1. each rank's part (its stage's layers, its tp shard) as fp32 weights on the host: the
//      master weights with mixed precision (a LoRA run's frozen base: the model's own values), assembled from the dp group's partitions where ZeRO
//      splits them (collective over the dp group);
//   2. without tensor or pipeline parallelism rank 0 writes it; otherwise dp rank 0 of every
//      (stage, tp rank) part sends it to rank 0 over the host world, which places every element at
//      its index in the whole model (model_spec::full_index undoes the tp split; the tied wte
//      comes from the first and the last stage, which hold the same values) and writes the files.
// Every rank returns once the file exists.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/allocator.h"
#include "layout/choices.h"
#include "parallel/engine.h"
#include "train/optimizer_state.h"

namespace ds::rt::train {

// `bf16`: llm.c's version 5 file (each fp32 master value rounded to bf16 once), else version 3.
void write_llmc_export(const std::string& path, parallel::Engine& engine, const std::vector<OptimizerState*>& states,
                       layout::StageSplit split, Allocator& alloc, Device device, bool bf16 = false);
// the family's Hugging Face layout in `dtype` into `dir` (checkpoint/hf_safetensors.h, save_hf_safetensors).
void write_safetensors_export(const std::string& dir, parallel::Engine& engine, const std::vector<OptimizerState*>& states,
                              layout::StageSplit split, Allocator& alloc, Device device, ckpt::StDtype dtype);
// LoRA (lora_weights.h): PEFT's adapter_config.json and adapter_model.safetensors in `dtype` into
// `dir` (--export-adapter); the two exports above write the merged model W + (alpha/r) B A.
void write_adapter_export(const std::string& dir, parallel::Engine& engine, const std::vector<OptimizerState*>& states,
                          layout::StageSplit split, Allocator& alloc, Device device, ckpt::StDtype dtype,
                          const std::vector<std::string>& target_modules, const std::string& base_model);
// Steps 1 and 2 above, then `write` on rank 0 with the whole model's fp32 values (the layout of
// model_spec::param_layout(shape, ModelPart::whole(shape))).
void write_whole_model(parallel::Engine& engine, const std::vector<OptimizerState*>& states, layout::StageSplit split, Allocator& alloc,
                       Device device, const std::function<void(const float*)>& write);

}  // namespace ds::rt::train
