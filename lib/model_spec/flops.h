// FLOPs of a model, counted one way for every family and every user (the trainer's MFU, gpu_bench,
// the plan's step-time model): matmul FLOPs from the family's own tensor list (model_spec), so a
// new family is counted without a formula of its own.
//
// The MFU convention (docs/training.md, "MFU") is llm.c's (gpt2_estimate_mfu) and PaLM's appendix B
// with the causal mask: per token, 6N for the weight matmuls of forward and backward (N: every
// parameter, the padded vocabulary included: the tied embedding is also the classifier) plus
// 6·L·(NH·hd)·T for the attention matmuls (QKᵀ and A·V, forward and backward, counted once under
// the causal mask; PaLM's 12·L·C·T counts the full square). llm.c's count is chosen because its
// published GPT-2 MFU figures are the peer the GPU benchmark is read against. Model FLOPs, not
// hardware FLOPs: recomputation is not counted.
#pragma once

#include "model_spec/shape.h"

namespace ds::model_spec {

// 6N + 6·L·(NH·hd)·T for sequences of T tokens (N = active_param_count(s): a mixture of experts
// counts the k experts a token is routed to, not all E, as Megatron and DeepSpeed count MoE MFU).
double model_flops_per_token(const ModelShape& s, int T);

// Elements of one layer's weight matrices (every per-layer tensor of two dimensions, whole model;
// of stacked experts the k of E a token uses): the matmuls a token's forward runs twice each
// (multiply and add).
double layer_matmul_params(const ModelShape& s);

// Hardware-style FLOPs of one sequence of T tokens, for the step-time model's rescaling between
// shapes: one layer's forward (2·T·layer_matmul_params + 4·T²·NH·hd: QKᵀ and A·V over the full
// square), and the head's logits matmul forward and backward (3 · 2·T·C·Vp).
double layer_forward_flops(const ModelShape& s, int T);
double head_flops(const ModelShape& s, int T);

}  // namespace ds::model_spec
