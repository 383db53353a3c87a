# The torchrun peer of bench/launch_bench.sh: every rank joins a gloo process group (through
# torchrun's rendezvous and MASTER_ADDR/MASTER_PORT), passes one barrier and exits.
import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
