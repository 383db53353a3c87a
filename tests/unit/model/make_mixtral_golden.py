#!/usr/bin/python3
"""Writes the Mixtral golden data: tests/data/mixtral_golden.safetensors (the weights, F32, in
Hugging Face's names), tests/data/mixtral_golden_grads.safetensors (d objective / d every weight,
F32 of float64 values) and tests/data/mixtral_golden.json (shape, tokens, targets, the
cross-entropy, the load-balancing loss and the objective). PyTorch float64 autograd over plain
torch ops, independent of dstrain's kernels. Run once with Debian's python3-torch:
    /usr/bin/python3 tests/unit/model/make_mixtral_golden.py

The model follows Hugging Face's MixtralForCausalLM (transformers' models/mixtral/modeling_mixtral.py),
checked function by function against it (docs/moe.md, "How the reference was checked"):
  - attention, norms and RoPE are LlamaForCausalLM's (make_llama_golden.py);
  - MixtralSparseMoeBlock: router_logits = gate(x); routing_weights = softmax(router_logits, dim=1,
    dtype=float); topk(routing_weights, top_k); routing_weights /= their sum; each expert
    (MixtralBlockSparseTop2MLP) computes w2(silu(w1 x) * w3 x), scaled by its routing weight and
    index_add_-ed into the output;
  - load_balancing_loss_func(router_logits of every layer concatenated, E, top_k):
    tokens_per_expert = mean(one_hot(selected), dim=0) (k, E); router_prob_per_expert =
    mean(softmax(logits), dim=0) (E); E * sum(tokens_per_expert * router_prob_per_expert);
  - the objective: mean cross-entropy + router_aux_loss_coef * aux_loss (HF with
    output_router_logits=True). The targets are given already shifted (dstrain's convention).
The seed is chosen so that no row's k-th and (k+1)-th router probabilities are within 1e-3 of each
other: fp32 and float64 then route every token the same way."""
import json
import math
import os
import struct

import torch

L, NH, KV, C, I, E, K, V, T_MAX = 2, 4, 2, 32, 24, 4, 2, 64, 16
B, T = 2, 7
THETA, EPS, COEF = 10000.0, 1e-5, 0.05
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
                (p + "block_sparse_moe.gate.weight", (E, C))]
        for e in range(E):
            q = p + f"block_sparse_moe.experts.{e}."
            out += [(q + "w1.weight", (I, C)), (q + "w2.weight", (C, I)), (q + "w3.weight", (I, C))]
    out += [("model.norm.weight", (C,)), ("lm_head.weight", (V, C))]
    return out


def make_weights(seed):
    g = torch.Generator().manual_seed(seed)
    w = {}
    for name, shape in names_and_shapes():
        r = torch.randn(shape, generator=g, dtype=torch.float32)
        if "layernorm" in name or name.endswith("norm.weight"):
            w[name] = 1.0 + 0.1 * r
        elif name.endswith("gate.weight"):
            w[name] = 0.5 * r  # a decisive router
        else:
            w[name] = 0.15 * r
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


def sparse_moe_block(w, p, x):
    """MixtralSparseMoeBlock.forward: (B,T,C) -> (B,T,C) and the router logits (B*T, E)."""
    h = x.reshape(-1, C)
    router_logits = h @ w[p + "block_sparse_moe.gate.weight"].T
    routing_weights = torch.softmax(router_logits, dim=1, dtype=router_logits.dtype)
    routing_weights, selected = torch.topk(routing_weights, K, dim=-1)
    routing_weights = routing_weights / routing_weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(h)
    expert_mask = torch.nn.functional.one_hot(selected, num_classes=E).permute(2, 1, 0)
    for e in range(E):
        q = p + f"block_sparse_moe.experts.{e}."
        idx, top_x = torch.where(expert_mask[e])
        cur = h[top_x]
        y = (torch.nn.functional.silu(cur @ w[q + "w1.weight"].T) * (cur @ w[q + "w3.weight"].T)) @ w[q + "w2.weight"].T
        out = out.index_add(0, top_x, y * routing_weights[top_x, idx, None])
    return out.view(B, T, C), router_logits


def load_balancing_loss(gate_logits):
    logits = torch.cat(gate_logits, dim=0)
    routing_weights = torch.softmax(logits, dim=-1)
    _, selected = torch.topk(routing_weights, K, dim=-1)
    expert_mask = torch.nn.functional.one_hot(selected, E)
    tokens_per_expert = torch.mean(expert_mask.to(routing_weights.dtype), dim=0)
    router_prob_per_expert = torch.mean(routing_weights, dim=0)
    return torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * E


def forward(w, tokens, targets):
    inv_freq = 1.0 / (THETA ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    x = w["model.embed_tokens.weight"][tokens]
    router_logits = []
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
        moe, logits = sparse_moe_block(w, p, rmsnorm(h, w[p + "post_attention_layernorm.weight"]))
        router_logits.append(logits)
        x = h + moe
    out = rmsnorm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T
    ce = torch.nn.functional.cross_entropy(out.view(-1, V), targets.view(-1))
    return ce, load_balancing_loss(router_logits), router_logits


def routing_margin(router_logits):
    p = torch.softmax(torch.cat(router_logits, dim=0), dim=-1)
    top = torch.topk(p, K + 1, dim=-1).values
    return (top[:, K - 1] - top[:, K]).min().item()


def main():
    g = torch.Generator().manual_seed(7)
    seq = torch.randint(0, V, (B, T + 1), generator=g)
    tokens, targets = seq[:, :T].contiguous(), seq[:, 1:].contiguous()
    for seed in range(20240611, 20240711):
        w32 = make_weights(seed)
        w = {n: t.to(torch.float64).requires_grad_(True) for n, t in w32.items()}
        ce, aux, logits = forward(w, tokens, targets)
        if routing_margin(logits) > 1e-3:
            break
    objective = ce + COEF * aux
    objective.backward()
    write_safetensors(os.path.join(DATA, "mixtral_golden.safetensors"), w32)
    write_safetensors(os.path.join(DATA, "mixtral_golden_grads.safetensors"), {n: t.grad for n, t in w.items()})
    meta = {"n_layer": L, "n_head": NH, "n_kv_head": KV, "n_embd": C, "intermediate_size": I, "vocab_size": V,
            "num_local_experts": E, "num_experts_per_tok": K, "router_aux_loss_coef": COEF,
            "seq_len": T_MAX, "rope_theta": THETA, "norm_eps": EPS, "B": B, "T": T, "seed": seed,
            "routing_margin": routing_margin(logits),
            "tokens": tokens.flatten().tolist(), "targets": targets.flatten().tolist(), "loss": ce.item(),
            "aux_loss": aux.item(), "objective": objective.item()}
    with open(os.path.join(DATA, "mixtral_golden.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"seed {seed} margin {routing_margin(logits):.4f} ce {ce.item():.10f} aux {aux.item():.10f} "
          f"(ln V = {math.log(V):.4f})")


if __name__ == "__main__":
    main()
