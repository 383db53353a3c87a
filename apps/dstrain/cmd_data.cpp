// `dstrain data prepare --input TEXT... --output DIR [--tokenizer byte|gpt2|hf|sentencepiece] ...`:
// text files to llm.c token files. Every input file is one document (the tokenizer's document
// token, GPT-2's <|endoftext|>, comes before each); the text streams through the parallel encoder
// (runtime/data/encode_pipeline.h), so a corpus larger than memory is fine. The last
// --val-fraction of the input bytes (cut where the tokenizer may cut) goes to DIR/val.bin, the
// rest to DIR/train.bin, or to DIR/train_000000.bin, ... with --shard-tokens N. The format is
// uint16 for vocabularies up to 65,536, else uint32. With gpt2, DIR/gpt2_tokenizer.bin (llm.c's
// decoder file) is written beside the data; with --train-vocab N, DIR/tokenizer.model is trained
// on the inputs first. `data inspect` lives in cmd_data_inspect.cpp, `data mix` in
// cmd_data_mix.cpp.
//
// `--format sft`: the inputs are JSONL instruction/chat examples (data/sft.h); each is rendered by
// --chat-template (data/chat_template.h), tokenized on one thread, and written with its loss mask
// (DIR/train.bin.mask beside DIR/train.bin, ...). The last --val-fraction of the examples goes to
// val.bin; --pad-to T pads every example to T tokens (masked out) so each fills one row of a batch.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.h"
#include "common/error.h"
#include "data/chat_template.h"
#include "data/corpus.h"
#include "data/encode_pipeline.h"
#include "data/llmc_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/sft.h"
#include "data/token_file.h"
#include "data/tokenizer.h"

namespace ds::cli {

namespace {

namespace fs = std::filesystem;
namespace dd = rt::data;

struct DataPrepareOptions {
  std::vector<std::string> inputs;
  std::string output;
  double val_fraction = 0.1;
  std::string tokenizer = "byte";
  std::string vocab;       // gpt2; hf: a directory holding tokenizer.json, or the file
  std::string model;       // sentencepiece
  int64_t train_vocab = 0;  // sentencepiece: train a model of this size first
  std::string model_type = "bpe";
  int64_t shard_tokens = 0;
  int threads = 0;  // 0 = every core
  int64_t chunk_bytes = 1 << 20;
  bool no_progress = false;
  std::string format = "text";           // text | sft
  std::string chat_template = "plain";   // sft
  int64_t pad_to = 0;                    // sft: pad each example to this many tokens (0 = packed)
};

// A one-line progress bar on stderr (only on a terminal): percent, MB, MB/s, ETA, tokens.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled && ::isatty(2)) {}
  void update(const dd::EncodeProgress& p) {
    if (!enabled_) return;
    const auto now = Clock::now();
    if (now - last_ < std::chrono::milliseconds(200) && p.bytes_done < p.bytes_total) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    const double rate = s > 0 ? p.bytes_done / s : 0;
    const double left = rate > 0 ? (p.bytes_total - p.bytes_done) / rate : 0;
    const double pct = p.bytes_total > 0 ? 100.0 * p.bytes_done / p.bytes_total : 100.0;
    std::fprintf(stderr, "\r%5.1f%% %.1f/%.1f MB  %.1f MB/s  ETA %d:%02d  %lld tokens   ", pct,
                 p.bytes_done / 1e6, p.bytes_total / 1e6, rate / 1e6, static_cast<int>(left) / 60,
                 static_cast<int>(left) % 60, static_cast<long long>(p.tokens));
    drawn_ = true;
  }
  ~ProgressBar() {
    if (drawn_) std::fprintf(stderr, "\n");
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_;
  bool drawn_ = false;
  Clock::time_point start_ = Clock::now(), last_{};
};

void check_options(const DataPrepareOptions& o) {
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0)) {
    throw invalid_argument("data prepare: --val-fraction {} is outside [0, 1)", o.val_fraction);
  }
  if (o.shard_tokens < 0) throw invalid_argument("data prepare: --shard-tokens must be >= 0");
  if (o.chunk_bytes < 1) throw invalid_argument("data prepare: --chunk-bytes must be >= 1");
  if (o.format != "sft" && (o.pad_to != 0 || o.chat_template != "plain")) {
    throw invalid_argument("data prepare: --pad-to and --chat-template need --format sft");
  }
  if (o.format == "sft" && o.train_vocab != 0) {
    throw invalid_argument("data prepare: --train-vocab trains on text files; with --format sft pass --model");
  }
  if (o.pad_to < 0) throw invalid_argument("data prepare: --pad-to must be >= 0");
  if (o.train_vocab != 0 && o.tokenizer != "sentencepiece") {
    throw invalid_argument("data prepare: --train-vocab needs --tokenizer sentencepiece");
  }
  if (o.tokenizer == "sentencepiece" && (o.train_vocab > 0) == !o.model.empty()) {
    throw invalid_argument("data prepare: --tokenizer sentencepiece needs exactly one of "
                           "--model FILE (an existing model) and --train-vocab N");
  }
  for (const auto& in : o.inputs) {
    std::error_code ec;
    if (!fs::is_regular_file(in, ec)) throw invalid_argument("data prepare: input {}: no such file", in);
  }
}

