// `dstrain sample`: text from a trained model (any family) on the CPU (runtime/train/sampling.h): the weights
// of a dstrain checkpoint (any layout), an llm.c file or Hugging Face safetensors (with the
// config that gives their shape), a KV-cache forward per token, decoded
// with the run's tokenizer. The text goes to stdout, what was loaded to stderr.
#include <iostream>

#include "commands.h"
#include "model_source.h"
#include "train/sampling.h"

namespace ds::cli {

namespace {

struct SampleCmdOptions {
  ModelSourceOptions source{"sample", /*config_names_model=*/false};
  rt::train::GenerateOptions gen;
};

int run_sample(const SampleCmdOptions& o) {
  const LoadedModel m = load_model_source(o.source);
  std::cerr << "dstrain: sampling " << o.gen.tokens << " tokens from " << m.model.source << " (" << m.codec->name()
            << " tokenizer, seed " << o.gen.seed << ")\n";
  std::cout << rt::train::generate_text(m.model.shape, m.model.params.data(), *m.codec, o.gen) << "\n";
  return 0;
}

}  // namespace

void add_sample_command(CLI::App& app, std::vector<Command>& out) {
  auto o = std::make_shared<SampleCmdOptions>();
  auto* sub = app.add_subcommand("sample", "generate text from a trained model on the CPU (KV cache)");
  add_model_source_options(sub, o->source,
                           "the run's config: its model must be the checkpoint's (default: the checkpoint's own); "
                           "the model's shape for Hugging Face safetensors; its data.tokenizer the default tokenizer");
  sub->add_option("--prompt", o->gen.prompt, "text to continue (default: start from a newline)");
  sub->add_option("--tokens", o->gen.tokens, "new tokens to generate (default 64)")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--temperature", o->gen.sample.temperature, "softmax temperature; 0 = greedy (default 1)")
      ->check(CLI::Range(0.0, 100.0));
  sub->add_option("--top-k", o->gen.sample.top_k, "sample among the k most likely tokens; 0 = all (default 0)")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--seed", o->gen.seed, "random seed (default 1337)");
  out.push_back({sub, [o] { return run_sample(*o); }});
}

}  // namespace ds::cli
