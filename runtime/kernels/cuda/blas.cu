// Matrix products on the GPU through cuBLAS (gemm, matmul backward) and cuBLASLt (matmul forward
// with the bias fused as an epilogue), plus the column-sum kernel for bias gradients.
//
// Row-major on top of column-major cuBLAS: a row-major X (rows, cols, row stride ld) is the
// column-major X^T with the same ld, so row-major C = op(A) op(B) is computed as the column-major
// C^T = op(B)^T op(A)^T: cuBLAS gets (B, A) swapped, m = N, n = M.
//
// Handles: one cuBLAS and one cuBLASLt handle per (host thread, device), created on first use and
// kept for the thread's life (a handle must not be used by two threads at once), plus a 32 MiB
// cuBLASLt workspace per (thread, device) from cudaMalloc, outside the tagged allocator.
//
// Math: the fp32 products (gemm, matmul_forward, matmul_backward) compute in the calling thread's
// MatmulMath (kernels.h): cuBLAS's default fp32 math (cublasSgemm; cuBLASLt CUBLAS_COMPUTE_32F)
// or CUBLAS_COMPUTE_32F_FAST_16BF (cublasGemmEx and cuBLASLt over fp32 storage: bf16 tensor-core
// multiplies, fp32 accumulation).
//
// bf16 storage (kernels.h, namespace typed): the same products over CUDA_R_16BF operands with
// CUBLAS_COMPUTE_32F, whatever the MatmulMath. Every output is rounded once, as oneDNN's on the
// CPU: the forward's bias goes in through the cuBLASLt epilogue, or is copied into the output
// first and the GEMM runs with beta = 1 (cuBLAS adds beta * C in fp32 before its one rounding);
// dweight += dout^T inp is a GEMM with beta = 1 whose C is the gradient buffer in its own type
// (bf16, or fp32 for grad_accum_dtype fp32).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <type_traits>

#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels.h"

