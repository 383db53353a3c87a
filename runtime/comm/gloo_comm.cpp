// Ring collectives over Gloo's TCP pairs.
//
// all_reduce: the buffer is cut into super-chunks of at most size x 4 MiB; each runs the classic
// ring: N-1 reduce-scatter steps (at step s rank r sends segment r-1-s to its right neighbour,
// receives segment r-2-s from its left one and reduces it into place), after which rank r owns
// the fully reduced segment r; then N-1 all-gather steps pass the finished segments around. Each
// rank sends 2(N-1)/N of the data, the minimum, and every element is reduced once by its owner,
// so all ranks end with the same bits. Bounded super-chunks keep the scratch at 4 MiB.
// reduce_scatter: the first half of that ring on per-rank segments (pieces of 4 MiB), with the
// partial sums in a scratch buffer so the input stays untouched. all_gather: the second half,
// straight into the output. broadcast: the root sends to every rank. barrier: dissemination
// (log2 N rounds of one-byte messages).
//
// Every wait goes through wait_buf(), which a watcher thread can interrupt when the deadline
// passes or another rank published an abort note; Gloo's own timeouts are not used (they poison
// the whole context without saying which peer was late).
#include "comm/gloo_comm.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "comm/reduce.h"
#include "common/check.h"
#include "common/socket.h"
#include "store/gloo_store_adapter.h"
#include "store/prefix_store.h"

namespace ds::rt::comm {

namespace {

constexpr size_t kPieceBytes = size_t{4} << 20;
constexpr uint64_t kP2pSlotBit = uint64_t{1} << 63;
// Gloo waits are interrupted by our watcher, never by Gloo's clock.
constexpr Millis kForever{Millis(24LL * 3600 * 1000 * 365)};

std::shared_ptr<gloo::transport::Device> device_for(const std::string& host) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<gloo::transport::Device>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[host];
  if (auto d = slot.lock()) return d;
  gloo::transport::tcp::attr attr;
  attr.hostname = host;
  auto d = gloo::transport::tcp::CreateDevice(attr);
  slot = d;
  return d;
}

std::string this_hostname() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "localhost";
  return host;
}

int mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace

bool process_gone(int64_t pid) {
  if (pid <= 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) == -1 && errno == ESRCH) return true;
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string stat;
  if (!std::getline(f, stat)) return false;
  auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  const char state = stat[close + 2];
  return state == 'Z' || state == 'X';
}

GlooComm::GlooComm(const BackendArgs& args, Backend backend) : HostComm(args, backend) {
  std::string host = args.options.gloo_hostname;
  if (host.empty()) host = args.all_local ? "127.0.0.1" : this_hostname();
  try {
    auto dev = device_for(host);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank(), size());
    ctx->setTimeout(args.options.timeout);
    if (size() > 1) {
      store::PrefixStore scoped("gloo/", store());
      scoped.set_default_timeout(args.options.timeout);
      store::GlooStoreAdapter adapter(scoped);
      ctx->connectFullMesh(adapter, dev);
    }
    ctx_ = ctx;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw remote_error("group '{}' (rank {} of {}): connecting the Gloo TCP mesh from {} failed: {}",
                       name(), rank(), size(), host, e.what());
  }
  watcher_ = std::thread([this] { watch(); });
}

GlooComm::~GlooComm() {
  stop_thread();
  {
    std::lock_guard<std::mutex> lock(wmu_);
    wstop_ = true;
    wcv_.notify_all();
  }
  if (watcher_.joinable()) watcher_.join();
}

GlooComm::UB GlooComm::make_ub(const void* p, size_t bytes) {
  static uint8_t dummy;
  void* ptr = p ? const_cast<void*>(p) : &dummy;
  return ctx_->createUnboundBuffer(ptr, bytes);
}

void GlooComm::watch() {
  std::unique_lock<std::mutex> lock(wmu_);
  while (!wstop_) {
    if (waits_.empty()) {
      wcv_.wait(lock);
      continue;
    }
    wcv_.wait_for(lock, Millis(20));
    const auto now = Clock::now();
    bool poll = false;
    for (ActiveWait* w : waits_) {
      if (w->reason.load() != 0) continue;
      if (now - w->since > Millis(1000)) note_waiting({w->peer});  // alive, waiting; read its beacon
      if (w->deadline.expired()) {
        try {
          on_deadline(*w->op, {w->peer}, w->since, w->deadline);  // a slow peer moves the deadline on
        } catch (const Error& e) {
          w->error = e;
          w->reason = 1;
          if (w->recv) w->buf->abortWaitRecv(); else w->buf->abortWaitSend();
        }
      } else if (now - w->since > Millis(250)) {
        poll = true;
      }
    }
    if (poll) {
      lock.unlock();
      auto note = poll_abort_note();
      lock.lock();
      if (note) {
        for (ActiveWait* w : waits_) {
          if (w->reason.load() != 0) continue;
          w->reason = 2;
          if (w->recv) w->buf->abortWaitRecv(); else w->buf->abortWaitSend();
        }
      }
    }
  }
}

