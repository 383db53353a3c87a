// The text protocol between `dstrain launch` and a remote `dstrain agent`, over the agent's
// stdin and stdout (an SSH channel). One message per line; fields separated by one space; a
// free-text field is last and escaped (backslash, newline and carriage return as \\ \n \r).
//
// launcher -> agent (stdin)            agent -> launcher (stdout)
//   token <TOKEN>        first line      store <STORE_PORT> <MASTER_PORT>   node 0, after token
//   env <KEY>=<VALUE>    any number      started <RANK> <PID>
//   start <STORE> <MASTER_PORT> <RESTART>  out <RANK> <1|2> <LINE>
//   stop [<SIGNAL>]      tear down, the  exit <RANK> code <N> | exit <RANK> signal <N>
//                        workers first
//                        sent SIGNAL
//                        (default SIGTERM)
//   dump                 the ranks dump their flight records (SIGUSR2 to those that catch it)
//   quit / end of input  tear down, exit done                      generation over
//                                        fatal <MESSAGE>           the agent cannot go on
//                                        beat <PID>                every kAgentBeatInterval,
//                                                                  from the agent's start
//
// Heartbeats: the agent writes "beat <its pid>" once a second from a thread of its own, so a
// launcher that hears nothing from a node for JobSpec::agent_timeout knows that agent is stopped,
// hung, or gone with its node or network; it fails the job naming the node, kills that agent by
// its pid where it can (SSH: a second connection) and tears the rest down.
// Anything the agent writes to stderr (its log) is shown by the launcher with the node's name.
//
// The token and the env values travel only here, never in arguments; nothing logs them.
// The world travels as JSON in the agent's arguments (world_to_json).
#pragma once

#include <signal.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/deadline.h"
#include "launch/process.h"
#include "launch/world.h"

namespace ds::launch::proto {

std::string escape(std::string_view text);
std::string unescape(std::string_view text);

// Splits "verb a b rest..." into at most `max_fields` fields; the last takes the rest verbatim.
std::vector<std::string> split_fields(std::string_view line, size_t max_fields);

// The world (nodes, slots, master address and port) as compact JSON, and back. A malformed world
// is an invalid_argument naming what is wrong.
std::string world_to_json(const World& world);
World world_from_json(std::string_view json);

// Agent -> launcher messages.
std::string msg_store(int store_port, int master_port);
std::string msg_started(int rank, long pid);
std::string msg_out(int rank, int stream, std::string_view line);
std::string msg_exit(int rank, const ExitStatus& status);
std::string msg_done();
std::string msg_fatal(std::string_view message);
std::string msg_beat(long pid);
inline constexpr Millis kAgentBeatInterval{1000};

// Launcher -> agent messages.
std::string msg_token(std::string_view token);
std::string msg_env(const std::string& key, const std::string& value);
std::string msg_start(const std::string& store_addr, int master_port, int restart_count);
std::string msg_stop(int first_signal = SIGTERM);
// "stop" -> SIGTERM, "stop 10" -> 10; nullopt when the line is not a stop.
std::optional<int> parse_stop(std::string_view line);
std::string msg_quit();
std::string msg_dump();

// What the launcher reads from an agent (remote_job.cpp), parsed and range-checked. A line whose
// verb is not the protocol's, or whose fields are not the protocol's integers, is kText: a login
// shell's or a missing program's words, shown as they are. Protocol lines with values out of range
// (a rank outside [0, world_size), a port outside 1..65535, a signal outside 1..64) are kMalformed:
// the launcher fails that node with `text` as the reason.
struct AgentMessage {
  enum class Kind { kStore, kStarted, kOut, kExit, kDone, kFatal, kBeat, kText, kMalformed };
  Kind kind = Kind::kText;
  int rank = -1;                        // kStarted, kOut, kExit
  int stream = 1;                       // kOut: 1 stdout, 2 stderr
  ExitStatus status;                    // kExit
  long pid = 0;                         // kStarted, kBeat (the agent's pid)
  int store_port = 0, master_port = 0;  // kStore
  std::string text;                     // kOut: the line; kFatal: the message; kText: the line;
                                        // kMalformed: what is wrong
};
AgentMessage parse_agent_message(std::string_view line, int world_size);

// What an agent reads from the launcher (agent_main.cpp), parsed and checked: env names are
// variable names, start's store is host:port, its master port 0..65535 (0: pick a free one) and
// its restart count >= 0. Anything else is kMalformed with `error` saying what is wrong, except an
// unknown verb (kUnknown: a newer launcher's message, ignored with a warning).
struct LauncherMessage {
  enum class Kind { kToken, kEnv, kStart, kStop, kQuit, kDump, kUnknown, kMalformed };
  Kind kind = Kind::kUnknown;
  std::string token;                         // kToken
  std::string key, value;                    // kEnv (value unescaped)
  std::string store_addr;                    // kStart
  int master_port = 0, restart_count = 0;    // kStart
  int signal = SIGTERM;                      // kStop
  std::string error;                         // kMalformed
};
LauncherMessage parse_launcher_message(std::string_view line);

}  // namespace ds::launch::proto
