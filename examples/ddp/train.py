"""A tiny DDP job: every rank trains the same model on different data, then prints a checksum.

DDP averages gradients across ranks, so the parameters, and with them the checksum, are identical
on every rank; without a working process group each rank's parameters would differ.
Run it with torchrun; works on CPU (gloo) and, unchanged, on GPUs (nccl).
"""

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights everywhere
    model = DistributedDataParallel(torch.nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1000 + rank)  # different data on every rank
    for _ in range(args.steps):
        inputs = torch.randn(32, 16, generator=data)
        loss = model(inputs).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    # one write per line: the ranks of a worker share its output pipe
    sys.stdout.write(f"rank {rank} world_size {world_size} local_rank {os.environ['LOCAL_RANK']}"
                     f" worker {os.environ.get('PODRUN_WORKER')} host {socket.gethostname()}"
                     f" checksum {checksum:.10f}\n")
    sys.stdout.flush()
    # DDP's reducer holds gloo work objects: release it before the process group goes, then let
    # every rank finish talking before any tears down (else gloo can abort a rank during teardown)
    del model, optimizer
    dist.barrier()
    dist.destroy_process_group()
    # gloo's C++ threads can still abort a rank in the interpreter's teardown ("terminate called
    # without an active exception", exit 134: seen in 2 of about 20 suite runs on 2 busy cores);
    # everything is written and the group is gone, so leave without that teardown
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
