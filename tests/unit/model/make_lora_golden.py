#!/usr/bin/python3
"""Writes the LoRA golden data from the Llama golden model (make_llama_golden.py: the same weights,
tokens and targets): a PEFT adapter directory tests/data/lora_golden/ (adapter_config.json and
adapter_model.safetensors, every linear layer adapted, r = 4, lora_alpha = 8, A and B both
non-zero), tests/data/lora_golden_grads.safetensors (d loss / d every A and B, PEFT's names) and
tests/data/lora_golden.json (the loss). PyTorch float64 autograd over plain torch ops. Run once with
Debian's python3-torch:
    /usr/bin/python3 tests/unit/model/make_lora_golden.py

The adapters follow PEFT's LoraLayer (peft/tuners/lora/layer.py, Linear.forward): for each
adapted nn.Linear, result = base_layer(x) + lora_B(lora_A(dropout(x))) * scaling with
scaling = lora_alpha / r, lora_A an nn.Linear(in, r, bias=False) (weight (r, in)) and lora_B an
nn.Linear(r, out, bias=False) (weight (out, r)); dropout 0 here. The base weights have no
gradient (requires_grad False), as PEFT freezes them. Tensor names:
base_model.model.<module>.lora_A.weight, as PeftModel.save_pretrained writes them."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_llama_golden as g  # noqa: E402

R, ALPHA = 4, 8.0
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA_DIR = os.path.join(g.DATA, "lora_golden")


def modules():
    out = []
    for l in range(g.L):
        for t in TARGETS:
            group = "self_attn" if t in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            out.append(f"model.layers.{l}.{group}.{t}")
    return out


def forward(w, lora, tokens, targets):
    B, T, NH, KV, HD = g.B, g.T, g.NH, g.KV, g.HD
    scaling = ALPHA / R

    def lin(x, module):
        y = x @ w[module + ".weight"].T
        if module in lora:
            a, b = lora[module]
            y = y + ((x @ a.T) @ b.T) * scaling
        return y

    inv_freq = 1.0 / (g.THETA ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    x = w["model.embed_tokens.weight"][tokens]
    for l in range(g.L):
        p = f"model.layers.{l}."
        n1 = g.rmsnorm(x, w[p + "input_layernorm.weight"])
        q = lin(n1, p + "self_attn.q_proj").view(B, T, NH, HD).transpose(1, 2)
        k = lin(n1, p + "self_attn.k_proj").view(B, T, KV, HD).transpose(1, 2)
        v = lin(n1, p + "self_attn.v_proj").view(B, T, KV, HD).transpose(1, 2)
        q = q * cos + g.rotate_half(q) * sin
        k = k * cos + g.rotate_half(k) * sin
        k = k.repeat_interleave(NH // KV, dim=1)
        v = v.repeat_interleave(NH // KV, dim=1)
        att = (q @ k.transpose(-2, -1)) * HD ** -0.5
        att = torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, NH * HD)
        h = x + lin(y, p + "self_attn.o_proj")
        n2 = g.rmsnorm(h, w[p + "post_attention_layernorm.weight"])
        gate = lin(n2, p + "mlp.gate_proj")
        up = lin(n2, p + "mlp.up_proj")
        x = h + lin(torch.nn.functional.silu(gate) * up, p + "mlp.down_proj")
    logits = g.rmsnorm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T
    return torch.nn.functional.cross_entropy(logits.view(-1, g.V), targets.view(-1))


def main():
    w32 = g.make_weights()
    gen = torch.Generator().manual_seed(7)
    seq = torch.randint(0, g.V, (g.B, g.T + 1), generator=gen)
    tokens, targets = seq[:, :g.T].contiguous(), seq[:, 1:].contiguous()
    w = {n: t.to(torch.float64) for n, t in w32.items()}  # frozen
    shapes = dict(g.names_and_shapes())
    lg = torch.Generator().manual_seed(20261205)
    lora32 = {}
    for m in modules():
        out, inp = shapes[m + ".weight"]
        a = torch.randn((R, inp), generator=lg, dtype=torch.float32) * 0.2
        b = torch.randn((out, R), generator=lg, dtype=torch.float32) * 0.2  # non-zero: a trained adapter
        lora32[m] = (a, b)
    lora = {m: (a.to(torch.float64).requires_grad_(True), b.to(torch.float64).requires_grad_(True))
            for m, (a, b) in lora32.items()}
    loss = forward(w, lora, tokens, targets)
    loss.backward()
    os.makedirs(LORA_DIR, exist_ok=True)
    name = lambda m, ab: f"base_model.model.{m}.lora_{ab}.weight"  # noqa: E731
    tensors, grads = {}, {}
    for m in modules():
        tensors[name(m, "A")], tensors[name(m, "B")] = lora32[m]
        grads[name(m, "A")], grads[name(m, "B")] = lora[m][0].grad, lora[m][1].grad
    g.write_safetensors(os.path.join(LORA_DIR, "adapter_model.safetensors"), tensors)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": R, "lora_alpha": ALPHA, "lora_dropout": 0.0,
              "target_modules": TARGETS, "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
              "base_model_name_or_path": "tests/data/llama_golden.safetensors", "modules_to_save": None,
              "init_lora_weights": True}
    with open(os.path.join(LORA_DIR, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=1)
        f.write("\n")
    g.write_safetensors(os.path.join(g.DATA, "lora_golden_grads.safetensors"), grads)
    with open(os.path.join(g.DATA, "lora_golden.json"), "w") as f:
        json.dump({"r": R, "lora_alpha": ALPHA, "loss": loss.item()}, f, indent=1)
        f.write("\n")
    print(f"loss with the adapters {loss.item():.10f}")


if __name__ == "__main__":
    main()
