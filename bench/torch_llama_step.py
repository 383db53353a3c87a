#!/usr/bin/python3
"""PyTorch peer of bench/step_bench's Llama row (--config L): Hugging Face's LlamaForCausalLM
(transformers' models/llama/modeling_llama.py, as docs/llama.md describes it and
tests/unit/model/make_llama_golden.py checks it) in plain torch ops, and the same step (forward,
backward, AdamW); prints "torch L-<precision> ms_per_step <median> cpu_ms_per_step <median> ...".
step_bench runs it with /usr/bin/python3 (Debian's python3-torch 1.13, which has no
scaled_dot_product_attention, so attention is HF's eager path) in the same environment.
--precision bf16 runs the forward and the loss under torch.autocast("cpu", dtype=torch.bfloat16)
(fp32 parameters and optimizer, PyTorch's CPU mixed precision); fp32 runs without it.

Where autocast meets the model it does what HF's modules do: RMSNorm computes in fp32 and casts
back to the input type before the weight; the RoPE tables are fp32, cast to q/k's type; the
attention softmax runs in fp32 (eager_attention_forward's softmax(dtype=float32)).

  /usr/bin/python3 bench/torch_llama_step.py --precision fp32 --steps 10 --warmup 2 --threads 2

Not here: HF's KV cache, dropout (attention_dropout 0), padding masks; the golden model's float64
check (make_llama_golden.py)."""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt2_step import parse_args, time_steps  # noqa: E402  the GPT-2 peer's command line and timed loop

CONFIGS = {  # L, NH, KV, C, I, V, maxT, B, T
    "L": (4, 4, 2, 256, 704, 4096, 128, 8, 128),
}
THETA, EPS = 10000.0, 1e-5


class RMSNorm(nn.Module):  # LlamaRMSNorm
    def __init__(self, C):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
        return self.weight * h.to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Layer(nn.Module):  # LlamaDecoderLayer: LlamaAttention, LlamaMLP, no biases
    def __init__(self, NH, KV, C, I):
        super().__init__()
        self.NH, self.KV, self.hd = NH, KV, C // NH
        self.input_layernorm = RMSNorm(C)
        self.q_proj = nn.Linear(C, NH * self.hd, bias=False)
        self.k_proj = nn.Linear(C, KV * self.hd, bias=False)
        self.v_proj = nn.Linear(C, KV * self.hd, bias=False)
        self.o_proj = nn.Linear(NH * self.hd, C, bias=False)
        self.post_attention_layernorm = RMSNorm(C)
        self.gate_proj = nn.Linear(C, I, bias=False)
        self.up_proj = nn.Linear(C, I, bias=False)
        self.down_proj = nn.Linear(I, C, bias=False)

    def mlp(self, n):  # LlamaMLP
        return self.down_proj(F.silu(self.gate_proj(n)) * self.up_proj(n))

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        n = self.input_layernorm(x)
        q = self.q_proj(n).view(B, T, self.NH, self.hd).transpose(1, 2)
        k = self.k_proj(n).view(B, T, self.KV, self.hd).transpose(1, 2)
        v = self.v_proj(n).view(B, T, self.KV, self.hd).transpose(1, 2)
        c, s = cos.to(q.dtype), sin.to(q.dtype)
        q = q * c + rotate_half(q) * s  # apply_rotary_pos_emb
        k = k * c + rotate_half(k) * s
        rep = self.NH // self.KV  # repeat_kv: kv head g serves query heads g*rep .. g*rep + rep - 1
        k = k[:, :, None].expand(B, self.KV, rep, T, self.hd).reshape(B, self.NH, T, self.hd)
        v = v[:, :, None].expand(B, self.KV, rep, T, self.hd).reshape(B, self.NH, T, self.hd)
        att = (q @ k.transpose(-2, -1)) * self.hd ** -0.5
        att = att + mask.to(att.dtype)
        att = F.softmax(att, dim=-1, dtype=torch.float32).to(q.dtype)
        y = (att @ v).transpose(1, 2).reshape(B, T, self.NH * self.hd)
        h = x + self.o_proj(y)
        return h + self.mlp(self.post_attention_layernorm(h))


class Llama(nn.Module):  # LlamaForCausalLM, untied lm_head
    def __init__(self, L, NH, KV, C, I, V, maxT, layer=Layer):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, C)
        self.layers = nn.ModuleList([layer(NH, KV, C, I) for _ in range(L)])
        self.norm = RMSNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        hd = C // NH
        inv_freq = 1.0 / (THETA ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        emb = torch.outer(torch.arange(maxT, dtype=torch.float32), inv_freq)
        emb = torch.cat((emb, emb), dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())
        self.register_buffer("mask", torch.full((maxT, maxT), float("-inf")).triu(1))
        for p in self.parameters():  # HF's _init_weights: normal(0, initializer_range 0.02)
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, self.cos[:T], self.sin[:T], self.mask[:T, :T])
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def main():
    a = parse_args(CONFIGS, "L")
    L, NH, KV, C, I, V, maxT, B, T = CONFIGS[a.config]
    model = Llama(L, NH, KV, C, I, V, maxT)
    idx = torch.randint(0, V, (B, T))
    tgt = torch.roll(idx, -1, 1)
    time_steps(model, idx, tgt, a)


if __name__ == "__main__":
    main()
