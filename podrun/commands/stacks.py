"""`podrun stacks`: every worker's Python stacks of a running job, now, saved and summed up as where the
workers' processes differ (launch/odd_ones.py), or shown whole (`--all`); of a stalled job, those its
stall saved."""

from __future__ import annotations

import os
import sys

from podrun import escapes, jobstore
from podrun.commands.logs import newest_running_or_newest
from podrun.errors import PodrunError, UsageError
from podrun.handles import handle_for
from podrun.launch import odd_ones, stacks
from podrun.output import colour_wanted, say
from podrun.plan import parse_worker_selection


def show_stacks(job: str | None, worker_selection: str | None, raw: bool = False, every: bool = False) -> int:
    """`job`: as for `podrun logs` (default: the newest running job, else the newest job). `raw`: the
    stacks as the workers gave them, escape sequences and all (escapes.py); they are saved so anyway.
    `every`: each worker's stacks whole, not the summary."""
    handle = handle_for(jobstore.find(job) if job else newest_running_or_newest())
    record = handle.record
    there = handle.run_there(["stacks", record.id, *(["--worker", worker_selection] if worker_selection else []),
                              *(["--raw"] if raw else []), *(["--all"] if every else [])], raw)
    if there is not None:
        return there
    was_running = record.current_state() == jobstore.RUNNING
    handle.reread()  # a detached job that its agents stopped on a stall: its end, and the stacks they saved
    indexes = [w.index for w in record.workers]
    chosen = sorted(parse_worker_selection(worker_selection, max(indexes) + 1)) if worker_selection else indexes
    if missing := sorted(set(chosen) - set(indexes)):
        raise UsageError(f"--worker {worker_selection}: job {record.id} has no worker {missing[0]} "
                         f"(its workers: {', '.join(map(str, indexes))})")
    if (state := record.current_state()) == jobstore.STALLED and (saved := stacks.newest_saved(record)):
        if was_running and not every:  # fetching its end just said where its workers' processes were
            return 0
        say(f"job {record.id} stalled: its processes are gone; the stacks its stall saved in {saved[0]}:")
        _show(record, {index: text for index, text in saved[1].items() if index in chosen}, raw, every)
        return 0
    if state != jobstore.RUNNING:
        raise PodrunError(f"job {record.id} is {state}: stacks come from a running job's processes"
                          f"{_saved_note(record)}")
    texts = handle.stacks(chosen)
    _show(record, texts, raw, every)
    say(f"{'' if every else 'the stacks, whole, '}saved in {stacks.save(record, texts)}")
    return 0


def _show(record: jobstore.JobRecord, texts: dict[int, str], raw: bool, every: bool) -> None:
    colour = colour_wanted(sys.stdout)
    if not every:
        for line in odd_ones.summary(texts):
            sys.stdout.write((line if raw else escapes.shown_text(line, colour)) + "\n")
        return
    for index in sorted(texts):
        address = next(w.address for w in record.workers if w.index == index)
        text = texts[index] if raw else escapes.shown_text(texts[index], colour)
        sys.stdout.write(f"── worker {index} ({address}) ──\n{text}")
        sys.stdout.write("" if text.endswith("\n") else "\n")


def _saved_note(record: jobstore.JobRecord) -> str:
    folder = os.path.join(record.dir, jobstore.STACKS_DIR)
    return f"; those saved earlier are in {folder}" if os.path.isdir(folder) else ""
