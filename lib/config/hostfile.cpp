#include "config/hostfile.h"

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "common/error.h"
#include "common/strings.h"

namespace ds::config {

namespace {

constexpr int64_t kMaxSlots = 4096;

// "slots=N" -> N; everything else is an error naming path:line.
int parse_slots(std::string_view token, const std::string& where) {
  auto eq = token.find('=');
  std::string_view key = token.substr(0, eq);
  if (eq == std::string_view::npos || key != "slots") {
    throw invalid_argument("{}: unknown token '{}' (expected 'slots=N' after the hostname)", where,
                           token);
  }
  std::string_view value = token.substr(eq + 1);
  if (value.empty()) {
    throw invalid_argument("{}: missing slot count in '{}' (expected 'slots=N' with N >= 1)",
                           where, token);
  }
  auto n = parse_int(value);
  if (!n) {
    throw invalid_argument("{}: slot count '{}' is not an integer (expected 'slots=N' with N >= 1)",
                           where, value);
  }
  if (*n <= 0) {
    throw invalid_argument("{}: slot count must be at least 1, got {}", where, *n);
  }
  if (*n > kMaxSlots) {
    throw invalid_argument("{}: slot count {} is implausibly large (at most {})", where, *n, kMaxSlots);
  }
  return static_cast<int>(*n);
}

// Parses "a:0,2" into host and slots; a bare host gives an empty slot list (all slots).
std::map<std::string, std::vector<int>> parse_filter(const std::string& text, const char* flag) {
  std::map<std::string, std::vector<int>> out;
  for (const auto& part : split(text, '@')) {
    std::string_view item = trim(part);
    if (item.empty()) {
      throw invalid_argument("{} '{}': empty host between '@' separators", flag, text);
    }
    auto colon = item.find(':');
    std::string host(trim(item.substr(0, colon)));
    if (host.empty()) throw invalid_argument("{} '{}': missing host name before ':'", flag, text);
    if (out.count(host)) throw invalid_argument("{} '{}': host '{}' is named twice", flag, text, host);
    std::vector<int> slots;
    if (colon != std::string_view::npos) {
      std::string_view list = item.substr(colon + 1);
      for (const auto& s : split(list, ',')) {
        auto n = parse_int(trim(s));
        if (!n || *n < 0) {
          throw invalid_argument("{} '{}': slot '{}' of host '{}' is not a non-negative integer",
                                 flag, text, s, host);
        }
        if (*n >= kMaxSlots) {  // before the narrowing: 4294967295 must not become slot -1
          throw invalid_argument("{} '{}': host '{}' has no slot {} (a host has at most {} slots)", flag, text,
                                 host, *n, kMaxSlots);
        }
        slots.push_back(static_cast<int>(*n));
      }
    }
    out[host] = std::move(slots);
  }
  return out;
}

const HostEntry& find_host(const Hostfile& hf, const std::string& host, const char* flag) {
  for (const auto& h : hf.hosts) {
    if (h.host == host) return h;
  }
  throw invalid_argument("{}: host '{}' is not in the hostfile {}", flag, host, hf.path);
}

void check_slots(const HostEntry& h, const std::vector<int>& slots, const char* flag,
                 const Hostfile& hf) {
  for (int s : slots) {
    if (s >= h.slots) {
      throw invalid_argument("{}: host '{}' has no slot {} (the hostfile {} gives it slots 0-{})",
                             flag, h.host, s, hf.path, h.slots - 1);
    }
  }
}

}  // namespace

Hostfile parse_hostfile(std::string_view text, const std::string& path) {
  Hostfile hf;
  hf.path = path;
  std::map<std::string, int> seen;  // host -> line
  int line_no = 0;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    auto hash = line.find('#');
    if (hash != std::string_view::npos) line = line.substr(0, hash);
    line = trim(line);
    if (line.empty()) {
      if (end == text.size()) break;
      continue;
    }
    std::string where = fmt::format("{}:{}", path, line_no);
    std::vector<std::string_view> tokens;
    size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
      size_t j = i;
      while (j < line.size() && !std::isspace(static_cast<unsigned char>(line[j]))) ++j;
      if (j > i) tokens.push_back(line.substr(i, j - i));
      i = j;
    }
    if (tokens.size() == 1) {
      throw invalid_argument("{}: host '{}' has no slot count (expected '{} slots=N')", where,
                             tokens[0], tokens[0]);
    }
    if (tokens.size() > 2) {
      throw invalid_argument("{}: unknown token '{}' (expected exactly 'hostname slots=N')", where,
                             tokens[2]);
    }
    std::string host(tokens[0]);
    if (host.find('=') != std::string::npos) {
      throw invalid_argument("{}: expected a hostname first, got '{}'", where, host);
    }
    int slots = parse_slots(tokens[1], where);
    if (auto it = seen.find(host); it != seen.end()) {
      throw invalid_argument("{}: duplicate host '{}' (first listed on line {})", where, host,
                             it->second);
    }
    seen[host] = line_no;
    hf.hosts.push_back(HostEntry{host, slots, line_no});
    if (end == text.size()) break;
  }
  if (hf.hosts.empty()) {
    throw invalid_argument("{}: the hostfile lists no hosts (expected lines like 'worker-0 slots=4')",
                           path);
  }
  return hf;
}

