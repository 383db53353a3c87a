// GPT-2's BPE: loading the vocabulary and merges, encoding a piece by ranked merges (with a
// per-thread cache of pieces), decoding by concatenating token bytes.
#include "data/gpt2_bpe.h"

#include <array>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "data/gpt2_pretokenize.h"

namespace ds::rt::data {

// Named rather than anonymous: Gpt2Tokenizer::Tables (a member of a class with linkage) holds a
// MergeMap.
namespace gpt2_bpe_detail {

constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();

// (a, b) -> (rank, merged id): open addressing with linear probing, power-of-two capacity.
class MergeMap {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    uint32_t rank = kNoRank;
    uint32_t id = 0;
  };
  static constexpr uint64_t kEmpty = ~0ULL;

  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    slots_.assign(cap, Entry{});
    mask_ = cap - 1;
  }
  // False when (a, b) is already there (a duplicate merge keeps its first, lowest rank).
  bool insert(uint32_t a, uint32_t b, uint32_t rank, uint32_t id) {
    const uint64_t key = pack(a, b);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return false;
      if (slots_[i].key == kEmpty) {
        slots_[i] = {key, rank, id};
        return true;
      }
    }
  }
  const Entry* find(uint32_t a, uint32_t b) const {
    const uint64_t key = pack(a, b);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i];
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static uint64_t pack(uint32_t a, uint32_t b) { return (static_cast<uint64_t>(a) << 32) | b; }
  size_t slot(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ULL) >> 40 & mask_; }
  std::vector<Entry> slots_;
  size_t mask_ = 0;
};

// bytes_to_unicode() of OpenAI's encoder.py: bytes 33..126, 161..172 and 174..255 stand for
// themselves; the other 68 bytes, in increasing order, for U+0100, U+0101, ...
std::array<char32_t, 256> make_byte_to_unicode() {
  std::array<char32_t, 256> m{};
  char32_t next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    m[static_cast<size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
  }
  return m;
}

const std::array<char32_t, 256> kByteToUnicode = make_byte_to_unicode();

// The byte a code point of the alphabet stands for, or -1.
int unicode_to_byte(char32_t c) {
  static const auto inverse = [] {
    std::array<int16_t, 0x144> inv{};
    inv.fill(-1);
    for (int b = 0; b < 256; ++b) inv[kByteToUnicode[static_cast<size_t>(b)]] = static_cast<int16_t>(b);
    return inv;
  }();
  return c < inverse.size() ? inverse[c] : -1;
}

// A vocabulary string's bytes: through the alphabet when every character is in it, else its
// own UTF-8 (a special token). Lenient UTF-8 decoding: nlohmann has validated the JSON string.
std::string vocab_string_bytes(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    char32_t c = b0;
    size_t len = 1;
    if (b0 >= 0xF0) c = b0 & 0x07, len = 4;
    else if (b0 >= 0xE0) c = b0 & 0x0F, len = 3;
    else if (b0 >= 0xC0) c = b0 & 0x1F, len = 2;
    for (size_t k = 1; k < len && i + k < s.size(); ++k) c = (c << 6) | (s[i + k] & 0x3F);
    const int byte = unicode_to_byte(c);
    if (byte < 0) return s;
    out.push_back(static_cast<char>(byte));
    i += len;
  }
  return out;
}

// "line L, column C" of byte offset `pos` in `text`.
std::string line_col(std::string_view text, size_t pos) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < pos && i < text.size(); ++i) {
    if (text[i] == '\n') ++line, col = 1;
    else ++col;
  }
  return fmt::format("line {}, column {}", line, col);
}

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw system_error("gpt2 tokenizer: cannot open {}", path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw system_error("gpt2 tokenizer: cannot read {}", path);
  return text;
}

std::atomic<uint64_t> g_next_instance{1};

}  // namespace gpt2_bpe_detail

using namespace gpt2_bpe_detail;

struct Gpt2Tokenizer::Tables {
  std::string bytes;              // every token's bytes, concatenated
  std::vector<uint32_t> offsets;  // (V+1): token i is bytes[offsets[i], offsets[i+1])
  std::array<uint32_t, 256> byte_token{};
  MergeMap merges;
  int64_t merge_count = 0;
  int64_t eot = -1;

  int64_t vocab_size() const { return static_cast<int64_t>(offsets.size()) - 1; }
  void encode_piece(std::string_view piece, std::vector<uint32_t>& out) const;
};

