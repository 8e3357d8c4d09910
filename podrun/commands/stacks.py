"""`podrun stacks`: every worker's Python stacks of a running job, now, shown and saved."""

from __future__ import annotations

import os
import sys

from podrun import escapes, jobstore
from podrun.commands.logs import newest_running_or_newest
from podrun.errors import PodrunError, UsageError
from podrun.handles import handle_for
from podrun.launch import stacks
from podrun.output import colour_wanted, say
from podrun.plan import parse_worker_selection


def show_stacks(job: str | None, worker_selection: str | None, raw: bool = False) -> int:
    """`job`: as for `podrun logs` (default: the newest running job, else the newest job). `raw`: the
    stacks as the workers gave them, escape sequences and all (escapes.py); they are saved so anyway."""
    handle = handle_for(jobstore.find(job) if job else newest_running_or_newest())
    record = handle.record
    there = handle.run_there(["stacks", record.id, *(["--worker", worker_selection] if worker_selection else []),
                              *(["--raw"] if raw else [])], raw)
    if there is not None:
        return there
    if (state := record.current_state()) != jobstore.RUNNING:
        raise PodrunError(f"job {record.id} is {state}: stacks come from a running job's processes"
                          f"{_saved_note(record)}")
    indexes = [w.index for w in record.workers]
    chosen = sorted(parse_worker_selection(worker_selection, max(indexes) + 1)) if worker_selection else indexes
    if missing := sorted(set(chosen) - set(indexes)):
        raise UsageError(f"--worker {worker_selection}: job {record.id} has no worker {missing[0]} "
                         f"(its workers: {', '.join(map(str, indexes))})")
    texts = handle.stacks(chosen)
    colour = colour_wanted(sys.stdout)
    for index in chosen:
        address = next(w.address for w in record.workers if w.index == index)
        text = texts[index] if raw else escapes.shown_text(texts[index], colour)
        sys.stdout.write(f"── worker {index} ({address}) ──\n{text}")
        sys.stdout.write("" if text.endswith("\n") else "\n")
    say(f"saved in {stacks.save(record, texts)}")
    return 0


def _saved_note(record: jobstore.JobRecord) -> str:
    folder = os.path.join(record.dir, jobstore.STACKS_DIR)
    return f"; those saved earlier are in {folder}" if os.path.isdir(folder) else ""
