// Collectives over a process group: the one interface the parallel code (ZeRO, tensor and
// pipeline parallelism) uses to talk to other ranks. After NCCL's public header: each call says
// what it computes, how big each buffer must be, whether it may run in place, how long it may
// block and what happens when another rank fails.
//
// Backends behind this interface (chosen by make_world_comm, see CommOptions::backend):
//   shm   ranks on one host: a POSIX shared-memory segment per group; collectives reduce
//         straight out of the peers' slots (several times Gloo's bandwidth on one host).
//   gloo  ranks on several hosts: Gloo's TCP pairs, our own ring algorithms on top.
//   nccl  GPU buffers (in the CUDA module, loaded on first use): NCCL on a CUDA stream.
//
// Deliberately not: a tensor library. Buffers are raw pointers with an element count and a
// DataType; the caller owns them. No autograd, no streams in the interface, no all-to-all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "common/deadline.h"
#include "common/error.h"

namespace ds::store {
class Store;
}

namespace ds::rt::comm {

// ---------------------------------------------------------------------------------------------
// Element types and reductions
// ---------------------------------------------------------------------------------------------

// Element types every backend moves. Reductions of kBFloat16 and kFloat16 accumulate in fp32 and
// round once to the storage type (round to nearest even) on the shm backend; Gloo's ring rounds
// after each of its N-1 partial sums, NCCL as NCCL does. Integer sums wrap around (two's
// complement), never undefined behaviour. kUInt8 is meant for byte payloads (gathers, broadcasts
// of serialized data); its reductions work too (sum mod 256).
enum class DataType : uint8_t { kFloat32, kBFloat16, kFloat16, kInt32, kInt64, kUInt8 };

size_t dtype_size(DataType t);       // bytes per element: 4, 2, 2, 4, 8, 1
const char* dtype_name(DataType t);  // "fp32", "bf16", "fp16", "int32", "int64", "uint8"

enum class ReduceOp : uint8_t { kSum, kMax, kMin };
const char* reduce_op_name(ReduceOp op);  // "sum", "max", "min"

enum class Backend : uint8_t { kAuto, kShm, kGloo, kNccl };
const char* backend_name(Backend b);  // "auto", "shm", "gloo", "nccl"
// "auto" | "shm" | "gloo" | "nccl"; anything else is an invalid_argument naming `what`.
Backend parse_backend(std::string_view text, std::string_view what);

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

struct CommOptions {
  // The group's name, used in every message ("all_reduce on group 'dp' ...") and in the store
  // keys and shared-memory name of the group. make_world_comm's default is "world".
  std::string name = "world";

  // kAuto: shm when every rank of the group runs on this host (same hostname, boot id and
  // namespaces, compared through the store), gloo otherwise. The DSTRAIN_COMM_BACKEND
  // environment variable (auto|shm|gloo|nccl) overrides kAuto. kShm across hosts is an
  // invalid_usage error on every rank. kNccl is never chosen automatically.
  Backend backend = Backend::kAuto;

  // Default deadline of every call, and of the group's setup (the rendezvous through the store).
  // A call may override it (CallOptions::timeout).
  Millis timeout{300000};

  // shm: bytes of one rank's staging slot (two per rank, double-buffered). Messages larger than
  // this stream through it in chunks; 2 MiB keeps the chunk in L2 while the peers reduce it.
  size_t shm_chunk_bytes = size_t{2} << 20;

  // gloo: the address peers connect to this rank at. Empty: 127.0.0.1 when every rank of the
  // group is on this host, else this host's name (as resolved by the peers).
  std::string gloo_hostname;

  // Part of the shared-memory segment's name; empty: DSTRAIN_JOB_ID, else "local".
  std::string job_id;

  // nccl: the CUDA device of this rank; -1: LOCAL_RANK.
  int cuda_device = -1;
};

// Per-call options.
struct CallOptions {
  // Overrides CommOptions::timeout for this call. The clock starts when the operation starts
  // executing (after the operations issued before it on the same Comm), not when it is issued.
  std::optional<Millis> timeout;
};

// ---------------------------------------------------------------------------------------------
// Work: the handle of an asynchronous call
// ---------------------------------------------------------------------------------------------

// Thread safety: wait() and done() may be called from any thread, any number of times.
class Work {
 public:
  virtual ~Work() = default;

  // True once the operation finished, successfully or not. Never blocks.
  virtual bool done() = 0;

