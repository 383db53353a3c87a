// A Hugging Face byte-level BPE tokenizer.json: reading it (every unsupported setting named by
// its JSON path), and encoding as the `tokenizers` library does:
//   1. added tokens are cut out of the text (leftmost occurrence, the longest at a position);
//   2. each stretch between them is normalized (NFC or nothing), gets the ByteLevel prefix space
//      when asked, and is split into pre-tokens by a scanner for the file's Split pattern;
//   3. a pre-token is one token when ignore_merges is set and its bytes are a vocab entry, else
//      its bytes become byte tokens and the merges apply in rank order (lowest rank first, the
//      leftmost pair on ties), as in gpt2_bpe.cpp.
//
// The Llama-3 / Qwen2 pattern, alternatives tried in order at a position:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)   a contraction, any case (ſ folds to s, as Unicode case
//                                  folding in the regex engines does)
//   [^\r\n\p{L}\p{N}]?\p{L}+       a letter run, with one leading non-newline non-alphanumeric
//   \p{N}{1,3}  (Qwen2: \p{N})     up to three digits
//    ?[^\s\p{L}\p{N}]+[\r\n]*      a symbol run, with an optional leading space and trailing
//                                  newlines
//   \s*[\r\n]+                     a whitespace run up to and including its last \r or \n
//   \s+(?!\S) | \s+                as GPT-2: a whitespace run less its last character when a
//                                  non-space follows and that leaves any
// Character classes are gpt2_pretokenize.h's (ICU: L, N, White_Space).
#include "data/hf_tokenizer.h"

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "data/gpt2_bpe.h"
#include "data/gpt2_pretokenize.h"

namespace ds::rt::data {

const char* const kHfGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kHfLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kHfQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Named, not anonymous: HfTokenizer::Tables (a member of a class with linkage) holds these, and
// the unity build puts this file beside gpt2_bpe.cpp.
namespace hf_tokenizer_detail {

using json = nlohmann::json;
constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();
// Ids index dense tables: a bound keeps a corrupt file from asking for gigabytes (the largest
// real vocabularies hold a few hundred thousand tokens).
constexpr int64_t kMaxId = 1 << 24;

enum class Pattern { kGpt2, kLlama3, kQwen2 };

// (a, b) -> (rank, merged id): open addressing with linear probing, power-of-two capacity.
class PairRanks {
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
  void insert(uint32_t a, uint32_t b, uint32_t rank, uint32_t id) {
    const uint64_t key = pack(a, b);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return;  // a repeated merge keeps its first, lowest rank
      if (slots_[i].key == kEmpty) {
        slots_[i] = {key, rank, id};
        return;
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

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIds = std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>>;

struct AddedToken {
  std::string content;
  uint32_t id;
};

// The byte a code point of GPT-2's byte-level alphabet stands for, or -1.
int alphabet_byte(char32_t c) {
  static const auto inverse = [] {
    std::array<int16_t, 0x144> inv{};
    inv.fill(-1);
    for (int b = 0; b < 256; ++b)
      inv[gpt2_byte_to_unicode(static_cast<uint8_t>(b))] = static_cast<int16_t>(b);
    return inv;
  }();
  return c < inverse.size() ? inverse[c] : -1;
}

std::string alphabet_utf8(uint8_t b) {
  const char32_t c = gpt2_byte_to_unicode(b);
  if (c < 0x80) return std::string(1, static_cast<char>(c));
  return {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
}

// A vocab string's bytes: through the alphabet when every character is in it, else its own
// UTF-8 (nlohmann has validated it).
std::string vocab_bytes(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    char32_t c = b0;
    size_t len = 1;
    if (b0 >= 0xF0)
      c = b0 & 0x07, len = 4;
    else if (b0 >= 0xE0)
      c = b0 & 0x0F, len = 3;
    else if (b0 >= 0xC0)
      c = b0 & 0x1F, len = 2;
    for (size_t k = 1; k < len && i + k < s.size(); ++k) c = (c << 6) | (s[i + k] & 0x3F);
    const int byte = alphabet_byte(c);
    if (byte < 0) return s;
    out.push_back(static_cast<char>(byte));
    i += len;
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw system_error("hf tokenizer: cannot open {}", path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw system_error("hf tokenizer: cannot read {}", path);
  return text;
}

std::string quoted(const json& j) {
  return j.dump();
}

// Reads one JSON file's values, naming the file and JSON path in every error.
struct Reader {
  const std::string& file;

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw invalid_argument("hf tokenizer {}: {}: {}", file, path, what);
  }
  const json& member(const json& obj, const std::string& path, const char* key) const {
    if (!obj.is_object()) fail(path, fmt::format("expected an object, got {}", obj.type_name()));
    auto it = obj.find(key);
    if (it == obj.end()) fail(path + "." + key, "missing");
    return *it;
  }
  // An optional member: null when absent.
  const json& optional(const json& obj, const char* key) const {
    static const json null;
    auto it = obj.find(key);
    return it == obj.end() ? null : *it;
  }
  std::string string(const json& obj, const std::string& path, const char* key) const {
    const json& v = member(obj, path, key);
    if (!v.is_string()) fail(path + "." + key, fmt::format("expected a string, got {}", quoted(v)));
    return v.get<std::string>();
  }
  bool flag(const json& obj, const std::string& path, const char* key, bool dflt) const {
    const json& v = optional(obj, key);
    if (v.is_null()) return dflt;
    if (!v.is_boolean())
      fail(path + "." + key, fmt::format("expected true or false, got {}", quoted(v)));
    return v.get<bool>();
  }
  // A flag this reader implements only with one value.
  void require_flag(const json& obj, const std::string& path, const char* key, bool dflt,
                    bool want) const {
    if (flag(obj, path, key, dflt) != want) {
      fail(path + "." + key,
           fmt::format("{} is not supported (dstrain implements {})", !want, want));
    }
  }
  uint32_t id(const json& v, const std::string& path) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= kMaxId) {
      fail(path, fmt::format("expected a token id in [0, {}), got {}", kMaxId, quoted(v)));
    }
    return v.get<uint32_t>();
  }
};

json parse_json(std::string_view text, const std::string& file) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    throw invalid_argument("hf tokenizer {}: not valid JSON: {}", file, e.what());
  }
}

// Per-thread cache of pre-tokens -> ids, tagged with the tokenizer it belongs to.
struct PieceCache {
  static constexpr size_t kMaxEntries = 1 << 18;
  uint64_t owner = 0;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>> map;
  std::vector<uint32_t> arena;

