// The NCCL backend (built into the CUDA module, core/cuda_module.h, and loaded with it on first
// use): make_world_comm / new_group with
// CommOptions::backend = Backend::kNccl (or DSTRAIN_COMM_BACKEND=nccl) return a Comm whose
// operations run on one CUDA stream of the rank's device. What differs from comm.h's contract:
//
// - Buffers are device pointers on this rank's device (CommOptions::cuda_device, else
//   LOCAL_RANK), which the constructor makes current on the calling thread.
// - Setup: rank 0 creates the NCCL unique id and publishes it under "nccl/id" in the group's
//   store; the others read it (bounded by the timeout); ncclCommInitRankConfig runs non-blocking
//   and is polled against the deadline, so a rank that never joins is a timeout, not a hang.
// - Ordering: before each operation the NCCL stream waits, on the device, for the work the
//   calling thread queued on its current CUDA stream (cuda::current_stream: the stream of an
//   open kern::DeviceScope, else the legacy default stream), so a collective never reads a
//   buffer the model is still writing. The other direction is the host's: Work::wait returns
//   once the collective finished, and only then does the caller queue kernels that use it.
// - Asynchronous calls enqueue on the stream and return a Work backed by a CUDA event; wait()
//   polls the event and ncclCommGetAsyncError. When the operation's deadline passes the
//   communicator is aborted (ncclCommAbort) and the error says so. NCCL cannot tell which rank
//   is missing, so these messages name the group and the operation, not the rank.
// - Synchronous calls wait for the stream, so the host may reuse the buffers afterwards.
// - send/recv ignore the tag: messages between two ranks match in issue order.
// - reduce_scatter_v and all_gather_v are grouped ncclReduce / ncclBroadcast calls (NCCL has no
//   per-rank-count collectives); the even variants are ncclReduceScatter / ncclAllGather.
// - Reductions of bf16/fp16 are NCCL's (accumulating in the storage type).
// - alloc_buffer returns device memory (cudaMalloc, zeroed), freed with the Comm.
//
// Deliberately not: CUDA-graph capture, several streams per Comm, or a CPU fallback.
#pragma once

#include "comm/comm.h"

#include "comm/host_comm.h"

// The module's entry point: a Comm over NCCL for the group BackendArgs describes.
extern "C" ds::rt::comm::CommPtr ds_cuda_make_nccl_comm(ds::rt::comm::BackendArgs args);
