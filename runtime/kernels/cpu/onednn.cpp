// oneDNN matmuls with a process-wide primitive cache (cpu/onednn.h).
//
// Why a cache keyed by shapes: a oneDNN primitive is specialised for its shapes, strides and
// types (it JIT-compiles its kernel when created, which costs ~0.1-1 ms); a training step issues
// the same few dozen products every step, so each key is created once and reused.
// Why per-thread streams and scratchpads: a dnnl::stream is not meant to be shared between threads
// that execute at the same time, and oneDNN's library-managed scratchpad is one global buffer in
// Debian's build (no concurrent execution), which gave wrong products when two ranks ran as
// threads of one process; each thread keeps its own, grown to the largest primitive's need.
#include "kernels/cpu/onednn.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "common/error.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu::onednn {

thread_local bool t_variable_rows = false;  // cpu::VariableMatmulRows: M and K are run-time dimensions

namespace {
using dt = dnnl::memory::data_type;
using Dims = dnnl::memory::dims;

std::atomic<Backend> g_backend{Backend::kOneDnn};


dt to_dnnl(DType t) {
  switch (t) {
    case DType::kF32: return dt::f32;
    case DType::kBF16: return dt::bf16;
    case DType::kF16: return dt::f16;
  }
  return dt::undef;
}

using Key = std::tuple<int, int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, bool, bool>;

struct Prim {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, bias, c, scratch;
  bool runtime_mk = false;  // created with M and K as run-time dimensions (VariableRows)
  Operand A{}, B{};         // the strides, for the run-time descriptors
  DType in = DType::kF32, out = DType::kF32;
  int64_t ldc = 0;
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}
dnnl::stream& thread_stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

struct Cache {
  std::mutex mu;
  std::map<Key, std::shared_ptr<Prim>> prims;          // nullptr: oneDNN has no primitive
  std::vector<std::pair<std::string, std::string>> used;  // (input type, impl) in first-use order
};
Cache& cache() {
  static Cache c;
  return c;
}

// Records (input type, implementation) for report(), once each; the caller holds cache().mu.
void note_used(const std::string& type, const std::string& impl) {
  auto& used = cache().used;
  for (const auto& u : used) {
    if (u.first == type && u.second == impl) return;
  }
  used.emplace_back(type, impl);
}

std::shared_ptr<Prim> create(DType in, Operand A, Operand B, bool bias, DType out, int64_t ldc, int M, int N,
                             int K, bool accumulate) {
  auto p = std::make_shared<Prim>();
  p->runtime_mk = M < 0;
  p->A = A;
  p->B = B;
  p->in = in;
  p->out = out;
  p->ldc = ldc;
  const dnnl::memory::dim m = p->runtime_mk ? DNNL_RUNTIME_DIM_VAL : M, k = p->runtime_mk ? DNNL_RUNTIME_DIM_VAL : K;
  p->a = dnnl::memory::desc(Dims{m, k}, to_dnnl(in), Dims{A.stride0, A.stride1});
  p->b = dnnl::memory::desc(Dims{k, N}, to_dnnl(in), Dims{B.stride0, B.stride1});
  p->c = dnnl::memory::desc(Dims{m, N}, to_dnnl(out), Dims{ldc, 1});
  if (bias) p->bias = dnnl::memory::desc(Dims{1, N}, to_dnnl(in), Dims{N, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  try {
    auto d = bias ? dnnl::matmul::desc(p->a, p->b, p->bias, p->c) : dnnl::matmul::desc(p->a, p->b, p->c);
    dnnl::matmul::primitive_desc pd(d, attr, engine());
    p->prim = dnnl::matmul(pd);
    p->scratch = pd.scratchpad_desc();
    note_used(dtype_name(in), pd.impl_info_str());
  } catch (const dnnl::error& e) {
    if (in == DType::kF32) throw system_error("oneDNN has no fp32 matmul for {}x{}x{}: {}", M, N, K, e.what());
    return nullptr;
  }
  return p;
}

// The cached primitive of this product, or nullptr where oneDNN has none.
std::shared_ptr<Prim> lookup(DType in, Operand A, Operand B, bool bias, DType out, int64_t ldc, int M, int N,
                             int K, bool accumulate) {
  // With VariableRows the key (and the primitive) leaves M and K open: one primitive per (N,
  // strides, types) serves every row count (the strides are in the key, so a stride that is a
  // row count still gets a primitive of its own).
  if (t_variable_rows) {
    M = -1;
    K = -1;
  }
  const Key key{M, N, K, A.stride0, A.stride1, B.stride0, B.stride1, ldc, static_cast<int>(in),
                static_cast<int>(out), bias, accumulate};
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.prims.find(key);
  if (it == c.prims.end()) it = c.prims.emplace(key, create(in, A, B, bias, out, ldc, M, N, K, accumulate)).first;
  return it->second;
}

void run(const Prim& p, const void* A, const void* B, const void* bias, void* C, int M, int N, int K) {
  const dnnl::engine& e = engine();
  dnnl::memory::desc a = p.a, b = p.b, c = p.c;
  if (p.runtime_mk) {  // the descriptors of this call's M and K
    a = dnnl::memory::desc(Dims{M, K}, to_dnnl(p.in), Dims{p.A.stride0, p.A.stride1});
    b = dnnl::memory::desc(Dims{K, N}, to_dnnl(p.in), Dims{p.B.stride0, p.B.stride1});
    c = dnnl::memory::desc(Dims{M, N}, to_dnnl(p.out), Dims{p.ldc, 1});
  }
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, dnnl::memory(a, e, const_cast<void*>(A))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(b, e, const_cast<void*>(B))},
      {DNNL_ARG_DST, dnnl::memory(c, e, C)}};
  if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, dnnl::memory(p.bias, e, const_cast<void*>(bias)));
  // The scratchpad is this thread's: oneDNN's own (library mode) is one global buffer unless the
  // library was built for concurrent execution, and ranks run as threads in the tests.
  thread_local std::vector<char> scratch;
  if (scratch.size() < p.scratch.get_size()) scratch.resize(p.scratch.get_size());
  args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(p.scratch, e, scratch.data()));
  p.prim.execute(thread_stream(), args);
  thread_stream().wait();
}

