// GPT-2's pre-tokenisation: the text is split into pieces by OpenAI's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (leftmost alternative first, each greedy), and BPE then runs inside each piece. Here the
// pattern is a hand-written scanner with the same semantics, not a regex engine.
//
// Character classes come from ICU (libicu-dev): \p{L} is general category L (Lu Ll Lt Lm Lo),
// \p{N} is N (Nd Nl No), \s is Unicode's White_Space property (u_isUWhiteSpace), which is what
// tiktoken's and Python's `regex` \s are; llm.c's GPT-2 data was made with tiktoken. (The npm
// gpt-3-encoder's JavaScript \s differs at U+0085, which it does not count as space, and
// U+FEFF, which it does.) The classes of the Basic Multilingual Plane are read from ICU once
// into a 64 KiB table; code points above it ask ICU directly.
//
// Bytes that are not valid UTF-8 (stray continuation bytes, overlong forms, surrogates, code
// points above U+10FFFF, truncated sequences) are taken one byte at a time as symbols (the class
// of [^\s\p{L}\p{N}]), so every byte string has a pre-tokenisation and decodes back exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace ds::rt::data {

enum class CharClass : uint8_t { kSymbol = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

// The class of the character at text[pos] and its length in bytes (1 for an invalid byte).
// pos < text.size().
struct CharAt {
  CharClass cls;
  uint8_t len;
};
CharAt char_at(std::string_view text, size_t pos);

// The end (exclusive) of the piece that starts at `pos` (< text.size()).
size_t gpt2_piece_end(std::string_view text, size_t pos);

// All pieces of `text`, in order (their concatenation is `text`). For tests and tools.
std::vector<std::string_view> gpt2_pieces(std::string_view text);

// A point where cutting `text` leaves every piece unchanged: a letter followed by an ASCII
// non-letter (a piece holding a letter is a letter run or a contraction ending in a letter, so
// it ends there, and the pattern restarts from that point with no memory). The smallest such
// point >= from, or npos.
size_t gpt2_cut_point(std::string_view text, size_t from);

}  // namespace ds::rt::data