std::string GlooComm::peer_gone(int peer) const {
  const PeerInfo& p = peers()[static_cast<size_t>(peer)];
  if (p.identity == peers()[static_cast<size_t>(rank())].identity && process_gone(p.pid)) {
    return fmt::format("died (process {} is gone)", p.pid);
  }
  return "closed its connection";
}

Error GlooComm::peer_error(int peer, const Op& op, const std::string& gloo_error) {
  if (auto note = poll_abort_note(/*force=*/true)) {
    return remote_error("{}: {} {} after another rank failed: {}", describe(op),
                        describe_rank(peer), peer_gone(peer), *note);
  }
  return remote_error("{}: {} {} (gloo: {})", describe(op), describe_rank(peer), peer_gone(peer),
                      gloo_error);
}

GlooComm::WaitResult GlooComm::wait_buf(gloo::transport::UnboundBuffer& buf, bool recv, int peer,
                                        Deadline deadline, const Op& op) {
  ActiveWait w{&buf, recv, deadline, deadline.at() - op.timeout, peer, &op, {0}, std::nullopt};
  {
    std::lock_guard<std::mutex> lock(wmu_);
    waits_.push_back(&w);
    wcv_.notify_all();
  }
  bool ok = false;
  std::string gloo_error;
  try {
    ok = recv ? buf.waitRecv(nullptr, kForever) : buf.waitSend(nullptr, kForever);
  } catch (const std::exception& e) {
    gloo_error = e.what();
  }
  {
    std::lock_guard<std::mutex> lock(wmu_);
    waits_.remove(&w);
  }
  if (!gloo_error.empty()) {
    throw peer_error(peer, op, gloo_error);
  }
  if (ok) return WaitResult::kDone;
  if (w.reason.load() == 1 && w.error) throw *w.error;
  return w.reason.load() == 2 ? WaitResult::kAbortNote : WaitResult::kDeadline;
}

Error GlooComm::wait_error(WaitResult r, int peer, const Op& op) {
  if (r == WaitResult::kAbortNote) {
    auto note = poll_abort_note();
    return remote_error("{}: aborted while waiting for {}, because another rank failed: {}",
                        describe(op), describe_rank(peer), note.value_or("(no details)"));
  }
  return Error(ErrorKind::kTimeout,
               fmt::format("{} timed out after {} waiting for {}", describe(op),
                           net::format_seconds(op.timeout), describe_rank(peer)),
               "the rank named may be stuck or slow; its own log says why");
}

void GlooComm::step(gloo::transport::UnboundBuffer* sbuf, size_t soff, size_t sn, int to,
                    gloo::transport::UnboundBuffer* rbuf, size_t roff, size_t rn, int from,
                    const Op& op, Deadline dl) {
  const uint64_t slot = next_slot_++;
  try {
    if (rn) rbuf->recv(from, slot, roff, rn);
  } catch (const std::exception& e) {
    throw peer_error(from, op, e.what());
  }
  try {
    if (sn) sbuf->send(to, slot, soff, sn);
  } catch (const std::exception& e) {
    throw peer_error(to, op, e.what());
  }
  if (rn) {
    auto r = wait_buf(*rbuf, true, from, dl, op);
    if (r != WaitResult::kDone) throw wait_error(r, from, op);
  }
  if (sn) {
    auto r = wait_buf(*sbuf, false, to, dl, op);
    if (r != WaitResult::kDone) throw wait_error(r, to, op);
  }
}

void GlooComm::run(const Op& op, Deadline dl) {
  switch (op.kind) {
    case OpKind::kAllReduce: return ring_all_reduce(op, dl);
    case OpKind::kReduceScatter: return ring_reduce_scatter(op, dl);
    case OpKind::kAllGather: return ring_all_gather(op, dl);
    case OpKind::kBroadcast: return one_to_all_broadcast(op, dl);
    case OpKind::kBarrier: return dissemination_barrier(op, dl);
    case OpKind::kSend:
    case OpKind::kRecv:
    case OpKind::kAllToAll: break;  // sends and receives (Comm::all_to_all_v)
  }
  DS_CHECK(false, "GlooComm::run got {}", op_name(op.kind));
}

