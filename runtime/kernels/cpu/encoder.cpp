// Token + position embedding, forward and backward, over any storage type (kernels.h: S, G).
#include <algorithm>

#include "kernels/cpu/kernels.h"

namespace ds::rt::cpu {

template <typename S>
void encoder_forward(S* out, const int32_t* inp, const S* wte, const S* wpe, int B, int T, int C) {
#pragma omp parallel for schedule(static) if (int64_t{B} * T * C >= kParallelWork)
  for (int64_t bt = 0; bt < static_cast<int64_t>(B) * T; bt++) {
    const int t = static_cast<int>(bt % T);
    S* o = out + bt * C;
    const S* w = wte + static_cast<int64_t>(inp[bt]) * C;
    const S* p = wpe + static_cast<int64_t>(t) * C;
    for (int c = 0; c < C; c++) o[c] = from_f32<S>(to_f32(w[c]) + to_f32(p[c]));
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
        for (int c = c0; c < c1; c++) w[c] = from_f32<G>(to_f32(w[c]) + to_f32(d[c]));
      }
      if (dwpe != nullptr) {
        G* p = dwpe + static_cast<int64_t>(t) * C;
        for (int c = c0; c < c1; c++) p[c] = from_f32<G>(to_f32(p[c]) + to_f32(d[c]));
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
      for (int c = c0; c < c1; c++) w[c] = from_f32<G>(to_f32(w[c]) + to_f32(d[c]));
    }
  }
}

template <typename S>
void add_position(S* out, const S* wpe, int B, int T, int C) {
#pragma omp parallel for schedule(static) if (int64_t{B} * T * C >= kParallelWork)
  for (int64_t bt = 0; bt < static_cast<int64_t>(B) * T; bt++) {
    S* o = out + bt * C;
    const S* p = wpe + (bt % T) * C;
    for (int c = 0; c < C; c++) o[c] = from_f32<S>(to_f32(o[c]) + to_f32(p[c]));
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
