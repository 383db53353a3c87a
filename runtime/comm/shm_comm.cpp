// ShmComm: collectives for ranks on one host through one POSIX shared-memory segment per group.
//
// Layout: a header (a futex word "bell" and a sleeper count), one control block per rank (its
// step counter `seq`, its state and a failure reason, each on its own cache lines), then two
// staging slots of chunk_bytes per rank (double buffering). Rank 0 creates the segment under a
// random name derived from the job and group, publishes the name in the store, and unlinks it as
// soon as every rank mapped it, so a crash leaks nothing.
//
// Synchronisation is a counter per rank: after writing its part of a chunk a rank bumps its own
// `seq` (release) and waits until every peer's `seq` reached the same value (acquire): an
// all-to-all barrier without a shared counter. Waits spin briefly, then yield, then sleep on the
// futex with a short timeout, checking on the way the deadline, the peers' states (closed,
// failed with a reason), whether a waited-for peer's process still exists, and the job-wide
// abort note.
//
// Algorithms, per chunk (every rank runs the same chunk sequence; slot parity alternates with a
// per-group chunk counter):
//   all_reduce      copy my chunk, except my own slice r, into my slot | barrier | reduce slice
//                   r from my buffer and the N-1 peers' slots (fp32 accumulation) into my slot |
//                   barrier | copy every slice from its owner's slot into my buffer. One reduction per element, so every rank
//                   gets the same bits; per rank ~2 reads + 2 writes of the data, no syscalls.
//   reduce_scatter  copy the piece for each destination q into sub-slot q of my slot | barrier |
//                   reduce sub-slot r of all slots straight into my output.
//   all_gather      copy my piece into my slot | barrier | copy every peer's piece out.
//   broadcast       root copies into its slot | barrier | the others copy out.
//   all_to_all      copy my piece for each peer q into sub-slot q of my slot | barrier | copy
//                   sub-slot r of every peer's slot out (the pieces' sizes differ per pair; the
//                   first barrier publishes each rank's largest, which sets the rounds).
// Why double buffering is enough: a slot is written again two chunks later, and between the two
// writes lies the next chunk's first barrier, which every peer reaches only after it finished
// reading the earlier chunk.
//
// Large outputs (all_gather, broadcast and a reduce_scatter's part from 4 MiB, all_reduce from
// 64 MiB) are written with streaming stores (copy_streaming and reduce_n_streaming in reduce.h):
// no read-for-ownership of lines that will not stay in cache anyway, about half the CPU time of a
// 4-rank 256 MiB all_gather here. The fp32 reductions are fused AVX2 passes and the copies one
// sequential stream (reduce.cpp): 2-rank 64 MiB on registered buffers, medians of three rounds,
// all_reduce 11.8 -> 6.6 ms, reduce_scatter 9.0 -> 4.2, all_gather 6.4 -> 5.5 (docs/parallelism.md,
// Performance). The staging slots are written normally: a peer reads them next, from this core's
// cache.
//
// Send/recv stay on the Gloo pairs of the base class (pipeline traffic is point-to-point and
// latency-tolerant; a shared-memory mailbox per pair would cost N^2 slots). all_to_all_v, which
// ran as sends and receives on them too, is a collective here since 2026-12-05, and with it the
// context-parallel ring's step (Comm::ring_exchange_async: one piece per rank).
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "comm/gloo_comm.h"
#include "comm/reduce.h"
#include "common/check.h"
#include "common/env.h"
#include "common/socket.h"
#include "store/store.h"

namespace ds::rt::comm {

namespace {

constexpr uint64_t kMagic = 0x31304d4d48535344ull;  // "DSSHMM01"
constexpr size_t kHeaderBytes = 256;
constexpr size_t kCtlBytes = 512;
constexpr size_t kAlign = 4096;
constexpr size_t kZeroCopyMinBytes = size_t{256} << 10;
// Outputs from this size up are written with streaming stores (copy_streaming): twice the L2 of
// a core here, so such an output would not stay in cache anyway.
// all_reduce writes its output only in the last third of its traffic, and below 64 MiB streaming
// measured no better (worse at 4 MiB), so it streams from 64 MiB.
constexpr size_t kStreamMinBytes = size_t{4} << 20;
constexpr size_t kStreamMinAllReduceBytes = size_t{64} << 20;

struct Header {
  uint64_t magic;
  uint32_t nranks;
  uint32_t pad;
  uint64_t chunk_bytes;
  uint64_t total_bytes;
  alignas(64) std::atomic<uint32_t> bell;
  alignas(64) std::atomic<uint32_t> sleepers;
};
static_assert(sizeof(Header) <= kHeaderBytes);

enum : uint32_t { kActive = 0, kClosed = 1, kFailed = 2 };

// What a rank is doing at a step: compared with the peers' after every wait, so that ranks
// calling different collectives (a caller bug) fail at once with both calls named, instead of
// exchanging garbage.
struct Fingerprint {
  uint64_t op_index;  // collectives issued on this Comm before this one
  uint64_t counts;    // FNV-1a of the element count(s)
  uint64_t total;     // total elements, for the message
  uint8_t kind, dtype, reduce, registered;  // registered: the zero-copy path (see below)
  int32_t root;
  bool operator==(const Fingerprint&) const = default;
};

struct RankCtl {
  alignas(64) std::atomic<uint64_t> seq;
  alignas(64) std::atomic<uint32_t> state;
  char reason[320];
  Fingerprint fp[2];  // fp[s % 2]: the operation of step s (stable until step s + 2)
  // Zero-copy path: where this rank's buffer lies in its registered regions, per step parity.
  int32_t reg_region[2];
  uint64_t reg_offset[2];
  // all_to_all: the largest piece this rank sends to a peer, per step parity (the rounds needed).
  uint64_t piece_max[2];
};
static_assert(sizeof(RankCtl) <= kCtlBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// The ranks sharing this node: LOCAL_WORLD_SIZE (dstrain launch and torchrun set it), 1 without.
int ranks_on_node() {
  const char* v = std::getenv("LOCAL_WORLD_SIZE");
  const int n = v != nullptr ? std::atoi(v) : 0;
  return n > 0 ? n : 1;
}

// The CPUs this process may run on (its affinity mask, which a container or taskset narrows).
unsigned usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

void futex_wait(std::atomic<uint32_t>* addr, uint32_t expected, Millis timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000),
              static_cast<long>((timeout.count() % 1000) * 1000000)};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t>* addr) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
            0);
}

