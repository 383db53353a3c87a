// The public half of Comm: argument checks (once, at the boundary, naming the bad value and the
// valid range), the synchronous wrappers, subgroups, and the factories: the peers' exchange
// through the store (who is on which host), backend selection, thread ranks for tests.
#include "comm/comm.h"

#include <atomic>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <numeric>
#include <set>
#include <thread>

#include <fmt/ranges.h>

#include "comm/beacon.h"
#include "comm/flight_recorder.h"
#include "comm/host_comm.h"
#include "comm/nccl_comm.h"
#include "common/check.h"
#include "common/env.h"
#include "common/error.h"
#include "common/socket.h"
#include "common/strings.h"
#include "core/cuda_module.h"
#include "store/hash_store.h"
#include "store/prefix_store.h"
#include "store/store.h"

namespace ds::rt::comm {

size_t dtype_size(DataType t) {
  switch (t) {
    case DataType::kFloat32: return 4;
    case DataType::kBFloat16: return 2;
    case DataType::kFloat16: return 2;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
    case DataType::kUInt8: return 1;
  }
  throw invalid_argument("unknown comm dtype {}", static_cast<int>(t));
}

const char* dtype_name(DataType t) {
  switch (t) {
    case DataType::kFloat32: return "fp32";
    case DataType::kBFloat16: return "bf16";
    case DataType::kFloat16: return "fp16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kUInt8: return "uint8";
  }
  return "unknown";
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "unknown";
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kAuto: return "auto";
    case Backend::kShm: return "shm";
    case Backend::kGloo: return "gloo";
    case Backend::kNccl: return "nccl";
  }
  return "unknown";
}

Backend parse_backend(std::string_view text, std::string_view what) {
  if (text == "auto") return Backend::kAuto;
  if (text == "shm") return Backend::kShm;
  if (text == "gloo") return Backend::kGloo;
  if (text == "nccl") return Backend::kNccl;
  throw Error(ErrorKind::kInvalidArgument,
              fmt::format("{}: unknown communication backend '{}'", what, text),
              "use one of auto, shm, gloo, nccl");
}

Backend requested_backend(const CommOptions& options) {
  if (options.backend != Backend::kAuto) return options.backend;
  auto env = env::get("DSTRAIN_COMM_BACKEND");
  if (!env || env->empty()) return Backend::kAuto;
  return parse_backend(*env, "DSTRAIN_COMM_BACKEND");
}

