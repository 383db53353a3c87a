#include "launch/agent_protocol.h"

#include <cctype>
#include <cstdint>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/socket.h"
#include "common/strings.h"

namespace ds::launch::proto {

std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

std::string unescape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size()) {
      char n = text[++i];
      out.push_back(n == 'n' ? '\n' : n == 'r' ? '\r' : n);
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

std::vector<std::string> split_fields(std::string_view line, size_t max_fields) {
  std::vector<std::string> out;
  while (!line.empty() && out.size() + 1 < max_fields) {
    auto sp = line.find(' ');
    if (sp == std::string_view::npos) break;
    out.emplace_back(line.substr(0, sp));
    line.remove_prefix(sp + 1);
  }
  out.emplace_back(line);
  return out;
}

std::string world_to_json(const World& world) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const auto& n : world.nodes) nodes.push_back({{"host", n.host}, {"slots", n.slots}});
  nlohmann::json j = {{"nodes", nodes},
                      {"master_addr", world.master_addr},
                      {"master_port", world.master_port}};
  return j.dump();
}

namespace {

// An integer field of the --world JSON, read only when it is a JSON integer in [lo, hi]:
// nlohmann's get<int>() converts a float or a wider integer without checking its range.
int world_int(const nlohmann::json& v, const char* what, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) throw invalid_argument("agent: malformed --world JSON: {} must be an integer, got {}", what, v.dump());
  if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(hi) : (v.get<int64_t>() < lo || v.get<int64_t>() > hi)) {
    throw invalid_argument("agent: malformed --world JSON: {} {} is not {}-{}", what, v.dump(), lo, hi);
  }
  return static_cast<int>(v.get<int64_t>());
}

// The checks the hostfile and the filters make on the launcher's side, made again on what
// arrives: a node needs a host and distinct, ascending slots 0-4095.
void check_world_nodes(const std::vector<config::NodeSlots>& nodes) {
  if (nodes.empty()) throw invalid_argument("agent: malformed --world JSON: no nodes");
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto& n = nodes[i];
    if (n.host.empty()) throw invalid_argument("agent: malformed --world JSON: node {} has no host", i);
    if (n.slots.empty()) throw invalid_argument("agent: malformed --world JSON: node {} ({}) has no slots", i, n.host);
    for (size_t k = 0; k < n.slots.size(); ++k) {
      if (n.slots[k] < 0 || n.slots[k] >= 4096 || (k > 0 && n.slots[k] <= n.slots[k - 1])) {
        throw invalid_argument("agent: malformed --world JSON: node {} ({}): slots must be distinct, ascending, 0-4095",
                               i, n.host);
      }
    }
  }
}

}  // namespace

World world_from_json(std::string_view text) {
  try {
    auto j = nlohmann::json::parse(text);
    std::vector<config::NodeSlots> nodes;
    for (const auto& n : j.at("nodes")) {
      const auto& slot_list = n.at("slots");
      if (!slot_list.is_array()) throw invalid_argument("agent: malformed --world JSON: slots must be an array, got {}", slot_list.dump());
      std::vector<int> slots;
      for (const auto& s : slot_list) slots.push_back(world_int(s, "slot", INT32_MIN, INT32_MAX));
      nodes.push_back({n.at("host").get<std::string>(), std::move(slots)});
    }
    check_world_nodes(nodes);
    const int port = world_int(j.at("master_port"), "master_port", 0, 65535);
    return make_world(nodes, j.at("master_addr").get<std::string>(), port);
  } catch (const nlohmann::json::exception& e) {
    throw invalid_argument("agent: malformed --world JSON: {}", e.what());
  }
}

