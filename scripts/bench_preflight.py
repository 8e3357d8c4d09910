#!/usr/bin/env python3
"""What `preflight` costs: a trivial job's `podrun exec` with each set of checks, against the same exec
without any, in the same run, rounds interleaved, on N local workers.

    python scripts/bench_preflight.py [--local 16,256] [--rounds 3] [--network-up-to 16]

The job's python3 is this interpreter (its torch for the network check). `versions,disk` reads every
worker's facts in its python3; `all` adds the network check's all-reduce and link rounds (16 MiB), which
imports torch in every worker: measured only up to --network-up-to workers (256 torch processes would
need ~60 GB on one machine; on a pod each host imports its own, in parallel).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchlib import print_table, timed

CHECKS = {"none": None, "versions,disk": "[versions, disk]", "all": "true"}


def spec(folder: Path, workers: int, checks: str | None) -> Path:
    path = folder / f"job-{workers}-{len(checks or '')}.yaml"
    preflight = f"preflight: {checks}\n" if checks else ""
    path.write_text(f"target: {{local: {{workers: {workers}}}}}\nrun: 'true'\n{preflight}"
                    f"env: {{PATH: '{Path(sys.executable).parent}:/usr/bin:/bin'}}\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local", default="16,256")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--network-up-to", type=int, default=16)
    args = parser.parse_args()
    rows: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "PODRUN_HOME": os.path.join(folder, "home")}
        for workers in map(int, args.local.split(",")):
            kinds = [kind for kind in CHECKS if kind != "all" or workers <= args.network_up_to]
            jobs = Path(folder, "jobs")  # the workdir: the specs alone, PODRUN_HOME beside it
            jobs.mkdir(exist_ok=True)
            specs = {kind: spec(jobs, workers, CHECKS[kind]) for kind in kinds}
            timed([sys.executable, "-m", "podrun", "exec", str(specs["none"])], env)  # ships the code once
            times: dict[str, list[float]] = {kind: [] for kind in kinds}
            for _ in range(args.rounds):
                for kind in kinds:
                    times[kind].append(timed([sys.executable, "-m", "podrun", "exec", str(specs[kind])], env))
            base = statistics.median(times["none"])
            for kind in kinds:
                median = statistics.median(times[kind])
                rows[f"{workers} local, {kind}"] = [f"{median:.2f}", f"{median - base:+.2f}", f"{median / base:.2f}"]
    print_table(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, median of {args.rounds}",
                ["workers, preflight", "exec s", "preflight's cost s", "ratio to none"], rows)


if __name__ == "__main__":
    main()
