"""What a job's accelerators cost (`podrun report`, `podrun jobs`): the price its record kept where it
started (JobRecord.price: the spec's cost.per_hour, or cloud/prices.py's table) times the hours they were
billed, per attempt; what of it went to productive work, and what was lost to preemptions.

Billed time, per attempt, from the record's phases (timeline.py), each attempt up to its end as podrun
recorded it (a running job's: now):
- a TPU podrun created bills from its creation: the `create` phase of attempt 0, the `recreate` of an
  attempt after a preemption. A queued request's wait for capacity is not billed, as no TPU exists then:
  the `queue` phase before `create`, a recreate's wait up to its `capacity_at`.
- anything else bills from the attempt's start: a TPU podrun did not create (the job's wall time on
  it), hosts, local workers, a Slurm allocation, a restart on the same workers.
What follows the job (the TPU's deletion, a TPU kept after it) is not the job's. Google bills a TPU while
it is READY and a Spot TPU until its preemption; podrun counts from the creation request and up to when
it saw the end, so it may count the minute or two of a creation and of a preemption's judgment more.

Lost to preemptions: every attempt that ended preempted, whole, and the TPU's recreation after it (the
next attempt's `recreate`, from capacity). Productive: `productive_s` where the caller knows it (the
productive steps of the goodput split); else the time some worker was in `run` in the attempts that
were not preempted.
"""

from __future__ import annotations

import time

from podrun import jobstore
from podrun.output import duration_text

NO_PRICE = "its record has no price (the job started before podrun recorded prices)"
ATTEMPTS_SHOWN = 6  # then `+N more $X`


def figures(record: jobstore.JobRecord, productive_s: float | None = None, lost_s: float | None = None,
            now: float | None = None) -> dict:
    """The job's cost, as `podrun report --json` and `jobs --json` give it: {per_hour, source, billed_s, total,
    attempts: [{attempt, state, billed_s, cost}], productive_s, productive, productive_of, lost_s,
    lost_to_preemptions}; or {per_hour: None, why} where it has no price. Money in USD, to the cent."""
    price = record.price or {"per_hour": None, "why": NO_PRICE}
    per_hour = price["per_hour"]
    if per_hour is None:
        return {"per_hour": None, "why": price["why"]}
    attempts = _billed(record, time.time() if now is None else now)
    billed_s = sum(attempt["billed_s"] for attempt in attempts)
    productive_of = "productive steps" if productive_s is not None else "run"
    productive_s = _run_s(record, attempts) if productive_s is None else productive_s
    lost_s = _lost_s(record, attempts) if lost_s is None else lost_s
    return {"per_hour": per_hour, "source": price["source"], "billed_s": round(billed_s, 3),
            "total": _cost(per_hour, billed_s),
            "attempts": [{"attempt": attempt["attempt"], "state": attempt["state"],
                          "billed_s": round(attempt["billed_s"], 3), "cost": _cost(per_hour, attempt["billed_s"])}
                         for attempt in attempts],
            "productive_s": round(productive_s, 3), "productive": _cost(per_hour, productive_s),
            "productive_of": productive_of, "lost_s": round(lost_s, 3), "lost_to_preemptions": _cost(per_hour, lost_s)}


def lines(cost: dict) -> list[str]:
    """The report's line: `cost $12.34 for 59m12s billed at $12.50/h (spec cost.per_hour): attempt 0 $8.10
    (preempted), attempt 1 $4.24; run $3.90, lost to preemptions $8.10`, or why it shows none."""
    if cost["per_hour"] is None:
        return [f"cost: not shown: {cost['why']}"]
    line = (f"cost {money(cost['total'])} for {duration_text(cost['billed_s'])} billed at {rate(cost['per_hour'])} "
            f"({cost['source']})")
    attempts = cost["attempts"]
    if len(attempts) > 1:
        shown = [f"attempt {each['attempt']} {money(each['cost'])}"
                 + " (preempted)" * (each["state"] == jobstore.PREEMPTED) for each in attempts[:ATTEMPTS_SHOWN]]
        if rest := attempts[ATTEMPTS_SHOWN:]:
            shown.append(f"+{len(rest)} more {money(sum(each['cost'] for each in rest))}")
        line += ": " + ", ".join(shown)
    line += f"; {cost['productive_of']} {money(cost['productive'])}"
    if cost["lost_s"] or any(each["state"] == jobstore.PREEMPTED for each in attempts):
        line += f", lost to preemptions {money(cost['lost_to_preemptions'])}"
    return [line]


def money(dollars: float) -> str:
    return f"${dollars:,.2f}"


def rate(per_hour: float) -> str:
    """`$12.50/h`; a price that has more than cents keeps them (`$7.372/h`)."""
    shown = money(per_hour) if round(per_hour, 2) == per_hour else f"${per_hour:,.6f}".rstrip("0")
    return f"{shown}/h"


def _cost(per_hour: float, seconds: float) -> float:
    return round(per_hour * seconds / 3600, 2)


def _billed(record: jobstore.JobRecord, now: float) -> list[dict]:
    """Each attempt, the current one last: {attempt, state, start, end, billed_s}, billed as the docstring says."""
    current = {"attempt": record.attempt, "state": record.current_state(), "started_at": record.attempt_started_at(),
               "ended_at": record.ended_at or now}
    billed = []
    for attempt in [*record.attempts, current]:
        made = _made(record, attempt["attempt"])
        start = made.get("capacity_at", made["start"]) if made else attempt["started_at"]
        end = attempt["ended_at"] or now
        billed.append({"attempt": attempt["attempt"], "state": attempt["state"], "start": start, "end": end,
                       "billed_s": max(0.0, end - start)})
    return billed


def _made(record: jobstore.JobRecord, attempt: int) -> dict | None:
    """The attempt's phase in which podrun made its TPU (create, or recreate after a preemption), if any."""
    return next((entry for entry in record.phases
                 if entry["attempt"] == attempt and entry["phase"] in ("create", "recreate")), None)


def _lost_s(record: jobstore.JobRecord, attempts: list[dict]) -> float:
    """Attempts that ended preempted, whole, and each TPU's recreation after one, from capacity."""
    lost = sum(attempt["billed_s"] for attempt in attempts if attempt["state"] == jobstore.PREEMPTED)
    for attempt in attempts:
        made = _made(record, attempt["attempt"])
        if made and made["phase"] == "recreate":
            lost += max(0.0, (made["end"] or attempt["end"]) - attempt["start"])
    return lost


def _run_s(record: jobstore.JobRecord, attempts: list[dict]) -> float:
    """The time some worker was in run, in the attempts not lost to a preemption; each instant once."""
    ends = {attempt["attempt"]: attempt["end"] for attempt in attempts if attempt["state"] != jobstore.PREEMPTED}
    spans = sorted((start, end or ends[entry["attempt"]]) for entry in record.phases
                   if entry["phase"] == "run" and entry["attempt"] in ends
                   for start, end in entry.get("workers", {}).values())
    seconds, reached = 0.0, float("-inf")
    for start, end in spans:
        if end > reached:
            seconds += end - max(start, reached)
            reached = end
    return seconds
