"""A stalled job (the spec's `stall`): how it is told, and how it is watched.

Without `progress`, a job stalls when no worker printed anything for `stall`; with it, when no worker's
step advanced for that long, whatever they print (a hung training loop's telemetry thread still
prints). `stall: auto` (with progress) derives the bound from the job's own step time
(remote/step_reader.auto_bound): AUTO_MULTIPLE times the median of its recent step times, within
PODRUN_STALL_AUTO_FLOOR (5 min) and PODRUN_STALL_AUTO_CAP (2 h); the cap until three steps were seen,
as a first step may compile for an hour.

An attached job is watched by its launcher (Launch, which hears every worker's output and step:
silence() and on_stall() here); a detached one by worker 0's agent (agent.Hub), which each other agent
tells of its output as "alive", at most every alive_every(stall) seconds, or of its step as it
advances, at most every second: a job's silence is seen that much late at most, and a chatty job
costs one message per worker per interval, never one per line.
"""

from __future__ import annotations

import asyncio
import re
import time

from podrun import jobstore, progress, timeline
from podrun.cloud.settings import seconds
from podrun.launch import stacks
from podrun.launch.steps import WorkerStep
from podrun.output import duration_text, say, worker_ranges
from podrun.remote import step_reader

ALIVE_EVERY_S = 5.0
AUTO = "auto"
AUTO_FLOOR = ("PODRUN_STALL_AUTO_FLOOR", step_reader.AUTO_FLOOR_S)
AUTO_CAP = ("PODRUN_STALL_AUTO_CAP", step_reader.AUTO_CAP_S)
AUTO_RECHECK_S = 1.0  # an auto bound shrinks as steps come: the watch looks again this often


def alive_every(stall_s: float | str) -> float:
    """How often, at most, a detached job's agent tells the hub that its worker printed something."""
    return ALIVE_EVERY_S if stall_s == AUTO else min(ALIVE_EVERY_S, float(stall_s) / 4)


def auto_settings() -> dict:
    """stall: auto's rule, as step_reader.auto_bound takes it (read when the job starts: a bad value is a line)."""
    return {"multiple": step_reader.AUTO_MULTIPLE, "floor_s": seconds(AUTO_FLOOR), "cap_s": seconds(AUTO_CAP)}


def summary(silent_s: dict[int, float], steps: dict[int, int | None] | None = None,
            fallen: dict[int, tuple[str, str]] | None = None) -> str:
    """`no output from any worker for 3.0s (w0-2 silent 3.0s, w3 silent 12.4s)`; with progress (`steps`,
    each worker's), `no step from any worker for 3.0s: the job is at step 7 (w0-2 at step 7 for 3.0s, ...)`.
    Workers alike (the same silence as duration_text shows it, and step) are named as ranges. `fallen`: the
    workers whose step fell and has not passed where it was since (the step it fell from and to, as shown):
    `...; the step went back, w0 from 10 to 1, and has not passed where it was since`."""
    alike: dict[str, list[int]] = {}
    for index, silence in sorted(silent_s.items(), key=lambda item: item[1]):
        if steps is None:
            said = f"silent {duration_text(silence)}"
        else:
            step = steps.get(index)
            said = f"at step {step} for {duration_text(silence)}" if step is not None else "no step yet"
        alike.setdefault(said, []).append(index)
    workers = ", ".join(f"{worker_ranges(indexes)} {said}" for said, indexes in alike.items())
    shortest = duration_text(min(silent_s.values()))
    if steps is None:
        return f"no output from any worker for {shortest} ({workers})"
    reached = [step for step in steps.values() if step is not None]
    where = f"the job is at step {max(reached)}" if reached else "no worker reached a step"
    went_back = f"; the step went back, {_falls(fallen)}, and has not passed where it was since" if fallen else ""
    return f"no step from any worker for {shortest}: {where} ({workers}){went_back}"


def _falls(falls: dict[int, tuple[str, str]]) -> str:
    """`w0-1 from 10 to 1, w2 from 9 to 0`: the workers whose step fell alike as ranges."""
    alike: dict[tuple[str, str], list[int]] = {}
    for index, fall in sorted(falls.items()):
        alike.setdefault(fall, []).append(index)
    return ", ".join(f"{worker_ranges(indexes)} from {before} to {after}" for (before, after), indexes in alike.items())


def fall_line(falls: dict[int, tuple[str, str]], pattern: str | None) -> str:
    """What podrun says the first time a worker's step fell (remote/step_reader.py: a per-epoch bar, a count
    that started over), with the workers whose step fell by then: a step below the highest is no progress, and
    an epoch group in the pattern makes each epoch's steps progress."""
    read = f"lines matching '{pattern}'" if pattern else "the step's file"
    said = (f"the step went back in {read}: {_falls(falls)}; a step is progress (for stall, restarts and the "
            f"record) only past the highest one reached")
    if pattern is None or "epoch" in re.compile(pattern).groupindex:
        return said
    return f"{said}; if it starts over each epoch, name the epoch in a group of its own: {epoch_pattern(pattern)}"


