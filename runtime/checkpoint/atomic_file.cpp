#include "checkpoint/atomic_file.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include <fmt/format.h>

#include "common/error.h"
#include "common/progress.h"

namespace ds::rt::ckpt {

void sync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: some filesystems refuse directory fds
  ::fsync(fd);
  ::close(fd);
}

namespace {
// The message of a failed write: with a full disk (or quota, or file size limit) it says how many
// bytes the file needs and how many the filesystem has free.
std::string write_failure(const char* verb, const std::string& tmp, const std::string& path, size_t bytes, int err) {
  std::string msg = fmt::format("cannot {} {}: {}", verb, tmp, errno_string(err));
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) {
    struct statvfs fs {};
    const std::string dir = std::filesystem::path(path).parent_path().string();
    if (::statvfs(dir.empty() ? "." : dir.c_str(), &fs) == 0) {
      msg += fmt::format(" (the file needs {} bytes; {} bytes are free on the filesystem of {})", bytes,
                         static_cast<unsigned long long>(fs.f_bavail) * fs.f_frsize, dir);
    } else {
      msg += fmt::format(" (the file needs {} bytes)", bytes);
    }
  }
  return msg;
}
}  // namespace

void write_file_atomic(const std::string& path, std::string_view data) {
  write_file_atomic(path, std::span<const std::string_view>(&data, 1));
}

void write_file_atomic(const std::string& path, std::span<const std::string_view> parts) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  size_t total = 0;
  for (const auto& p : parts) total += p.size();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw system_error("cannot create {}: {}", tmp, errno_string(errno));
  for (const auto& data : parts) {
    size_t off = 0;
    while (off < data.size()) {
      // In chunks of 64 MiB, each one progress (common/progress.h): a big shard on a slow disk is
      // not a hung rank.
      ssize_t n = ::write(fd, data.data() + off, std::min<size_t>(data.size() - off, size_t{64} << 20));
      progress::bump();
      if (n < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        throw Error(ErrorKind::kSystem, write_failure("write", tmp, path, total, err),
                    "free space there (or point training.checkpoint_dir elsewhere); the previous checkpoint and "
                    "`latest` are untouched");
      }
      off += static_cast<size_t>(n);
    }
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw Error(ErrorKind::kSystem, write_failure("flush", tmp, path, total, err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw system_error("cannot rename {} to {}: {}", tmp, path, errno_string(err));
  }
  sync_dir(std::filesystem::path(path).parent_path().string());
}

std::string read_file(const std::string& path, const char* what) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw invalid_argument("cannot read {} {}: {}", what, path, errno_string(errno));
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      throw system_error("cannot read {} {}: {}", what, path, errno_string(err));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

}  // namespace ds::rt::ckpt