  void reset(uint64_t id) {
    owner = id;
    map.clear();
    arena.clear();
  }
};

thread_local PieceCache t_hf_cache;
std::atomic<uint64_t> g_hf_next_instance{1};

// ---- The Llama-3 / Qwen2 scanner -------------------------------------------------------------

bool is_newline(char c) {
  return c == '\r' || c == '\n';
}

size_t class_run_end(std::string_view text, size_t pos, CharClass cls) {
  while (pos < text.size()) {
    const CharAt c = char_at(text, pos);
    if (c.cls != cls) break;
    pos += c.len;
  }
  return pos;
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d) at text[pos] == '\'': its end, or 0.
size_t folded_contraction_end(std::string_view text, size_t pos) {
  auto lower = [&](size_t i) -> int {
    if (i >= text.size()) return 0;
    const auto b = static_cast<unsigned char>(text[i]);
    return b >= 'A' && b <= 'Z' ? b + 32 : b;
  };
  const int a = lower(pos + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 2;
  if (a == 0xC5 && lower(pos + 2) == 0xBF) return pos + 3;  // U+017F LATIN SMALL LETTER LONG S
  const int b = lower(pos + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return pos + 3;
  return 0;
}

size_t llama_whitespace_end(std::string_view text, size_t pos) {
  size_t end = pos, last_start = pos, after_newline = 0;
  int count = 0;
  while (end < text.size()) {
    const CharAt c = char_at(text, end);
    if (c.cls != CharClass::kSpace) break;
    last_start = end;
    end += c.len;
    if (is_newline(text[last_start])) after_newline = end;
    ++count;
  }
  if (after_newline != 0) return after_newline;      // \s*[\r\n]+
  if (end == text.size() || count == 1) return end;  // \s+(?!\S) at the end, or \s+
  return last_start;                                 // \s+(?!\S) backtracks by one
}

size_t llama_piece_end(std::string_view text, size_t pos, int max_digits) {
  if (text[pos] == '\'') {
    if (size_t e = folded_contraction_end(text, pos)) return e;
  }
  const CharAt c = char_at(text, pos);
  if (c.cls == CharClass::kLetter) return class_run_end(text, pos, CharClass::kLetter);
  const size_t next = pos + c.len;
  const bool has_next = next < text.size();
  const CharAt n = has_next ? char_at(text, next) : CharAt{CharClass::kSpace, 0};
  if (c.cls != CharClass::kNumber && !is_newline(text[pos]) && has_next &&
      n.cls == CharClass::kLetter) {
    return class_run_end(text, next, CharClass::kLetter);
  }
  if (c.cls == CharClass::kNumber) {
    size_t e = pos;
    for (int k = 0; k < max_digits && e < text.size(); ++k) {
      const CharAt d = char_at(text, e);
      if (d.cls != CharClass::kNumber) break;
      e += d.len;
    }
    return e;
  }
  size_t sym = std::string_view::npos;
  if (c.cls == CharClass::kSymbol)
    sym = pos;
  else if (text[pos] == ' ' && has_next && n.cls == CharClass::kSymbol)
    sym = next;
  if (sym != std::string_view::npos) {
    size_t e = class_run_end(text, sym, CharClass::kSymbol);
    while (e < text.size() && is_newline(text[e])) ++e;
    return e;
  }
  return llama_whitespace_end(text, pos);
}

// NFC through ICU; text that is not valid UTF-8 is left as it is (the tokenizers library takes
// only valid strings).
bool nfc(std::string_view text, std::string& out) {
  if (std::all_of(text.begin(), text.end(), [](char ch) { return (ch & 0x80) == 0; })) return false;
  UErrorCode st = U_ZERO_ERROR;
  const UNormalizer2* norm = unorm2_getNFCInstance(&st);
  if (U_FAILURE(st)) throw Error(ErrorKind::kInternal, "ICU has no NFC normalizer");
  std::vector<UChar> src(text.size() + 1), dst;
  int32_t len = 0;
  u_strFromUTF8(src.data(), static_cast<int32_t>(src.size()), &len, text.data(),
                static_cast<int32_t>(text.size()), &st);
  if (U_FAILURE(st)) return false;
  if (unorm2_isNormalized(norm, src.data(), len, &st) || U_FAILURE(st)) return false;
  dst.resize(static_cast<size_t>(len) * 3 + 16);
  const int32_t n =
      unorm2_normalize(norm, src.data(), len, dst.data(), static_cast<int32_t>(dst.size()), &st);
  if (U_FAILURE(st)) return false;
  int32_t bytes = 0;
  out.resize(static_cast<size_t>(n) * 3 + 4);
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &bytes, dst.data(), n, &st);
  if (U_FAILURE(st)) return false;
  out.resize(static_cast<size_t>(bytes));
  return true;
}

}  // namespace hf_tokenizer_detail

namespace hfd = hf_tokenizer_detail;

struct HfTokenizer::Tables {
  std::vector<std::string> token_bytes;  // by id; empty = no such id
  std::vector<bool> present;             // by id
  std::array<uint32_t, 256> byte_token{};
  hfd::StringIds vocab;           // vocab string (alphabet) -> id
  hfd::StringIds vocab_by_bytes;  // a vocab entry's bytes -> id (ignore_merges)
  hfd::PairRanks merges;
  bool ignore_merges = false;
  bool nfc = false;
  bool add_prefix_space = false;
  hfd::Pattern pattern = hfd::Pattern::kGpt2;
  std::vector<hfd::AddedToken> added;   // longest first
  std::array<bool, 256> added_first{};  // a byte some added token starts with
  int64_t bos = -1, eos = -1, template_bos = -1, endoftext = -1;

