// GlooComm: the CPU backend for ranks on several hosts. Gloo provides the TCP full mesh (pairs
// set up through our store, via GlooStoreAdapter) and tagged point-to-point transfers
// (UnboundBuffer); the collectives are our own ring algorithms on top (gloo_comm.cpp), so that
// every wait knows which peer it waits for and a failure names it.
//
// Deliberately not: Gloo's own collectives (their errors cannot name a rank, and Gloo has no
// per-rank-count reduce-scatter), nor a shared-memory path (ShmComm derives from this class and
// replaces the collectives when every rank is on one host; it keeps send/recv from here).
#pragma once

#include <atomic>
#include <condition_variable>
#include <list>
#include <optional>
#include <memory>
#include <mutex>
#include <thread>

#include "comm/host_comm.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

namespace ds::rt::comm {

class GlooComm : public HostComm, public std::enable_shared_from_this<GlooComm> {
 public:
  // Connects the full mesh (blocks until every rank did, or options.timeout).
  GlooComm(const BackendArgs& args, Backend backend = Backend::kGloo);
  ~GlooComm() override;

  using UB = std::unique_ptr<gloo::transport::UnboundBuffer>;
  enum class WaitResult { kDone, kDeadline, kAbortNote };

  // Waits for `buf`'s pending send or recv with `peer`. Returns kDeadline or kAbortNote when the
  // watcher interrupted the wait (the transfer stays posted); throws a remote_error naming the
  // peer when Gloo reports a broken connection.
  WaitResult wait_buf(gloo::transport::UnboundBuffer& buf, bool recv, int peer,
                      Deadline deadline, const Op& op);
  // The error for a wait that ended with `r` (kDeadline: timeout naming the peer; kAbortNote:
  // remote error quoting the note).
  Error wait_error(WaitResult r, int peer, const Op& op);
  // "died" when the peer is on this host and its process is gone, else "closed its connection".
  std::string peer_gone(int peer) const;
  // The error for a Gloo failure on the pair with `peer`: names the peer, and quotes the
  // job-wide abort note when another rank failed first (its exit closed the connection).
  Error peer_error(int peer, const Op& op, const std::string& gloo_error);
  void fail(const Error& e) { record_failure(e); }
  std::string describe_op(const Op& op) const { return describe(op); }

 protected:
  void run(const Op& op, Deadline deadline) override;
  WorkPtr post_p2p(const Op& op) override;
  UB make_ub(const void* p, size_t bytes);

 private:
  void ring_all_reduce(const Op& op, Deadline dl);
  void ring_reduce_scatter(const Op& op, Deadline dl);
  void ring_all_gather(const Op& op, Deadline dl);
  void one_to_all_broadcast(const Op& op, Deadline dl);
  void dissemination_barrier(const Op& op, Deadline dl);
  // One ring step: posts the recv and the send on a fresh slot, waits for both.
  void step(gloo::transport::UnboundBuffer* sbuf, size_t soff, size_t sn, int to,
            gloo::transport::UnboundBuffer* rbuf, size_t roff, size_t rn, int from,
            const Op& op, Deadline dl);
  void watch();

  std::shared_ptr<gloo::Context> ctx_;
  uint64_t next_slot_ = 1;  // collective slots, the same sequence on every rank
  std::vector<uint8_t> tmp_, acc_;

  struct ActiveWait {
    gloo::transport::UnboundBuffer* buf;
    bool recv;
    Deadline deadline;
    Clock::time_point since;
    int peer = 0;
    const Op* op = nullptr;
    std::atomic<int> reason{0};  // 0 running, 1 deadline (error below), 2 abort note
    std::optional<Error> error;  // why the deadline ended the wait (HostComm::on_deadline)
  };
  std::mutex wmu_;
  std::condition_variable wcv_;
  std::list<ActiveWait*> waits_;
  bool wstop_ = false;
  std::thread watcher_;
};

// True when process `pid` (same pid namespace) is gone or a zombie.
bool process_gone(int64_t pid);

}  // namespace ds::rt::comm
