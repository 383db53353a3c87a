// What `dstrain sample` and `dstrain eval` load: a trained model (a dstrain checkpoint, an llm.c
// file, Hugging Face safetensors with the config that gives their shape, or, for eval, what a
// config names) and the run's tokenizer (the flags, else the config's data.tokenizer, else the
// checkpoint's run's, else byte-level for a vocabulary of 256 or less). The flags are the same
// on both commands; model_source.cpp holds the one place that reads them.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>

#include "train/sampling.h"

namespace ds::cli {

struct ModelSourceOptions {
  ModelSourceOptions(std::string command_name, bool config_names_model)
      : command(std::move(command_name)), config_alone(config_names_model) {}
  std::string command;  // "sample" | "eval", for messages
  // --config alone names the model (eval); else one of --checkpoint and --init-from is required.
  bool config_alone = false;
  std::string checkpoint, init_from, config;
  std::string tokenizer, vocab, spm_model, llmc;
};

// Adds --checkpoint, --init-from, --config/-c, --tokenizer, --vocab, --spm-model, --llmc-tokenizer.
void add_model_source_options(CLI::App* sub, ModelSourceOptions& o, const std::string& config_help);

struct LoadedModel {
  rt::train::SamplingModel model;
  std::unique_ptr<rt::train::TextCodec> codec;
};

// invalid_argument naming the flags for a missing or doubled source, and what the loaders throw.
LoadedModel load_model_source(const ModelSourceOptions& o);

}  // namespace ds::cli
