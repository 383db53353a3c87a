// What an elastic restart (dstrain launch --nnodes MIN:MAX) adds to every metrics record of the
// run that follows it: `elastic_restarts` (how many times the job went on without lost nodes) and
// `elastic_downtime_s` (from the latest loss, as the launcher saw it, to the end of this run's
// first step: teardown, relaunch, start-up and the resume together). Nothing without a restart.
// Read from the launcher's DSTRAIN_ELASTIC_RESTARTS and DSTRAIN_ELASTIC_LOST_AT.
#pragma once

#include "train/metrics.h"

namespace ds::rt::train {

class ElasticMetrics {
 public:
  ElasticMetrics();
  // Adds the fields to `r` (the first call fixes the downtime).
  void add_to(StepRecord& r);

 private:
  int64_t restarts_ = 0;
  double lost_at_ = 0;  // Unix seconds
  double downtime_s_ = -1;
};

}  // namespace ds::rt::train
