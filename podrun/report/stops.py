"""What the report page says of a job's stops: each stall's verdict (why the job was judged stalled, as
its record's `stall` phases keep it) and the stacks of its last stop (the newest `stacks/<n>/` in the
job's directory: launch/stacks.py saves one on a stall and for each `podrun stacks`)."""

from __future__ import annotations

import html
import os
import time

from podrun import escapes, jobstore
from podrun.launch import odd_ones, stacks

STACKS_SHOWN = 32  # workers whose stacks the page holds: a 1,024-worker dump is megabytes, redrawn every 2 s live


def stall_verdicts(record: jobstore.JobRecord) -> str:
    verdicts = [f"attempt {entry['attempt']}: {entry.get('why') or 'stalled'}"
                for entry in record.phases if entry["phase"] == "stall"]
    if not verdicts:
        return ""
    items = "".join(f"<li>{_shown(verdict)}</li>" for verdict in verdicts)
    return f'<h2>Stalls</h2><ul id="stalls">{items}</ul>'


def last_stacks(record: jobstore.JobRecord) -> str:
    """The newest dump as a collapsed block: where the workers' processes differ (odd_ones.py), then a
    worker's stacks each (escaped: they quote what the job's processes hold)."""
    newest = stacks.newest_saved(record)
    if newest is None:
        return ""
    folder, texts = newest[0], dict(sorted(newest[1].items()))
    saved = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(os.stat(folder).st_mtime))
    lines = "".join(f"<li>{_shown(line)}</li>" for line in odd_ones.summary(texts))
    shown = list(texts)[:STACKS_SHOWN]
    workers = "".join(f'<details id="stacks-w{worker}"><summary>worker {worker}</summary><pre>{_shown(texts[worker])}'
                      f'</pre></details>' for worker in shown)
    if len(texts) > len(shown):
        workers += f"<p>the other {len(texts) - len(shown)} workers' stacks: in the folder</p>"
    return (f'<h2>Stacks of the last stop</h2><details id="stacks"><summary>{_shown(folder)}, saved {saved}: '
            f'{len(texts)} workers</summary><ul>{lines}</ul>{workers}</details>')


def _shown(text: str) -> str:
    return html.escape(escapes.shown_text(text, colour=False))