const char* Comm::op_name(OpKind k) {
  switch (k) {
    case OpKind::kAllReduce: return "all_reduce";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kSend: return "send";
    case OpKind::kRecv: return "recv";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kAllToAll: return "all_to_all";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------------
// Comm
// ---------------------------------------------------------------------------------------------

Comm::Comm(std::shared_ptr<store::Store> store, std::shared_ptr<store::Store> abort_store,
           int rank, int size, CommOptions options, Backend backend, std::vector<PeerInfo> peers)
    : store_(std::move(store)),
      abort_store_(std::move(abort_store)),
      rank_(rank),
      size_(size),
      options_(std::move(options)),
      backend_(backend),
      peers_(std::move(peers)) {
  DS_CHECK(static_cast<int>(peers_.size()) == size_, "{} peers for {} ranks", peers_.size(), size_);
}

const std::string& Comm::host_of(int r) const {
  if (r < 0 || r >= size_) {
    throw invalid_argument("group '{}' has ranks 0..{}; there is no rank {}", name(), size_ - 1, r);
  }
  return peers_[static_cast<size_t>(r)].host;
}

std::string Comm::describe(const Op& op) const {
  std::string s = fmt::format("{} on group '{}' (rank {} of {}", op_name(op.kind), name(), rank_,
                              size_);
  if (op.kind == OpKind::kSend) s += fmt::format(", to rank {} tag {}", op.peer, op.tag);
  if (op.kind == OpKind::kRecv) s += fmt::format(", from rank {} tag {}", op.peer, op.tag);
  return s + ")";
}

std::string Comm::describe_rank(int r) const {
  const PeerInfo& p = peers_[static_cast<size_t>(r)];
  if (p.world_rank != r || name() != "world") {
    return fmt::format("rank {} (world rank {}, {})", r, p.world_rank, p.host);
  }
  return fmt::format("rank {} ({})", r, p.host);
}

namespace {

void check_bytes(const Comm::Op& op, size_t count, const char* what) {
  const size_t es = dtype_size(op.dtype);
  if (count > SIZE_MAX / es / 2) {
    throw invalid_argument("{}: {} count {} of {} is too large", Comm::op_name(op.kind), what,
                           count, dtype_name(op.dtype));
  }
}

void check_ptr(const Comm::Op& op, const void* p, size_t count, const char* what) {
  if (p == nullptr && count > 0) {
    throw invalid_argument("{}: {} is null but holds {} elements", Comm::op_name(op.kind), what,
                           count);
  }
}

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return an > 0 && bn > 0 && pa < pb + bn && pb < pa + an;
}

// all_to_all_v's arguments (op.counts sent, op.recv_counts received): a count per rank, this
// rank's own part the same both ways, sums that fit, buffers that hold them and do not overlap.
void check_all_to_all(const Comm::Op& op, int rank, int size, const std::string& what) {
  if (op.counts.size() != static_cast<size_t>(size) || op.recv_counts.size() != static_cast<size_t>(size)) {
    throw invalid_argument("{}: {} send and {} receive counts for a group of {}", what, op.counts.size(),
                           op.recv_counts.size(), size);
  }
  const size_t own = op.counts[static_cast<size_t>(rank)];
  if (own != op.recv_counts[static_cast<size_t>(rank)]) {
    throw invalid_argument("{}: this rank sends {} elements to itself but expects {}", what, own,
                           op.recv_counts[static_cast<size_t>(rank)]);
  }
  size_t sent = 0, received = 0;
  for (int q = 0; q < size; ++q) {
    sent += op.counts[static_cast<size_t>(q)];
    received += op.recv_counts[static_cast<size_t>(q)];
    check_bytes(op, sent, "total sent");
    check_bytes(op, received, "total received");
  }
  check_ptr(op, op.in, sent, "input");
  check_ptr(op, op.out, received, "output");
  const size_t es = dtype_size(op.dtype);
  if (overlaps(op.in, sent * es, op.out, received * es)) throw invalid_argument("{}: input and output overlap", what);
}

}  // namespace

WorkPtr Comm::issue(Op op, const CallOptions& call, bool async) {
  op.timeout = call.timeout.value_or(options_.timeout);
  if (op.timeout.count() <= 0) {
    throw invalid_argument("{}: timeout must be positive (got {} ms)", describe(op),
                           op.timeout.count());
  }
  (void)dtype_size(op.dtype);  // rejects an out-of-range enum value
  const size_t es = dtype_size(op.dtype);
  switch (op.kind) {
    case OpKind::kAllReduce:
    case OpKind::kBroadcast:
      check_bytes(op, op.count, "buffer");
      check_ptr(op, op.out, op.count, "buf");
      if (op.kind == OpKind::kBroadcast && (op.peer < 0 || op.peer >= size_)) {
        throw invalid_argument("{}: root {} is not a rank of the group (0..{})", describe(op),
                               op.peer, size_ - 1);
      }
      break;
    case OpKind::kReduceScatter:
    case OpKind::kAllGather: {
      if (op.counts.size() != static_cast<size_t>(size_)) {
        throw invalid_argument("{}: {} per-rank counts for a group of {}", describe(op),
                               op.counts.size(), size_);
      }
      size_t total = 0, offset = 0;
      for (int q = 0; q < size_; ++q) {
        const size_t c = op.counts[static_cast<size_t>(q)];
        check_bytes(op, c, "per-rank");
        if (q == rank_) offset = total;
        total += c;
        check_bytes(op, total, "total");
      }
      const size_t mine = op.counts[static_cast<size_t>(rank_)];
      const bool rs = op.kind == OpKind::kReduceScatter;
      const size_t in_n = rs ? total : mine, out_n = rs ? mine : total;
      check_ptr(op, op.in, in_n, "input");
      check_ptr(op, op.out, out_n, "output");
      const auto* in_b = static_cast<const uint8_t*>(op.in);
      auto* out_b = static_cast<uint8_t*>(op.out);
      const bool in_place = rs ? (out_b == in_b + offset * es) : (in_b == out_b + offset * es);
      if (!in_place && overlaps(op.in, in_n * es, op.out, out_n * es)) {
        throw invalid_argument(
            "{}: input and output overlap; the only overlap allowed is in place ({})",
            describe(op),
            rs ? "output == input + offset(rank)" : "input == output + offset(rank)");
      }
      break;
    }
    case OpKind::kSend:
    case OpKind::kRecv:
      check_bytes(op, op.count, "buffer");
      check_ptr(op, op.kind == OpKind::kSend ? op.in : op.out, op.count, "buf");
      if (op.peer < 0 || op.peer >= size_ || op.peer == rank_) {
        throw invalid_argument("{}: peer {} must be another rank of the group (0..{}, not {})",
                               describe(op), op.peer, size_ - 1, rank_);
      }
      if (op.tag < 0) throw invalid_argument("{}: tag {} must be >= 0", describe(op), op.tag);
      break;
    case OpKind::kBarrier:
      break;
    case OpKind::kAllToAll:
      check_all_to_all(op, rank_, size_, describe(op));
      break;
  }
  count_traffic(op, es);
  const uint64_t id = record_issue(op);
  op.flight_id = id;
  // Posted at once: p2p on every backend, everything on NCCL's stream. The CPU backends' thread
  // marks its collectives started when it takes them up.
  if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv || backend_ == Backend::kNccl) flight::started(id);
  WorkPtr work;
  try {
    work = submit(std::move(op), async);
  } catch (const std::exception& e) {
    flight::finished(id, e.what());
    flight::dump_on_first_failure(e.what());
    throw;
  }
  return flight::track(std::move(work), id);
}

