"""What a job's recorded phases (timeline.py) add up to: the wall time split by phase, goodput, the
attempts, the slowest worker of each phase, and the workers grouped into bands that behaved alike.

Each instant of the wall time (from the job's first phase, a TPU's creation included, to its end, or
now) counts once, under the first phase of PRECEDENCE that some worker (or the job) was in then, else
as `other` (pieces); goodput.py splits the time counted as `run` by the job's steps.
"""

from __future__ import annotations

import math
import statistics
import time

from podrun import jobstore, timeline

# what an instant counts as, when several phases are under way at once (a stall lies within run)
PRECEDENCE = ("stall", "run", "stop", "judge", "recreate", "restart", "setup", "ship", "connect", "create", "queue")
SHOWN_ORDER = ("queue", "create", "connect", "ship", "setup", "run", "stop", "stall", "judge", "recreate", "restart")
MAX_ROWS = 48  # the page's rows of workers, however many workers: the rest are bands


class Span:
    """One phase of one worker (worker None: of the whole job) in one attempt."""

    __slots__ = ("phase", "attempt", "worker", "start", "end", "details")

    def __init__(self, phase: str, attempt: int, worker: int | None, start: float, end: float, details: dict):
        self.phase, self.attempt, self.worker, self.start, self.end = phase, attempt, worker, start, end
        self.details = details

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


class Analysis:
    def __init__(self, record: jobstore.JobRecord, now: float | None = None):
        self.record = record
        self.now = time.time() if now is None else now
        self.attempts = _attempts(record)
        self.spans = [span for entry in record.phases for span in self._spans(entry)]
        # per worker (None: the job's own): what the per-worker questions read, so that asking them of
        # every worker stays linear in workers x attempts
        self.spans_of: dict[int | None, list[Span]] = {}
        for span in self.spans:
            self.spans_of.setdefault(span.worker, []).append(span)
        self._seconds_by_phase: dict[str, dict[int, float]] = {}
        self._rates: dict[int, list[tuple[float, float, float]]] = {}
        self.start = min([record.started_at, *(span.start for span in self.spans)])
        self.end = record.ended_at or self.now
        self.wall_s = max(self.end - self.start, 1e-9)
        self.pieces = _pieces([span for span in self.spans if span.seconds > 0], self.start, self.end)
        self.by_phase: dict[str, float] = {}
        for piece_start, piece_end, phase in self.pieces:
            self.by_phase[phase] = self.by_phase.get(phase, 0.0) + piece_end - piece_start
        self.workers = sorted({span.worker for span in self.spans if span.worker is not None}
                              | {worker.index for worker in record.workers})

    def _spans(self, entry: dict) -> list[Span]:
        attempt = entry["attempt"]
        until = self.attempts[attempt]["ended_at"] if attempt < len(self.attempts) else None
        until = until or self.record.ended_at or self.now  # an open phase ends with its attempt
        details = {key: value for key, value in entry.items() if key in ("bytes", "why", "lost")}
        if "workers" not in entry:
            return [Span(entry["phase"], attempt, None, entry["start"], entry["end"] or until, details)]
        return [Span(entry["phase"], attempt, int(worker), start, end or until, details)
                for worker, (start, end) in entry["workers"].items()]

    def worker_seconds(self, phase: str) -> dict[int, float]:
        """Each worker's time in the phase, summed over attempts."""
        if phase not in self._seconds_by_phase:
            seconds: dict[int, float] = {}
            for span in self.spans:
                if span.phase == phase and span.worker is not None:
                    seconds[span.worker] = seconds.get(span.worker, 0.0) + span.seconds
            self._seconds_by_phase[phase] = seconds
        return self._seconds_by_phase[phase]

    def slowest(self, phase: str) -> tuple[int, float, float] | None:
        """The worker longest in the phase: (worker, its seconds, the median worker's); None if no worker's."""
        seconds = self.worker_seconds(phase)
        if not seconds:
            return None
        worker = max(seconds, key=lambda index: (seconds[index], -index))
        return worker, seconds[worker], statistics.median(seconds.values())

    def phases_shown(self) -> list[str]:
        seen = {span.phase for span in self.spans}
        return [phase for phase in SHOWN_ORDER if phase in seen]

    def line_rates(self, worker: int) -> list[tuple[float, float, float]]:
        """(start, end, lines per second) of the worker's run output over time, as the launcher counted it."""
        if worker not in self._rates:
            self._rates[worker] = self._line_rates(worker)
        return self._rates[worker]

    def _line_rates(self, worker: int) -> list[tuple[float, float, float]]:
        rates = []
        for entry in self.record.phases:
            counter = entry.get("lines", {}).get(str(worker))
            if entry["phase"] != "run" or not counter:
                continue
            every = counter["every_s"]
            part = entry["workers"].get(str(worker)) or [counter["start"], None]
            run_end = part[1] or self.end
            counts = timeline.line_counts(counter)
            for slot, count in enumerate(counts):
                start = counter["start"] + slot * every
                rates.append((start, min(start + every, run_end), count / every))
            slots_end = counter["start"] + len(counts) * every
            if slots_end < run_end:  # silent from its last line to the run's end
                rates.append((slots_end, run_end, 0.0))
        return rates

    def counted_lines(self) -> bool:
        return any("lines" in entry for entry in self.record.phases)

    def bands(self, max_rows: int = MAX_ROWS) -> list[list[int]]:
        """The workers in groups that behaved alike (phases that begin and end within the same step of
        time, the same order of magnitude of output): as fine a step as keeps the groups within
        max_rows; the largest groups then, and the rest in one. No more workers than rows: a row each."""
        if len(self.workers) <= max_rows:
            return [[worker] for worker in self.workers]
        step = self.wall_s / 200
        output = {worker: self._output(worker) for worker in self.workers}
        while True:
            groups: dict[tuple, list[int]] = {}
            for worker in self.workers:
                groups.setdefault(self._signature(worker, step, *output[worker]), []).append(worker)
            if len(groups) <= max_rows or step > self.wall_s:
                break
            step *= 2
        ordered = sorted(groups.values(), key=len, reverse=True)
        if len(ordered) > max_rows:
            rest = sorted(worker for group in ordered[max_rows - 1:] for worker in group)
            ordered = ordered[:max_rows - 1] + [rest]
        return sorted(ordered, key=lambda group: group[0])

    def _signature(self, worker: int, step: float, loudness: int, silent_s: float) -> tuple:
        spans = sorted((span.attempt, span.phase, round((span.start - self.start) / step),
                        round((span.end - self.start) / step)) for span in self.spans_of.get(worker, ()))
        return tuple(spans), loudness, silent_s // max(step, 1e-9)

    def _output(self, worker: int) -> tuple[int, float]:
        """The order of magnitude of the worker's lines per second in run (-1: none counted), and its
        seconds without a line."""
        rates = self.line_rates(worker)
        seconds = sum(end - start for start, end, _ in rates)
        lines = sum((end - start) * rate for start, end, rate in rates)
        loudness = round(math.log2(1 + lines / seconds)) if seconds else -1
        return loudness, sum(end - start for start, end, rate in rates if rate == 0)


