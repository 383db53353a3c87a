// Errors for the whole of dstrain: one exception type with a small set of kinds (after NCCL's
// result codes), each mapped to a process exit code. Only `main` turns an Error into a message
// and an exit status; everything else throws with context and lets it propagate.
//
// Messages name the file, line, JSON path, rank, host or key involved; a `hint` says what to do.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace ds {

enum class ErrorKind {
  kInvalidArgument,  // bad user input: a file, flag or config value (exit 2)
  kInvalidUsage,     // a valid value used in the wrong way or order (exit 2)
  kSystem,           // an OS call failed: file, socket, process (exit 1)
  kRemote,           // another process, rank or host failed (exit 1)
  kTimeout,          // a deadline passed (exit 124, as timeout(1))
  kInternal,         // a broken invariant: a bug in dstrain (exit 70, EX_SOFTWARE)
};

const char* error_kind_name(ErrorKind kind);
int exit_code_for(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, std::string hint = {})
      : std::runtime_error(std::move(message)), kind_(kind), hint_(std::move(hint)) {}

  ErrorKind kind() const { return kind_; }
  const std::string& hint() const { return hint_; }
  int exit_code() const { return exit_code_for(kind_); }

 private:
  ErrorKind kind_;
  std::string hint_;
};

// Builders: DS_THROW-free call sites read as `throw invalid_argument("...", args...)`.
template <typename... Args>
Error invalid_argument(fmt::format_string<Args...> f, Args&&... args) {
  return Error(ErrorKind::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Error invalid_usage(fmt::format_string<Args...> f, Args&&... args) {
  return Error(ErrorKind::kInvalidUsage, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Error system_error(fmt::format_string<Args...> f, Args&&... args) {
  return Error(ErrorKind::kSystem, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Error remote_error(fmt::format_string<Args...> f, Args&&... args) {
  return Error(ErrorKind::kRemote, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Error timeout_error(fmt::format_string<Args...> f, Args&&... args) {
  return Error(ErrorKind::kTimeout, fmt::format(f, std::forward<Args>(args)...));
}

// errno as text, for system errors: "open /x: No such file or directory".
std::string errno_string(int err);

}  // namespace ds
