// CPU kernels of the decoder (every family's ops), llm.c style: free functions over raw buffers, outputs first,
// then inputs, then shapes. Every forward has a backward twin. The kernels over the storage type
// that CUDA runs too are declared from one op list, kernels/ops.def (which documents each); the
// CUDA twins have the same signatures plus a stream (runtime/kernels/cuda), and
// runtime/kernels/dispatch.h is the only place that picks between them.
//
// Legend: B = batch, T = time, C = channels, OC = output channels, NH = heads, hs = C / NH,
// V = real vocabulary, Vp = padded vocabulary (row stride of the logits).
//
// ---- element types: how a kernel is templated (follow this for new kernels) ----------------------
// Two template parameters, named the same in every kernel:
//   S  the STORAGE type of parameters, activations and activation gradients: float, bf16 or f16
//      (core/dtype.h; bf16/f16 are 2-byte structs holding the bit pattern);
//   G  the type of PARAMETER GRADIENTS (dweight, dbias, dwte, ...): S itself, or float (gradients
//      accumulated in fp32 under 16-bit storage, data_types.grad_accum_dtype = fp32).
// Statistics are always float whatever S: LayerNorm mean/rstd, attention lse and scratch, losses,
// the vocab-parallel loss statistics. Arithmetic is always fp32: a kernel reads S with to_f32(x),
// computes in float and writes from_f32<S>(value) (round to nearest even) ONCE per output element;
// accumulating outputs (+=) read, add in fp32 and round once. For S = float both are the identity,
// so the fp32 kernels are the same loops they always were.
// Instantiation: the templates are defined in the .cpp files and explicitly instantiated there for
// every combination with DS_FOR_EACH_STORAGE(X) (X(S): float, bf16, f16) or
// DS_FOR_EACH_STORAGE_GRAD(X) (X(S, G): (float, float), (bf16, bf16), (bf16, float), (f16, f16),
// (f16, float)); kernels/typed.h switches on run-time dtypes into exactly these. A kernel used
// only with one type (the optimizer's fp32 master) keeps plain float parameters. An output that
// may be null is declared std::type_identity_t<S>* / <G>* (not deduced), so a caller's nullptr
// does not stop S and G from being deduced from the other arguments.
// Matmuls (matmul_forward/backward) run on oneDNN (cpu/onednn.h): fp32, and bf16 on bf16 matrix
// instructions with fp32 accumulation; fp16 converts to fp32 around the fp32 primitive.
//
// Conventions (every function):
// - Buffers do not alias unless a function says so. Shapes are row-major, in comments.
// - Backward: parameter gradients (dweight, dbias, dwte, ...) ACCUMULATE (+=); input gradients
//   (dinp, dqkv) are OVERWRITTEN unless the function says "accumulates". Null gradient pointers
//   are skipped where the function says so.
// - Threading: each kernel parallelises itself with OpenMP over omp_get_max_threads() threads
//   (and BLAS runs single-threaded inside them, see gemm()); calling one from inside an OpenMP
//   parallel region runs it on the calling thread. Results do not depend on the thread count
//   except for the order of float sums in gemm reductions inside OpenBLAS/oneDNN (deterministic
//   for a fixed thread count and machine).
// - No allocation: scratch comes from the caller (attention's `scratch`). Exception: the oneDNN
//   fallback for 16-bit matmuls where the processor has no primitive (cpu/onednn.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <type_traits>
#include <string>

#include "core/dtype.h"
#include "kernels/adamw_step.h"

#define DS_FOR_EACH_STORAGE(X) X(float) X(::ds::rt::bf16) X(::ds::rt::f16)
#define DS_FOR_EACH_STORAGE_GRAD(X)                                                  \
  X(float, float) X(::ds::rt::bf16, ::ds::rt::bf16) X(::ds::rt::bf16, float)          \
  X(::ds::rt::f16, ::ds::rt::f16) X(::ds::rt::f16, float)

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

// ---- the storage-typed ops (kernels/ops.def: shapes, accumulation and null rules) --------------

#define DS_NOT_DEDUCED(T) std::type_identity_t<T>
#define DS_KERNEL_OP(name, params, args) template <typename S> void name params;
#define DS_KERNEL_OP_G(name, params, args) template <typename S, typename G> void name params;
#include "kernels/ops.def"

// ---- attention scratch ------------------------------------------------------------------------

// Floats of scratch the attention kernels need (ops.def): per OpenMP thread 2 x T x T (the
// score tiles of one head); with 16-bit storage of `storage_bytes` also 8 x T x hs, the head's
// q, k, v, out, dout and dq, dk, dv in fp32 (each head is converted once and runs the fp32 code).
size_t attention_scratch_floats(int T, int hs = 0, int storage_bytes = 4);

// ---- ring attention's merge (context parallelism; attention_block.cpp) ------------------------

// Floats of scratch attention_block_forward/backward (ops.def) need per OpenMP thread, enough for
// either: one head's q, out and dout (Tq, hd each) and D (Tq), the block's k and v (Tk, hd each),
// and two score tiles (64, Tk), all fp32. layout::ring_attention_scratch counts the same.
size_t attention_block_scratch_floats(int Tq, int Tk, int hd);

// Merges a partial result of attention_block_forward (ops.def) into (out, lse) by the
// log-sum-exps, in place: afterwards they are the attention over the union of both key sets.
// out/part (B,T,NH hd), lse/part_lse (B,NH,T), fp32; a part row with lse -inf changes nothing.
void attention_merge(float* out, float* lse, const float* part, const float* part_lse, int B, int T, int NH,
                     int hd);

