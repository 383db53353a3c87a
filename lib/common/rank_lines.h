// Lines a rank writes to its stderr for `dstrain launch` to read, and their parsers. Every backend
// carries rank output to the launcher line by line, so these reach it from any node; the output
// multiplexer keeps what they say (output.h) and writes them to the rank's log file only.
//
//   dstrain-hung-rank: <world rank> <host> <what: "made no progress for 4.0 s while ...">
//       A rank named a peer hung (its progress beacon stopped). The job summary then names the
//       hung rank rather than the first rank to exit (a waiting rank, failed because of it).
//   dstrain-failed-at-step: <step>
//       A training rank failed during this step (an error left its step loop). An elastic
//       restart names the step at which the lost node was lost: the highest such step.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ds::rank_lines {

inline constexpr std::string_view kHungPrefix = "dstrain-hung-rank: ";
inline constexpr std::string_view kStepPrefix = "dstrain-failed-at-step: ";

struct HungRank {
  int world_rank = -1;
  std::string host;
  std::string what;
};

std::string hung_line(const HungRank& r);  // without the newline
std::optional<HungRank> parse_hung_line(std::string_view text);

std::string step_line(int64_t step);
std::optional<int64_t> parse_step_line(std::string_view text);

// True for a line of this protocol (either kind).
bool is_rank_line(std::string_view text);

// Writes the line and a newline to stderr with one write(2). Never throw.
void announce_hung(const HungRank& r);
void announce_failed_step(int64_t step);

}  // namespace ds::rank_lines
