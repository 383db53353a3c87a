// SFT examples (JSONL to tokens and a loss mask) and mask files (sft.h).
#include "data/sft.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace ds::rt::data {

namespace {
constexpr int kHeaderInts = 256;
constexpr int64_t kMaskHeaderBytes = kHeaderInts * 4;
}  // namespace

std::string mask_path_for(const std::string& token_path) { return token_path + ".mask"; }

MaskFile::MaskFile(const std::string& path, int64_t expected_count) : path_(path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw invalid_argument("mask file {}: cannot open", path);
  const auto bytes = static_cast<int64_t>(in.tellg());
  in.seekg(0);
  if (bytes < kMaskHeaderBytes) {
    throw invalid_argument("mask file {}: truncated header: the file has {} bytes, the header alone is {}",
                           path, bytes, kMaskHeaderBytes);
  }
  std::array<int32_t, kHeaderInts> h{};
  in.read(reinterpret_cast<char*>(h.data()), kMaskHeaderBytes);
  if (h[0] != kMaskFileMagic) {
    throw invalid_argument("mask file {}: wrong magic {}, expected {} (a dstrain loss mask)", path, h[0],
                           kMaskFileMagic);
  }
  if (h[1] != kMaskFileVersion) {
    throw invalid_argument("mask file {}: unsupported version {}, expected {}", path, h[1], kMaskFileVersion);
  }
  const int64_t count = h[2];
  if (count < 0 || kMaskHeaderBytes + count != bytes) {
    throw invalid_argument("mask file {}: the header says {} tokens but the file has {} bytes ({} expected)", path,
                           count, bytes, kMaskHeaderBytes + count);
  }
  if (count != expected_count) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("mask file {}: {} entries, but its token file has {} tokens", path, count,
                            expected_count),
                "the mask belongs to other data: prepare both again with `dstrain data prepare --format sft`");
  }
  mask_.resize(static_cast<size_t>(count));
  in.read(reinterpret_cast<char*>(mask_.data()), count);
  if (!in) throw system_error("mask file {}: read failed", path);
  for (int64_t i = 0; i < count; ++i) {
    if (mask_[static_cast<size_t>(i)] > 1) {
      throw invalid_argument("mask file {}: byte {} at index {} is not 0 or 1", path, mask_[static_cast<size_t>(i)],
                             i);
    }
  }
}

MaskFileWriter::MaskFileWriter(std::string path)
    : path_(std::move(path)), tmp_(fmt::format("{}.tmp.{}", path_, ::getpid())) {
  file_ = std::fopen(tmp_.c_str(), "wb");
  if (file_ == nullptr) throw system_error("mask file {}: cannot create: {}", tmp_, errno_string(errno));
  const std::array<int32_t, kHeaderInts> h{};
  if (std::fwrite(h.data(), 4, kHeaderInts, file_) != kHeaderInts) {
    throw system_error("mask file {}: write failed", tmp_);
  }
}

MaskFileWriter::~MaskFileWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove(tmp_.c_str());
  }
}

void MaskFileWriter::append(std::span<const uint8_t> mask) {
  if (mask.empty()) return;
  if (std::fwrite(mask.data(), 1, mask.size(), file_) != mask.size()) {
    throw system_error("mask file {}: write failed: {}", tmp_, errno_string(errno));
  }
  count_ += static_cast<int64_t>(mask.size());
}

void MaskFileWriter::finish() {
  if (count_ > INT32_MAX) throw invalid_argument("mask file {}: {} entries do not fit the int32 count", path_, count_);
  const std::array<int32_t, 3> h{kMaskFileMagic, kMaskFileVersion, static_cast<int32_t>(count_)};
  const bool ok = std::fseek(file_, 0, SEEK_SET) == 0 && std::fwrite(h.data(), 4, 3, file_) == 3 &&
                  std::fflush(file_) == 0;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!ok || !closed || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    std::remove(tmp_.c_str());
    throw system_error("mask file {}: cannot write: {}", path_, errno_string(errno));
  }
}

std::vector<ChatMessage> parse_sft_line(std::string_view line, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    throw invalid_argument("{}: malformed JSON: {}", where, e.what());
  }
  constexpr const char* kExpected =
      "expected {\"prompt\": string, \"completion\": string} or {\"messages\": [{\"role\": string, \"content\": "
      "string}, ...]}";
  if (!j.is_object()) throw invalid_argument("{}: a JSON {}, {}", where, j.type_name(), kExpected);
  auto string_at = [&](const nlohmann::json& o, const char* key, const std::string& path) -> std::string {
    auto it = o.find(key);
    if (it == o.end()) throw invalid_argument("{}: {}.{} is missing; {}", where, path, key, kExpected);
    if (!it->is_string()) {
      throw invalid_argument("{}: {}.{} is a {}, expected a string", where, path, key, it->type_name());
    }
    return it->get<std::string>();
  };
  const bool chat = j.contains("messages");
  const bool pc = j.contains("prompt") || j.contains("completion");
  if (chat && pc) throw invalid_argument("{}: both \"messages\" and \"prompt\"/\"completion\"; {}", where, kExpected);
  if (pc) {
    return {{"user", string_at(j, "prompt", "$")}, {"assistant", string_at(j, "completion", "$")}};
  }
  if (!chat) throw invalid_argument("{}: neither \"messages\" nor \"prompt\"/\"completion\"; {}", where, kExpected);
  const auto& ms = j["messages"];
  if (!ms.is_array()) throw invalid_argument("{}: $.messages is a {}, expected an array", where, ms.type_name());
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < ms.size(); ++i) {
    const std::string path = fmt::format("$.messages[{}]", i);
    if (!ms[i].is_object()) throw invalid_argument("{}: {} is a {}, expected an object", where, path, ms[i].type_name());
    out.push_back({string_at(ms[i], "role", path), string_at(ms[i], "content", path)});
  }
  return out;
}

void encode_sft_example(const Tokenizer& tok, const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                        const std::string& where, std::vector<uint32_t>& tokens, std::vector<uint8_t>& mask) {
  const auto segments = tmpl.render(messages, where);
  if (tok.document_token() >= 0) {
    tokens.push_back(static_cast<uint32_t>(tok.document_token()));
    mask.push_back(0);
  }
  for (const ChatSegment& s : segments) {
    if (!s.text.empty()) tok.encode(s.text, tokens);
    mask.resize(tokens.size(), s.trainable ? 1 : 0);
  }
}

}  // namespace ds::rt::data
