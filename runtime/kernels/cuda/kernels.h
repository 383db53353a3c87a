// CUDA kernels of the decoder (every family's ops): the twins of runtime/kernels/cpu/kernels.h with the same
// arguments plus a trailing cudaStream_t, over DEVICE pointers. runtime/kernels/dispatch.h is the
// only place meant to pick between the two sets.
//
// This header compiles without nvcc and without the CUDA headers (host code of the runtime includes
// it): cudaStream_t is declared here exactly as CUDA declares it. It is C++17 (nvcc compiles the
// .cu files that include it as C++17).
//
// Deliberately not here: anything that allocates (scratch and workspaces come from the caller or,
// for cuBLAS, from a per-device workspace created once), OpenMP threading knobs (CPU only).
//
// Conventions (as on the CPU, see cpu/kernels.h for the legend and every shape):
// - Every pointer is device memory on the CURRENT device (cudaSetDevice) unless said otherwise.
// - Every call is asynchronous on `stream` (0 = the legacy default stream): it enqueues work and
//   returns; results are visible after the stream is synchronised or through events.
// - Backward: parameter gradients ACCUMULATE (+=), input gradients are OVERWRITTEN unless the
//   function says "accumulates", exactly as on the CPU.
// - Arithmetic is fp32 everywhere (bf16 variants read and write bf16, compute in fp32). cuBLAS runs
//   in its default (pedantic fp32) math mode (no TF32 unless NVIDIA_TF32_OVERRIDE says otherwise),
//   unless the calling thread chose MatmulMath::kBf16 (end of this header): then the matmuls
//   multiply in bf16 on tensor cores with fp32 storage and accumulation.
// - Sums run in a different order than on the CPU: results agree with the CPU kernels to ~1e-5
//   relative (fp32) and ~1e-2 (bf16), not bit for bit. encoder_backward and add-to-embedding
//   gradients use atomicAdd, so their float sums are not deterministic run to run.
// - Failure: a CUDA or cuBLAS error (launch or the call itself) throws ds::Error naming the call,
//   the file:line and the CUDA error string. Errors inside a kernel surface on a later call (CUDA's
//   sticky errors). Bad shapes the CPU twin would accept are accepted here too; limits specific to
//   these kernels (attention's head size) throw ds::Error up front.
//
// bf16: buffers of core/dtype.h's bf16 (or uint16_t where a function says so) hold bfloat16 bit
// patterns, rounded to nearest even exactly as core/dtype.h's f32_to_bf16.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/adamw_step.h"

#ifndef DS_OP_UNPAREN
#define DS_OP_UNPAREN(...) __VA_ARGS__
#endif

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;  // as CUDA's driver_types.h declares it

namespace ds::rt::cuda {

// ---- gemm (cuBLAS) ------------------------------------------------------------------------------

// Row-major C(M,N) = alpha * op(A) op(B) + beta * C as cpu::gemm, through cublasSgemm on `stream`.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc, cudaStream_t stream);
// The same over bf16 A, B, C with fp32 accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F).
void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A,
               int lda, const uint16_t* B, int ldb, float beta, uint16_t* C, int ldc,
               cudaStream_t stream);

// ---- attention's limits ---------------------------------------------------------------------------

// The exact attention kernels (attention.cu) run one warp per query row (forward, dq) or key row
// (dk, dv) with an online softmax: nothing of size T x T is stored, so they need no scratch (the
// ops' `scratch` may be null and is ignored). Head size must be at most kMaxHeadSize (throws
// otherwise).
inline constexpr int kMaxHeadSize = 256;

// ---- the storage-typed ops: kernels/ops.def, the twins of the CPU templates -----------------------