  std::optional<uint32_t> find(std::string_view token) const {
    for (const auto& a : added) {
      if (a.content == token) return a.id;
    }
    if (auto it = vocab.find(token); it != vocab.end()) return it->second;
    return std::nullopt;
  }
  // The leftmost added token at or after `pos`: {start, index}, or {npos, 0}.
  std::pair<size_t, size_t> next_added(std::string_view text, size_t pos) const {
    if (added.empty()) return {std::string_view::npos, 0};
    for (size_t i = pos; i < text.size(); ++i) {
      if (!added_first[static_cast<unsigned char>(text[i])]) continue;
      for (size_t k = 0; k < added.size(); ++k) {
        if (text.compare(i, added[k].content.size(), added[k].content) == 0) return {i, k};
      }
    }
    return {std::string_view::npos, 0};
  }
  size_t piece_end(std::string_view text, size_t pos) const {
    switch (pattern) {
      case hfd::Pattern::kGpt2:
        return gpt2_piece_end(text, pos);
      case hfd::Pattern::kLlama3:
        return hfd::llama_piece_end(text, pos, 3);
      case hfd::Pattern::kQwen2:
        return hfd::llama_piece_end(text, pos, 1);
    }
    return text.size();
  }
  void bpe(std::string_view piece, std::vector<uint32_t>& out) const;
  void encode_stretch(std::string_view text, hfd::PieceCache& cache,
                      std::vector<uint32_t>& out) const;
};

namespace hf_tokenizer_detail {

void read_vocab(const Reader& r, const json& model, HfTokenizer::Tables& t) {
  const json& vocab = r.member(model, "model", "vocab");
  if (!vocab.is_object() || vocab.empty()) {
    r.fail("model.vocab", fmt::format("expected an object mapping token strings to ids, got {}",
                                      vocab.is_object() ? "an empty object" : vocab.type_name()));
  }
  t.vocab.reserve(vocab.size());
  uint32_t max_id = 0;
  for (const auto& [key, value] : vocab.items()) {
    const uint32_t id = r.id(value, "model.vocab[" + json(key).dump() + "]");
    if (id >= t.token_bytes.size()) {
      t.token_bytes.resize(std::max<size_t>(id + 1, t.token_bytes.size() * 2));
      t.present.resize(t.token_bytes.size());
    }
    if (t.present[id]) {
      r.fail("model.vocab[" + json(key).dump() + "]", fmt::format("id {} is given twice", id));
    }
    t.present[id] = true;
    t.token_bytes[id] = vocab_bytes(key);
    t.vocab.emplace(key, id);
    t.vocab_by_bytes.emplace(t.token_bytes[id], id);
    max_id = std::max(max_id, id);
  }
  t.token_bytes.resize(max_id + 1);
  t.present.resize(max_id + 1);
  for (int b = 0; b < 256; ++b) {
    const std::string key = alphabet_utf8(static_cast<uint8_t>(b));
    auto it = t.vocab.find(key);
    if (it == t.vocab.end()) {
      r.fail("model.vocab", fmt::format("the byte token for byte {} ({}) is missing; a byte-level "
                                        "BPE vocabulary holds all 256",
                                        b, json(key).dump()));
    }
    t.byte_token[static_cast<size_t>(b)] = it->second;
  }
}

void read_merges(const Reader& r, const json& model, HfTokenizer::Tables& t) {
  const json& merges = r.member(model, "model", "merges");
  if (!merges.is_array())
    r.fail("model.merges", fmt::format("expected an array, got {}", merges.type_name()));
  t.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string path = fmt::format("model.merges[{}]", i);
    const json& m = merges[i];
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size() ||
          s.find(' ', sp + 1) != std::string::npos) {
        r.fail(path, fmt::format("expected two tokens separated by one space, got {}", quoted(m)));
      }
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    } else {
      r.fail(path, fmt::format("expected \"a b\" or [\"a\", \"b\"], got {}", quoted(m)));
    }
    auto id_of = [&](const std::string& tok, const char* what) {
      auto it = t.vocab.find(tok);
      if (it == t.vocab.end()) {
        r.fail(path, fmt::format("{} {} of merge {} is not in model.vocab", what, json(tok).dump(),
                                 quoted(m)));
      }
      return it->second;
    };
    const uint32_t ia = id_of(a, "token"), ib = id_of(b, "token"),
                   merged = id_of(a + b, "the merged token");
    t.merges.insert(ia, ib, static_cast<uint32_t>(i), merged);
  }
}

