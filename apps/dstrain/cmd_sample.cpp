// `dstrain sample`: text from a trained model (any family) on the CPU (runtime/train/sampling.h): the weights
// of a dstrain checkpoint (any layout), an llm.c file or Hugging Face safetensors (with the
// config that gives their shape), a KV-cache forward per token, decoded
// with the run's tokenizer. The text goes to stdout, what was loaded to stderr.
#include <filesystem>
#include <iostream>
#include <optional>

#include "commands.h"
#include "common/error.h"
#include "config/job_config.h"
#include "train/sampling.h"

namespace ds::cli {

namespace {

struct SampleCmdOptions {
  std::string checkpoint, init_from, config;
  rt::train::GenerateOptions gen;
  std::string tokenizer, vocab, spm_model, llmc;
};

int run_sample(const SampleCmdOptions& o) {
  if (o.checkpoint.empty() == o.init_from.empty()) {
    throw Error(ErrorKind::kInvalidArgument, "dstrain sample needs exactly one of --checkpoint DIR and --init-from FILE",
                "--checkpoint takes a step_N directory or a training.checkpoint_dir; --init-from an llm.c file, or "
                "Hugging Face safetensors (a .safetensors file or a directory) with --config");
  }
  // Hugging Face safetensors: a directory or a .safetensors file; anything else is llm.c's file.
  const bool hf = !o.init_from.empty() && (std::filesystem::is_directory(o.init_from) ||
                                           std::filesystem::path(o.init_from).extension() == ".safetensors");
  if (hf && o.config.empty()) {
    throw Error(ErrorKind::kInvalidArgument,
                "--init-from " + o.init_from + ": Hugging Face safetensors need --config FILE for the model's shape",
                "pass the config the weights were trained or exported with");
  }
  std::optional<config::JobConfig> cfg;
  if (!o.config.empty()) cfg = config::load_job_config(o.config, 1);
  rt::train::SamplingModel model = !o.checkpoint.empty() ? rt::train::load_checkpoint_model(o.checkpoint)
                                   : hf                  ? rt::train::load_hf_model(o.init_from, *cfg)
                                                         : rt::train::load_llmc_model(o.init_from);
  if (cfg) rt::train::require_same_model(model, *cfg);
  // The tokenizer: the flags, else the config's data.tokenizer.
  std::optional<rt::data::TokenizerSpec> spec;
  if (!o.tokenizer.empty()) {
    spec = rt::data::TokenizerSpec{o.tokenizer, o.tokenizer == "gpt2" || o.tokenizer == "hf" ? o.vocab
                                                : o.tokenizer == "llmc"                      ? o.llmc
                                                                                             : o.spm_model};
  } else if (cfg) {
    spec = rt::train::config_tokenizer(*cfg);
  }
  const auto codec = rt::train::codec_for(model.shape.vocab_size, spec ? &*spec : nullptr);
  std::cerr << "dstrain: sampling " << o.gen.tokens << " tokens from " << model.source << " (" << codec->name()
            << " tokenizer, seed " << o.gen.seed << ")\n";
  std::cout << rt::train::generate_text(model.shape, model.params.data(), *codec, o.gen) << "\n";
  return 0;
}

}  // namespace

void add_sample_command(CLI::App& app, std::vector<Command>& out) {
  auto o = std::make_shared<SampleCmdOptions>();
  auto* sub = app.add_subcommand("sample", "generate text from a trained model on the CPU (KV cache)");
  sub->add_option("--checkpoint", o->checkpoint,
                  "a dstrain checkpoint: a step_N directory, or a training.checkpoint_dir (its latest)");
  sub->add_option("--init-from", o->init_from,
                  "an llm.c checkpoint file, or Hugging Face safetensors (a .safetensors file or a directory, "
                  "with --config)");
  sub->add_option("--config,-c", o->config,
                  "the run's config: its model must be the checkpoint's (default: the checkpoint's own); "
                  "the model's shape for Hugging Face safetensors");
  sub->add_option("--prompt", o->gen.prompt, "text to continue (default: start from a newline)");
  sub->add_option("--tokens", o->gen.tokens, "new tokens to generate (default 64)")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--temperature", o->gen.sample.temperature, "softmax temperature; 0 = greedy (default 1)")
      ->check(CLI::Range(0.0, 100.0));
  sub->add_option("--top-k", o->gen.sample.top_k, "sample among the k most likely tokens; 0 = all (default 0)")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--seed", o->gen.seed, "random seed (default 1337)");
  sub->add_option("--tokenizer", o->tokenizer,
                  "the run's tokenizer: byte, gpt2, hf, sentencepiece or llmc (default: the config's data.tokenizer, "
                  "else byte-level for a vocabulary of 256 or less)")
      ->check(CLI::IsMember({"byte", "gpt2", "hf", "sentencepiece", "llmc"}));
  sub->add_option("--vocab", o->vocab, "gpt2: the vocabulary directory (scripts/fetch-gpt2-tokenizer.sh: data/gpt2); hf: tokenizer.json or its directory");
  sub->add_option("--spm-model", o->spm_model, "sentencepiece: the .model file");
  sub->add_option("--llmc-tokenizer", o->llmc, "llmc: llm.c's gpt2_tokenizer.bin (decode only: no --prompt)");
  out.push_back({sub, [o] { return run_sample(*o); }});
}

}  // namespace ds::cli
