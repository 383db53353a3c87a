// Hugging Face weights in safetensors (checkpoint/safetensors.h), to and from dstrain's flat
// parameter layout (model_spec::param_layout), for any family whose description has a Hugging
// Face format (model_spec/family.h, HfFormat: tensor names, architecture, config.json keys). HF
// stores the embedding and lm_head as (vocab_size, C): with a padded vocabulary
// (padded_vocab_size > vocab_size, GPT-2's 50304) the extra rows are zero on import and dropped
// on export.
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint/safetensors.h"
#include "model_spec/family.h"
#include "model_spec/shape.h"

namespace ds::rt::ckpt {

// Whether `path` names Hugging Face safetensors rather than a family's own checkpoint file (llm.c's
// for GPT-2): a directory, or a file whose name ends in .safetensors. Looks at the name only.
bool is_hf_weights_path(const std::string& path);

// The family's Hugging Face format; invalid_argument naming model.type and the families that have
// one when it has none. `what` names the caller ("--export-safetensors", "training.init_from").
const model_spec::HfFormat& hf_format(const model_spec::ModelShape& shape, const char* what);

// Fills `params` (the part's layout.total fp32 values) with this part's share of the weights in
// `path` (a .safetensors file, or a directory with model.safetensors.index.json and shards, or
// with model.safetensors). F32/BF16/F16 read exactly into fp32; a tensor the format transposes
// (HfFormat::transposed) is read as HF's (in, out) and stored as dstrain's (out, in); a position
// embedding with more rows than model.seq_len gives its first seq_len.
// invalid_argument naming the file and tensor when a tensor is missing, has another shape (both
// named), or the file holds tensors this model has no place for (more layers; the format's
// ignored buffers are skipped; an lm_head for a tied model must equal the embedding). A format
// with a base_prefix also reads the base model's names (without it). A format with import_checks
// requires the config.json beside the weights and each checked key in it (invalid_argument
// naming config.json and the key, with the expected value).
void load_hf_safetensors(const std::string& path, const model_spec::ModelShape& shape,
                         const model_spec::ModelPart& part, float* params);

// Writes the whole model (`whole`: the values of param_layout(shape, whole model)) into `dir` as
// HF's layout in `dtype` (model.safetensors, or shards of at most max_shard_bytes with an index;
// the format's transposed tensors as HF's (in, out)) plus a config.json that transformers reads.
// Returns the files written.
std::vector<std::string> save_hf_safetensors(const std::string& dir, const model_spec::ModelShape& shape,
                                             const float* whole, StDtype dtype,
                                             uint64_t max_shard_bytes = uint64_t{5} << 30);

// The config.json text for `shape`: architectures and model_type from the family's format, its
// config keys, torch_dtype.
std::string hf_config_json(const model_spec::ModelShape& shape, StDtype dtype);

}  // namespace ds::rt::ckpt
