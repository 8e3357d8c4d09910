"""report.html: one self-contained page (inline CSS, SVG and a few lines of script; nothing from the
network) with the job's summary, its wall time as one bar of parts (goodput.py), its steps over time
(the spec's `progress`), its stall verdicts, its timeline (a row per worker, or per band of workers that
behaved alike, coloured bars per phase, the attempts one after another with their first and last step,
preemptions and stalls marked, each bar's times on hover), each row's lines per second over the run,
and the stacks of its last stop. `podrun report --serve` (live.py) serves the same page, redrawn as the
job goes."""

from __future__ import annotations

import html
import statistics

from podrun import jobstore, progress
from podrun.output import worker_ranges
from podrun.report import stops
from podrun.report.analysis import Analysis, Span
from podrun.report.goodput import Goodput, steps_text
from podrun.report.summary import summary

COLOURS = {"queue": "#c7c7c7", "create": "#8c6d31", "connect": "#9e9ac8", "ship": "#6baed6", "setup": "#fdae6b",
           "run": "#31a354", "stop": "#969696", "judge": "#e377c2", "recreate": "#d62728", "restart": "#bcbd22",
           "stall": "#e6550d"}
# the parts of the wall time (goodput.py): podrun's phases keep their colours
PART_COLOURS = {**COLOURS, "productive": COLOURS["run"], "program_startup": "#fdd0a2",
                "wasted_progress_from_disruption": "#843c39", "slow_steps": "#e7ba52",
                "infrastructure_recovery_from_disruption": COLOURS["recreate"], "after_last_step": "#c6dbef",
                "other": "#e0e0e0"}
WIDTH = 1100
LABEL_W = 190
ROW_H = 18
TOP = 34  # room for the attempts' labels and the time axis
RATE_LEVELS = 8  # a row's lines per second, drawn in this many shades
STEPS_H = 120  # the steps figure's plot, below its axis
STEP_COLOURS = ("#3182bd", "#31a354", "#756bb1", "#e6550d")  # an attempt's line each, in turn

STYLE = """
body{font:13px system-ui,sans-serif;margin:16px;color:#222}
pre{background:#f6f6f6;padding:8px;overflow-x:auto}
.legend span{display:inline-block;margin-right:12px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}
svg text{font:11px system-ui,sans-serif}
rect.bar:hover,rect.rate:hover,rect.part:hover{stroke:#000;stroke-width:1}
"""
# the browser test reads data-drawn: how many bars the timeline holds, once drawn with a size; and
# data-parts: the parts of the wall time drawn (live.py's script marks both again after each redraw)
SCRIPT = """
function markDrawn() {
  var svg = document.getElementById('timeline');
  var bars = svg.querySelectorAll('rect.bar').length;
  document.body.setAttribute('data-drawn', bars > 0 && svg.getBBox().width > 0 ? String(bars) : 'no');
  var parts = document.getElementById('parts');
  var drawn = parts.querySelectorAll('rect.part').length;
  document.body.setAttribute('data-parts', parts.getBBox().width > 0 ? String(drawn) : 'no');
}
window.addEventListener('load', markDrawn);
"""


def page(analysis: Analysis, split: Goodput, live_script: str = "") -> str:
    """The whole page; `live_script`: what redraws its content as the job goes (live.py)."""
    title = html.escape(analysis.record.id)
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>podrun report: {title}</title>"
            f"<style>{STYLE}</style><script>{SCRIPT}{live_script}</script></head><body>"
            f"<div id=\"content\">{content(analysis, split)}</div></body></html>\n")