// The mixture of experts' routed slots (ids (NK) of experts in [0, E), slot s = row * k + j)
// sorted by expert, stably: slots (NK) the slot at each sorted position, pos (NK) each slot's
// sorted position, offsets (E+1) where each expert's run starts (offsets[E] = NK). invalid_argument
// for an expert id outside [0, E).
void moe_sort_slots(int32_t* slots, int32_t* pos, int32_t* offsets, const int32_t* idx, int64_t NK, int E);
// out[i] = in[idx[i]] for i < n (fp32 values between token and expert order).
void moe_gather_f32(float* out, const float* in, const int32_t* idx, int64_t n);

// While one lives, the matmuls this thread runs have row counts that change from call to call (the
// mixture of experts' per-expert products: an expert's share of the tokens): the oneDNN products
// (cpu/onednn.h) then use one primitive with run-time M and K for every row count instead of
// creating (0.1-1 ms) and caching one per exact shape. Scopes nest.
class VariableMatmulRows {
 public:
  VariableMatmulRows();
  ~VariableMatmulRows();
  VariableMatmulRows(const VariableMatmulRows&) = delete;
  VariableMatmulRows& operator=(const VariableMatmulRows&) = delete;

 private:
  bool saved_;
};

// ---- buffers ------------------------------------------------------------------------------------

// bytes of zeros at p, split across the OpenMP threads when large (a gradient buffer's memset is
// otherwise the one serial pass of a step).
void fill_zero(void* p, size_t bytes);
// x = the nearest bf16 (fp16) value of x, in place, rounding as core/dtype.h (tests and the
// CUDA comparison use it; training stores 16-bit values in 16-bit buffers).
void round_to_bf16_in_place(float* x, int64_t N);
void round_to_f16_in_place(float* x, int64_t N);

// ---- fused softmax + cross-entropy ----------------------------------------------------------------

inline constexpr int32_t kIgnoreTarget = -1;  // a masked-out target: no loss, no gradient

// losses (N) = -log softmax(logits[n, :V])[targets[n]]; logits (N,Vp), columns >= V ignored.
// A target of kIgnoreTarget (-1: a token the loss mask leaves out, data/sft.h) gets loss 0 and,
// backward, a row of zero dlogits. Returns the number of other targets outside [0, V) (their
// loss is NaN); 0 when all are valid.
template <typename S>
int64_t crossentropy_forward(float* losses, const S* logits, const int32_t* targets, int N, int V,
                             int Vp);
// As crossentropy_forward, and turns logits into dlogits IN PLACE:
// dlogits[n, v] = (softmax[n, v] - [v == targets[n]]) * dloss for v < V, 0 for V <= v < Vp.
template <typename S>
int64_t crossentropy_softmax_backward(float* losses, S* logits_to_dlogits, const int32_t* targets,
                                      float dloss, int N, int V, int Vp);

// ---- element type conversion (round to nearest even) ----------------------------------------------

void convert_f32_to_bf16(uint16_t* out, const float* inp, int64_t N);
void convert_bf16_to_f32(float* out, const uint16_t* inp, int64_t N);
void convert_f32_to_f16(uint16_t* out, const float* inp, int64_t N);
void convert_f16_to_f32(float* out, const uint16_t* inp, int64_t N);
// out (N, type D) = inp (N, type S) converted through fp32 (rounded once); D == S is a copy.
template <typename D, typename S>
void convert(D* out, const S* inp, int64_t N);

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
// Mixed precision: the fp32 master `params` updated with gradients of type G, and when
// params_out is not null the updated weights rounded into it (type S, the model's working copy)
// in the same pass. Same formula, element for element, as adamw_update.
template <typename G, typename S>
void adamw_update_partition_mixed(const kern::AdamWStep& s, float* params, const G* grads,
                                  float* exp_avg, float* exp_avg_sq, int64_t begin, int64_t count,
                                  std::span<const kern::DecayRange> decay, S* params_out);

// Sum of x[i]^2 accumulated in double; inf/nan inputs make it non-finite. Deterministic for a
// given thread count (each thread sums one contiguous block; blocks are added in thread order).
template <typename S>
double sum_of_squares(const S* x, int64_t n);
// True when every element is finite (no inf, no nan).
template <typename S>
bool all_finite(const S* x, int64_t n);

// ---- what ran ---------------------------------------------------------------------------------------

// One line per matmul implementation used so far in this process: "fp32 matmul: brg:avx512_core"
// (oneDNN's implementation string), "bf16 matmul: ..." or "... fp32 fallback" where oneDNN had no
// 16-bit primitive; then, once a bf16 attention has run, which path it took ("bf16 attention:
// avx512_bf16 dot products" or "... fp32 compute"). For `dstrain report` and the run's summary.
std::string kernel_report();
// The bf16 attention part of kernel_report() ("" until a bf16 attention ran).
std::string attention_report();
// oneDNN's version, "3.x.y (commit ...)", as the library linked at run time reports it.
std::string onednn_version();

// ---- rotary position embeddings: the tables ---------------------------------------------------
// Tables for positions [0, T): cos/sin (T, hd/2), angle t * theta^(-2i/hd) (HF's inv_freq); fp32
// whatever the storage type.
void rope_tables(float* cos, float* sin, int T, int hd, double theta);

}  // namespace ds::rt::cpu