  // Blocks until the operation finished, then rethrows its error if it failed (the same
  // ds::Error every later wait() rethrows). When `deadline` passes first, throws kTimeout
  // ("still running") and leaves the operation running: its own deadline (CallOptions::timeout)
  // still bounds it, so waiting again later is fine.
  virtual void wait(Deadline deadline = Deadline::never()) = 0;
};
using WorkPtr = std::shared_ptr<Work>;

// ---------------------------------------------------------------------------------------------
// Comm: one process group
// ---------------------------------------------------------------------------------------------
//
// Ordering. Every rank of the group must issue the same collectives in the same order with the
// same counts, dtype, reduction and root (as with NCCL and Gloo). A mismatch is a bug in the
// caller; it shows as a timeout or wrong numbers, not as a crash of this library.
// Collectives run in issue order, one at a time, on the Comm's communication thread (CPU
// backends; created on the first asynchronous call) or its CUDA stream (nccl). A synchronous
// call on an idle CPU Comm runs on the calling thread (no hand-off latency).
//
// Point-to-point. send/recv match by (peer, tag) in issue order between the two ranks, and are
// NOT ordered with respect to collectives: pipeline stages may overlap them with a pending
// all_reduce. send_async/recv_async only post the transfer; a send completes when the data has
// left the buffer. Two ranks that each send to the other before receiving do not deadlock.
// (nccl: tags are ignored, messages match in issue order; see nccl_comm.h.)
//
// Buffers. CPU backends take host pointers, nccl takes device pointers. A buffer passed to an
// asynchronous call must stay valid, and must not be written (nor read, for outputs) until its
// Work is done. Counts are in elements of `dtype`; zero counts are valid no-ops (every rank still
// makes the call). Pointers may be null only where their count is zero.
//
// Deadlines and failures. Every call finishes, fails or times out within its deadline
// (CommOptions::timeout unless CallOptions::timeout). Errors are ds::Error:
//   kTimeout  "all_reduce on group 'dp' (rank 0 of 4) timed out after 30.0 s waiting for
//              rank 3 (host-b)": a peer is alive but never got there.
//   kRemote   "all_reduce on group 'dp' (rank 0 of 4): rank 3 (host-b) died" /
//              "... closed its connection" / "... failed: <its error>": a peer is gone.
//   kInvalidArgument  a bad argument (count overflow, root out of range, aliasing buffers), at
//              the call, before anything is communicated.
// After any failure the Comm is broken: every later call fails at once with the first error,
// and the group has to be rebuilt (the job restarts). Destroying a Comm is always safe; a peer
// still waiting for it then fails with "rank r closed its communicator".
//
// Thread safety. Calls may come from several threads, but the order in which they are issued is
// the order the group runs them, so one thread per Comm is the sane usage. rank(), size(),
// name() and host_of() are immutable.
// Bytes this process has sent through every Comm since it started, as the ring algorithm counts
// them per rank: all_reduce 2(n-1)/n of the buffer, reduce_scatter and all_gather (n-1)/n of the
// whole (sum of counts), broadcast (n-1)/n, send the buffer; recv and barrier nothing. Groups
// of one send nothing. For the metrics' comm_bytes_sent (bench/zero_bench.sh reports it).
uint64_t bytes_sent_by_this_process();

class Comm {
 public:
  virtual ~Comm() = default;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return options_.name; }
  Backend backend() const { return backend_; }
  const CommOptions& options() const { return options_; }
  // The host name rank `r` reported at setup (for messages).
  const std::string& host_of(int r) const;

  // all_reduce: buf[i] = op over all ranks q of buf_q[i], for i < count, on every rank.
  // In place only: `buf` is both input and output (count elements). Every rank ends with the
  // same bits.
  void all_reduce(void* buf, size_t count, DataType dtype, ReduceOp op,
                  const CallOptions& call = {});
  WorkPtr all_reduce_async(void* buf, size_t count, DataType dtype, ReduceOp op,
                           const CallOptions& call = {});

