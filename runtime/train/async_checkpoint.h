// Asynchronous checkpoints (training.checkpoint_async): the step that checkpoints copies this
// rank's shard into a host staging buffer and goes on training while a background thread writes
// the shard file; rank 0 commits (manifest, `latest`, pruning) once every rank's write is done.
//
// The sequence of one checkpoint of step N:
//   training thread, every rank (save(), collective over the host world only through its
//   order: every rank calls it at the same step):
//     1. join the write in flight (at most one), timing the wait; its failure is raised here;
//     2. copy the shard's tensors (checkpointing.h's shard_tensors, the sync path's very list)
//        into the staging buffer; rank 0 captures the manifest as of step N and creates the
//        temporary directory <root>/.tmp-step_N;
//     3. start the writer thread.
//   writer thread, over the "checkpoint" host world (HostWorld::twin: a Comm group of every rank
//   made at start-up, used by this thread alone, so its collectives never interleave with the
//   training thread's):
//     4. barrier (rank 0's directory exists); write this rank's shard (fsynced, renamed);
//     5. gather every rank's outcome; rank 0 commits only when every shard is written;
//     6. gather rank 0's commit outcome, so every rank knows whether step N is `latest`.
// A crash anywhere before 5's commit leaves the previous checkpoint as `latest`; a failure
// (ENOSPC, RLIMIT_FSIZE, a dead peer) is kept and raised on the training thread of every rank at
// the next save() or flush(), naming the file and the step; the job then stops.
//
// Memory: the staging buffer is allocated once, here, tagged MemTag::kCheckpoint (pinned host
// memory, Device::kCudaHost, on a GPU run, counted as pinned); its size is what the plan's
// "checkpoint" tag predicts (lib/plan/memory_model.h).
// Thread safety: one thread (the training thread) calls the members; the writer thread touches
// only the staging buffer, the group and the job it was handed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "core/allocator.h"
#include "parallel/host_world.h"
#include "train/checkpointing.h"

namespace ds::rt::train {

class AsyncCheckpointer {
 public:
  // Collective over the host world (gathers the partition records, creates the "checkpoint"
  // group). Allocates the staging buffer on the host (pinned when `device` is kCuda).
  AsyncCheckpointer(CheckpointedRun& run, Allocator& alloc, Device device);
  // Waits for a write in flight (bounded by the group's deadlines); never throws.
  ~AsyncCheckpointer();
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;

  // Collective (every rank, same step): steps 1-3 above. Returns the milliseconds waited for the
  // previous write. Throws the previous write's failure (ds::Error naming the file and step).
  double save(CheckpointedRun& run, int64_t step);
  // Waits for the write in flight and throws its failure; returns the milliseconds waited. After
  // it, the last saved step is committed as `latest`. Collective only through its order.
  double flush();

  size_t staging_bytes() const { return staging_.bytes(); }

 private:
  struct Tensor {
    std::string name, dtype;
    int64_t n = 0;                 // elements
    size_t offset = 0, bytes = 0;  // in the staging buffer
  };
  void write(int64_t step, nlohmann::json manifest);  // the writer thread's body
  double join();                                      // waits; the milliseconds waited

  std::string root_;
  int keep_last_ = 0;
  int rank_ = 0;
  std::unique_ptr<parallel::HostWorld> group_;  // every rank, "checkpoint" (the writer's alone)
  std::vector<int64_t> records_;
  std::vector<Tensor> tensors_;
  Buffer staging_;
  std::thread writer_;
  // Set by the writer, read after join(): the failure of the last write ("" = none).
  std::string error_;
  ErrorKind error_kind_ = ErrorKind::kSystem;
  std::string error_hint_;
};

}  // namespace ds::rt::train