void read_model(const Reader& r, const json& root, HfTokenizer::Tables& t) {
  const json& model = r.member(root, "", "model");
  const json& type = r.optional(model, "type");
  if (!type.is_null() && type != "BPE") {
    r.fail("model.type", fmt::format("{} is not supported: dstrain reads byte-level BPE "
                                     "tokenizer.json files (model.type \"BPE\"); a SentencePiece "
                                     "model goes through --tokenizer sentencepiece",
                                     quoted(type)));
  }
  if (!r.optional(model, "dropout").is_null())
    r.fail("model.dropout", "BPE dropout is not supported (expected null)");
  r.require_flag(model, "model", "byte_fallback", false, false);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json& v = r.optional(model, key);
    if (!v.is_null() && v != "") {
      r.fail(std::string("model.") + key,
             fmt::format("{} is not supported (expected null or \"\")", quoted(v)));
    }
  }
  t.ignore_merges = r.flag(model, "model", "ignore_merges", false);
  read_vocab(r, model, t);
  read_merges(r, model, t);
}

void read_added_tokens(const Reader& r, const json& root, HfTokenizer::Tables& t) {
  const json& added = r.optional(root, "added_tokens");
  if (added.is_null()) return;
  if (!added.is_array())
    r.fail("added_tokens", fmt::format("expected an array, got {}", added.type_name()));
  for (size_t i = 0; i < added.size(); ++i) {
    const std::string path = fmt::format("added_tokens[{}]", i);
    const uint32_t id = r.id(r.member(added[i], path, "id"), path + ".id");
    const std::string content = r.string(added[i], path, "content");
    if (content.empty()) r.fail(path + ".content", "an added token cannot be empty");
    for (const char* key : {"lstrip", "rstrip", "single_word"}) {
      r.require_flag(added[i], path, key, false, false);
    }
    if (id >= t.token_bytes.size()) {
      t.token_bytes.resize(id + 1);
      t.present.resize(id + 1);
    }
    t.present[id] = true;
    t.token_bytes[id] = content;
    t.added.push_back({content, id});
    t.added_first[static_cast<unsigned char>(content[0])] = true;
  }
  std::stable_sort(t.added.begin(), t.added.end(), [](const AddedToken& a, const AddedToken& b) {
    return a.content.size() > b.content.size();
  });
}