int64_t total_bytes(const std::vector<std::string>& inputs) {
  int64_t total = 0;
  for (const auto& in : inputs) total += static_cast<int64_t>(fs::file_size(in));
  return total;
}

// The tokenizer to encode with; trains DIR/tokenizer.model first when asked.
std::unique_ptr<dd::Tokenizer> prepare_tokenizer(const DataPrepareOptions& o, int threads) {
  dd::TokenizerSpec spec{o.tokenizer, o.tokenizer == "gpt2" || o.tokenizer == "hf" ? o.vocab : o.model};
  if (o.train_vocab > 0) {
    dd::SentencePieceTraining t;
    t.inputs = o.inputs;
    t.model_prefix = (fs::path(o.output) / "tokenizer").string();
    t.vocab_size = o.train_vocab;
    t.model_type = o.model_type;
    t.threads = threads;
    dd::train_sentencepiece(t);
    spec.path = t.model_prefix + ".model";
    std::cout << fmt::format("{}: trained ({} {}, vocab {})\n", spec.path, o.model_type,
                             "sentencepiece", o.train_vocab);
  }
  return dd::open_tokenizer(spec);
}

void print_files(const std::vector<std::pair<std::string, int64_t>>& files) {
  for (const auto& [path, count] : files) std::cout << fmt::format("{}: {} tokens\n", path, count);
}