void GlooComm::ring_all_reduce(const Op& op, Deadline dl) {
  const int n = size(), r = rank();
  if (n == 1 || op.count == 0) return;
  const size_t es = dtype_size(op.dtype);
  const size_t piece = std::max<size_t>(1, kPieceBytes / es);
  const size_t super = piece * static_cast<size_t>(n);
  tmp_.resize(piece * es);
  auto* buf = static_cast<uint8_t*>(op.out);
  auto send_ub = make_ub(buf, op.count * es);
  auto recv_ub = make_ub(buf, op.count * es);
  auto tmp_ub = make_ub(tmp_.data(), tmp_.size());
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  for (size_t base = 0; base < op.count; base += super) {
    const size_t m = std::min(super, op.count - base);
    auto off = [&](int i) { return base + seg_begin(m, n, i); };
    auto len = [&](int i) { return seg_begin(m, n, i + 1) - seg_begin(m, n, i); };
    for (int s = 0; s < n - 1; ++s) {
      const int si = mod(r - 1 - s, n), ri = mod(r - 2 - s, n);
      step(send_ub.get(), off(si) * es, len(si) * es, right, tmp_ub.get(), 0, len(ri) * es, left,
           op, dl);
      reduce_into(op.dtype, op.reduce, buf + off(ri) * es, tmp_.data(), len(ri));
    }
    for (int s = 0; s < n - 1; ++s) {
      const int si = mod(r - s, n), ri = mod(r - s - 1, n);
      step(send_ub.get(), off(si) * es, len(si) * es, right, recv_ub.get(), off(ri) * es,
           len(ri) * es, left, op, dl);
    }
  }
}

void GlooComm::ring_reduce_scatter(const Op& op, Deadline dl) {
  const int n = size(), r = rank();
  const size_t es = dtype_size(op.dtype);
  const auto [off, total, maxc] = count_layout(op.counts);
  const auto* in = static_cast<const uint8_t*>(op.in);
  auto* out = static_cast<uint8_t*>(op.out);
  const size_t mine = op.counts[static_cast<size_t>(r)];
  if (n == 1) {
    if (mine && out != in) std::memmove(out, in, mine * es);
    return;
  }
  const size_t piece = std::max<size_t>(1, kPieceBytes / es);
  tmp_.resize(piece * es);
  acc_.resize(piece * es);
  auto in_ub = make_ub(in, total * es);
  auto tmp_ub = make_ub(tmp_.data(), tmp_.size());
  auto acc_ub = make_ub(acc_.data(), acc_.size());
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  for (size_t p0 = 0; p0 < maxc; p0 += piece) {
    auto len = [&](int q) {
      const size_t c = op.counts[static_cast<size_t>(q)];
      return c > p0 ? std::min(piece, c - p0) : size_t{0};
    };
    auto in_at = [&](int q) { return (off[static_cast<size_t>(q)] + p0) * es; };
    for (int s = 0; s < n - 1; ++s) {
      const int si = mod(r - 1 - s, n), ri = mod(r - 2 - s, n);
      if (s == 0) {
        step(in_ub.get(), in_at(si), len(si) * es, right, tmp_ub.get(), 0, len(ri) * es, left, op,
             dl);
      } else {
        step(acc_ub.get(), 0, len(si) * es, right, tmp_ub.get(), 0, len(ri) * es, left, op, dl);
      }
      const void* srcs[2] = {tmp_.data(), in + in_at(ri)};
      void* dst = (s == n - 2) ? static_cast<void*>(out + p0 * es) : acc_.data();
      if (len(ri)) reduce_n(op.dtype, op.reduce, dst, srcs, 2, len(ri));
    }
  }
}

void GlooComm::ring_all_gather(const Op& op, Deadline dl) {
  const int n = size(), r = rank();
  const size_t es = dtype_size(op.dtype);
  const auto [off, total, largest] = count_layout(op.counts);
  auto* out = static_cast<uint8_t*>(op.out);
  const size_t mine = op.counts[static_cast<size_t>(r)];
  if (mine && op.in != out + off[static_cast<size_t>(r)] * es) {
    std::memmove(out + off[static_cast<size_t>(r)] * es, op.in, mine * es);
  }
  if (n == 1) return;
  auto send_ub = make_ub(out, total * es);
  auto recv_ub = make_ub(out, total * es);
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  for (int s = 0; s < n - 1; ++s) {
    const int si = mod(r - s, n), ri = mod(r - s - 1, n);
    step(send_ub.get(), off[static_cast<size_t>(si)] * es, op.counts[static_cast<size_t>(si)] * es,
         right, recv_ub.get(), off[static_cast<size_t>(ri)] * es,
         op.counts[static_cast<size_t>(ri)] * es, left, op, dl);
  }
}