void read_normalizer(const Reader& r, const json& root, HfTokenizer::Tables& t) {
  const json& n = r.optional(root, "normalizer");
  if (n.is_null()) return;
  const std::string type = r.string(n, "normalizer", "type");
  if (type != "NFC") {
    r.fail("normalizer.type", fmt::format("\"{}\" is not supported (null or NFC)", type));
  }
  t.nfc = true;
}

Pattern read_split(const Reader& r, const json& split, const std::string& path) {
  const json& pattern = r.member(split, path, "pattern");
  const json& regex = r.optional(pattern, "Regex");
  if (!pattern.is_object() || !regex.is_string()) {
    r.fail(path + ".pattern", fmt::format("expected {{\"Regex\": ...}}, got {}", quoted(pattern)));
  }
  const std::string behavior = r.string(split, path, "behavior");
  if (behavior != "Isolated") {
    r.fail(path + ".behavior", fmt::format("\"{}\" is not supported (Isolated)", behavior));
  }
  r.require_flag(split, path, "invert", false, false);
  const std::string p = regex.get<std::string>();
  if (p == kHfGpt2Pattern) return Pattern::kGpt2;
  if (p == kHfLlama3Pattern) return Pattern::kLlama3;
  if (p == kHfQwen2Pattern) return Pattern::kQwen2;
  throw Error(ErrorKind::kInvalidArgument,
              fmt::format("hf tokenizer {}: {}.pattern.Regex: the pattern {} is not supported: "
                          "dstrain matches only GPT-2's {}, Llama-3's {} and Qwen2's {}",
                          r.file, path, json(p).dump(), json(kHfGpt2Pattern).dump(),
                          json(kHfLlama3Pattern).dump(), json(kHfQwen2Pattern).dump()),
              "pre-tokenizer patterns are hand-written scanners (runtime/data/hf_tokenizer.cpp); "
              "a new one needs a new scanner");
}

