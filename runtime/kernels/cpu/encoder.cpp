// Token + position embedding, forward and backward, over any storage type (kernels.h: S, G).
#include <algorithm>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu {

namespace {
// o[c] = a[c] + b[c] in fp32, rounded once; o may be a. Multi-versioned (vmath.h) so the 16-bit
// conversions vectorise.
template <typename D, typename A, typename B>
DS_SIMD_CLONES void add_row(D* o, const A* a, const B* b, int n) {
  for (int c = 0; c < n; c++) o[c] = from_f32<D>(to_f32(a[c]) + to_f32(b[c]));
}
}  // namespace

template <typename S>
void encoder_forward(S* out, const int32_t* inp, const S* wte, const S* wpe, int B, int T, int C) {
#pragma omp parallel for schedule(static) if (int64_t{B} * T * C >= kParallelWork)
  for (int64_t bt = 0; bt < static_cast<int64_t>(B) * T; bt++) {
    const int t = static_cast<int>(bt % T);
    S* o = out + bt * C;
    const S* w = wte + static_cast<int64_t>(inp[bt]) * C;
    const S* p = wpe + static_cast<int64_t>(t) * C;
    add_row(o, w, p, C);
  }
}

template <typename S, typename G>
void encoder_backward(G* dwte, std::type_identity_t<G>* dwpe, const S* dout, const int32_t* inp, int B, int T, int C) {
  // Parallel over channel blocks: every thread walks all tokens for its channels, so repeated
  // tokens never race and the sums keep one order.
  const int kBlock = 64;
  const int nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (int64_t{B} * T * C >= kParallelWork)
  for (int cb = 0; cb < nblocks; cb++) {
    const int c0 = cb * kBlock, c1 = std::min(C, c0 + kBlock);
    for (int64_t bt = 0; bt < static_cast<int64_t>(B) * T; bt++) {
      const int t = static_cast<int>(bt % T);
      const S* d = dout + bt * C;
      if (dwte != nullptr) {
        G* w = dwte + static_cast<int64_t>(inp[bt]) * C;
        add_row(w + c0, w + c0, d + c0, c1 - c0);
      }
      if (dwpe != nullptr) {
        G* p = dwpe + static_cast<int64_t>(t) * C;
        add_row(p + c0, p + c0, d + c0, c1 - c0);
      }
    }
  }
}

template <typename S>
void encoder_forward_vocab(S* out, const int32_t* inp, const S* wte, int B, int T, int C, int v0,
                           int Vl) {
#pragma omp parallel for schedule(static) if (int64_t{B} * T * C >= kParallelWork)
  for (int64_t bt = 0; bt < static_cast<int64_t>(B) * T; bt++) {
    S* o = out + bt * C;
    const int v = inp[bt] - v0;
    if (v < 0 || v >= Vl) {
      for (int c = 0; c < C; c++) o[c] = from_f32<S>(0.0f);
      continue;
    }
    const S* w = wte + static_cast<int64_t>(v) * C;
    for (int c = 0; c < C; c++) o[c] = w[c];
  }
}

template <typename S, typename G>
void encoder_backward_vocab(G* dwte, const S* dout, const int32_t* inp, int B, int T, int C,
                            int v0, int Vl) {
  const int kBlock = 64;
  const int nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (int64_t{B} * T * C >= kParallelWork)
  for (int cb = 0; cb < nblocks; cb++) {
    const int c0 = cb * kBlock, c1 = std::min(C, c0 + kBlock);
    for (int64_t bt = 0; bt < static_cast<int64_t>(B) * T; bt++) {
      const int v = inp[bt] - v0;
      if (v < 0 || v >= Vl) continue;
      const S* d = dout + bt * C;
      G* w = dwte + static_cast<int64_t>(v) * C;
      add_row(w + c0, w + c0, d + c0, c1 - c0);
    }
  }
}

template <typename S>
void add_position(S* out, const S* wpe, int B, int T, int C) {
#pragma omp parallel for schedule(static) if (int64_t{B} * T * C >= kParallelWork)
  for (int64_t bt = 0; bt < static_cast<int64_t>(B) * T; bt++) {
    S* o = out + bt * C;
    const S* p = wpe + (bt % T) * C;
    add_row(o, o, p, C);
  }
}

#define DS_INST_S(S)                                                                          \
  template void encoder_forward<S>(S*, const int32_t*, const S*, const S*, int, int, int);    \
  template void encoder_forward_vocab<S>(S*, const int32_t*, const S*, int, int, int, int, int); \
  template void add_position<S>(S*, const S*, int, int, int);
#define DS_INST_SG(S, G)                                                                         \
  template void encoder_backward<S, G>(G*, std::type_identity_t<G>*, const S*, const int32_t*, int, int, int);         \
  template void encoder_backward_vocab<S, G>(G*, const S*, const int32_t*, int, int, int, int, int);
DS_FOR_EACH_STORAGE(DS_INST_S)
DS_FOR_EACH_STORAGE_GRAD(DS_INST_SG)

}  // namespace ds::rt::cpu
