# The torchrun peer of bench/elastic_bench.sh: a small DDP training loop over gloo (an MLP, a few
# ms per step) that checkpoints every 5 steps and resumes from its checkpoint when torchelastic
# restarts it. Rank 0 prints "step S restart R world W t UNIX" after every step.
#   torchrun ... bench/torchrun_elastic_worker.py CKPT STEPS
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ckpt, steps = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
start = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
gen = torch.Generator().manual_seed(rank)
for step in range(start + 1, steps + 1):
    x = torch.randn(8, 64, generator=gen)
    loss = (ddp(x) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0:
        print(f"step {step} restart {restart} world {world} t {time.time():.3f}", flush=True)
        if step % 5 == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
dist.destroy_process_group()
