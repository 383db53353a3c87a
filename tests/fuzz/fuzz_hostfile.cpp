// Fuzzes hostfiles and the resource filters (lib/config/hostfile.h) and the world built from
// them (lib/launch/world.h), as `dstrain launch` uses them.
// Input: hostfile text, then NUL-separated: --include, --exclude, --num-nodes, --num-gpus.
// Invariants of a result: every host is in the hostfile, in its order, at most once; every slot
// is one the host has, ascending and distinct; the world numbers ranks 0..N-1 node by node.
#include <set>
#include <string>

#include "common/strings.h"
#include "config/hostfile.h"
#include "fuzz_support.h"
#include "launch/world.h"

using namespace ds;

namespace {

int count_flag(std::string_view text) {
  if (text.empty()) return -1;
  auto n = parse_int(text);
  return n && *n >= -2 && *n <= 1 << 20 ? static_cast<int>(*n) : -1;
}

void check_nodes(const config::Hostfile& hf, const std::vector<config::NodeSlots>& nodes) {
  DS_FUZZ_CHECK(!nodes.empty());
  size_t next = 0;
  for (const auto& n : nodes) {
    while (next < hf.hosts.size() && hf.hosts[next].host != n.host) ++next;
    DS_FUZZ_CHECK(next < hf.hosts.size());  // in the hostfile, in its order, once
    const auto& h = hf.hosts[next++];
    DS_FUZZ_CHECK(!n.slots.empty());
    for (size_t i = 0; i < n.slots.size(); ++i) {
      DS_FUZZ_CHECK(n.slots[i] >= 0 && n.slots[i] < h.slots);
      if (i > 0) DS_FUZZ_CHECK(n.slots[i] > n.slots[i - 1]);
    }
  }
}

void check_world(const std::vector<config::NodeSlots>& nodes) {
  launch::World w = launch::make_world(nodes, "", 29500);
  DS_FUZZ_CHECK(w.nodes.size() == nodes.size());
  int rank = 0;
  for (const auto& n : w.nodes) {
    DS_FUZZ_CHECK(n.first_rank == rank);
    rank += static_cast<int>(n.slots.size());
  }
  DS_FUZZ_CHECK(rank == w.world_size());
  for (int r = 0; r < w.world_size(); ++r) DS_FUZZ_CHECK(w.workers[static_cast<size_t>(r)].rank == r);
  DS_FUZZ_CHECK(w.master_addr == nodes.front().host);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto parts = fuzz::split_nul(in, 5);
  config::Hostfile hf;
  if (!fuzz::clear_error_or_value([&] { hf = config::parse_hostfile(parts[0], "fuzz.hostfile"); })) return 0;
  DS_FUZZ_CHECK(!hf.hosts.empty());
  std::set<std::string> names;
  for (const auto& h : hf.hosts) {
    DS_FUZZ_CHECK(h.slots >= 1 && h.slots <= 4096);
    DS_FUZZ_CHECK(!h.host.empty() && names.insert(h.host).second);
  }
  config::ResourceFilter f;
  if (parts.size() > 1) f.include = std::string(parts[1]);
  if (parts.size() > 2) f.exclude = std::string(parts[2]);
  if (parts.size() > 3) f.num_nodes = count_flag(parts[3]);
  if (parts.size() > 4) f.num_gpus = count_flag(parts[4]);
  std::vector<config::NodeSlots> nodes;
  if (!fuzz::clear_error_or_value([&] { nodes = config::apply_filters(hf, f); })) return 0;
  check_nodes(hf, nodes);
  fuzz::clear_error_or_value([&] { check_world(nodes); });
  return 0;
}
