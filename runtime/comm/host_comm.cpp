// The communication thread and failure bookkeeping shared by the CPU backends. A synchronous
// call on an idle Comm runs on the caller's thread (saves the hand-off, a few tens of µs on a
// busy machine); otherwise operations queue and the thread runs them one at a time, in order.
#include "comm/host_comm.h"

#include <algorithm>

#include "comm/flight_recorder.h"
#include "common/check.h"
#include "common/rank_lines.h"
#include "common/progress.h"
#include "common/socket.h"
#include "store/store.h"

namespace ds::rt::comm {

namespace {
constexpr const char* kAbortKey = "comm_abort";
constexpr Millis kAbortPollInterval{250};
}  // namespace

bool HostWork::done() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void HostWork::wait(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (deadline.is_never()) {
    cv_.wait(lock, [&] { return done_; });
  } else if (!cv_.wait_until(lock, deadline.at(), [&] { return done_; })) {
    throw timeout_error("{}: still running when the wait's deadline passed (the operation's own "
                        "deadline still applies)",
                        what_);
  }
  if (error_) std::rethrow_exception(error_);
}

void HostWork::finish(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mu_);
  error_ = std::move(error);
  done_ = true;
  cv_.notify_all();
}

HostComm::HostComm(const BackendArgs& args, Backend backend)
    : Comm(args.store, args.abort_store, args.rank, args.size, args.options, backend, args.peers),
      peer_progress_(args.abort_store) {}

namespace {
std::vector<int> world_ranks_of(const std::vector<Comm::PeerInfo>& peers, const std::vector<int>& ranks) {
  std::vector<int> out;
  for (int q : ranks) out.push_back(peers[static_cast<size_t>(q)].world_rank);
  return out;
}
}  // namespace

void HostComm::note_waiting(const std::vector<int>& behind) {
  progress::bump();
  peer_progress_.poll(world_ranks_of(peers(), behind));
}

void HostComm::on_deadline(const Op& op, const std::vector<int>& behind, Clock::time_point since, Deadline& dl) {
  const auto world = world_ranks_of(peers(), behind);
  std::string who;
  for (int q : behind) who += (who.empty() ? "" : ", ") + describe_rank(q);
  if (!peer_progress_.all_have_beacons(world)) {
    throw Error(ErrorKind::kTimeout,
                fmt::format("{} timed out after {} waiting for {}", describe(op), net::format_seconds(op.timeout), who),
                "the rank named may be stuck or slow; its own log says why");
  }
  const auto stale = peer_progress_.stale(world, op.timeout);
  if (!stale.empty()) {
    const auto it = std::find(world.begin(), world.end(), stale.front());
    const int q = behind[static_cast<size_t>(it - world.begin())];
    const std::string what = fmt::format("made no progress for {} while world rank {} waited for it in {}",
                                         net::format_seconds(op.timeout),
                                         peers()[static_cast<size_t>(rank())].world_rank, describe(op));
    rank_lines::announce_hung({stale.front(), host_of(q), what});
    flight::note_hung_peer(stale.front(), what);
    throw Error(ErrorKind::kTimeout,
                fmt::format("{}: {} made no progress for {} while this rank waited for it (stopped, stuck in a "
                            "kernel, or its node is gone)",
                            describe(op), describe_rank(q), net::format_seconds(op.timeout)),
                "look at that rank's host and process; comm_timeout sets how long a rank may show no progress");
  }
  const auto waited = Clock::now() - since;
  if (waited >= kMaxSlowFactor * op.timeout) {
    throw Error(ErrorKind::kTimeout,
                fmt::format("{} waited {} for {}, which still make progress but never reached this collective",
                            describe(op),
                            net::format_seconds(std::chrono::duration_cast<Millis>(waited)), who),
                "every rank must issue the same collectives in the same order");
  }
  dl = Deadline::after(Millis(1000));  // slow, not hung: look again in a second
}

HostComm::~HostComm() { stop_thread(); }

void HostComm::stop_thread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

Error HostComm::broken_error(const Op& op) {
  std::lock_guard<std::mutex> lock(health_->mu);
  DS_CHECK(health_->first.has_value(), "broken_error on a healthy comm");
  return Error(health_->first->kind(),
               fmt::format("{}: the group is unusable after an earlier failure: {}", describe(op),
                           health_->first->what()),
               "the job has to restart; look for the first error above");
}

void HostComm::record_failure(const Error& e) {
  {
    std::lock_guard<std::mutex> lock(health_->mu);
    if (health_->first) return;
    health_->first = e;
  }
  try {
    on_failure(e.what());
  } catch (...) {
  }
  flight::dump_on_first_failure(e.what());
  try {
    if (abort_store()) {
      abort_store()->compare_set(kAbortKey, {}, store::to_bytes(e.what()));
    }
  } catch (...) {
    // The store may be what failed; the error itself still reaches this rank's caller.
  }
}

std::optional<std::string> HostComm::poll_abort_note(bool force) {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (abort_note_) return abort_note_;
  const auto now = Clock::now();
  if ((!force && now < next_abort_poll_) || !abort_store()) return std::nullopt;
  next_abort_poll_ = now + kAbortPollInterval;
  try {
    if (abort_store()->check({kAbortKey})) {
      abort_note_ = store::to_string(abort_store()->get(kAbortKey, Millis(5000)));
    }
  } catch (...) {
  }
  return abort_note_;
}

void HostComm::execute(const Op& op, HostWork& work) {
  {
    bool broken;
    {
      std::lock_guard<std::mutex> lock(health_->mu);
      broken = health_->first.has_value();
    }
    if (broken) {
      work.finish(std::make_exception_ptr(broken_error(op)));
      return;
    }
  }
  try {
    flight::started(op.flight_id);
    const auto t0 = Clock::now();
    run(op, Deadline::after(op.timeout));
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    busy_ns_[static_cast<size_t>(op.kind)].fetch_add(ns, std::memory_order_relaxed);
    flight::finished(op.flight_id);
    work.finish(nullptr);
  } catch (const Error& e) {
    flight::finished(op.flight_id, e.what());
    record_failure(e);
    work.finish(std::current_exception());
  } catch (const std::exception& e) {
    Error err(ErrorKind::kInternal, fmt::format("{}: {}", describe(op), e.what()));
    flight::finished(op.flight_id, err.what());
    record_failure(err);
    work.finish(std::make_exception_ptr(err));
  }
}

double HostComm::busy_seconds(OpKind k) const {
  return static_cast<double>(busy_ns_[static_cast<size_t>(k)].load(std::memory_order_relaxed)) * 1e-9;
}

WorkPtr HostComm::submit(Op op, bool async) {
  if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) {
    bool broken;
    {
      std::lock_guard<std::mutex> lock(health_->mu);
      broken = health_->first.has_value();
    }
    if (broken) {
      auto w = std::make_shared<HostWork>(describe(op));
      w->finish(std::make_exception_ptr(broken_error(op)));
      return w;
    }
    return post_p2p(op);
  }
  auto work = std::make_shared<HostWork>(describe(op));
  std::unique_lock<std::mutex> lock(mu_);
  if (!async && queue_.empty() && !busy_) {
    busy_ = true;
    lock.unlock();
    execute(op, *work);
    lock.lock();
    busy_ = false;
    cv_.notify_all();
    return work;
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  queue_.push_back(Task{std::move(op), work});
  cv_.notify_all();
  return work;
}

void HostComm::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return (!queue_.empty() && !busy_) || (stop_ && queue_.empty()); });
    if (queue_.empty()) return;  // stopping, and everything issued has run
    Task task = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    execute(task.op, *task.work);
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace ds::rt::comm
