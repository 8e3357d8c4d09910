"""Preflight's network check on this worker (launch/health.py): an all-reduce across every worker with
the job's backend, then each worker's bandwidth from its neighbours. Run by the job's own python3 (its
source on stdin), with torch.

argv RANK WORLD MASTER_ADDR PORT BACKEND NBYTES TIMEOUT_S. Rank 0 with PORT 0 serves the store on a free
port and prints {"port": N} first. Every rank prints {"allreduce_s": S, "received": {SOURCE: BYTES_PER_S}}:
the best of two all-reduces of NBYTES, and the rate at which NBYTES came from each source, in rounds where
every rank sends to the rank SHIFT after it and receives from the one SHIFT before (shifts 1, and 2 from
three workers on: a worker's sends then go to two peers, and a slow sender is told from a slow receiver).
"""

import datetime
import json
import sys
import time

import torch
import torch.distributed as dist

TRIES = 2  # of each measurement, the best kept: the first may also pay for a connection's setup


def timed(request, device, started):
    """Seconds from `started` until `request` completed."""
    request.wait()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def main():
    rank, world, master, port, backend, nbytes, timeout_s = sys.argv[1:]
    rank, world, port, nbytes = int(rank), int(world), int(port), int(nbytes)
    timeout = datetime.timedelta(seconds=float(timeout_s))
    store = dist.TCPStore(master, port, world, rank == 0, timeout=timeout, wait_for_workers=False)
    if rank == 0:
        print(json.dumps({"port": store.port}), flush=True)
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(0)
        device = torch.device("cuda", 0)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    sent, received = (torch.ones(nbytes // 4, dtype=torch.float32, device=device) for _ in range(2))
    allreduce_s = None
    for _ in range(TRIES):
        started = time.perf_counter()
        took = timed(dist.all_reduce(sent, async_op=True), device, started)
        allreduce_s = took if allreduce_s is None else min(allreduce_s, took)
    rates = {}
    for shift in (1, 2) if world > 2 else (1,):
        source = (rank - shift) % world
        best = None
        for _ in range(TRIES):
            dist.barrier()
            started = time.perf_counter()
            sending, receiving = dist.batch_isend_irecv([dist.P2POp(dist.isend, sent, (rank + shift) % world),
                                                         dist.P2POp(dist.irecv, received, source)])
            took = timed(receiving, device, started)  # the receive's alone: this worker's own send may be the slow one
            sending.wait()
            best = took if best is None else min(best, took)
        rates[str(source)] = nbytes / best
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({"allreduce_s": allreduce_s, "received": rates}), flush=True)


if __name__ == "__main__":
    main()
