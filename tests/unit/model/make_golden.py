#!/usr/bin/python3
"""Writes tests/data/gpt2_golden.json: the loss and selected gradients of a tiny GPT-2 computed
by PyTorch (float64, autograd), independently of dstrain's kernels. Run once with Debian's
PyTorch 1.13:  /usr/bin/python3 tests/unit/model/make_golden.py

The weights come from an integer hash of (tensor index in llm.c's order, layer, element index)
that golden_test.cpp computes the same way, so no weights need storing. The model is GPT-2 as
llm.c has it: token + position embeddings, pre-LayerNorm blocks (eps 1e-5) with fused QKV causal
attention and a tanh-GELU 4x MLP, final LayerNorm, lm_head tied to wte; loss = mean token
cross-entropy over the real vocabulary (padded rows of wte unused)."""
import json
import math
import os

import torch
import torch.nn.functional as F

L, NH, C, V, Vp, maxT = 2, 2, 16, 30, 32, 8
B, T = 2, 6
NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b",
         "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
SHAPES = {"wte": (Vp, C), "wpe": (maxT, C), "ln1w": (C,), "ln1b": (C,), "qkvw": (3 * C, C),
          "qkvb": (3 * C,), "attprojw": (C, C), "attprojb": (C,), "ln2w": (C,), "ln2b": (C,),
          "fcw": (4 * C, C), "fcb": (4 * C,), "fcprojw": (C, 4 * C), "fcprojb": (C,),
          "lnfw": (C,), "lnfb": (C,)}
PER_LAYER = set(NAMES[2:14])
M32 = 0xFFFFFFFF


def hash_value(tid, layer, i):
    x = (tid * 1000003 + (layer + 1) * 7919 + i * 2654435761) & M32
    x ^= x >> 16
    x = (x * 0x45D9F3B) & M32
    x ^= x >> 16
    x = (x * 0x45D9F3B) & M32
    x ^= x >> 16
    return (x / 4294967296.0 - 0.5) * 0.4  # uniform in [-0.2, 0.2)


def make_tensor(tid, name, layer):
    shape = SHAPES[name]
    n = math.prod(shape)
    vals = [hash_value(tid, layer, i) for i in range(n)]
    if name in ("ln1w", "ln2w", "lnfw"):
        vals = [1.0 + v for v in vals]
    # Round through float32 exactly as the C++ side does (static_cast<float>(double)).
    t = torch.tensor(vals, dtype=torch.float32).to(torch.float64).reshape(shape)
    return t.requires_grad_(True)


def tokens(seed, n, vocab):
    out, x = [], seed
    for _ in range(n):
        x = (x * 1664525 + 1013904223) & M32
        out.append((x >> 8) % vocab)
    return out


params = {}
for tid, name in enumerate(NAMES):
    if name in PER_LAYER:
        params[name] = [make_tensor(tid, name, l) for l in range(L)]
    else:
        params[name] = make_tensor(tid, name, -1)

inp = torch.tensor(tokens(11, B * T, V)).reshape(B, T)
tgt = torch.tensor(tokens(12, B * T, V)).reshape(B, T)


def layernorm(x, w, b):
    return F.layer_norm(x, (C,), w, b, eps=1e-5)


def forward():
    P = params
    x = P["wte"][inp] + P["wpe"][:T]
    hs = C // NH
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        h = layernorm(x, P["ln1w"][l], P["ln1b"][l])
        qkv = h @ P["qkvw"][l].T + P["qkvb"][l]
        q, k, v = qkv.split(C, dim=-1)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ P["attprojw"][l].T + P["attprojb"][l]
        h = layernorm(x, P["ln2w"][l], P["ln2b"][l])
        f = F.gelu(h @ P["fcw"][l].T + P["fcb"][l], approximate="tanh")
        x = x + f @ P["fcprojw"][l].T + P["fcprojb"][l]
    x = layernorm(x, P["lnfw"], P["lnfb"])
    logits = x @ P["wte"][:V].T
    return F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))


loss = forward()
loss.backward()

grads = []
for tid, name in enumerate(NAMES):
    layers = range(L) if name in PER_LAYER else [-1]
    for l in layers:
        t = params[name][l] if name in PER_LAYER else params[name]
        g = t.grad.reshape(-1)
        n = g.numel()
        for i in sorted({0, n // 3, (2 * n) // 3 + 1, n - 1}):
            if name == "wte" and i >= V * C:
                i = V * C - 1
            grads.append({"tensor": name, "layer": l, "index": i, "value": g[i].item()})
grads.append({"tensor": "wte", "layer": -1, "index": V * C + 3, "value": 0.0})  # padded row

out = {
    "produced_by": "tests/unit/model/make_golden.py with PyTorch " + torch.__version__ +
                   " in float64 autograd",
    "shape": {"n_layer": L, "n_head": NH, "n_embd": C, "vocab_size": V,
              "padded_vocab_size": Vp, "seq_len": maxT},
    "B": B, "T": T,
    "tokens": inp.reshape(-1).tolist(), "targets": tgt.reshape(-1).tolist(),
    "loss": loss.item(),
    "grads": grads,
}
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data",
                    "gpt2_golden.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
print("loss", loss.item(), "grads", len(grads), "->", os.path.normpath(path))