uint64_t Comm::record_issue(const Op& op) {
  if (!flight::enabled()) return 0;
  std::lock_guard<std::mutex> lock(flight_mu_);
  if (flight_group_ < 0) {
    flight::GroupInfo g{name(), rank_, size_, backend_name(backend_), {}};
    for (const auto& p : peers_) g.world_ranks.push_back(p.world_rank);
    flight_group_ = flight::register_group(g);
  }
  const bool p2p = op.kind == OpKind::kSend || op.kind == OpKind::kRecv;
  const uint64_t seq = p2p ? ++p2p_seq_[{op.kind, op.peer, op.tag}] : ++collective_seq_;
  return flight::issued(flight_group_, seq, op);
}

namespace {
std::atomic<uint64_t> g_bytes_sent{0};
}  // namespace

// The ring algorithm's bytes per rank: what a bandwidth-bound backend moves whatever its
// implementation (the shm backend copies through shared memory, Gloo's ring sends exactly this).
void Comm::count_traffic(const Op& op, size_t es) const {
  const double n = size_;
  if (size_ <= 1) return;
  double bytes = 0;
  switch (op.kind) {
    case OpKind::kAllReduce:
      bytes = 2.0 * (n - 1) / n * static_cast<double>(op.count * es);
      break;
    case OpKind::kBroadcast:
      bytes = (n - 1) / n * static_cast<double>(op.count * es);
      break;
    case OpKind::kReduceScatter:
    case OpKind::kAllGather: {
      size_t total = 0;
      for (size_t c : op.counts) total += c;
      bytes = (n - 1) / n * static_cast<double>(total * es);
      break;
    }
    case OpKind::kSend:
      bytes = static_cast<double>(op.count * es);
      break;
    case OpKind::kAllToAll:
      for (int q = 0; q < size_; ++q) {
        if (q != rank_) bytes += static_cast<double>(op.counts[static_cast<size_t>(q)] * es);
      }
      break;
    case OpKind::kRecv:
    case OpKind::kBarrier:
      break;
  }
  g_bytes_sent.fetch_add(static_cast<uint64_t>(bytes), std::memory_order_relaxed);
}

uint64_t bytes_sent_by_this_process() { return g_bytes_sent.load(std::memory_order_relaxed); }

CountLayout count_layout(std::span<const size_t> counts) {
  CountLayout l;
  l.offsets.reserve(counts.size());
  for (size_t c : counts) {
    l.offsets.push_back(l.total);
    l.total += c;
    l.largest = std::max(l.largest, c);
  }
  return l;
}