void GlooComm::one_to_all_broadcast(const Op& op, Deadline dl) {
  const int n = size(), r = rank(), root = op.peer;
  const uint64_t slot = next_slot_++;
  const size_t bytes = op.count * dtype_size(op.dtype);
  if (n == 1 || bytes == 0) return;
  if (r == root) {
    std::vector<UB> ubs;
    for (int q = 0; q < n; ++q) {
      if (q == root) continue;
      ubs.push_back(make_ub(op.out, bytes));
      try {
        ubs.back()->send(q, slot, 0, bytes);
      } catch (const std::exception& e) {
        throw peer_error(q, op, e.what());
      }
    }
    size_t i = 0;
    for (int q = 0; q < n; ++q) {
      if (q == root) continue;
      auto res = wait_buf(*ubs[i++], false, q, dl, op);
      if (res != WaitResult::kDone) throw wait_error(res, q, op);
    }
  } else {
    auto ub = make_ub(op.out, bytes);
    try {
      ub->recv(root, slot, 0, bytes);
    } catch (const std::exception& e) {
      throw peer_error(root, op, e.what());
    }
    auto res = wait_buf(*ub, true, root, dl, op);
    if (res != WaitResult::kDone) throw wait_error(res, root, op);
  }
}

void GlooComm::dissemination_barrier(const Op& op, Deadline dl) {
  const int n = size(), r = rank();
  uint8_t out_byte = 1, in_byte = 0;
  auto sub = make_ub(&out_byte, 1);
  auto rub = make_ub(&in_byte, 1);
  for (int k = 1; k < n; k *= 2) {
    step(sub.get(), 0, 1, mod(r + k, n), rub.get(), 0, 1, mod(r - k, n), op, dl);
  }
}

// ---------------------------------------------------------------------------------------------
// send / recv
// ---------------------------------------------------------------------------------------------

namespace {

class GlooP2pWork : public Work {
 public:
  GlooP2pWork(std::shared_ptr<GlooComm> comm, Comm::Op op, GlooComm::UB ub)
      : comm_(std::move(comm)),
        op_(std::move(op)),
        ub_(std::move(ub)),
        deadline_(Deadline::after(op_.timeout)) {}

  bool done() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

  void wait(Deadline deadline) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      const bool mine_first = !deadline.is_never() && deadline.at() < deadline_.at();
      const Deadline dl = mine_first ? deadline : deadline_;
      const bool recv = op_.kind == Comm::OpKind::kRecv;
      try {
        auto r = comm_->wait_buf(*ub_, recv, op_.peer, dl, op_);
        if (r == GlooComm::WaitResult::kDeadline && mine_first) {
          throw timeout_error("{}: still running when the wait's deadline passed (the "
                              "operation's own deadline still applies)",
                              comm_->describe_op(op_));
        }
        if (r != GlooComm::WaitResult::kDone) throw comm_->wait_error(r, op_.peer, op_);
        done_ = true;
      } catch (const Error& e) {
        if (e.kind() == ErrorKind::kTimeout && mine_first) throw;
        comm_->fail(e);
        done_ = true;
        error_ = std::current_exception();
      }
    }
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex mu_;
  std::shared_ptr<GlooComm> comm_;
  Comm::Op op_;
  GlooComm::UB ub_;
  Deadline deadline_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace

WorkPtr GlooComm::post_p2p(const Op& op) {
  const size_t bytes = op.count * dtype_size(op.dtype);
  const bool send = op.kind == OpKind::kSend;
  auto ub = make_ub(send ? op.in : op.out, bytes);
  const uint64_t slot = kP2pSlotBit | static_cast<uint32_t>(op.tag);
  if (bytes > 0) {
    try {
      if (send) ub->send(op.peer, slot, 0, bytes); else ub->recv(op.peer, slot, 0, bytes);
    } catch (const std::exception& e) {
      Error err = peer_error(op.peer, op, e.what());
      record_failure(err);
      throw err;
    }
  }
  if (bytes == 0) {
    auto w = std::make_shared<HostWork>(describe(op));
    w->finish(nullptr);
    return w;
  }
  return std::make_shared<GlooP2pWork>(shared_from_this(), op, std::move(ub));
}

CommPtr make_gloo_comm(BackendArgs args) { return std::make_shared<GlooComm>(args); }

}  // namespace ds::rt::comm
