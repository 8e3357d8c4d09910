#!/usr/bin/env python3
"""What recording a job's phases (podrun/timeline.py) costs: one save of job.json with and without them,
and the count of a chunk's lines; with --report, what `podrun report` takes (its summary, page and JSON)
on a record of N workers x 3 attempts, its time per worker showing whether it stays linear.

    python scripts/bench_record.py [--workers 64 1024] [--saves 30]
    python scripts/bench_record.py --report --workers 1024 4096 [--against REF]

--against: the same report timed on the tree at REF too (git archive into a temporary folder), in the
same run, rows interleaved.

Each record holds N workers with SSH endpoints; "with phases" adds what a full attempt records: connect,
ship, setup and run for every worker, and every worker's run line counts at their full MAX_SLOTS.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("BENCH_RECORD_TREE", str(ROOT)))
os.environ["PODRUN_HOME"] = tempfile.mkdtemp(prefix="bench-record-")

from podrun import jobstore, timeline  # noqa: E402


def record(workers: int, phases: bool) -> jobstore.JobRecord:
    kept = jobstore.JobRecord(
        id=f"bench-{workers}-{phases}", name="bench", target=f"hosts:{workers}", spec_path="/bench.yaml",
        workers=[jobstore.WorkerRecord(index, f"10.0.{index // 256}.{index % 256}",
                                       endpoint={"kind": "ssh", "host": f"10.0.{index // 256}.{index % 256}",
                                                 "port": 22, "user": "root", "identity_file": "/root/.ssh/id"})
                 for index in range(workers)])
    kept.create()
    if phases:
        indexes = list(range(workers))
        for phase in ("connect", "ship", "setup", "run"):
            entry = timeline.begin(kept, phase, indexes)
            for index in indexes:
                timeline.end(entry, index)
        for index in indexes:
            counter = timeline.line_counter()
            for slot in range(timeline.MAX_SLOTS):
                timeline.count_lines(counter, 37, counter["start"] + slot)
            timeline.keep_lines(entry, index, counter)
    return kept


def attempts_record(workers: int, attempts: int = 3) -> jobstore.JobRecord:
    """N workers through `attempts` attempts, each with every worker's phases and line counts; the
    workers' times spread so that the report groups them into bands."""
    kept = record(workers, phases=False)
    start = kept.started_at
    for attempt in range(attempts):
        indexes = list(range(workers))
        for number, phase in enumerate(("connect", "ship", "setup", "run")):
            entry = timeline.begin(kept, phase, indexes, at=start + number * 10)
            for index in indexes:
                timeline.end(entry, index, at=start + number * 10 + 1 + (index * 7919 % 97) / 10)
        for index in indexes:
            counter: dict = {"start": start + 30, "every_s": 1, "counts": []}
            for slot in range(timeline.MAX_SLOTS):
                timeline.count_lines(counter, (index + slot) % 5, counter["start"] + slot)
            timeline.keep_lines(entry, index, counter)
        start += 200
        kept.ended_at = start
        if attempt < attempts - 1:
            kept.restart()
    kept.state, kept.exit_code, kept.ended_at = jobstore.SUCCEEDED, 0, start
    return kept


def report_seconds(kept: jobstore.JobRecord) -> float:
    """What `podrun report` computes for the record: its summary, its page and its JSON object."""
    from podrun.commands.report import report_object
    from podrun.report.analysis import Analysis
    from podrun.report.goodput import Goodput
    from podrun.report.page import page
    from podrun.report.summary import summary

    started = time.perf_counter()
    analysis = Analysis(kept, now=kept.ended_at)
    split = Goodput(analysis)
    summary(analysis, split)
    page(analysis, split)
    report_object(analysis, split)
    return time.perf_counter() - started


def report_rows(workers: list[int], rounds: int, tree: str) -> None:
    for count in workers:
        kept = attempts_record(count)
        took = statistics.median(report_seconds(kept) for _ in range(rounds))
        print(f"| {tree} | {count} x 3 | {took:.2f} s | {took / count * 1000:.2f} ms |", flush=True)
        shutil.rmtree(kept.dir)


def main_report(workers: list[int], rounds: int, against: str | None) -> None:
    print("| tree | workers x attempts | `podrun report` (median) | per worker |\n| --- | ---: | ---: | ---: |")
    for count in workers:
        report_rows([count], rounds, "this")
        if against:
            with tempfile.TemporaryDirectory(prefix="bench-record-tree-") as tree:
                archive = subprocess.run(["git", "-C", str(ROOT), "archive", against], check=True,
                                         capture_output=True).stdout
                subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
                subprocess.run([sys.executable, __file__, "--report-rows", str(count), "--rounds", str(rounds),
                                "--tree-name", against], env={**os.environ, "BENCH_RECORD_TREE": tree}, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--saves", type=int, default=30)
    parser.add_argument("--report", action="store_true", help="time `podrun report` instead of a save")
    parser.add_argument("--rounds", type=int, default=3, help="--report: rounds per size (median)")
    parser.add_argument("--against", help="--report: the same on the tree at this git ref, in the same run")
    parser.add_argument("--report-rows", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tree-name", default="this", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.report_rows:
        report_rows([args.report_rows], args.rounds, args.tree_name)
        shutil.rmtree(os.environ["PODRUN_HOME"])
        return
    if args.report:
        main_report(args.workers, args.rounds, args.against)
        shutil.rmtree(os.environ["PODRUN_HOME"])
        return
    print("| workers | phases | job.json | one save (median) |\n| ---: | --- | ---: | ---: |")
    for workers in args.workers:
        for phases in (False, True):
            kept = record(workers, phases)
            took = []
            for _ in range(args.saves):
                started = time.perf_counter()
                kept.save()
                took.append(time.perf_counter() - started)
            size = os.path.getsize(os.path.join(kept.dir, jobstore.RECORD_FILE))
            print(f"| {workers} | {'with' if phases else 'without'} | {size / 1024:.0f} KB | "
                  f"{statistics.median(took) * 1000:.2f} ms |")
            shutil.rmtree(kept.dir)
    counter = timeline.line_counter()
    chunks = 100_000
    started = time.perf_counter()
    for _ in range(chunks):
        timeline.count_lines(counter, b"a line\nanother\n".count(b"\n"), time.time())
    print(f"\ncounting a chunk's lines: {(time.perf_counter() - started) / chunks * 1e6:.2f} us")
    shutil.rmtree(os.environ["PODRUN_HOME"])


if __name__ == "__main__":
    main()
