// Fuzzes the agent protocol (lib/launch/agent_protocol.h) in both directions, as the launcher
// and the agent read it: each input line is parsed as an agent's message (for a world of 1-64
// ranks) and as the launcher's; the world's JSON (the agent's --world argument) is parsed too.
// Input: byte 0 picks the world size; the rest is lines, and the part after the first NUL is
// also tried as --world JSON.
// Invariants: every parsed rank is inside the world, ports and signals in range; escape and
// unescape round-trip; a world from JSON keeps what world_from_json checks (ranks 0..N-1,
// distinct ascending slots) and round-trips through world_to_json.
#include <string>

#include "fuzz_support.h"
#include "launch/agent_protocol.h"

using namespace ds;
using namespace ds::launch;

namespace {

void check_agent_line(std::string_view line, int world) {
  using K = proto::AgentMessage::Kind;
  proto::AgentMessage m = proto::parse_agent_message(line, world);
  if (m.kind == K::kOut || m.kind == K::kExit || m.kind == K::kStarted) DS_FUZZ_CHECK(m.rank >= 0 && m.rank < world);
  if (m.kind == K::kOut) DS_FUZZ_CHECK(m.stream == 1 || m.stream == 2);
  if (m.kind == K::kExit) {
    DS_FUZZ_CHECK((m.status.signal >= 1 && m.status.signal <= 64) ||
                  (m.status.signal == 0 && m.status.code >= 0 && m.status.code <= 255));
  }
  if (m.kind == K::kStore) DS_FUZZ_CHECK(m.store_port >= 1 && m.store_port <= 65535 && m.master_port >= 1);
  if (m.kind == K::kMalformed) DS_FUZZ_CHECK(!m.text.empty());
}

void check_launcher_line(std::string_view line) {
  using K = proto::LauncherMessage::Kind;
  proto::LauncherMessage m = proto::parse_launcher_message(line);
  if (m.kind == K::kStop) DS_FUZZ_CHECK(m.signal >= 1 && m.signal <= 64);
  if (m.kind == K::kStart) DS_FUZZ_CHECK(m.master_port >= 0 && m.master_port <= 65535 && m.restart_count >= 0);
  if (m.kind == K::kEnv) {
    DS_FUZZ_CHECK(!m.key.empty() && m.key.find('=') == std::string::npos);
    // What the launcher sends for this pair parses back to it.
    std::string sent = proto::msg_env(m.key, m.value);
    auto again = proto::parse_launcher_message(std::string_view(sent).substr(0, sent.size() - 1));
    DS_FUZZ_CHECK(again.kind == K::kEnv && again.key == m.key && again.value == m.value);
  }
  if (m.kind == K::kMalformed) DS_FUZZ_CHECK(!m.error.empty());
  DS_FUZZ_CHECK(proto::unescape(proto::escape(line)) == line);
}

void check_world(std::string_view json) {
  World w = proto::world_from_json(json);
  DS_FUZZ_CHECK(!w.nodes.empty() && w.world_size() >= 1);
  for (int r = 0; r < w.world_size(); ++r) DS_FUZZ_CHECK(w.workers[static_cast<size_t>(r)].rank == r);
  for (const auto& n : w.nodes) {
    for (size_t k = 1; k < n.slots.size(); ++k) DS_FUZZ_CHECK(n.slots[k] > n.slots[k - 1]);
  }
  World back = proto::world_from_json(proto::world_to_json(w));
  DS_FUZZ_CHECK(back.world_size() == w.world_size() && back.master_addr == w.master_addr &&
                back.master_port == w.master_port);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int world = 1 + data[0] % 64;
  std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  auto parts = fuzz::split_nul(in, 2);
  std::string_view lines = parts[0];
  while (!lines.empty()) {
    size_t nl = lines.find('\n');
    std::string_view line = lines.substr(0, nl);
    check_agent_line(line, world);
    check_launcher_line(line);
    if (nl == std::string_view::npos) break;
    lines.remove_prefix(nl + 1);
  }
  if (parts.size() > 1) fuzz::clear_error_or_value([&] { check_world(parts[1]); });
  return 0;
}
