// The run-time dtype switch of the typed dispatch header (kernels/typed.h):
// DS_TYPED_CALL(what, s, g, body) runs `body` with the C++ types S (storage) and G (parameter
// gradients) of dtypes s and g, for exactly the combinations the CPU kernels instantiate
// (DS_FOR_EACH_STORAGE_GRAD, cpu/kernels.h), and returns; any other combination is a ds::Error
// (invalid usage) naming the kernel and the dtypes. DS_AS(X, p) is TypedPtr p as X*, checking
// that a non-null p has X's dtype (invalid usage otherwise).
// The macros stay defined after this header (typed.h uses them); nothing else should use them.
#pragma once

#include "common/error.h"
#include "core/typed_ptr.h"

namespace ds::rt::kern::typed::detail {

template <typename S>
S* as(TypedPtr p, const char* what) {
  if (p.data != nullptr && p.dtype != dtype_of<S>) {
    throw invalid_usage("{}: a {} buffer where {} was expected", what, dtype_name(p.dtype),
                        dtype_name(dtype_of<S>));
  }
  return static_cast<S*>(p.data);
}

[[noreturn]] inline void unsupported(const char* what, DType t, DType g) {
  throw invalid_usage("{}: storage {} with gradients {} is not a supported combination", what, dtype_name(t),
                      dtype_name(g));
}

}  // namespace ds::rt::kern::typed::detail

#define DS_TYPED_CASE(s, g, S_, G_, body)                                                       \
  if ((s) == ::ds::rt::dtype_of<S_> && (g) == ::ds::rt::dtype_of<G_>) {                        \
    using S [[maybe_unused]] = S_;                                                              \
    using G [[maybe_unused]] = G_;                                                              \
    body;                                                                                       \
    return;                                                                                     \
  }
#define DS_TYPED_CALL(what, s, g, body)                                                         \
  do {                                                                                          \
    DS_TYPED_CASE(s, g, float, float, body)                                                     \
    DS_TYPED_CASE(s, g, ::ds::rt::bf16, ::ds::rt::bf16, body)                                   \
    DS_TYPED_CASE(s, g, ::ds::rt::bf16, float, body)                                            \
    DS_TYPED_CASE(s, g, ::ds::rt::f16, ::ds::rt::f16, body)                                     \
    DS_TYPED_CASE(s, g, ::ds::rt::f16, float, body)                                             \
    ::ds::rt::kern::typed::detail::unsupported(what, (s), (g));                                 \
  } while (0)
#define DS_AS(X, p) ::ds::rt::kern::typed::detail::as<X>((p), __func__)
