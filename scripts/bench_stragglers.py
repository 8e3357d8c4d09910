#!/usr/bin/env python3
"""What `stragglers` sampling costs the job: an even 3-worker gloo job (every worker computes 0.1 s a step,
then all-reduces; no straggler, so the sampling goes on to the end) with `stragglers: 1s` against the same
job without it, rounds interleaved, in one run; and one py-spy dump of a busy Python process, timed alone.

    python scripts/bench_stragglers.py [--steps 60] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import print_table, timed

EVEN = """\
import datetime, os, time, torch, torch.distributed as dist
rank = int(os.environ["PODRUN_WORKER"])
dist.init_process_group("gloo", rank=rank, world_size=3, timeout=datetime.timedelta(seconds=60))
for step in range(int(os.environ["STEPS"])):
    end = time.perf_counter() + 0.1
    while time.perf_counter() < end:
        pass
    dist.all_reduce(torch.ones(4))
dist.destroy_process_group()
"""


def spec(folder: Path, steps: int, sampled: bool) -> Path:
    path = folder / f"even-{'sampled' if sampled else 'plain'}.yaml"
    path.write_text("target: {local: {workers: 3}}\nrun: python3 even.py\n" + "stragglers: 1s\n" * sampled +
                    f"env: {{PATH: '{Path(sys.executable).parent}:/usr/bin:/bin', STEPS: '{steps}'}}\n")
    return path


def one_dump_s() -> float:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        py_spy = str(Path(sys.executable).parent / "py-spy")
        return statistics.median(timed([py_spy, "dump", "--pid", str(busy.pid)]) for _ in range(5))
    finally:
        busy.kill()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        jobs = Path(folder, "jobs")
        jobs.mkdir()
        (jobs / "even.py").write_text(EVEN)
        env = {**os.environ, "PODRUN_HOME": os.path.join(folder, "home")}
        specs = {sampled: spec(jobs, args.steps, sampled) for sampled in (False, True)}
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds):
            for sampled, path in specs.items():
                times[sampled].append(timed([sys.executable, "-m", "podrun", "exec", str(path)], env))
    plain, sampled = statistics.median(times[False]), statistics.median(times[True])
    print_table(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, {args.steps} steps, median of {args.rounds}",
                ["job", "exec s", "ratio"], {"no sampling": [f"{plain:.2f}", "1.00"],
                                             "stragglers: 1s": [f"{sampled:.2f}", f"{sampled / plain:.3f}"]})
    print(f"one py-spy dump of a busy process: {one_dump_s() * 1000:.0f} ms (median of 5)")


if __name__ == "__main__":
    main()