// The CPU templates' signatures (the same S and G, the same shapes, accumulation and null rules)
// plus a stream, declared from the one op list. Instantiated for S = G = float, and S = bf16
// (core/dtype.h, the model's 2-byte buffers) with G = bf16 or float (the parameter gradients;
// grad_accum_dtype fp32): the three tables of kernels/cuda_kernel_table.h. No fp16
// instantiations: fp16 storage has no CUDA kernels and the dispatch refuses it by name.
// Like the CPU templates, each kernel reads S, computes in fp32 and rounds every output ONCE (an
// accumulating output: read, add in fp32, round once); the statistics stay fp32 (mean/rstd, lse,
// losses, the vocab-parallel statistics). Where the CUDA twin differs from the CPU:
// - encoder_backward: dwte through atomics (fp32: atomicAdd; 16-bit: a compare-and-swap loop per
//   element, each addition rounded once), in no fixed order; dwpe one thread per (t, c), the B
//   rows summed in fp32, then one rounding (the CPU rounds after each row).
// - layernorm, rmsnorm: one warp per row; dweight and dbias as column sums over row chunks in a
//   fixed order (column_sums.cuh), added and rounded once.
// - matmul_forward: fp32 through the cuBLASLt bias epilogue (cublasSgemm + add_bias where it has
//   no algorithm or the bias is not 16-byte aligned), in the thread's MatmulMath (below); 16-bit
//   through cuBLASLt / cublasGemmEx over CUDA_R_16BF operands with CUBLAS_COMPUTE_32F (fp32
//   accumulation, tensor cores), the bias added in fp32 before the one rounding of out.
//   matmul_backward: dweight with G as cuBLAS's C type (read, accumulated in fp32, rounded once).
// - attention_forward/backward (multi-head) run the grouped-query kernels with KV = NH. bf16
//   runs flash attention (below) where it takes the shape and the exact kernels otherwise (this
//   thread's AttentionKernel); fp32 always the exact ones. Deterministic (no atomics).
// - rope: one thread per rotated pair, cos/sin computed on the host by cpu::rope_tables and
//   uploaded once. swiglu and the elementwise ops: grid-stride, 16-byte packs where aligned.
namespace typed {

#define DS_NOT_DEDUCED(T) T
#define DS_KERNEL_OP(name, params, args) \
  template <typename S>                   \
  void name(DS_OP_UNPAREN params, cudaStream_t stream);
#define DS_KERNEL_OP_G(name, params, args) \
  template <typename S, typename G>         \
  void name(DS_OP_UNPAREN params, cudaStream_t stream);
#include "kernels/ops.def"

// The CUDA forms of the kernels whose CPU form differs (not in the op list), over S as above.
// Cross-entropy as the CPU's except for the count of invalid targets: the CPU returns it, here it
// is ADDED to *bad_targets (device memory, may be null) so nothing synchronises. Invalid targets
// get a NaN loss (and, in backward, their row of dlogits is left unchanged, as on the CPU).
template <typename S>
void crossentropy_forward(float* losses, const S* logits, const int32_t* targets, int N, int V,
                          int Vp, int* bad_targets, cudaStream_t stream);
template <typename S>
void crossentropy_softmax_backward(float* losses, S* logits_to_dlogits, const int32_t* targets,
                                   float dloss, int N, int V, int Vp, int* bad_targets,
                                   cudaStream_t stream);
// sum_of_squares (below) of S values, returned to the host (synchronises the stream); the scratch
// is the calling thread's own, per device.
template <typename S>
double sum_of_squares_to_host(const S* x, int64_t n, cudaStream_t stream);
// out[i] = the sum of squares of xs[i][0, ns[i]) for i < count (each as sum_of_squares_to_host
// computes it, bit for bit), with one copy back and one synchronisation for all of them.
template <typename S>
void sums_of_squares_to_host(double* out, const S* const* xs, const int64_t* ns, int count, cudaStream_t stream);

}  // namespace typed

// ---- ring attention's merge (cpu::attention_merge on the device; attention_block.cu) -------------

void attention_merge(float* out, float* lse, const float* part, const float* part_lse, int B, int T, int NH,
                     int hd, cudaStream_t stream);

// ---- the mixture of experts' sort of routed slots by expert (cpu::moe_sort_slots; moe.cu) ----------

void moe_sort_slots(int32_t* slots, int32_t* pos, int32_t* offsets, const int32_t* idx, int64_t NK, int E,
                    cudaStream_t stream);
void moe_gather_f32(float* out, const float* in, const int32_t* idx, int64_t n, cudaStream_t stream);

// ---- element type conversion (round to nearest even) -----------------------------------------------

void convert_f32_to_bf16(uint16_t* out, const float* inp, int64_t N, cudaStream_t stream);
void convert_bf16_to_f32(float* out, const uint16_t* inp, int64_t N, cudaStream_t stream);
void convert_f32_to_f16(uint16_t* out, const float* inp, int64_t N, cudaStream_t stream);
void convert_f16_to_f32(float* out, const uint16_t* inp, int64_t N, cudaStream_t stream);
// cpu::round_to_bf16_in_place, round_to_f16_in_place on the device (rounding bit-identical to
// core/dtype.h).
void round_to_bf16_in_place(float* x, int64_t N, cudaStream_t stream);
void round_to_f16_in_place(float* x, int64_t N, cudaStream_t stream);
// x[i] = value for i < N (ring attention's lse accumulators start at -inf).
void fill_f32(float* x, float value, int64_t N, cudaStream_t stream);

// ---- fused AdamW ------------------------------------------------------------------------------------

// cpu::adamw_update on the device, element for element the same formula (fp32). params (fp32
// master), exp_avg, exp_avg_sq read and written; grads read. When params_bf16 is not null the
// updated parameters are also written there as bf16 (the model's working copy), in the same pass.
void adamw_update(const kern::AdamWStep& s, float* params, const float* grads, float* exp_avg,
                  float* exp_avg_sq, int64_t n, bool decay, uint16_t* params_bf16,
                  cudaStream_t stream);