Hostfile load_hostfile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw invalid_argument("cannot read hostfile {}: {}", path, errno_string(errno));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_hostfile(ss.str(), path);
}

Hostfile local_hostfile(int slots) {
  if (slots <= 0) throw invalid_argument("the local node needs at least 1 slot, got {}", slots);
  return Hostfile{"<local>", {HostEntry{"localhost", slots, 0}}};
}

std::vector<NodeSlots> apply_filters(const Hostfile& hf, const ResourceFilter& f) {
  const bool inc = !f.include.empty(), exc = !f.exclude.empty();
  const bool counts = f.num_nodes >= 0 || f.num_gpus >= 0;
  if (inc && exc) {
    throw invalid_argument("--include and --exclude cannot be used together");
  }
  if ((inc || exc) && counts) {
    throw invalid_argument("--{} cannot be combined with --num-nodes or --num-gpus",
                           inc ? "include" : "exclude");
  }
  if (f.num_nodes == 0 || f.num_nodes < -1) {
    throw invalid_argument("--num-nodes must be at least 1, got {}", f.num_nodes);
  }
  if (f.num_gpus == 0 || f.num_gpus < -1) {
    throw invalid_argument("--num-gpus must be at least 1, got {}", f.num_gpus);
  }

  std::vector<NodeSlots> out;
  if (inc) {
    auto want = parse_filter(f.include, "--include");
    for (const auto& [host, slots] : want) check_slots(find_host(hf, host, "--include"), slots, "--include", hf);
    for (const auto& h : hf.hosts) {
      auto it = want.find(h.host);
      if (it == want.end()) continue;
      NodeSlots ns{h.host, {}};
      if (it->second.empty()) {
        for (int s = 0; s < h.slots; ++s) ns.slots.push_back(s);
      } else {
        std::set<int> uniq(it->second.begin(), it->second.end());
        ns.slots.assign(uniq.begin(), uniq.end());
      }
      out.push_back(std::move(ns));
    }
  } else if (exc) {
    auto drop = parse_filter(f.exclude, "--exclude");
    for (const auto& [host, slots] : drop) check_slots(find_host(hf, host, "--exclude"), slots, "--exclude", hf);
    for (const auto& h : hf.hosts) {
      auto it = drop.find(h.host);
      if (it != drop.end() && it->second.empty()) continue;  // whole host excluded
      std::set<int> gone;
      if (it != drop.end()) gone.insert(it->second.begin(), it->second.end());
      NodeSlots ns{h.host, {}};
      for (int s = 0; s < h.slots; ++s) {
        if (!gone.count(s)) ns.slots.push_back(s);
      }
      if (!ns.slots.empty()) out.push_back(std::move(ns));
    }
  } else {
    size_t n = hf.hosts.size();
    if (f.num_nodes > 0) {
      if (static_cast<size_t>(f.num_nodes) > n) {
        throw invalid_argument("--num-nodes {} is more than the {} host(s) in {}", f.num_nodes, n,
                               hf.path);
      }
      n = static_cast<size_t>(f.num_nodes);
    }
    for (size_t i = 0; i < n; ++i) {
      const auto& h = hf.hosts[i];
      int k = h.slots;
      if (f.num_gpus > 0) {
        if (f.num_gpus > h.slots) {
          throw invalid_argument("--num-gpus {} is more than the {} slot(s) of host '{}' in {}",
                                 f.num_gpus, h.slots, h.host, hf.path);
        }
        k = f.num_gpus;
      }
      NodeSlots ns{h.host, {}};
      for (int s = 0; s < k; ++s) ns.slots.push_back(s);
      out.push_back(std::move(ns));
    }
  }
  if (out.empty()) {
    throw invalid_argument("the filters leave no slots to run on (hostfile {})", hf.path);
  }
  return out;
}

}  // namespace ds::config
