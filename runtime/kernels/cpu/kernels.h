// CPU kernels of the GPT-2 model, llm.c style: free functions over raw fp32 buffers, outputs
// first, then inputs, then shapes. Every forward has a backward twin. The CUDA kernels will have
// the same signatures plus a stream (runtime/kernels/cuda); runtime/kernels/dispatch.h is the only
// place that picks between them.
//
// Legend: B = batch, T = time, C = channels, OC = output channels, NH = heads, hs = C / NH,
// V = real vocabulary, Vp = padded vocabulary (row stride of the logits).
//
// Conventions (every function):
// - Buffers do not alias unless a function says so. Shapes are row-major, in comments.
// - Backward: parameter gradients (dweight, dbias, dwte, ...) ACCUMULATE (+=); input gradients
//   (dinp, dqkv) are OVERWRITTEN unless the function says "accumulates". Null gradient pointers
//   are skipped where the function says so.
// - Threading: each kernel parallelises itself with OpenMP over omp_get_max_threads() threads
//   (and BLAS runs single-threaded inside them, see gemm()); calling one from inside an OpenMP
//   parallel region runs it on the calling thread. Results do not depend on the thread count
//   except for the order of float sums in gemm reductions inside OpenBLAS (deterministic for a
//   fixed thread count).
// - No allocation: scratch comes from the caller (attention's `scratch`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "kernels/adamw_step.h"

namespace ds::rt::cpu {

// Below this many elements of work a kernel runs on the calling thread: waking the OpenMP team
// costs more than it saves.
inline constexpr int64_t kParallelWork = 32768;

// ---- threading and gemm ----------------------------------------------------------------------

// How matrix products use the cores. kSplit (default): OpenBLAS single-threaded, every product
// split by rows or columns across the OpenMP threads (one thread pool for the whole runtime).
// kBlas: OpenBLAS threads itself and OpenMP regions stay separate (kept for measurement).
enum class GemmThreading { kSplit, kBlas };
void set_gemm_threading(GemmThreading mode);
GemmThreading gemm_threading();

// Call before an OpenMP parallel region whose threads call gemm() (outside the region): makes
// OpenBLAS single-threaded for them.
void gemm_before_parallel_region();

// Row-major C(M,N) = alpha * op(A) op(B) + beta * C, op = transpose when the flag says so; lda,
// ldb, ldc are row strides. Splits M or N across threads (see GemmThreading).
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);

// ---- encoder: token + position embedding ------------------------------------------------------

// out (B,T,C) = wte[inp[b,t]] + wpe[t]. inp (B,T) token ids in [0, V); wte (V,C); wpe (maxT,C).
void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                     int T, int C);
// dwte, dwpe accumulate; either may be null.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B,
                      int T, int C);

// Vocabulary-parallel variants (tensor parallelism): this rank holds rows [v0, v0 + Vl) of wte
// (Vl rows). Forward writes the token embedding of tokens in that range and 0 for the others (the
// sum over the tp group is the full embedding); backward accumulates dwte for tokens in range.
void encoder_forward_vocab(float* out, const int32_t* inp, const float* wte, int B, int T, int C,
                           int v0, int Vl);
void encoder_backward_vocab(float* dwte, const float* dout, const int32_t* inp, int B, int T,
                            int C, int v0, int Vl);
// out (B,T,C) += wpe[t] (maxT,C).
void add_position(float* out, const float* wpe, int B, int T, int C);

// ---- layernorm (eps 1e-5) ---------------------------------------------------------------------

// out (B,T,C), mean (B,T), rstd (B,T) from inp (B,T,C), weight (C), bias (C).
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int B, int T, int C);
// dinp ACCUMULATES (it is the residual stream's gradient); dweight, dbias accumulate.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int B, int T, int C);

// ---- matmul with bias -------------------------------------------------------------------------

// out (B,T,OC) = inp (B,T,C) @ weight (OC,C)^T + bias (OC). bias may be null.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int B,
                    int T, int C, int OC);
// dinp (B,T,C) = dout @ weight (overwritten; skipped when null); dweight (OC,C) += dout^T @ inp;
// dbias (OC) += column sums of dout (skipped when null).
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int B, int T, int C, int OC);
// out (N,OC) += bias (OC), row by row.
void add_bias(float* out, const float* bias, int N, int OC);

// ---- causal multi-head self-attention -----------------------------------------------------------

// Memory-efficient formulation (flash-attention's, with one (T,T) tile per head): forward keeps
// only the output and the log-sum-exp of each score row; backward recomputes the probabilities
// from q, k and lse. Nothing of size (B,NH,T,T) is ever stored.
//   qkv (B,T,3C): q, k, v side by side, head h at channels [h*hs, (h+1)*hs) of each.
//   out (B,T,C), lse (B,NH,T).
//   scratch: attention_scratch_floats(T) floats (forward uses half of it).
size_t attention_scratch_floats(int T);  // 2 x T x T per OpenMP thread
void attention_forward(float* out, float* lse, const float* qkv, float* scratch, int B, int T,
                       int C, int NH);
// dqkv (B,T,3C) overwritten. `out` is the forward's output.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, float* scratch, int B, int T, int C, int NH);