namespace ds::rt::cuda {

namespace {

constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

thread_local MatmulMath t_matmul_math = MatmulMath::kFp32;

// cuBLAS's compute type for fp32 storage under this thread's math.
cublasComputeType_t fp32_compute_type() {
  return t_matmul_math == MatmulMath::kBf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
}

struct Handles {
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  float* scratch = nullptr;  // reduction_scratch (column_sums.cuh)
  size_t scratch_floats = 0;
};

// Per-thread handles by device; released at thread exit (errors then are ignored: the context may
// already be gone at process exit).
struct ThreadHandles {
  std::map<int, Handles> by_device;
  ~ThreadHandles() {
    for (auto& [dev, h] : by_device) {
      if (h.scratch != nullptr) cudaFree(h.scratch);
      if (h.workspace != nullptr) cudaFree(h.workspace);
      if (h.lt != nullptr) cublasLtDestroy(h.lt);
      if (h.blas != nullptr) cublasDestroy(h.blas);
    }
  }
};

Handles& handles() {
  thread_local ThreadHandles th;
  int dev = 0;
  DS_CUDA_CHECK(cudaGetDevice(&dev));
  auto it = th.by_device.find(dev);
  if (it != th.by_device.end()) return it->second;
  Handles h;
  DS_CUBLAS_CHECK(cublasCreate(&h.blas));
  DS_CUBLAS_CHECK(cublasLtCreate(&h.lt));
  DS_CUDA_CHECK(cudaMalloc(&h.workspace, kLtWorkspaceBytes));
  return th.by_device.emplace(dev, h).first->second;
}

}  // namespace

float* reduction_scratch(size_t floats) {
  Handles& h = handles();
  if (floats > h.scratch_floats) {
    if (h.scratch != nullptr) {
      DS_CUDA_CHECK(cudaDeviceSynchronize());  // a queued kernel may still read the old buffer
      DS_CUDA_CHECK(cudaFree(h.scratch));
      h.scratch = nullptr;
      h.scratch_floats = 0;
    }
    const size_t n = std::max<size_t>(floats, size_t{1} << 18);  // 1 MiB at least
    DS_CUDA_CHECK(cudaMalloc(&h.scratch, n * sizeof(float)));
    h.scratch_floats = n;
  }
  return h.scratch;
}

namespace {

cublasHandle_t blas_on(cudaStream_t stream) {
  cublasHandle_t h = handles().blas;
  DS_CUBLAS_CHECK(cublasSetStream(h, stream));
  return h;
}

cublasOperation_t op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

// dbias[c] += sum over rows of dout[r, c] (fp32 sums in a fixed order, one rounding into G),
// over row chunks (column_sums.cuh).
template <typename S>
struct BiasTerm {
  const S* dout;
  int OC;
  __device__ void operator()(int64_t r, int c, float (&acc)[1]) const { acc[0] += ld(dout + r * OC + c); }
};
template <typename G>
struct AddInto {
  G* out;
  __device__ void operator()(int c, const float (&sum)[1]) const { st(out + c, ld(out + c) + sum[0]); }
};

template <typename S, typename G>
void column_sum(G* dbias, const S* dout, int64_t rows, int OC, cudaStream_t stream) {
  if (dbias == nullptr || OC <= 0) return;
  column_sums::run<1>(rows, OC, BiasTerm<S>{dout, OC}, AddInto<G>{dbias}, stream);
}

// out[r, c] = bias[c] for the n = rows * OC elements of out (a copy: no rounding).
template <typename S>
__global__ void bias_rows_kernel(S* out, const S* bias, int OC, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = bias[i % OC];
  }
}

template <typename G>
constexpr cudaDataType_t cuda_type() {
  return std::is_same_v<G, float> ? CUDA_R_32F : CUDA_R_16BF;
}

// The largest power of two (at most 256) dividing the address.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

// out^T (OC, BT) = W^T-as-stored ... see the file comment: cublasLtMatmul with A = weight
// (stored column-major as (C, OC), transposed), B = inp (stored (C, BT)), D = out (stored (OC, BT)),
// and the bias (OC) added to every column of D. Returns false when cuBLASLt has no algorithm.
// `type` is the storage of all four (CUDA_R_32F or CUDA_R_16BF), `compute` cuBLAS's compute type.
bool lt_matmul_bias(void* out, const void* inp, const void* weight, const void* bias,
                    cudaDataType_t type, cublasComputeType_t compute, int BT, int C, int OC,
                    cudaStream_t stream) {
  Handles& h = handles();
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld_ = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  bool ok = false;
  try {
    DS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    DS_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    DS_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    DS_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    DS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                   sizeof(bias)));
    DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, type, C, OC, C));
    DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, type, C, BT, C));
    DS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld_, type, OC, BT, OC));
    DS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kLtWorkspaceBytes;
    DS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    // The heuristic assumes 256-byte aligned matrices unless told: our views into flat buffers
    // may be aligned to 4 bytes only, so state each pointer's real alignment.
    const uint32_t al_a = alignment_of(weight), al_b = alignment_of(inp), al_d = alignment_of(out);
    DS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
    DS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
    DS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d)));
    DS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)));
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    const cublasStatus_t hs =
        cublasLtMatmulAlgoGetHeuristic(h.lt, desc, la, lb, ld_, ld_, pref, 1, &heur, &found);
    if (hs == CUBLAS_STATUS_SUCCESS && found > 0) {
      const float alpha = 1.0f, beta = 0.0f;
      DS_CUBLAS_CHECK(cublasLtMatmul(h.lt, desc, &alpha, weight, la, inp, lb, &beta, out, ld_, out,
                                     ld_, &heur.algo, h.workspace, kLtWorkspaceBytes, stream));
      ok = true;
    }
  } catch (...) {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (ld_ != nullptr) cublasLtMatrixLayoutDestroy(ld_);
    if (lb != nullptr) cublasLtMatrixLayoutDestroy(lb);
    if (la != nullptr) cublasLtMatrixLayoutDestroy(la);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
    throw;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(ld_);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatmulDescDestroy(desc);
  return ok;
}

}  // namespace

void set_matmul_math(MatmulMath m) { t_matmul_math = m; }
MatmulMath matmul_math() { return t_matmul_math; }

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc, cudaStream_t stream) {
  if (M <= 0 || N <= 0) return;
  if (t_matmul_math == MatmulMath::kFp32) {
    DS_CUBLAS_CHECK(cublasSgemm(blas_on(stream), op(trans_b), op(trans_a), N, M, K, &alpha, B, ldb,
                                A, lda, &beta, C, ldc));
    return;
  }
  // fp32 A, B, C in memory; cuBLAS converts A and B to bf16 for the tensor cores, accumulates and
  // applies alpha, beta in fp32 (the scale type of every CUBLAS_COMPUTE_32F_* compute type).
  DS_CUBLAS_CHECK(cublasGemmEx(blas_on(stream), op(trans_b), op(trans_a), N, M, K, &alpha, B,
                               CUDA_R_32F, ldb, A, CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc,
                               fp32_compute_type(), CUBLAS_GEMM_DEFAULT));
}

