"""A job's progress (the spec's `progress`): the step each worker reached, and the job's steps over
time in each attempt, kept in its record.

A worker's agent reads its step (remote/step_reader.py) and reports it when it advances, at most once
a second. The job's step is the highest any worker reached: a job whose rank 0 alone prints its step
advances with it. record.steps holds an entry per attempt that reached a step:

    {"attempt": 1, "first": 3, "first_at": T, "last": 9, "last_at": T,
     "samples": [T, S, T, S, ...],    # the job's step S as of epoch second T, in order
     "firsts": {"0": 3, "1": 3}}      # where each worker's run began: the step of its first step line

`samples` holds at most MAX_SAMPLES + 1 pairs, however long the attempt (step_reader.add_sample).

With an epoch group in the pattern, a step is a running count through the epochs (step_reader.py), and
the entry also holds where the job's step stands and what its count is made of:

    "epoch": {"epoch": 3, "step": 5, "first": 1, "steps": 10}   # step 25: (3 - 1) * 10 + 5

which a later attempt's agents are handed (epochs_known), so that its count goes on from the same base.
"""

from __future__ import annotations

from podrun.remote.step_reader import MAX_SAMPLES as MAX_SAMPLES  # re-exported: what a record holds at most
from podrun.remote.step_reader import add_sample

RATE_SLOTS = 10  # the parts of an attempt's span that its rate over time is given for (`podrun report`)


def entry_of(record, attempt: int | None = None) -> dict | None:
    """The attempt's entry in record.steps (default: the current attempt's); None before its first step."""
    attempt = record.attempt if attempt is None else attempt
    return next((entry for entry in reversed(record.steps) if entry["attempt"] == attempt), None)


def advance(record, worker, step: int, at: float, epoch: dict | None = None) -> bool:
    """Worker `worker` (a WorkerRecord) reached `step` at `at` (epoch seconds); whether the job's step rose.
    `epoch`: with an epoch group, the agent's fields of it (StepReader.epoch_fields)."""
    if worker.step is not None and step <= worker.step:
        return False
    worker.step, worker.step_at = step, at
    entry = entry_of(record)
    if entry is None:
        entry = {"attempt": record.attempt, "first": step, "first_at": at, "last": step, "last_at": at,
                 "samples": [round(at, 3), step]}
        record.steps.append(entry)
    elif step <= entry["last"]:
        return False
    else:
        entry["last"], entry["last_at"] = step, at
        add_sample(entry["samples"], at, step)
    if epoch and epoch.get("epoch") is not None:
        take_epoch(entry, epoch)
    return True


def began(record, worker: int, first: int) -> str | None:
    """Worker `worker`'s run began at step `first` (its first step line) in the current attempt: kept in the
    attempt's entry as "firsts"; the line to say the first time the workers' beginnings differ, else None."""
    entry = entry_of(record)
    if entry is None:
        return None
    firsts = entry.setdefault("firsts", {})
    differed = different_beginnings(entry)
    firsts[str(worker)] = first
    return None if differed or not (text := different_beginnings(entry)) else f"attempt {record.attempt}: {text}"


def different_beginnings(entry: dict) -> str | None:
    """`its workers began at different steps: ...` where the attempt's workers' first steps differ: they
    did not all restore the same checkpoint, or some redid steps that others skipped; else None."""
    firsts = entry.get("firsts") or {}
    if len(set(firsts.values())) < 2:
        return None
    each = ", ".join(f"w{worker} at {step}" for worker, step in sorted(firsts.items(), key=lambda item: int(item[0])))
    return f"its workers began at different steps ({each}): did each restore the same checkpoint?"


def take_epoch(entry: dict, fields: dict) -> None:
    """Keep in the attempt's entry where an epoch group's count stands (StepReader.epoch_fields: of an agent's
    step event, or of its run's exit), where it is not behind what the entry has."""
    now = {"epoch": fields["epoch"], "step": fields["epoch_step"], "first": fields["first_epoch"],
           "steps": fields["epoch_steps"]}
    before = entry.get("epoch") or now
    later = now if (now["epoch"], now["step"]) >= (before["epoch"], before["step"]) else before
    entry["epoch"] = {**later, "steps": max(now["steps"], before["steps"])}


def epochs_known(record) -> dict | None:
    """With an epoch group: the first epoch the job read and the most steps an epoch of it reached, as the
    record holds them from earlier attempts (StepReader's `progress["epochs"]`); None before any."""
    known = [entry["epoch"] for entry in record.steps if entry.get("epoch")]
    if not known:
        return None
    return {"first": known[0]["first"], "steps": max(epoch["steps"] for epoch in known)}


def samples(entry: dict) -> list[tuple[float, int]]:
    """The entry's (epoch seconds, job step) pairs, in order."""
    pairs = entry["samples"]
    return [(pairs[index], pairs[index + 1]) for index in range(0, len(pairs), 2)]


def rates(entry: dict, slots: int = RATE_SLOTS) -> list[tuple[float, float, float]]:
    """The entry's step rate over time: its samples' span cut into `slots` equal parts, each (from, to, steps
    per minute), the step at each cut read between the samples around it; [] with fewer than two samples."""
    pairs = samples(entry)
    start, end = pairs[0][0], pairs[-1][0]
    if len(pairs) < 2 or end <= start:
        return []
    cuts = [start + (end - start) * number / slots for number in range(slots)] + [end]  # the last exact: no float past it
    steps = [_step_at(pairs, at) for at in cuts]
    return [(cuts[number], cuts[number + 1], (steps[number + 1] - steps[number]) * 60 / (cuts[number + 1] - cuts[number]))
            for number in range(slots)]


def rate_text(per_minute: float) -> str:
    """A step rate as `podrun jobs` and the report show it: whole above 10 a minute, else two figures."""
    return f"{per_minute:.0f}" if per_minute >= 10 else f"{per_minute:.2g}"


def _step_at(pairs: list[tuple[float, int]], at: float) -> float:
    """The step at `at`, on the line between the samples before and after it."""
    after = next(number for number, (when, _) in enumerate(pairs) if when >= at)
    if after == 0:
        return pairs[0][1]
    (before_at, before), (after_at, step) = pairs[after - 1], pairs[after]
    return before + (step - before) * (at - before_at) / (after_at - before_at)


def best_before(record, attempt: int) -> int | None:
    """The highest step any attempt before `attempt` reached; None if none reached one."""
    return max((entry["last"] for entry in record.steps if entry["attempt"] < attempt), default=None)


def step_of(record) -> int | None:
    """The job's step now: the highest its current attempt reached."""
    entry = entry_of(record)
    return entry["last"] if entry else None


def steps_per_minute(record, now: float, window_s: float = 300.0) -> float | None:
    """The current attempt's rate over its last `window_s` of samples (or all of them, if shorter); None
    until it has two samples."""
    entry = entry_of(record)
    if entry is None:
        return None
    pairs = samples(entry)
    recent = [pair for pair in pairs if pair[0] >= pairs[-1][0] - window_s] or pairs
    first_at, first = recent[0] if len(recent) > 1 else pairs[0]
    last_at, last = pairs[-1]
    if last_at <= first_at:
        return None
    return (last - first) * 60 / (max(now, last_at) - first_at)
