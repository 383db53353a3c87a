// GPT-2 is the one decoder (decoder.h) with the GPT-2 family (model_spec/family.h): pre-LayerNorm,
// learned positions, fused qkv with biases, a 4C GELU MLP, the lm_head tied to the token
// embedding. These names are kept for the callers and tests written before the families shared
// one model.
#pragma once

#include "model/decoder.h"

namespace ds::rt {

using Gpt2 = Decoder;
using Gpt2Options = ModelOptions;
using Gpt2Activations = DecoderActivations;

}  // namespace ds::rt
