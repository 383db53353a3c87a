// Samples: text a model writes, for `dstrain sample` and for training.sample_interval (llm.c
// prints one every so often while it trains). Any family. The model comes from a dstrain
// checkpoint (any layout: the parts are reassembled into the whole model,
// checkpoint/part_reader.h) or an llm.c file, as fp32 weights on the host; generation runs on the
// CPU with a KV cache (model/generate.h).
//
// Tokenizers: the run's, through TextCodec. A model whose vocabulary is 256 or less is byte-level
// (one token per byte) unless a tokenizer is named; a larger one needs the tokenizer its data was
// prepared with (data/tokenizer.h: GPT-2's BPE, SentencePiece, llm.c's decode-only file), named
// by a TokenizerSpec. codec_for() is the one place that chooses.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/job_config.h"
#include "data/tokenizer.h"
#include "model/generate.h"
#include "model_spec/shape.h"

namespace ds::rt::train {

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual std::string name() const = 0;
  // invalid_argument naming the offending byte or token.
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& tokens) const = 0;
  // The first token of an empty prompt (the tokenizer's document token, <|endoftext|> for GPT-2's
  // BPE; byte-level: '\n').
  virtual int32_t start_token() const = 0;
};

// The tokenizer for a model of `vocab_size` tokens: `spec` when given ("byte": byte-level for any vocabulary),
// else byte-level; an error naming the options when the vocabulary is larger than byte-level
// and no tokenizer is given.
std::unique_ptr<TextCodec> codec_for(int vocab_size, const data::TokenizerSpec* spec = nullptr);

struct SamplingModel {
  model_spec::ModelShape shape;
  std::vector<float> params;  // whole model, fp32, flat layout
  std::string source;         // "checkpoint DIR (step N)" or "llm.c file F", for messages
};

// A dstrain checkpoint: DIR is a step directory (with manifest.json) or a training.checkpoint_dir
// (its `latest`). Master weights (fp32) where the run kept them, else the parameters.
// invalid_argument naming the directory when it is neither, or when its files do not fit.
SamplingModel load_checkpoint_model(const std::string& dir);
// An llm.c checkpoint (version 3 or 5; checkpoint/llmc_format.h: one family's files).
SamplingModel load_llmc_model(const std::string& path);
// Hugging Face safetensors (a .safetensors file, or a directory of them) of the model `cfg`
// describes, for families with a Hugging Face format (checkpoint/hf_safetensors.h): the file
// carries no shape that dstrain reads, so the config gives it.
SamplingModel load_hf_model(const std::string& path, const config::JobConfig& cfg);

// The model a run's config names, for commands given only --config: the newest checkpoint in
// training.checkpoint_dir, else model.init_from (an llm.c file or Hugging Face safetensors), else
// the initial weights of training.seed (an untrained model, as training starts: a chance baseline).
SamplingModel load_config_model(const config::JobConfig& cfg);
// A config's data.tokenizer; nullopt when it names none.
std::optional<data::TokenizerSpec> config_tokenizer(const config::JobConfig& cfg);
// The config a checkpoint (a step directory or a training.checkpoint_dir) was written with.
config::JobConfig checkpoint_config(const std::string& dir);

// Throws invalid_argument naming both shapes when `model` is not the model `cfg` describes.
void require_same_model(const SamplingModel& model, const config::JobConfig& cfg);

struct GenerateOptions {
  std::string prompt;  // "" = start from the codec's start token
  int tokens = 64;     // new tokens (fewer when the context fills up)
  SampleOptions sample;
  uint64_t seed = 1337;
};

// The prompt followed by the model's continuation, decoded.
std::string generate_text(const model_spec::ModelShape& shape, const float* params, const TextCodec& codec,
                          const GenerateOptions& o);

}  // namespace ds::rt::train