// The same with bf16 gradients (read and converted to fp32 first).
void adamw_update_bf16_grads(const kern::AdamWStep& s, float* params, const uint16_t* grads,
                             float* exp_avg, float* exp_avg_sq, int64_t n, bool decay,
                             uint16_t* params_bf16, cudaStream_t stream);

// ---- gradient norm (optim/clip.h on the device) ---------------------------------------------------

// *out (device, one double) = sum of x[i]^2 over n floats, accumulated in double, in a fixed
// order (deterministic): kSumSquaresBlocks partial sums into `scratch` (device, that many
// doubles), then one block adds them. inf/nan inputs make it non-finite, as on the CPU.
inline constexpr int kSumSquaresBlocks = 256;
void sum_of_squares(double* out, double* scratch, const float* x, int64_t n, cudaStream_t stream);

// ---- the per-token losses summed on the device, brought back once per step ------------------------

// Slot `slot` (0 <= slot < kLossSlots) of the calling thread's device array of loss sums = the sum
// of losses[0, n) in double, in sum_of_squares' fixed order; nothing synchronises. The slots are
// the thread's own, per device, outside the tagged accounting (like the norm's scratch).
inline constexpr int kLossSlots = 1024;
void loss_sum_to_slot(const float* losses, int64_t n, int slot, cudaStream_t stream);
// out[0, count) = slots [0, count): one copy back, one synchronisation.
void loss_slots_to_host(double* out, int count, cudaStream_t stream);

// ---- flash attention on the tensor cores (bf16 storage) --------------------------------------------

// Causal grouped-query attention over bf16 buffers (flash_attention.cu): qkv (B,T,(NH+2KV)hd), q
// heads then k heads then v heads (a multi-head (B,T,3C) is KV = NH), out (B,T,NH hd), lse (B,NH,T)
// fp32, the layouts and saved values of the exact kernels above and of attention_gqa_*.
// FlashAttention-2's schedule on bf16 mma with fp32 accumulation; P and dS are rounded to bf16
// where they enter a product. dqkv is overwritten; no atomics (deterministic). hd must be one of
// flash_attention_supported's and every pointer 16-byte aligned; otherwise ds::Error up front.
bool flash_attention_supported(int hd);  // hd in {16, 32, 64, 80, 96, 128}
void flash_attention_forward_bf16(uint16_t* out, float* lse, const uint16_t* qkv, int B, int T,
                                  int NH, int KV, int hd, cudaStream_t stream);
void flash_attention_backward_bf16(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv,
                                   const uint16_t* out, const float* lse, int B, int T, int NH,
                                   int KV, int hd, cudaStream_t stream);

// Which kernels THIS host thread's bf16 attention calls run (attention_forward/backward<bf16>,
// attention_gqa_*_bf16): kFlash (the default) where flash_attention_supported(hd) and the
// buffers are 16-byte aligned, the exact warp-per-row kernels otherwise; kExact always the exact
// ones (the reference). fp32 storage always runs the exact kernels. Host state read at each call.
enum class AttentionKernel { kFlash, kExact };
void set_attention_kernel(AttentionKernel k);
AttentionKernel attention_kernel();

// ---- matmul precision (per host thread) ----------------------------------------------------------

// How THIS host thread's fp32 matrix products compute: gemm, matmul_forward (the cuBLASLt bias
// epilogue and its sgemm fallback) and matmul_backward. Storage is fp32 either way (inputs,
// outputs, accumulated parameter gradients, beta * C); only the multiply changes:
// - kFp32 (every thread's default): cuBLAS's pedantic fp32 math, as the conventions above say.
// - kBf16: CUBLAS_COMPUTE_32F_FAST_16BF: cuBLAS may round A and B to bf16 on the fly and multiply
//   on tensor cores with fp32 accumulation. Results then agree with the fp32 product to about
//   1e-2 of the output's scale (sqrt(K) x |a| x |b| for random data), not 1e-5; on inputs that are
//   already bf16-representable they agree to fp32 accumulation error. cuBLAS is allowed, not
//   obliged, to use bf16 (small or misaligned shapes may run in fp32).
// gemm_bf16 (bf16 storage) is unaffected. The setting is host state read when a call is made (not
// enqueued): it applies to the calls this thread makes afterwards, on any stream and device.
enum class MatmulMath { kFp32, kBf16 };
void set_matmul_math(MatmulMath m);
MatmulMath matmul_math();

// The calling thread's current CUDA stream (nullptr = the legacy default stream), as an opaque
// pointer: kern::DeviceScope sets it (through the module's kernel table) while a CUDA scope is
// open, and the NCCL backend makes its own stream wait for this one before every collective (as
// PyTorch's c10d does with getCurrentCUDAStream), so a collective never reads a buffer the
// model is still writing. One per thread, owned by the module.
void*& current_stream();

}  // namespace ds::rt::cuda
