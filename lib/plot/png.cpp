// rsvg-convert as a child: its path resolved on PATH first (so "not installed" is its own error,
// not an exec failure), stdout to /dev/null, stderr through a pipe the parent reads until EOF or
// the deadline, then the child reaped. The temporary SVG is removed on every path out.
#include "plot/png.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <vector>

#include "common/error.h"
#include "common/strings.h"

namespace ds::plot {

namespace {

std::optional<std::string> find_on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  for (const auto& dir : split(path ? path : "", ':')) {
    if (dir.empty()) continue;
    const std::string p = dir + "/" + program;
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0)
      return p;
  }
  return std::nullopt;
}

class TempFile {
 public:
  explicit TempFile(const std::string& contents) {
    path_ = (std::filesystem::temp_directory_path() / "dstrain-plot-XXXXXX.svg").string();
    const int fd = ::mkstemps(path_.data(), 4);
    if (fd < 0)
      throw system_error("cannot create a temporary file {}: {}", path_, errno_string(errno));
    size_t done = 0;
    while (done < contents.size()) {
      const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = errno;
        ::close(fd);
        ::unlink(path_.c_str());
        throw system_error("cannot write {}: {}", path_, errno_string(err));
      }
      done += static_cast<size_t>(n);
    }
    ::close(fd);
  }
  ~TempFile() { ::unlink(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exit code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("signal {}", WTERMSIG(status));
  return "unknown status";
}

}  // namespace

void write_png(const std::string& svg, const std::string& png_path, Deadline deadline) {
  const auto program = find_on_path("rsvg-convert");
  if (!program) {
    throw Error(ErrorKind::kInvalidUsage,
                fmt::format("writing {} needs rsvg-convert, which is not on PATH", png_path),
                "install librsvg2-bin (scripts/install-deps.sh), or write an SVG: -o plot.svg");
  }
  TempFile tmp(svg);
  std::vector<std::string> argv = {*program, "--format", "png", "--output", png_path, tmp.path()};
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);

  int err_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) throw system_error("pipe: {}", errno_string(errno));
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(err_pipe[0]);
    ::close(err_pipe[1]);
    throw system_error("fork for rsvg-convert: {}", errno_string(err));
  }
  if (pid == 0) {  // the child: async-signal-safe calls only, then exec
    const int null_fd = ::open("/dev/null", O_WRONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    ::execv(args[0], args.data());
    static const char kMsg[] = "exec failed\n";
    (void)!::write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
    ::_exit(127);
  }
  ::close(err_pipe[1]);
  std::string err_text;
  bool timed_out = false;
  for (;;) {
    pollfd pfd{err_pipe[0], POLLIN, 0};
    const int r = ::poll(&pfd, 1, deadline.remaining_ms());
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) {
      timed_out = true;
      break;
    }
    char buf[4096];
    const ssize_t n = ::read(err_pipe[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    err_text.append(buf, static_cast<size_t>(n));
  }
  ::close(err_pipe[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out)
    throw timeout_error("rsvg-convert did not finish writing {} in time (killed)", png_path);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string tail(trim(err_text));
    if (tail.size() > 400) tail = "..." + tail.substr(tail.size() - 400);
    throw system_error("rsvg-convert failed writing {} ({}){}{}", png_path, describe_status(status),
                       tail.empty() ? "" : ": ", tail);
  }
}

}  // namespace ds::plot