def content(analysis: Analysis, split: Goodput) -> str:
    """What the page shows of the job: all of it but the page's head and script."""
    record = analysis.record
    rows = [_row(analysis, band) for band in analysis.bands()]
    legend = "".join(f'<span><i style="background:{colour}"></i>{phase}</span>' for phase, colour in COLOURS.items()
                     if phase in analysis.phases_shown())
    if any(span.phase == "preempted" for span in analysis.spans):
        legend += "<span>▲ preempted</span>"
    rates_note = ("Lines per second of each row's output while run ran, as the launcher received them (counted "
                  "per chunk, in slots that widen as the run grows); red: no line in that slot."
                  if analysis.counted_lines() else
                  "No lines counted: the run went on without podrun receiving its output (a detached job).")
    return (f"<h1>{html.escape(record.id)}</h1><pre>{html.escape(chr(10).join(summary(analysis, split)))}</pre>"
            f"<h2>Wall time by part</h2>{_parts(split)}{_progress(analysis)}{stops.stall_verdicts(record)}"
            f"<h2>Timeline</h2><div class=\"legend\">{legend}</div>"
            f"{_timeline(analysis, rows)}"
            f"<h2>Output</h2><p>{rates_note}</p>{_rates(analysis, rows)}{stops.last_stacks(record)}")


class Row:
    def __init__(self, label: str, title: str, workers: list[int], spans: list[Span]):
        self.label, self.title, self.workers, self.spans = label, title, workers, spans


def _row(analysis: Analysis, band: list[int]) -> Row:
    """A worker's row, or a band's: drawn as its first worker, its title giving the band's spread."""
    first = band[0]
    spans = analysis.spans_of.get(first, [])
    if len(band) == 1:
        return Row(f"w{first}", _address(analysis, first), band, spans)
    label = f"{worker_ranges(band)} ({len(band)})"
    spread = []
    members = set(band)
    for phase in analysis.phases_shown():
        seconds = [s for w, s in analysis.worker_seconds(phase).items() if w in members]
        if seconds:
            spread.append(f"{phase}: {min(seconds):.2f}s to {max(seconds):.2f}s, median {statistics.median(seconds):.2f}s")
    return Row(label, f"{len(band)} workers alike: {worker_ranges(band)}\n" + "\n".join(spread), band, spans)


def _address(analysis: Analysis, index: int) -> str:
    return next((f"worker {index} ({w.address})" for w in analysis.record.workers if w.index == index),
                f"worker {index}")


def _x(analysis: Analysis, at: float) -> float:
    return round(LABEL_W + (at - analysis.start) / analysis.wall_s * (WIDTH - LABEL_W - 10), 1)


def _title(text: str) -> str:
    return f"<title>{html.escape(text)}</title>"


def _bar(analysis: Analysis, span: Span, y: float, height: float, who: str) -> str:
    x0, x1 = _x(analysis, span.start), _x(analysis, span.end)
    extra = "".join(f", {key} {value}" for key, value in span.details.items())
    text = (f"{who}: {span.phase}, attempt {span.attempt}: {span.start - analysis.start:.2f}s to "
            f"{span.end - analysis.start:.2f}s ({span.seconds:.2f}s){extra}")
    return (f'<rect class="bar" x="{x0}" y="{y}" width="{max(x1 - x0, 1)}" height="{height}" '
            f'fill="{COLOURS.get(span.phase, "#444")}">{_title(text)}</rect>')


def _frame(analysis: Analysis, height: float) -> list[str]:
    """The time axis, and each attempt's start as a dashed line with its label."""
    parts = [f'<text x="{LABEL_W}" y="{TOP - 6}">0s</text>',
             f'<text x="{WIDTH - 10}" y="{TOP - 6}" text-anchor="end">{analysis.wall_s:.1f}s</text>']
    for attempt in analysis.attempts:
        x = _x(analysis, attempt["started_at"])
        steps = f", {text}" if (text := steps_text(analysis.record, attempt["attempt"])) else ""
        parts.append(f'<line x1="{x}" y1="4" x2="{x}" y2="{height}" stroke="#555" stroke-dasharray="3,3"/>'
                     f'<text x="{x + 3}" y="12">attempt {html.escape(str(attempt["attempt"]))}: '
                     f'{html.escape(attempt["state"])}{steps}</text>')
    return parts


