"""`podrun jobs`: the jobs in the job store, newest first, with their state as where they run says."""

from __future__ import annotations

import json
import os
import time

from podrun import handles, jobstore, progress
from podrun.launch import restart_policy
from podrun.output import (
    counted,
    duration_text,
    print_table,
    say,
)
from podrun.report import cost

DEFAULT_JOBS_SHOWN = 20
HEADER = ("ID", "NAME", "TARGET", "STATE", "STEP", "EXIT CODES", "STARTED", "DURATION", "COST")
# what gives way when the table is wider than the terminal, {column: how narrow it may get}, group by
# group: the name and the id (the wider of the two first, the name on a tie: the id begins with it),
# then (after a running job's idle time, left out: _table) the exit codes; then whole columns, the
# least needed first (the id begins with the name), each giving the others their room back; then the
# id and the state are cut further
SHRINKABLE = ({"NAME": 4, "ID": 12}, {"EXIT CODES": len("EXIT CODES")})
DROPPABLE = ("STEP", "STARTED", "NAME", "COST", "DURATION", "TARGET")
LAST_RESORT = {"ID": 9, "STATE": len("succeeded")}
FAILURES_SHOWN = 3  # then `+N`


def list_jobs(name_or_prefix: str | None, states: list[str], count: int | None, show_all: bool,
              as_json: bool) -> int:
    """Newest first: at most `count` jobs (default 20; with --json, all), of these states (any if none),
    whose id begins with `name_or_prefix` (an id begins with its job's name)."""
    records = [record for record in jobstore.all_jobs() if record.id.startswith(name_or_prefix or "")]
    refreshed = handles.refresh(records)
    jobs = [(record, record.current_state()) for record in records]
    jobs = [(record, state) for record, state in jobs if not states or state in states]
    limit = None if show_all or (as_json and count is None) else DEFAULT_JOBS_SHOWN if count is None else count
    shown = jobs[:limit]
    if as_json:
        print(json.dumps([_as_json(record, state, (refreshed.get(record.id) or handles.handle_for(record)).notes(state))
                          for record, state in shown], indent=1))
    else:
        notes = {record.id: _notes(refreshed.get(record.id) or handles.handle_for(record), state)
                 for record, state in shown}
        print_table(_table(shown, notes, _terminal_width()))
    if len(shown) < len(jobs):
        say(f"{counted(len(jobs) - len(shown), 'older job')} not shown; -n N or --all shows them")
    return 0


def _as_json(record: jobstore.JobRecord, state: str, notes: list[str]) -> dict:
    """Every field of the record, with the state shown, what it cost (so far), what its handle notes of
    where it lives (a supervisor host's laptop shows them) and, while it runs, each worker's `output_at`."""
    fields = {**record.to_dict(), "state": state, "cost": cost.figures(record), "notes": notes}
    if state == jobstore.RUNNING:
        for worker, worker_fields in zip(record.workers, fields["workers"]):
            worker_fields["output_at"] = record.output_at(worker)
    return fields


def _row(record: jobstore.JobRecord, state: str, notes: list[str], idle: bool) -> tuple[str, ...]:
    end = record.ended_at or (time.time() if state == jobstore.RUNNING else None)
    duration = duration_text(end - record.started_at) if end else "-"
    return record.id, record.name, record.target, _state_text(record, state, notes, idle), _step(record, state), \
        _exit_codes(record, state), _started(record), duration, _cost(record)


def _cost(record: jobstore.JobRecord) -> str:
    """`$12.34`: what the job's workers cost, so far while it runs (report/cost.py); `-` where it has no price."""
    figures = cost.figures(record)
    return cost.money(figures["total"]) if figures["per_hour"] is not None else "-"


