// LoRA's adapters as tensors (PEFT's semantics): a targeted weight W (out, in) gets A (r, in) and
// B (out, r), and the layer computes y = W x + (alpha / r) B (A x). The adapters of a layer are
// one unit (UnitKind::kAdapters) placed after every other unit of the flat layout, so the frozen
// base is [0, adapter_begin) and the trainable adapters [adapter_begin, total): one region for
// ZeRO, the optimizer and checkpoints.
//
// Tensor parallelism shards the adapters as the base matrix is sharded: a column-parallel W
// (split by output rows) has A replicated and B split by rows as W's (with W's groups: GPT-2's
// fused qkv); a row-parallel W (split by input columns) has A split by columns and B replicated.
// Each rank's partial result is then exact under the tp regions the base already has; the
// replicated factor's gradient is a per-rank partial (dA of a column-parallel W, dB of a
// row-parallel one), summed over tp like the sequence-parallel norms' (hooks.h:
// tp_sum_partial_grads).
//
// Not here: which target names select which tensors (lora_targets.h), the math (the decoder).
#pragma once

#include <array>
#include <optional>
#include <vector>

#include "model_spec/shape.h"

namespace ds::model_spec {

// The weight matrices a LoRA may adapt, in the order of LoraShape::targets' bits and of the
// kLoraA*/kLoraB* ParamIds: GPT-2's four, then Llama's seven.
inline constexpr std::array<ParamId, 11> kLoraTargetable = {
    ParamId::kQkvw, ParamId::kAttprojw, ParamId::kFcw,  ParamId::kFcprojw, ParamId::kWq,   ParamId::kWk,
    ParamId::kWv,   ParamId::kWo,       ParamId::kWgate, ParamId::kWup,    ParamId::kWdown};

// Index of `base` in kLoraTargetable, or -1.
int lora_target_index(ParamId base);
ParamId lora_a_id(ParamId base);  // invalid_argument when `base` is not targetable
ParamId lora_b_id(ParamId base);
// The base matrix an adapter tensor belongs to, and whether it is the A (else B); nullopt for a
// tensor that is not an adapter.
std::optional<ParamId> lora_base_of(ParamId adapter);
bool is_lora_a(ParamId adapter);
bool lora_targets(const LoraShape& l, ParamId base);  // `base` is adapted

// The adapter tensors of `s` (empty without LoRA), in the family's order of the base tensors, A
// then B of each: A (r, in) Kaiming-uniform, B (out, r) zeros, split as the header says.
std::vector<ParamTensor> lora_params(const ModelShape& s, const std::vector<ParamTensor>& base);

// The targeted base tensors of one layer in the family's order (the decoder's per-layer list).
std::vector<ParamId> lora_layer_targets(const ModelShape& s);

}  // namespace ds::model_spec