def _parts(split: Goodput) -> str:
    """The wall time as one bar, a rectangle per part in the order of goodput.PARTS, each titled with its share."""
    parts, x, width = [], 0.0, WIDTH - 10
    for part, seconds in split.parts_s.items():
        if seconds <= 0:
            continue
        share = seconds / split.wall_s
        title = _title(f"{part}: {seconds:.2f}s ({share:.1%}){split.part_note(part)}")
        parts.append(f'<rect class="part" x="{round(x, 1)}" y="0" width="{max(round(share * width, 1), 0.5)}" '
                     f'height="{ROW_H}" fill="{PART_COLOURS[part]}">{title}</rect>')
        x += share * width
    legend = "".join(f'<span><i style="background:{PART_COLOURS[part]}"></i>{part}</span>'
                     for part, seconds in split.parts_s.items() if seconds > 0)
    return (f'<div class="legend">{legend}</div><svg id="parts" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
            f'height="{ROW_H}" viewBox="0 0 {WIDTH} {ROW_H}">{"".join(parts)}</svg>')


def _timeline(analysis: Analysis, rows: list[Row]) -> str:
    height = TOP + ROW_H * (len(rows) + 1) + 4
    parts = _frame(analysis, height)
    job_spans = [span for span in analysis.spans if span.worker is None]
    parts.append(f'<text x="4" y="{TOP + 13}">job</text>')
    for span in job_spans:
        if span.phase == "preempted":
            continue
        if span.phase == "stall":  # over every row: no worker printed anything then
            x0, x1 = _x(analysis, span.start), _x(analysis, span.end)
            parts.append(f'<rect x="{x0}" y="{TOP}" width="{max(x1 - x0, 1)}" height="{height - TOP}" '
                         f'fill="{COLOURS["stall"]}" opacity="0.18"/>')
        parts.append(_bar(analysis, span, TOP + 2, ROW_H - 4, "job"))
    for number, row in enumerate(rows, start=1):
        y = TOP + number * ROW_H
        parts.append(f'<text x="4" y="{y + 13}">{html.escape(row.label)}{_title(row.title)}</text>')
        parts += [_bar(analysis, span, y + 2, ROW_H - 4, row.label) for span in row.spans]
    for span in job_spans:
        if span.phase == "preempted":
            x, why = _x(analysis, span.start), _title(f"preempted: {span.details.get('why')}")
            parts.append(f'<line x1="{x}" y1="{TOP}" x2="{x}" y2="{height}" stroke="#d62728" stroke-width="2"/>'
                         f'<text x="{x}" y="{TOP + 2}" fill="#d62728" text-anchor="middle">▲{why}</text>')
    return (f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}">{"".join(parts)}</svg>')


def _progress(analysis: Analysis) -> str:
    """The job's step now and its rate, and each attempt's steps over time on the timeline's time axis."""
    record = analysis.record
    if not record.steps:
        return ""
    now, latest = progress.step_of(record), record.steps[-1]
    rate = progress.steps_per_minute(record, analysis.now) if record.current_state() == jobstore.RUNNING else None
    said = (f"step {now} in attempt {record.attempt}" if now is not None else
            f"no step yet in attempt {record.attempt}; attempt {latest['attempt']} reached step {latest['last']}")
    said += f", {rate:.1f} steps/min over the last 5 min" if rate is not None else ""
    return f'<h2>Steps</h2><p id="step">{html.escape(said)}</p>{_steps(analysis)}'