  // reduce_scatter: out[i] = op over q of in_q[rank * count + i], for i < count.
  // `in` holds size() * count elements, `out` count elements. In place when
  // out == in + rank * count (in elements); any other overlap is invalid_argument.
  void reduce_scatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                      const CallOptions& call = {});
  WorkPtr reduce_scatter_async(const void* in, void* out, size_t count, DataType dtype,
                               ReduceOp op, const CallOptions& call = {});

  // reduce_scatter_v: the same with per-rank counts, for sizes the group does not divide.
  // counts.size() == size(); rank q's part starts at offset(q) = counts[0] + ... + counts[q-1].
  // out[i] = op over ranks p of in_p[offset(rank) + i], for i < counts[rank].
  // `in` holds sum(counts) elements, `out` counts[rank]. In place when
  // out == in + offset(rank). Every rank must pass the same counts.
  void reduce_scatter_v(const void* in, void* out, std::span<const size_t> counts,
                        DataType dtype, ReduceOp op, const CallOptions& call = {});
  WorkPtr reduce_scatter_v_async(const void* in, void* out, std::span<const size_t> counts,
                                 DataType dtype, ReduceOp op, const CallOptions& call = {});

  // all_gather: out[q * count + i] = in_q[i] for every rank q, i < count.
  // `in` holds count elements, `out` size() * count. In place when in == out + rank * count.
  void all_gather(const void* in, void* out, size_t count, DataType dtype,
                  const CallOptions& call = {});
  WorkPtr all_gather_async(const void* in, void* out, size_t count, DataType dtype,
                           const CallOptions& call = {});

  // all_gather_v: out[offset(q) + i] = in_q[i] for i < counts[q], offsets as reduce_scatter_v.
  // `in` holds counts[rank] elements, `out` sum(counts). In place when in == out + offset(rank).
  void all_gather_v(const void* in, void* out, std::span<const size_t> counts, DataType dtype,
                    const CallOptions& call = {});
  WorkPtr all_gather_v_async(const void* in, void* out, std::span<const size_t> counts,
                             DataType dtype, const CallOptions& call = {});

  // broadcast: buf[i] = buf_root[i] on every rank, i < count. In place (root's buf is the input).
  void broadcast(void* buf, size_t count, DataType dtype, int root,
                 const CallOptions& call = {});
  WorkPtr broadcast_async(void* buf, size_t count, DataType dtype, int root,
                          const CallOptions& call = {});

  // send: count elements of `buf` to rank `peer`, matched by the peer's recv(.., rank(), tag).
  // recv: count elements from rank `peer` into `buf`; the sender's count must be the same.
  // peer != rank(); tag >= 0.
  void send(const void* buf, size_t count, DataType dtype, int peer, int tag,
            const CallOptions& call = {});
  WorkPtr send_async(const void* buf, size_t count, DataType dtype, int peer, int tag,
                     const CallOptions& call = {});
  void recv(void* buf, size_t count, DataType dtype, int peer, int tag,
            const CallOptions& call = {});
  WorkPtr recv_async(void* buf, size_t count, DataType dtype, int peer, int tag,
                     const CallOptions& call = {});

  // all_to_all_v: rank r sends send_counts[q] elements of `in` to every rank q and receives
  // recv_counts[q] elements from it: `in` is packed by destination (q's elements start at
  // send_counts[0] + ... + send_counts[q-1]), `out` by source likewise. recv_counts[q] must be
  // rank q's send_counts[r] (exchange the counts first: an all_to_all_v of one count per rank).
  // Counts may be zero and differ per rank (the mixture of experts' token exchange). No overlap
  // between in and out. gloo: every pair's transfer is a send and a recv on this group (tag
  // kAllToAllTag), all posted before any is waited for, own part copied; each bounded by the
  // deadline and naming the peer it waited for, as any send/recv. shm: one collective through the
  // group's segment (rounds of staged pieces, shm_comm.cpp), with its deadline and hung-rank
  // naming. nccl: one ncclGroup of sends and receives on the group's stream.
  // all_to_all_v_async: the same, returning at once (gloo: once every transfer is posted and the
  // own part copied); both buffers belong to the call until its Work is done.
  static constexpr int kAllToAllTag = 0x7a2a;
  void all_to_all_v(const void* in, std::span<const size_t> send_counts, void* out,
                    std::span<const size_t> recv_counts, DataType dtype, const CallOptions& call = {});
  WorkPtr all_to_all_v_async(const void* in, std::span<const size_t> send_counts, void* out,
                             std::span<const size_t> recv_counts, DataType dtype, const CallOptions& call = {});

  // ring_exchange_async: every rank sends `count` elements of `send` to rank + 1 and receives
  // rank - 1's into `recv` (modulo the size), as the context-parallel ring's step: an all_to_all_v
  // with one piece per rank, so on shm it is a collective through the segment (every rank of the
  // group calls it, in the same order as its other collectives), on gloo a send and a recv.
  WorkPtr ring_exchange_async(const void* send, void* recv, size_t count, DataType dtype,
                              const CallOptions& call = {});

  // barrier: returns once every rank of the group has called it.
  void barrier(const CallOptions& call = {});
  WorkPtr barrier_async(const CallOptions& call = {});

  // A subgroup of this group: `ranks` are ranks of THIS group (distinct, in range, in the
  // order that defines the new group's ranks; this rank must be one of them). Called by exactly
  // the members, each with the same `ranks` and `name`; the rendezvous goes through this
  // group's store under the prefix "group/<name>/", so a name may be used once per Comm
  // (a second use is invalid_usage). The backend is chosen again for the subgroup (a subgroup of
  // a multi-host world that lives on one host gets shm). `name` is also the subgroup's name in
  // messages. Blocks until every member joined, or the timeout (naming the missing ranks).
  std::shared_ptr<Comm> new_group(const std::vector<int>& ranks, const std::string& name,
                                  const CallOptions& call = {});

  // Registered buffers: `bytes` of memory (64-byte aligned, zeroed) that stays valid until this
  // Comm is destroyed. On the shm backend every peer maps it too, and a collective whose buffers
  // lie in registered memory on every rank reads the peers' data in place: no staging copies and
  // three synchronisations per call whatever its size (all_reduce: its buffer; reduce_scatter:
  // the input; all_gather: input and output). Either every rank passes registered buffers to a
  // call or none does (a mix is an invalid_usage error naming both ranks). gloo returns
  // ordinary host memory, nccl device memory. Collective: every rank calls it with the same size, while no operation of
  // this Comm is in flight; blocks until every rank mapped every region (the timeout).
  void* alloc_buffer(size_t bytes, const CallOptions& call = {});

  // Starts this process's progress beacon (comm/beacon.h) in this group's job-wide key space, under
  // this rank's world rank: its peers can then tell it slow from hung. Lives as long as the result.
  std::shared_ptr<void> start_progress_beacon() const;

  // Marks this rank failed with `e` before it leaves because of an error of its own (not one of
  // this Comm's): the peers' waits on it end at once, naming this rank and e's message, instead of
  // "closed its communicator" or a timeout; the job-wide abort note carries the message. Never
  // throws. The Comm is unusable afterwards. NCCL: nothing (its peers see the abort).
  virtual void fail(const Error& e) {}

  // One operation as the backends receive it (after argument checks). Public for the backends'
  // benefit; callers use the methods above.
  enum class OpKind : uint8_t {
    kAllReduce, kReduceScatter, kAllGather, kBroadcast, kSend, kRecv, kBarrier,
    kAllToAll  // nccl and shm; gloo runs all_to_all_v as sends and receives
  };
  struct Op {
    OpKind kind = OpKind::kBarrier;
    const void* in = nullptr;  // all_reduce/broadcast: == out
    void* out = nullptr;
    size_t count = 0;            // all_reduce, broadcast, send, recv
    std::vector<size_t> counts;  // reduce_scatter, all_gather (per rank; even ones filled in); all_to_all: sent
    std::vector<size_t> recv_counts;  // all_to_all: received from each rank
    DataType dtype = DataType::kFloat32;
    ReduceOp reduce = ReduceOp::kSum;
    int peer = -1;  // broadcast root, send/recv peer
    int tag = 0;
    Millis timeout{0};
    uint64_t flight_id = 0;  // its flight recorder entry (comm/flight_recorder.h); 0: none
  };
  static const char* op_name(OpKind k);

  // Busy time, for the wall-clock breakdown: the seconds this group spent running operations of
  // kind `k` since it was created (cumulative; on the communication thread or inline on the
  // caller's; send/recv are not counted), read from any thread. Negative where the backend does
  // not measure it (nccl: the collectives run on a CUDA stream).
  virtual double busy_seconds(OpKind k) const { return -1.0; }

  // What each rank reported at setup.
  struct PeerInfo {
    std::string host;      // gethostname()
    std::string identity;  // host + boot id + namespaces: equal means "shared memory works"
    int64_t pid = 0;
    int world_rank = 0;    // its rank in the world group
  };

 protected:
  Comm(std::shared_ptr<store::Store> store, std::shared_ptr<store::Store> abort_store, int rank,
       int size, CommOptions options, Backend backend, std::vector<PeerInfo> peers);

  // Runs or queues `op` (already checked). `async` false: the caller waits on the result at
  // once, so a backend may run it on the calling thread.
  virtual WorkPtr submit(Op op, bool async) = 0;
  // all_to_all_v and its async form: checks, then one collective (shm, nccl) or the pairs' sends
  // and receives (gloo).
  WorkPtr issue_all_to_all_v(const void* in, std::span<const size_t> send_counts, void* out,
                             std::span<const size_t> recv_counts, DataType dtype, const CallOptions& call,
                             bool async);
  // alloc_buffer's backend part; the default is ordinary memory owned by the Comm.
  virtual void* allocate_registered(size_t bytes, Millis timeout);

  // Adds op's bytes to bytes_sent_by_this_process().
  void count_traffic(const Op& op, size_t element_size) const;

  // "all_reduce on group 'dp' (rank 0 of 4)"
  std::string describe(const Op& op) const;
  std::string describe_rank(int r) const;  // "rank 3 (host-b)", "rank 1 (world rank 5, host-b)"
  const std::vector<PeerInfo>& peers() const { return peers_; }
  const std::shared_ptr<store::Store>& store() const { return store_; }
  // The world group's key space (shared by every subgroup): the job-wide abort note lives there.
  const std::shared_ptr<store::Store>& abort_store() const { return abort_store_; }

 private:
  WorkPtr issue(Op op, const CallOptions& call, bool async);
  // The flight recorder's entry for `op` (registers this group on first use; 0: recording off).
  uint64_t record_issue(const Op& op);

  std::shared_ptr<store::Store> store_;  // this group's scope (a PrefixStore)
  std::shared_ptr<store::Store> abort_store_;
  int rank_;
  int size_;
  CommOptions options_;
  Backend backend_;
  std::vector<PeerInfo> peers_;
  std::mutex groups_mu_;
  std::vector<std::string> used_group_names_;
  std::vector<std::unique_ptr<uint8_t[]>> plain_buffers_;
  std::mutex flight_mu_;  // the flight recorder's numbering of this group's operations
  int flight_group_ = -1;
  uint64_t collective_seq_ = 0;
  std::map<std::tuple<OpKind, int, int>, uint64_t> p2p_seq_;  // (kind, peer, tag) -> count
};
using CommPtr = std::shared_ptr<Comm>;