def _step(record: jobstore.JobRecord, state: str) -> str:
    """The job's step (the spec's progress): `412 31/min` while it runs; after a restart, where the attempt
    began too, `300-412` (jobs --json has every attempt's first and last); `-` without progress."""
    entry = progress.entry_of(record)
    if entry is None:
        return "-"
    shown = f"{entry['first']}-{entry['last']}" if record.attempt and entry["first"] != entry["last"] else str(entry["last"])
    total = record.total_steps
    if total:
        shown += f"/{total} {min(100.0, 100 * entry['last'] / total):.0f}%"
    rate = progress.steps_per_minute(record, time.time()) if state == jobstore.RUNNING else None
    if rate is None:
        return shown
    shown = f"{shown} {progress.rate_text(rate)}/min"
    return f"{shown} {duration_text(60 * max(0, total - entry['last']) / rate)} left" if total and rate else shown


def _notes(handle: handles.JobHandle, state: str) -> list[str]:
    """Beside the state: once it ended, its last attempt's cause (`oom on worker 2`), the restarts it took
    (`restarts`) and what its handle says of where it lives (a
    supervisor host, and whether it answered; while it runs, its supervisor here)."""
    record = handle.record
    left_out = sum(entry["phase"] == "swap" for entry in record.phases)
    straggler = [f"w{record.straggler['worker']} straggling"] if record.straggler else []
    cause = jobstore.cause_brief(record.cause) if state != jobstore.RUNNING else None
    return ([cause] if cause else []) + \
        [f"{record.attempt} restart{'s' * (record.attempt > 1)}"] * bool(record.attempt) + \
        [f"{left_out} host{'s' * (left_out > 1)} left out"] * bool(left_out) + \
        straggler + handle.notes(state)


def _state_text(record: jobstore.JobRecord, state: str, notes: list[str], idle: bool) -> str:
    """The state, with its `notes` (_notes) and, while it runs (with `idle`), how long ago its last output came;
    after it ended, what podrun still does with its capacity (`succeeded; deleting its TPU`)."""
    notes = list(notes)
    if state == jobstore.RUNNING and idle:
        notes.append(_idle(record))
    text = f"{state} ({', '.join(notes)})" if notes else state
    return f"{text}; {record.giving_back}" if record.giving_back and state != jobstore.RUNNING else text


def _idle(record: jobstore.JobRecord) -> str:
    """`idle 4s`: how long ago the last output of any worker came (since the attempt started, if none
    came yet); short, as the column must fit 80 columns (--json has each worker's output_at)."""
    idle_s = max(0.0, time.time() - max((at for at in map(record.output_at, record.workers) if at is not None),
                                        default=record.attempt_started_at()))
    return f"idle {idle_s:.0f}s" if idle_s < 60 else f"idle {duration_text(idle_s)}"


def _started(record: jobstore.JobRecord) -> str:
    """As ps shows a start (STIME): the time today, the day this year, else the year (--json has it all)."""
    started, now = time.localtime(record.started_at), time.localtime()
    if started[:3] == now[:3]:
        return time.strftime("%H:%M", started)
    return time.strftime("%b %d" if started.tm_year == now.tm_year else "%Y", started)


def _exit_codes(record: jobstore.JobRecord, state: str) -> str:
    """`32/32 ok`, `30/32 ok, 2 running`, `32 stopped`, or the failed workers and how many were stopped
    (by `podrun stop`, fail-fast or Ctrl-C): `w5=3, 31 stopped`; those a stop had to kill are counted
    apart: `w5=3, 30 stopped, 1 killed after the grace period`; `-` while no worker is known (a supervisor
    host not read yet)."""
    if not record.workers:
        return "-"
    if restart_policy.cause(record.state, record.exit_code, record.summary) == "time_limit":
        return f"{len(record.workers)} at the time limit"  # Slurm ended them all, whatever each exited with
    failed = [w for w in record.workers if w.exit_code and not _stopped(w) and not w.killed]
    stopped = sum(_stopped(w) and not w.killed for w in record.workers)
    killed = sum(bool(w.killed) for w in record.workers)
    ok = sum(w.exit_code == 0 and not _stopped(w) for w in record.workers)
    pending = sum(w.exit_code is None for w in record.workers)
    parts = []
    if failed:
        parts.append(_failures(failed))
    elif ok or not (stopped or killed or pending):
        parts.append(f"{ok}/{len(record.workers)} ok")
    if stopped:
        parts.append(f"{stopped} stopped")
    if killed:
        parts.append(f"{killed} killed after the grace period")
    if pending:
        parts.append(f"{pending} {'running' if state == jobstore.RUNNING else 'unknown'}")
    return ", ".join(parts)


