// The one place a CUDA or cuBLAS failure becomes a ds::Error (see check.h).
#include "kernels/cuda/check.h"

#include "common/error.h"

namespace ds::rt::cuda {

void throw_cuda_error(const char* api, const char* call, const char* file, int line, int code,
                      const char* message) {
  throw Error(ErrorKind::kSystem,
              fmt::format("{} call `{}` failed at {}:{}: {} (code {})", api, call, file, line,
                          message != nullptr ? message : "?", code),
              "run `dstrain report` to see the GPUs, driver and CUDA runtime this process sees; "
              "CUDA_LAUNCH_BLOCKING=1 makes a kernel's error surface at its own launch");
}

}  // namespace ds::rt::cuda
