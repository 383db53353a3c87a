// llm.c's gpt2_tokenizer.bin: parse (from bytes), decode, write.
#include "data/llmc_tokenizer.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "common/error.h"

namespace ds::rt::data {

namespace {

constexpr size_t kHeaderBytes = 256 * 4;

}  // namespace

std::unique_ptr<LlmcTokenizer> LlmcTokenizer::parse(std::string_view bytes, const std::string& name) {
  if (bytes.size() < kHeaderBytes) {
    throw invalid_argument("llm.c tokenizer {}: truncated header: {} bytes, the header alone is "
                           "1024", name, bytes.size());
  }
  int32_t h[4];
  std::memcpy(h, bytes.data(), sizeof(h));
  if (h[0] != kLlmcTokenizerMagic) {
    throw invalid_argument("llm.c tokenizer {}: wrong magic {}, expected {}", name, h[0],
                           kLlmcTokenizerMagic);
  }
  if (h[1] != 1 && h[1] != 2) {
    throw invalid_argument("llm.c tokenizer {}: unsupported version {}, expected 1 or 2", name, h[1]);
  }
  const int64_t v = h[2];
  if (v < 1 || (h[1] == 1 && v != 50257)) {
    throw invalid_argument("llm.c tokenizer {}: vocab size {} is invalid{}", name, v,
                           h[1] == 1 ? " (version 1 means GPT-2's 50257)" : "");
  }
  const int64_t eot = h[1] == 1 ? 50256 : h[3];
  if (eot < 0 || eot >= v) {
    throw invalid_argument("llm.c tokenizer {}: EOT id {} is outside the vocabulary (0..{})", name,
                           eot, v - 1);
  }
  std::vector<std::string> tokens;
  tokens.reserve(static_cast<size_t>(v));
  size_t pos = kHeaderBytes;
  for (int64_t i = 0; i < v; ++i) {
    if (pos >= bytes.size()) {
      throw invalid_argument("llm.c tokenizer {}: ends at token {} of {}", name, i, v);
    }
    const auto len = static_cast<unsigned char>(bytes[pos++]);
    if (len == 0) throw invalid_argument("llm.c tokenizer {}: token {} has length 0", name, i);
    if (pos + len > bytes.size()) {
      throw invalid_argument("llm.c tokenizer {}: token {} needs {} bytes, the file ends after {}",
                             name, i, len, bytes.size() - pos);
    }
    tokens.emplace_back(bytes.substr(pos, len));
    pos += len;
  }
  if (pos != bytes.size()) {
    throw invalid_argument("llm.c tokenizer {}: {} bytes after the last of {} tokens", name,
                           bytes.size() - pos, v);
  }
  return std::make_unique<LlmcTokenizer>(std::move(tokens), eot);
}

std::unique_ptr<LlmcTokenizer> LlmcTokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw invalid_argument("llm.c tokenizer {}: cannot open", path);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse(bytes, path);
}

LlmcTokenizer::LlmcTokenizer(std::vector<std::string> tokens, int64_t eot)
    : tokens_(std::move(tokens)), eot_(eot) {}

void LlmcTokenizer::encode(std::string_view, std::vector<uint32_t>&) const {
  throw invalid_usage("llm.c's tokenizer file can only decode; encode with --tokenizer gpt2");
}

void LlmcTokenizer::decode(std::span<const uint32_t> tokens, std::string& out) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= tokens_.size()) {
      throw invalid_argument("llm.c tokenizer: token {} at index {} is outside the vocabulary "
                             "(0..{})", tokens[i], i, tokens_.size() - 1);
    }
    out += tokens_[tokens[i]];
  }
}

size_t LlmcTokenizer::cut_point(std::string_view, size_t) const { return std::string_view::npos; }

void write_llmc_tokenizer(const std::string& path, const Tokenizer& tok) {
  if (tok.document_token() < 0) {
    throw invalid_argument("llm.c tokenizer {}: the {} tokenizer has no EOT token, which the "
                           "layout needs", path, tok.name());
  }
  const auto v = static_cast<int32_t>(tok.vocab_size());
  std::string body;
  for (int32_t i = 0; i < v; ++i) {
    const uint32_t id = static_cast<uint32_t>(i);
    const std::string b = tok.decode(std::span<const uint32_t>(&id, 1));
    if (b.empty() || b.size() > 255) {
      throw invalid_argument("llm.c tokenizer {}: token {} decodes to {} bytes; the layout holds "
                             "1..255", path, i, b.size());
    }
    body.push_back(static_cast<char>(b.size()));
    body += b;
  }
  int32_t header[256] = {};
  header[0] = kLlmcTokenizerMagic;
  header[1] = 2;
  header[2] = v;
  header[3] = static_cast<int32_t>(tok.document_token());
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
    out.write(body.data(), static_cast<std::streamsize>(body.size()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw system_error("llm.c tokenizer {}: cannot write {}", path, tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw system_error("llm.c tokenizer {}: cannot rename {} into place: {}", path, tmp,
                       errno_string(errno));
  }
}

}  // namespace ds::rt::data