// The per-rank layout of a reduce_scatter / all_gather (Comm::Op::counts), for the backends:
// rank q's part starts at offsets[q] = counts[0] + ... + counts[q-1]; `total` is the sum of the
// counts and `largest` the largest one (a chunked algorithm runs ceil(largest / piece) rounds).
// Elements, not bytes. The counts were checked for overflow before a backend sees them.
struct CountLayout {
  std::vector<size_t> offsets;
  size_t total = 0;
  size_t largest = 0;
};
CountLayout count_layout(std::span<const size_t> counts);

// Small host-side reductions for bookkeeping (losses, norms, per-rank counters), collective over
// `comm` (every rank calls them with vectors of the same length; null comm: a group of one, the
// input comes back). sum_in_rank_order gathers every rank's values and adds them in rank order,
// so every rank gets the same bits (an overflow verdict or a loss agrees everywhere);
// gather_int64 returns every rank's values, rank-major. Blocking, bounded by the Comm's timeout.
std::vector<double> sum_in_rank_order(Comm* comm, const std::vector<double>& mine);
std::vector<int64_t> gather_int64(Comm* comm, const std::vector<int64_t>& mine);

// ---------------------------------------------------------------------------------------------
// Factories
// ---------------------------------------------------------------------------------------------

// The world group of a job: every rank calls it with the job's store (usually
// store::connect_from_env(), or a PrefixStore per restart generation), its rank and the world
// size. Keys go under "comm/<options.name>/" of `store`, so one store serves one world Comm per
// name. Blocks until every rank joined (options.timeout; the error names the ranks that did not
// join). Throws invalid_argument for rank/size out of range.
CommPtr make_world_comm(std::shared_ptr<store::Store> store, int rank, int size,
                        CommOptions options = {});

// Like make_world_comm, but `store` is already scoped to this group (no "comm/<name>/" prefix
// is added). new_group() uses it.
CommPtr make_comm(std::shared_ptr<store::Store> store, int rank, int size, CommOptions options);

// N ranks as threads of this process over one in-memory store (tests, single-process runs):
// creates the N Comms concurrently and returns them indexed by rank. Throws the first rank's
// error when a setup fails.
std::vector<CommPtr> make_thread_comms(int n, CommOptions options = {});

// What kAuto resolves to for `options` before the peers are known (for logs): the env override
// or options.backend.
Backend requested_backend(const CommOptions& options);

}  // namespace ds::rt::comm