std::string msg_store(int store_port, int master_port) {
  return fmt::format("store {} {}\n", store_port, master_port);
}
std::string msg_started(int rank, long pid) { return fmt::format("started {} {}\n", rank, pid); }
std::string msg_out(int rank, int stream, std::string_view line) {
  return fmt::format("out {} {} {}\n", rank, stream, escape(line));
}
std::string msg_exit(int rank, const ExitStatus& s) {
  if (s.signal != 0) return fmt::format("exit {} signal {}\n", rank, s.signal);
  return fmt::format("exit {} code {}\n", rank, s.code);
}
std::string msg_done() { return "done\n"; }
std::string msg_beat(long pid) { return fmt::format("beat {}\n", pid); }
std::string msg_fatal(std::string_view message) {
  return fmt::format("fatal {}\n", escape(message));
}
std::string msg_token(std::string_view token) { return fmt::format("token {}\n", token); }
std::string msg_env(const std::string& key, const std::string& value) {
  return fmt::format("env {}={}\n", key, escape(value));
}
std::string msg_start(const std::string& store_addr, int master_port, int restart_count) {
  return fmt::format("start {} {} {}\n", store_addr, master_port, restart_count);
}
std::string msg_stop(int first_signal) {
  return first_signal == SIGTERM ? "stop\n" : fmt::format("stop {}\n", first_signal);
}
std::optional<int> parse_stop(std::string_view line) {
  if (line == "stop") return SIGTERM;
  if (line.substr(0, 5) != "stop ") return std::nullopt;
  auto sig = parse_int(line.substr(5));
  if (!sig || *sig <= 0 || *sig >= 65) return std::nullopt;
  return static_cast<int>(*sig);
}
std::string msg_quit() { return "quit\n"; }
std::string msg_dump() { return "dump\n"; }

namespace {

using AK = AgentMessage::Kind;

bool in_range(int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; }

AgentMessage agent_msg(AK kind) {
  AgentMessage m;
  m.kind = kind;
  return m;
}

AgentMessage malformed(std::string why) {
  AgentMessage m;
  m.kind = AK::kMalformed;
  m.text = std::move(why);
  return m;
}

// "out <RANK> <1|2> <LINE>" and "exit <RANK> code|signal <N>" (f has 4 fields); "started <RANK>
// <PID>" (3). Non-integers make the line kText (m unchanged); out-of-range values kMalformed.
AgentMessage parse_rank_message(const std::vector<std::string>& f, std::string_view line, int world) {
  AgentMessage text = agent_msg(AK::kText);
  text.text = std::string(line);
  auto rank = parse_int(f[1]);
  if (!rank) return text;
  if (!in_range(*rank, 0, world - 1)) {
    return malformed(fmt::format("rank {} in '{}' is outside the job's ranks 0-{}", *rank, f[0], world - 1));
  }
  AgentMessage m;
  m.rank = static_cast<int>(*rank);
  if (f[0] == "out") {
    if (f[2] != "1" && f[2] != "2") return text;
    m.kind = AK::kOut;
    m.stream = f[2] == "2" ? 2 : 1;
    m.text = unescape(f[3]);
    return m;
  }
  auto val = parse_int(f[0] == "started" ? f[2] : f[3]);
  if (!val) return text;
  if (f[0] == "started") {
    if (*val <= 0 || *val > INT32_MAX) return malformed(fmt::format("pid {} of rank {} is not a process id", *val, *rank));
    m.kind = AK::kStarted;
    m.pid = static_cast<long>(*val);
    return m;
  }
  if (f[2] == "signal") {
    if (!in_range(*val, 1, 64)) return malformed(fmt::format("rank {} ended by signal {}: not a signal", *rank, *val));
    m.status.signal = static_cast<int>(*val);
  } else if (f[2] == "code") {
    if (!in_range(*val, 0, 255)) return malformed(fmt::format("rank {} ended with exit code {}: not 0-255", *rank, *val));
    m.status.code = static_cast<int>(*val);
  } else {
    return text;
  }
  m.kind = AK::kExit;
  return m;
}

AgentMessage parse_store_message(const std::vector<std::string>& f, std::string_view line) {
  auto sp = parse_int(f[1]);
  auto mp = parse_int(f[2]);
  if (!sp || !mp || !in_range(*sp, 1, 65535) || !in_range(*mp, 1, 65535)) {
    return malformed(fmt::format("node 0's agent sent a malformed store line '{}'", line.substr(0, 80)));
  }
  AgentMessage m = agent_msg(AK::kStore);
  m.store_port = static_cast<int>(*sp);
  m.master_port = static_cast<int>(*mp);
  return m;
}

}  // namespace