def _stopped(worker: jobstore.WorkerRecord) -> bool:
    """Whether the worker ended because it was told to: SIGTERM (an attached job's launcher stopping it),
    or its agent's stop_reason (a detached job's, whatever its program exited with)."""
    return worker.stop_reason is not None or bool(worker.exit_code) and worker.signal == "SIGTERM"


def _failures(failed: list[jobstore.WorkerRecord]) -> str:
    shown = " ".join(f"w{worker.index}={worker.exit_code}" for worker in failed[:FAILURES_SHOWN])
    return f"{shown} +{len(failed) - FAILURES_SHOWN}" if len(failed) > FAILURES_SHOWN else shown


def _table(jobs: list[tuple[jobstore.JobRecord, str]], notes: dict[str, list[str]], width: int | None) \
        -> list[tuple[str, ...]]:
    """The rows of `podrun jobs`, each state with its job's `notes` (by id), the header first, fitted to `width`
    (None: whole) as SHRINKABLE says; STEP only where a job shown has progress, COST where one has a price."""
    shown_if = {"STEP": any(record.steps for record, _ in jobs),
                "COST": any(record.price and record.price["per_hour"] is not None for record, _ in jobs)}
    kept = [column for column, name in enumerate(HEADER) if shown_if.get(name, True)]

    def rows_of(idle: bool) -> list[tuple[str, ...]]:
        return [tuple(row[column] for column in kept)
                for row in [HEADER, *(_row(record, state, notes[record.id], idle) for record, state in jobs)]]

    rows = _fit(rows_of(idle=True), width, SHRINKABLE[:1])
    if not width or _table_width(rows) <= width:
        return rows
    whole = rows_of(idle=False)
    for dropped in range(len(DROPPABLE) + 1):
        shown = [column for column, name in enumerate(whole[0]) if name not in DROPPABLE[:dropped]]
        rows = _fit([tuple(row[column] for column in shown) for row in whole], width, SHRINKABLE)
        if _table_width(rows) <= width:
            return rows
    return _fit(rows, width, (LAST_RESORT,))


def _terminal_width() -> int | None:
    """On a terminal, COLUMNS, else its width; None for a pipe or a file, COLUMNS or not: they get whole
    rows, as from `ps` or `docker ps`, since a script that reads them must not get cut cells."""
    if not os.isatty(1):
        return None
    try:
        return int(os.environ["COLUMNS"]) or None
    except (KeyError, ValueError):
        try:
            return os.get_terminal_size(1).columns
        except OSError:
            return None


def _table_width(rows: list[tuple[str, ...]]) -> int:
    return sum(max(len(row[column]) for row in rows) for column in range(len(rows[0]))) + 2 * (len(rows[0]) - 1)


def _fit(rows: list[tuple[str, ...]], width: int | None, shrinkable: tuple[dict[str, int], ...]) \
        -> list[tuple[str, ...]]:
    """The rows, with the `shrinkable` columns (SHRINKABLE's groups, by header) cut in the middle until a row
    fits `width` (or they can give no more)."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    excess = _table_width(rows) - width if width else 0
    for by_name in shrinkable:
        narrowest = {rows[0].index(name): least for name, least in by_name.items() if name in rows[0]}
        while excess > 0 and (wider := [column for column in narrowest if widths[column] > narrowest[column]]):
            widths[max(wider, key=lambda column: widths[column])] -= 1
            excess -= 1
    return [tuple(_cut_middle(cell, width) for cell, width in zip(row, widths)) for row in rows]


def _cut_middle(text: str, width: int) -> str:
    """`text`, or its beginning and end around a `…` to fit `width`: both ends of an id stay readable."""
    if len(text) <= width:
        return text
    end = (width - 1) // 2
    return f"{text[:width - 1 - end]}…{text[len(text) - end:]}"