def _steps(analysis: Analysis) -> str:
    """A line per attempt: the job's step (y) over time (x, as on the timeline), flat (dashed) from its last
    step to the attempt's end, or now."""
    entries = analysis.record.steps
    low = min(entry["first"] for entry in entries)
    high = max(max(entry["last"] for entry in entries), low + 1)
    height = TOP + STEPS_H + 8
    parts = _frame(analysis, height)
    parts += [f'<text x="4" y="{TOP + 10}">step {high}</text>', f'<text x="4" y="{TOP + STEPS_H}">step {low}</text>']

    def y(step: int) -> float:
        return round(TOP + STEPS_H - (step - low) / (high - low) * STEPS_H, 1)

    for number, entry in enumerate(entries):
        colour = STEP_COLOURS[number % len(STEP_COLOURS)]
        pairs = progress.samples(entry)
        points = " ".join(f"{_x(analysis, at)},{y(step)}" for at, step in pairs)
        attempt = entry["attempt"]
        until = analysis.attempts[attempt]["ended_at"] if attempt < len(analysis.attempts) else None
        last_x, last_y = _x(analysis, pairs[-1][0]), y(pairs[-1][1])
        text = (f"attempt {attempt}: step {entry['first']} at {entry['first_at'] - analysis.start:.1f}s to step "
                f"{entry['last']} at {entry['last_at'] - analysis.start:.1f}s")
        parts.append(f'<polyline class="steps" points="{points}" fill="none" stroke="{colour}" stroke-width="2">'
                     f'{_title(text)}</polyline><circle cx="{last_x}" cy="{last_y}" r="3" fill="{colour}"/>'
                     f'<line x1="{last_x}" y1="{last_y}" x2="{_x(analysis, until or analysis.end)}" y2="{last_y}" '
                     f'stroke="{colour}" stroke-dasharray="2,3"/>')
    return (f'<svg id="steps" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}">{"".join(parts)}</svg>')


def _rates(analysis: Analysis, rows: list[Row]) -> str:
    """Each row's lines per second as shades of one colour (a band's: the mean of its workers), red where none came."""
    per_row = [_band_rates(analysis, row.workers) for row in rows]
    peak = max((rate for rates in per_row for _, _, rate in rates), default=0.0) or 1.0
    height = TOP + ROW_H * len(rows) + 4
    parts = _frame(analysis, height)
    for number, (row, rates) in enumerate(zip(rows, per_row)):
        y = TOP + number * ROW_H
        parts.append(f'<text x="4" y="{y + 13}">{html.escape(row.label)}</text>')
        for start, end, rate in _merged(rates, peak):
            x0, x1 = _x(analysis, start), _x(analysis, end)
            fill = "#e6550d" if rate == 0 else "#08519c"
            opacity = 0.5 if rate == 0 else round(0.15 + 0.85 * rate / peak, 2)
            when = f"{start - analysis.start:.1f}s to {end - analysis.start:.1f}s"
            parts.append(f'<rect class="rate" x="{x0}" y="{y + 2}" width="{max(x1 - x0, 0.5)}" height="{ROW_H - 4}" '
                         f'fill="{fill}" opacity="{opacity}">{_title(f"{row.label}: {rate:.1f} lines/s, {when}")}</rect>')
    return (f'<svg id="rates" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}">{"".join(parts)}</svg>')


def _band_rates(analysis: Analysis, workers: list[int]) -> list[tuple[float, float, float]]:
    """The first worker's slots, each with the band's mean rate over the same slot."""
    each = [analysis.line_rates(worker) for worker in workers]
    first = each[0]
    return [(start, end, statistics.fmean(rates[slot][2] if slot < len(rates) else 0.0 for rates in each))
            for slot, (start, end, _) in enumerate(first)]


def _merged(rates: list[tuple[float, float, float]], peak: float) -> list[tuple[float, float, float]]:
    """Neighbouring slots drawn in the same shade, as one (mean rate): a long run stays a few rectangles."""
    merged: list[tuple[float, float, float]] = []
    level = None
    for start, end, rate in rates:
        this = -1 if rate == 0 else round(rate / peak * RATE_LEVELS)
        if merged and this == level and abs(merged[-1][1] - start) < 1e-6:
            previous = merged[-1]
            seconds = (previous[1] - previous[0]) + (end - start)
            mean = (previous[2] * (previous[1] - previous[0]) + rate * (end - start)) / seconds if seconds else rate
            merged[-1] = (previous[0], end, mean)
        else:
            merged.append((start, end, rate))
        level = this
    return merged
