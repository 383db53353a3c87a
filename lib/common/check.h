// Invariant checks. DS_CHECK guards internal invariants (a failure is a dstrain bug);
// argument checks at public boundaries throw ds::invalid_argument with a message instead.
#pragma once

#include "common/error.h"

#define DS_CHECK(cond, ...)                                                                  \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      throw ::ds::Error(::ds::ErrorKind::kInternal,                                          \
                        ::fmt::format("internal check failed at {}:{}: {} ({})", __FILE__,   \
                                      __LINE__, #cond, ::fmt::format("" __VA_ARGS__)));      \
    }                                                                                        \
  } while (0)

// Throws a system error naming the call and errno when `expr` returns -1.
#define DS_SYSCHECK(expr, what)                                                   \
  do {                                                                            \
    if ((expr) == -1) {                                                           \
      int ds_err_ = errno;                                                        \
      throw ::ds::system_error("{}: {}", (what), ::ds::errno_string(ds_err_));    \
    }                                                                             \
  } while (0)
