// NcclComm: Comm over NCCL on one CUDA stream (contract in nccl_comm.h). Every NCCL call runs in
// non-blocking mode (ncclConfig_t::blocking = 0), so no call can hang past its deadline: a call
// that returns ncclInProgress is polled with ncclCommGetAsyncError, and a deadline that passes
// aborts the communicator.
#include "comm/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/host_comm.h"
#include "common/check.h"
#include "kernels/cuda/kernels.h"
#include "common/env.h"
#include "common/socket.h"
#include "store/store.h"

namespace ds::rt::comm {

namespace {

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kUInt8: return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

void cuda_check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw system_error("{}: CUDA error {}", what, cudaGetErrorString(e));
}

// What a Work and the Comm share: the communicator (aborted at most once) and the first error.
struct NcclState {
  std::mutex mu;
  ncclComm_t comm = nullptr;
  bool aborted = false;
  std::shared_ptr<Health> health = std::make_shared<Health>();

  void abort() {
    std::lock_guard<std::mutex> lock(mu);
    if (!aborted && comm != nullptr) {
      ncclCommAbort(comm);
      aborted = true;
    }
  }
  void fail(const Error& e) {
    std::lock_guard<std::mutex> lock(health->mu);
    if (!health->first) health->first = e;
  }
};

// Polls until an in-progress NCCL call settles, or the deadline passes (then aborts).
void settle(NcclState& st, ncclResult_t r, Deadline dl, const std::string& what, Millis timeout) {
  while (r == ncclInProgress) {
    if (dl.expired()) {
      st.abort();
      throw Error(ErrorKind::kTimeout,
                  fmt::format("{} timed out after {}; the NCCL communicator was aborted (NCCL "
                              "does not say which rank is missing)",
                              what, net::format_seconds(timeout)),
                  "look for the rank that failed or never got there in the other ranks' logs");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    ncclCommGetAsyncError(st.comm, &r);
  }
  if (r != ncclSuccess) {
    throw remote_error("{}: NCCL error {} ({})", what, ncclGetErrorString(r),
                       ncclGetLastError(st.comm));
  }
}

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<NcclState> st, cudaEvent_t ev, Deadline dl, std::string what,
           Millis timeout)
      : st_(std::move(st)), ev_(ev), dl_(dl), what_(std::move(what)), timeout_(timeout) {}
  ~NcclWork() override {
    if (ev_ != nullptr) cudaEventDestroy(ev_);
  }

  bool done() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_ || cudaEventQuery(ev_) != cudaErrorNotReady;
  }

  void wait(Deadline deadline) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      try {
        for (;;) {
          const cudaError_t q = cudaEventQuery(ev_);
          if (q == cudaSuccess) break;
          if (q != cudaErrorNotReady) cuda_check(q, what_);
          ncclResult_t r = ncclSuccess;
          ncclCommGetAsyncError(st_->comm, &r);
          if (r != ncclSuccess && r != ncclInProgress) settle(*st_, r, dl_, what_, timeout_);
          if (dl_.expired()) settle(*st_, ncclInProgress, dl_, what_, timeout_);
          if (deadline.expired()) {
            throw timeout_error("{}: still running when the wait's deadline passed (the "
                                "operation's own deadline still applies)",
                                what_);
          }
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
      } catch (const Error& e) {
        if (e.kind() == ErrorKind::kTimeout && !dl_.expired()) throw;  // only the wait's deadline
        st_->fail(e);
        error_ = std::current_exception();
      }
      done_ = true;
    }
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex mu_;
  std::shared_ptr<NcclState> st_;
  cudaEvent_t ev_;
  Deadline dl_;
  std::string what_;
  Millis timeout_;
  bool done_ = false;
  std::exception_ptr error_;
};

