#!/usr/bin/python3
"""PyTorch peer of bench/step_bench: the same GPT-2 (llm.c's architecture: tied lm_head, tanh
GELU, pre-LayerNorm, no dropout) and the same fp32 step (forward, backward, AdamW) for issue 4's
S and M configs; prints "torch <config> ms_per_step <median>". step_bench runs it with
/usr/bin/python3 (Debian's python3-torch 1.13) in the same environment. --precision bf16 runs the
forward and the loss under torch.autocast("cpu", dtype=torch.bfloat16) (fp32 parameters and
optimizer, PyTorch's CPU mixed precision); fp32 runs without it.

  /usr/bin/python3 bench/torch_gpt2_step.py --config S --precision fp32 --steps 10 --warmup 2 --threads 2"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {  # L, NH, C, V, maxT, B, T
    "S": (4, 4, 256, 4096, 128, 8, 128),
    "M": (6, 6, 384, 50304, 256, 4, 256),
}


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.attproj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        hs = C // self.NH
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, self.NH, hs).transpose(1, 2)
        k = k.view(B, T, self.NH, hs).transpose(1, 2)
        v = v.view(B, T, self.NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(mask[:T, :T] == 0, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.attproj(y)
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, NH, C, V, maxT):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(maxT, C)
        self.blocks = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.lnf = nn.LayerNorm(C)
        self.register_buffer("mask", torch.tril(torch.ones(maxT, maxT)))
        for n, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if "proj" in n else 0.02
                nn.init.normal_(p, 0.0, std)
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x, self.mask)
        logits = self.lnf(x) @ self.wte.weight.T  # tied lm_head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    a = parse_args(CONFIGS, "S")
    L, NH, C, V, maxT, B, T = CONFIGS[a.config]
    model = GPT(L, NH, C, V, maxT)
    idx = torch.randint(0, V, (B, T))
    tgt = torch.roll(idx, -1, 1)
    time_steps(model, idx, tgt, a)


def parse_args(configs, default):
    """Both peers' command line (--config, --steps, --warmup, --threads, --precision); sets
    torch's thread count and seed."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=default, choices=sorted(configs))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    return a


def time_steps(model, idx, tgt, a):
    """The timed steps (zero_grad, forward and loss, backward, AdamW) of `model` on one batch, as
    both peers run them; prints the line step_bench reads. `a`: the parsed arguments (config,
    precision, steps, warmup)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    times, cpu = [], []
    for s in range(a.warmup + a.steps):
        c0 = time.process_time()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if a.precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(idx, tgt)
        else:
            loss = model(idx, tgt)
        loss.backward()
        opt.step()
        if s >= a.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.process_time() - c0) * 1e3)
    n = sum(p.numel() for p in model.parameters())
    print(f"torch {a.config}-{a.precision} ms_per_step {statistics.median(times):.1f} "
          f"cpu_ms_per_step {statistics.median(cpu):.1f} params {n / 1e6:.2f}M "
          f"loss {loss.item():.4f} threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
