// The flight recorder: every rank keeps a ring buffer of its last N collective and point-to-point
// operations (op, group, sizes, sequence number, issue/start/end times, state), so that when a
// job hangs each rank can say what it was doing. After PyTorch's NCCL flight recorder.
//
// Recording. Comm::issue records every operation of every backend (shm, Gloo, NCCL) when it is
// issued; the CPU backends mark it started when their communication thread takes it up (p2p and
// NCCL operations are started when posted/enqueued); the Work's wait (or the inline run) marks it
// completed or failed. Collectives carry a per-group sequence number that is the same on every
// rank of the group (they issue the same collectives in the same order); a send or recv carries
// its index among this rank's operations of the same kind, peer and tag on that group, which is
// the index of the matching operation on the peer.
//
// Dumps. <dir>/flight_<world rank>.json, written atomically (temp file, rename):
//   - when one of this process's Comms fails for the first time (a hung or dead peer, a timeout):
//     every surviving rank of a failed job leaves its record;
//   - on the dump signal (SIGUSR2, install_dump_signal): `kill -USR2` of `dstrain launch` makes
//     its agents signal every rank that catches it, so a live hang can be inspected without
//     stopping it.
// <dir> is DSTRAIN_FLIGHT_DIR, else DSTRAIN_LOG_DIR (what `dstrain launch --log-dir` sets for its
// ranks), else $TMPDIR (or /tmp)/dstrain-flight-<DSTRAIN_JOB_ID>. `dstrain debug hang DIR` reads
// them (flight_analysis.h).
//
// Size: DSTRAIN_FLIGHT_RECORDER_ENTRIES (default kDefaultEntries; 0 turns recording off).
// Cost: one mutex and a few stores per operation, and one small allocation for the Work wrapper.
// Thread safety: every function may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/comm.h"

namespace ds::rt::comm::flight {

inline constexpr size_t kDefaultEntries = 2048;

enum class State : uint8_t { kIssued, kStarted, kCompleted, kFailed };
const char* state_name(State s);  // "issued", "started", "completed", "failed"

// One group as this rank sees it.
struct GroupInfo {
  std::string name;
  int rank = 0;
  int size = 0;
  std::string backend;
  std::vector<int> world_ranks;  // rank q of the group is world rank world_ranks[q]
};

// What the recorder keeps of one operation (the ring's element).
struct Entry {
  uint64_t id = 0;  // this process's operation count, from 1 (0: an empty slot)
  int group = -1;   // index into the process's groups
  uint64_t seq = 0;  // collectives: per group; send/recv: per (group, kind, peer, tag)
  Comm::OpKind kind = Comm::OpKind::kBarrier;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce = ReduceOp::kSum;
  uint64_t elements = 0;  // this rank's input (send: sent; recv: received; all_gather: gathered)
  int peer = -1;          // send/recv: the peer's group rank; broadcast: the root
  int tag = 0;
  int64_t issued_us = 0, started_us = 0, ended_us = 0;  // Unix microseconds (0: not yet)
  State state = State::kIssued;
  std::string error;  // a failed operation's message (its first 300 characters)
};

// True when recording is on (DSTRAIN_FLIGHT_RECORDER_ENTRIES > 0).
bool enabled();

// A group's index, registered the first time it is seen.
int register_group(const GroupInfo& g);

// Records an operation being issued; returns its id (0 when recording is off).
uint64_t issued(int group, uint64_t seq, const Comm::Op& op);
void started(uint64_t id);
// Completed (error empty) or failed. The first final state of an entry stays.
void finished(uint64_t id, const std::string& error = {});

// A peer this rank found hung (its progress beacon stopped while this rank waited for it):
// kept in the dump ("hung_peers"), the analysis's evidence when every rank reached the same
// operation (a rank stopped inside a collective).
void note_hung_peer(int world_rank, const std::string& what);

// Wraps a backend's Work so that its wait marks the entry completed or failed.
WorkPtr track(WorkPtr work, uint64_t id);

// The whole record as JSON (the dump's content): the groups, the entries oldest first.
nlohmann::json snapshot(const std::string& reason);

// The directory dumps go to (see above) and this process's dump file in it.
std::string dump_dir();
std::string dump_path();

// Writes the dump now (atomically); returns its path, or "" when recording is off or the write
// failed (then a warning names the file). Never throws.
std::string dump(const std::string& reason);

// Dumps once per process for the first Comm failure (later failures are consequences), when the
// process is a launched job's rank (DSTRAIN_JOB_ID) or a directory is set.
void dump_on_first_failure(const std::string& message);

// Makes `signal` (SIGUSR2) dump the record: the handler only wakes a thread of this module,
// which writes the file. Call once, from the rank's main, before training.
void install_dump_signal(int signal);

}  // namespace ds::rt::comm::flight