namespace {

using StringIds = std::unordered_map<std::string, uint32_t>;

// Reads the vocabulary into t (bytes, offsets, byte tokens, eot) and returns string -> id.
StringIds parse_vocab(std::string_view json, const std::string& name, Gpt2Tokenizer::Tables& t) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json.begin(), json.end());
  } catch (const nlohmann::json::parse_error& e) {
    throw invalid_argument("gpt2 vocabulary {}: not valid JSON at {}: {}", name,
                           line_col(json, e.byte > 0 ? e.byte - 1 : 0), e.what());
  }
  if (!j.is_object() || j.empty()) {
    throw invalid_argument("gpt2 vocabulary {}: expected a JSON object mapping token strings to "
                           "ids, got {}", name, j.is_object() ? "an empty object" : j.type_name());
  }
  const size_t v = j.size();
  std::vector<std::string> by_id(v);
  std::vector<bool> seen(v, false);
  StringIds ids;
  ids.reserve(v);
  for (const auto& [key, value] : j.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= static_cast<int64_t>(v)) {
      throw invalid_argument("gpt2 vocabulary {}: token {}: expected an id in [0, {}) (the "
                             "vocabulary has {} entries), got {}",
                             name, nlohmann::json(key).dump(), v, v, value.dump());
    }
    const auto id = value.get<uint32_t>();
    if (seen[id]) {
      throw invalid_argument("gpt2 vocabulary {}: id {} is given twice (token {}); ids must be "
                             "0..{} each once", name, id, nlohmann::json(key).dump(), v - 1);
    }
    seen[id] = true;
    by_id[id] = vocab_string_bytes(key);
    ids.emplace(key, id);
  }
  t.offsets.assign(1, 0);
  for (const auto& b : by_id) {
    t.bytes += b;
    t.offsets.push_back(static_cast<uint32_t>(t.bytes.size()));
  }
  for (int b = 0; b < 256; ++b) {
    std::string key;
    const char32_t c = kByteToUnicode[static_cast<size_t>(b)];
    if (c < 0x80) key.push_back(static_cast<char>(c));
    else key += {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
    auto it = ids.find(key);
    if (it == ids.end()) {
      throw invalid_argument("gpt2 vocabulary {}: the byte token for byte {} ({}) is missing; a "
                             "byte-level BPE vocabulary holds all 256", name, b,
                             nlohmann::json(key).dump());
    }
    t.byte_token[static_cast<size_t>(b)] = it->second;
  }
  if (auto it = ids.find("<|endoftext|>"); it != ids.end()) t.eot = it->second;
  return ids;
}

// One "a b" line of the merges file: the two tokens, or an error naming the line.
std::pair<std::string_view, std::string_view> split_merge(std::string_view line,
                                                          const std::string& name, size_t lineno) {
  const size_t sp = line.find(' ');
  if (sp == std::string_view::npos || sp == 0 || sp + 1 >= line.size() ||
      line.find(' ', sp + 1) != std::string_view::npos) {
    throw invalid_argument("gpt2 merges {}:{}: expected two tokens separated by one space, got "
                           "{}", name, lineno, nlohmann::json(std::string(line)).dump());
  }
  return {line.substr(0, sp), line.substr(sp + 1)};
}

void parse_merges(std::string_view text, const std::string& name, const StringIds& ids,
                  const std::string& vocab_name, Gpt2Tokenizer::Tables& t) {
  std::vector<std::string_view> lines;
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    lines.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  t.merges.reserve(lines.size());
  uint32_t rank = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string_view line = lines[i];
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (i == 0 && line.starts_with("#version"))) continue;
    const auto [a, b] = split_merge(line, name, i + 1);
    auto id_of = [&](const std::string& tok, const char* what) {
      auto it = ids.find(tok);
      if (it == ids.end()) {
        throw invalid_argument("gpt2 merges {}:{}: merge \"{}\": {} {} is not in the vocabulary "
                               "{}", name, i + 1, line, what, nlohmann::json(tok).dump(),
                               vocab_name);
      }
      return it->second;
    };
    const std::string sa(a), sb(b);
    const uint32_t ia = id_of(sa, "token"), ib = id_of(sb, "token");
    const uint32_t merged = id_of(sa + sb, "the merged token");
    t.merges.insert(ia, ib, rank++, merged);
  }
  t.merge_count = rank;
}

// Per-thread cache of pieces -> ids, tagged with the tokenizer it belongs to.
struct PieceCache {
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  static constexpr size_t kMaxEntries = 1 << 18;
  uint64_t owner = 0;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, Hash, std::equal_to<>> map;
  std::vector<uint32_t> arena;

  void reset(uint64_t id) {
    owner = id;
    map.clear();
    arena.clear();
  }
};

thread_local PieceCache t_cache;

}  // namespace

