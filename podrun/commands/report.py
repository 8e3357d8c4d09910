"""`podrun report`: where a job's time went, in a terminal summary and a page (report.html) in its directory;
with `--serve`, that page served live (report/live.py)."""

from __future__ import annotations

import os
import sys

from podrun import escapes, jobstore
from podrun.commands.logs import newest_running_or_newest
from podrun.handles import handle_for
from podrun.output import colour_wanted
from podrun.report.analysis import Analysis
from podrun.report.summary import summary

PAGE = "report.html"


def report(job: str | None, serve: bool = False, port: int = 0) -> int:
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
    # an attempt's summary quotes the failed worker's last exception line: made harmless
    print(escapes.shown_text("\n".join(summary(analysis)), colour_wanted(sys.stdout)))
    from podrun.report.page import page

    path = os.path.join(record.dir, PAGE)
    temporary = f"{path}.{os.getpid()}"
    with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as file:
        file.write(page(analysis))
    os.replace(temporary, path)
    print(f"timeline: {path}")
    return 0
