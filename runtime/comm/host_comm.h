// HostComm: what the CPU backends (gloo, shm) share: the communication thread that runs
// collectives in issue order, the Work handle for host operations, the "broken after the first
// failure" state, and the job-wide abort note that lets one rank's diagnosis ("rank 3 died")
// reach ranks that are only waiting on a survivor.
//
// Deliberately not: public. Callers see comm.h only; backends derive from HostComm.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "comm/beacon.h"
#include "comm/comm.h"
#include "common/error.h"

namespace ds::rt::comm {

// Backend constructors (each does its own rendezvous through `store`; see comm.cpp).
struct BackendArgs {
  std::shared_ptr<store::Store> store;        // this group's key space
  std::shared_ptr<store::Store> abort_store;  // the world's key space (job-wide abort note)
  int rank = 0;
  int size = 1;
  CommOptions options;
  std::vector<Comm::PeerInfo> peers;
  bool all_local = false;
};

// A Work whose completion is set by whoever ran the operation.
class HostWork : public Work {
 public:
  explicit HostWork(std::string what) : what_(std::move(what)) {}
  bool done() override;
  void wait(Deadline deadline) override;
  void finish(std::exception_ptr error);  // null: success

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::string what_;  // "all_reduce on group 'dp' (rank 0 of 4)"
};

// The first failure of a Comm, shared with the Works that outlive it.
struct Health {
  std::mutex mu;
  std::optional<Error> first;
};

class HostComm : public Comm {
 public:
  void fail(const Error& e) override { record_failure(e); }
  double busy_seconds(OpKind k) const override;

 protected:
  HostComm(const BackendArgs& args, Backend backend);
  ~HostComm() override;

  // Collectives and barrier (never send/recv), on the communication thread or inline. Throws
  // ds::Error; the caller records it as this Comm's failure.
  virtual void run(const Op& op, Deadline deadline) = 0;
  // send/recv: post the transfer now and return a Work that completes with it. The Work must
  // call record_failure() when it fails.
  virtual WorkPtr post_p2p(const Op& op) = 0;

  // Derived destructors call this first: waits for queued operations, stops the thread.
  void stop_thread();

  // Records `e` as this Comm's first failure (idempotent) and publishes a note under the
  // job-wide "comm_abort" key so that peers blocked on a live rank learn the cause.
  void record_failure(const Error& e);
  // The job-wide abort note, if some rank published one. Polls the store at most every
  // 250 ms per Comm (cheap enough to call from a wait loop); never blocks long.
  // `force`: ask the store now (after a connection loss, to tell cause from consequence).
  std::optional<std::string> poll_abort_note(bool force = false);
  // Called once when this Comm fails (shm publishes its state to the peers).
  virtual void on_failure(const std::string& message) {}

  // Hung ranks (comm/beacon.h). From a wait loop for `behind` (ranks of this group): this process
  // is alive and waiting (its progress moves) and the awaited ranks' beacons are read (at most
  // once a second). Cheap.
  void note_waiting(const std::vector<int>& behind);
  // The wait for `behind` passed its deadline `dl` (the operation began at `since`): throws the
  // hung-rank error naming a rank whose beacon stopped for the timeout, or the plain timeout error
  // when the ranks publish no beacon; when every awaited rank still makes progress (slow, not
  // hung) it moves `dl` on and returns, up to kMaxSlowFactor x the timeout.
  void on_deadline(const Op& op, const std::vector<int>& behind, Clock::time_point since, Deadline& dl);

  // The error for an operation issued after the Comm broke.
  Error broken_error(const Op& op);
  const std::shared_ptr<Health>& health() const { return health_; }

 private:
  struct Task {
    Op op;
    std::shared_ptr<HostWork> work;
  };
  WorkPtr submit(Op op, bool async) override;
  void execute(const Op& op, HostWork& work);
  void loop();

  std::shared_ptr<Health> health_ = std::make_shared<Health>();
  // Nanoseconds spent in run() per OpKind (busy_seconds); send/recv are posted, not run here.
  static constexpr int kOpKinds = static_cast<int>(OpKind::kAllToAll) + 1;  // kAllToAll is the last
  std::array<std::atomic<int64_t>, kOpKinds> busy_ns_{};

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;

  std::mutex abort_mu_;
  Clock::time_point next_abort_poll_{};
  std::optional<std::string> abort_note_;
  PeerProgress peer_progress_;
};

CommPtr make_gloo_comm(BackendArgs args);
CommPtr make_shm_comm(BackendArgs args);

}  // namespace ds::rt::comm
