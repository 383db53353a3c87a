// Llama's shape rules, used by ModelShape::validate / validate_tp (gpt2_spec.cpp); defined in
// llama_spec.cpp. Internal to ds_model_spec.
#pragma once

#include "model_spec/gpt2_spec.h"

namespace ds::model_spec {

void validate_llama(const ModelShape& s);
void validate_llama_tp(const ModelShape& s, int tp);

}  // namespace ds::model_spec
