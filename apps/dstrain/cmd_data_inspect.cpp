// `dstrain data inspect FILE... [--tokenizer KIND --vocab DIR | --model FILE | --llmc-tokenizer
// FILE] [--tokens N]`: a token file's header (format, magic, version), token count and id range,
// its first ids, and those decoded when a tokenizer is given or lies beside the file (llm.c's
// gpt2_tokenizer.bin, or a SentencePiece tokenizer.model, as `data prepare` leaves them).
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common/error.h"
#include "data/sft.h"
#include "data/token_file.h"
#include "data/tokenizer.h"

namespace ds::cli {

namespace {

namespace fs = std::filesystem;
namespace dd = rt::data;

struct DataInspectOptions {
  std::vector<std::string> files;
  std::string tokenizer;  // "" = look beside the file
  std::string vocab, model, llmc;
  int64_t tokens = 64;
};

// The tokenizer the options name, else one found beside `file`, else none.
std::unique_ptr<dd::Tokenizer> tokenizer_for(const DataInspectOptions& o, const std::string& file,
                                             std::string* from) {
  if (!o.tokenizer.empty()) {
    const std::string& path = o.tokenizer == "gpt2" || o.tokenizer == "hf" ? o.vocab
                              : o.tokenizer == "llmc" ? o.llmc
                                                      : o.model;
    *from = o.tokenizer + (path.empty() ? "" : " " + path);
    return dd::open_tokenizer({o.tokenizer, path});
  }
  const fs::path dir = fs::path(file).parent_path();
  for (const auto& [name, kind] : {std::pair{"gpt2_tokenizer.bin", "llmc"},
                                   std::pair{"tokenizer.model", "sentencepiece"}}) {
    const fs::path p = dir / name;
    std::error_code ec;
    if (fs::exists(p, ec)) {
      *from = fmt::format("{} {} (beside the file)", kind, p.string());
      return dd::open_tokenizer({kind, p.string()});
    }
  }
  return nullptr;
}

void inspect_one(const DataInspectOptions& o, const std::string& path) {
  dd::TokenFile f(path);
  const uint32_t max = f.max_token();
  uint32_t min = max;
  for (int64_t i = 0; i < f.size(); ++i) min = std::min(min, f.token(i));
  std::cout << fmt::format("{}\n  format: {}\n  tokens: {}\n  ids: {}..{}\n", path,
                           dd::token_format_name(f.format()), f.size(), min, max);
  const auto n = static_cast<size_t>(std::min<int64_t>(o.tokens, f.size()));
  std::vector<uint32_t> head(n);
  for (size_t i = 0; i < n; ++i) head[i] = f.token(static_cast<int64_t>(i));
  std::cout << fmt::format("  first {} ids: [{}]\n", n, fmt::join(head, ", "));
  if (std::filesystem::exists(dd::mask_path_for(path))) {  // SFT data: its loss mask (validated)
    const dd::MaskFile m(dd::mask_path_for(path), f.size());
    int64_t counted = 0;
    for (uint8_t b : m.mask()) counted += b;
    std::vector<int> mh(m.mask().begin(), m.mask().begin() + static_cast<int64_t>(n));
    std::cout << fmt::format("  loss mask {}: {} of {} tokens count ({:.1f}%); first {}: [{}]\n", m.path(), counted,
                             m.size(), 100.0 * static_cast<double>(counted) / static_cast<double>(m.size()), n,
                             fmt::join(mh, ", "));
  }
  std::string from;
  const auto tok = tokenizer_for(o, path, &from);
  if (!tok) {
    std::cout << "  (no tokenizer given or beside the file: pass --tokenizer to decode)\n";
    return;
  }
  if (max >= tok->vocab_size()) {
    throw invalid_argument("data inspect: {}: id {} is outside the {} tokenizer's vocabulary "
                           "({} ids)", path, max, tok->name(), tok->vocab_size());
  }
  const std::string text = tok->decode(head);
  std::cout << fmt::format("  decoded by {}: {}\n", from,
                           nlohmann::json(text).dump(-1, ' ', false,
                                                     nlohmann::json::error_handler_t::replace));
}

int run_data_inspect(const DataInspectOptions& o) {
  if (o.tokens < 0) throw invalid_argument("data inspect: --tokens must be >= 0");
  for (const auto& f : o.files) inspect_one(o, f);
  return 0;
}

}  // namespace

void add_data_inspect_command(CLI::App* data, std::vector<Command>& out) {
  auto opts = std::make_shared<DataInspectOptions>();
  auto* inspect = data->add_subcommand(
      "inspect", "a token file's header, token count, id range and first tokens decoded");
  inspect->add_option("file", opts->files, "token files (llm.c format, uint16 or uint32)")
      ->required()
      ->expected(1, -1);
  inspect->add_option("--tokenizer", opts->tokenizer,
                      "byte, gpt2, hf, sentencepiece or llmc (default: a gpt2_tokenizer.bin or "
                      "tokenizer.model beside the file)")
      ->check(CLI::IsMember({"byte", "gpt2", "hf", "sentencepiece", "llmc"}));
  inspect->add_option("--vocab", opts->vocab, "gpt2: the vocabulary directory; hf: tokenizer.json or its directory");
  inspect->add_option("--model", opts->model, "sentencepiece: the .model file");
  inspect->add_option("--llmc-tokenizer", opts->llmc, "llmc: llm.c's gpt2_tokenizer.bin");
  inspect->add_option("--tokens", opts->tokens, "how many leading tokens to show")
      ->capture_default_str();
  out.push_back({inspect, [opts] { return run_data_inspect(*opts); }});
}

}  // namespace ds::cli