std::string sanitize(const std::string& s, size_t max) {
  std::string out;
  for (char c : s) {
    if (out.size() >= max) break;
    out += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-') ? c : '_';
  }
  return out;
}

class ShmComm : public GlooComm {
 public:
  explicit ShmComm(const BackendArgs& args) : GlooComm(args, Backend::kShm) {
    // At least 256 bytes per rank: reduce_scatter cuts a slot into size() sub-slots.
    chunk_ = std::max({align_up(args.options.shm_chunk_bytes, 64), size_t{4096},
                       static_cast<size_t>(size()) * 256});
    // More ranks on this node than CPUs it may use: spinning only steals the CPU from the rank we
    // wait for. Every rank on the node counts, not only this group's: two tp pairs of a 4-rank
    // job on 2 cores would otherwise each spin as if they had the machine to themselves.
    spin_ = static_cast<unsigned>(std::max(size(), ranks_on_node())) <= usable_cpus();
    if (size() > 1) map_segment(args);
  }

  ~ShmComm() override {
    stop_thread();
    if (base_ != nullptr) {
      auto& c = ctl(rank());
      uint32_t expected = kActive;
      c.state.compare_exchange_strong(expected, kClosed);
      ring_bell();
      ::munmap(base_, map_bytes_);
    }
    for (auto& reg : regions_) {
      for (auto& [p, n] : reg.maps) ::munmap(p, n);
    }
  }

  // Each rank creates a segment of its own, publishes its name, and maps every peer's (read
  // only); names are unlinked once everyone mapped them.
  void* allocate_registered(size_t bytes, Millis timeout) override {
    if (size() == 1) return Comm::allocate_registered(bytes, timeout);
    const Deadline dl = Deadline::after(timeout);
    const size_t mb = align_up(bytes, kAlign);
    const size_t k = regions_.size();
    std::random_device rd;
    const uint64_t nonce = (uint64_t{rd()} << 32) ^ rd();
    const std::string mine_name = fmt::format("/ds-{}-{}-r{}-{}-{:016x}", sanitize(job_, 40),
                                              sanitize(name(), 40), k, rank(), nonce);
    Region reg;
    reg.bytes = bytes;
    reg.peer.assign(static_cast<size_t>(size()), nullptr);
    auto map_named = [&](const std::string& nm, bool own) -> uint8_t* {
      int fd = ::shm_open(nm.c_str(), own ? (O_CREAT | O_EXCL | O_RDWR) : O_RDONLY, 0600);
      if (fd < 0) {
        throw system_error("alloc_buffer on group '{}' rank {}: shm_open {} failed: {}", name(),
                           rank(), nm, errno_string(errno));
      }
      if (own && ::ftruncate(fd, static_cast<off_t>(mb)) != 0) {
        const int err = errno;
        ::close(fd);
        ::shm_unlink(nm.c_str());
        throw system_error("alloc_buffer on group '{}': sizing {} to {} bytes failed: {}", name(),
                           nm, mb, errno_string(err));
      }
      void* p = ::mmap(nullptr, mb, own ? (PROT_READ | PROT_WRITE) : PROT_READ,
                       MAP_SHARED | MAP_POPULATE, fd, 0);
      const int err = errno;
      ::close(fd);
      if (p == MAP_FAILED) {
        if (own) ::shm_unlink(nm.c_str());
        throw system_error("alloc_buffer on group '{}': mapping {} bytes of {} failed: {}",
                           name(), mb, nm, errno_string(err));
      }
      reg.maps.emplace_back(p, mb);
      return static_cast<uint8_t*>(p);
    };
    try {
      reg.peer[static_cast<size_t>(rank())] = map_named(mine_name, true);
      // "<size> <name>": every rank checks the sizes agree before mapping anything.
      store()->set(fmt::format("reg/{}/{}", k, rank()),
                   store::to_bytes(fmt::format("{} {}", bytes, mine_name)));
      for (int q = 0; q < size(); ++q) {
        if (q == rank()) continue;
        const std::string v = store::to_string(store()->get(
            fmt::format("reg/{}/{}", k, q), Millis(std::max(1, dl.remaining_ms()))));
        const size_t sp = v.find(' ');
        const std::string theirs = v.substr(0, sp);
        if (sp == std::string::npos || theirs != std::to_string(bytes)) {
          throw invalid_usage("alloc_buffer #{} on group '{}': this rank ({}) asked for {} bytes, {} "
                              "for {}; every rank must pass the same size",
                              k, name(), rank(), bytes, describe_rank(q), theirs);
        }
        reg.peer[static_cast<size_t>(q)] = map_named(v.substr(sp + 1), false);
      }
      store::barrier(*store(), fmt::format("reg/{}/mapped", k), size(),
                     Millis(std::max(1, dl.remaining_ms())));
    } catch (...) {
      ::shm_unlink(mine_name.c_str());
      for (auto& [p, n] : reg.maps) ::munmap(p, n);
      throw;
    }
    ::shm_unlink(mine_name.c_str());
    regions_.push_back(std::move(reg));
    return regions_.back().peer[static_cast<size_t>(rank())];
  }