// Dense fp32 copy of a strided (rows, cols) operand of type S. Row-major operands (stride1 1)
// widen row by row; transposed ones (stride0 1) in 64x64 tiles, reading along the source's
// contiguous dimension. Rows or tiles are split across the OpenMP threads; the loops are
// compiled for AVX-512/AVX2 as well (DS_SIMD_CLONES), so the 16-bit widening vectorises.
template <typename S>
DS_SIMD_CLONES void widen_row(float* dst, const S* src, int n) {
  for (int j = 0; j < n; j++) dst[j] = to_f32(src[j]);
}

template <typename S>
DS_SIMD_CLONES void widen_tile(float* dst, int ldd, const S* src, int64_t lds, int rows, int cols) {
  // dst[i * ldd + j] = src[i + j * lds]: the source is contiguous along i.
  for (int j = 0; j < cols; j++) {
    for (int i = 0; i < rows; i++) dst[static_cast<int64_t>(i) * ldd + j] = to_f32(src[i + j * lds]);
  }
}

template <typename S>
void to_dense_f32_typed(float* dst, const S* src, Operand X, int rows, int cols) {
  const bool big = static_cast<int64_t>(rows) * cols >= kParallelWork;
  if (X.stride1 == 1 || cols == 1) {
#pragma omp parallel for schedule(static) if (big)
    for (int i = 0; i < rows; i++) widen_row(dst + static_cast<int64_t>(i) * cols, src + i * X.stride0, cols);
    return;
  }
  if (X.stride0 == 1) {
    constexpr int kTile = 64;
    const int ti = (rows + kTile - 1) / kTile, tj = (cols + kTile - 1) / kTile;
#pragma omp parallel for schedule(static) if (big)
    for (int t = 0; t < ti * tj; t++) {
      const int i0 = (t / tj) * kTile, j0 = (t % tj) * kTile;
      widen_tile(dst + static_cast<int64_t>(i0) * cols + j0, cols, src + i0 + j0 * X.stride1, X.stride1,
                 std::min(kTile, rows - i0), std::min(kTile, cols - j0));
    }
    return;
  }
  for (int i = 0; i < rows; i++) {
    for (int j = 0; j < cols; j++) dst[static_cast<int64_t>(i) * cols + j] = to_f32(src[i * X.stride0 + j * X.stride1]);
  }
}

void to_dense_f32(std::vector<float>& dst, DType in, Operand X, int rows, int cols) {
  dst.resize(static_cast<size_t>(rows) * cols);
  if (in == DType::kF32) to_dense_f32_typed(dst.data(), static_cast<const float*>(X.data), X, rows, cols);
  if (in == DType::kBF16) to_dense_f32_typed(dst.data(), static_cast<const bf16*>(X.data), X, rows, cols);
  if (in == DType::kF16) to_dense_f32_typed(dst.data(), static_cast<const f16*>(X.data), X, rows, cols);
}

// C's rows rounded from the dense fp32 result, split across the threads.
template <typename S>
DS_SIMD_CLONES void narrow_row(S* dst, const float* src, int n) {
  for (int j = 0; j < n; j++) dst[j] = from_f32<S>(src[j]);
}

