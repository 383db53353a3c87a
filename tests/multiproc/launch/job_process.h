// Test helper: runs `dstrain launch ...` (or any program) as a child in its own process group,
// stdout and stderr to files, with a deadline; the destructor SIGKILLs the group and every pid
// a test registered, so a failing test never leaves processes behind. Header-only.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace ds::test {

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline bool pid_alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  // A zombie still answers kill(0); look at its state.
  std::ifstream st("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(st, line);
  auto rp = line.rfind(')');
  return !(rp != std::string::npos && rp + 2 < line.size() && line[rp + 2] == 'Z');
}

// A fresh temporary directory, removed on destruction.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/ds_launch_test_XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

class JobProcess {
 public:
  // Starts argv with `env_extra` added ("K=V"), in `cwd` when not empty.
  JobProcess(std::vector<std::string> argv, const std::string& cwd = {},
             std::vector<std::string> env_extra = {}, std::vector<std::string> env_unset = {}) {
    out_ = dir_ / "stdout";
    err_ = dir_ / "stderr";
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      int o = ::open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int e = ::open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(o, 1);
      ::dup2(e, 2);
      if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(126);
      for (auto& kv : env_extra) ::putenv(kv.data());
      for (auto& k : env_unset) ::unsetenv(k.c_str());
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::setpgid(pid_, pid_);
  }
  ~JobProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(-pid_, SIGKILL);
      int st;
      ::waitpid(pid_, &st, 0);
    }
    for (pid_t p : extra_pids_) ::kill(p, SIGKILL);
  }

  pid_t pid() const { return pid_; }
  void signal(int sig) { ::kill(pid_, sig); }

  // Waits up to `timeout` for the exit; returns the status as a shell reports it (128+signal),
  // or -1 on timeout (the process is then left to the destructor).
  int wait(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int st = 0;
      pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        if (WIFEXITED(st)) return WEXITSTATUS(st);
        if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
        return -1;
      }
      if (std::chrono::steady_clock::now() > until) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  std::string out() const { return slurp(out_); }
  std::string err() const { return slurp(err_); }

  // Registers worker pids read from pid files, so the destructor kills any survivor.
  void track(pid_t p) { extra_pids_.insert(p); }

 private:
  TempDir dir_;
  std::string out_, err_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::set<pid_t> extra_pids_;
};

// Reads every rank_<N>.pid in `dir`; waits up to `timeout` until `expected` of them exist.
inline std::vector<pid_t> read_pids(const std::string& dir, size_t expected,
                                    std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  auto until = std::chrono::steady_clock::now() + timeout;
  std::vector<pid_t> pids;
  for (;;) {
    pids.clear();
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (e.path().extension() == ".pid") pids.push_back(std::atoi(slurp(e.path()).c_str()));
    }
    if (pids.size() >= expected || std::chrono::steady_clock::now() > until) return pids;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Waits until none of `pids` is alive (up to `timeout`); returns the survivors.
inline std::vector<pid_t> wait_gone(const std::vector<pid_t>& pids,
                                    std::chrono::milliseconds timeout = std::chrono::seconds(15)) {
  auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::vector<pid_t> alive;
    for (pid_t p : pids) {
      if (pid_alive(p)) alive.push_back(p);
    }
    if (alive.empty() || std::chrono::steady_clock::now() > until) return alive;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// The non-empty lines of file `path` (a metrics file's records so far; 0 when it is missing).
inline size_t nonempty_lines(const std::string& path) {
  std::ifstream in(path);
  size_t n = 0;
  std::string l;
  while (std::getline(in, l)) n += !l.empty();
  return n;
}

inline size_t count_lines_containing(const std::string& text, const std::string& needle) {
  size_t n = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) n += line.find(needle) != std::string::npos;
  return n;
}

}  // namespace ds::test
