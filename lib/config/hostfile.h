// Hostfiles in DeepSpeed's format, and DeepSpeed's resource filters, with errors that name the
// file and line.
//
//   # comment                 whole-line comment
//   worker-0 slots=4          one host per line: a hostname and its slot (GPU / process) count
//   worker-1 slots=4  # note  trailing comments allowed; blank lines ignored
//
// Node order is file order. Slots are numbered 0..slots-1 on each host; with GPUs a slot is the
// CUDA device index on that host.
//
// Filters (DeepSpeed's `--include` / `--exclude` syntax, as its documentation describes):
//   "worker-0@worker-1:0,2"   '@' separates hosts; a bare host means all its slots, "host:0,2"
//                             means only those slots of that host.
//   --num-nodes N             the first N hosts; --num-gpus N: the first N slots of each host.
// include with exclude, or either with num-nodes / num-gpus, is an error.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ds::config {

struct HostEntry {
  std::string host;
  int slots = 0;
  int line = 0;  // 1-based line in the hostfile, for messages
};

struct Hostfile {
  std::string path;  // as given; "<local>" for the implicit local node
  std::vector<HostEntry> hosts;
};

// Parses hostfile text; `path` is only used in messages. Throws ds::Error (invalid argument)
// naming path:line and what was expected.
Hostfile parse_hostfile(std::string_view text, const std::string& path);
// Reads and parses a file; a missing or unreadable file is an error naming it.
Hostfile load_hostfile(const std::string& path);

struct ResourceFilter {
  std::string include;  // empty: no include filter
  std::string exclude;  // empty: no exclude filter
  int num_nodes = -1;   // -1: all
  int num_gpus = -1;    // -1: all slots of each host
};

// The hosts and slots a job runs on, in hostfile order.
struct NodeSlots {
  std::string host;
  std::vector<int> slots;  // slot indices, ascending
};

// Applies the filters to the hostfile. Throws invalid_argument for conflicting filters, a host or
// slot the hostfile does not have (naming it), --num-gpus above a host's slots, and a filter that
// leaves no slots.
std::vector<NodeSlots> apply_filters(const Hostfile& hostfile, const ResourceFilter& filter);

// The implicit hostfile when none is given: the local node ("localhost") with `slots` slots.
Hostfile local_hostfile(int slots);

}  // namespace ds::config