AgentMessage parse_agent_message(std::string_view line, int world_size) {
  auto f = split_fields(line, 4);
  const std::string& verb = f[0];
  if ((verb == "out" || verb == "exit") && f.size() == 4) return parse_rank_message(f, line, world_size);
  if (verb == "started" && f.size() == 3) return parse_rank_message(f, line, world_size);
  if (verb == "store" && f.size() == 3) return parse_store_message(f, line);
  if (auto pid = verb == "beat" && f.size() == 2 ? parse_int(f[1]) : std::nullopt) {
    if (*pid <= 0 || *pid > INT32_MAX) return malformed(fmt::format("heartbeat pid {} is not a process id", *pid));
    AgentMessage m = agent_msg(AK::kBeat);
    m.pid = static_cast<long>(*pid);
    return m;
  }
  if (line == "done") return agent_msg(AK::kDone);
  if (verb == "fatal") {
    AgentMessage m = agent_msg(AK::kFatal);
    m.text = unescape(line.size() > 6 ? line.substr(6) : "");
    return m;
  }
  AgentMessage m;
  m.text = std::string(line);
  return m;
}

namespace {

using LK = LauncherMessage::Kind;

LauncherMessage launcher_msg(LK kind) {
  LauncherMessage m;
  m.kind = kind;
  return m;
}

LauncherMessage launcher_malformed(std::string why) {
  LauncherMessage m = launcher_msg(LK::kMalformed);
  m.error = std::move(why);
  return m;
}

bool env_name(std::string_view k) {
  if (k.empty() || std::isdigit(static_cast<unsigned char>(k[0]))) return false;
  for (char c : k) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

LauncherMessage parse_start(std::string_view line) {
  auto f = split_fields(line, 5);
  if (f.size() != 4) return launcher_malformed("malformed start line from the launcher (expected 'start STORE PORT RESTART')");
  auto mport = parse_int(f[2]);
  auto restart = parse_int(f[3]);
  if (!mport || !in_range(*mport, 0, 65535)) return launcher_malformed("start line: master port is not 0-65535");
  if (!restart || !in_range(*restart, 0, INT32_MAX)) return launcher_malformed("start line: restart count is not a count");
  try {
    net::parse_host_port(f[1], "the store address");
  } catch (const Error& e) {
    return launcher_malformed(std::string("start line: ") + e.what());
  }
  LauncherMessage m = launcher_msg(LK::kStart);
  m.store_addr = f[1];
  m.master_port = static_cast<int>(*mport);
  m.restart_count = static_cast<int>(*restart);
  return m;
}

}  // namespace

LauncherMessage parse_launcher_message(std::string_view line) {
  if (line == "quit") return launcher_msg(LK::kQuit);
  if (line == "dump") return launcher_msg(LK::kDump);
  if (line == "stop" || starts_with(line, "stop ")) {
    auto sig = parse_stop(line);
    if (!sig) return launcher_malformed("malformed stop line from the launcher (expected 'stop [SIGNAL 1-64]')");
    LauncherMessage m = launcher_msg(LK::kStop);
    m.signal = *sig;
    return m;
  }
  if (starts_with(line, "token ")) {
    LauncherMessage m = launcher_msg(LK::kToken);
    m.token = std::string(line.substr(6));
    if (m.token.empty()) return launcher_malformed("empty job token from the launcher");
    return m;
  }
  if (starts_with(line, "env ")) {
    auto eq = line.find('=');
    if (eq == std::string_view::npos || !env_name(line.substr(4, eq - 4))) {
      return launcher_malformed("malformed env line from the launcher (expected 'env NAME=VALUE')");
    }
    LauncherMessage m = launcher_msg(LK::kEnv);
    m.key = std::string(line.substr(4, eq - 4));
    m.value = unescape(line.substr(eq + 1));
    return m;
  }
  if (starts_with(line, "start ")) return parse_start(line);
  return launcher_msg(LK::kUnknown);
}

}  // namespace ds::launch::proto
