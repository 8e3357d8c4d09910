"""A stalled job (the spec's `stall`): how its silence is told, and how it is watched.

An attached job is watched by its launcher (Launch, which sees every worker's output: silence() and
on_stall() here); a detached one
by worker 0's agent (agent.Hub), which each other agent tells of its output as "alive", at most every
alive_every(stall) seconds: a job's silence is seen that much late at most, and a chatty job costs
one message per worker per interval, never one per line.
"""

from __future__ import annotations

import asyncio
import time

from podrun import jobstore, timeline
from podrun.launch import stacks
from podrun.launch.steps import WorkerStep
from podrun.output import duration_text, say, worker_ranges

ALIVE_EVERY_S = 5.0


def alive_every(stall_s: float) -> float:
    """How often, at most, a detached job's agent tells the hub that its worker printed something."""
    return min(ALIVE_EVERY_S, stall_s / 4)


def summary(silent_s: dict[int, float]) -> str:
    """`no output from any worker for 3.0s (w0-2 silent 3.0s, w3 silent 12.4s)`: workers silent for
    the same time (as duration_text shows it) are named as ranges."""
    by_silence: dict[str, list[int]] = {}
    for index, seconds in sorted(silent_s.items(), key=lambda item: item[1]):
        by_silence.setdefault(duration_text(seconds), []).append(index)
    shortest = min(silent_s.values())
    return (f"no output from any worker for {duration_text(shortest)} ("
            + ", ".join(f"{worker_ranges(indexes)} silent {silence}" for silence, indexes in by_silence.items()) + ")")


def add_stopped(record: jobstore.JobRecord, stalls: dict[int, dict]) -> None:
    """A detached job's stall, once its workers' exits (worker index: run.exit with `stalled`) are in: as an
    attached job's (on_stall), from the last line of any worker to the stop."""
    # an agent of an older podrun (a job detached before an upgrade) said when it ended, not when it stalled
    stopped_at = {index: stall_exit.get("stalled_at") or stall_exit["ended_at"] for index, stall_exit in stalls.items()}
    heard_at = max(stopped_at[index] - stall_exit["stalled"] for index, stall_exit in stalls.items())
    timeline.add(record, "stall", heard_at, max(stopped_at.values()),
                 why=summary({index: stall_exit["stalled"] for index, stall_exit in stalls.items()}))


async def silence(worker_steps: list[WorkerStep], stall_s: float) -> dict[int, float]:
    """Returns once no worker has printed anything for `stall_s` (the clock starts now): how long each
    worker has been silent."""
    started = time.monotonic()
    while (left := max(started, *(ws.output_at for ws in worker_steps)) + stall_s - time.monotonic()) > 0:
        await asyncio.sleep(left)
    now = time.monotonic()
    return {ws.plan.worker.index: now - max(started, ws.output_at) for ws in worker_steps}


async def on_stall(record: jobstore.JobRecord, silent_s: dict[int, float], worker_steps: list[WorkerStep]) -> str:
    """Say which workers were silent for how long, and save every worker's stacks, before the stop;
    returns the stall's summary."""
    stalled = summary(silent_s)
    timeline.begin(record, "stall", at=time.time() - min(silent_s.values()), why=stalled)
    say(f"job {record.id} stalled: {stalled}; saving every worker's stacks, then stopping it")
    texts = await stacks.collect([(ws.plan.worker.index, ws.plan.worker.transport, ws.plan.job_dir)
                                  for ws in worker_steps])
    say(f"stacks of every worker saved in {stacks.save(record, texts)}")
    return stalled
