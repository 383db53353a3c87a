// Which rank is behind, from the flight records (flight_analysis.h).
#include "comm/flight_analysis.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "common/error.h"

namespace ds::rt::comm::flight {

namespace {

using nlohmann::json;

struct OpRecord {
  uint64_t seq = 0;
  std::string op, dtype, state;
  uint64_t elements = 0;
  int peer = -1, tag = 0;
  bool p2p = false;
  bool done() const { return state == "completed"; }
};

// One group as the analysis sees it: the same name and members on every rank.
struct GroupKey {
  std::string name;
  std::vector<int> world_ranks;
  bool operator<(const GroupKey& o) const { return std::tie(name, world_ranks) < std::tie(o.name, o.world_ranks); }
};

struct RankOps {
  std::vector<OpRecord> collectives;  // ascending seq
  std::vector<OpRecord> p2p;
  int group_rank = -1;
};

using Groups = std::map<GroupKey, std::map<int, RankOps>>;  // group -> world rank -> its operations

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::string members_text(const std::vector<int>& w) {
  const bool contiguous = !w.empty() && w.back() - w.front() + 1 == static_cast<int>(w.size()) &&
                          std::is_sorted(w.begin(), w.end());
  if (contiguous && w.size() > 2) return fmt::format("world ranks {}-{}", w.front(), w.back());
  std::string s = "world ranks ";
  for (size_t i = 0; i < w.size(); ++i) s += (i ? ", " : "") + std::to_string(w[i]);
  return s;
}

std::string op_text(const OpRecord& o) {
  return fmt::format("#{} {} ({} x {})", o.seq, o.op, o.dtype, o.elements);
}

std::string group_text(const GroupKey& g) { return fmt::format("group '{}' ({})", g.name, members_text(g.world_ranks)); }

// Reads one dump into `groups` (and its hung-peer verdicts into `hung`: world rank -> the ranks
// that named it); returns its world rank.
int read_dump(const json& d, const std::string& name, Groups& groups, std::map<int, std::vector<int>>& hung) {
  try {
    if (d.value("format", "") != "dstrain-flight-recorder") {
      throw invalid_argument("{}: not a dstrain flight record (no \"format\": \"dstrain-flight-recorder\")", name);
    }
    const int me = d.at("world_rank").get<int>();
    std::vector<GroupKey> keys;
    std::vector<int> ranks_in;
    for (const auto& g : d.at("groups")) {
      keys.push_back({g.at("name").get<std::string>(), g.at("world_ranks").get<std::vector<int>>()});
      ranks_in.push_back(g.at("rank").get<int>());
      groups[keys.back()][me].group_rank = ranks_in.back();
    }
    for (const auto& e : d.at("entries")) {
      const int gi = e.at("group").get<int>();
      if (gi < 0 || gi >= static_cast<int>(keys.size())) {
        throw invalid_argument("{}: entry {} names group {}, but the record lists {} group(s)", name,
                               e.value("id", uint64_t{0}), gi, keys.size());
      }
      OpRecord o;
      o.seq = e.at("seq").get<uint64_t>();
      o.op = e.at("op").get<std::string>();
      o.dtype = e.at("dtype").get<std::string>();
      o.state = e.at("state").get<std::string>();
      o.elements = e.at("elements").get<uint64_t>();
      o.p2p = o.op == "send" || o.op == "recv";
      if (o.p2p) {
        o.peer = e.at("peer").get<int>();
        o.tag = e.at("tag").get<int>();
      }
      RankOps& ops = groups[keys[static_cast<size_t>(gi)]][me];
      (o.p2p ? ops.p2p : ops.collectives).push_back(std::move(o));
    }
    for (const auto& h : d.value("hung_peers", json::array())) {
      auto& by = hung[h.at("world_rank").get<int>()];
      if (std::find(by.begin(), by.end(), me) == by.end()) by.push_back(me);
    }
    for (auto& [key, per_rank] : groups) {
      auto it = per_rank.find(me);
      if (it == per_rank.end()) continue;
      auto& c = it->second.collectives;
      std::sort(c.begin(), c.end(), [](const OpRecord& a, const OpRecord& b) { return a.seq < b.seq; });
    }
    return me;
  } catch (const nlohmann::json::exception& e) {
    throw invalid_argument("{}: malformed flight record: {}", name, e.what());
  }
}

const OpRecord* at_seq(const RankOps& ops, uint64_t seq) {
  for (const auto& o : ops.collectives) {
    if (o.seq == seq) return &o;
  }
  return nullptr;
}

// The first (lowest) sequence number at which two members issued different collectives.
void find_mismatch(const GroupKey& g, const std::map<int, RankOps>& per_rank, HangAnalysis& out) {
  std::map<uint64_t, std::pair<int, const OpRecord*>> first_seen;
  for (const auto& [r, ops] : per_rank) {
    for (const auto& o : ops.collectives) first_seen.try_emplace(o.seq, r, &o);
  }
  for (const auto& [seq, seen] : first_seen) {
    const OpRecord& a = *seen.second;
    for (const auto& [r, ops] : per_rank) {
      const OpRecord* o = at_seq(ops, seq);
      if (o == nullptr) continue;
      const bool sized = o->op != "all_to_all";  // its counts differ per rank by design
      if (a.op == o->op && a.dtype == o->dtype && (!sized || a.elements == o->elements)) continue;
      out.findings.push_back({fmt::format("{}: mismatched collectives at #{}: rank {} issued {} ({} x {}), rank {} "
                                          "issued {} ({} x {}); every member must issue the same collectives in the "
                                          "same order",
                                          group_text(g), seq, seen.first, a.op, a.dtype, a.elements, r, o->op,
                                          o->dtype, o->elements),
                              {}});
      return;
    }
  }
}

// "all_gather #17 on group 'world'" for the first operation rank `r` has not completed, in any
// group ("" when every recorded operation completed): where that rank itself waits.
using Waits = std::map<int, std::string>;

// The collectives of one group. A member whose last collective here completed while another
// member waits in a later one has not reached it: behind (unless it waits elsewhere: `waits`).
// A member whose last collective failed or is still pending waits, whatever its number (a rank
// that gave up on an earlier collective, or one that went on after being let run again).
void analyse_collectives(const GroupKey& g, const std::map<int, RankOps>& per_rank, const Waits& waits,
                         HangAnalysis& out) {
  uint64_t top = 0;
  for (const auto& [r, ops] : per_rank) {
    if (!ops.collectives.empty()) top = std::max(top, ops.collectives.back().seq);
  }
  if (top == 0) return;
  find_mismatch(g, per_rank, out);
  std::map<uint64_t, std::vector<int>> waiting;  // seq -> members whose last collective (not completed) it is
  std::map<uint64_t, const OpRecord*> waiting_op;
  std::vector<int> behind, missing;
  std::string behind_detail;
  for (int r : g.world_ranks) {
    auto it = per_rank.find(r);
    if (it == per_rank.end()) {
      missing.push_back(r);
      continue;
    }
    const auto& c = it->second.collectives;
    if (!c.empty() && !c.back().done()) {
      waiting[c.back().seq].push_back(r);
      waiting_op.try_emplace(c.back().seq, &c.back());
      continue;
    }
    if (!c.empty() && c.back().seq == top) continue;  // completed the group's last collective
    behind.push_back(r);
    std::string last = c.empty() ? "it has no collective on this group in its record"
                                 : fmt::format("its last is {}, completed", op_text(c.back()));
    auto w = waits.find(r);
    if (w != waits.end()) last += "; it waits in " + w->second;
    behind_detail += fmt::format("; rank {} has not issued #{} ({})", r, waiting.empty() ? top : waiting.rbegin()->first,
                                 last);
  }
  if (waiting.empty()) return;  // the group's last collective completed everywhere it was recorded
  std::string text = group_text(g) + ": ";
  bool first = true;
  for (const auto& [seq, ranks] : waiting) {
    const OpRecord& o = *waiting_op.at(seq);
    text += fmt::format("{}{} wait{} in {}{}", first ? "" : "; ", ranks_text(ranks), ranks.size() == 1 ? "s" : "",
                        op_text(o), o.state == "failed" ? " (and gave up: failed)" : "");
    first = false;
  }
  text += behind_detail;
  if (!missing.empty()) {
    text += fmt::format("; {} left no flight record (stopped, killed before it could write one, or it writes to "
                        "another directory)",
                        ranks_text(missing));
  }
  HangFinding f{text, behind};
  f.behind.insert(f.behind.end(), missing.begin(), missing.end());
  if (f.behind.empty() && waiting.size() == 1 && waiting.begin()->second.size() == g.world_ranks.size()) {
    f.text += "; every member reached it: the hang is inside the operation (the transport), or a rank stopped in it";
  }
  out.findings.push_back(std::move(f));
}

// Pending sends and receives of one group whose peer never posted the matching operation.
void analyse_p2p(const GroupKey& g, const std::map<int, RankOps>& per_rank, HangAnalysis& out) {
  for (const auto& [r, ops] : per_rank) {
    for (const auto& o : ops.p2p) {
      if (o.done() || o.peer < 0 || o.peer >= static_cast<int>(g.world_ranks.size())) continue;
      const int peer = g.world_ranks[static_cast<size_t>(o.peer)];
      const std::string what = fmt::format("{}: rank {} waits in {} #{} {} rank {} (tag {}, {} x {})", group_text(g), r,
                                           o.op, o.seq, o.op == "recv" ? "from" : "to", peer, o.tag, o.dtype,
                                           o.elements);
      auto it = per_rank.find(peer);
      if (it == per_rank.end()) {
        out.findings.push_back({what + fmt::format("; rank {} left no flight record", peer), {peer}});
        continue;
      }
      const std::string want = o.op == "recv" ? "send" : "recv";
      const OpRecord* last = nullptr;
      bool found = false;
      for (const auto& p : it->second.p2p) {
        if (p.op != want || p.peer != ops.group_rank || p.tag != o.tag) continue;
        if (last == nullptr || p.seq > last->seq) last = &p;
        found = found || p.seq == o.seq;
      }
      if (found) continue;  // both posted: not a matter of who is behind
      if (last != nullptr && !last->done()) {
        // The peer waits (or gave up) on this pair itself, at an earlier index: not behind.
        out.findings.push_back({what + fmt::format("; rank {} waits in its {} #{} (state {})", peer, want, last->seq,
                                                   last->state),
                                {}});
        continue;
      }
      out.findings.push_back(
          {what + fmt::format("; rank {} has not posted the matching {} (its last {} to rank {} with tag {} is #{})",
                              peer, want, want, r, o.tag, last ? last->seq : 0),
           {peer}});
    }
  }
}

}  // namespace

HangAnalysis analyse_hang(const std::vector<json>& dumps, const std::vector<std::string>& names) {
  HangAnalysis out;
  Groups groups;
  std::map<int, std::vector<int>> hung;
  std::set<int> have;
  for (size_t i = 0; i < dumps.size(); ++i) {
    const int r = read_dump(dumps[i], names.at(i), groups, hung);
    if (!have.insert(r).second) throw invalid_argument("{}: a second flight record of world rank {}", names[i], r);
  }
  out.ranks_with_records.assign(have.begin(), have.end());
  std::set<int> missing;
  for (const auto& [g, per_rank] : groups) {
    for (int r : g.world_ranks) {
      if (!have.count(r)) missing.insert(r);
    }
  }
  out.ranks_missing.assign(missing.begin(), missing.end());
  Waits waits;
  for (const auto& [g, per_rank] : groups) {
    for (const auto& [r, ops] : per_rank) {
      for (const auto* list : {&ops.collectives, &ops.p2p}) {
        for (const auto& o : *list) {
          if (!o.done() && !waits.count(r)) waits[r] = fmt::format("{} #{} on group '{}'", o.op, o.seq, g.name);
        }
      }
    }
  }
  const size_t seq_findings_from = out.findings.size();
  for (const auto& [g, per_rank] : groups) analyse_collectives(g, per_rank, waits, out);
  for (const auto& [g, per_rank] : groups) analyse_p2p(g, per_rank, out);
  const size_t seq_findings_to = out.findings.size();
  // The ranks' own verdicts: a peer whose progress beacon stopped while they waited for it.
  for (auto& [r, by] : hung) {
    std::sort(by.begin(), by.end());
    out.findings.push_back({fmt::format("{} saw rank {} make no progress while waiting for it (its progress beacon "
                                        "stopped: stopped, stuck in a kernel, or its node gone)",
                                        ranks_text(by), r),
                            {r}});
  }

  // The verdict: the ranks' own (beacon) verdicts when there are any, the most direct evidence;
  // else the sequence numbers, preferring ranks that do not themselves wait on someone.
  std::map<int, int> named;
  for (size_t i = seq_findings_to; i < out.findings.size(); ++i) {
    for (int r : out.findings[i].behind) ++named[r];
  }
  if (named.empty()) {
    std::map<int, int> idle;
    for (size_t i = seq_findings_from; i < seq_findings_to; ++i) {
      for (int r : std::set<int>(out.findings[i].behind.begin(), out.findings[i].behind.end())) {
        ++named[r];
        if (!waits.count(r)) ++idle[r];
      }
    }
    if (!idle.empty()) named = idle;
  }
  int most = 0;
  for (const auto& [r, n] : named) most = std::max(most, n);
  for (const auto& [r, n] : named) {
    if (n == most) out.behind.push_back(r);
  }
  if (out.behind.empty()) {
    out.verdict = out.findings.empty()
                      ? "no rank is behind: every recorded operation completed (the job was not hung in a "
                        "collective when the records were written)"
                      : "no rank is behind the others: see the findings above";
  } else {
    const bool one = out.behind.size() == 1;
    out.verdict = fmt::format("{} {} behind: the others wait for {} ({} finding(s) name {})", ranks_text(out.behind),
                              one ? "is" : "are", one ? "it" : "them", most, one ? "it" : "each");
  }
  return out;
}

HangAnalysis analyse_hang_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw invalid_argument("{}: not a directory", dir);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("flight_", 0) == 0 && e.path().extension() == ".json") files.push_back(e.path().string());
  }
  if (ec) throw invalid_argument("{}: cannot list: {}", dir, ec.message());
  if (files.empty()) {
    throw invalid_argument("{}: no flight records (flight_<rank>.json); ranks write them on a communication "
                           "failure or on SIGUSR2, into --log-dir, DSTRAIN_FLIGHT_DIR or $TMPDIR/dstrain-flight-<job id>",
                           dir);
  }
  std::sort(files.begin(), files.end());
  std::vector<json> dumps;
  for (const auto& f : files) {
    std::ifstream in(f);
    json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) throw invalid_argument("{}: not valid JSON", f);
    dumps.push_back(std::move(j));
  }
  return analyse_hang(dumps, files);
}

std::string format_hang_report(const HangAnalysis& a, const std::string& dir) {
  std::string s = fmt::format("flight records in {}: {} ({} of {})\n", dir, ranks_text(a.ranks_with_records),
                              a.ranks_with_records.size(), a.ranks_with_records.size() + a.ranks_missing.size());
  if (!a.ranks_missing.empty()) s += fmt::format("no record from {}\n", ranks_text(a.ranks_missing));
  for (const auto& f : a.findings) s += "  " + f.text + "\n";
  s += "verdict: " + a.verdict + "\n";
  return s;
}

}  // namespace ds::rt::comm::flight