std::vector<double> sum_in_rank_order(Comm* comm, const std::vector<double>& mine) {
  if (comm == nullptr) return mine;
  const size_t k = mine.size(), n = static_cast<size_t>(comm->size());
  std::vector<double> all(k * n);
  comm->all_gather(mine.data(), all.data(), k * sizeof(double), DataType::kUInt8);
  std::vector<double> sum(k, 0.0);
  for (size_t q = 0; q < n; ++q) {
    for (size_t i = 0; i < k; ++i) sum[i] += all[q * k + i];
  }
  return sum;
}

std::vector<int64_t> gather_int64(Comm* comm, const std::vector<int64_t>& mine) {
  if (comm == nullptr) return mine;
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(comm->size()));
  comm->all_gather(mine.data(), all.data(), mine.size(), DataType::kInt64);
  return all;
}

namespace {

Comm::Op make_op(Comm::OpKind kind, const void* in, void* out, size_t count, DataType dtype) {
  Comm::Op o;
  o.kind = kind;
  o.in = in;
  o.out = out;
  o.count = count;
  o.dtype = dtype;
  return o;
}
Comm::Op op_all_reduce(void* buf, size_t count, DataType dtype, ReduceOp r) {
  Comm::Op o = make_op(Comm::OpKind::kAllReduce, buf, buf, count, dtype);
  o.reduce = r;
  return o;
}
Comm::Op op_reduce_scatter(const void* in, void* out, std::span<const size_t> counts,
                           DataType dtype, ReduceOp r) {
  Comm::Op o = make_op(Comm::OpKind::kReduceScatter, in, out, 0, dtype);
  o.counts.assign(counts.begin(), counts.end());
  o.reduce = r;
  return o;
}
Comm::Op op_all_gather(const void* in, void* out, std::span<const size_t> counts,
                       DataType dtype) {
  Comm::Op o = make_op(Comm::OpKind::kAllGather, in, out, 0, dtype);
  o.counts.assign(counts.begin(), counts.end());
  return o;
}
Comm::Op op_broadcast(void* buf, size_t count, DataType dtype, int root) {
  Comm::Op o = make_op(Comm::OpKind::kBroadcast, buf, buf, count, dtype);
  o.peer = root;
  return o;
}
Comm::Op op_p2p(Comm::OpKind kind, const void* in, void* out, size_t count, DataType dtype,
                int peer, int tag) {
  Comm::Op o = make_op(kind, in, out, count, dtype);
  o.peer = peer;
  o.tag = tag;
  return o;
}

}  // namespace

// The synchronous calls wait without a deadline of their own: the operation's deadline bounds
// them.
WorkPtr Comm::all_reduce_async(void* buf, size_t count, DataType dtype, ReduceOp op,
                               const CallOptions& call) {
  return issue(op_all_reduce(buf, count, dtype, op), call, true);
}
void Comm::all_reduce(void* buf, size_t count, DataType dtype, ReduceOp op,
                      const CallOptions& call) {
  issue(op_all_reduce(buf, count, dtype, op), call, false)->wait();
}

WorkPtr Comm::reduce_scatter_v_async(const void* in, void* out, std::span<const size_t> counts,
                                     DataType dtype, ReduceOp op, const CallOptions& call) {
  return issue(op_reduce_scatter(in, out, counts, dtype, op), call, true);
}
void Comm::reduce_scatter_v(const void* in, void* out, std::span<const size_t> counts,
                            DataType dtype, ReduceOp op, const CallOptions& call) {
  issue(op_reduce_scatter(in, out, counts, dtype, op), call, false)->wait();
}
WorkPtr Comm::reduce_scatter_async(const void* in, void* out, size_t count, DataType dtype,
                                   ReduceOp op, const CallOptions& call) {
  std::vector<size_t> counts(static_cast<size_t>(size()), count);
  return issue(op_reduce_scatter(in, out, counts, dtype, op), call, true);
}
void Comm::reduce_scatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                          const CallOptions& call) {
  std::vector<size_t> counts(static_cast<size_t>(size()), count);
  issue(op_reduce_scatter(in, out, counts, dtype, op), call, false)->wait();
}

