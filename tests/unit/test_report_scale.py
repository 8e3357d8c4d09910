"""`podrun report` stays linear in workers x attempts: the per-worker questions (its phases, its output,
its band) read that worker's own spans, never every span of the job once per worker."""

from __future__ import annotations

from types import SimpleNamespace

from podrun import jobstore, timeline
from podrun.report.analysis import Analysis
from podrun.report.goodput import Goodput
from podrun.report.page import content
from podrun.report.summary import summary


class CountedSpans(list):
    """The analysis's spans, counting the passes over all of them."""

    passes = 0

    def __iter__(self):
        CountedSpans.passes += 1
        return super().__iter__()


def attempts_record(workers: int, attempts: int = 3) -> jobstore.JobRecord:
    record = jobstore.JobRecord(id=f"scale-20260101-000000-{workers:04x}", name="scale", target=f"local:{workers}",
                                spec_path="scale.yaml", started_at=1000.0, launcher={},
                                workers=[jobstore.WorkerRecord(index, f"local/w{index}") for index in range(workers)])
    record.create()
    start = record.started_at
    for attempt in range(attempts):
        indexes = list(range(workers))
        for number, phase in enumerate(("connect", "setup", "run")):
            entry = timeline.begin(record, phase, indexes, at=start + number * 10)
            for index in indexes:  # spread, so that the page groups the workers into bands
                timeline.end(entry, index, at=start + number * 10 + 1 + index % 7)
        for index in indexes:
            counter: dict = {"start": start + 20, "every_s": 1, "counts": []}
            timeline.count_lines(counter, index % 3, start + 21)
            timeline.keep_lines(entry, index, counter)
        start += 100
        record.ended_at = start
        if attempt < attempts - 1:
            record.restart()
    record.state, record.exit_code = jobstore.SUCCEEDED, 0
    return record


def passes_over_spans(workers: int) -> int:
    analysis = Analysis(attempts_record(workers), now=2000.0)
    analysis.spans = CountedSpans(analysis.spans)
    CountedSpans.passes = 0
    split = Goodput(analysis)
    summary(analysis, split)
    content(analysis, split)
    return CountedSpans.passes


def test_the_passes_over_every_span_do_not_grow_with_the_workers(home):
    few, many = passes_over_spans(100), passes_over_spans(400)
    assert many == few < 100  # a pass per worker (quadratic in all) would make it 400 at least


class CountedParts(dict):
    """A phase's workers' parts, counting the passes over all of them."""

    passes = 0

    def values(self):
        CountedParts.passes += 1
        return super().values()

    def __iter__(self):
        CountedParts.passes += 1
        return super().__iter__()


def passes_to_end_each_worker(workers: int) -> int:
    entry = timeline.begin(SimpleNamespace(attempt=0, phases=[]), "run", list(range(workers)), at=1000.0)
    entry["workers"] = CountedParts(entry["workers"])
    CountedParts.passes = 0
    for index in range(workers):
        timeline.end(entry, index, at=1001.0 + index)
        timeline.end(entry, index, at=5000.0)  # a part ends once
    assert entry["end"] == 1000.0 + workers and "open" not in entry
    return CountedParts.passes


def test_ending_each_workers_part_of_a_phase_stays_linear_in_the_workers():
    few, many = passes_to_end_each_worker(100), passes_to_end_each_worker(400)
    assert many == few == 1  # the phase's end, once every part ended; a pass per worker's end was quadratic
