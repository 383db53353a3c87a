// Where the tests find GPT-2's real vocabulary: $DSTRAIN_GPT2_VOCAB, else data/gpt2 in the source
// tree (scripts/fetch-gpt2-tokenizer.sh puts it there; scripts/test.sh runs that script first).
// Without it the tests that need it FAIL, naming the script, so CI cannot pass by skipping them;
// a developer offline sets DSTRAIN_ALLOW_NO_GPT2=1 to skip them instead.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace ds::test {

inline std::string gpt2_vocab_dir() {
  if (const char* env = std::getenv("DSTRAIN_GPT2_VOCAB"); env != nullptr && *env != '\0') return env;
  return std::string(DS_SOURCE_DIR) + "/data/gpt2";
}

inline bool have_gpt2_vocab() {
  const std::filesystem::path d(gpt2_vocab_dir());
  return std::filesystem::exists(d / "encoder.json") && std::filesystem::exists(d / "vocab.bpe");
}

}  // namespace ds::test

// Opens a test that needs GPT-2's vocabulary: fails (or skips with DSTRAIN_ALLOW_NO_GPT2=1).
#define DS_REQUIRE_GPT2_VOCAB()                                                              \
  do {                                                                                       \
    if (!::ds::test::have_gpt2_vocab()) {                                                    \
      const char* allow = std::getenv("DSTRAIN_ALLOW_NO_GPT2");                              \
      if (allow != nullptr && std::string(allow) == "1") {                                   \
        GTEST_SKIP() << "no GPT-2 vocabulary in " << ::ds::test::gpt2_vocab_dir();           \
      }                                                                                      \
      FAIL() << "GPT-2's vocabulary is missing from " << ::ds::test::gpt2_vocab_dir()        \
             << ": run scripts/fetch-gpt2-tokenizer.sh (or set DSTRAIN_ALLOW_NO_GPT2=1 to "  \
                "skip these tests)";                                                         \
    }                                                                                        \
  } while (0)
