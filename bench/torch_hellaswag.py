#!/usr/bin/python3
"""PyTorch peer of `dstrain eval --task hellaswag` for bench/eval_bench.sh: the same GPT-2
(bench/torch_gpt2_step.py's llm.c architecture, its random initialisation) scores the same
HellaSwag-format jsonl with byte-level tokens (each ending encoded as " " + ending after the
context, as llm.c's hellaswag.py builds its rows), in torch.no_grad, fp32. --batch 1 pads each
item's four rows to the longest of them (llm.c's hellaswag.py); --batch N > 1 scores N items per
forward padded to --positions (dstrain's batch shape). Prints "torch batch N items_per_s X".

  /usr/bin/python3 bench/torch_hellaswag.py --data FILE --limit 32 --batch 8 --positions 160"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt2_step import GPT  # noqa: E402


def rows_of(item):
    ctx = list(item["ctx"].encode())
    return [(ctx + list((" " + e).encode()), len(ctx)) for e in item["endings"]]


def logits_of(model, idx):
    B, T = idx.shape
    x = model.wte(idx) + model.wpe(torch.arange(T))
    for b in model.blocks:
        x = b(x, model.mask)
    return model.lnf(x) @ model.wte.weight.T


def score(model, rows, T):
    idx = torch.zeros((len(rows), T), dtype=torch.long)
    tgt = torch.full((len(rows), T), -100, dtype=torch.long)
    for r, (toks, begin) in enumerate(rows):
        n = len(toks)
        idx[r, : n - 1] = torch.tensor(toks[:-1])
        tgt[r, begin - 1 : n - 1] = torch.tensor(toks[begin:])
    logits = logits_of(model, idx)
    losses = F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1), reduction="none").view(len(rows), T)
    return losses.sum(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--limit", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--positions", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT(12, 12, 768, 50257, 1024)
    items = [json.loads(l) for l in open(a.data) if l.strip()][: a.limit]
    with torch.no_grad():
        t0 = time.perf_counter()
        for i in range(0, len(items), a.batch):
            rows = [r for it in items[i : i + a.batch] for r in rows_of(it)]
            T = a.positions if a.batch > 1 else max(len(t) for t, _ in rows) - 1
            score(model, rows, T)
        s = time.perf_counter() - t0
    print(f"torch batch {a.batch} items_per_s {len(items) / s:.3f} threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
