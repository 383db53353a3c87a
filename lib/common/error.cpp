#include "common/error.h"

#include <cstring>

namespace ds {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "invalid argument";
    case ErrorKind::kInvalidUsage: return "invalid usage";
    case ErrorKind::kSystem: return "system error";
    case ErrorKind::kRemote: return "remote error";
    case ErrorKind::kTimeout: return "timeout";
    case ErrorKind::kInternal: return "internal error";
  }
  return "error";
}

int exit_code_for(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
    case ErrorKind::kInvalidUsage: return 2;
    case ErrorKind::kSystem:
    case ErrorKind::kRemote: return 1;
    case ErrorKind::kTimeout: return 124;
    case ErrorKind::kInternal: return 70;
  }
  return 1;
}

std::string errno_string(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer (possibly not buf).
  return std::string(strerror_r(err, buf, sizeof buf));
}

}  // namespace ds
