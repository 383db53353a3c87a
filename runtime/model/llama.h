// A Llama is the one decoder (decoder.h) with the Llama family (model_spec/family.h): Hugging
// Face's LlamaForCausalLM, pre-RMSNorm, rotary positions (rotate_half), grouped-query attention,
// a SwiGLU MLP, no biases, an lm_head tied or not. These names are kept for the callers and tests
// written before the families shared one model.
#pragma once

#include "model/decoder.h"

namespace ds::rt {

using Llama = Decoder;
using LlamaActivations = DecoderActivations;

}  // namespace ds::rt
