// The run-time dtype switch of the typed dispatch header (kernels/typed.h):
// DS_TYPED_CALL(what, s, g, body) runs `body` with the C++ types S (storage) and G (parameter
// gradients) of dtypes s and g, for exactly the combinations the CPU kernels instantiate
// (DS_FOR_EACH_STORAGE_GRAD, cpu/kernels.h), and returns; any other combination is a ds::Error
// (invalid usage) naming the kernel and the dtypes. DS_AS(X, p) is TypedPtr p as X*, checking
// that a non-null p has X's dtype (invalid usage otherwise).
// The macros stay defined after this header (typed.h uses them); nothing else should use them.
#pragma once

#include <string>
#include <type_traits>

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

// ---- the op list's wrappers (typed.h): TypedPtr arguments matched against a kernel's parameters --

template <typename T>
struct Type {
  using type = T;
};

// Whether argument `a` can be passed as parameter type P of one instantiation: a TypedPtr (or
// nullptr) where P is a buffer pointer, when its dtype is P's element type or it is null; any
// other argument when it converts to P.
template <typename P, typename A>
constexpr bool arg_converts() {
  if constexpr (std::is_same_v<A, TypedPtr>) return std::is_pointer_v<P>;
  else return std::is_convertible_v<const A&, P>;
}
template <typename P, typename A>
bool arg_fits(const A& a) {
  if constexpr (std::is_same_v<A, TypedPtr>) {
    using T = std::remove_cv_t<std::remove_pointer_t<P>>;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
      return a.data == nullptr || a.dtype == dtype_of<T>;
    } else {
      return a.data == nullptr;
    }
  } else {
    return true;
  }
}
template <typename P, typename A>
P arg_as(const A& a) {
  if constexpr (std::is_same_v<A, TypedPtr>) return static_cast<P>(a.data);
  else return a;
}

// Calls f with the arguments when every one fits its parameter; false (nothing called) otherwise.
template <typename... P, typename... A>
bool call_if_fits(void (*f)(P...), const A&... a) {
  static_assert(sizeof...(P) == sizeof...(A), "a typed kernel call with the wrong number of arguments");
  if constexpr ((arg_converts<P, A>() && ...)) {
    if (!(arg_fits<P>(a) && ...)) return false;
    f(arg_as<P>(a)...);
    return true;
  } else {
    return false;
  }
}

template <typename A>
void describe_arg(std::string& out, const A& a) {
  if constexpr (std::is_same_v<A, TypedPtr>) {
    if (!out.empty()) out += ", ";
    out += a.data == nullptr ? "null" : dtype_name(a.dtype);
  }
}
template <typename... A>
[[noreturn]] void no_typed_kernel(const char* what, const A&... a) {
  std::string types;
  (describe_arg(types, a), ...);
  throw invalid_usage("{}: no kernel takes buffers of {} (in argument order): storage and parameter-gradient "
                      "types are fp32/fp32, bf16/bf16, bf16/fp32, fp16/fp16 or fp16/fp32",
                      what, types);
}

// The kernel of storage S (pick(Type<S>) is &kern::name<S>) whose parameters the arguments fit.
template <typename Pick, typename... A>
void call_storage(const char* what, Pick pick, const A&... a) {
  if (call_if_fits(pick(Type<float>{}), a...) || call_if_fits(pick(Type<bf16>{}), a...) ||
      call_if_fits(pick(Type<f16>{}), a...)) {
    return;
  }
  no_typed_kernel(what, a...);
}
// The same for a kernel of storage S and parameter gradients G (pick(Type<S>, Type<G>)), over
// the combinations DS_FOR_EACH_STORAGE_GRAD instantiates.
template <typename Pick, typename... A>
void call_storage_grad(const char* what, Pick pick, const A&... a) {
  if (call_if_fits(pick(Type<float>{}, Type<float>{}), a...) ||
      call_if_fits(pick(Type<bf16>{}, Type<bf16>{}), a...) ||
      call_if_fits(pick(Type<bf16>{}, Type<float>{}), a...) ||
      call_if_fits(pick(Type<f16>{}, Type<f16>{}), a...) ||
      call_if_fits(pick(Type<f16>{}, Type<float>{}), a...)) {
    return;
  }
  no_typed_kernel(what, a...);
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
