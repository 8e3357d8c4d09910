"""`podrun report`'s terminal summary: wall time, goodput and the rest of the wall time by part
(goodput.py), each phase with its slowest worker, the attempts, why each ended and its first and last
step, what it cost (cost.py); report.html shows it too."""

from __future__ import annotations

from podrun import jobstore, progress
from podrun.output import duration_text, worker_ranges
from podrun.report import cost
from podrun.report.analysis import Analysis
from podrun.report.goodput import UNKNOWN, Goodput, steps_text


def summary(analysis: Analysis, split: Goodput) -> list[str]:
    record = analysis.record
    good = f"{seconds_text(split.parts_s['productive'])} productive" if split.known else \
        f"{seconds_text(split.parts_s['run'])} in run"
    lines = [record.outcome() if record.current_state() != jobstore.RUNNING else f"job {record.id} is running",
             f"wall time {seconds_text(analysis.wall_s)}; goodput {split.goodput:.1%} ({good})"]
    rest = [f"{part} {seconds_text(seconds)}{split.part_note(part)}"
            for part, seconds in split.parts_s.items() if seconds > 0 and part not in ("productive", "run")]
    lines.append(f"the rest: {', '.join(rest) if rest else 'nothing'}")
    if not split.known:
        lines.append(UNKNOWN)
    shown = analysis.phases_shown()
    if shown:
        lines.append(f"{'phase':<10} {'time':>8}  slowest worker (summed over attempts)")
    for phase in shown:
        slowest = analysis.slowest(phase)
        detail = ""
        if slowest and len(analysis.worker_seconds(phase)) > 1:
            worker, seconds, median = slowest
            detail = f"w{worker} {seconds_text(seconds)}, +{seconds_text(seconds - median)} over the median worker"
        elif slowest:
            detail = f"w{slowest[0]} {seconds_text(slowest[1])}"
        lines.append(f"{phase:<10} {seconds_text(analysis.by_phase.get(phase, 0.0)):>8}  {detail}".rstrip())
    for attempt in analysis.attempts:
        took = (attempt["ended_at"] or analysis.now) - attempt["started_at"]
        why = f": {attempt['summary']}" if attempt["summary"] and attempt["state"] != jobstore.SUCCEEDED else ""
        why = f" ({cause}){why}" if (cause := jobstore.cause_brief(attempt.get("cause"))) else why
        steps = f"; {steps_text(record, attempt['attempt']) or 'no step'}" if split.known else ""
        lines.append(f"attempt {attempt['attempt']}: {attempt['state']} after {seconds_text(took)}{why}{steps}")
        entry = progress.entry_of(record, attempt["attempt"])
        if entry and (rates := progress.rates(entry)):
            rates_shown = " ".join(progress.rate_text(rate) for _, _, rate in rates)
            lines.append(f"  steps/min over each tenth of its steps: {rates_shown}")
    for entry in record.phases:
        if entry["phase"] == "preempted":
            lines.append(f"preempted in attempt {entry['attempt']}: {entry.get('why')}")
        elif entry["phase"] == "move":
            lines.append(f"moved to {entry.get('zone')} in attempt {entry['attempt']}: {entry.get('why')}")
        elif entry["phase"] == "swap":
            place = f"spare {entry['spare']}" if entry.get("spare") else "a new allocation"
            lines.append(f"attempt {entry['attempt']}: worker {entry.get('worker')} on {place}, "
                         f"{entry.get('left')} left out: {entry.get('why')}")
    lines += cost.lines(cost_of(analysis, split))
    silent = [worker for worker in analysis.workers if _silent(analysis, worker)]
    if silent and analysis.counted_lines():
        lines.append(f"printed nothing in run: {worker_ranges(silent)}")
    return lines


def _silent(analysis: Analysis, worker: int) -> bool:
    rates = analysis.line_rates(worker)
    return bool(rates) and not any(rate for _, _, rate in rates)


def seconds_text(seconds: float) -> str:
    return f"{seconds:.2f}s" if seconds < 10 else duration_text(seconds)


def cost_of(analysis: Analysis, split: Goodput) -> dict:
    """cost.figures with the productive steps' seconds, where the steps are known."""
    return cost.figures(analysis.record, split.parts_s["productive"] if split.known else None, now=analysis.now)
