// CUDA and NCCL facts for `dstrain report` and the launcher's default slot count. Never throws:
// a machine with the toolkit but no driver or GPU answers with an empty list and a reason.
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "core/device.h"

namespace ds::rt {

namespace {
std::string version_string(int v) {
  // CUDA encodes 1000 * major + 10 * minor.
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}
}  // namespace

AcceleratorInfo cuda_query_accelerators() {
  AcceleratorInfo info;
  info.cuda_compiled = true;
  int rt = 0;
  if (cudaRuntimeGetVersion(&rt) == cudaSuccess) info.cuda_runtime = version_string(rt);
  int drv = 0;
  if (cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0) info.cuda_driver = version_string(drv);
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess) {
    // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
    info.nccl_version = std::to_string(nccl / 10000) + "." + std::to_string((nccl % 10000) / 100) +
                        "." + std::to_string(nccl % 100);
  }
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    info.status = std::string("no GPU visible: ") + cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky error
    return info;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    GpuInfo g;
    g.index = i;
    g.name = prop.name;
    g.total_bytes = prop.totalGlobalMem;
    g.sm_major = prop.major;
    g.sm_minor = prop.minor;
    info.gpus.push_back(g);
  }
  if (info.gpus.empty()) info.status = "CUDA sees no GPU";
  return info;
}

}  // namespace ds::rt