WorkPtr Comm::all_gather_v_async(const void* in, void* out, std::span<const size_t> counts,
                                 DataType dtype, const CallOptions& call) {
  return issue(op_all_gather(in, out, counts, dtype), call, true);
}
void Comm::all_gather_v(const void* in, void* out, std::span<const size_t> counts,
                        DataType dtype, const CallOptions& call) {
  issue(op_all_gather(in, out, counts, dtype), call, false)->wait();
}
WorkPtr Comm::all_gather_async(const void* in, void* out, size_t count, DataType dtype,
                               const CallOptions& call) {
  std::vector<size_t> counts(static_cast<size_t>(size()), count);
  return issue(op_all_gather(in, out, counts, dtype), call, true);
}
void Comm::all_gather(const void* in, void* out, size_t count, DataType dtype,
                      const CallOptions& call) {
  std::vector<size_t> counts(static_cast<size_t>(size()), count);
  issue(op_all_gather(in, out, counts, dtype), call, false)->wait();
}

WorkPtr Comm::broadcast_async(void* buf, size_t count, DataType dtype, int root,
                              const CallOptions& call) {
  return issue(op_broadcast(buf, count, dtype, root), call, true);
}
void Comm::broadcast(void* buf, size_t count, DataType dtype, int root, const CallOptions& call) {
  issue(op_broadcast(buf, count, dtype, root), call, false)->wait();
}

WorkPtr Comm::send_async(const void* buf, size_t count, DataType dtype, int peer, int tag,
                         const CallOptions& call) {
  return issue(op_p2p(OpKind::kSend, buf, nullptr, count, dtype, peer, tag), call, true);
}
void Comm::send(const void* buf, size_t count, DataType dtype, int peer, int tag,
                const CallOptions& call) {
  issue(op_p2p(OpKind::kSend, buf, nullptr, count, dtype, peer, tag), call, false)->wait();
}
WorkPtr Comm::recv_async(void* buf, size_t count, DataType dtype, int peer, int tag,
                         const CallOptions& call) {
  return issue(op_p2p(OpKind::kRecv, nullptr, buf, count, dtype, peer, tag), call, true);
}
void Comm::recv(void* buf, size_t count, DataType dtype, int peer, int tag,
                const CallOptions& call) {
  issue(op_p2p(OpKind::kRecv, nullptr, buf, count, dtype, peer, tag), call, false)->wait();
}

namespace {
// The Works of one call made of several (gloo's all_to_all_v): done when all are, wait() waits
// for each in turn under the one deadline.
class AllOfWork : public Work {
 public:
  explicit AllOfWork(std::vector<WorkPtr> parts) : parts_(std::move(parts)) {}
  bool done() override {
    return std::all_of(parts_.begin(), parts_.end(), [](const WorkPtr& w) { return w->done(); });
  }
  void wait(Deadline deadline) override {
    for (const WorkPtr& w : parts_) w->wait(deadline);
  }

 private:
  std::vector<WorkPtr> parts_;
};
}  // namespace

WorkPtr Comm::all_to_all_v_async(const void* in, std::span<const size_t> send_counts, void* out,
                                 std::span<const size_t> recv_counts, DataType dtype, const CallOptions& call) {
  return issue_all_to_all_v(in, send_counts, out, recv_counts, dtype, call, true);
}

void Comm::all_to_all_v(const void* in, std::span<const size_t> send_counts, void* out,
                        std::span<const size_t> recv_counts, DataType dtype, const CallOptions& call) {
  issue_all_to_all_v(in, send_counts, out, recv_counts, dtype, call, false)->wait();
}