class NcclComm : public Comm {
 public:
  explicit NcclComm(const BackendArgs& a)
      : Comm(a.store, a.abort_store, a.rank, a.size, a.options, Backend::kNccl, a.peers) {
    device_ = a.options.cuda_device >= 0 ? a.options.cuda_device
                                         : static_cast<int>(env::get_int("LOCAL_RANK"));
    const std::string where = fmt::format("group '{}' (rank {} of {}, cuda device {})", name(),
                                          rank(), size(), device_);
    cuda_check(cudaSetDevice(device_), where + ": cudaSetDevice");
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
               where + ": cudaStreamCreate");
    cuda_check(cudaMalloc(&scratch_, sizeof(int32_t)), where + ": cudaMalloc");
    const Deadline dl = Deadline::after(a.options.timeout);
    ncclUniqueId id;
    if (rank() == 0) {
      settle(*st_, ncclGetUniqueId(&id), dl, where + ": ncclGetUniqueId", a.options.timeout);
      store::Bytes b(sizeof(id));
      std::memcpy(b.data(), &id, sizeof(id));
      store()->set("nccl/id", b);
    } else {
      store::Bytes b = store()->get("nccl/id", Millis(std::max(1, dl.remaining_ms())));
      if (b.size() != sizeof(id)) {
        throw remote_error("{}: the NCCL id in the store has {} bytes, expected {}", where,
                           b.size(), sizeof(id));
      }
      std::memcpy(&id, b.data(), sizeof(id));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&st_->comm, size(), id, rank(), &config);
    if (r == ncclInProgress || r == ncclSuccess) {
      if (r == ncclInProgress) ncclCommGetAsyncError(st_->comm, &r);
      settle(*st_, r, dl, where + ": ncclCommInitRankConfig (waiting for every rank to join)",
             a.options.timeout);
    } else {
      throw remote_error("{}: ncclCommInitRankConfig failed: {}", where, ncclGetErrorString(r));
    }
  }

  ~NcclComm() override {
    if (st_->comm != nullptr) {
      if (!st_->aborted) {
        cudaStreamSynchronize(stream_);
        ncclCommDestroy(st_->comm);
      }
    }
    for (void* p : buffers_) cudaFree(p);
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

 protected:
  WorkPtr submit(Op op, bool async) override {
    const std::string what = describe(op);
    {
      std::lock_guard<std::mutex> lock(st_->health->mu);
      if (st_->health->first) {
        throw Error(st_->health->first->kind(),
                    fmt::format("{}: the group is unusable after an earlier failure: {}", what,
                                st_->health->first->what()));
      }
    }
    const Deadline dl = Deadline::after(op.timeout);
    try {
      cuda_check(cudaSetDevice(device_), what + ": cudaSetDevice");
      order_after_producer(what);
      enqueue(op, dl, what);
      cudaEvent_t ev = nullptr;
      cuda_check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), what + ": event");
      cuda_check(cudaEventRecord(ev, stream_), what + ": event record");
      auto work = std::make_shared<NcclWork>(st_, ev, dl, what, op.timeout);
      if (!async) work->wait(Deadline::never());
      return work;
    } catch (const Error& e) {
      st_->fail(e);
      throw;
    }
  }

  // Device memory on this rank's device (NCCL needs no registration; ncclMemAlloc would be the
  // place for NVLS/user-buffer registration later).
  void* allocate_registered(size_t bytes, Millis) override {
    cuda_check(cudaSetDevice(device_), fmt::format("alloc_buffer on group '{}'", name()));
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes), fmt::format("alloc_buffer on group '{}': cudaMalloc of {} "
                                                  "bytes", name(), bytes));
    cuda_check(cudaMemset(p, 0, bytes), fmt::format("alloc_buffer on group '{}'", name()));
    std::lock_guard<std::mutex> lock(st_->mu);
    buffers_.push_back(p);
    return p;
  }

 private:
  // The communication stream waits (on the device, not the host) for everything the calling
  // thread queued on its current CUDA stream (cuda::current_stream; the model's): the buffers
  // this operation reads are written by kernels that may not have run yet, and the buffers it
  // writes may still be read by them.
  void order_after_producer(const std::string& what) {
    auto producer = static_cast<cudaStream_t>(cuda::current_stream());
    cudaEvent_t ready = nullptr;
    cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), what + ": event");
    const cudaError_t rec = cudaEventRecord(ready, producer);
    const cudaError_t wait = rec == cudaSuccess ? cudaStreamWaitEvent(stream_, ready, 0) : rec;
    cudaEventDestroy(ready);  // released by CUDA once the wait is satisfied
    cuda_check(wait, what + ": ordering after the compute stream");
  }

  void enqueue(const Op& op, Deadline dl, const std::string& what) {
    const ncclDataType_t t = nccl_type(op.dtype);
    const size_t es = dtype_size(op.dtype);
    ncclComm_t c = st_->comm;
    auto call = [&](ncclResult_t r) { settle(*st_, r, dl, what, op.timeout); };
    switch (op.kind) {
      case OpKind::kAllReduce:
        return call(ncclAllReduce(op.out, op.out, op.count, t, nccl_op(op.reduce), c, stream_));
      case OpKind::kBroadcast:
        return call(ncclBroadcast(op.out, op.out, op.count, t, op.peer, c, stream_));
      case OpKind::kSend: return call(ncclSend(op.in, op.count, t, op.peer, c, stream_));
      case OpKind::kRecv: return call(ncclRecv(op.out, op.count, t, op.peer, c, stream_));
      case OpKind::kBarrier:
        return call(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, c, stream_));
      case OpKind::kAllToAll: {
        const auto* in = static_cast<const uint8_t*>(op.in);
        auto* out = static_cast<uint8_t*>(op.out);
        size_t so = 0, ro = 0;
        call(ncclGroupStart());
        for (int q = 0; q < size(); ++q) {
          const size_t s = op.counts[static_cast<size_t>(q)], r = op.recv_counts[static_cast<size_t>(q)];
          if (s > 0) call(ncclSend(in + so * es, s, t, q, c, stream_));
          if (r > 0) call(ncclRecv(out + ro * es, r, t, q, c, stream_));
          so += s;
          ro += r;
        }
        return call(ncclGroupEnd());
      }
      case OpKind::kReduceScatter:
      case OpKind::kAllGather: break;
    }
    const bool even = std::all_of(op.counts.begin(), op.counts.end(),
                                  [&](size_t x) { return x == op.counts[0]; });
    const auto* in = static_cast<const uint8_t*>(op.in);
    auto* out = static_cast<uint8_t*>(op.out);
    const std::vector<size_t> off = count_layout(op.counts).offsets;
    if (op.kind == OpKind::kReduceScatter) {
      if (even) {
        return call(ncclReduceScatter(in, out, op.counts[0], t, nccl_op(op.reduce), c, stream_));
      }
      call(ncclGroupStart());
      for (int q = 0; q < size(); ++q) {
        const size_t n = op.counts[static_cast<size_t>(q)];
        call(ncclReduce(in + off[static_cast<size_t>(q)] * es, out, n, t, nccl_op(op.reduce), q,
                        c, stream_));
      }
      return call(ncclGroupEnd());
    }
    if (even) return call(ncclAllGather(in, out, op.counts[0], t, c, stream_));
    call(ncclGroupStart());
    for (int q = 0; q < size(); ++q) {
      const size_t n = op.counts[static_cast<size_t>(q)];
      uint8_t* dst = out + off[static_cast<size_t>(q)] * es;
      const void* src = q == rank() ? static_cast<const void*>(in) : dst;
      call(ncclBroadcast(src, dst, n, t, q, c, stream_));
    }
    call(ncclGroupEnd());
  }

  std::shared_ptr<NcclState> st_ = std::make_shared<NcclState>();
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  std::vector<void*> buffers_;
};

}  // namespace

}  // namespace ds::rt::comm

extern "C" __attribute__((visibility("default"))) ds::rt::comm::CommPtr ds_cuda_make_nccl_comm(
    ds::rt::comm::BackendArgs args) {
  return std::make_shared<ds::rt::comm::NcclComm>(args);
}
