"""The wall time split into parts that add up to it exactly, and goodput: the productive part over the
wall time (`podrun report`, `podrun report --json`).

Kinds are named as Google's ml-goodput-measurement names its badput where the meaning is the same:

- productive: run time that advanced the job's step past the best step any earlier attempt reached;
- program_startup: run time from the run's start to the attempt's first step (all of it, in an attempt
  that reached none);
- wasted_progress_from_disruption: run time redoing steps an earlier attempt had reached already. A step
  line names a step done, so an attempt whose first line is `step 4` restored step 3: after one that died
  at step 5 it redid steps 4 and 5, two steps lost, as Google's library counts from the step restored to
  the step reached before. The time of the first of them, which came before the attempt's first line, is
  the attempt's median step time, taken out of its program_startup;
- slow_steps: productive time beyond a robust step time: per interval between two samples of the step,
  what its steps took beyond median + 3 * MAD of every interval's time per step (each interval weighed
  by its steps), the bound beyond which Google's library calls a step time anomalous;
- infrastructure_recovery_from_disruption: from a disruption to the run of the next attempt, as Google's
  library counts it from the last step's record to the job's restart: a restarted attempt's run time
  after its last step, and podrun's judge, recreate and restart phases;
- after_last_step: the last attempt's run time after its last step line: steps that print nothing (the
  last epoch of a job that prints a step per epoch), the last evaluation and save, the teardown; in a job
  that failed, up to the failure; in a running one, its current step;
- queue, create, connect, ship, setup, stop, stall: podrun's own phases (timeline.py); other: the rest
  (time in no phase).

Only the time analysis.py counts as `run` is split by steps: a stall within a run stays stall. A job
without steps in its record (no `progress` in its spec, or no step printed) keeps `run` as one part.
"""

from __future__ import annotations

import statistics

from podrun import progress
from podrun.output import counted
from podrun.report.analysis import Analysis

RECOVERY = "infrastructure_recovery_from_disruption"
PARTS = ("productive", "program_startup", "wasted_progress_from_disruption", "slow_steps", "queue", "create",
         "connect", "ship", "setup", "stop", RECOVERY, "stall", "after_last_step", "other")
BY_STEPS = ("productive", "program_startup", "wasted_progress_from_disruption", "slow_steps", "after_last_step")
PHASE_PART = {"judge": RECOVERY, "recreate": RECOVERY, "restart": RECOVERY}
SLOW_MADS = 3  # a step slower than median + this many median absolute deviations is slow
UNKNOWN = ("no steps recorded (the spec's `progress`): run is one part; program startup, lost progress and slow "
           "steps are not known")


class Interval:
    """The time between two samples of an attempt's step: the steps it advanced, how many of them were
    new (past the best step before the attempt), and the part of it counted as run."""

    __slots__ = ("seconds", "steps", "new_steps", "counted_s")

    def __init__(self, seconds: float, steps: int, new_steps: int):
        self.seconds, self.steps, self.new_steps, self.counted_s = seconds, steps, new_steps, 0.0

    @property
    def step_s(self) -> float:
        return self.seconds / self.steps

    @property
    def productive_s(self) -> float:
        return self.counted_s * self.new_steps / self.steps


class Goodput:
    def __init__(self, analysis: Analysis):
        record = analysis.record
        self.wall_s = analysis.wall_s
        self.known = bool(record.steps)
        self.parts_s = dict.fromkeys(PARTS if self.known else ("run", *(p for p in PARTS if p not in BY_STEPS)), 0.0)
        self.intervals: list[Interval] = []
        self.lost_progress_steps = 0
        timelines = [_Attempt(record, attempt, analysis.end, restarted=attempt is not analysis.attempts[-1])
                     for attempt in analysis.attempts]
        for attempt in timelines:
            self.intervals += attempt.intervals
            self.lost_progress_steps += attempt.lost_steps
        for start, end, phase in analysis.pieces:
            if phase != "run":
                self.parts_s[PHASE_PART.get(phase, phase if phase in self.parts_s else "other")] += end - start
            elif not self.known:
                self.parts_s["run"] += end - start
            else:
                for attempt in timelines:
                    attempt.split(max(start, attempt.start), min(end, attempt.end), self.parts_s)
        if self.known:
            self.parts_s["slow_steps"] = self._slow_s()
            self.parts_s["productive"] = sum(interval.productive_s for interval in self.intervals) - \
                self.parts_s["slow_steps"]

    @property
    def goodput(self) -> float:
        return self.parts_s["productive" if self.known else "run"] / self.wall_s

    def slow_step_bound(self) -> float | None:
        """median + SLOW_MADS * MAD of the time per step, each interval weighed by its steps; None without one."""
        timed = [(interval.step_s, interval.steps) for interval in self.intervals]
        if not timed:
            return None
        median = _weighted_median(timed)
        return median + SLOW_MADS * _weighted_median([(abs(step_s - median), steps) for step_s, steps in timed])

    def _slow_s(self) -> float:
        bound = self.slow_step_bound()
        return sum(interval.productive_s * max(0.0, 1 - bound / interval.step_s) for interval in self.intervals
                   if bound is not None and interval.step_s > bound)

    def part_note(self, part: str) -> str:
        """What a part's seconds stand for beyond time, where it counts something: ` (2 steps lost)`."""
        if part != "wasted_progress_from_disruption":
            return ""
        return f" ({counted(self.lost_progress_steps, 'step')} lost)"

    def to_dict(self) -> dict:
        return {"wall_s": self.wall_s, "parts_s": self.parts_s, "goodput": self.goodput,
                "lost_progress_steps": self.lost_progress_steps, "slow_step_bound_s": self.slow_step_bound()}


