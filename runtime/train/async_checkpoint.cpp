// Asynchronous checkpoints (async_checkpoint.h). The writer thread owns a host world of its own
// (HostWorld::twin, a Comm group over every rank) because collectives must be issued in one order
// per Comm: the training thread keeps issuing the steps' sums on the host world while the writer
// waits for its peers' shards. The outcome of every rank's write is gathered before rank 0
// commits, so `latest` never names a step one of whose shards is missing, and every rank learns a
// peer's failure from the same gather: every rank raises it at the same save() or flush(), and the
// job stops together.
#include "train/async_checkpoint.h"

#include <chrono>
#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/part_reader.h"
#include "checkpoint/shard_file.h"
#include "common/error.h"
#include "kernels/dispatch.h"

namespace ds::rt::train {

AsyncCheckpointer::AsyncCheckpointer(CheckpointedRun& run, Allocator& alloc, Device device)
    : root_(run.cfg.training.checkpoint_dir), keep_last_(run.cfg.training.keep_last),
      rank_(run.engine.host_world().rank()) {
  records_ = gather_partition_records(run);
  group_ = std::make_unique<parallel::HostWorld>(run.engine.host_world().twin("checkpoint"));
  // The tensors back to back, unpadded: exactly the bytes the plan counts.
  size_t at = 0;
  for (const ShardTensor& t : shard_tensors(run)) {
    tensors_.push_back({t.name, ckpt::shard_dtype_name(t.src.dtype), t.n, at, t.src.bytes(t.n)});
    at += tensors_.back().bytes;
  }
  staging_ = alloc.allocate(at, MemTag::kCheckpoint, "async checkpoint staging",
                            device == Device::kCuda ? Device::kCudaHost : Device::kCpu);
}

AsyncCheckpointer::~AsyncCheckpointer() {
  if (!writer_.joinable()) return;
  try {
    join();
  } catch (...) {
  }
}

double AsyncCheckpointer::join() {
  if (!writer_.joinable()) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  writer_.join();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double AsyncCheckpointer::flush() {
  const double waited = join();
  if (!error_.empty()) {
    // What `latest` names now: the last checkpoint every rank completed (none: the run has none).
    std::string latest;
    try {
      const auto dir = ckpt::latest_checkpoint(root_);
      latest = dir ? fmt::format("{} is still `latest`", *dir) : fmt::format("{} holds no checkpoint yet", root_);
    } catch (const Error& e) {
      latest = e.what();
    }
    throw Error(error_kind_, fmt::format("{}; {}", error_, latest),
                error_hint_.empty() ? "free space (or raise the limit) under " + root_ + " and resume with --resume"
                                    : error_hint_);
  }
  return waited;
}

double AsyncCheckpointer::save(CheckpointedRun& run, int64_t step) {
  const double waited = flush();
  // The shard as of this step, into the staging buffer (a device-to-host copy on a GPU).
  const auto tensors = shard_tensors(run);
  for (size_t i = 0; i < tensors.size(); ++i) {
    kern::copy_to_host(staging_.as<char>() + tensors_[i].offset, tensors[i].src.data, tensors_[i].bytes);
  }
  nlohmann::json manifest;
  if (rank_ == 0) {
    manifest = checkpoint_manifest(run, step, records_);
    ckpt::begin_checkpoint(root_, step);
  }
  writer_ = std::thread([this, step, m = std::move(manifest)]() mutable { write(step, std::move(m)); });
  return waited;
}

void AsyncCheckpointer::write(int64_t step, nlohmann::json manifest) {
  error_.clear();
  error_hint_.clear();
  auto fail = [&](ErrorKind kind, const std::string& what, const std::string& hint) {
    if (!error_.empty()) return;  // the first failure is the one to report
    error_kind_ = kind;
    error_ = fmt::format("async checkpoint of step {} failed: {}", step, what);
    error_hint_ = hint;
  };
  const std::string tmp = (std::filesystem::path(root_) / (".tmp-" + ckpt::step_dir_name(step))).string();
  try {
    group_->barrier();  // rank 0 created the temporary directory
    try {
      ckpt::ShardWriter w;
      for (const Tensor& t : tensors_) {
        w.add(t.name, t.dtype, {t.n}, staging_.as<char>() + t.offset, t.bytes);
      }
      w.write(tmp + "/" + ckpt::shard_file_name(rank_));
    } catch (const Error& e) {
      fail(e.kind(), e.what(), e.hint());
    } catch (const std::exception& e) {
      fail(ErrorKind::kSystem, e.what(), "");
    }
    // Every rank's outcome; rank 0 commits only when every shard is on disk.
    const auto written = group_->gather_int64({error_.empty() ? 0 : 1});
    int failed_rank = -1;
    for (size_t q = 0; q < written.size() && failed_rank < 0; ++q) {
      if (written[q] != 0) failed_rank = static_cast<int>(q);
    }
    if (failed_rank >= 0) {
      fail(ErrorKind::kRemote, fmt::format("rank {} could not write its shard {}/{} (its log names the cause)",
                                           failed_rank, tmp, ckpt::shard_file_name(failed_rank)),
           "");
    } else if (rank_ == 0) {
      try {
        const std::string dir = ckpt::commit_checkpoint(root_, step, manifest, keep_last_);
        spdlog::info("saved checkpoint {} (async)", dir);
      } catch (const Error& e) {
        fail(e.kind(), e.what(), e.hint());
      } catch (const std::exception& e) {
        fail(ErrorKind::kSystem, e.what(), "");
      }
    }
    // Rank 0's commit, so that every rank knows whether this step is `latest`.
    const auto committed = group_->gather_int64({rank_ == 0 && error_.empty() ? 1 : 0});
    if (committed[0] == 0 && error_.empty()) {
      fail(ErrorKind::kRemote, fmt::format("rank 0 could not commit {} (its log names the cause)", tmp), "");
    }
  } catch (const Error& e) {
    fail(e.kind(), e.what(), e.hint());
  } catch (const std::exception& e) {
    fail(ErrorKind::kInternal, e.what(), "");
  }
}

}  // namespace ds::rt::train
