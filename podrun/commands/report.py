"""`podrun report`: where a job's time went, in a terminal summary and a page (report.html) in its
directory, or (--json) one JSON object: the wall time, its parts (report/goodput.py), goodput, the
steps of each attempt and the attempts; or (--serve) the page served live (report/live.py)."""

from __future__ import annotations

import json
import os
import sys

from podrun import escapes, jobstore
from podrun.commands.logs import newest_running_or_newest
from podrun.handles import handle_for
from podrun.output import colour_wanted
from podrun.report.analysis import Analysis
from podrun.report.goodput import Goodput, steps_of
from podrun.report.summary import cost_of, summary

PAGE = "report.html"


def report(job: str | None, as_json: bool = False, serve: bool = False, port: int = 0) -> int:
    """`job`: as for `podrun logs` (default: the newest running job, else the newest job). `serve`: serve the
    page on 127.0.0.1:`port` (0: a free one) until Ctrl-C, instead."""
    record = jobstore.find(job) if job else newest_running_or_newest()
    if serve:
        from podrun.report import live

        return live.serve(live.LiveReport(record.id), port)
    handle = handle_for(record)
    handle.reread()
    record = handle.record
    analysis = Analysis(record)
    split = Goodput(analysis)
    if as_json:
        print(json.dumps(report_object(analysis, split)))
        return 0
    # an attempt's summary quotes the failed worker's last exception line: made harmless
    print(escapes.shown_text("\n".join(summary(analysis, split)), colour_wanted(sys.stdout)))
    from podrun.report.page import page

    path = os.path.join(record.dir, PAGE)
    temporary = f"{path}.{os.getpid()}"
    with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as file:
        file.write(page(analysis, split))
    os.replace(temporary, path)
    print(f"timeline: {path}")
    return 0


def report_object(analysis: Analysis, split: Goodput) -> dict:
    """What `report --json` prints: every figure in seconds (times: epoch seconds)."""
    record = analysis.record
    attempts = [{**attempt, "seconds": (attempt["ended_at"] or analysis.now) - attempt["started_at"]}
                for attempt in analysis.attempts]
    return {"job": record.id, "name": record.name, "state": record.current_state(), "started_at": analysis.start,
            "ended_at": record.ended_at, **split.to_dict(), "steps": steps_of(record), "attempts": attempts,
            "phases_s": analysis.by_phase, "cost": cost_of(analysis, split)}