void Gpt2Tokenizer::Tables::encode_piece(std::string_view piece, std::vector<uint32_t>& out) const {
  thread_local std::vector<uint32_t> sym;
  thread_local std::vector<uint32_t> rank;
  sym.resize(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    sym[i] = byte_token[static_cast<unsigned char>(piece[i])];
  }
  auto rank_of = [&](size_t i) {
    const MergeMap::Entry* e = merges.find(sym[i], sym[i + 1]);
    return e != nullptr ? e->rank : kNoRank;
  };
  rank.resize(sym.size() - 1);
  for (size_t i = 0; i + 1 < sym.size(); ++i) rank[i] = rank_of(i);
  while (sym.size() > 1) {
    size_t best = 0;
    for (size_t i = 1; i < rank.size(); ++i) {
      if (rank[i] < rank[best]) best = i;
    }
    if (rank[best] == kNoRank) break;
    sym[best] = merges.find(sym[best], sym[best + 1])->id;
    sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    rank.erase(rank.begin() + static_cast<std::ptrdiff_t>(best));
    if (best + 1 < sym.size()) rank[best] = rank_of(best);
    if (best > 0) rank[best - 1] = rank_of(best - 1);
  }
  out.insert(out.end(), sym.begin(), sym.end());
}

Gpt2Tokenizer::Gpt2Tokenizer(std::unique_ptr<Tables> t)
    : t_(std::move(t)), instance_id_(g_next_instance.fetch_add(1)) {}

Gpt2Tokenizer::~Gpt2Tokenizer() = default;

std::unique_ptr<Gpt2Tokenizer> Gpt2Tokenizer::parse(std::string_view vocab_json,
                                                    std::string_view merges,
                                                    const std::string& vocab_name,
                                                    const std::string& merges_name) {
  auto t = std::make_unique<Tables>();
  const StringIds ids = parse_vocab(vocab_json, vocab_name, *t);
  parse_merges(merges, merges_name, ids, vocab_name, *t);
  return std::unique_ptr<Gpt2Tokenizer>(new Gpt2Tokenizer(std::move(t)));
}

std::unique_ptr<Gpt2Tokenizer> Gpt2Tokenizer::from_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("gpt2 tokenizer: {} is not a directory", dir),
                "pass the directory holding vocab.json + merges.txt or encoder.json + vocab.bpe "
                "(scripts/fetch-gpt2-tokenizer.sh fetches GPT-2's)");
  }
  for (const auto& [vocab, merges] : {std::pair{"vocab.json", "merges.txt"},
                                      std::pair{"encoder.json", "vocab.bpe"}}) {
    const std::string v = (fs::path(dir) / vocab).string(), m = (fs::path(dir) / merges).string();
    if (fs::exists(v, ec) && fs::exists(m, ec)) return parse(read_whole(v), read_whole(m), v, m);
  }
  throw Error(ErrorKind::kInvalidArgument,
              fmt::format("gpt2 tokenizer: {} holds neither vocab.json + merges.txt nor "
                          "encoder.json + vocab.bpe", dir),
              "scripts/fetch-gpt2-tokenizer.sh fetches GPT-2's vocabulary into data/gpt2");
}

int64_t Gpt2Tokenizer::vocab_size() const { return t_->vocab_size(); }
int64_t Gpt2Tokenizer::document_token() const { return t_->eot; }
int64_t Gpt2Tokenizer::merge_count() const { return t_->merge_count; }

std::string_view Gpt2Tokenizer::token_bytes(uint32_t id) const {
  return std::string_view(t_->bytes).substr(t_->offsets[id], t_->offsets[id + 1] - t_->offsets[id]);
}

void Gpt2Tokenizer::encode(std::string_view text, std::vector<uint32_t>& out) const {
  PieceCache& cache = t_cache;
  if (cache.owner != instance_id_ || cache.map.size() >= PieceCache::kMaxEntries) {
    cache.reset(instance_id_);
  }
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = gpt2_piece_end(text, pos);
    const std::string_view piece = text.substr(pos, end - pos);
    pos = end;
    if (piece.size() == 1) {
      out.push_back(t_->byte_token[static_cast<unsigned char>(piece[0])]);
      continue;
    }
    if (auto it = cache.map.find(piece); it != cache.map.end()) {
      const auto [off, len] = it->second;
      out.insert(out.end(), cache.arena.begin() + off, cache.arena.begin() + off + len);
      continue;
    }
    const size_t before = out.size();
    t_->encode_piece(piece, out);
    const auto off = static_cast<uint32_t>(cache.arena.size());
    cache.arena.insert(cache.arena.end(), out.begin() + static_cast<std::ptrdiff_t>(before),
                       out.end());
    cache.map.emplace(std::string(piece),
                      std::pair{off, static_cast<uint32_t>(out.size() - before)});
  }
}

void Gpt2Tokenizer::decode(std::span<const uint32_t> tokens, std::string& out) const {
  const auto v = static_cast<uint32_t>(t_->vocab_size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= v) {
      throw invalid_argument("gpt2 tokenizer: token {} at index {} is outside the vocabulary "
                             "(0..{})", tokens[i], i, v - 1);
    }
    out += token_bytes(tokens[i]);
  }
}

size_t Gpt2Tokenizer::cut_point(std::string_view text, size_t from) const {
  return gpt2_cut_point(text, from);
}

char32_t gpt2_byte_to_unicode(uint8_t b) { return kByteToUnicode[b]; }

}  // namespace ds::rt::data
