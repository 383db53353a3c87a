// Matmul with bias, forward and backward, over any storage type (kernels.h: S, G), on oneDNN
// (cpu/onednn.h): fp32, or bf16 with fp32 accumulation.
//
// The bias goes into the forward's primitive (oneDNN adds it before the one rounding of the
// output). No GELU post-op: the MLP's backward needs the pre-activation fch as well as
// gelu(fch), so a fused GELU would still have to store both and saves only one pass over fch.
// The weight gradient accumulates into G with oneDNN's sum post-op (dweight += dout^T inp, one
// rounding per element for 16-bit G); dbias sums columns in fp32.
#include <algorithm>
#include <string>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/onednn.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu {

namespace {
// The row loops are multi-versioned (vmath.h) so the 16-bit conversions vectorise.
template <typename S>
DS_SIMD_CLONES void add_bias_row(S* o, const S* bias, int OC) {
  for (int j = 0; j < OC; j++) o[j] = from_f32<S>(to_f32(o[j]) + to_f32(bias[j]));
}

// acc[j - j0] += dout[n][j] over all rows n, for the columns [j0, j1).
template <typename S>
DS_SIMD_CLONES void column_sums(float* acc, const S* dout, int N, int OC, int j0, int j1) {
  for (int n = 0; n < N; n++) {
    const S* d = dout + static_cast<int64_t>(n) * OC;
    for (int j = j0; j < j1; j++) acc[j - j0] += to_f32(d[j]);
  }
}
}  // namespace

template <typename S>
void add_bias(S* out, const S* bias, int N, int OC) {
#pragma omp parallel for schedule(static) if (int64_t{N} * OC >= kParallelWork)
  for (int n = 0; n < N; n++) add_bias_row(out + static_cast<int64_t>(n) * OC, bias, OC);
}

template <typename S>
void matmul_forward(S* out, const S* inp, const S* weight, const S* bias, int B, int T, int C, int OC) {
  // out (N,OC) = inp (N,C) @ W^T: W (OC,C) read as a (C,OC) operand with strides (1, C).
  onednn::matmul(dtype_of<S>, {inp, C, 1}, {weight, 1, C}, bias, dtype_of<S>, out, OC, B * T, OC, C, false);
}

namespace {
template <typename S, typename G>
void bias_backward(G* dbias, const S* dout, int N, int OC) {
  // Column sums in fp32: each thread owns a block of output channels.
  const int kBlock = 64;
  const int nblocks = (OC + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (int64_t{N} * OC >= kParallelWork)
  for (int jb = 0; jb < nblocks; jb++) {
    const int j0 = jb * kBlock, j1 = std::min(OC, j0 + kBlock);
    float acc[kBlock] = {};
    column_sums(acc, dout, N, OC, j0, j1);
    for (int j = j0; j < j1; j++) dbias[j] = from_f32<G>(to_f32(dbias[j]) + acc[j - j0]);
  }
}
}  // namespace

template <typename S, typename G>
void matmul_backward(std::type_identity_t<S>* dinp, G* dweight, std::type_identity_t<G>* dbias, const S* dout, const S* inp, const S* weight, int B, int T,
                     int C, int OC) {
  const int N = B * T;
  const DType s = dtype_of<S>;
  // dinp (N,C) = dout (N,OC) @ W (OC,C).
  if (dinp != nullptr) onednn::matmul(s, {dout, OC, 1}, {weight, C, 1}, nullptr, s, dinp, C, N, C, OC, false);
  // dweight (OC,C) += dout^T (OC,N) @ inp (N,C): dout read with strides (1, OC).
  if (dweight != nullptr) onednn::matmul(s, {dout, 1, OC}, {inp, C, 1}, nullptr, dtype_of<G>, dweight, C, OC, C, N, true);
  if (dbias != nullptr) bias_backward(dbias, dout, N, OC);
}

std::string kernel_report() {
  const std::string m = onednn::report(), a = attention_report();
  return a.empty() ? m : m.empty() ? a : m + "; " + a;
}
std::string onednn_version() { return onednn::version(); }

#define DS_INST_S(S)                                                                   \
  template void add_bias<S>(S*, const S*, int, int);                                   \
  template void matmul_forward<S>(S*, const S*, const S*, const S*, int, int, int, int);
#define DS_INST_SG(S, G) \
  template void matmul_backward<S, G>(std::type_identity_t<S>*, G*, std::type_identity_t<G>*, const S*, const S*, const S*, int, int, int, int);
DS_FOR_EACH_STORAGE(DS_INST_S)
DS_FOR_EACH_STORAGE_GRAD(DS_INST_SG)

}  // namespace ds::rt::cpu
