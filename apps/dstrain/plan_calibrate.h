// `dstrain plan --calibrate` and `dstrain plan --recommend --measure`: the parts of the plan that
// run real work on this machine (the runtime's kernels, its backends, real launched jobs). The
// model they feed is lib/plan/step_time.h; the file format lib/plan/calibration.h.
#pragma once

#include <string>

#include "config/job_config.h"
#include "plan/memory_model.h"

namespace ds::cli {

struct CalibrateRequest {
  std::string config;    // "" = model_spec::kDefaultCalibrationShape, fp32
  std::string hostfile;  // "" = this node
  int nproc_per_node = 0;  // 0: the hostfile's, else 1
  std::string output;    // the calibration file (required)
  int threads = 0;       // CPU threads per rank (0: OMP_NUM_THREADS, else 1)
  config::ParseOptions parse;  // the plan's --set and --strict, passed to every rank
};
// Launches the ranks through `dstrain launch` (each runs run_calibration_worker), then checks
// and writes `output`. Prints a summary. Throws ds::Error on bad input or a failed run.
int run_calibrate(const CalibrateRequest& r);

// One launched rank of the calibration (hidden flag --calibrate-worker DIR): measures, and rank
// 0 writes DIR/calibration.json.
int run_calibration_worker(const std::string& config, const std::string& dir, const config::ParseOptions& parse);

struct MeasureRequest {
  std::string config;
  std::string hostfile;
  int world_size = 1;
  int threads = 1;
  int steps = 4;
  bool quiet = false;  // --json: progress lines go to stderr either way
  // The plan's --set and --strict: the sets are applied to the config's JSON before the layout's
  // keys replace theirs (so a layout key the user also set is the layout's), and --strict is
  // passed to each run's `dstrain train`.
  config::ParseOptions parse;
};
// Runs `layout` (the config with r.parse.sets applied, then the layout's keys replaced) for r.steps steps through
// `dstrain launch` and returns the fastest step's ms after the first (the least disturbed by other
// load); <= 0 when it failed (the failure is printed to stderr).
double measure_layout(const MeasureRequest& r, const plan::Layout& layout);

}  // namespace ds::cli
