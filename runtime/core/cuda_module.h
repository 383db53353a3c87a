// The CUDA module: everything of dstrain that needs CUDA (the kernels and cuBLAS, the caching
// device allocator and pinned host memory, the device query, the NCCL backend) is built into one
// shared library, libdstrain_cuda.so, installed beside the executable. Nothing else links a CUDA
// library: `dstrain` starts without mapping libcudart, libcublas, libcublasLt or libnccl, and one
// build runs on machines with and without GPUs (and without the CUDA libraries at all).
//
// The module is loaded with dlopen the first time a CUDA device is asked for (a DeviceScope or an
// allocation on Device::kCuda, an NCCL group, `dstrain report`, the plan reading GPU memory), once
// per process, and never unloaded. It exports a few extern "C" entry points; each consumer asks
// for the one it needs through cuda_module_symbol and casts it to the type the module declares
// (core/cuda_memory_table.h, kernels/cuda_kernel_table.h, comm/nccl_comm.h), so no code outside
// the module references a CUDA symbol at link time (the link fails if one does).
//
// Where: $DSTRAIN_CUDA_MODULE when set, else libdstrain_cuda.so in the directory of the running
// executable (/proc/self/exe). The module must come from the same build: it exports its ABI
// number (kCudaModuleAbi) and a module of another number is refused by name.
//
// Failures are ds::Error (invalid usage, exit 2) naming what asked for CUDA and what is missing:
// a build without CUDA, the file not beside the executable, or a CUDA library the module needs
// (dlopen's message names it), each with a hint saying what to install or rebuild.
// Thread safety: every function may be called from any thread (the load happens once).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ds::rt {

// Bumped whenever an exported table or entry point changes shape.
inline constexpr int kCudaModuleAbi = 9;  // 9: streams and CUDA graphs in the memory table; 8: the loss slots and the batched sums of squares; 7: the block kernels' scratch; 6: ring attention's block kernels and merge; 5: the op list's typed tables
inline constexpr const char* kCudaModuleFile = "libdstrain_cuda.so";

// Whether this build produced the module (DSTRAIN_CUDA found nvcc and NCCL, or was ON).
bool cuda_module_built();
// The path the module is loaded from (see above); "" when /proc/self/exe cannot be read.
std::string cuda_module_path();
// Loads the module if needed and returns the address of the exported `symbol`. `purpose` says
// what asked for CUDA ("$.training.device \"cuda\"", "the nccl backend", ...) and starts the
// error message. Throws as described above.
void* cuda_module_symbol(const char* symbol, std::string_view purpose);
// Loads the module if needed; nullopt on success, else the error's text (for `dstrain report`).
std::optional<std::string> try_load_cuda_module();
// Whether this process has loaded the module (tests: a CPU job never does).
bool cuda_module_loaded();

}  // namespace ds::rt