class _Attempt:
    """One attempt's run time, split by its steps."""

    def __init__(self, record, attempt: dict, end: float, restarted: bool):
        number = attempt["attempt"]
        self.start, self.end = attempt["started_at"], attempt["ended_at"] or end
        self.entry = progress.entry_of(record, number)
        best = progress.best_before(record, number)
        # what its run time after its last step is: up to a restart, the disruption's (as Google counts it)
        self.after_last = RECOVERY if restarted else "after_last_step"
        self.samples = progress.samples(self.entry) if self.entry else []
        self.intervals = [Interval(at - before_at, step - before, step - max(before, min(step, best)) if best is not None
                                   else step - before)
                          for (before_at, before), (at, step) in zip(self.samples, self.samples[1:])]
        # the step it restored is the one before its first: it redid the steps from there up to the best before
        self.lost_steps = max(0, best - (self.entry["first"] - 1)) if self.entry and best is not None else 0
        # the first step's own time came before the attempt's first line: one step time of the startup, if redone
        redone_first = self.entry is not None and best is not None and self.entry["first"] <= best
        step_s = _weighted_median([(interval.step_s, interval.steps) for interval in self.intervals]) \
            if self.intervals else 0.0
        self.first_step_at = self.samples[0][0] - min(step_s, self.samples[0][0] - self.start) \
            if redone_first else None

    def split(self, start: float, end: float, parts_s: dict[str, float]) -> None:
        """Add the run time from start to end (within this attempt) to the parts it belongs to."""
        if end <= start:
            return
        if not self.samples:
            parts_s["program_startup"] += end - start
            return
        first_at, last_at = self.samples[0][0], self.samples[-1][0]
        startup_end = first_at if self.first_step_at is None else self.first_step_at
        parts_s["program_startup"] += _overlap(start, end, self.start, startup_end)
        parts_s["wasted_progress_from_disruption"] += _overlap(start, end, startup_end, first_at)
        parts_s[self.after_last] += _overlap(start, end, last_at, self.end)
        for interval, ((before_at, _), (at, _)) in zip(self.intervals, zip(self.samples, self.samples[1:])):
            counted = _overlap(start, end, before_at, at)
            interval.counted_s += counted
            parts_s["wasted_progress_from_disruption"] += counted * (1 - interval.new_steps / interval.steps)


def _overlap(start: float, end: float, other_start: float, other_end: float) -> float:
    return max(0.0, min(end, other_end) - max(start, other_start))


def _weighted_median(values: list[tuple[float, int]]) -> float:
    """The median of the values, each counted as often as its weight (the mean of the middle two, as
    statistics.median does, when the weights add up to an even number)."""
    ordered = sorted(values)
    total = sum(weight for _, weight in ordered)
    middle = [(total - 1) // 2, total // 2]  # the positions of the middle one or two in the counted list
    found, passed = [], 0
    for value, weight in ordered:
        found += [value for position in middle if passed <= position < passed + weight]
        passed += weight
    return statistics.fmean(found)


def steps_of(record) -> list[dict]:
    """Each attempt's first and last step, when each was reached (epoch seconds), and its step rate over
    time: `rates`, [from, to, steps per minute] over each tenth of its steps' span (progress.rates)."""
    return [{**{key: entry[key] for key in ("attempt", "first", "first_at", "last", "last_at", "firsts") if key in entry},
             "rates": [[round(start, 3), round(end, 3), round(rate, 2)] for start, end, rate in progress.rates(entry)]}
            for entry in record.steps]


def steps_text(record, attempt: int) -> str | None:
    """`steps 3 to 9`: the attempt's first and last step, and whether its workers began at different
    steps; None if it reached none."""
    entry = progress.entry_of(record, attempt)
    if entry is None:
        return None
    differ = progress.different_beginnings(entry)
    return f"steps {entry['first']} to {entry['last']}" + (f"; {differ}" if differ else "")
