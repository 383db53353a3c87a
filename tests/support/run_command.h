// Test helper: run a command through /bin/sh and capture its exit status, stdout and stderr.
// For CLI tests that run the real dstrain binary. Header-only.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace ds::test {

struct CommandResult {
  int exit_code = -1;  // exit status, or 128+signal
  std::string out;
  std::string err;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `cmd` with /bin/sh -c, stdout and stderr captured separately (stderr through a temp file).
inline CommandResult run_command(const std::string& cmd) {
  char tmpl[] = "/tmp/ds_test_err_XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd >= 0) close(fd);
  std::string full = cmd + " 2>" + tmpl;
  CommandResult r;
  FILE* p = popen(full.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) r.exit_code = 128 + WTERMSIG(status);
  r.err = read_file(tmpl);
  unlink(tmpl);
  return r;
}

inline std::string dstrain() { return DS_DSTRAIN_BIN; }
inline std::string source_path(const std::string& rel) { return std::string(DS_SOURCE_DIR) + "/" + rel; }

}  // namespace ds::test
