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
// bf16: buffers named *_bf16 hold bfloat16 bit patterns (uint16_t), rounded to nearest even exactly
// as core/dtype.h's f32_to_bf16. In every *_bf16 variant the PARAMETER GRADIENTS stay fp32;
// activations, their gradients and parameters are bf16. These predate the typed twins (namespace
// typed, below: bf16 of core/dtype.h, gradients of either type), run the same kernels and are
// kept for the tests that call them; the dispatch calls the typed twins.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/adamw_step.h"

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

// ---- encoder ------------------------------------------------------------------------------------

void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                     int T, int C, cudaStream_t stream);
// dwte, dwpe accumulate; either may be null. dwte through atomicAdd (order not deterministic).
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B,
                      int T, int C, cudaStream_t stream);
void encoder_forward_vocab(float* out, const int32_t* inp, const float* wte, int B, int T, int C,
                           int v0, int Vl, cudaStream_t stream);
void encoder_backward_vocab(float* dwte, const float* dout, const int32_t* inp, int B, int T,
                            int C, int v0, int Vl, cudaStream_t stream);
void add_position(float* out, const float* wpe, int B, int T, int C, cudaStream_t stream);

// bf16: out, wte, wpe, dout bf16; dwte, dwpe fp32 (accumulate).
void encoder_forward_bf16(uint16_t* out, const int32_t* inp, const uint16_t* wte,
                          const uint16_t* wpe, int B, int T, int C, cudaStream_t stream);
void encoder_backward_bf16(float* dwte, float* dwpe, const uint16_t* dout, const int32_t* inp,
                           int B, int T, int C, cudaStream_t stream);

// ---- layernorm (eps 1e-5) -------------------------------------------------------------------------

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int B, int T, int C, cudaStream_t stream);
// dinp ACCUMULATES; dweight, dbias accumulate.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int B, int T, int C, cudaStream_t stream);
// bf16: out, inp, weight, bias, dinp, dout bf16; mean, rstd, dweight, dbias fp32.
void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const uint16_t* inp,
                            const uint16_t* weight, const uint16_t* bias, int B, int T, int C,
                            cudaStream_t stream);
void layernorm_backward_bf16(uint16_t* dinp, float* dweight, float* dbias, const uint16_t* dout,
                             const uint16_t* inp, const uint16_t* weight, const float* mean,
                             const float* rstd, int B, int T, int C, cudaStream_t stream);

// ---- matmul with bias (cuBLASLt bias epilogue for the forward) ----------------------------------

// out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias (OC); bias may be null. With a bias the
// product and the bias are one cublasLtMatmul (CUBLASLT_EPILOGUE_BIAS); where cuBLASLt offers no
// algorithm it falls back to cublasSgemm + add_bias.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int B,
                    int T, int C, int OC, cudaStream_t stream);
// dinp overwritten (skipped when null); dweight += dout^T inp; dbias += column sums (skipped when
// null).
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int B, int T, int C, int OC, cudaStream_t stream);
void add_bias(float* out, const float* bias, int N, int OC, cudaStream_t stream);
// cpu::add_in_place, round_to_bf16_in_place, round_to_f16_in_place on the device (rounding
// bit-identical to core/dtype.h).
void add_in_place(float* dst, const float* src, int64_t N, cudaStream_t stream);
void round_to_bf16_in_place(float* x, int64_t N, cudaStream_t stream);
void round_to_f16_in_place(float* x, int64_t N, cudaStream_t stream);

// ---- causal multi-head self-attention ------------------------------------------------------------

// Same layout and saved buffers as the CPU: qkv (B,T,3C), out (B,T,C), lse (B,NH,T) = the
// log-sum-exp of each (scaled) score row; backward recomputes the probabilities from q, k, lse.
// One warp per query row (forward, dq) or key row (dk, dv) with an online softmax: nothing of
// size T x T is stored, so no scratch is needed (attention_scratch_floats is 0; `scratch` may be
// null and is ignored). Head size hs = C / NH must be at most kMaxHeadSize (throws otherwise).
inline constexpr int kMaxHeadSize = 256;
size_t attention_scratch_floats(int T);  // 0
void attention_forward(float* out, float* lse, const float* qkv, float* scratch, int B, int T,
                       int C, int NH, cudaStream_t stream);
// dqkv (B,T,3C) overwritten.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, float* scratch, int B, int T, int C, int NH,
                        cudaStream_t stream);

// ---- GELU (tanh approximation) and residual -------------------------------------------------------

void gelu_forward(float* out, const float* inp, int64_t N, cudaStream_t stream);
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N,
                   cudaStream_t stream);  // dinp may alias dout