 protected:
  void run(const Op& op, Deadline dl) override {
    if (size() == 1) return run_single(op);
    set_fingerprint(op);
    if (choose_registered(op)) {
      switch (op.kind) {
        case OpKind::kAllReduce: return zc_all_reduce(op, dl);
        case OpKind::kReduceScatter: return zc_reduce_scatter(op, dl);
        case OpKind::kAllGather: return zc_all_gather(op, dl);
        default: break;
      }
    }
    switch (op.kind) {
      case OpKind::kAllReduce: return all_reduce(op, dl);
      case OpKind::kReduceScatter: return reduce_scatter(op, dl);
      case OpKind::kAllGather: return all_gather(op, dl);
      case OpKind::kBroadcast: return broadcast(op, dl);
      case OpKind::kBarrier:
        arrive();
        return wait_peers(op, dl);
      case OpKind::kAllToAll: return all_to_all(op, dl);
      case OpKind::kSend:
      case OpKind::kRecv: break;  // on the Gloo pairs
    }
    DS_CHECK(false, "ShmComm::run got {}", op_name(op.kind));
  }

  void on_failure(const std::string& message) override {
    if (base_ == nullptr) return;
    auto& c = ctl(rank());
    std::snprintf(c.reason, sizeof(c.reason), "%s", message.c_str());
    c.state.store(kFailed, std::memory_order_release);
    ring_bell();
  }

 private:
  Header* hdr() { return reinterpret_cast<Header*>(base_); }
  RankCtl& ctl(int q) {
    return *reinterpret_cast<RankCtl*>(base_ + kHeaderBytes + static_cast<size_t>(q) * kCtlBytes);
  }
  uint8_t* slot(int q, int b) {
    return base_ + data_off_ + (static_cast<size_t>(q) * 2 + static_cast<size_t>(b)) * chunk_;
  }

  void map_segment(const BackendArgs& args) {
    const int n = size();
    data_off_ = align_up(kHeaderBytes + static_cast<size_t>(n) * kCtlBytes, kAlign);
    map_bytes_ = data_off_ + static_cast<size_t>(n) * 2 * chunk_;
    std::string job = args.options.job_id;
    if (job.empty()) job = env::get_or_default("DSTRAIN_JOB_ID");
    if (job.empty()) job = "local";
    job_ = job;
    const Deadline deadline = Deadline::after(args.options.timeout);
    std::string shm_name;
    if (rank() == 0) {
      std::random_device rd;
      const uint64_t nonce = (uint64_t{rd()} << 32) ^ rd();
      shm_name = fmt::format("/ds-{}-{}-{:016x}", sanitize(job, 60), sanitize(name(), 60), nonce);
      int fd = ::shm_open(shm_name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0) {
        throw system_error("group '{}': shm_open {} failed: {}", name(), shm_name,
                           errno_string(errno));
      }
      if (::ftruncate(fd, static_cast<off_t>(map_bytes_)) != 0) {
        const int err = errno;
        ::close(fd);
        ::shm_unlink(shm_name.c_str());
        throw system_error("group '{}': sizing shared memory {} to {} bytes failed: {}", name(),
                           shm_name, map_bytes_, errno_string(err));
      }
      map_fd(fd, shm_name);
      hdr()->nranks = static_cast<uint32_t>(n);
      hdr()->chunk_bytes = chunk_;
      hdr()->total_bytes = map_bytes_;
      std::atomic_thread_fence(std::memory_order_release);
      hdr()->magic = kMagic;
      store()->set("shm/name", store::to_bytes(shm_name));
    } else {
      shm_name = store::to_string(
          store()->get("shm/name", Millis(std::max(1, deadline.remaining_ms()))));
      int fd = ::shm_open(shm_name.c_str(), O_RDWR, 0600);
      if (fd < 0) {
        throw system_error("group '{}' rank {}: opening rank 0's shared memory {} failed: {}",
                           name(), rank(), shm_name, errno_string(errno));
      }
      map_fd(fd, shm_name);
      if (hdr()->magic != kMagic || hdr()->nranks != static_cast<uint32_t>(n) ||
          hdr()->chunk_bytes != chunk_) {
        throw invalid_usage(
            "group '{}' rank {}: shared memory {} does not match this group (ranks {} vs {}, "
            "chunk {} vs {} bytes)",
            name(), rank(), shm_name, hdr()->nranks, n, hdr()->chunk_bytes, chunk_);
      }
    }
    ctl(rank()).state.store(kActive);
    // Everyone mapped it: the name can go (the memory lives until the last unmap).
    try {
      store::barrier(*store(), "shm/mapped", n, Millis(std::max(1, deadline.remaining_ms())));
    } catch (...) {
      if (rank() == 0) ::shm_unlink(shm_name.c_str());
      throw;
    }
    if (rank() == 0) ::shm_unlink(shm_name.c_str());
  }