void read_pre_tokenizer(const Reader& r, const json& root, HfTokenizer::Tables& t) {
  const json& pre = r.member(root, "", "pre_tokenizer");
  if (pre.is_null())
    r.fail("pre_tokenizer",
           "null is not supported (expected ByteLevel or a Sequence of Split + ByteLevel)");
  const std::string type = r.string(pre, "pre_tokenizer", "type");
  if (type == "ByteLevel") {
    r.require_flag(pre, "pre_tokenizer", "use_regex", true, true);
    t.add_prefix_space = r.flag(pre, "pre_tokenizer", "add_prefix_space", true);
    t.pattern = Pattern::kGpt2;
    return;
  }
  if (type != "Sequence") {
    r.fail("pre_tokenizer.type", fmt::format("\"{}\" is not supported (ByteLevel, or a Sequence "
                                             "of Split + ByteLevel)",
                                             type));
  }
  const json& seq = r.member(pre, "pre_tokenizer", "pretokenizers");
  if (!seq.is_array() || seq.size() != 2 || !seq[0].is_object() || !seq[1].is_object() ||
      seq[0].value("type", "") != "Split" || seq[1].value("type", "") != "ByteLevel") {
    r.fail("pre_tokenizer.pretokenizers",
           fmt::format("expected [Split, ByteLevel], got {}", seq.dump().substr(0, 200)));
  }
  t.pattern = read_split(r, seq[0], "pre_tokenizer.pretokenizers[0]");
  r.require_flag(seq[1], "pre_tokenizer.pretokenizers[1]", "use_regex", true, false);
  r.require_flag(seq[1], "pre_tokenizer.pretokenizers[1]", "add_prefix_space", true, false);
}

void read_decoder(const Reader& r, const json& root) {
  const json& d = r.member(root, "", "decoder");
  if (d.is_null() || r.string(d, "decoder", "type") != "ByteLevel") {
    r.fail("decoder",
           fmt::format("expected {{\"type\": \"ByteLevel\"}}, got {}", d.dump().substr(0, 200)));
  }
}

// The id of the special token a TemplateProcessing's "single" template starts with, or -1.
int64_t template_bos(const Reader& r, const json& p, const std::string& path,
                     const HfTokenizer::Tables& t) {
  const json& single = r.member(p, path, "single");
  if (!single.is_array()) r.fail(path + ".single", "expected an array");
  if (single.empty() || !single[0].is_object() || !single[0].contains("SpecialToken")) return -1;
  const json& special = single[0]["SpecialToken"];
  const std::string name = r.string(special, path + ".single[0].SpecialToken", "id");
  const json& table = r.optional(p, "special_tokens");
  if (table.is_object() && table.contains(name)) {
    const json& ids = r.member(table[name], path + ".special_tokens." + name, "ids");
    if (ids.is_array() && ids.size() == 1)
      return r.id(ids[0], path + ".special_tokens." + name + ".ids[0]");
    r.fail(path + ".special_tokens." + name + ".ids", "expected one id");
  }
  if (auto id = t.find(name)) return *id;
  r.fail(path + ".single[0]",
         fmt::format("the special token {} is not a token", json(name).dump()));
}

void read_post_processor(const Reader& r, const json& p, const std::string& path,
                         HfTokenizer::Tables& t) {
  if (p.is_null()) return;
  const std::string type = r.string(p, path, "type");
  if (type == "ByteLevel") return;
  if (type == "TemplateProcessing") {
    t.template_bos = template_bos(r, p, path, t);
    return;
  }
  if (type == "Sequence") {
    const json& procs = r.member(p, path, "processors");
    if (!procs.is_array()) r.fail(path + ".processors", "expected an array");
    for (size_t i = 0; i < procs.size(); ++i) {
      read_post_processor(r, procs[i], fmt::format("{}.processors[{}]", path, i), t);
    }
    return;
  }
  r.fail(path + ".type", fmt::format("\"{}\" is not supported (ByteLevel, TemplateProcessing or "
                                     "a Sequence of them)",
                                     type));
}

// tokenizer_config.json's bos_token / eos_token: a string, {"content": ...} or null.
int64_t config_token(const Reader& r, const json& config, const char* key,
                     const HfTokenizer::Tables& t) {
  const json& v = r.optional(config, key);
  if (v.is_null()) return -1;
  std::string name;
  if (v.is_string())
    name = v.get<std::string>();
  else if (v.is_object())
    name = r.string(v, key, "content");
  else
    r.fail(key, fmt::format("expected a string, {{\"content\": ...}} or null, got {}", quoted(v)));
  if (auto id = t.find(name)) return *id;
  r.fail(key, fmt::format("{} is not a token of the tokenizer", json(name).dump()));
}

}  // namespace hf_tokenizer_detail

