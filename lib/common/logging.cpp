#include "common/logging.h"

#include <mutex>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include "common/env.h"
#include "common/error.h"

namespace ds::log {

void init(const std::string& level) {
  std::string lv = level.empty() ? env::get_or_default("DSTRAIN_LOG_LEVEL") : level;
  auto parsed = spdlog::level::from_str(lv);
  if (parsed == spdlog::level::off && lv != "off") {
    throw invalid_argument("unknown log level '{}' (expected trace, debug, info, warn, error, off)",
                           lv);
  }
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("dstrain");
    logger->set_pattern("[dstrain] %^%l%$: %v");
    spdlog::set_default_logger(logger);
  });
  spdlog::set_level(parsed);
}

namespace {
class RecordingSinkImpl final : public RecordingSink,
                                public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> lines() const override {
    std::lock_guard<std::mutex> lock(lines_mu_);
    return lines_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    std::lock_guard<std::mutex> lock(lines_mu_);
    lines_.emplace_back(fmt::format("{}: {}", spdlog::level::to_string_view(msg.level),
                                    std::string_view(msg.payload.data(), msg.payload.size())));
  }
  void flush_() override {}

 private:
  mutable std::mutex lines_mu_;
  std::vector<std::string> lines_;
};
}  // namespace

std::shared_ptr<RecordingSink> record() {
  init();
  auto sink = std::make_shared<RecordingSinkImpl>();
  spdlog::default_logger()->sinks().push_back(sink);
  return sink;
}

}  // namespace ds::log
