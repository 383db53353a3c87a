// fork/exec with everything allocated before fork; see process.h for why not Boost.Process.
#include "launch/process.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include "common/error.h"
#include "common/strings.h"

extern char** environ;

namespace ds::launch {

ExitStatus ExitStatus::from_wait(int wstatus) {
  ExitStatus s;
  if (WIFEXITED(wstatus)) {
    s.code = WEXITSTATUS(wstatus);
  } else if (WIFSIGNALED(wstatus)) {
    s.signal = WTERMSIG(wstatus);
  } else {
    s.code = 1;
  }
  return s;
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  if (abbrev == nullptr) return fmt::format("signal {}", sig);
  return fmt::format("SIG{}", abbrev);
}

std::string ExitStatus::describe() const {
  if (signal != 0) return fmt::format("signal {} ({})", signal, signal_name(signal));
  return fmt::format("exit code {}", code);
}

std::optional<std::string> find_program(const std::string& program, const std::string& path_env) {
  auto executable = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (program.empty()) return std::nullopt;
  if (program.find('/') != std::string::npos) {
    if (executable(program)) return program;
    return std::nullopt;
  }
  for (const auto& dir : split(path_env.empty() ? "/usr/local/bin:/usr/bin:/bin" : path_env, ':')) {
    std::string cand = (dir.empty() ? std::string(".") : dir) + "/" + program;
    if (executable(cand)) return cand;
  }
  return std::nullopt;
}

namespace {

void close_quietly(int fd) {
  if (fd >= 0) ::close(fd);
}

std::string lookup_path(const EnvList& env) {
  for (const auto& [k, v] : env) {
    if (k == "PATH") return v;
  }
  const char* p = ::getenv("PATH");
  return p != nullptr ? p : "";
}

}  // namespace

Spawned spawn(const SpawnRequest& req) {
  if (req.argv.empty()) throw invalid_argument("no command to run");
  std::string program = req.argv[0];
  // A relative path with a '/' means relative to the worker's directory, not the agent's.
  if (!req.cwd.empty() && program.find('/') != std::string::npos && program[0] != '/') {
    program = req.cwd + "/" + program;
  }
  auto path = find_program(program, lookup_path(req.env));
  if (!path) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("command '{}' not found (not an executable file{})", req.argv[0],
                            req.argv[0].find('/') == std::string::npos ? " on PATH" : ""),
                "give the program's absolute path, or fix PATH with --env PATH=...");
  }

  // Everything the child needs, prepared before fork.
  std::vector<std::string> env_strings;
  env_strings.reserve(req.env.size());
  for (const auto& [k, v] : req.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = req.argv;
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int c : req.cpus) {
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &cpus);
  }

  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1}, exec_pipe[2] = {-1, -1};
  auto cleanup = [&] {
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1], exec_pipe[0], exec_pipe[1]}) {
      close_quietly(fd);
    }
  };
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0 ||
      ::pipe2(exec_pipe, O_CLOEXEC) != 0) {
    int e = errno;
    cleanup();
    throw system_error("pipe for '{}': {}", req.argv[0], errno_string(e));
  }
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    cleanup();
    close_quietly(devnull);
    throw system_error("fork for '{}': {}", req.argv[0], errno_string(e));
  }
  if (pid == 0) {
    // Child: async-signal-safe calls only.
    ::setpgid(0, 0);
    if (req.kill_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
    }
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int s : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGQUIT}) ::sigaction(s, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    if (!req.cpus.empty()) ::sched_setaffinity(0, sizeof cpus, &cpus);
    if (!req.cwd.empty() && ::chdir(req.cwd.c_str()) != 0) {
      int e = errno;
      (void)!::write(exec_pipe[1], &e, sizeof e);
      ::_exit(127);
    }
    ::execve(path->c_str(), argv.data(), envp.data());
    int e = errno;
    (void)!::write(exec_pipe[1], &e, sizeof e);
    ::_exit(127);
  }
  // Parent. Also set the group here, so that signalling the group right away cannot race the
  // child's own setpgid.
  ::setpgid(pid, pid);
  close_quietly(devnull);
  close_quietly(out_pipe[1]);
  close_quietly(err_pipe[1]);
  close_quietly(exec_pipe[1]);
  for (int fd : {out_pipe[0], err_pipe[0]}) {
    int fl = ::fcntl(fd, F_GETFL);
    ::fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  }
  Spawned s{pid, out_pipe[0], err_pipe[0], exec_pipe[0], *path};
  if (!req.defer_exec_check) confirm_exec(s);
  return s;
}

void confirm_exec(Spawned& s) {
  if (s.exec_fd < 0) return;
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(s.exec_fd, &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  close_quietly(s.exec_fd);
  s.exec_fd = -1;
  if (n > 0) {
    int st = 0;
    while (::waitpid(s.pid, &st, 0) < 0 && errno == EINTR) {
    }
    close_quietly(s.stdout_fd);
    close_quietly(s.stderr_fd);
    s.stdout_fd = s.stderr_fd = -1;
    s.pid = -1;
    throw system_error("could not start '{}': {}", s.program, errno_string(child_errno));
  }
}

void signal_group(pid_t pgid, int sig) {
  if (pgid <= 0) return;
  ::kill(-pgid, sig);
}

EnvList current_environment() {
  EnvList env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    env.emplace_back(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return env;
}

void ignore_sigpipe() {
  struct sigaction sa {};
  sa.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &sa, nullptr);
}

}  // namespace ds::launch
