// CUDA kernels of the Llama model (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention):
// the twins of runtime/kernels/cpu/llama_kernels.h with the same arguments plus a trailing
// cudaStream_t, over DEVICE pointers. kernels/llama_typed.h is the only place meant to pick
// between the two sets; code outside the CUDA module reaches these through its table
// (kernels/cuda_llama_table.h).
//
// CUDA-free like kernels/cuda/kernels.h (host code includes it), whose conventions hold here:
// current-device pointers, asynchronous on `stream`, parameter gradients ACCUMULATE, input
// gradients as each function says, failures as ds::Error naming the call.
//
// Element types: the plain names take fp32 storage. The *_bf16 names take bf16 storage (uint16_t
// holding bf16 bits, rounded to nearest even exactly as core/dtype.h); as everywhere in the
// module, a bf16 variant's PARAMETER GRADIENTS are fp32 (rmsnorm_backward_bf16's dweight), and
// rmsnorm_backward_bf16_gbf16 is the one with bf16 parameter gradients (grad_accum_dtype bf16).
// Arithmetic is fp32 whatever the storage, each output rounded once, as the CPU templates do;
// statistics (rstd, lse) and the RoPE cos/sin tables are fp32 device buffers.
//
// Agreement with the CPU: element-wise kernels (RoPE, SwiGLU, RMSNorm's row outputs) to ~1e-6
// relative at fp32 (expf against the CPU's polynomial exp; sums in another order); RMSNorm's
// dweight and attention sum in another order (~1e-4, attention's backward ~1e-3 as GPT-2's).
// Deterministic: no atomics anywhere; every output element is written by one thread or warp.
//
// Legend: N = rows (B*T), C = channels, NH = query heads, KV = kv heads (NH % KV == 0), hd = head
// size (even, <= kMaxHeadSize), I = the SwiGLU width, T = sequence length.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/kernels.h"  // cudaStream_t, kMaxHeadSize

namespace ds::rt::cuda {

// ---- RMSNorm: one warp per row; dweight by a (32, 8) block per 32 channels, fixed order ---------

// out (N,C) = inp * rstd * weight, rstd (N) = 1 / sqrt(mean(inp^2) + eps).
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                     int C, float eps, cudaStream_t stream);
// dinp ACCUMULATES (+=), dweight accumulates.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int64_t N, int C,
                      cudaStream_t stream);
void rmsnorm_forward_bf16(uint16_t* out, float* rstd, const uint16_t* inp, const uint16_t* weight,
                          int64_t N, int C, float eps, cudaStream_t stream);
// bf16 dinp, fp32 dweight.
void rmsnorm_backward_bf16(uint16_t* dinp, float* dweight, const uint16_t* dout,
                           const uint16_t* inp, const uint16_t* weight, const float* rstd,
                           int64_t N, int C, cudaStream_t stream);
// bf16 dinp and dweight (the fp32 column sum is added to dweight and rounded once).
void rmsnorm_backward_bf16_gbf16(uint16_t* dinp, uint16_t* dweight, const uint16_t* dout,
                                 const uint16_t* inp, const uint16_t* weight, const float* rstd,
                                 int64_t N, int C, cudaStream_t stream);

// ---- rotary embeddings (rotate_half), in place, one thread per rotated pair ---------------------

// As cpu::rope_forward: `heads` heads of hd values `offset` elements into each row of x (row
// stride `stride`; row b*T + t has position t); cos/sin (T, hd/2) fp32 on the device (computed
// on the host by cpu::rope_tables and uploaded once). backward: the transpose rotation.
void rope_forward(float* x, const float* cos, const float* sin, int B, int T, int heads, int hd,
                  int stride, int offset, cudaStream_t stream);
void rope_backward(float* dx, const float* cos, const float* sin, int B, int T, int heads, int hd,
                   int stride, int offset, cudaStream_t stream);
void rope_forward_bf16(uint16_t* x, const float* cos, const float* sin, int B, int T, int heads,
                       int hd, int stride, int offset, cudaStream_t stream);
void rope_backward_bf16(uint16_t* dx, const float* cos, const float* sin, int B, int T, int heads,
                        int hd, int stride, int offset, cudaStream_t stream);

// ---- SwiGLU: silu(gate) * up over the stacked (gate | up) rows, grid-stride --------------------

// gu (N, 2I), out (N, I). backward: dgu (N, 2I) overwritten.
void swiglu_forward(float* out, const float* gu, int64_t N, int I, cudaStream_t stream);
void swiglu_backward(float* dgu, const float* dout, const float* gu, int64_t N, int I,
                     cudaStream_t stream);
void swiglu_forward_bf16(uint16_t* out, const uint16_t* gu, int64_t N, int I, cudaStream_t stream);
void swiglu_backward_bf16(uint16_t* dgu, const uint16_t* dout, const uint16_t* gu, int64_t N, int I,
                          cudaStream_t stream);

// ---- causal grouped-query attention, k and v read in place --------------------------------------

// qkv (B,T,(NH+2KV)hd): q heads, then k heads, then v heads; query head h reads kv head
// h / (NH/KV). out (B,T,NH hd), lse (B,NH,T). No scratch: `scratch` may be null and is ignored
// (the model's att_scratch is 0 floats on CUDA, as GPT-2's). Throws ds::Error up front when hd is
// odd or above kMaxHeadSize, or NH is not a multiple of KV.
// Forward: one warp per (b, h, query row), online softmax (GPT-2's attention.cu).
void attention_gqa_forward(float* out, float* lse, const float* qkv, float* scratch, int B, int T,
                           int NH, int KV, int hd, cudaStream_t stream);
// dqkv (B,T,(NH+2KV)hd) overwritten. dq: one warp per (b, h, query row); dk, dv: one warp per
// (b, kv head, key row), walking the group's query heads in head order and every later query row,
// summing in fp32 registers and writing once (no atomics, no scratch, deterministic).
void attention_gqa_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                            const float* lse, float* scratch, int B, int T, int NH, int KV, int hd,
                            cudaStream_t stream);
void attention_gqa_forward_bf16(uint16_t* out, float* lse, const uint16_t* qkv, float* scratch,
                                int B, int T, int NH, int KV, int hd, cudaStream_t stream);
void attention_gqa_backward_bf16(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv,
                                 const uint16_t* out, const float* lse, float* scratch, int B,
                                 int T, int NH, int KV, int hd, cudaStream_t stream);

}  // namespace ds::rt::cuda
