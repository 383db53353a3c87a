// The flight recorder's ring buffer, its dumps and the dump signal (flight_recorder.h).
#include "comm/flight_recorder.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.h"

namespace ds::rt::comm::flight {

namespace {

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

size_t configured_entries() {
  const char* env = std::getenv("DSTRAIN_FLIGHT_RECORDER_ENTRIES");
  if (env == nullptr || *env == '\0') return kDefaultEntries;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  if (end == env || *end != '\0' || v < 0 || v > (1LL << 24)) {
    spdlog::warn("DSTRAIN_FLIGHT_RECORDER_ENTRIES='{}' is not a count in 0..16777216; keeping {} entries", env,
                 kDefaultEntries);
    return kDefaultEntries;
  }
  return static_cast<size_t>(v);
}

uint64_t op_elements(const Comm::Op& op) {
  if (op.kind != Comm::OpKind::kReduceScatter && op.kind != Comm::OpKind::kAllGather &&
      op.kind != Comm::OpKind::kAllToAll) {
    return op.count;
  }
  uint64_t total = 0;  // reduce_scatter, all_gather: the whole; all_to_all: what this rank sends
  for (size_t c : op.counts) total += c;
  return total;
}

class Recorder {
 public:
  Recorder() : ring_(configured_entries()) {}

  bool on() const { return !ring_.empty(); }

  int add_group(const GroupInfo& g) {
    std::lock_guard<std::mutex> lock(mu_);
    groups_.push_back(g);
    return static_cast<int>(groups_.size()) - 1;
  }

  uint64_t add(int group, uint64_t seq, const Comm::Op& op) {
    if (!on()) return 0;
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t id = ++count_;
    Entry& e = ring_[id % ring_.size()];
    e = Entry{};
    e.id = id;
    e.group = group;
    e.seq = seq;
    e.kind = op.kind;
    e.dtype = op.dtype;
    e.reduce = op.reduce;
    e.elements = op_elements(op);
    e.peer = op.peer;
    e.tag = op.tag;
    e.issued_us = now_us();
    return id;
  }

  // The entry of `id` if the ring still holds it (under mu_).
  Entry* find(uint64_t id) {
    if (id == 0 || !on()) return nullptr;
    Entry& e = ring_[id % ring_.size()];
    return e.id == id ? &e : nullptr;
  }

  void start(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry* e = find(id);
    if (e != nullptr && e->state == State::kIssued) {
      e->state = State::kStarted;
      e->started_us = now_us();
    }
  }

  void finish(uint64_t id, const std::string& error) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry* e = find(id);
    if (e == nullptr || e->state == State::kCompleted || e->state == State::kFailed) return;
    if (e->started_us == 0) e->started_us = e->issued_us;
    e->ended_us = now_us();
    e->state = error.empty() ? State::kCompleted : State::kFailed;
    e->error = error.substr(0, 300);
  }

  // This process's world rank: its rank in the group named "world", else in the first group.
  int world_rank() {
    std::lock_guard<std::mutex> lock(mu_);
    return world_rank_locked();
  }

  void add_hung_peer(int world_rank, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (hung_peers_.size() < 16) hung_peers_.push_back({{"world_rank", world_rank}, {"what", what}});
  }

  nlohmann::json snapshot(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    nlohmann::json groups = nlohmann::json::array();
    for (const auto& g : groups_) {
      groups.push_back({{"name", g.name},
                        {"rank", g.rank},
                        {"size", g.size},
                        {"backend", g.backend},
                        {"world_ranks", g.world_ranks}});
    }
    nlohmann::json entries = nlohmann::json::array();
    const uint64_t n = ring_.size();
    const uint64_t first = count_ > n ? count_ - n + 1 : 1;
    for (uint64_t id = first; id <= count_ && n > 0; ++id) {
      const Entry& e = ring_[id % n];
      if (e.id != id) continue;
      nlohmann::json j = {{"id", e.id},
                          {"group", e.group},
                          {"seq", e.seq},
                          {"op", Comm::op_name(e.kind)},
                          {"dtype", dtype_name(e.dtype)},
                          {"elements", e.elements},
                          {"bytes", e.elements * dtype_size(e.dtype)},
                          {"state", state_name(e.state)},
                          {"issued_us", e.issued_us},
                          {"started_us", e.started_us},
                          {"ended_us", e.ended_us}};
      if (e.kind == Comm::OpKind::kAllReduce || e.kind == Comm::OpKind::kReduceScatter) {
        j["reduce"] = reduce_op_name(e.reduce);
      }
      if (e.kind == Comm::OpKind::kSend || e.kind == Comm::OpKind::kRecv) {
        j["peer"] = e.peer;
        j["tag"] = e.tag;
      }
      if (e.kind == Comm::OpKind::kBroadcast) j["root"] = e.peer;
      if (!e.error.empty()) j["error"] = e.error;
      entries.push_back(std::move(j));
    }
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    return {{"format", "dstrain-flight-recorder"},
            {"version", 1},
            {"world_rank", world_rank_locked()},
            {"host", host},
            {"pid", static_cast<int64_t>(::getpid())},
            {"reason", reason},
            {"dumped_us", now_us()},
            {"capacity", ring_.size()},
            {"recorded", count_},
            {"groups", std::move(groups)},
            {"hung_peers", hung_peers_},
            {"entries", std::move(entries)}};
  }

 private:
  int world_rank_locked() const {
    int r = -1;
    for (const auto& g : groups_) {
      if (g.name == "world") return g.world_ranks[static_cast<size_t>(g.rank)];
      if (r < 0) r = g.world_ranks[static_cast<size_t>(g.rank)];
    }
    return r;
  }

