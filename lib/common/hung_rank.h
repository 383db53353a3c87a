// The one line a rank writes to its stderr when it names a hung peer, and its parser. The rank's
// error says the same in words; this line is for `dstrain launch`, whose job summary then names
// the hung rank rather than the first rank to exit (a waiting rank, which failed because of it).
// Every backend carries rank output to the launcher, so the line reaches it from any node.
//
//   dstrain-hung-rank: <world rank> <host> <what: "made no progress for 4.0 s while ...">
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ds::hung {

inline constexpr std::string_view kLinePrefix = "dstrain-hung-rank: ";

struct Report {
  int world_rank = -1;
  std::string host;
  std::string what;
};

std::string line(const Report& r);  // without the newline
std::optional<Report> parse_line(std::string_view text);

// Writes line(r) and a newline to stderr with one write(2). Never throws.
void announce(const Report& r);

}  // namespace ds::hung
