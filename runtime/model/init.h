// Initial weights, layout-independent: each element is a pure function of (seed, tensor,
// layer, index in the full tensor), so a shard generates its part alone. The value kind is the
// tensor's (model_spec InitKind): GPT-2 as llm.c (normal(0, 0.02), 0.02/sqrt(2L) for the residual
// projections, zeros for biases, ones for LayerNorm weights); Llama as Hugging Face (normal(0,
// 0.02), norms 1).
#pragma once

#include <cstdint>

#include "model_spec/shape.h"

namespace ds::rt {

// A standard normal sample for (seed, tensor id, layer (-1 for global tensors), full index).
double init_normal(uint64_t seed, int tensor, int layer, int64_t index);
// U(0, 1) (open) from the same counter-based generator.
double init_uniform(uint64_t seed, int tensor, int layer, int64_t index);

// Writes `count` initial values of tp rank `tp_rank`'s shard of tensor `t` (layer `layer`),
// starting at local element `local_begin`, to dst. Deterministic, any thread count.
void init_tensor_values(float* dst, const model_spec::ParamTensor& t, int layer, int n_layer,
                        int tp, int tp_rank, uint64_t seed, int64_t local_begin, int64_t count, int ep = 1,
                        int ep_rank = 0);

}  // namespace ds::rt