// `async` false: a CPU collective may run on the calling thread (issue()).
WorkPtr Comm::issue_all_to_all_v(const void* in, std::span<const size_t> send_counts, void* out,
                                 std::span<const size_t> recv_counts, DataType dtype, const CallOptions& call,
                                 bool async) {
  Op op = make_op(OpKind::kAllToAll, in, out, 0, dtype);
  op.counts.assign(send_counts.begin(), send_counts.end());
  op.recv_counts.assign(recv_counts.begin(), recv_counts.end());
  check_all_to_all(op, rank_, size_, describe(op));
  if (backend_ == Backend::kNccl || backend_ == Backend::kShm) return issue(std::move(op), call, async);
  // Gloo: a send and a recv per peer (each with the deadline and the peer's name; the
  // sends count the traffic), all posted before any is waited for, and the own part copied.
  const size_t own = send_counts[static_cast<size_t>(rank_)];
  const size_t es = dtype_size(dtype);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  std::vector<WorkPtr> work;
  size_t so = 0, ro = 0;
  const uint8_t* own_src = nullptr;
  uint8_t* own_dst = nullptr;
  for (int q = 0; q < size_; ++q) {
    const size_t s = send_counts[static_cast<size_t>(q)], r = recv_counts[static_cast<size_t>(q)];
    if (q == rank_) {
      own_src = src + so * es;
      own_dst = dst + ro * es;
    } else {
      if (r > 0) work.push_back(recv_async(dst + ro * es, r, dtype, q, kAllToAllTag, call));
      if (s > 0) work.push_back(send_async(src + so * es, s, dtype, q, kAllToAllTag, call));
    }
    so += s;
    ro += r;
  }
  if (own > 0) std::memcpy(own_dst, own_src, own * es);
  return std::make_shared<AllOfWork>(std::move(work));
}

WorkPtr Comm::ring_exchange_async(const void* send, void* recv, size_t count, DataType dtype,
                                  const CallOptions& call) {
  std::vector<size_t> sent(static_cast<size_t>(size_), 0), received(static_cast<size_t>(size_), 0);
  sent[static_cast<size_t>((rank_ + 1) % size_)] = count;
  received[static_cast<size_t>((rank_ + size_ - 1) % size_)] = count;
  return all_to_all_v_async(send, sent, recv, received, dtype, call);
}

WorkPtr Comm::barrier_async(const CallOptions& call) {
  return issue(make_op(OpKind::kBarrier, nullptr, nullptr, 0, DataType::kUInt8), call, true);
}
void Comm::barrier(const CallOptions& call) {
  issue(make_op(OpKind::kBarrier, nullptr, nullptr, 0, DataType::kUInt8), call, false)->wait();
}

// ---------------------------------------------------------------------------------------------
// Setup: peers, backend choice, subgroups
// ---------------------------------------------------------------------------------------------

namespace {

std::string read_first_line(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return std::string(trim(line));
}

std::string ns_id(const char* which) {
  char buf[256];
  std::string path = fmt::format("/proc/self/ns/{}", which);
  ssize_t n = ::readlink(path.c_str(), buf, sizeof(buf) - 1);
  if (n <= 0) return "?";
  return std::string(buf, static_cast<size_t>(n));
}

Comm::PeerInfo this_process(int world_rank) {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "unknown");
  Comm::PeerInfo p;
  p.host = host;
  // Equal identities mean: the same kernel (boot id), the same /dev/shm (mount namespace), the
  // same pid numbers (pid namespace, for the liveness checks) and the same IPC namespace.
  p.identity = fmt::format("{}|{}|{}|{}|{}", p.host,
                           read_first_line("/proc/sys/kernel/random/boot_id"), ns_id("mnt"),
                           ns_id("pid"), ns_id("ipc"));
  p.pid = ::getpid();
  p.world_rank = world_rank;
  return p;
}

std::string encode_peer(const Comm::PeerInfo& p) {
  return fmt::format("{}\n{}\n{}\n{}", p.host, p.identity, p.pid, p.world_rank);
}

Comm::PeerInfo decode_peer(const std::string& s, int r, const std::string& group) {
  auto parts = split(s, '\n');
  if (parts.size() != 4) {
    throw remote_error("group '{}' setup: rank {} published a malformed peer record '{}'", group,
                       r, s);
  }
  Comm::PeerInfo p;
  p.host = parts[0];
  p.identity = parts[1];
  p.pid = parse_int(parts[2]).value_or(0);
  p.world_rank = static_cast<int>(parse_int(parts[3]).value_or(r));
  return p;
}

