#!/usr/bin/python3
"""Writes the Llama golden data: tests/data/llama_golden.safetensors (the weights, F32),
tests/data/llama_golden_grads.safetensors (d loss / d every weight, F32 of float64 values) and
tests/data/llama_golden.json (shape, tokens, targets, loss). PyTorch float64 autograd over plain
torch ops, independent of dstrain's kernels. Run once with Debian's python3-torch:
    /usr/bin/python3 tests/unit/model/make_llama_golden.py

The model follows Hugging Face's LlamaForCausalLM (transformers' models/llama/modeling_llama.py),
checked line by line against it (see docs/llama.md, "How the reference was checked"):
  - LlamaRMSNorm: x * rsqrt(mean(x^2, -1) + eps) * weight, computed in fp32/float64;
  - LlamaRotaryEmbedding: inv_freq = 1 / theta^(arange(0, hd, 2) / hd), emb = cat(freqs, freqs);
    apply_rotary_pos_emb: q * cos + rotate_half(q) * sin, rotate_half(x) = cat(-x2, x1);
  - repeat_kv: kv head g serves query heads g*n_rep .. g*n_rep + n_rep - 1;
  - eager attention: softmax(q k^T * hd^-0.5 + causal mask) v, then o_proj;
  - LlamaMLP: down_proj(silu(gate_proj(x)) * up_proj(x));
  - decoder layer: x + attn(input_layernorm(x)), then h + mlp(post_attention_layernorm(h));
  - final norm, lm_head (untied here), mean cross-entropy. HF's forward(labels=...) shifts the
    labels itself; here the targets are given already shifted (dstrain's convention), which is
    the same loss.
Weights are float32 values (so dstrain reads them exactly) used in float64. The safetensors
files are written by the small writer below (no safetensors package)."""
import json
import math
import os
import struct

import torch

L, NH, KV, C, I, V, T_MAX = 2, 4, 2, 32, 48, 64, 16
B, T = 2, 7
THETA, EPS = 10000.0, 1e-5
HD = C // NH
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "data")


def names_and_shapes():
    out = [("model.embed_tokens.weight", (V, C))]
    for l in range(L):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", (C,)), (p + "self_attn.q_proj.weight", (NH * HD, C)),
                (p + "self_attn.k_proj.weight", (KV * HD, C)), (p + "self_attn.v_proj.weight", (KV * HD, C)),
                (p + "self_attn.o_proj.weight", (C, NH * HD)), (p + "post_attention_layernorm.weight", (C,)),
                (p + "mlp.gate_proj.weight", (I, C)), (p + "mlp.up_proj.weight", (I, C)),
                (p + "mlp.down_proj.weight", (C, I))]
    out += [("model.norm.weight", (C,)), ("lm_head.weight", (V, C))]
    return out


def make_weights():
    g = torch.Generator().manual_seed(20240611)
    w = {}
    for name, shape in names_and_shapes():
        r = torch.randn(shape, generator=g, dtype=torch.float32)
        w[name] = (1.0 + 0.1 * r) if name.endswith("norm.weight") or "layernorm" in name else 0.15 * r
    return w


def write_safetensors(path, tensors):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        raw = t.to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def rmsnorm(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def rotate_half(x):
    return torch.cat((-x[..., HD // 2:], x[..., : HD // 2]), dim=-1)


def forward(w, tokens, targets):
    inv_freq = 1.0 / (THETA ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    x = w["model.embed_tokens.weight"][tokens]
    for l in range(L):
        p = f"model.layers.{l}."
        n1 = rmsnorm(x, w[p + "input_layernorm.weight"])
        q = (n1 @ w[p + "self_attn.q_proj.weight"].T).view(B, T, NH, HD).transpose(1, 2)
        k = (n1 @ w[p + "self_attn.k_proj.weight"].T).view(B, T, KV, HD).transpose(1, 2)
        v = (n1 @ w[p + "self_attn.v_proj.weight"].T).view(B, T, KV, HD).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // KV, dim=1)
        v = v.repeat_interleave(NH // KV, dim=1)
        att = (q @ k.transpose(-2, -1)) * HD ** -0.5
        att = torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, NH * HD)
        h = x + y @ w[p + "self_attn.o_proj.weight"].T
        n2 = rmsnorm(h, w[p + "post_attention_layernorm.weight"])
        gate = n2 @ w[p + "mlp.gate_proj.weight"].T
        up = n2 @ w[p + "mlp.up_proj.weight"].T
        x = h + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    logits = rmsnorm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T
    return torch.nn.functional.cross_entropy(logits.view(-1, V), targets.view(-1))


def main():
    w32 = make_weights()
    g = torch.Generator().manual_seed(7)
    seq = torch.randint(0, V, (B, T + 1), generator=g)
    tokens, targets = seq[:, :T].contiguous(), seq[:, 1:].contiguous()
    w = {n: t.to(torch.float64).requires_grad_(True) for n, t in w32.items()}
    loss = forward(w, tokens, targets)
    loss.backward()
    write_safetensors(os.path.join(DATA, "llama_golden.safetensors"), w32)
    write_safetensors(os.path.join(DATA, "llama_golden_grads.safetensors"), {n: t.grad for n, t in w.items()})
    meta = {"n_layer": L, "n_head": NH, "n_kv_head": KV, "n_embd": C, "intermediate_size": I, "vocab_size": V,
            "seq_len": T_MAX, "rope_theta": THETA, "norm_eps": EPS, "B": B, "T": T,
            "tokens": tokens.flatten().tolist(), "targets": targets.flatten().tolist(), "loss": loss.item()}
    with open(os.path.join(DATA, "llama_golden.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"loss {loss.item():.10f} (ln V = {math.log(V):.4f})")


if __name__ == "__main__":
    main()
