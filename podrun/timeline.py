"""Where a job's time goes (`podrun report`): its phases, with start and end times, kept in its record.

record.phases is a list of entries, in the order they began, saved in job.json with the record's
other fields (never a write of its own: recording costs a few dict updates per phase):

    {"phase": "run", "attempt": 0, "start": T, "end": T | None,
     "workers": {"0": [T, T | None], ...},          # a phase of each worker: when each began and ended
     "open": 3,                                      # with workers, while the phase runs: their parts not ended
     "lines": {"0": {"start": T, "every_s": 1, "counts": "3 0 12"}, ...},  # run: lines received per slot
     ...details: "bytes" (ship), "why" (stall, preempted, restart, move, swap), "capacity_at" (recreate: when
        its queued request found capacity), "zone" and "left" (move: the zone moved to, the zone left),
        "worker", "left" and "spare" (swap: the worker whose host was left out, that host, the spare in its place)}

T is epoch seconds. A job-wide phase (queue, create, recreate, judge, restart, stall) has no "workers"; an
instant (preempted, move, swap) has end == start. An end still None is open: the phase runs, or its worker's end
was never seen (the report ends it with the attempt).

Phases: queue (a queued TPU request waiting for capacity, as polled), create (the TPU made before the
job), connect (the connection and podrun's agent started, up to its probe report), ship, setup, run,
stop (from the stop sent to the worker's exit), judge (a lost worker judged against the API), recreate
(a preempted TPU deleted and made again), restart (the wait before a restart on the same workers),
stall (from the last line of any worker to the stop), preempted, move (the TPU asked for in the next of
its zones: no capacity in the one it left), swap (a lost host left out, a spare in its rank: before the
attempt that runs on the spare).
"""

from __future__ import annotations

import time

MAX_SLOTS = 120  # lines counted per worker per run: past that, two slots become one of twice the time


def now() -> float:
    return round(time.time(), 3)


def begin(record, phase: str, workers: list[int] | None = None, at: float | None = None, **details) -> dict:
    """A phase that begins now (or `at`), for these workers (all at once) or for the whole job."""
    at = now() if at is None else round(at, 3)
    entry: dict = {"phase": phase, "attempt": record.attempt, "start": at, "end": None, **details}
    if workers is not None:
        entry["workers"] = {str(index): [at, None] for index in workers}
        entry["open"] = len(entry["workers"])  # so that ending each worker's part costs the same, however many
    record.phases.append(entry)
    return entry


def add(record, phase: str, start: float, end: float, **details) -> dict:
    """A job-wide phase that is over already."""
    entry = begin(record, phase, at=start, **details)
    entry["end"] = round(end, 3)
    return entry


def end(entry: dict, worker: int | None = None, at: float | None = None) -> None:
    """End one worker's part of the phase, or (worker None) the phase: with it every part still open."""
    at = now() if at is None else round(at, 3)
    if worker is not None:
        parts = entry["workers"]
        part = parts.get(str(worker))
        if part is None or part[1] is not None:
            return
        part[1] = at
        # counted once where a record saved by an older podrun lacks the count
        left = entry["open"] - 1 if "open" in entry else sum(part[1] is None for part in parts.values())
        entry["open"] = left
        if not left:
            del entry["open"]
            entry["end"] = max(part[1] for part in parts.values())
        return
    for part in entry.get("workers", {}).values():
        if part[1] is None:
            part[1] = at
    entry.pop("open", None)
    if entry["end"] is None:
        entry["end"] = at


def current(record, phase: str) -> dict | None:
    """The current attempt's latest entry of this phase."""
    return next((entry for entry in reversed(record.phases)
                 if entry["phase"] == phase and entry["attempt"] == record.attempt), None)


def line_counter() -> dict:
    """A count of lines received over time, from now (count_lines), kept by its worker's step until
    keep_lines puts it in the run's entry."""
    return {"start": now(), "every_s": 1, "counts": []}


def keep_lines(entry: dict, worker: int, counter: dict) -> None:
    """The worker's counts in the run's entry, once its run ended, as one string: 1,024 workers' lists
    of numbers would make each save of the record ~10 times slower (indented JSON)."""
    entry.setdefault("lines", {})[str(worker)] = {**counter, "counts": " ".join(map(str, counter["counts"]))}


def line_counts(kept: dict) -> list[int]:
    """The counts keep_lines kept."""
    return [int(count) for count in kept["counts"].split()]


def count_lines(counter: dict, lines: int, at: float) -> None:
    """Add `lines` received at `at` (epoch seconds): at most MAX_SLOTS counts, however long the run."""
    counts = counter["counts"]
    slot = max(0, int((at - counter["start"]) / counter["every_s"]))
    while slot >= MAX_SLOTS:
        counts[:] = [sum(counts[i:i + 2]) for i in range(0, len(counts), 2)]
        counter["every_s"] *= 2
        slot = int((at - counter["start"]) / counter["every_s"])
    if slot >= len(counts):
        counts.extend([0] * (slot + 1 - len(counts)))
    counts[slot] += lines
