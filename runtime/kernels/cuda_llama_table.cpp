// The module's Llama kernel table, looked up once (kernels/cuda_llama_table.h).
#include "kernels/cuda_llama_table.h"

#include "core/cuda_module.h"

namespace ds::rt::kern {

const LlamaCudaKernels& llama_cuda_kernels(const char* purpose) {
  using TableFn = decltype(&ds_cuda_llama_kernel_table);
  // A throwing initialiser leaves the static unset: every caller sees a failed load.
  static const LlamaCudaKernels* const table =
      reinterpret_cast<TableFn>(cuda_module_symbol("ds_cuda_llama_kernel_table", purpose))();
  return *table;
}

}  // namespace ds::rt::kern