// Every rank publishes "peer/<rank>" and reads everybody else's; on timeout the error lists the
// ranks that never published.
std::vector<Comm::PeerInfo> exchange_peers(store::Store& st, int rank, int size,
                                           const CommOptions& o, int world_rank) {
  const Deadline deadline = Deadline::after(o.timeout);
  st.set(fmt::format("peer/{}", rank), store::to_bytes(encode_peer(this_process(world_rank))));
  std::vector<std::string> keys;
  for (int q = 0; q < size; ++q) keys.push_back(fmt::format("peer/{}", q));
  try {
    st.wait(keys, o.timeout);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kTimeout) throw;
    std::vector<int> missing;
    for (int q = 0; q < size; ++q) {
      if (!st.check({keys[static_cast<size_t>(q)]})) missing.push_back(q);
    }
    throw Error(ErrorKind::kTimeout,
                fmt::format("group '{}' setup on rank {} of {} timed out after {}: rank{} {} never "
                            "joined ({})",
                            o.name, rank, size, net::format_seconds(o.timeout),
                            missing.size() == 1 ? "" : "s", fmt::join(missing, ", "),
                            st.describe()),
                "check that every rank of the group starts and calls the same group setup");
  }
  std::vector<Comm::PeerInfo> peers;
  for (int q = 0; q < size; ++q) {
    auto left = Millis(std::max(1, deadline.remaining_ms()));
    peers.push_back(decode_peer(store::to_string(st.get(keys[static_cast<size_t>(q)], left)), q,
                                o.name));
  }
  return peers;
}

CommPtr make_comm_impl(std::shared_ptr<store::Store> st, std::shared_ptr<store::Store> abort_st,
                       int rank, int size, CommOptions options, int world_rank) {
  if (size < 1) throw invalid_argument("group '{}': size {} must be >= 1", options.name, size);
  if (rank < 0 || rank >= size) {
    throw invalid_argument("group '{}': rank {} is outside 0..{}", options.name, rank, size - 1);
  }
  if (options.name.empty()) throw invalid_argument("a communication group needs a name");
  if (options.timeout.count() <= 0) {
    throw invalid_argument("group '{}': timeout must be positive (got {} ms)", options.name,
                           options.timeout.count());
  }
  const Backend requested = requested_backend(options);
  auto peers = exchange_peers(*st, rank, size, options, world_rank);
  bool all_local = true;
  int other = -1;
  for (int q = 0; q < size; ++q) {
    if (peers[static_cast<size_t>(q)].identity != peers[static_cast<size_t>(rank)].identity) {
      all_local = false;
      if (other < 0) other = q;
    }
  }
  Backend chosen = requested;
  if (chosen == Backend::kAuto) chosen = all_local ? Backend::kShm : Backend::kGloo;
  if (chosen == Backend::kShm && !all_local) {
    throw Error(ErrorKind::kInvalidUsage,
                fmt::format("group '{}': the shm backend needs every rank on one host, but rank {} "
                            "runs on {} and rank {} on {}",
                            options.name, rank, peers[static_cast<size_t>(rank)].host, other,
                            peers[static_cast<size_t>(other)].host),
                "use DSTRAIN_COMM_BACKEND=auto or gloo");
  }
  BackendArgs args{std::move(st), std::move(abort_st), rank, size, std::move(options),
                   std::move(peers), all_local};
  switch (chosen) {
    case Backend::kShm: return make_shm_comm(std::move(args));
    case Backend::kGloo: return make_gloo_comm(std::move(args));
    case Backend::kNccl: {
      // The NCCL backend lives in the CUDA module (core/cuda_module.h), loaded here on first use.
      using MakeNccl = decltype(&ds_cuda_make_nccl_comm);
      const std::string purpose = fmt::format("group '{}' (the nccl backend)", args.options.name);
      auto make = reinterpret_cast<MakeNccl>(cuda_module_symbol("ds_cuda_make_nccl_comm", purpose));
      return make(std::move(args));
    }
    case Backend::kAuto: break;
  }
  DS_CHECK(false, "backend not resolved");
  return nullptr;
}

}  // namespace

CommPtr make_comm(std::shared_ptr<store::Store> store, int rank, int size, CommOptions options) {
  if (!store) throw invalid_argument("make_comm: no store");
  auto abort_store = store;
  return make_comm_impl(std::move(store), std::move(abort_store), rank, size, std::move(options),
                        rank);
}