// --format sft: JSONL examples, one at a time, into token files with masks beside them.
int run_sft_prepare(const DataPrepareOptions& o) {
  const auto tmpl = dd::open_chat_template(o.chat_template);
  std::error_code ec;
  fs::create_directories(o.output, ec);
  if (ec) {
    throw system_error("data prepare: cannot create the output directory {}: {}", o.output, ec.message());
  }
  const auto tok = prepare_tokenizer(o, 1);
  auto is_blank = [](const std::string& l) { return l.find_first_not_of(" \t\r") == std::string::npos; };
  int64_t examples = 0;
  for (const auto& in : o.inputs) {
    std::ifstream f(in);
    for (std::string line; std::getline(f, line);) examples += is_blank(line) ? 0 : 1;
  }
  if (examples == 0) throw invalid_argument("data prepare: the inputs ({}) hold no examples", fmt::join(o.inputs, ", "));
  const auto val_examples = static_cast<int64_t>(std::floor(static_cast<double>(examples) * o.val_fraction));
  if (o.val_fraction > 0 && (val_examples == 0 || val_examples == examples)) {
    throw invalid_argument("data prepare: {} examples are too few for a validation split of {}", examples,
                           o.val_fraction);
  }
  const auto format = dd::token_format_for_vocab(tok->vocab_size());
  dd::ShardWriter train(o.output, "train", format, o.shard_tokens, true);
  dd::ShardWriter val(o.output, "val", format, o.shard_tokens, true);
  const uint32_t pad = tok->document_token() >= 0 ? static_cast<uint32_t>(tok->document_token()) : 0;
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
  int64_t index = 0, counted = 0, total = 0, longest = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& in : o.inputs) {
    std::ifstream f(in);
    int64_t line_no = 0;
    for (std::string line; std::getline(f, line);) {
      ++line_no;
      if (is_blank(line)) continue;
      const std::string where = fmt::format("{}:{}", in, line_no);
      ids.clear();
      mask.clear();
      dd::encode_sft_example(*tok, *tmpl, dd::parse_sft_line(line, where), where, ids, mask);
      longest = std::max<int64_t>(longest, static_cast<int64_t>(ids.size()));
      if (o.pad_to > 0) {
        if (static_cast<int64_t>(ids.size()) > o.pad_to) {
          throw invalid_argument("{}: the example has {} tokens, more than --pad-to {}", where, ids.size(), o.pad_to);
        }
        ids.resize(static_cast<size_t>(o.pad_to), pad);
        mask.resize(static_cast<size_t>(o.pad_to), 0);
      }
      for (uint8_t m : mask) counted += m;
      total += static_cast<int64_t>(ids.size());
      (index++ < examples - val_examples ? train : val).append(ids, mask);
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<std::string> removed;
  print_files(train.finish(&removed));
  if (val.count() > 0) print_files(val.finish(&removed));
  else std::cout << "no validation split (--val-fraction 0)\n";
  for (const auto& r : removed) std::cout << fmt::format("removed stale shard {}\n", r);
  if (tok->name() == "gpt2") {
    const std::string bin = (fs::path(o.output) / "gpt2_tokenizer.bin").string();
    dd::write_llmc_tokenizer(bin, *tok);
    std::cout << fmt::format("{}: llm.c's tokenizer file\n", bin);
  }
  std::cout << fmt::format("sft: {} examples ({} train, {} val), chat template {}, {} tokens of which {} counted in "
                           "the loss ({:.1f}%), longest example {} tokens{}; masks beside each token file "
                           "(.mask); {:.2f} s\n",
                           examples, examples - val_examples, val_examples, tmpl->name(), total, counted,
                           total > 0 ? 100.0 * counted / total : 0.0, longest,
                           o.pad_to > 0 ? fmt::format(", each padded to {}", o.pad_to) : "", secs);
  return 0;
}

int run_data_prepare(const DataPrepareOptions& o) {
  check_options(o);
  if (o.format == "sft") return run_sft_prepare(o);
  const int64_t bytes = total_bytes(o.inputs);
  if (bytes == 0) {
    throw invalid_argument("data prepare: the inputs ({}) hold no text: empty corpus",
                           fmt::join(o.inputs, ", "));
  }
  std::error_code ec;
  fs::create_directories(o.output, ec);
  if (ec) {
    throw system_error("data prepare: cannot create the output directory {}: {}", o.output,
                       ec.message());
  }
  const int threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  const auto tok = prepare_tokenizer(o, threads);
  const auto format = dd::token_format_for_vocab(tok->vocab_size());
  dd::ShardWriter train(o.output, "train", format, o.shard_tokens);
  dd::ShardWriter val(o.output, "val", format, o.shard_tokens);

  dd::EncodeOptions eo;
  eo.threads = threads;
  eo.chunk_bytes = static_cast<size_t>(o.chunk_bytes);
  const auto val_bytes = static_cast<int64_t>(std::floor(static_cast<double>(bytes) * o.val_fraction));
  eo.split_byte = o.val_fraction > 0 ? bytes - val_bytes : -1;
  ProgressBar bar(!o.no_progress);
  const auto t0 = std::chrono::steady_clock::now();
  const auto p = dd::encode_files(
      *tok, o.inputs, eo, [&](std::span<const uint32_t> t, int part) { (part == 0 ? train : val).append(t); },
      [&](const dd::EncodeProgress& pr) { bar.update(pr); });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (o.val_fraction > 0 && val.count() == 0) {
    throw invalid_argument("data prepare: {} tokens are too few for a validation split of {}",
                           p.tokens, o.val_fraction);
  }
  std::vector<std::string> removed;
  print_files(train.finish(&removed));
  if (val.count() > 0) print_files(val.finish(&removed));
  else std::cout << "no validation split (--val-fraction 0)\n";
  for (const auto& r : removed) std::cout << fmt::format("removed stale shard {}\n", r);
  if (tok->name() == "gpt2") {
    const std::string bin = (fs::path(o.output) / "gpt2_tokenizer.bin").string();
    dd::write_llmc_tokenizer(bin, *tok);
    std::cout << fmt::format("{}: llm.c's tokenizer file\n", bin);
  }
  std::cout << fmt::format("{} tokenizer, vocab_size {}, {} tokens, {}; {:.1f} MB in {:.2f} s on {} "
                           "threads ({:.1f} MB/s)\n",
                           tok->name(), tok->vocab_size(), p.tokens, dd::token_format_name(format),
                           bytes / 1e6, secs, threads, secs > 0 ? bytes / 1e6 / secs : 0.0);
  return 0;
}

void add_prepare(CLI::App* data, std::vector<Command>& out) {
  auto opts = std::make_shared<DataPrepareOptions>();
  auto* prepare = data->add_subcommand(
      "prepare", "tokenize text files into DIR/train.bin and DIR/val.bin (or shards)");
  prepare->add_option("--input", opts->inputs,
                      "text files, one document each (or JSONL with --format sft), in this order")
      ->required()
      ->expected(1, -1);
  prepare->add_option("--output", opts->output, "output directory (created if missing)")
      ->required();
  prepare->add_option("--val-fraction", opts->val_fraction,
                      "fraction of the input bytes, taken from the end, written to val.bin "
                      "(0 = no val.bin)")
      ->capture_default_str();
  prepare->add_option("--tokenizer", opts->tokenizer, "byte, gpt2, hf or sentencepiece")
      ->check(CLI::IsMember({"byte", "gpt2", "hf", "sentencepiece"}))
      ->capture_default_str();
  prepare->add_option("--vocab", opts->vocab,
                      "gpt2: directory with vocab.json + merges.txt or encoder.json + vocab.bpe; hf: a "
                      "directory holding tokenizer.json, or the file");
  prepare->add_option("--model", opts->model, "sentencepiece: an existing .model file");
  prepare->add_option("--train-vocab", opts->train_vocab,
                      "sentencepiece: train a model of N pieces on the inputs first "
                      "(saved as DIR/tokenizer.model)");
  prepare->add_option("--model-type", opts->model_type, "sentencepiece training: bpe or unigram")
      ->check(CLI::IsMember({"bpe", "unigram"}))
      ->capture_default_str();
  prepare->add_option("--shard-tokens", opts->shard_tokens,
                      "write shards of N tokens (train_000000.bin, ...); 0 = one file each")
      ->capture_default_str();
  prepare->add_option("--threads", opts->threads, "encoder threads (0 = every core)")
      ->capture_default_str();
  prepare->add_option("--chunk-bytes", opts->chunk_bytes,
                      "bytes per parallel chunk (the ids do not depend on it)")
      ->capture_default_str();
  prepare->add_flag("--no-progress", opts->no_progress, "no progress bar on a terminal");
  prepare->add_option("--format", opts->format,
                      "text: each input is one document; sft: each input is JSONL instruction/chat "
                      "examples, written with a loss mask beside each token file")
      ->check(CLI::IsMember({"text", "sft"}))
      ->capture_default_str();
  prepare->add_option("--chat-template", opts->chat_template,
                      "sft: how messages become text: plain, llama3, or jinja:PATH for a Hugging Face "
                      "tokenizer_config.json's chat_template (PATH the file or its model directory; docs/data.md)")
      ->capture_default_str();
  prepare->add_option("--pad-to", opts->pad_to,
                      "sft: pad every example to N tokens (masked out), one example per row of "
                      "seq_len N; 0 = packed back to back")
      ->capture_default_str();
  out.push_back({prepare, [opts] { return run_data_prepare(*opts); }});
}

}  // namespace

void add_data_command(CLI::App& app, std::vector<Command>& out) {
  auto* data = app.add_subcommand("data", "prepare and inspect training data (llm.c token files), show a blend's mix");
  data->require_subcommand(1);
  add_prepare(data, out);
  add_data_inspect_command(data, out);
  add_data_mix_command(data, out);
}

}  // namespace ds::cli