template <typename S>
void store_rows(void* C, int64_t ldc, const float* c, int M, int N) {
#pragma omp parallel for schedule(static) if (static_cast<int64_t>(M) * N >= kParallelWork)
  for (int i = 0; i < M; i++) narrow_row(static_cast<S*>(C) + i * ldc, c + static_cast<int64_t>(i) * N, N);
}

void matmul_f32(Operand A, Operand B, const float* bias, float* C, int64_t ldc, int M, int N, int K,
                bool accumulate) {
  if (g_backend.load(std::memory_order_relaxed) == Backend::kOpenBlas && (A.stride0 == 1 || A.stride1 == 1) &&
      (B.stride0 == 1 || B.stride1 == 1)) {
    const bool ta = A.stride1 != 1, tb = B.stride1 != 1;
    const int lda = static_cast<int>(ta ? A.stride1 : A.stride0), ldb = static_cast<int>(tb ? B.stride1 : B.stride0);
    gemm(ta, tb, M, N, K, 1.0f, static_cast<const float*>(A.data), lda, static_cast<const float*>(B.data), ldb,
         accumulate ? 1.0f : 0.0f, C, static_cast<int>(ldc));
    if (bias != nullptr) add_bias(C, bias, M, N);
    return;
  }
  auto p = lookup(DType::kF32, A, B, bias != nullptr, DType::kF32, ldc, M, N, K, accumulate);
  run(*p, A.data, B.data, bias, C, M, N, K);
}

// 16-bit product through fp32: operands converted, the fp32 primitive, C rounded once.
void matmul_convert(DType in, Operand A, Operand B, const void* bias, DType out, void* C, int64_t ldc, int M,
                    int N, int K, bool accumulate) {
  thread_local std::vector<float> a, b, c, bb;
  to_dense_f32(a, in, A, M, K);
  to_dense_f32(b, in, B, K, N);
  if (bias != nullptr) to_dense_f32(bb, in, Operand{bias, 0, 1}, 1, N);
  c.resize(static_cast<size_t>(M) * N);  // the product overwrites it unless accumulating
  if (accumulate) to_dense_f32(c, out, Operand{C, ldc, 1}, M, N);
  matmul_f32(Operand{a.data(), K, 1}, Operand{b.data(), N, 1}, bias != nullptr ? bb.data() : nullptr, c.data(),
             N, M, N, K, accumulate);
  if (out == DType::kF32) store_rows<float>(C, ldc, c.data(), M, N);
  if (out == DType::kBF16) store_rows<bf16>(C, ldc, c.data(), M, N);
  if (out == DType::kF16) store_rows<f16>(C, ldc, c.data(), M, N);
  // Noted once per input type, not on every product (this runs every step).
  static std::atomic<bool> noted[3];
  if (!noted[static_cast<int>(in)].exchange(true)) {
    std::lock_guard<std::mutex> lock(cache().mu);
    note_used(dtype_name(in), "converted to fp32");
  }
}
}  // namespace

void set_backend(Backend b) { g_backend.store(b); }


Backend backend() { return g_backend.load(); }

void matmul(DType in, Operand A, Operand B, const void* bias, DType out, void* C, int64_t ldc, int M, int N,
            int K, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  if (in == DType::kF32) {
    return matmul_f32(A, B, static_cast<const float*>(bias), static_cast<float*>(C), ldc, M, N, K, accumulate);
  }
  if (g_backend.load(std::memory_order_relaxed) == Backend::kOneDnn) {
    if (auto p = lookup(in, A, B, bias != nullptr, out, ldc, M, N, K, accumulate)) {
      return run(*p, A.data, B.data, bias, C, M, N, K);
    }
  }
  matmul_convert(in, A, B, bias, out, C, ldc, M, N, K, accumulate);
}

std::string report() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  std::string s;
  for (const auto& [type, impl] : c.used) s += (s.empty() ? "" : "; ") + type + " matmul: " + impl;
  return s;
}

std::string version() {
  const dnnl_version_t* v = dnnl_version();
  const std::string hash = v->hash != nullptr ? v->hash : "N/A";
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) + " (" +
         (hash == "N/A" ? "" : "commit " + hash + ", ") + "CPU runtime " +
         (v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : v->cpu_runtime == DNNL_RUNTIME_SEQ ? "sequential" : "other") +
         ")";
}

}  // namespace ds::rt::cpu::onednn

namespace ds::rt::cpu {
VariableMatmulRows::VariableMatmulRows() : saved_(onednn::t_variable_rows) { onednn::t_variable_rows = true; }
VariableMatmulRows::~VariableMatmulRows() { onednn::t_variable_rows = saved_; }
}  // namespace ds::rt::cpu
