"""The straggler, named from stacks (`stragglers: 30s` in the spec): while run goes on, every worker's
stacks are sampled on that period (remote/stacks.py's py-spy dump over the connections the job holds,
as `podrun stacks` does) and each sample is read as odd_ones.py reads a dump: the compared processes
(torchrun's ranks, else each worker's outermost Python) placed by their main thread.

A sample in which most workers wait in a collective (a frame of torch.distributed, or a collective's
name) while a few compute is one that those few held the others back in. A worker that did so in at
least HELD_AT_LEAST of the last WINDOW samples, and in nearly every sample where any worker held the
others back (ALONE_SHARE), is the straggler: said once,
in one line (`w1 held the others back in 4 of the last 4 samples (in forward (model.py:88); the others in
all_reduce (torch/distributed/distributed_c10d.py:2806))`), kept in the record (`straggler`: `podrun jobs`
shows it beside the state, `report --json` has it) and told to the spec's `notify` (event `straggler`).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import Callable

from podrun import jobstore
from podrun.launch import odd_ones, stacks
from podrun.launch.steps import WorkerStep
from podrun.output import say

WINDOW = 10
HELD_AT_LEAST = 3
ALONE_SHARE = 0.8
# a collective's function, or any frame of torch.distributed's files (its wrappers, a work's wait)
COLLECTIVE_FUNCTION = re.compile(r"^(all_reduce\w*|all_gather\w*|reduce_scatter\w*|broadcast\w*|barrier|all_to_all\w*|"
                                 r"psum|pmean|process_allgather)$")
COLLECTIVE_FILE = "torch/distributed/"


async def watch(record: jobstore.JobRecord, worker_steps: list[WorkerStep], period_s: float,
                on_found: Callable[[dict], None]) -> None:
    """Sample every period_s until cancelled; once a straggler shows, say it, keep it and call on_found."""
    held: deque[dict[int, tuple[str, str]]] = deque(maxlen=WINDOW)
    workers = [(ws.plan.worker.index, ws.plan.worker.transport, ws.plan.job_dir) for ws in worker_steps]
    without_python = 0
    await asyncio.gather(*(ws.gone.wait() for ws in worker_steps))  # not while the checks before run go on
    while True:
        started = time.monotonic()
        await asyncio.sleep(period_s)
        processes = odd_ones.compared_processes(await stacks.collect(workers))
        if not any(process.place.kind == "python" for process in processes):
            without_python += 1
            if without_python == HELD_AT_LEAST:  # not a Python job's start: no py-spy where it runs
                say("stragglers: no Python stacks from any worker in 3 samples (py-spy is not on the job's PATH, or "
                    "the job runs no Python): no straggler can be named")
                return
            continue
        held.append(holding_back(processes))
        if found := straggler(list(held)):
            found["sample_s"] = round(time.monotonic() - started - period_s, 3)
            record.straggler = found
            record.save()
            say(found["said"])
            on_found(found)
            return


def holding_back(processes: list[odd_ones.Process]) -> dict[int, tuple[str, str]]:
    """One sample (its compared processes): each worker that computed while most others waited in a
    collective, with where it was and where the others were; {} where no such few stand out."""
    places: dict[int, list[odd_ones.Process]] = {}
    for process in processes:
        places.setdefault(process.worker, []).append(process)
    waiting = {worker for worker, processes in places.items() if all(_in_collective(p) for p in processes)}
    computing = [worker for worker, processes in places.items() if processes[0].place.kind == "python"
                 and worker not in waiting]
    if not computing or len(computing) * 2 >= len(places) or not waiting:
        return {}
    where_others = min(waiting)
    others = next(p for p in places[where_others] if _in_collective(p)).place.said
    return {worker: (next(p for p in places[worker] if not _in_collective(p)).place.said, others)
            for worker in computing}


def straggler(samples: list[dict[int, tuple[str, str]]]) -> dict | None:
    """The worker that held the others back in at least HELD_AT_LEAST of the samples, and in nearly every one
    in which any worker did (ALONE_SHARE): one worker, again and again, not the job's own unevenness."""
    counts: dict[int, int] = {}
    for sample in samples:
        for worker in sample:
            counts[worker] = counts.get(worker, 0) + 1
    if not counts:
        return None
    worker, times = max(counts.items(), key=lambda item: (item[1], -item[0]))
    if times < HELD_AT_LEAST or times < ALONE_SHARE * sum(1 for sample in samples if sample):
        return None
    itself, others = next(sample[worker] for sample in reversed(samples) if worker in sample)
    return {"worker": worker, "held": times, "samples": len(samples), "in": itself, "others": others,
            "said": f"w{worker} held the others back in {times} of the last {len(samples)} samples ({itself}; "
                    f"the others {others})"}


def _in_collective(process: odd_ones.Process) -> bool:
    for frame in process.place.frames if process.place.kind == "python" else ():
        function, _, where = frame.partition(" (")
        if COLLECTIVE_FUNCTION.match(function) or COLLECTIVE_FILE in where:
            return True
    return False