void HfTokenizer::Tables::bpe(std::string_view piece, std::vector<uint32_t>& out) const {
  thread_local std::vector<uint32_t> sym;
  thread_local std::vector<uint32_t> rank;
  sym.resize(piece.size());
  for (size_t i = 0; i < piece.size(); ++i)
    sym[i] = byte_token[static_cast<unsigned char>(piece[i])];
  auto rank_of = [&](size_t i) {
    const hfd::PairRanks::Entry* e = merges.find(sym[i], sym[i + 1]);
    return e != nullptr ? e->rank : hfd::kNoRank;
  };
  rank.resize(sym.size() - 1);
  for (size_t i = 0; i + 1 < sym.size(); ++i) rank[i] = rank_of(i);
  while (sym.size() > 1) {
    size_t best = 0;
    for (size_t i = 1; i < rank.size(); ++i) {
      if (rank[i] < rank[best]) best = i;
    }
    if (rank[best] == hfd::kNoRank) break;
    sym[best] = merges.find(sym[best], sym[best + 1])->id;
    sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    rank.erase(rank.begin() + static_cast<std::ptrdiff_t>(best));
    if (best + 1 < sym.size()) rank[best] = rank_of(best);
    if (best > 0) rank[best - 1] = rank_of(best - 1);
  }
  out.insert(out.end(), sym.begin(), sym.end());
}

// One stretch of text between added tokens: normalize, prefix space, pre-tokens, BPE.
void HfTokenizer::Tables::encode_stretch(std::string_view text, hfd::PieceCache& cache,
                                         std::vector<uint32_t>& out) const {
  if (text.empty()) return;
  thread_local std::string normalized;
  if (nfc && hfd::nfc(text, normalized)) text = normalized;
  thread_local std::string prefixed;
  if (add_prefix_space && text[0] != ' ') {
    prefixed.assign(1, ' ');
    prefixed += text;
    text = prefixed;
  }
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = piece_end(text, pos);
    const std::string_view piece = text.substr(pos, end - pos);
    pos = end;
    if (piece.size() == 1) {
      out.push_back(byte_token[static_cast<unsigned char>(piece[0])]);
      continue;
    }
    if (auto it = cache.map.find(piece); it != cache.map.end()) {
      const auto [off, len] = it->second;
      out.insert(out.end(), cache.arena.begin() + off, cache.arena.begin() + off + len);
      continue;
    }
    const size_t before = out.size();
    auto whole = ignore_merges ? vocab_by_bytes.find(piece) : vocab_by_bytes.end();
    if (whole != vocab_by_bytes.end())
      out.push_back(whole->second);
    else
      bpe(piece, out);
    const auto off = static_cast<uint32_t>(cache.arena.size());
    cache.arena.insert(cache.arena.end(), out.begin() + static_cast<std::ptrdiff_t>(before),
                       out.end());
    cache.map.emplace(std::string(piece),
                      std::pair{off, static_cast<uint32_t>(out.size() - before)});
  }
}

HfTokenizer::HfTokenizer(std::unique_ptr<Tables> t)
    : t_(std::move(t)), instance_id_(hfd::g_hf_next_instance.fetch_add(1)) {}

HfTokenizer::~HfTokenizer() = default;

std::unique_ptr<HfTokenizer> HfTokenizer::parse(std::string_view tokenizer_json,
                                                std::string_view config_json,
                                                const std::string& tokenizer_name,
                                                const std::string& config_name) {
  auto t = std::make_unique<Tables>();
  const hfd::json root = hfd::parse_json(tokenizer_json, tokenizer_name);
  const hfd::Reader r{tokenizer_name};
  if (!root.is_object())
    r.fail("(top level)", fmt::format("expected an object, got {}", root.type_name()));
  hfd::read_model(r, root, *t);
  hfd::read_added_tokens(r, root, *t);
  hfd::read_normalizer(r, root, *t);
  hfd::read_pre_tokenizer(r, root, *t);
  hfd::read_decoder(r, root);
  hfd::read_post_processor(r, r.optional(root, "post_processor"), "post_processor", *t);
  if (auto id = t->find("<|endoftext|>")) t->endoftext = *id;
  if (!config_json.empty()) {
    const hfd::json config = hfd::parse_json(config_json, config_name);
    const hfd::Reader c{config_name};
    if (!config.is_object()) c.fail("(top level)", "expected an object");
    t->bos = hfd::config_token(c, config, "bos_token", *t);
    t->eos = hfd::config_token(c, config, "eos_token", *t);
  }
  return std::unique_ptr<HfTokenizer>(new HfTokenizer(std::move(t)));
}