  void map_fd(int fd, const std::string& shm_name) {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != map_bytes_) {
      ::close(fd);
      throw invalid_usage("group '{}' rank {}: shared memory {} has {} bytes, expected {}", name(),
                          rank(), shm_name, static_cast<long long>(st.st_size), map_bytes_);
    }
    void* p = ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    const int err = errno;
    ::close(fd);
    if (p == MAP_FAILED) {
      throw system_error("group '{}': mapping {} bytes of shared memory {} failed: {}", name(),
                         map_bytes_, shm_name, errno_string(err));
    }
    base_ = static_cast<uint8_t*>(p);
  }

  void ring_bell() {
    hdr()->bell.fetch_add(1, std::memory_order_seq_cst);
    if (hdr()->sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(&hdr()->bell);
  }

  void arrive() {
    ++seq_;
    ctl(rank()).fp[seq_ % 2] = fp_;
    ctl(rank()).reg_region[seq_ % 2] = reg_region_;
    ctl(rank()).reg_offset[seq_ % 2] = reg_offset_;
    ctl(rank()).piece_max[seq_ % 2] = piece_max_;
    ctl(rank()).seq.store(seq_, std::memory_order_release);
    ring_bell();
  }

  // The first peer whose seq is behind ours, or -1.
  int laggard() {
    for (int q = 0; q < size(); ++q) {
      if (q != rank() && ctl(q).seq.load(std::memory_order_acquire) < seq_) return q;
    }
    return -1;
  }

  // Spin (only when every rank can have its own CPU), then yield for a while (hands the CPU to
  // the rank we wait for when they share one), then sleep on the futex in short slices.
  void wait_peers(const Op& op, Deadline dl) {
    wait_arrivals(op, dl);
    for (int q = 0; q < size(); ++q) {
      if (q == rank()) continue;
      const Fingerprint theirs = ctl(q).fp[seq_ % 2];
      if (!(theirs == fp_)) {
        throw Error(ErrorKind::kInvalidUsage,
                    fmt::format("{}: {} is in a different collective: it called {} while this "
                                "rank called {}",
                                describe(op), describe_rank(q), describe_fp(theirs),
                                describe_fp(fp_)),
                    "every rank must issue the same collectives, with the same counts, dtype, "
                    "reduction and root, in the same order");
      }
    }
  }

  static std::string describe_fp(const Fingerprint& f) {
    std::string s = fmt::format("{} #{} ({}, {} elements", op_name(static_cast<OpKind>(f.kind)),
                                f.op_index, dtype_name(static_cast<DataType>(f.dtype)), f.total);
    if (f.kind == static_cast<uint8_t>(OpKind::kAllReduce) ||
        f.kind == static_cast<uint8_t>(OpKind::kReduceScatter)) {
      s += fmt::format(", {}", reduce_op_name(static_cast<ReduceOp>(f.reduce)));
    }
    if (f.kind == static_cast<uint8_t>(OpKind::kBroadcast)) s += fmt::format(", root {}", f.root);
    if (f.registered) s += ", registered buffer";
    return s + ")";
  }

  void set_fingerprint(const Op& op) {
    Fingerprint f{};
    f.op_index = op_index_++;
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) {
      for (int i = 0; i < 8; ++i) {
        h ^= (v >> (8 * i)) & 0xff;
        h *= 1099511628211ull;
      }
    };
    if (op.kind == OpKind::kAllToAll) {
      // Its counts differ per rank by design (the mixture of experts' token exchange).
    } else if (op.counts.empty()) {
      mix(op.count);
      f.total = op.count;
    } else {
      for (size_t c : op.counts) {
        mix(c);
        f.total += c;
      }
    }
    f.counts = h;
    f.kind = static_cast<uint8_t>(op.kind);
    f.dtype = static_cast<uint8_t>(op.dtype);
    f.reduce = (op.kind == OpKind::kAllReduce || op.kind == OpKind::kReduceScatter)
                   ? static_cast<uint8_t>(op.reduce)
                   : 0;
    f.root = op.kind == OpKind::kBroadcast ? op.peer : -1;
    fp_ = f;
  }

  void wait_arrivals(const Op& op, Deadline dl) {  // a copy: a slow peer moves it on
    if (laggard() < 0) return;
    const auto t0 = Clock::now();
    if (spin_) {
      do {
        for (int i = 0; i < 16; ++i) cpu_relax();
        if (laggard() < 0) return;
      } while (Clock::now() - t0 < std::chrono::microseconds(30));
    }
    do {
      ::sched_yield();
      if (laggard() < 0) return;
    } while (Clock::now() - t0 < std::chrono::microseconds(60));
    auto next_liveness = Clock::now();
    const auto since = dl.at() - op.timeout;  // when the operation began (the deadline moves)
    for (;;) {
      const int q = laggard();
      if (q < 0) return;
      check_peers(op, dl, since, next_liveness);
      hdr()->sleepers.fetch_add(1, std::memory_order_seq_cst);
      const uint32_t b = hdr()->bell.load(std::memory_order_seq_cst);
      if (laggard() >= 0) futex_wait(&hdr()->bell, b, Millis(5));
      hdr()->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

  // Throws when waiting longer cannot help: a peer closed or failed, died, the job-wide abort
  // note appeared, or the deadline passed and an awaited rank shows no progress (beacon.h).
  void check_peers(const Op& op, Deadline& dl, Clock::time_point since, Clock::time_point& next_liveness) {
    std::vector<int> behind;
    for (int q = 0; q < size(); ++q) {
      if (q == rank() || ctl(q).seq.load(std::memory_order_acquire) >= seq_) continue;
      behind.push_back(q);
      const uint32_t st = ctl(q).state.load(std::memory_order_acquire);
      if (st == kFailed) {
        std::string why(ctl(q).reason, strnlen(ctl(q).reason, sizeof(ctl(q).reason)));
        throw remote_error("{}: {} failed: {}", describe(op), describe_rank(q), why);
      }
      if (st == kClosed) {
        throw Error(ErrorKind::kRemote,
                    fmt::format("{}: {} closed its communicator while this rank waited for it",
                                describe(op), describe_rank(q)),
                    "every rank must issue the same collectives in the same order");
      }
    }
    const auto now = Clock::now();
    if (now >= next_liveness) {
      next_liveness = now + Millis(100);
      for (int q : behind) {
        const auto& p = peers()[static_cast<size_t>(q)];
        if (process_gone(p.pid)) {
          throw remote_error("{}: {} died (process {} is gone)", describe(op), describe_rank(q),
                             p.pid);
        }
      }
      if (auto note = poll_abort_note()) {
        throw remote_error("{}: aborted while waiting for {}, because another rank failed: {}",
                           describe(op), describe_rank(behind.front()), *note);
      }
      note_waiting(behind);
    }
    if (dl.expired()) on_deadline(op, behind, since, dl);
  }

  int next_buffer() { return static_cast<int>(chunk_counter_++ & 1); }

  // Into a collective's output: streaming stores for large outputs (see kStreamMinBytes).
  // Source and destination never overlap (in place is never copied).
  static void copy_out(void* dst, const void* src, size_t bytes, bool stream) {
    if (stream) {
      copy_streaming(dst, src, bytes);
    } else {
      std::memcpy(dst, src, bytes);
    }
  }

  // A reduce_scatter's reduction into its output: streaming stores once the rank's whole output
  // (`output_bytes`) is large (reduce_n_streaming), as copy_out does for copies.
  static void reduce_out(const Op& op, int n, void* out, const void* const* srcs, size_t count, size_t output_bytes) {
    if (output_bytes >= kStreamMinBytes) {
      reduce_n_streaming(op.dtype, op.reduce, out, srcs, n, count);
    } else {
      reduce_n(op.dtype, op.reduce, out, srcs, n, count);
    }
  }

  void all_reduce(const Op& op, Deadline dl) {
    const int n = size(), r = rank();
    const size_t es = dtype_size(op.dtype);
    const size_t per_chunk = chunk_ / es;
    const size_t unit = std::max<size_t>(1, 64 / es);
    auto* buf = static_cast<uint8_t*>(op.out);
    const bool stream = op.count * es >= kStreamMinAllReduceBytes;
    std::vector<const void*> srcs(static_cast<size_t>(n));
    std::vector<size_t> cut(static_cast<size_t>(n) + 1);
    for (size_t off = 0; off < op.count; off += per_chunk) {
      const size_t m = std::min(per_chunk, op.count - off);
      const int b = next_buffer();
      for (int i = 0; i <= n; ++i) {
        cut[static_cast<size_t>(i)] = i == n ? m : seg_begin(m, n, i) / unit * unit;
      }
      const size_t lo = cut[static_cast<size_t>(r)], hi = cut[static_cast<size_t>(r) + 1];
      // Only the peers read my slot, and only their own slices of it: my slice stays home.
      if (lo > 0) std::memcpy(slot(r, b), buf + off * es, lo * es);
      if (m > hi) std::memcpy(slot(r, b) + hi * es, buf + (off + hi) * es, (m - hi) * es);
      arrive();
      wait_peers(op, dl);
      if (hi > lo) {
        for (int q = 0; q < n; ++q) srcs[static_cast<size_t>(q)] = slot(q, b) + lo * es;
        srcs[static_cast<size_t>(r)] = buf + (off + lo) * es;
        reduce_n(op.dtype, op.reduce, slot(r, b) + lo * es, srcs.data(), n, hi - lo);
      }
      arrive();
      wait_peers(op, dl);
      for (int q = 0; q < n; ++q) {
        const size_t qlo = cut[static_cast<size_t>(q)], qhi = cut[static_cast<size_t>(q) + 1];
        if (qhi > qlo) copy_out(buf + (off + qlo) * es, slot(q, b) + qlo * es, (qhi - qlo) * es, stream);
      }
    }
  }

  void reduce_scatter(const Op& op, Deadline dl) {
    const int n = size(), r = rank();
    const size_t es = dtype_size(op.dtype);
    const size_t sub = chunk_ / static_cast<size_t>(n) / 64 * 64;
    const size_t per = std::max<size_t>(1, sub / es);
    const auto [off, total, maxc] = count_layout(op.counts);
    const auto* in = static_cast<const uint8_t*>(op.in);
    auto* out = static_cast<uint8_t*>(op.out);
    std::vector<const void*> srcs(static_cast<size_t>(n));
    for (size_t p0 = 0; p0 < maxc; p0 += per) {
      const int b = next_buffer();
      auto len = [&](int q) {
        const size_t c = op.counts[static_cast<size_t>(q)];
        return c > p0 ? std::min(per, c - p0) : size_t{0};
      };
      for (int q = 0; q < n; ++q) {
        if (len(q)) {
          std::memcpy(slot(r, b) + static_cast<size_t>(q) * sub,
                      in + (off[static_cast<size_t>(q)] + p0) * es, len(q) * es);
        }
      }
      arrive();
      wait_peers(op, dl);
      if (len(r)) {
        for (int q = 0; q < n; ++q) {
          srcs[static_cast<size_t>(q)] = slot(q, b) + static_cast<size_t>(r) * sub;
        }
        reduce_out(op, n, out + p0 * es, srcs.data(), len(r), op.counts[static_cast<size_t>(r)] * es);
      }
    }
  }

  void all_gather(const Op& op, Deadline dl) {
    const int n = size(), r = rank();
    const size_t es = dtype_size(op.dtype);
    const size_t per = std::max<size_t>(1, chunk_ / es);
    const auto [off, total, maxc] = count_layout(op.counts);
    const auto* in = static_cast<const uint8_t*>(op.in);
    auto* out = static_cast<uint8_t*>(op.out);
    const size_t mine = op.counts[static_cast<size_t>(r)];
    const bool stream = total * es >= kStreamMinBytes;
    for (size_t p0 = 0; p0 < maxc; p0 += per) {
      const int b = next_buffer();
      auto len = [&](int q) {
        const size_t c = op.counts[static_cast<size_t>(q)];
        return c > p0 ? std::min(per, c - p0) : size_t{0};
      };
      if (len(r)) std::memcpy(slot(r, b), in + p0 * es, len(r) * es);
      arrive();
      wait_peers(op, dl);
      for (int q = 0; q < n; ++q) {
        if (q != r && len(q)) {
          copy_out(out + (off[static_cast<size_t>(q)] + p0) * es, slot(q, b), len(q) * es, stream);
        }
      }
    }
    uint8_t* my_out = out + off[static_cast<size_t>(r)] * es;
    if (mine && in != my_out) copy_out(my_out, in, mine * es, stream);  // no overlap unless in place
  }

  // all_to_all_v: rounds of at most `per` elements of every piece. In each, my piece for rank q
  // goes into sub-slot q of my slot, one barrier, then I copy sub-slot r of every peer's slot out.
  // The first barrier also publishes the largest piece each rank sends (piece_max), so every rank
  // runs as many rounds as the largest piece of the group needs. My own piece is copied directly.
  void all_to_all(const Op& op, Deadline dl) {
    const int n = size(), r = rank();
    const size_t es = dtype_size(op.dtype);
    const size_t sub = chunk_ / static_cast<size_t>(n) / 64 * 64;
    const size_t per = std::max<size_t>(1, sub / es);
    const auto* in = static_cast<const uint8_t*>(op.in);
    auto* out = static_cast<uint8_t*>(op.out);
    std::vector<size_t> so(static_cast<size_t>(n)), ro(static_cast<size_t>(n));
    piece_max_ = 0;  // published by every arrive(); read only here
    size_t s = 0, t = 0;
    for (int q = 0; q < n; ++q) {
      so[static_cast<size_t>(q)] = s;
      ro[static_cast<size_t>(q)] = t;
      s += op.counts[static_cast<size_t>(q)];
      t += op.recv_counts[static_cast<size_t>(q)];
      if (q != r) piece_max_ = std::max<uint64_t>(piece_max_, op.counts[static_cast<size_t>(q)]);
    }
    const size_t own = op.counts[static_cast<size_t>(r)];
    if (own) std::memcpy(out + ro[static_cast<size_t>(r)] * es, in + so[static_cast<size_t>(r)] * es, own * es);
    auto len = [&](const std::vector<size_t>& counts, int q, size_t p0) {
      const size_t c = counts[static_cast<size_t>(q)];
      return c > p0 ? std::min(per, c - p0) : size_t{0};
    };
    uint64_t largest = 0;
    for (size_t p0 = 0, round = 0; round == 0 || p0 < largest; p0 += per, ++round) {
      const int b = next_buffer();
      for (int q = 0; q < n; ++q) {
        const size_t m = q == r ? 0 : len(op.counts, q, p0);
        if (m) std::memcpy(slot(r, b) + static_cast<size_t>(q) * sub, in + (so[static_cast<size_t>(q)] + p0) * es, m * es);
      }
      arrive();
      wait_peers(op, dl);
      if (round == 0) {
        for (int q = 0; q < n; ++q) largest = std::max(largest, ctl(q).piece_max[seq_ % 2]);
      }
      for (int q = 0; q < n; ++q) {
        const size_t m = q == r ? 0 : len(op.recv_counts, q, p0);
        if (m) std::memcpy(out + (ro[static_cast<size_t>(q)] + p0) * es, slot(q, b) + static_cast<size_t>(r) * sub, m * es);
      }
    }
  }

  void broadcast(const Op& op, Deadline dl) {
    const int r = rank(), root = op.peer;
    const size_t bytes = op.count * dtype_size(op.dtype);
    auto* buf = static_cast<uint8_t*>(op.out);
    for (size_t off = 0; off < bytes; off += chunk_) {
      const size_t m = std::min(chunk_, bytes - off);
      const int b = next_buffer();
      if (r == root) std::memcpy(slot(root, b), buf + off, m);
      arrive();
      wait_peers(op, dl);
      if (r != root) copy_out(buf + off, slot(root, b), m, bytes >= kStreamMinBytes);
    }
  }

  // ---- Zero-copy path: every rank's buffer is in a registered region (alloc_buffer) --------
  // The peers' buffers are mapped here, so the staging slots are skipped: all_reduce reduces
  // slice r straight from the N buffers into mine, then copies the other slices from their
  // owners; reduce_scatter reduces my part straight into my output; all_gather copies every
  // piece straight out of its owner's buffer. The last barrier keeps my buffer unchanged until
  // every peer finished reading it.

  // Where [p, p + bytes) lies in my regions, as (region, offset); (-1, 0) when it does not.
  std::pair<int32_t, uint64_t> locate(const void* p, size_t bytes) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t k = 0; k < regions_.size(); ++k) {
      const uint8_t* base = regions_[k].peer[static_cast<size_t>(rank())];
      if (b >= base && bytes <= regions_[k].bytes &&
          static_cast<size_t>(b - base) <= regions_[k].bytes - bytes) {
        return {static_cast<int32_t>(k), static_cast<uint64_t>(b - base)};
      }
    }
    return {-1, 0};
  }

  // Sets fp_.registered and my published location (all_gather: both buffers must be registered;
  // a rank with an empty piece publishes its output, which nobody reads).
  bool choose_registered(const Op& op) {
    reg_region_ = -1;
    reg_offset_ = 0;
    fp_.registered = 0;
    if (regions_.empty()) return false;
    const size_t es = dtype_size(op.dtype);
    const void* p = nullptr;
    size_t bytes = 0;
    const size_t total = count_layout(op.counts).total;
    switch (op.kind) {
      case OpKind::kAllReduce:
        p = op.out;
        bytes = op.count * es;
        break;
      case OpKind::kReduceScatter:
        p = op.in;
        bytes = total * es;
        break;
      case OpKind::kAllGather:
        // Both buffers: peers read my input, and a rank with an empty piece still has to agree.
        if (total == 0 || locate(op.out, total * es).first < 0) return false;
        bytes = op.counts[static_cast<size_t>(rank())] * es;
        p = bytes ? op.in : op.out;
        if (bytes == 0) bytes = total * es;
        break;
      default:
        return false;
    }
    if (bytes == 0) return false;
    // Small messages: the staging path needs one synchronisation less and the copy is cheap.
    // (The total is the same on every rank, so every rank decides alike.)
    const size_t total_bytes = (op.kind == OpKind::kAllReduce ? op.count : total) * es;
    if (total_bytes < kZeroCopyMinBytes) return false;
    auto [k, off] = locate(p, bytes);
    if (k < 0) return false;
    reg_region_ = k;
    reg_offset_ = off;
    fp_.registered = 1;
    return true;
  }

  // After the first wait: rank q's buffer as mapped here.
  const uint8_t* peer_buffer(int q) {
    const auto& c = ctl(q);
    const int32_t k = c.reg_region[seq_ % 2];
    DS_CHECK(k >= 0 && static_cast<size_t>(k) < regions_.size(), "rank {} region {}", q, k);
    return regions_[static_cast<size_t>(k)].peer[static_cast<size_t>(q)] + c.reg_offset[seq_ % 2];
  }

  void zc_all_reduce(const Op& op, Deadline dl) {
    const int n = size(), r = rank();
    const size_t es = dtype_size(op.dtype);
    const size_t unit = std::max<size_t>(1, 64 / es);
    auto* buf = static_cast<uint8_t*>(op.out);
    arrive();
    wait_peers(op, dl);
    std::vector<const uint8_t*> peer(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) peer[static_cast<size_t>(q)] = q == r ? buf : peer_buffer(q);
    std::vector<size_t> cut(static_cast<size_t>(n) + 1);
    for (int i = 0; i <= n; ++i) {
      cut[static_cast<size_t>(i)] = i == n ? op.count : seg_begin(op.count, n, i) / unit * unit;
    }
    const size_t lo = cut[static_cast<size_t>(r)], hi = cut[static_cast<size_t>(r) + 1];
    if (hi > lo) {
      std::vector<const void*> srcs(static_cast<size_t>(n));
      for (int q = 0; q < n; ++q) srcs[static_cast<size_t>(q)] = peer[static_cast<size_t>(q)] + lo * es;
      reduce_n(op.dtype, op.reduce, buf + lo * es, srcs.data(), n, hi - lo);
    }
    arrive();
    wait_peers(op, dl);
    for (int q = 0; q < n; ++q) {
      const size_t qlo = cut[static_cast<size_t>(q)], qhi = cut[static_cast<size_t>(q) + 1];
      if (q != r && qhi > qlo) {
        copy_out(buf + qlo * es, peer[static_cast<size_t>(q)] + qlo * es, (qhi - qlo) * es,
                 op.count * es >= kStreamMinAllReduceBytes);
      }
    }
    arrive();
    wait_peers(op, dl);
  }

  void zc_reduce_scatter(const Op& op, Deadline dl) {
    const int n = size(), r = rank();
    const size_t es = dtype_size(op.dtype);
    const size_t off = count_layout(op.counts).offsets[static_cast<size_t>(r)];
    arrive();
    wait_peers(op, dl);
    const size_t mine = op.counts[static_cast<size_t>(r)];
    if (mine) {
      std::vector<const void*> srcs(static_cast<size_t>(n));
      for (int q = 0; q < n; ++q) {
        const uint8_t* b = q == r ? static_cast<const uint8_t*>(op.in) : peer_buffer(q);
        srcs[static_cast<size_t>(q)] = b + off * es;
      }
      reduce_out(op, n, op.out, srcs.data(), mine, mine * es);
    }
    arrive();
    wait_peers(op, dl);
  }

  void zc_all_gather(const Op& op, Deadline dl) {
    const int n = size(), r = rank();
    const size_t es = dtype_size(op.dtype);
    auto* out = static_cast<uint8_t*>(op.out);
    arrive();
    wait_peers(op, dl);
    const auto [off, total, largest] = count_layout(op.counts);
    const size_t my_off = off[static_cast<size_t>(r)];
    const bool stream = total * es >= kStreamMinBytes;
    for (int q = 0; q < n; ++q) {
      const size_t c = op.counts[static_cast<size_t>(q)];
      // A peer with an empty piece published its output's location: nothing to read there.
      if (q != r && c) copy_out(out + off[static_cast<size_t>(q)] * es, peer_buffer(q), c * es, stream);
    }
    const size_t mine = op.counts[static_cast<size_t>(r)];
    if (mine && op.in != out + my_off * es) copy_out(out + my_off * es, op.in, mine * es, stream);
    arrive();
    wait_peers(op, dl);
  }

  void run_single(const Op& op) {
    const size_t es = dtype_size(op.dtype);
    if (op.kind == OpKind::kAllToAll && op.counts[0] > 0) std::memcpy(op.out, op.in, op.counts[0] * es);
    if ((op.kind == OpKind::kReduceScatter || op.kind == OpKind::kAllGather) &&
        op.counts[0] > 0 && op.in != op.out) {
      std::memmove(op.out, op.in, op.counts[0] * es);
    }
  }

  uint8_t* base_ = nullptr;
  size_t map_bytes_ = 0;
  size_t data_off_ = 0;
  size_t chunk_ = 0;
  uint64_t seq_ = 0;
  uint64_t chunk_counter_ = 0;
  uint64_t op_index_ = 0;
  Fingerprint fp_{};
  struct Region {
    size_t bytes = 0;
    std::vector<uint8_t*> peer;  // peer[q]: rank q's region as mapped here (mine writable)
    std::vector<std::pair<void*, size_t>> maps;
  };
  std::vector<Region> regions_;
  int32_t reg_region_ = -1;
  uint64_t reg_offset_ = 0;
  uint64_t piece_max_ = 0;  // all_to_all: published by arrive() (RankCtl::piece_max)
  std::string job_;
  bool spin_ = false;
};

}  // namespace

CommPtr make_shm_comm(BackendArgs args) { return std::make_shared<ShmComm>(args); }

}  // namespace ds::rt::comm