class Falls:
    """The workers whose step fell (their agents' "fell" events, one each at most), said in one line once in
    an attempt: the first is said with those that fell within GATHERED_S of it (agents report at most once a
    second), or sooner where a stall or the run's end comes first (say())."""

    GATHERED_S = 1.5

    def __init__(self, pattern: str | None):
        self.pattern = pattern
        self.falls: dict[int, tuple[str, str]] = {}  # worker: the step it fell from and to, as shown
        self.said = False

    def heard(self, index: int, event: dict) -> None:
        if self.said:
            return
        if not self.falls:
            asyncio.get_running_loop().call_later(self.GATHERED_S, self.say)
        self.falls[index] = (str(event["before"]), str(event["after"]))

    def say(self) -> None:
        if self.falls and not self.said:
            self.said = True
            say(fall_line(self.falls, self.pattern))


def epoch_pattern(pattern: str) -> str:
    """The pattern with its epoch's number in a group named epoch, where it has an `epoch \\d+` before its first
    group (`'Epoch \\d+:.*?(\\d+)/\\d+'`); else an example of one."""
    first_group = next((index for index, char in enumerate(pattern) if char == "(" and pattern[index - 1:index] != "\\"),
                       len(pattern))
    number = re.search(r"(?i)epoch\W{0,3}(\\d\+)", pattern[:first_group])
    if number is None:
        return "progress: 'Epoch (?P<epoch>\\d+):.*?(\\d+)/\\d+' for a bar such as `Epoch 2: 10%| 1/10`"
    return f"progress: '{pattern[:number.start(1)]}(?P<epoch>\\d+){pattern[number.end(1):]}'"


async def silence(worker_steps: list[WorkerStep], stall_s: float | str, record: jobstore.JobRecord,
                  by_steps: bool) -> dict[int, float]:
    """Returns once no worker has printed anything (`by_steps`: advanced its step) for the stall's bound
    (the clock starts now): how long each worker has been silent."""
    started = time.monotonic()
    rule = auto_settings() if stall_s == AUTO else None

    def since(ws: WorkerStep) -> float:
        return max(started, ws.step_at if by_steps else ws.output_at)

    while True:
        bound = step_reader.auto_bound(_advances(record), **rule) if rule else float(stall_s)
        left = max(map(since, worker_steps)) + bound - time.monotonic()
        if left <= 0:
            break
        await asyncio.sleep(min(left, AUTO_RECHECK_S) if rule else left)
    now = time.monotonic()
    return {ws.plan.worker.index: now - since(ws) for ws in worker_steps}


def _advances(record: jobstore.JobRecord) -> list[tuple[float, int]]:
    entry = progress.entry_of(record)
    return progress.samples(entry) if entry else []


def add_stopped(record: jobstore.JobRecord, stalls: dict[int, dict], steps: dict[int, int | None] | None) -> None:
    """A detached job's stall, once its workers' exits (worker index: run.exit with `stalled`) are in: as an
    attached job's (on_stall), from the last line (with progress: step) of any worker to the stop."""
    # an agent of an older podrun (a job detached before an upgrade) said when it ended, not when it stalled
    stopped_at = {index: stall_exit.get("stalled_at") or stall_exit["ended_at"] for index, stall_exit in stalls.items()}
    heard_at = max(stopped_at[index] - stall_exit["stalled"] for index, stall_exit in stalls.items())
    timeline.add(record, "stall", heard_at, max(stopped_at.values()),
                 why=summary({index: stall_exit["stalled"] for index, stall_exit in stalls.items()}, steps,
                             fallen_of(stalls)))


def fallen_of(exits: dict[int, dict]) -> dict[int, tuple[str, str]]:
    """The workers whose step fell and had not passed where it was by their run's end, from their exits
    (remote/step.py): the step it fell from and to, as shown."""
    return {index: (ended["fell_from"], ended["fell_to"]) for index, ended in exits.items() if ended.get("fell_from")}


def still_fallen(fell: dict, step: int | None) -> bool:
    """Whether a worker whose step fell (its agent's "fell" event) has not passed where it fell from since."""
    return step is None or step <= fell["step"]


async def on_stall(record: jobstore.JobRecord, silent_s: dict[int, float], worker_steps: list[WorkerStep],
                   by_steps: bool) -> str:
    """Say which workers were silent (without a step) for how long, save every worker's stacks and say
    where their processes differ, before the stop; returns the stall's summary."""
    stalled = summary(silent_s, {worker.index: worker.step for worker in record.workers} if by_steps else None,
                      {ws.plan.worker.index: (ws.fell["before"], ws.fell["after"]) for ws in worker_steps
                       if by_steps and ws.fell and still_fallen(ws.fell, record.workers[ws.plan.worker.index].step)})
    timeline.begin(record, "stall", at=time.time() - min(silent_s.values()), why=stalled)
    say(f"job {record.id} stalled: {stalled}; saving every worker's stacks, then stopping it")
    texts = await stacks.collect([(ws.plan.worker.index, ws.plan.worker.transport, ws.plan.job_dir)
                                  for ws in worker_steps])
    for line in stacks.saved_and_summed_up(record, texts):
        say(line)
    return stalled
