// Logging through spdlog. One process-wide logger; level from DSTRAIN_LOG_LEVEL or --log-level.
// Messages go to stderr so that stdout carries only a command's output (tables, JSON).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

namespace ds::log {

// Sets up the default logger ("dstrain", stderr, "[dstrain] level: message"). Idempotent.
// `level` empty means DSTRAIN_LOG_LEVEL (default info). Unknown level: invalid_argument.
void init(const std::string& level = {});

// A sink that records formatted lines, for tests that assert on log output.
class RecordingSink;
std::shared_ptr<RecordingSink> record();  // attaches to the default logger
class RecordingSink {
 public:
  virtual ~RecordingSink() = default;
  virtual std::vector<std::string> lines() const = 0;
};

}  // namespace ds::log
