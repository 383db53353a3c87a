// Shared pieces of the fuzz targets (tests/fuzz/README.md).
//
// The contract every target checks: a parser of outside input either returns a value that keeps
// its documented invariants, or throws ds::Error (a clear message). Any other exception
// (nlohmann's type_error, std::out_of_range, bad_alloc, ...) escapes the target and libFuzzer
// reports it as a crash, as it does for a sanitizer's report, an abort or a hang.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace ds::fuzz {

// Runs `f`; a ds::Error is the clear error the parser promises and is swallowed.
template <typename F>
bool clear_error_or_value(F&& f) {
  try {
    f();
    return true;
  } catch (const ds::Error&) {
    return false;
  }
}

// A broken invariant: prints it and aborts, so libFuzzer keeps the input.
[[noreturn]] inline void invariant_failed(const char* what) {
  std::fprintf(stderr, "fuzz invariant failed: %s\n", what);
  std::abort();
}
#define DS_FUZZ_CHECK(cond) \
  do {                      \
    if (!(cond)) ::ds::fuzz::invariant_failed(#cond); \
  } while (0)

// This process's scratch directory (created on first use under $TMPDIR or /tmp, removed at exit).
const std::string& scratch_dir();
// Writes `data` to <scratch>/<name> (replacing it) and returns the path.
std::string write_scratch(const std::string& name, const uint8_t* data, size_t size);

// Quiets dstrain's logging (spdlog): warnings on every input would dominate the time.
void quiet_logging();

// The parts of an input split at NUL bytes, at most `max_parts` (the last keeps the rest).
std::vector<std::string_view> split_nul(std::string_view in, size_t max_parts);

}  // namespace ds::fuzz
