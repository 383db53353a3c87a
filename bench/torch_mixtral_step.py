#!/usr/bin/python3
"""PyTorch peer of bench/step_bench's MoE row (--config MoE): Hugging Face's MixtralForCausalLM
(transformers' models/mixtral/modeling_mixtral.py, as tests/unit/model/make_mixtral_golden.py
checks it) in plain torch ops: Llama's attention (torch_llama_step.py) and, for every MLP,
MixtralSparseMoeBlock's eager loop over the experts (router softmax in fp32, top-k, renormalised
weights, each expert's tokens gathered with torch.where and index_add_-ed back), the objective
cross-entropy + router_aux_loss_coef * load_balancing_loss_func; the same step (forward, backward,
AdamW); prints "torch MoE-<precision> ms_per_step <median> ...". --precision bf16 runs under
torch.autocast("cpu", dtype=torch.bfloat16), as the Llama peer.

  /usr/bin/python3 bench/torch_mixtral_step.py --precision fp32 --steps 10 --warmup 2 --threads 2"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt2_step import parse_args, time_steps  # noqa: E402  the peers' command line and timed loop
from torch_llama_step import Layer, Llama  # noqa: E402  Llama's attention, norms and head

CONFIGS = {  # L, NH, KV, C, I, E, k, V, maxT, B, T
    "MoE": (4, 4, 2, 256, 704, 8, 2, 4096, 128, 8, 128),
}
COEF = 0.02


class Expert(nn.Module):  # MixtralBlockSparseTop2MLP
    def __init__(self, C, I):
        super().__init__()
        self.w1 = nn.Linear(C, I, bias=False)
        self.w2 = nn.Linear(I, C, bias=False)
        self.w3 = nn.Linear(C, I, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoeLayer(Layer):  # MixtralDecoderLayer: Llama's attention, block_sparse_moe
    E, K = 8, 2
    router_logits = []  # every layer's, for the load-balancing loss of the step

    def __init__(self, NH, KV, C, I):
        super().__init__(NH, KV, C, I)
        del self.gate_proj, self.up_proj, self.down_proj
        self.gate = nn.Linear(C, self.E, bias=False)
        self.experts = nn.ModuleList([Expert(C, I) for _ in range(self.E)])

    def mlp(self, n):  # MixtralSparseMoeBlock.forward
        B, T, C = n.shape
        h = n.reshape(-1, C)
        logits = self.gate(h)
        MoeLayer.router_logits.append(logits)
        weights = F.softmax(logits, dim=1, dtype=torch.float)
        weights, selected = torch.topk(weights, self.K, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(h.dtype)
        out = torch.zeros((B * T, C), dtype=h.dtype)
        mask = F.one_hot(selected, num_classes=self.E).permute(2, 1, 0)
        for e in range(self.E):
            idx, top_x = torch.where(mask[e])
            y = self.experts[e](h[None, top_x].reshape(-1, C)) * weights[top_x, idx, None]
            out.index_add_(0, top_x, y.to(h.dtype))
        return out.reshape(B, T, C)


def load_balancing_loss(gate_logits, E, K):  # load_balancing_loss_func, no attention mask
    logits = torch.cat(gate_logits, dim=0)
    weights = F.softmax(logits, dim=-1)
    _, selected = torch.topk(weights, K, dim=-1)
    tokens_per_expert = torch.mean(F.one_hot(selected, E).float(), dim=0)
    return torch.sum(tokens_per_expert * torch.mean(weights, dim=0).unsqueeze(0)) * E


class Mixtral(Llama):  # MixtralForCausalLM with output_router_logits: the loss includes the aux loss
    def forward(self, idx, targets):
        MoeLayer.router_logits = []
        ce = super().forward(idx, targets)
        return ce + COEF * load_balancing_loss(MoeLayer.router_logits, MoeLayer.E, MoeLayer.K)


def main():
    a = parse_args(CONFIGS, "MoE")
    L, NH, KV, C, I, E, k, V, maxT, B, T = CONFIGS[a.config]
    MoeLayer.E, MoeLayer.K = E, k
    model = Mixtral(L, NH, KV, C, I, V, maxT, layer=MoeLayer)
    idx = torch.randint(0, V, (B, T))
    tgt = torch.roll(idx, -1, 1)
    time_steps(model, idx, tgt, a)


if __name__ == "__main__":
    main()
