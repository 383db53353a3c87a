#!/usr/bin/python3
"""Writes one tiny GPT-2's weights twice, in Hugging Face's and in llm.c's layout, and what
Hugging Face's GPT2LMHeadModel computes from them. Run once with Debian's python3-torch:
    /usr/bin/python3 tests/unit/model/make_gpt2_hf.py
It writes
  tests/data/gpt2_hf/model.safetensors  GPT2LMHeadModel's names, F32, the Conv1D weights
                                        (c_attn, attn.c_proj, c_fc, mlp.c_proj) stored (in, out);
                                        also lm_head.weight (equal to wte) and the causal-mask
                                        buffers attn.bias and attn.masked_bias that older files hold
  tests/data/gpt2_hf/config.json        GPT2Config's keys
  tests/data/gpt2_hf.bin                the same weights as an llm.c checkpoint (version 3): the
                                        matrices (out, in), tensor-major, wte padded to Vp rows of
                                        zeros beyond V
  tests/data/gpt2_hf.json               shape, tokens, targets, the mean loss and every position's
                                        logits of sequence 0
for tests/unit/model/gpt2_hf_test.cpp, which imports both files into dstrain and compares.

The reference forward follows transformers' models/gpt2/modeling_gpt2.py in plain torch ops,
float64: Conv1D is addmm(bias, x, weight) with weight (in, out); GPT2Attention splits c_attn's
output into q, k, v (each C columns, heads of C/NH), scores q k^T / sqrt(C/NH) with the causal
mask, softmax, then c_proj; GPT2MLP is c_proj(gelu_new(c_fc(x))) with gelu_new the tanh
approximation; blocks are x + attn(ln_1(x)), then h + mlp(ln_2(h)); ln_f; logits = h wte^T
(the tied lm_head). LayerNorm eps 1e-5. Targets come shifted (dstrain's convention; HF's
forward(labels=...) shifts itself, the same loss). The safetensors writer is the few lines
below (no safetensors package)."""
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

L, NH, C, V, VP, MAX_T = 2, 2, 16, 30, 32, 8
B, T = 2, 8
EPS = 1e-5
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "data")


def make_weights():
    """dstrain's (llm.c's) tensors, matrices (out, in), wte with V rows."""
    g = torch.Generator().manual_seed(20261205)

    def rnd(*shape, scale=0.2):
        return scale * torch.randn(shape, generator=g, dtype=torch.float32)

    w = {"wte": rnd(V, C), "wpe": rnd(MAX_T, C, scale=0.1)}
    for l in range(L):
        w[f"ln1w{l}"] = 1.0 + rnd(C, scale=0.1)
        w[f"ln1b{l}"] = rnd(C, scale=0.1)
        w[f"qkvw{l}"] = rnd(3 * C, C)
        w[f"qkvb{l}"] = rnd(3 * C, scale=0.1)
        w[f"attprojw{l}"] = rnd(C, C)
        w[f"attprojb{l}"] = rnd(C, scale=0.1)
        w[f"ln2w{l}"] = 1.0 + rnd(C, scale=0.1)
        w[f"ln2b{l}"] = rnd(C, scale=0.1)
        w[f"fcw{l}"] = rnd(4 * C, C)
        w[f"fcb{l}"] = rnd(4 * C, scale=0.1)
        w[f"fcprojw{l}"] = rnd(C, 4 * C, scale=0.1)
        w[f"fcprojb{l}"] = rnd(C, scale=0.1)
    w["lnfw"] = 1.0 + rnd(C, scale=0.1)
    w["lnfb"] = rnd(C, scale=0.1)
    return w


def hf_tensors(w):
    """GPT2LMHeadModel's state dict: Conv1D weights transposed to (in, out)."""
    t = {"transformer.wte.weight": w["wte"], "transformer.wpe.weight": w["wpe"]}
    for l in range(L):
        p = f"transformer.h.{l}."
        t[p + "ln_1.weight"] = w[f"ln1w{l}"]
        t[p + "ln_1.bias"] = w[f"ln1b{l}"]
        t[p + "attn.bias"] = torch.tril(torch.ones(MAX_T, MAX_T)).view(1, 1, MAX_T, MAX_T)
        t[p + "attn.masked_bias"] = torch.tensor(-1e4)
        t[p + "attn.c_attn.weight"] = w[f"qkvw{l}"].t().contiguous()
        t[p + "attn.c_attn.bias"] = w[f"qkvb{l}"]
        t[p + "attn.c_proj.weight"] = w[f"attprojw{l}"].t().contiguous()
        t[p + "attn.c_proj.bias"] = w[f"attprojb{l}"]
        t[p + "ln_2.weight"] = w[f"ln2w{l}"]
        t[p + "ln_2.bias"] = w[f"ln2b{l}"]
        t[p + "mlp.c_fc.weight"] = w[f"fcw{l}"].t().contiguous()
        t[p + "mlp.c_fc.bias"] = w[f"fcb{l}"]
        t[p + "mlp.c_proj.weight"] = w[f"fcprojw{l}"].t().contiguous()
        t[p + "mlp.c_proj.bias"] = w[f"fcprojb{l}"]
    t["transformer.ln_f.weight"] = w["lnfw"]
    t["transformer.ln_f.bias"] = w["lnfb"]
    t["lm_head.weight"] = w["wte"].clone()
    return t


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


