// The job's bookkeeping collectives, over the host world: the group of every rank on a host
// backend (shm or Gloo), which a training run keeps whatever device its model is on. A step's
// loss, gradient norm and overflow flag, the peaks every rank measured, the barriers that order
// a checkpoint's phases, and the gather of model parts to rank 0 for an export all go through
// here, so the trainer itself calls no collective.
//
// Contract: every member is collective over the world (every rank calls it, in the same order);
// each blocks until done, bounded by the world Comm's timeout, and throws the Comm's ds::Error
// naming the rank that failed or never came. A single process (no Comm) runs the same code with
// local results. Values are host memory. Thread safety: one thread drives it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "comm/comm.h"

namespace ds::rt::parallel {

class HostWorld {
 public:
  // `world`: the host group of every rank, or null for a single process.
  explicit HostWorld(comm::CommPtr world = nullptr);

  int rank() const { return world_ ? world_->rank() : 0; }
  int size() const { return world_ ? world_->size() : 1; }
  const comm::CommPtr& comm() const { return world_; }

  // Every rank's values added in rank order (the same bits on every rank).
  std::vector<double> sum_in_rank_order(const std::vector<double>& mine);
  // Every rank's values, rank-major.
  std::vector<int64_t> gather_int64(const std::vector<int64_t>& mine);
  void barrier();
  // This rank leaves because of `e` (not a collective's error): its peers learn it at once
  // (Comm::fail). Not collective; never throws.
  void fail(const Error& e) {
    if (world_) world_->fail(e);
  }

  // Rank 0 receives the values of every rank q for which contributes(q) holds (its own
  // included), in rank order, and calls consume(q, values) for each, then finish(); the other
  // contributing ranks send theirs. `contributes` must give the same answer on every rank. Every
  // rank returns after rank 0 has finished (a barrier ends it).
  void gather_to_root(std::span<const float> mine, const std::function<bool(int)>& contributes,
                      const std::function<void(int, std::span<const float>)>& consume,
                      const std::function<void()>& finish);
  // Three phases in order, each complete on every rank before the next starts: rank 0 runs
  // prepare(); every rank runs write(); rank 0 runs commit(). (A checkpoint: the directory, the
  // shards, the manifest.) An exception in a phase propagates on the rank that threw it.
  void in_phases(const std::function<void()>& prepare, const std::function<void()>& write,
                 const std::function<void()>& commit);

  // Collective: a second host world of the same ranks on a Comm group of its own, named `name`
  // (once per name), for another thread whose collectives must not share this world's order (the
  // async checkpoint writer). Its deadlines are the world's. A single process gets one without Comm.
  HostWorld twin(const std::string& name);

 private:
  comm::CommPtr world_;
};

}  // namespace ds::rt::parallel
