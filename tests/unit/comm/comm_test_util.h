// Helpers for the comm tests: run one function per rank on N threads (each with its own Comm),
// and closed-form per-rank values (rank r contributes r + 1 + i % 7 at index i) in every dtype.
#pragma once

#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "common/half.h"
#include "comm/reduce.h"

namespace ds::rt::comm::testing {

inline void run_on_threads(const std::vector<CommPtr>& comms,
                           const std::function<void(Comm&)>& fn) {
  std::vector<std::exception_ptr> errors(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(*comms[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// Element i as a double, whatever the dtype (small integers are exact in every dtype).
inline double get(DataType t, const void* p, size_t i) {
  switch (t) {
    case DataType::kFloat32: return static_cast<const float*>(p)[i];
    case DataType::kBFloat16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DataType::kFloat16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DataType::kInt32: return static_cast<const int32_t*>(p)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DataType::kUInt8: return static_cast<const uint8_t*>(p)[i];
  }
  return 0;
}

inline void set(DataType t, void* p, size_t i, double v) {
  switch (t) {
    case DataType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case DataType::kBFloat16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(static_cast<float>(v));
      return;
    case DataType::kFloat16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(static_cast<float>(v));
      return;
    case DataType::kInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); return;
    case DataType::kInt64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); return;
    case DataType::kUInt8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); return;
  }
}

// Rank r's contribution at index i.
inline double value(int r, size_t i) { return r + 1 + static_cast<double>(i % 7); }

// A byte buffer holding n elements of t.
inline std::vector<uint8_t> buffer(DataType t, size_t n) {
  return std::vector<uint8_t>(n * dtype_size(t) + 1, 0xcd);
}

inline const std::vector<DataType>& all_dtypes() {
  static const std::vector<DataType> v = {DataType::kFloat32, DataType::kBFloat16,
                                          DataType::kFloat16, DataType::kInt32,
                                          DataType::kInt64,   DataType::kUInt8};
  return v;
}

}  // namespace ds::rt::comm::testing
