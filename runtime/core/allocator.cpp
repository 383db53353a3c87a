// Tagged CPU allocator: posix_memalign + madvise(MADV_HUGEPAGE) for large blocks, zero-filled
// in parallel so every page is touched before the first step.
#include "core/allocator.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "common/progress.h"
#include "core/cuda_memory_table.h"

namespace ds::rt {

namespace {
constexpr size_t kAlign = 64;
constexpr size_t kHugePage = size_t{2} << 20;

// Zero-fill (= first touch) in parallel chunks: faulting pages is the slow part.
void touch(void* p, size_t bytes) {
  auto* c = static_cast<char*>(p);
  const int64_t chunk = 1 << 20;
  const int64_t n = static_cast<int64_t>((bytes + chunk - 1) / chunk);
#pragma omp parallel for schedule(static) if (n > 1)
  for (int64_t i = 0; i < n; i++) {
    const size_t off = static_cast<size_t>(i * chunk);
    std::memset(c + off, 0, std::min<size_t>(chunk, bytes - off));
    progress::bump();  // a long start-up touch is progress, not a hang
  }
}
}  // namespace

const char* mem_tag_name(MemTag t) {
  switch (t) {
    case MemTag::kParams: return "params";
    case MemTag::kGrads: return "grads";
    case MemTag::kOptimizer: return "optimizer";
    case MemTag::kActivations: return "activations";
    case MemTag::kComm: return "comm";
    case MemTag::kWorkspace: return "workspace";
    case MemTag::kCheckpoint: return "checkpoint";
  }
  return "?";
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = o.owner_;
    data_ = o.data_;
    bytes_ = o.bytes_;
    tag_ = o.tag_;
    device_ = o.device_;
    o.owner_ = nullptr;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void Buffer::reset() {
  if (data_ != nullptr && owner_ != nullptr) owner_->release(*this);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

Allocator& Allocator::process() {
  static Allocator a;
  return a;
}

Buffer Allocator::allocate(size_t bytes, MemTag tag, std::string_view name, Device device) {
  Buffer b;
  if (bytes == 0) return b;
  if (device != Device::kCpu) {
    const CudaMemoryTable& cuda = cuda_memory(
        fmt::format("allocating {} ({} bytes, tag {}) on {}", name, bytes, mem_tag_name(tag),
                    device == Device::kCuda ? "a CUDA device" : "pinned host memory"));
    void* dp = device == Device::kCuda ? cuda.device_alloc(bytes, name) : cuda.pinned_alloc(bytes, name);
    return account(dp, bytes, tag, device);
  }
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  const size_t align = rounded >= kHugePage ? kHugePage : kAlign;
  void* p = nullptr;
  const int rc = posix_memalign(&p, align, rounded);
  if (rc != 0 || p == nullptr) {
    throw system_error("allocating {} bytes for {} (tag {}): {}", bytes, name, mem_tag_name(tag),
                       errno_string(rc));
  }
  if (align == kHugePage) madvise(p, rounded, MADV_HUGEPAGE);  // a hint; failure is harmless
  touch(p, rounded);
  return account(p, bytes, tag, device);
}

Buffer Allocator::account(void* p, size_t bytes, MemTag tag, Device device) {
  Buffer b;
  b.owner_ = this;
  b.data_ = p;
  b.bytes_ = bytes;
  b.tag_ = tag;
  b.device_ = device;
  std::lock_guard<std::mutex> lock(mu_);
  if (device == Device::kCudaHost) {
    stats_.pinned_current += static_cast<int64_t>(bytes);
    stats_.pinned_peak = std::max(stats_.pinned_peak, stats_.pinned_current);
    return b;
  }
  const auto i = static_cast<size_t>(tag);
  stats_.current[i] += static_cast<int64_t>(bytes);
  stats_.peak[i] = std::max(stats_.peak[i], stats_.current[i]);
  stats_.current_total += static_cast<int64_t>(bytes);
  stats_.peak_total = std::max(stats_.peak_total, stats_.current_total);
  return b;
}

void Allocator::release(Buffer& b) {
  if (b.device_ == Device::kCuda) {
    cuda_memory().device_free(b.data_);  // loaded: the buffer came from it
  } else if (b.device_ == Device::kCudaHost) {
    cuda_memory().pinned_free(b.data_);
  } else {
    std::free(b.data_);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (b.device_ == Device::kCudaHost) {
    stats_.pinned_current -= static_cast<int64_t>(b.bytes_);
    return;
  }
  const auto i = static_cast<size_t>(b.tag_);
  stats_.current[i] -= static_cast<int64_t>(b.bytes_);
  stats_.current_total -= static_cast<int64_t>(b.bytes_);
}

MemStats Allocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}
int64_t Allocator::current(MemTag t) const { return stats().current[static_cast<size_t>(t)]; }
int64_t Allocator::peak(MemTag t) const { return stats().peak[static_cast<size_t>(t)]; }
int64_t Allocator::peak_total() const { return stats().peak_total; }

void Allocator::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak = stats_.current;
  stats_.peak_total = stats_.current_total;
  stats_.pinned_peak = stats_.pinned_current;
}

}  // namespace ds::rt