namespace {
// Row-major C (type ctype) = alpha * op(A) op(B) + beta * C over bf16 A and B, fp32 accumulation
// (CUBLAS_COMPUTE_32F), alpha and beta applied in fp32 before the one rounding of C.
void gemm_bf16_operands(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                        const void* A, int lda, const void* B, int ldb, float beta, void* C,
                        cudaDataType_t ctype, int ldc, cudaStream_t stream) {
  if (M <= 0 || N <= 0) return;
  DS_CUBLAS_CHECK(cublasGemmEx(blas_on(stream), op(trans_b), op(trans_a), N, M, K, &alpha, B,
                               CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda, &beta, C, ctype, ldc,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A,
               int lda, const uint16_t* B, int ldb, float beta, uint16_t* C, int ldc,
               cudaStream_t stream) {
  gemm_bf16_operands(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, CUDA_R_16BF, ldc,
                     stream);
}

namespace {

// The fp32 products (typed::matmul_*<float>), in this thread's MatmulMath.
void matmul_forward_f32(float* out, const float* inp, const float* weight, const float* bias, int B,
                        int T, int C, int OC, cudaStream_t stream) {
  const int BT = B * T;
  if (BT <= 0 || OC <= 0) return;
  // cuBLASLt's bias epilogue only with a 16-byte aligned bias (no preference describes the bias
  // alignment; llm.c requires the same); otherwise the plain product and add_bias.
  if (bias != nullptr && C > 0 && alignment_of(bias) >= 16 &&
      lt_matmul_bias(out, inp, weight, bias, CUDA_R_32F, fp32_compute_type(), BT, C, OC, stream)) {
    return;
  }
  gemm(false, true, BT, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC, stream);
  if (bias != nullptr) typed::add_bias(out, bias, BT, OC, stream);
}

void matmul_backward_f32(float* dinp, float* dweight, float* dbias, const float* dout,
                         const float* inp, const float* weight, int B, int T, int C, int OC,
                         cudaStream_t stream) {
  const int BT = B * T;
  if (BT <= 0) return;
  if (dinp != nullptr) gemm(false, false, BT, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C, stream);
  if (dweight != nullptr) gemm(true, false, OC, C, BT, 1.0f, dout, OC, inp, C, 1.0f, dweight, C, stream);
  column_sum(dbias, dout, BT, OC, stream);
}

}  // namespace

namespace typed {

template <typename S>
void matmul_forward(S* out, const S* inp, const S* weight, const S* bias, int B, int T, int C,
                    int OC, cudaStream_t stream) {
  if constexpr (std::is_same_v<S, float>) {
    matmul_forward_f32(out, inp, weight, bias, B, T, C, OC, stream);
  } else {
    const int BT = B * T;
    if (BT <= 0 || OC <= 0) return;
    if (bias != nullptr && C > 0 && alignment_of(bias) >= 16 &&
        lt_matmul_bias(out, inp, weight, bias, CUDA_R_16BF, CUBLAS_COMPUTE_32F, BT, C, OC, stream)) {
      return;
    }
    float beta = 0.0f;
    if (bias != nullptr) {
      const int64_t n = int64_t{BT} * OC;
      bias_rows_kernel<S><<<elementwise_blocks(n, 256), 256, 0, stream>>>(out, bias, OC, n);
      DS_CUDA_CHECK_LAUNCH("bias_rows_kernel");
      beta = 1.0f;
    }
    gemm_bf16_operands(false, true, BT, OC, C, 1.0f, inp, C, weight, C, beta, out, CUDA_R_16BF, OC,
                       stream);
  }
}

template <typename S, typename G>
void matmul_backward(S* dinp, G* dweight, G* dbias, const S* dout, const S* inp, const S* weight,
                     int B, int T, int C, int OC, cudaStream_t stream) {
  if constexpr (std::is_same_v<S, float>) {
    matmul_backward_f32(dinp, dweight, dbias, dout, inp, weight, B, T, C, OC, stream);
  } else {
    const int BT = B * T;
    if (BT <= 0) return;
    if (dinp != nullptr) {
      gemm_bf16_operands(false, false, BT, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp,
                         CUDA_R_16BF, C, stream);
    }
    if (dweight != nullptr) {
      gemm_bf16_operands(true, false, OC, C, BT, 1.0f, dout, OC, inp, C, 1.0f, dweight,
                         cuda_type<G>(), C, stream);
    }
    column_sum(dbias, dout, BT, OC, stream);
  }
}

template void matmul_forward<float>(float*, const float*, const float*, const float*, int, int,
                                    int, int, cudaStream_t);
template void matmul_forward<Bf16>(Bf16*, const Bf16*, const Bf16*, const Bf16*, int, int, int,
                                   int, cudaStream_t);
template void matmul_backward<float, float>(float*, float*, float*, const float*, const float*,
                                            const float*, int, int, int, int, cudaStream_t);
template void matmul_backward<Bf16, Bf16>(Bf16*, Bf16*, Bf16*, const Bf16*, const Bf16*,
                                          const Bf16*, int, int, int, int, cudaStream_t);
template void matmul_backward<Bf16, float>(Bf16*, float*, float*, const Bf16*, const Bf16*,
                                           const Bf16*, int, int, int, int, cudaStream_t);

}  // namespace typed

}  // namespace ds::rt::cuda
