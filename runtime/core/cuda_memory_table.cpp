// The module's memory table, looked up once (core/cuda_memory_table.h).
#include "core/cuda_memory_table.h"

#include <string>

#include "core/cuda_module.h"

namespace ds::rt {

const CudaMemoryTable& cuda_memory(std::string_view purpose) {
  using TableFn = decltype(&ds_cuda_memory_table);
  // A throwing initialiser leaves the static unset, so a failed load is reported to every caller
  // (the module is never unloaded, so the pointer stays valid).
  static const CudaMemoryTable* const table =
      reinterpret_cast<TableFn>(cuda_module_symbol("ds_cuda_memory_table", purpose))();
  return *table;
}

}  // namespace ds::rt
