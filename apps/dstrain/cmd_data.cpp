// `dstrain data prepare --input TEXT... --output DIR [--val-fraction F]`: text files to llm.c
// token files with the byte-level tokenizer. The inputs are concatenated in the order given
// (bytes as they are, nothing inserted between files); the last F of the tokens become
// DIR/val.bin, the rest DIR/train.bin. Not here: other tokenizers, streaming of corpora larger
// than memory.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.h"
#include "common/error.h"
#include "data/token_file.h"
#include "data/tokenizer.h"

namespace ds::cli {

namespace {

struct DataPrepareOptions {
  std::vector<std::string> inputs;
  std::string output;
  double val_fraction = 0.1;
};

std::string read_text(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw invalid_argument("data prepare: input {}: no such file", path);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw system_error("data prepare: input {}: cannot open", path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw system_error("data prepare: input {}: read failed", path);
  return text;
}

int run_data_prepare(const DataPrepareOptions& o) {
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0)) {
    throw invalid_argument("data prepare: --val-fraction {} is outside [0, 1)", o.val_fraction);
  }
  std::vector<uint16_t> tokens;
  for (const auto& path : o.inputs) {
    const std::string text = read_text(path);
    rt::data::encode_bytes(text, tokens);
    std::cout << fmt::format("{}: {} bytes\n", path, text.size());
  }
  if (tokens.empty()) {
    throw invalid_argument("data prepare: the inputs ({}) hold no text: empty corpus",
                           fmt::join(o.inputs, ", "));
  }
  const auto total = static_cast<int64_t>(tokens.size());
  const auto val_count = static_cast<int64_t>(std::floor(static_cast<double>(total) * o.val_fraction));
  const int64_t train_count = total - val_count;
  if (o.val_fraction > 0 && val_count == 0) {
    throw invalid_argument("data prepare: {} tokens are too few for a validation split of {}",
                           total, o.val_fraction);
  }

  std::error_code ec;
  std::filesystem::create_directories(o.output, ec);
  if (ec) {
    throw system_error("data prepare: cannot create the output directory {}: {}", o.output,
                       ec.message());
  }
  const std::filesystem::path dir(o.output);
  const std::string train_path = (dir / "train.bin").string();
  const std::string val_path = (dir / "val.bin").string();
  std::span<const uint16_t> all(tokens);
  rt::data::write_token_file(train_path, all.first(static_cast<size_t>(train_count)));
  std::cout << fmt::format("{}: {} tokens\n", train_path, train_count);
  if (val_count > 0) {
    rt::data::write_token_file(val_path, all.last(static_cast<size_t>(val_count)));
    std::cout << fmt::format("{}: {} tokens\n", val_path, val_count);
  } else {
    std::cout << "no validation split (--val-fraction 0)\n";
  }
  std::cout << fmt::format("byte-level tokenizer, vocab_size {}\n", rt::data::kByteVocabSize);
  return 0;
}

}  // namespace

void add_data_command(CLI::App& app, std::vector<Command>& out) {
  auto* data = app.add_subcommand("data", "prepare training data (llm.c token files)");
  data->require_subcommand(1);
  auto opts = std::make_shared<DataPrepareOptions>();
  auto* prepare = data->add_subcommand(
      "prepare", "tokenize text files (byte-level, vocab 256) into DIR/train.bin and DIR/val.bin");
  prepare->add_option("--input", opts->inputs, "text files, concatenated in this order")
      ->required()
      ->expected(1, -1);
  prepare->add_option("--output", opts->output, "output directory (created if missing)")
      ->required();
  prepare->add_option("--val-fraction", opts->val_fraction,
                      "fraction of the tokens, taken from the end, written to val.bin "
                      "(0 = no val.bin)")
      ->capture_default_str();
  out.push_back({prepare, [opts] { return run_data_prepare(*opts); }});
}

}  // namespace ds::cli
