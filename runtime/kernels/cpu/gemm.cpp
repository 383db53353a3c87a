// gemm: OpenBLAS sgemm, split across the OpenMP threads by rows or columns of the output.
//
// Why split ourselves: OpenBLAS's pthread build keeps its own worker threads, which spin after
// each call; with OpenMP's threads spinning too, the two pools fight over the cores (PyTorch's
// step takes 2.5x longer here that way). With BLAS single-threaded and every product cut into one
// block per OpenMP thread, there is one pool. Each block is a full-K product, so there is no
// reduction between threads and the result is deterministic.
#include <omp.h>

#include <algorithm>
#include <atomic>

#include <cblas.h>

#include "kernels/cpu/kernels.h"

namespace ds::rt::cpu {

namespace {
std::atomic<GemmThreading> g_mode{GemmThreading::kSplit};
std::atomic<int> g_blas_threads{-1};  // what we last told OpenBLAS

void ensure_blas_threads(int n) {
  if (g_blas_threads.load(std::memory_order_relaxed) != n) {
    openblas_set_num_threads(n);
    g_blas_threads.store(n, std::memory_order_relaxed);
  }
}

void sgemm1(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}
}  // namespace

void set_gemm_threading(GemmThreading mode) { g_mode.store(mode); }

void gemm_before_parallel_region() {
  if (!omp_in_parallel()) ensure_blas_threads(1);
}
GemmThreading gemm_threading() { return g_mode.load(); }

void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  if (omp_in_parallel()) {
    // A thread of someone's parallel region (attention's): single-threaded BLAS, already set by
    // gemm_before_parallel_region(); never touch OpenBLAS's settings from here.
    sgemm1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const int nt = omp_get_max_threads();
  if (g_mode.load(std::memory_order_relaxed) == GemmThreading::kBlas) {
    ensure_blas_threads(nt);
    sgemm1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  ensure_blas_threads(1);
  const int64_t work = static_cast<int64_t>(M) * N * K;
  if (nt <= 1 || work < (int64_t{1} << 18)) {
    sgemm1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  // Split the larger output dimension into nt blocks, multiples of 16 where possible.
  const bool by_rows = M >= N;
  const int dim = by_rows ? M : N;
  const int parts = std::min(nt, std::max(1, dim / 16));
#pragma omp parallel for num_threads(parts) schedule(static, 1)
  for (int p = 0; p < parts; p++) {
    // Balanced blocks with boundaries on multiples of 16.
    auto edge = [&](int q) { return q == parts ? dim : static_cast<int>(int64_t{dim} * q / parts / 16 * 16); };
    const int lo = edge(p), hi = edge(p + 1);
    if (hi <= lo) continue;
    if (by_rows) {
      const float* a = ta ? A + lo : A + static_cast<int64_t>(lo) * lda;
      sgemm1(ta, tb, hi - lo, N, K, alpha, a, lda, B, ldb, beta, C + static_cast<int64_t>(lo) * ldc,
             ldc);
    } else {
      const float* b = tb ? B + static_cast<int64_t>(lo) * ldb : B + lo;
      sgemm1(ta, tb, M, hi - lo, K, alpha, A, lda, b, ldb, beta, C + lo, ldc);
    }
  }
}

}  // namespace ds::rt::cpu
