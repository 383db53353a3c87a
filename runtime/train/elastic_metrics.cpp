// The elastic restart's metrics (elastic_metrics.h).
#include "train/elastic_metrics.h"

#include <chrono>
#include <cstdlib>

#include "common/env.h"

namespace ds::rt::train {

ElasticMetrics::ElasticMetrics() {
  restarts_ = env::get_int("DSTRAIN_ELASTIC_RESTARTS");
  if (const auto at = env::get("DSTRAIN_ELASTIC_LOST_AT")) lost_at_ = std::strtod(at->c_str(), nullptr);
}

void ElasticMetrics::add_to(StepRecord& r) {
  if (restarts_ <= 0) return;
  if (downtime_s_ < 0) {
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    downtime_s_ = lost_at_ > 0 ? now - lost_at_ : 0.0;
  }
  r.extra["elastic_restarts"] = restarts_;
  r.extra["elastic_downtime_s"] = downtime_s_;
}

}  // namespace ds::rt::train
