// GPT-2's pre-tokenisation pattern as a scanner. At a position the alternatives are tried in the
// pattern's order:
//   1. a contraction ('s 't 'm 'd, then 're 've 'll), ASCII and case-sensitive;
//   2-4. an optional single U+0020 followed by a maximal run of one class (letters, numbers, or
//      symbols = neither space, letter nor number);
//   5. \s+(?!\S): a whitespace run, less its last character when a non-space follows it (the
//      greedy run backtracks by one so that the lookahead sees a space), if that leaves any;
//   6. \s+: otherwise the run (then it is one character followed by a non-space).
#include "data/gpt2_pretokenize.h"

#include <unicode/uchar.h>

#include <array>

namespace ds::rt::data {

namespace {

CharClass classify(UChar32 c) {
  if (u_isUWhiteSpace(c)) return CharClass::kSpace;
  const uint32_t mask = U_GET_GC_MASK(c);
  if (mask & U_GC_L_MASK) return CharClass::kLetter;
  if (mask & U_GC_N_MASK) return CharClass::kNumber;
  return CharClass::kSymbol;
}

// The BMP's classes, read from ICU once (thread-safe static initialisation).
const std::array<CharClass, 0x10000>& bmp_classes() {
  static const auto table = [] {
    std::array<CharClass, 0x10000> t{};
    for (UChar32 c = 0; c < 0x10000; ++c) t[static_cast<size_t>(c)] = classify(c);
    return t;
  }();
  return table;
}

bool is_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

// Decodes one strict UTF-8 scalar at text[pos]; len 0 = invalid (taken as one symbol byte).
struct Decoded {
  UChar32 cp;
  uint8_t len;
};

Decoded decode_utf8(std::string_view text, size_t pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  const size_t left = text.size() - pos;
  const unsigned char b0 = s[0];
  if (b0 < 0x80) return {b0, 1};
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (left >= 2 && is_cont(s[1])) return {((b0 & 0x1F) << 6) | (s[1] & 0x3F), 2};
    return {0, 0};
  }
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (left < 3 || !is_cont(s[1]) || !is_cont(s[2])) return {0, 0};
    if ((b0 == 0xE0 && s[1] < 0xA0) || (b0 == 0xED && s[1] > 0x9F)) return {0, 0};
    return {((b0 & 0x0F) << 12) | ((s[1] & 0x3F) << 6) | (s[2] & 0x3F), 3};
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (left < 4 || !is_cont(s[1]) || !is_cont(s[2]) || !is_cont(s[3])) return {0, 0};
    if ((b0 == 0xF0 && s[1] < 0x90) || (b0 == 0xF4 && s[1] > 0x8F)) return {0, 0};
    return {((b0 & 0x07) << 18) | ((s[1] & 0x3F) << 12) | ((s[2] & 0x3F) << 6) | (s[3] & 0x3F),
            4};
  }
  return {0, 0};
}

// The end of the maximal run of class `cls` starting at pos (the character at pos is of it).
size_t run_end(std::string_view text, size_t pos, CharClass cls) {
  while (pos < text.size()) {
    const CharAt c = char_at(text, pos);
    if (c.cls != cls) break;
    pos += c.len;
  }
  return pos;
}

size_t contraction_end(std::string_view text, size_t pos) {
  if (pos + 1 >= text.size()) return 0;
  const char a = text[pos + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 2;
  if (pos + 2 >= text.size()) return 0;
  const char b = text[pos + 2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return pos + 3;
  return 0;
}

size_t whitespace_end(std::string_view text, size_t pos) {
  size_t last_start = pos, end = pos;
  int count = 0;
  while (end < text.size()) {
    const CharAt c = char_at(text, end);
    if (c.cls != CharClass::kSpace) break;
    last_start = end;
    end += c.len;
    ++count;
  }
  if (end == text.size() || count == 1) return end;  // (?!\S) holds at the end / rule 6
  return last_start;                                 // backtrack by one character
}

}  // namespace

CharAt char_at(std::string_view text, size_t pos) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  if (b0 < 0x80) return {bmp_classes()[b0], 1};
  const Decoded d = decode_utf8(text, pos);
  if (d.len == 0) return {CharClass::kSymbol, 1};
  const CharClass cls = d.cp < 0x10000 ? bmp_classes()[static_cast<size_t>(d.cp)] : classify(d.cp);
  return {cls, d.len};
}

size_t gpt2_piece_end(std::string_view text, size_t pos) {
  if (text[pos] == '\'') {
    if (size_t e = contraction_end(text, pos)) return e;
  }
  const CharAt c = char_at(text, pos);
  if (text[pos] == ' ' && pos + 1 < text.size()) {
    const CharAt next = char_at(text, pos + 1);
    if (next.cls != CharClass::kSpace) return run_end(text, pos + 1, next.cls);
  }
  if (c.cls != CharClass::kSpace) return run_end(text, pos, c.cls);
  return whitespace_end(text, pos);
}

std::vector<std::string_view> gpt2_pieces(std::string_view text) {
  std::vector<std::string_view> out;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = gpt2_piece_end(text, pos);
    out.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return out;
}

size_t gpt2_cut_point(std::string_view text, size_t from) {
  auto ascii_letter = [](unsigned char b) { return (b | 0x20) >= 'a' && (b | 0x20) <= 'z'; };
  for (size_t i = from < 1 ? 1 : from; i < text.size(); ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80 && !ascii_letter(b) && ascii_letter(static_cast<unsigned char>(text[i - 1]))) {
      return i;
    }
  }
  return std::string_view::npos;
}

}  // namespace ds::rt::data
