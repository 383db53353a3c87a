// A pointer that knows its element type: how the model, the parallel engines and the optimizer
// pass buffers whose storage type is chosen at run time (fp32, or bf16/fp16 with mixed
// precision, core/dtype.h). The kernels are templates over the storage type; the typed dispatch
// (kernels/typed.h) switches on the dtype once per call and hands them typed pointers.
//
// Arithmetic is in elements of the pointer's type. A TypedPtr converts implicitly from float*
// (fp32 code reads as before); as<T>() checks the type. Constness is not tracked: a TypedPtr
// given to a function as an input is only read, as its contract says.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/check.h"
#include "core/dtype.h"

namespace ds::rt {

struct TypedPtr {
  void* data = nullptr;
  DType dtype = DType::kF32;

  TypedPtr() = default;
  TypedPtr(std::nullptr_t) {}
  TypedPtr(float* p) : data(p) {}  // NOLINT: fp32 buffers read as before
  TypedPtr(const float* p) : data(const_cast<float*>(p)) {}  // NOLINT
  TypedPtr(void* p, DType t) : data(p), dtype(t) {}

  explicit operator bool() const { return data != nullptr; }
  size_t element_size() const { return dtype_size(dtype); }
  size_t bytes(int64_t n) const { return static_cast<size_t>(n) * element_size(); }
  TypedPtr operator+(int64_t n) const {
    return data ? TypedPtr(static_cast<char*>(data) + n * static_cast<int64_t>(element_size()), dtype) : TypedPtr();
  }
  TypedPtr& operator+=(int64_t n) { return *this = *this + n; }
  bool operator==(const TypedPtr& o) const { return data == o.data; }

  // The fp32 view; the dtype must be fp32 (a broken invariant otherwise).
  float* f32() const {
    DS_CHECK(dtype == DType::kF32 || data == nullptr, "a {} buffer read as fp32", dtype_name(dtype));
    return static_cast<float*>(data);
  }
};

}  // namespace ds::rt