def write_llmc(path, w):
    """llm.c's version 3 file: 256 int32 header, then each tensor for all layers, in llm.c's order."""
    header = [20240326, 3, MAX_T, V, L, NH, C, VP] + [0] * 248
    wte = torch.zeros(VP, C)
    wte[:V] = w["wte"]
    parts = [wte, w["wpe"]]
    for name in ["ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b", "fcw", "fcb",
                 "fcprojw", "fcprojb"]:
        parts += [w[f"{name}{l}"] for l in range(L)]
    parts += [w["lnfw"], w["lnfb"]]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        for p in parts:
            f.write(p.to(torch.float32).contiguous().numpy().tobytes())


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def hf_forward(t, idx):
    """GPT2LMHeadModel's forward from its own state dict (float64)."""
    d = {k: v.to(torch.float64) for k, v in t.items()}
    n, s = idx.shape
    hs = C // NH
    h = d["transformer.wte.weight"][idx] + d["transformer.wpe.weight"][torch.arange(s)]
    mask = torch.tril(torch.ones(s, s, dtype=torch.bool))
    for l in range(L):
        p = f"transformer.h.{l}."
        a = F.layer_norm(h, (C,), d[p + "ln_1.weight"], d[p + "ln_1.bias"], eps=EPS)
        qkv = torch.addmm(d[p + "attn.c_attn.bias"], a.reshape(-1, C), d[p + "attn.c_attn.weight"]).view(n, s, 3 * C)
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (x.view(n, s, NH, hs).transpose(1, 2) for x in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(n * s, C)
        h = h + torch.addmm(d[p + "attn.c_proj.bias"], y, d[p + "attn.c_proj.weight"]).view(n, s, C)
        m = F.layer_norm(h, (C,), d[p + "ln_2.weight"], d[p + "ln_2.bias"], eps=EPS)
        f = gelu_new(torch.addmm(d[p + "mlp.c_fc.bias"], m.reshape(-1, C), d[p + "mlp.c_fc.weight"]))
        h = h + torch.addmm(d[p + "mlp.c_proj.bias"], f, d[p + "mlp.c_proj.weight"]).view(n, s, C)
    h = F.layer_norm(h, (C,), d["transformer.ln_f.weight"], d["transformer.ln_f.bias"], eps=EPS)
    return h @ d["lm_head.weight"].t()


def main():
    w = make_weights()
    t = hf_tensors(w)
    os.makedirs(os.path.join(DATA, "gpt2_hf"), exist_ok=True)
    write_safetensors(os.path.join(DATA, "gpt2_hf", "model.safetensors"), t)
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
              "n_embd": C, "n_head": NH, "n_layer": L, "n_positions": MAX_T, "n_ctx": MAX_T, "n_inner": None,
              "vocab_size": V, "layer_norm_epsilon": EPS, "scale_attn_weights": True,
              "tie_word_embeddings": True, "torch_dtype": "float32"}
    with open(os.path.join(DATA, "gpt2_hf", "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    write_llmc(os.path.join(DATA, "gpt2_hf.bin"), w)

    g = torch.Generator().manual_seed(7)
    idx = torch.randint(0, V, (B, T), generator=g)
    tgt = torch.randint(0, V, (B, T), generator=g)
    logits = hf_forward(t, idx)
    loss = F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))
    out = {"shape": {"n_layer": L, "n_head": NH, "n_embd": C, "vocab_size": V, "padded_vocab_size": VP,
                     "seq_len": MAX_T},
           "B": B, "T": T, "tokens": idx.reshape(-1).tolist(), "targets": tgt.reshape(-1).tolist(),
           "loss": loss.item(), "logits0": logits[0].reshape(-1).tolist()}
    with open(os.path.join(DATA, "gpt2_hf.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
