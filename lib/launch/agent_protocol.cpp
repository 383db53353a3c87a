#include "launch/agent_protocol.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
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

World world_from_json(std::string_view text) {
  try {
    auto j = nlohmann::json::parse(text);
    std::vector<config::NodeSlots> nodes;
    for (const auto& n : j.at("nodes")) {
      nodes.push_back({n.at("host").get<std::string>(), n.at("slots").get<std::vector<int>>()});
    }
    return make_world(nodes, j.at("master_addr").get<std::string>(),
                      j.at("master_port").get<int>());
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

}  // namespace ds::launch::proto
