// Reading other processes from /proc, for the tests that kill parts of a job and check what is
// left: every process, a process's parent, children, environment and command line. A process may
// exit while it is read: every reader then answers as if it were gone ("" / 0 / skipped), never
// throws. Linux only. Header-only.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace ds::test {

// The contents of a /proc file, or "" when its process is gone (reading a file of a process that
// exits meanwhile fails with ESRCH, which libstdc++'s filebuf throws).
inline std::string read_proc_file(const std::string& path) {
  try {
    std::ifstream f(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  } catch (const std::exception&) {
    return "";
  }
}

// The pids of /proc's processes.
inline std::vector<pid_t> all_pids() {
  std::vector<pid_t> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename();
    if (!name.empty() && name.find_first_not_of("0123456789") == std::string::npos) out.push_back(std::stoi(name));
  }
  return out;
}

// Process `pid`'s parent (0 when gone).
inline pid_t parent_of(pid_t pid) {
  const std::string stat = read_proc_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 > stat.size()) return 0;
  std::istringstream rest(stat.substr(close + 2));
  char state = 0;
  pid_t ppid = 0;
  rest >> state >> ppid;
  return ppid;
}

// The children of `parent`.
inline std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (pid_t pid : all_pids()) {
    if (parent_of(pid) == parent) out.push_back(pid);
  }
  return out;
}

// Process `pid`'s environment variable `key` ("" when unset or gone).
inline std::string env_of(pid_t pid, const std::string& key) {
  const std::string env = read_proc_file("/proc/" + std::to_string(pid) + "/environ");
  const std::string k = key + "=";
  for (size_t at = 0; at < env.size();) {
    size_t end = env.find('\0', at);
    if (end == std::string::npos) end = env.size();
    if (env.compare(at, k.size(), k) == 0) return env.substr(at + k.size(), end - at - k.size());
    at = end + 1;
  }
  return "";
}

// Process `pid`'s command line, its arguments joined by spaces ("" when gone).
inline std::string cmdline_of(pid_t pid) {
  std::string cmd = read_proc_file("/proc/" + std::to_string(pid) + "/cmdline");
  for (char& c : cmd) c = c == '\0' ? ' ' : c;
  return cmd;
}

}  // namespace ds::test