void residual_forward(float* out, const float* inp1, const float* inp2, int64_t N,
                      cudaStream_t stream);  // out may alias either input
void residual_backward(float* dinp1, float* dinp2, const float* dout, int64_t N,
                       cudaStream_t stream);  // both accumulate
void gelu_forward_bf16(uint16_t* out, const uint16_t* inp, int64_t N, cudaStream_t stream);
void gelu_backward_bf16(uint16_t* dinp, const uint16_t* inp, const uint16_t* dout, int64_t N,
                        cudaStream_t stream);
void residual_forward_bf16(uint16_t* out, const uint16_t* inp1, const uint16_t* inp2, int64_t N,
                           cudaStream_t stream);
void residual_backward_bf16(uint16_t* dinp1, uint16_t* dinp2, const uint16_t* dout, int64_t N,
                            cudaStream_t stream);

// ---- fused softmax + cross-entropy -----------------------------------------------------------------

// As the CPU twins, except for the count of invalid targets: the CPU returns it, here it is ADDED
// to *bad_targets (device memory, may be null) so nothing synchronises. Invalid targets get a NaN
// loss (and, in backward, their row of dlogits is left unchanged, as on the CPU).
void crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int N, int V,
                          int Vp, int* bad_targets, cudaStream_t stream);
void crossentropy_softmax_backward(float* losses, float* logits_to_dlogits, const int32_t* targets,
                                   float dloss, int N, int V, int Vp, int* bad_targets,
                                   cudaStream_t stream);
// bf16 logits (and dlogits), fp32 losses.
void crossentropy_forward_bf16(float* losses, const uint16_t* logits, const int32_t* targets, int N,
                               int V, int Vp, int* bad_targets, cudaStream_t stream);
void crossentropy_softmax_backward_bf16(float* losses, uint16_t* logits_to_dlogits,
                                        const int32_t* targets, float dloss, int N, int V, int Vp,
                                        int* bad_targets, cudaStream_t stream);
// Vocabulary-parallel phases, as the CPU's (the caller reduces mx, then sumexp/tlogit, between).
void vocab_ce_max(float* mx, const float* logits, int N, int Vl, int v0, int V,
                  cudaStream_t stream);
void vocab_ce_sums(float* sumexp, float* tlogit, const float* logits, const float* mx,
                   const int32_t* targets, int N, int Vl, int v0, int V, cudaStream_t stream);
void vocab_ce_finish(float* losses, float* logits_to_dlogits, const float* mx, const float* sumexp,
                     const float* tlogit, const int32_t* targets, float dloss, int N, int Vl,
                     int v0, int V, cudaStream_t stream);

// ---- element type conversion (round to nearest even) -----------------------------------------------

void convert_f32_to_bf16(uint16_t* out, const float* inp, int64_t N, cudaStream_t stream);
void convert_bf16_to_f32(float* out, const uint16_t* inp, int64_t N, cudaStream_t stream);
void convert_f32_to_f16(uint16_t* out, const float* inp, int64_t N, cudaStream_t stream);
void convert_f16_to_f32(float* out, const uint16_t* inp, int64_t N, cudaStream_t stream);

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

// ---- gradient norm and scaling (optim/clip.h on the device) -------------------------------------

// *out (device, one double) = sum of x[i]^2 over n floats, accumulated in double, in a fixed
// order (deterministic): kSumSquaresBlocks partial sums into `scratch` (device, that many
// doubles), then one block adds them. inf/nan inputs make it non-finite, as on the CPU.
inline constexpr int kSumSquaresBlocks = 256;
void sum_of_squares(double* out, double* scratch, const float* x, int64_t n, cudaStream_t stream);
// The same, returned to the host (synchronises the stream); the scratch is the calling thread's
// own, per device.
double sum_of_squares_to_host(const float* x, int64_t n, cudaStream_t stream);
// x[i] *= coef; nothing is launched when coef == 1.
void scale_in_place(float* x, int64_t n, float coef, cudaStream_t stream);


// ---- RMSNorm, rotary embeddings, SwiGLU, grouped-query attention --------------------------------

// The twins of cpu/kernels.h's (multi-head attention above runs the same grouped-query kernels
// with KV = NH). Statistics (rstd, lse) and the RoPE cos/sin tables are fp32
// device buffers. Legend: N = rows (B*T), C = channels, NH = query heads, KV = kv heads
// (NH % KV == 0), hd = head size (even, <= kMaxHeadSize), I = the SwiGLU width.
// RMSNorm: one warp per row; dweight: column sums over row chunks, fixed order. out (N,C) = inp *
// rstd * weight, rstd (N) = 1 / sqrt(mean(inp^2) + eps); backward: dinp ACCUMULATES, dweight too.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                     int C, float eps, cudaStream_t stream);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t N, int C,
                      cudaStream_t stream);
