"""`podrun report`: where a job's time went, in a terminal summary and a page (report.html) in its directory."""

from __future__ import annotations

import os
import sys

from podrun import escapes, jobstore
from podrun.commands.logs import newest_running_or_newest
from podrun.output import colour_wanted
from podrun.report.analysis import Analysis
from podrun.report.summary import summary

PAGE = "report.html"


def report(job: str | None) -> int:
    """`job`: as for `podrun logs` (default: the newest running job, else the newest job)."""
    record = jobstore.find(job) if job else newest_running_or_newest()
    if record.supervised_by:  # its phases are in the record its supervisor keeps
        from podrun.supervisor import remote

        remote.reread(record)
    elif record.detached and record.state == jobstore.RUNNING and not record.supervised():
        from podrun.launch import detached  # the workers that ended meanwhile: their run's end

        detached.refresh([record])
    analysis = Analysis(record)
    # an attempt's summary quotes the failed worker's last exception line: made harmless
    print(escapes.shown_text("\n".join(summary(analysis)), colour_wanted(sys.stdout)))
    from podrun.report.page import page

    path = os.path.join(record.dir, PAGE)
    temporary = f"{path}.{os.getpid()}"
    with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        handle.write(page(analysis))
    os.replace(temporary, path)
    print(f"timeline: {path}")
    return 0
