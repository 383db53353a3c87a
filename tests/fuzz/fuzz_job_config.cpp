// Fuzzes job configs (lib/config/job_config.h): the strict JSON reader (duplicate keys, lines),
// every section's reader and the cross-section rules, for world sizes 1 and 8.
// Invariants of a valid config: the batch triad holds against the data-parallel size, and
// to_json() parses back (with no base path) to the same config, as job_config.h promises.
#include <string>

#include "config/job_config.h"
#include "fuzz_support.h"

using namespace ds;

namespace {

void check_config(const config::JobConfig& c, int world) {
  DS_FUZZ_CHECK(c.world_size == world);
  DS_FUZZ_CHECK(c.data_parallel_size >= 1);
  DS_FUZZ_CHECK(c.data_parallel_size * c.tensor_parallel.size * c.pipeline.stages == world);
  DS_FUZZ_CHECK(c.train_batch_size ==
                c.train_micro_batch_size_per_gpu * c.gradient_accumulation_steps * c.data_parallel_size);
  const std::string text = c.to_json().dump();
  config::JobConfig again;
  try {
    again = config::parse_job_config(text, "", world);
  } catch (const ds::Error& e) {
    std::fprintf(stderr, "to_json() did not parse back: %s\n%s\n", e.what(), text.c_str());
    fuzz::invariant_failed("round trip of to_json()");
  }
  DS_FUZZ_CHECK(again.to_json() == c.to_json());
  fuzz::clear_error_or_value([&] { config::require_training_sections(c); });
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  for (int world : {1, 8}) {
    config::JobConfig c;
    if (fuzz::clear_error_or_value([&] { c = config::parse_job_config(text, "configs/fuzz.json", world); })) {
      check_config(c, world);
    }
  }
  return 0;
}