// RoPE (rotate_half), in place, one thread per rotated pair: `heads` heads of hd values `offset`
// elements into each row of x (row stride `stride`; row b*T + t has position t); cos/sin (T, hd/2)
// computed on the host by cpu::rope_tables and uploaded once. backward: the transpose rotation.
void rope_forward(float* x, const float* cos, const float* sin, int B, int T, int heads, int hd,
                  int stride, int offset, cudaStream_t stream);
void rope_backward(float* dx, const float* cos, const float* sin, int B, int T, int heads, int hd,
                   int stride, int offset, cudaStream_t stream);
// SwiGLU over the stacked (gate | up) rows, grid-stride: gu (N, 2I), out (N, I); backward: dgu
// (N, 2I) overwritten.
void swiglu_forward(float* out, const float* gu, int64_t N, int I, cudaStream_t stream);
void swiglu_backward(float* dgu, const float* dout, const float* gu, int64_t N, int I,
                     cudaStream_t stream);
// Causal grouped-query attention, k and v read in place (attention.cu): qkv (B,T,(NH+2KV)hd), q
// heads then k heads then v heads, query head h reading kv head h / (NH/KV); out (B,T,NH hd), lse
// (B,NH,T). No scratch (`scratch` is ignored). dqkv overwritten; deterministic. Throws ds::Error
// up front when hd is above kMaxHeadSize or NH is not a multiple of KV.
void attention_gqa_forward(float* out, float* lse, const float* qkv, float* scratch, int B, int T,
                           int NH, int KV, int hd, cudaStream_t stream);
void attention_gqa_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                            const float* lse, float* scratch, int B, int T, int NH, int KV, int hd,
                            cudaStream_t stream);

// ---- 16-bit storage: the twins of the CPU templates (what kernels/dispatch.h routes bf16 to) -----

// The CPU templates' signatures (cpu/kernels.h: the same S and G, the same shapes, accumulation
// and null rules) plus a stream. Instantiated for S = bf16 (core/dtype.h, the model's 2-byte
// buffers) with G = bf16 or float (the parameter gradients; grad_accum_dtype fp32), and for
// S = G = float too, which is what the fp32 functions above run (the matmuls: the other way
// round, typed<float> is the fp32 function). Like the CPU templates, each
// kernel reads S, computes in fp32 and rounds every output ONCE (an accumulating output: read, add
// in fp32, round once); the statistics stay fp32 (mean/rstd, lse, losses, the vocab-parallel
// statistics). Where the order of rounding differs from the CPU's (at most one rounding per output
// here, sometimes fewer than the CPU's), the function says so. No fp16 instantiations: fp16
// storage has no CUDA kernels and the dispatch refuses it by name.
// Matrix products: cuBLASLt / cublasGemmEx over CUDA_R_16BF operands with CUBLAS_COMPUTE_32F (fp32
// accumulation, tensor cores); MatmulMath (below) does not apply to them.
namespace typed {

template <typename S>
void encoder_forward(S* out, const int32_t* inp, const S* wte, const S* wpe, int B, int T, int C,
                     cudaStream_t stream);
// dwte through a compare-and-swap loop per element (each addition rounded once, as on the CPU, in
// no fixed order); dwpe one thread per (t, c): the B rows summed in fp32, then one rounding (the
// CPU rounds after each row).
template <typename S, typename G>
void encoder_backward(G* dwte, G* dwpe, const S* dout, const int32_t* inp, int B, int T, int C,
                      cudaStream_t stream);
template <typename S>
void encoder_forward_vocab(S* out, const int32_t* inp, const S* wte, int B, int T, int C, int v0,
                           int Vl, cudaStream_t stream);
template <typename S, typename G>
void encoder_backward_vocab(G* dwte, const S* dout, const int32_t* inp, int B, int T, int C, int v0,
                            int Vl, cudaStream_t stream);
template <typename S>
void add_position(S* out, const S* wpe, int B, int T, int C, cudaStream_t stream);

template <typename S>
void layernorm_forward(S* out, float* mean, float* rstd, const S* inp, const S* weight,
                       const S* bias, int B, int T, int C, cudaStream_t stream);
template <typename S, typename G>
void layernorm_backward(S* dinp, G* dweight, G* dbias, const S* dout, const S* inp,
                        const S* weight, const float* mean, const float* rstd, int B, int T, int C,
                        cudaStream_t stream);

// bias (may be null) added in fp32 before the one rounding of out: cuBLASLt's bias epilogue, or
// (no algorithm, or a bias not 16-byte aligned) the bias copied into out and a GEMM with beta = 1.
template <typename S>
void matmul_forward(S* out, const S* inp, const S* weight, const S* bias, int B, int T, int C,
                    int OC, cudaStream_t stream);
// dinp (skipped when null) overwritten; dweight += dout^T inp with G as cuBLAS's C type (read,
// accumulated in fp32, rounded once); dbias += fp32 column sums of dout, rounded once.
template <typename S, typename G>
void matmul_backward(S* dinp, G* dweight, G* dbias, const S* dout, const S* inp, const S* weight,
                     int B, int T, int C, int OC, cudaStream_t stream);
template <typename S>
void add_bias(S* out, const S* bias, int N, int OC, cudaStream_t stream);

// As attention_forward/backward above (one warp per row, no scratch: `scratch` is ignored), q, k,
// v, out and dout read from S, outputs rounded once; lse fp32.
template <typename S>
void attention_forward(S* out, float* lse, const S* qkv, float* scratch, int B, int T, int C,
                       int NH, cudaStream_t stream);
template <typename S>
void attention_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse,
                        float* scratch, int B, int T, int C, int NH, cudaStream_t stream);

