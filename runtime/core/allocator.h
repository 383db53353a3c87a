// The tagged allocator: every buffer of the data plane comes from here, with a tag saying what it
// holds, so the runtime reports its real current and peak bytes per tag (and the planner is held
// to them).
//
// Contract:
// - Buffers are 64-byte aligned, zero-filled and already touched when allocate() returns (first
//   touch costs ~11 us per 4 KiB page on our machines: pay it at start-up, never per step).
//   Large buffers ask for transparent huge pages. Allocate once, reuse across steps.
// - Buffer is a move-only owner; destroying it returns the memory and lowers the tag's current.
//   A Buffer must not outlive its Allocator.
// - Thread safety: allocate/release and the statistics may be called from any thread.
// - Device: kCpu here; kCuda (device memory on the current device, through the caching allocator
//   of kernels/cuda/memory.h) and kCudaHost (pinned host memory) through the CUDA module, loaded
//   on the first such allocation (core/cuda_module.h); without the module they throw its error. Bytes of kCpu and kCuda buffers are counted per tag;
//   pinned host buffers (kCudaHost: what a GPU run offloads to the host) are counted apart, as
//   MemStats::pinned_*, so the per-tag figures of a GPU run stay the GPU's.
// - Failure: out of memory throws ds::Error (system) naming the tag, the name and the size.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

namespace ds::rt {

// kCheckpoint: an async checkpoint's host staging buffer (train/async_checkpoint.h).
enum class MemTag { kParams, kGrads, kOptimizer, kActivations, kComm, kWorkspace, kCheckpoint };
inline constexpr int kNumMemTags = 7;
const char* mem_tag_name(MemTag t);  // "params", "grads", "optimizer", "activations", ..., "checkpoint"

enum class Device { kCpu, kCuda, kCudaHost };  // kCudaHost: pinned (page-locked) host memory

class Allocator;

class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }
  MemTag tag() const { return tag_; }
  Device device() const { return device_; }
  bool empty() const { return data_ == nullptr; }
  void reset();  // frees now

 private:
  friend class Allocator;
  Allocator* owner_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemTag tag_ = MemTag::kWorkspace;
  Device device_ = Device::kCpu;
};

struct MemStats {
  std::array<int64_t, kNumMemTags> current{};
  std::array<int64_t, kNumMemTags> peak{};
  int64_t current_total = 0;
  int64_t peak_total = 0;  // peak of the sum (not the sum of the peaks)
  // Pinned host memory (Device::kCudaHost), whatever its tag; not in the figures above.
  int64_t pinned_current = 0;
  int64_t pinned_peak = 0;
};

class Allocator {
 public:
  Allocator() = default;
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;
  ~Allocator() = default;

  // The process's allocator (what the trainer reports); tests may make their own.
  static Allocator& process();

  // `name` is for error messages only. bytes == 0 gives an empty Buffer.
  Buffer allocate(size_t bytes, MemTag tag, std::string_view name, Device device = Device::kCpu);

  MemStats stats() const;
  int64_t current(MemTag t) const;
  int64_t peak(MemTag t) const;
  int64_t peak_total() const;
  // Peaks restart from the current values (e.g. after start-up, to measure a step).
  void reset_peaks();

 private:
  friend class Buffer;
  void release(Buffer& b);
  Buffer account(void* p, size_t bytes, MemTag tag, Device device);  // counts p, wraps it
  mutable std::mutex mu_;
  MemStats stats_;
};

}  // namespace ds::rt
