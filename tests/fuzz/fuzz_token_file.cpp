// Fuzzes llm.c token files (runtime/data/token_file.h) as the loaders open them: the header
// (magic, version, count against the file size), then the vocabulary check of every token.
// Input byte 0 picks the vocabulary (0: unchecked at open, else 256 * byte, and check_vocab
// is called too); the rest is the file.
// Invariants of an opened file: at least one token, exactly as many as the header says and the
// file holds, each below the vocabulary when one was checked.
#include <string>

#include "data/token_file.h"
#include "fuzz_support.h"

using namespace ds;
using namespace ds::rt;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int64_t vocab = 256 * static_cast<int64_t>(data[0]);
  const std::string path = fuzz::write_scratch("tokens.bin", data + 1, size - 1);
  fuzz::clear_error_or_value([&] {
    data::TokenFile f(path, vocab);
    DS_FUZZ_CHECK(f.size() >= 1);
    DS_FUZZ_CHECK(static_cast<size_t>(f.size()) * 2 + data::kTokenFileHeaderBytes == size - 1);
    uint64_t sum = 0;
    for (uint16_t t : f.tokens()) {
      if (vocab > 0) DS_FUZZ_CHECK(t < vocab);
      sum += t;
    }
    if (vocab == 0) f.check_vocab(256 + static_cast<int64_t>(sum % 65280));
  });
  return 0;
}