  std::mutex mu_;
  std::vector<Entry> ring_;
  uint64_t count_ = 0;
  std::vector<GroupInfo> groups_;
  nlohmann::json hung_peers_ = nlohmann::json::array();
};

Recorder& recorder() {
  static Recorder* r = new Recorder();  // never destroyed: dumps may run while the process exits
  return *r;
}

// A Work whose wait records the entry's end.
class TrackedWork : public Work {
 public:
  TrackedWork(WorkPtr inner, uint64_t id) : inner_(std::move(inner)), id_(id) {}
  bool done() override { return inner_->done(); }
  void wait(Deadline deadline) override {
    try {
      inner_->wait(deadline);
    } catch (const std::exception& e) {
      if (inner_->done()) {  // else only this wait's deadline passed: the operation runs on
        recorder().finish(id_, e.what());
        dump_on_first_failure(e.what());
      }
      throw;
    }
    recorder().finish(id_, {});
  }

 private:
  WorkPtr inner_;
  uint64_t id_;
};

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

int world_rank_for_file() {
  const std::string r = env_or_empty("RANK");
  if (!r.empty()) return std::atoi(r.c_str());
  return std::max(recorder().world_rank(), 0);
}

std::atomic<bool> g_dumped_on_failure{false};
int g_signal_pipe[2] = {-1, -1};

void on_dump_signal(int) {
  const int saved = errno;
  const char b = 1;
  if (g_signal_pipe[1] >= 0) (void)!::write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

}  // namespace

const char* state_name(State s) {
  switch (s) {
    case State::kIssued: return "issued";
    case State::kStarted: return "started";
    case State::kCompleted: return "completed";
    case State::kFailed: return "failed";
  }
  return "?";
}

bool enabled() { return recorder().on(); }
int register_group(const GroupInfo& g) { return recorder().add_group(g); }
uint64_t issued(int group, uint64_t seq, const Comm::Op& op) { return recorder().add(group, seq, op); }
void started(uint64_t id) {
  if (id != 0) recorder().start(id);
}
void finished(uint64_t id, const std::string& error) {
  if (id != 0) recorder().finish(id, error);
}

void note_hung_peer(int world_rank, const std::string& what) { recorder().add_hung_peer(world_rank, what); }

WorkPtr track(WorkPtr work, uint64_t id) {
  if (id == 0) return work;
  return std::make_shared<TrackedWork>(std::move(work), id);
}

nlohmann::json snapshot(const std::string& reason) { return recorder().snapshot(reason); }

std::string dump_dir() {
  std::string dir = env_or_empty("DSTRAIN_FLIGHT_DIR");
  if (dir.empty()) dir = env_or_empty("DSTRAIN_LOG_DIR");
  if (dir.empty()) {
    std::string tmp = env_or_empty("TMPDIR");
    if (tmp.empty()) tmp = "/tmp";
    std::string job = env_or_empty("DSTRAIN_JOB_ID");
    if (job.empty()) job = fmt::format("pid{}", static_cast<long>(::getpid()));
    dir = (std::filesystem::path(tmp) / ("dstrain-flight-" + job)).string();
  }
  return dir;
}

std::string dump_path() {
  return (std::filesystem::path(dump_dir()) / fmt::format("flight_{}.json", world_rank_for_file())).string();
}

std::string dump(const std::string& reason) {
  if (!enabled()) return {};
  std::string path;
  try {
    path = dump_path();
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    const std::string text = snapshot(reason).dump(1) + "\n";
    const std::string tmp = path + fmt::format(".tmp{}", static_cast<long>(::getpid()));
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw system_error("cannot create {}: {}", tmp, errno_string(errno));
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        throw system_error("cannot write {}: {}", tmp, errno_string(err));
      }
      done += static_cast<size_t>(n);
    }
    ::close(fd);
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      throw system_error("cannot rename {} to {}: {}", tmp, path, errno_string(err));
    }
    return path;
  } catch (const std::exception& e) {
    spdlog::warn("flight recorder: no dump written ({})", e.what());
    return {};
  }
}

void dump_on_first_failure(const std::string& message) {
  if (!enabled() || g_dumped_on_failure.exchange(true)) return;
  // Outside a launched job (thread ranks, a lone process) nobody collects the records.
  if (env_or_empty("DSTRAIN_FLIGHT_DIR").empty() && env_or_empty("DSTRAIN_LOG_DIR").empty() &&
      env_or_empty("DSTRAIN_JOB_ID").empty()) {
    return;
  }
  const std::string path = dump("comm failure: " + message);
  if (!path.empty()) {
    spdlog::error("flight recorder: this rank's last operations are in {} (read every rank's with `dstrain debug "
                  "hang {}`)",
                  path, std::filesystem::path(path).parent_path().string());
  }
}

void install_dump_signal(int signal) {
  static std::once_flag once;
  std::call_once(once, [signal] {
    if (::pipe2(g_signal_pipe, O_CLOEXEC) != 0) {
      spdlog::warn("flight recorder: no dump signal ({})", errno_string(errno));
      return;
    }
    std::thread([] {
      for (;;) {
        char b;
        const ssize_t n = ::read(g_signal_pipe[0], &b, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        const std::string path = dump("dump signal");
        if (!path.empty()) spdlog::info("flight recorder: dumped to {}", path);
      }
    }).detach();
    struct sigaction sa {};
    sa.sa_handler = on_dump_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(signal, &sa, nullptr);
  });
}

}  // namespace ds::rt::comm::flight