// ---- GELU (tanh approximation) -----------------------------------------------------------------

void gelu_forward(float* out, const float* inp, int64_t N);
// dinp = gelu'(inp) * dout, overwritten; dinp may alias dout.
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N);

// ---- residual -----------------------------------------------------------------------------------

// out = inp1 + inp2; out may alias either input.
void residual_forward(float* out, const float* inp1, const float* inp2, int64_t N);
// dinp1 += dout, dinp2 += dout (both accumulate).
void residual_backward(float* dinp1, float* dinp2, const float* dout, int64_t N);
// dst += src (gradient accumulation of the parallel engines); must not overlap.
void add_in_place(float* dst, const float* src, int64_t N);
// x = the nearest bf16 (fp16) value of x, in place, rounding as core/dtype.h: the storage
// precision of mixed-precision parameters kept in fp32 buffers.
void round_to_bf16_in_place(float* x, int64_t N);
void round_to_f16_in_place(float* x, int64_t N);

// ---- fused softmax + cross-entropy ----------------------------------------------------------------

// losses (N) = -log softmax(logits[n, :V])[targets[n]]; logits (N,Vp), columns >= V ignored.
// Returns the number of targets outside [0, V) (their loss is NaN); 0 when all are valid.
int64_t crossentropy_forward(float* losses, const float* logits, const int32_t* targets, int N,
                             int V, int Vp);
// As crossentropy_forward, and turns logits into dlogits IN PLACE:
// dlogits[n, v] = (softmax[n, v] - [v == targets[n]]) * dloss for v < V, 0 for V <= v < Vp.
int64_t crossentropy_softmax_backward(float* losses, float* logits_to_dlogits,
                                      const int32_t* targets, float dloss, int N, int V, int Vp);

// Vocabulary-parallel cross-entropy (Megatron's): logits (N, Vl) are this rank's columns
// [v0, v0 + Vl) of the full vocabulary; columns at or past the real vocabulary V are ignored.
// Between the phases the caller reduces over the tp group: max after phase 1, sums after phase 2.
// Phase 1: mx (N) = max of the rank's valid logits (-inf when it has none).
void vocab_ce_max(float* mx, const float* logits, int N, int Vl, int v0, int V);
// Phase 2 (mx now the global max): sumexp (N) = sum exp(logit - mx) of the valid columns;
// tlogit (N) = the target's logit when this rank holds it, else 0.
void vocab_ce_sums(float* sumexp, float* tlogit, const float* logits, const float* mx,
                   const int32_t* targets, int N, int Vl, int v0, int V);
// Phase 3 (sums now global): losses (N) = mx + log(sumexp) - tlogit; when logits_to_dlogits is
// not null (training) the logits become dlogits in place: (softmax - [v == target]) * dloss, 0 for
// invalid columns.
void vocab_ce_finish(float* losses, float* logits_to_dlogits, const float* mx,
                     const float* sumexp, const float* tlogit, const int32_t* targets,
                     float dloss, int N, int Vl, int v0, int V);

// ---- element type conversion (round to nearest even) ----------------------------------------------

void convert_f32_to_bf16(uint16_t* out, const float* inp, int64_t N);
void convert_bf16_to_f32(float* out, const uint16_t* inp, int64_t N);
void convert_f32_to_f16(uint16_t* out, const float* inp, int64_t N);
void convert_f16_to_f32(float* out, const uint16_t* inp, int64_t N);

// ---- the optimizer's passes over flat fp32 buffers (kernels/adamw_step.h) --------------------------

// AdamW over n elements in place, as kernels/adamw_step.h writes it: params, exp_avg (m) and
// exp_avg_sq (v) read and written, grads only read; buffers must not overlap. `decay` says
// whether weight decay applies to these n elements. Results do not depend on the thread count.
void adamw_update(const kern::AdamWStep& s, float* params, const float* grads, float* exp_avg,
                  float* exp_avg_sq, int64_t n, bool decay);
// The runs of the partition [begin, begin + count) that decay alike, in order and covering it:
// run(offset from begin, n, decay) for each. Throws ds::Error (invalid argument) for a negative
// partition or a table not sorted by offset or overlapping. Shared with the CUDA dispatch.
void for_each_decay_run(int64_t begin, int64_t count, std::span<const kern::DecayRange> decay,
                        const std::function<void(int64_t, int64_t, bool)>& run);
// AdamW over the partition [begin, begin + count) of the flat buffers (pointers at the
// partition's first element, shard-local; `decay` in global offsets, so one table serves every
// rank and partitioning).
void adamw_update_partition(const kern::AdamWStep& s, float* params, const float* grads,
                            float* exp_avg, float* exp_avg_sq, int64_t begin, int64_t count,
                            std::span<const kern::DecayRange> decay);

// Sum of x[i]^2 accumulated in double; inf/nan inputs make it non-finite. Deterministic for a
// given thread count (each thread sums one contiguous block; blocks are added in thread order).
double sum_of_squares(const float* x, int64_t n);
// x[i] *= coef; nothing to do when coef == 1.
void scale_in_place(float* x, int64_t n, float coef);
// True when every element is finite (no inf, no nan).
bool all_finite(const float* x, int64_t n);

}  // namespace ds::rt::cpu