CommPtr make_world_comm(std::shared_ptr<store::Store> store, int rank, int size,
                        CommOptions options) {
  if (!store) throw invalid_argument("make_world_comm: no store");
  auto scoped = std::make_shared<store::PrefixStore>(fmt::format("comm/{}/", options.name),
                                                     std::move(store));
  scoped->set_default_timeout(options.timeout);
  return make_comm(std::move(scoped), rank, size, std::move(options));
}

std::shared_ptr<Comm> Comm::new_group(const std::vector<int>& ranks, const std::string& name,
                                      const CallOptions& call) {
  if (name.empty() || name.find('/') != std::string::npos) {
    throw invalid_argument("new_group on group '{}': the name '{}' must be non-empty without '/'",
                           this->name(), name);
  }
  std::set<int> seen;
  int my_index = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    if (r < 0 || r >= size_) {
      throw invalid_argument("new_group '{}' on group '{}': rank {} is outside 0..{}", name,
                             this->name(), r, size_ - 1);
    }
    if (!seen.insert(r).second) {
      throw invalid_argument("new_group '{}' on group '{}': rank {} is listed twice", name,
                             this->name(), r);
    }
    if (r == rank_) my_index = static_cast<int>(i);
  }
  if (my_index < 0) {
    throw Error(ErrorKind::kInvalidUsage,
                fmt::format("new_group '{}' on group '{}': rank {} is not a member of [{}]", name,
                            this->name(), rank_, fmt::join(ranks, ", ")),
                "only the members of a subgroup create it");
  }
  {
    std::lock_guard<std::mutex> lock(groups_mu_);
    if (std::find(used_group_names_.begin(), used_group_names_.end(), name) !=
        used_group_names_.end()) {
      throw invalid_usage("new_group on group '{}': the name '{}' was already used", this->name(),
                          name);
    }
    used_group_names_.push_back(name);
  }
  CommOptions o = options_;
  o.name = name;
  if (call.timeout) o.timeout = *call.timeout;
  if (backend_ == Backend::kNccl) o.backend = Backend::kNccl;
  auto sub = std::make_shared<store::PrefixStore>(fmt::format("group/{}/", name), store_);
  sub->set_default_timeout(o.timeout);
  // The members must agree on the member list: member 0 publishes it, the others compare.
  const std::string members = fmt::format("{}", fmt::join(ranks, ","));
  if (my_index == 0) {
    sub->set("members", store::to_bytes(members));
  } else {
    std::string theirs = store::to_string(sub->get("members", o.timeout));
    if (theirs != members) {
      throw invalid_usage(
          "new_group '{}' on group '{}': rank {} was called with members [{}] but the first "
          "member with [{}]",
          name, this->name(), rank_, members, theirs);
    }
  }
  return make_comm_impl(std::move(sub), abort_store_, my_index, static_cast<int>(ranks.size()),
                        std::move(o), peers_[static_cast<size_t>(rank_)].world_rank);
}

std::shared_ptr<void> Comm::start_progress_beacon() const {
  return std::make_shared<ProgressBeacon>(abort_store_, peers_[static_cast<size_t>(rank_)].world_rank);
}

void* Comm::alloc_buffer(size_t bytes, const CallOptions& call) {
  if (bytes == 0 || bytes > (size_t{1} << 46)) {
    throw invalid_argument("alloc_buffer on group '{}': {} bytes (valid: 1 .. 64 TiB)", name(),
                           bytes);
  }
  return allocate_registered(bytes, call.timeout.value_or(options_.timeout));
}

void* Comm::allocate_registered(size_t bytes, Millis) {
  // Over-allocate for 64-byte alignment; value-initialized (zeroed) like the shm regions.
  std::lock_guard<std::mutex> lock(groups_mu_);
  plain_buffers_.push_back(std::make_unique<uint8_t[]>(bytes + 64));
  auto p = reinterpret_cast<uintptr_t>(plain_buffers_.back().get());
  return reinterpret_cast<void*>((p + 63) / 64 * 64);
}

std::vector<CommPtr> make_thread_comms(int n, CommOptions options) {
  if (n < 1) throw invalid_argument("make_thread_comms: {} ranks", n);
  auto st = std::make_shared<store::HashStore>();
  std::vector<CommPtr> comms(static_cast<size_t>(n));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        comms[static_cast<size_t>(r)] = make_world_comm(st, r, n, options);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return comms;
}

}  // namespace ds::rt::comm
