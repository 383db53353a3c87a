// The collectives' element type (comm::DataType) of a typed buffer (core/typed_ptr.h), for the
// parallel engines that move the model's buffers: 16-bit storage travels as 16 bits.
#pragma once

#include "comm/comm.h"
#include "core/typed_ptr.h"

namespace ds::rt::parallel {

inline comm::DataType comm_dtype(DType t) {
  switch (t) {
    case DType::kF32: return comm::DataType::kFloat32;
    case DType::kBF16: return comm::DataType::kBFloat16;
    case DType::kF16: return comm::DataType::kFloat16;
  }
  return comm::DataType::kFloat32;
}

}  // namespace ds::rt::parallel
