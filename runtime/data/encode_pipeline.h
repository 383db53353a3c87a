// Encoding text files at scale: streamed (a file is read in rounds of a few chunks, never whole),
// parallel across threads, and the same ids in the same order for any thread count.
//
// Each round reads the next bytes of the current file and cuts them into chunks of about
// `chunk_bytes`, each ending at the first point at or after that size where the tokenizer says
// a cut leaves the ids unchanged (Tokenizer::cut_point). The chunks are encoded in parallel and
// emitted in order; the bytes after the last cut wait for the next round. Since every cut is
// exact, the ids are those of encoding each file whole, whatever the thread count, chunk size or
// read size. A file with no cut point (say, megabytes of Chinese without an ASCII letter for
// GPT-2, or without a newline for SentencePiece) is held in memory until one comes.
//
// Documents: every input file is one document; the tokenizer's document token (GPT-2's
// <|endoftext|>, a SentencePiece model's BOS) is written before each, as llm.c's data scripts do.
//
// A split: the stream may change from part 0 to part 1 (train to validation) at the first cut
// point at or after a given byte of the concatenated input.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace ds::rt::data {

struct EncodeOptions {
  int threads = 1;                   // encoder threads (>= 1)
  size_t chunk_bytes = 1 << 20;      // target chunk size
  size_t read_bytes = 0;             // bytes read per round; 0 = 4 * threads * chunk_bytes
  int64_t split_byte = -1;           // part 1 starts at the first cut at or after this input
                                     // byte (of all files together); -1 = no split
};

struct EncodeProgress {
  int64_t bytes_done = 0;
  int64_t bytes_total = 0;  // all input files' sizes
  int64_t tokens = 0;
};

// Receives the ids in order; `part` is 0 or 1 (see split_byte).
using TokenSink = std::function<void(std::span<const uint32_t> tokens, int part)>;
// Called after every round, on the calling thread.
using ProgressFn = std::function<void(const EncodeProgress&)>;

// Encodes `files` in order with `tok` into `sink`. Throws ds::Error naming the file when one is
// missing or unreadable (before anything is encoded, all are checked), and what the tokenizer or
// the sink throw.
EncodeProgress encode_files(const Tokenizer& tok, const std::vector<std::string>& files,
                            const EncodeOptions& options, const TokenSink& sink,
                            const ProgressFn& progress = {});

}  // namespace ds::rt::data
