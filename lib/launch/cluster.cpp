// Finding and checking srun / mpirun / mpiexec, and splitting --launcher-args (cluster.h).
#include "launch/cluster.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"
#include "launch/process.h"

namespace ds::launch {

namespace {

struct ProgramSpec {
  std::vector<std::string> names;
  const char* package;
  std::vector<std::string> version_marks;  // `--version` must print one; empty: not checked
  const char* flavour;
};

ProgramSpec program_spec(Backend b) {
  switch (b) {
    case Backend::kSlurm:
      return {{"srun"}, "slurm-client", {}, "Slurm"};
    // Open MPI 4 says "mpirun (OpenRTE) 4.1.4", Open MPI 5 "mpirun (Open MPI) 5.0.3".
    case Backend::kOpenMpi:
      return {{"mpirun.openmpi", "mpirun"}, "openmpi-bin", {"OpenRTE", "Open MPI"}, "Open MPI"};
    default:
      return {{"mpiexec.hydra", "mpirun.mpich", "mpiexec.mpich", "mpiexec"},
              "mpich",
              {"HYDRA"},
              "MPICH"};
  }
}

// `program --version`'s stdout and stderr together, waiting at most 10 s ("" when it hangs).
std::string version_text(const std::string& program) {
  SpawnRequest req;
  req.argv = {program, "--version"};
  req.env = current_environment();
  Spawned s = spawn(req);
  std::string out;
  Deadline deadline = Deadline::after(Millis(10000));
  int open = 2;
  while (open > 0 && !deadline.expired()) {
    pollfd p[2] = {{s.stdout_fd, POLLIN, 0}, {s.stderr_fd, POLLIN, 0}};
    ::poll(p, 2, deadline.remaining_ms());
    for (auto& fd : {&s.stdout_fd, &s.stderr_fd}) {
      if (*fd < 0) continue;
      char buf[4096];
      ssize_t n = ::read(*fd, buf, sizeof buf);
      if (n > 0) out.append(buf, static_cast<size_t>(n));
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        ::close(*fd);
        *fd = -1;
        --open;
      }
    }
  }
  signal_group(s.pid, SIGKILL);
  int st = 0;
  ::waitpid(s.pid, &st, 0);
  for (int fd : {s.stdout_fd, s.stderr_fd}) {
    if (fd >= 0) ::close(fd);
  }
  return out;
}

}  // namespace

std::string cluster_program_label(Backend b) {
  return b == Backend::kSlurm ? "srun" : b == Backend::kOpenMpi ? "mpirun" : "mpiexec";
}

std::string find_cluster_program(Backend b) {
  const ProgramSpec spec = program_spec(b);
  const char* path = std::getenv("PATH");
  for (const auto& name : spec.names) {
    auto found = find_program(name, path != nullptr ? path : "");
    if (!found) continue;
    if (spec.version_marks.empty()) return *found;
    std::string v = version_text(*found);
    for (const auto& mark : spec.version_marks) {
      if (v.find(mark) != std::string::npos) return *found;
    }
    std::string first_line = v.substr(0, v.find('\n'));
    throw Error(ErrorKind::kInvalidUsage,
                fmt::format("{} is not {}'s launcher (its --version says: '{}')", *found,
                            spec.flavour, first_line),
                fmt::format("install {} (Debian package {}), or use the --launcher that matches it",
                            spec.flavour, spec.package));
  }
  throw Error(ErrorKind::kInvalidUsage,
              fmt::format("--launcher {} needs {}'s {}, but none of {} is on PATH", backend_name(b),
                          spec.flavour, cluster_program_label(b), fmt::join(spec.names, ", ")),
              fmt::format("install it (Debian package {}) or put it on PATH", spec.package));
}

std::vector<std::string> split_launcher_args(const std::string& text) {
  std::vector<std::string> words;
  std::string cur;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (quote == '\'') {
      if (c == '\'')
        quote = 0;
      else
        cur.push_back(c);
      continue;
    }
    if (c == '\\' && i + 1 < text.size() &&
        (quote == 0 || std::string("\"\\$`").find(text[i + 1]) != std::string::npos)) {
      cur.push_back(text[++i]);
      in_word = true;
      continue;
    }
    if (quote == '"') {
      if (c == '"')
        quote = 0;
      else
        cur.push_back(c);
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(cur);
      cur.clear();
      in_word = false;
    } else {
      cur.push_back(c);
      in_word = true;
    }
  }
  if (quote != 0) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("--launcher-args: unterminated {} quote in '{}'",
                            quote == '"' ? "double" : "single", text),
                "close the quote (the value is split into words as a shell would)");
  }
  if (in_word) words.push_back(cur);
  return words;
}

}  // namespace ds::launch
