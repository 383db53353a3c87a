// Loading the CUDA module (contract in cuda_module.h). The first caller dlopens the file with
// RTLD_NOW | RTLD_LOCAL, so a CUDA library the module needs is reported at once by dlopen (its
// message names the missing file) instead of at the first kernel; the handle is kept for the
// process' life. A failed load is remembered too: every later caller gets the same message.
#include "core/cuda_module.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <filesystem>
#include <mutex>

#include <fmt/format.h>

#include "common/env.h"
#include "common/error.h"

namespace ds::rt {

namespace {

struct ModuleState {
  std::once_flag once;
  std::atomic<void*> handle{nullptr};
  std::string error;  // why the load failed; "" when loaded
  std::string hint;
};

ModuleState& state() {
  static ModuleState s;
  return s;
}

std::string executable_dir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  buf[n] = '\0';
  return std::filesystem::path(buf).parent_path().string();
}

void load(ModuleState& s) {
  const std::string path = cuda_module_path();
  if (!cuda_module_built()) {
    s.error = "this dstrain was built without CUDA (DSTRAIN_CUDA=OFF, or nvcc or NCCL not found)";
    s.hint = "rebuild on a machine with the CUDA toolkit and NCCL (scripts/build.sh -DDSTRAIN_CUDA=ON), "
             "or use training.device \"cpu\"";
    return;
  }
  if (path.empty() || !std::filesystem::exists(path)) {
    s.error = fmt::format("the CUDA module {} is missing", path.empty() ? kCudaModuleFile : path);
    s.hint = fmt::format("install {} beside the dstrain executable (the build puts it in build/bin), or set "
                         "DSTRAIN_CUDA_MODULE to its path",
                         kCudaModuleFile);
    return;
  }
  dlerror();
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* why = dlerror();
    s.error = fmt::format("the CUDA module {} could not be loaded: {}", path, why ? why : "unknown error");
    s.hint = "install the CUDA runtime libraries it needs (libcudart, libcublas and libcublasLt of the CUDA "
             "toolkit, and NCCL's libnccl), or add their directory to LD_LIBRARY_PATH";
    return;
  }
  using AbiFn = int (*)();
  auto abi = reinterpret_cast<AbiFn>(dlsym(h, "ds_cuda_module_abi"));
  if (abi == nullptr || abi() != kCudaModuleAbi) {
    s.error = fmt::format("the CUDA module {} is from another dstrain build (ABI {}, this dstrain needs {})",
                          path, abi ? std::to_string(abi()) : std::string("unknown"), kCudaModuleAbi);
    s.hint = "install the module built with this dstrain (build/bin/libdstrain_cuda.so of the same build)";
    dlclose(h);
    return;
  }
  s.handle.store(h, std::memory_order_release);
}

ModuleState& loaded_state() {
  ModuleState& s = state();
  std::call_once(s.once, [&s] { load(s); });
  return s;
}

}  // namespace

bool cuda_module_built() {
#ifdef DSTRAIN_CUDA_MODULE_BUILT
  return true;
#else
  return false;
#endif
}

std::string cuda_module_path() {
  if (auto p = env::get("DSTRAIN_CUDA_MODULE"); p && !p->empty()) return *p;
  const std::string dir = executable_dir();
  if (dir.empty()) return "";
  return (std::filesystem::path(dir) / kCudaModuleFile).string();
}

void* cuda_module_symbol(const char* symbol, std::string_view purpose) {
  ModuleState& s = loaded_state();
  void* handle = s.handle.load(std::memory_order_acquire);
  if (handle == nullptr) {
    throw Error(ErrorKind::kInvalidUsage, fmt::format("{} needs CUDA, but {}", purpose, s.error), s.hint);
  }
  void* p = dlsym(handle, symbol);
  if (p == nullptr) {
    throw Error(ErrorKind::kInternal,
                fmt::format("{}: the CUDA module {} has no entry point {}", purpose, cuda_module_path(), symbol),
                "install the module built with this dstrain");
  }
  return p;
}

std::optional<std::string> try_load_cuda_module() {
  ModuleState& s = loaded_state();
  if (s.handle.load(std::memory_order_acquire) != nullptr) return std::nullopt;
  return s.error;
}

bool cuda_module_loaded() { return state().handle.load(std::memory_order_acquire) != nullptr; }

}  // namespace ds::rt