template <typename S>
void gelu_forward(S* out, const S* inp, int64_t N, cudaStream_t stream);
template <typename S>
void gelu_backward(S* dinp, const S* inp, const S* dout, int64_t N, cudaStream_t stream);
template <typename S>
void residual_forward(S* out, const S* inp1, const S* inp2, int64_t N, cudaStream_t stream);
template <typename S>
void residual_backward(S* dinp1, S* dinp2, const S* dout, int64_t N, cudaStream_t stream);
template <typename S>
void add_in_place(S* dst, const S* src, int64_t N, cudaStream_t stream);

// bad_targets as crossentropy_forward above (device, may be null).
template <typename S>
void crossentropy_forward(float* losses, const S* logits, const int32_t* targets, int N, int V,
                          int Vp, int* bad_targets, cudaStream_t stream);
template <typename S>
void crossentropy_softmax_backward(float* losses, S* logits_to_dlogits, const int32_t* targets,
                                   float dloss, int N, int V, int Vp, int* bad_targets,
                                   cudaStream_t stream);
template <typename S>
void vocab_ce_max(float* mx, const S* logits, int N, int Vl, int v0, int V, cudaStream_t stream);
template <typename S>
void vocab_ce_sums(float* sumexp, float* tlogit, const S* logits, const float* mx,
                   const int32_t* targets, int N, int Vl, int v0, int V, cudaStream_t stream);
template <typename S>
void vocab_ce_finish(float* losses, S* logits_to_dlogits, const float* mx, const float* sumexp,
                     const float* tlogit, const int32_t* targets, float dloss, int N, int Vl,
                     int v0, int V, cudaStream_t stream);

// sum_of_squares_to_host and scale_in_place above over S (the gradient norm and clip of 16-bit
// gradients): squares summed in double, x[i] = x[i] * coef rounded once.
template <typename S>
double sum_of_squares_to_host(const S* x, int64_t n, cudaStream_t stream);
template <typename S>
void scale_in_place(S* x, int64_t n, float coef, cudaStream_t stream);

// RMSNorm, RoPE, SwiGLU and grouped-query attention over S (the fp32 entry points above); RMSNorm's
// dweight of type G (S or fp32: the fp32 column sums added and rounded once).
template <typename S>
void rmsnorm_forward(S* out, float* rstd, const S* inp, const S* weight, int64_t N, int C,
                     float eps, cudaStream_t stream);
template <typename S, typename G>
void rmsnorm_backward(S* dinp, G* dweight, const S* dout, const S* inp, const S* weight,
                      const float* rstd, int64_t N, int C, cudaStream_t stream);
template <typename S>
void rope_forward(S* x, const float* cos, const float* sin, int B, int T, int heads, int hd,
                  int stride, int offset, cudaStream_t stream);
template <typename S>
void rope_backward(S* dx, const float* cos, const float* sin, int B, int T, int heads, int hd,
                   int stride, int offset, cudaStream_t stream);
template <typename S>
void swiglu_forward(S* out, const S* gu, int64_t N, int I, cudaStream_t stream);
template <typename S>
void swiglu_backward(S* dgu, const S* dout, const S* gu, int64_t N, int I, cudaStream_t stream);
template <typename S>
void attention_gqa_forward(S* out, float* lse, const S* qkv, float* scratch, int B, int T, int NH,
                           int KV, int hd, cudaStream_t stream);
template <typename S>
void attention_gqa_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse,
                            float* scratch, int B, int T, int NH, int KV, int hd,
                            cudaStream_t stream);

}  // namespace typed

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
