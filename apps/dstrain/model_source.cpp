// The model and tokenizer of `dstrain sample` and `dstrain eval` (model_source.h).
#include "model_source.h"

#include <filesystem>
#include <optional>

#include "common/error.h"
#include "config/job_config.h"

namespace ds::cli {

namespace rtt = rt::train;

void add_model_source_options(CLI::App* sub, ModelSourceOptions& o, const std::string& config_help) {
  sub->add_option("--checkpoint", o.checkpoint,
                  "a dstrain checkpoint: a step_N directory, or a training.checkpoint_dir (its latest)");
  sub->add_option("--init-from", o.init_from,
                  "an llm.c checkpoint file, or Hugging Face safetensors (a .safetensors file or a directory, "
                  "with --config)");
  sub->add_option("--config,-c", o.config, config_help);
  sub->add_option("--tokenizer", o.tokenizer,
                  "the run's tokenizer: byte, gpt2, hf, sentencepiece or llmc (default: the config's or the "
                  "checkpoint's data.tokenizer, else byte-level for a vocabulary of 256 or less)")
      ->check(CLI::IsMember({"byte", "gpt2", "hf", "sentencepiece", "llmc"}));
  sub->add_option("--vocab", o.vocab,
                  "gpt2: the vocabulary directory (scripts/fetch-gpt2-tokenizer.sh: data/gpt2); hf: tokenizer.json "
                  "or its directory");
  sub->add_option("--spm-model", o.spm_model, "sentencepiece: the .model file");
  sub->add_option("--llmc-tokenizer", o.llmc, "llmc: llm.c's gpt2_tokenizer.bin (decode only)");
}

LoadedModel load_model_source(const ModelSourceOptions& o) {
  const std::string which = "dstrain " + o.command;
  if (!o.checkpoint.empty() && !o.init_from.empty()) {
    throw invalid_argument("{} takes one of --checkpoint and --init-from, not both", which);
  }
  if (o.checkpoint.empty() && o.init_from.empty() && (!o.config_alone || o.config.empty())) {
    throw Error(ErrorKind::kInvalidArgument,
                o.config_alone ? which + " needs a model: --checkpoint DIR, --init-from FILE or --config FILE"
                               : which + " needs exactly one of --checkpoint DIR and --init-from FILE",
                std::string("--checkpoint takes a step_N directory or a training.checkpoint_dir; --init-from an "
                            "llm.c file, or Hugging Face safetensors (a .safetensors file or a directory) with "
                            "--config") +
                    (o.config_alone ? "; --config alone evaluates what the config names (its newest checkpoint, "
                                      "else its model.init_from, else its untrained initial weights)"
                                    : ""));
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
  LoadedModel out;
  out.model = !o.checkpoint.empty() ? rtt::load_checkpoint_model(o.checkpoint)
              : hf                  ? rtt::load_hf_model(o.init_from, *cfg)
              : !o.init_from.empty() ? rtt::load_llmc_model(o.init_from)
                                     : rtt::load_config_model(*cfg);
  if (cfg) rtt::require_same_model(out.model, *cfg);
  std::optional<rt::data::TokenizerSpec> spec;
  if (!o.tokenizer.empty()) {
    spec = rt::data::TokenizerSpec{o.tokenizer, o.tokenizer == "gpt2" || o.tokenizer == "hf" ? o.vocab
                                                : o.tokenizer == "llmc"                      ? o.llmc
                                                                                             : o.spm_model};
  } else if (cfg) {
    spec = rtt::config_tokenizer(*cfg);
  } else if (!o.checkpoint.empty()) {
    spec = rtt::config_tokenizer(rtt::checkpoint_config(o.checkpoint));
  }
  out.codec = rtt::codec_for(out.model.shape.vocab_size, spec ? &*spec : nullptr);
  return out;
}

}  // namespace ds::cli