std::unique_ptr<HfTokenizer> HfTokenizer::from_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path file =
      fs::is_directory(path, ec) ? fs::path(path) / "tokenizer.json" : fs::path(path);
  if (!fs::is_regular_file(file, ec)) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("hf tokenizer: {} is neither a directory holding tokenizer.json "
                            "nor a tokenizer.json file",
                            path),
                "pass a Hugging Face model directory holding tokenizer.json, or the file itself");
  }
  const fs::path config = file.parent_path() / "tokenizer_config.json";
  const std::string config_text =
      fs::is_regular_file(config, ec) ? hfd::read_file(config.string()) : "";
  return parse(hfd::read_file(file.string()), config_text, file.string(), config.string());
}

int64_t HfTokenizer::vocab_size() const {
  return static_cast<int64_t>(t_->token_bytes.size());
}

int64_t HfTokenizer::document_token() const {
  if (t_->bos >= 0) return t_->bos;
  if (t_->template_bos >= 0) return t_->template_bos;
  return t_->endoftext;
}

int64_t HfTokenizer::eos_token() const {
  return t_->eos;
}

std::optional<uint32_t> HfTokenizer::token_id(std::string_view token) const {
  return t_->find(token);
}

std::string_view HfTokenizer::pattern_name() const {
  switch (t_->pattern) {
    case hfd::Pattern::kGpt2:
      return "gpt2";
    case hfd::Pattern::kLlama3:
      return "llama3";
    case hfd::Pattern::kQwen2:
      return "qwen2";
  }
  return "";
}

void HfTokenizer::encode(std::string_view text, std::vector<uint32_t>& out) const {
  hfd::PieceCache& cache = hfd::t_hf_cache;
  if (cache.owner != instance_id_ || cache.map.size() >= hfd::PieceCache::kMaxEntries) {
    cache.reset(instance_id_);
  }
  for (size_t pos = 0; pos < text.size();) {
    const auto [start, k] = t_->next_added(text, pos);
    if (start == std::string_view::npos) {
      t_->encode_stretch(text.substr(pos), cache, out);
      break;
    }
    t_->encode_stretch(text.substr(pos, start - pos), cache, out);
    out.push_back(t_->added[k].id);
    pos = start + t_->added[k].content.size();
  }
}

void HfTokenizer::decode(std::span<const uint32_t> tokens, std::string& out) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= t_->present.size() || !t_->present[tokens[i]]) {
      throw invalid_argument(
          "hf tokenizer: token {} at index {} is not in the vocabulary (ids "
          "0..{}, with gaps)",
          tokens[i], i, t_->present.size() - 1);
    }
    out += t_->token_bytes[tokens[i]];
  }
}

size_t HfTokenizer::cut_point(std::string_view text, size_t from) const {
  if (t_->add_prefix_space) return std::string_view::npos;
  auto inside_added = [&](size_t c) {
    for (const auto& a : t_->added) {
      const size_t len = a.content.size();
      // An occurrence covering c starts in (c - len, c) and lies within this window.
      const size_t lo = c >= len ? c - len + 1 : 0;
      const std::string_view window = text.substr(lo, std::min(text.size(), c + len - 1) - lo);
      if (window.find(a.content) != std::string_view::npos) return true;
    }
    return false;
  };
  for (size_t i = std::max<size_t>(from, 1); i < text.size(); ++i) {
    size_t c = i;
    if (t_->pattern == hfd::Pattern::kGpt2) {
      c = gpt2_cut_point(text, i);
      if (c == std::string_view::npos) return c;
    } else {
      const auto b = static_cast<unsigned char>(text[i]);
      if (!hfd::is_newline(text[i - 1]) || b < 0x21 || b > 0x7E) continue;
    }
    if (!inside_added(c)) return c;
    i = c;
  }
  return std::string_view::npos;
}

}  // namespace ds::rt::data
