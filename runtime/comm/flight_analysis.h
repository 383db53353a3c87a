// Reading a hung job's flight records (flight_recorder.h): which rank is behind, and in which
// operation and sequence number the others wait for it. After PyTorch's flight recorder analyser:
//   - a collective group: every member issues the same collectives in the same order, so the
//     members' highest sequence numbers should agree; a member whose last collective on the group
//     is older (and completed) than the one the others wait in has not reached it: it is behind
//     (in compute, stuck, or stopped). A member without a record at all is named as such (a rank
//     stopped by SIGSTOP or killed at once cannot write one);
//   - the same sequence number with a different operation, type or size on two members is a
//     mismatch (the callers issued different collectives);
//   - a pending recv whose peer never posted the matching send (same group, tag and index) names
//     that peer; a pending send likewise.
// Deliberately not: timing heuristics. The verdict comes from sequence numbers only.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ds::rt::comm::flight {

struct HangFinding {
  std::string text;       // one line, for people
  std::vector<int> behind;  // world ranks this finding names as behind (or missing)
};

struct HangAnalysis {
  std::vector<int> ranks_with_records;  // world ranks, ascending
  std::vector<int> ranks_missing;       // members of some group without a record
  std::vector<HangFinding> findings;
  std::vector<int> behind;  // the verdict: the ranks named behind most often (ascending)
  std::string verdict;      // one line
};

// Analyses the dumps (each one rank's flight_<rank>.json, parsed). A dump that is not a flight
// record is an invalid_argument naming `names[i]` (the file) and what is wrong.
HangAnalysis analyse_hang(const std::vector<nlohmann::json>& dumps, const std::vector<std::string>& names);

// Reads every flight_*.json of `dir` and analyses them; an unreadable directory, no records or a
// malformed file is an invalid_argument naming it.
HangAnalysis analyse_hang_dir(const std::string& dir);

// The report `dstrain debug hang` prints.
std::string format_hang_report(const HangAnalysis& a, const std::string& dir);

}  // namespace ds::rt::comm::flight