def _attempts(record: jobstore.JobRecord) -> list[dict]:
    """Every attempt, the current one last: {attempt, state, exit_code, summary, started_at, ended_at, cause,
    straggler}."""
    current = {"attempt": record.attempt, "state": record.current_state(), "exit_code": record.exit_code,
               "summary": record.summary, "started_at": record.attempt_started_at(), "ended_at": record.ended_at,
               "cause": record.cause, "straggler": record.straggler}
    return [*record.attempts, current]


def _pieces(spans: list[Span], start: float, end: float) -> list[tuple[float, float, str]]:
    """The time from start to end as (start, end, phase) pieces, in order, each instant counted once under
    the first phase of PRECEDENCE under way then (else `other`); neighbours of one phase are one piece."""
    events = sorted([(span.start, 1, span.phase) for span in spans] + [(span.end, -1, span.phase) for span in spans])
    active = dict.fromkeys(PRECEDENCE, 0)
    pieces: list[tuple[float, float, str]] = []
    at = start
    for moment, change, phase in [*events, (end, 0, "")]:
        moment = min(max(moment, start), end)
        if moment > at:
            counted = next((name for name in PRECEDENCE if active[name] > 0), "other")
            if pieces and pieces[-1][2] == counted:
                pieces[-1] = (pieces[-1][0], moment, counted)
            else:
                pieces.append((at, moment, counted))
            at = moment
        if phase in active:
            active[phase] += change
    return pieces
