// CPU kernels of the Llama model (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention),
// in the conventions of kernels.h: outputs first, then inputs, then shapes; parameter gradients
// ACCUMULATE, input gradients as each function says; OpenMP inside; no allocation.
// fp32 storage for now: the bodies are templates over the element type (llama_*.cpp), so the
// 16-bit storage types add overloads here, not new math.
//
// Legend: N = rows (B*T), C = channels, NH = query heads, KV = kv heads (NH % KV == 0), hd = head
// size, I = the SwiGLU width, T = sequence length.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ds::rt::cpu {

// ---- RMSNorm (Hugging Face's LlamaRMSNorm) -------------------------------------------------
// out (N,C) = inp * rstd * weight, rstd (N) = 1 / sqrt(mean(inp^2) + eps), computed in fp32.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int C, float eps);
// dinp ACCUMULATES (+=, the residual stream's gradient flows through it), dweight accumulates.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int64_t N, int C);

// ---- rotary position embeddings (rotate_half convention) -------------------------------------
// Tables for positions [0, T): cos/sin (T, hd/2), angle t * theta^(-2i/hd) (HF's inv_freq).
void rope_tables(float* cos, float* sin, int T, int hd, double theta);
// In place on `heads` consecutive heads of hd values starting `offset` elements into each row of
// x (rows of `stride` elements; row b*T + t has position t): for i < hd/2,
//   x[i], x[i + hd/2] <- x[i] cos - x[i + hd/2] sin, x[i + hd/2] cos + x[i] sin.
void rope_forward(float* x, const float* cos, const float* sin, int B, int T, int heads, int hd, int stride,
                  int offset);
// The transpose rotation, in place on the gradient: d(before) from d(after).
void rope_backward(float* dx, const float* cos, const float* sin, int B, int T, int heads, int hd, int stride,
                   int offset);

// ---- SwiGLU: silu(gate) * up ---------------------------------------------------------------
// gu (N, 2I): row n holds gate[0, I) then up[0, I) (one matmul with gate_proj and up_proj
// stacked); out (N, I) = silu(gate) * up.
void swiglu_forward(float* out, const float* gu, int64_t N, int I);
// dgu (N, 2I) overwritten from dout (N, I).
void swiglu_backward(float* dgu, const float* dout, const float* gu, int64_t N, int I);

// ---- causal grouped-query attention ---------------------------------------------------------
// qkv (B,T,(NH+2KV)hd): each row is q heads [0, NH), then k heads, then v heads; query head h
// reads kv head h / (NH/KV), in place (k and v are never expanded). out (B,T,NH hd);
// lse (B,NH,T). scratch: attention_scratch_floats(T) (kernels.h), 2 x T x T per thread.
// Forward parallelises over (b, h); backward over (b, kv head), each task walking its group of
// query heads so that dk and dv of a kv head are summed by one thread in a fixed order.
void attention_gqa_forward(float* out, float* lse, const float* qkv, float* scratch, int B, int T, int NH, int KV,
                           int hd);
// dqkv (B,T,(NH+2KV)hd) overwritten.
void attention_gqa_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                            float* scratch, int B, int T, int NH, int KV, int hd);

}  // namespace ds::rt::cpu
