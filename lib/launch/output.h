// Worker output, line by line: splitting byte streams into lines, the `[rank N]` console prefix,
// the console's --ranks-filter and the per-rank files of --log-dir.
//
// A line is written with one write(2), so lines from different ranks never interleave (one
// thread writes; the mutex only guards against setup threads logging at the same time).
// Deliberately not: colours, timestamps, or log rotation.
#pragma once

#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "common/rank_lines.h"

namespace ds::launch {

// Accumulates bytes and hands out complete lines (without the '\n'; a trailing '\r' is kept).
// A line longer than kMaxLine is handed out in kMaxLine pieces, so a stream without newlines
// cannot grow memory without bound.
class LineSplitter {
 public:
  static constexpr size_t kMaxLine = 64 * 1024;
  using Sink = std::function<void(std::string_view line)>;
  void feed(std::string_view bytes, const Sink& sink);
  // Hands out the unterminated rest, if any (at end of stream).
  void finish(const Sink& sink);

 private:
  std::string partial_;
};

// "0,2,5-7" -> {0,2,5,6,7}. Every rank must be < world_size; errors name the bad token and the
// option ("--ranks-filter").
std::set<int> parse_rank_set(std::string_view text, int world_size, std::string_view what);

struct OutputOptions {
  std::optional<std::set<int>> console_ranks;  // nullopt: every rank on the console
  std::string log_dir;                         // empty: no files; else <dir>/rank_<N>.log
  bool prefix = true;                          // "[rank N] " before each console line
};

class OutputMux {
 public:
  // `out_fd`/`err_fd`: where worker stdout/stderr lines go (1 and 2 normally; tests pass pipes).
  // Creates log_dir (and parents); an uncreatable directory is a system_error naming it.
  explicit OutputMux(OutputOptions options, int out_fd = 1, int err_fd = 2);
  ~OutputMux();

  // One line of a worker: stream 1 = stdout, 2 = stderr.
  void line(int rank, int stream, std::string_view text);
  // A line of the launcher itself (summaries, agent messages): to err_fd, unprefixed.
  void note(std::string_view text);
  // Marks a restart in every open log file (and forgets the generation's hung rank).
  void restart_marker(int restart_count);
  // What the workers' rank lines (common/rank_lines.h) on stderr said in this generation (the
  // lines themselves go to the log files only): the first hung rank a rank named, and the
  // highest step a rank failed in.
  std::optional<rank_lines::HungRank> hung_rank() const;
  std::optional<int64_t> failed_at_step() const;

 private:
  std::ofstream& log_for(int rank);
  void write_all(int fd, std::string_view s);

  OutputOptions options_;
  int out_fd_, err_fd_;
  mutable std::mutex mu_;
  std::map<int, std::unique_ptr<std::ofstream>> logs_;
  std::optional<rank_lines::HungRank> hung_;
  std::optional<int64_t> failed_at_step_;
};

}  // namespace ds::launch
