#!/usr/bin/env python3
"""What recording a job's phases (podrun/timeline.py) costs: one save of job.json with and without them,
and the count of a chunk's lines.

    python scripts/bench_record.py [--workers 64 1024] [--saves 30]

Each record holds N workers with SSH endpoints; "with phases" adds what a full attempt records: connect,
ship, setup and run for every worker, and every worker's run line counts at their full MAX_SLOTS.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--saves", type=int, default=30)
    args = parser.parse_args()
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
