// The command line's half of the micro-batch "auto": the memory and the calibration (auto_batch.h).
#include "auto_batch.h"

#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "common/strings.h"
#include "core/device.h"
#include "plan/auto_micro_batch.h"
#include "plan/calibration.h"
#include "plan/plan_inputs.h"

namespace ds::cli {

namespace {

plan::DeviceMemory auto_batch_memory(const config::JobConfig& cfg, const std::string& gpu_mem, int ranks_per_node) {
  if (!gpu_mem.empty() || cfg.training.device == "cuda") {
    plan::DeviceMemory d = plan::resolve_device_memory(gpu_mem, [] {
      std::vector<int64_t> sizes;
      for (const auto& g : rt::query_accelerators(rt::ModuleUse::kIfGpuPresent).gpus) {
        sizes.push_back(static_cast<int64_t>(g.total_bytes));
      }
      return sizes;
    });
    if (d.bytes <= 0) {
      throw Error(ErrorKind::kInvalidArgument,
                  fmt::format("{}: \"auto\" needs the memory of a GPU, and none was found",
                              cfg.auto_micro_batch.where_micro_batch),
                  "pass --gpu-mem SIZE (e.g. 80GiB), or --set train_micro_batch_size_per_gpu=N");
    }
    return d;
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const int ranks = std::max(1, ranks_per_node);
  plan::DeviceMemory d;
  d.bytes = static_cast<int64_t>(pages) * page / ranks;
  d.source = fmt::format("host memory {} / {} rank(s) on this node",
                         format_bytes(static_cast<double>(pages) * static_cast<double>(page)), ranks);
  return d;
}

}  // namespace

void add_auto_batch_flags(CLI::App* sub, AutoBatchFlags& f) {
  sub->add_option("--gpu-mem", f.gpu_mem,
                  "train_micro_batch_size_per_gpu \"auto\": the memory per rank the pick must fit, e.g. "
                  "80GiB (default: the smallest GPU found on a cuda run, host memory / ranks on this node "
                  "on a CPU run)");
  sub->add_option("--calibration", f.calibration,
                  "train_micro_batch_size_per_gpu \"auto\": pick the fastest micro-batch by this machine's "
                  "step-time model (dstrain plan --calibrate's file; default: the largest that fits)");
}

void resolve_auto_batch(config::JobConfig& cfg, const AutoBatchFlags& f, int ranks_per_node, int threads) {
  if (!cfg.auto_micro_batch.pending) return;
  const plan::DeviceMemory mem = auto_batch_memory(cfg, f.gpu_mem, ranks_per_node);
  plan::AutoMicroBatchRequest req;
  req.memory_bytes = mem.bytes;
  req.memory_source = mem.source;
  req.threads = threads;
  plan::Calibration cal;
  if (!f.calibration.empty()) {
    cal = plan::read_calibration(f.calibration).cal;
    if (ranks_per_node > 0) cal.ranks_per_node = ranks_per_node;  // the machine at hand, as plan --recommend
    req.calibration = &cal;
  }
  plan::resolve_auto_micro_batch(cfg, req);
}

}  // namespace ds::cli
