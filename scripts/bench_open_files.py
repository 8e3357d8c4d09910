#!/usr/bin/env python3
"""The launcher's open files at the peak of `podrun exec`, against what podrun counts for the job
(podrun/file_limit.py), on local workers and on lab hosts.

    python scripts/bench_open_files.py [--local 10 50 200] [--hosts 4 16 48]

The peak is the largest count of /proc/PID/fd of the podrun process, read every 2 ms while it runs:
the files of a launch are held through its step, so the reads see the peak. Each count runs
`true` twice: without code to ship, and shipping a one-file workdir (the heaviest moment: every
worker's agent waits while the relay's receiver runs beside it). --hosts needs root (tests/lab.py).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import Lab, print_table, require_lab_tools

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from podrun import file_limit  # noqa: E402
from podrun.launch.lifecycle import STEP_PROCESSES  # noqa: E402

POLL_S = 0.002  # a loop without a pause would take a core from what it measures


def peak_open_files(argv: list[str], env: dict) -> tuple[int, float]:
    """The most files the podrun process held at once, and its wall seconds; it must succeed."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as errors:  # a pipe left unread would stop podrun once full
        process = subprocess.Popen([sys.executable, "-m", "podrun", *argv], env=env, stdout=subprocess.DEVNULL,
                                   stderr=errors)
        peak = 0
        while process.poll() is None:
            try:
                peak = max(peak, len(os.listdir(f"/proc/{process.pid}/fd")))
            except OSError:  # it has just ended
                break
            time.sleep(POLL_S)
        if process.wait() != 0:
            errors.seek(0)
            raise SystemExit(f"podrun {' '.join(argv)} failed: {errors.read().decode()[-2000:]}")
    return peak, time.perf_counter() - started


def add_row(rows: dict[str, list[str]], first: dict, kind: str, workers: int, ships: bool, peak: int,
            wall_s: float) -> None:
    """A row; "per further worker": the growth in peak since the smallest count of the same kind."""
    counted = file_limit.needed([kind] * workers, processes=STEP_PROCESSES, files=1)
    smallest, smallest_peak = first.setdefault((kind, ships), (workers, peak))
    growth = f"{(peak - smallest_peak) / (workers - smallest):.2f}" if workers > smallest else "-"
    label = f"{workers} {kind}" + (", code ships" if ships else "")
    rows[label] = [str(peak), growth, str(counted), f"{wall_s:.1f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local", type=int, nargs="*", default=[10, 50, 200])
    parser.add_argument("--hosts", type=int, nargs="*", default=[])
    args = parser.parse_args()
    rows: dict[str, list[str]] = {}
    first: dict = {}
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        code = work / "code"
        code.mkdir()
        (code / "train.py").write_text("print('hello')\n")
        for workers in args.local:
            for ships in (False, True):
                env = {**os.environ, "PODRUN_HOME": str(work / f"home-local-{workers}-{ships}")}
                argv = ["exec", "--local", str(workers), *(["--workdir", str(code)] if ships else []), "--", "true"]
                add_row(rows, first, "local", workers, ships, *peak_open_files(argv, env))
        if args.hosts:
            if problem := require_lab_tools():
                raise SystemExit(f"--hosts: {problem}")
            with Lab(max(args.hosts), work / "lab") as lab:
                for workers in args.hosts:
                    for ships in (False, True):
                        hosts = ",".join(host.ip for host in lab.hosts[:workers])
                        env = {**os.environ, "PODRUN_HOME": str(work / f"home-ssh-{workers}-{ships}")}
                        argv = ["exec", "--hosts", hosts, "--user", "root", "--identity-file", str(lab.client_key),
                                *(["--workdir", str(code)] if ships else []), "--", "true"]
                        add_row(rows, first, "ssh", workers, ships, *peak_open_files(argv, env))
    print_table("podrun exec of `true`: the launcher's open files at the peak, and what podrun counts",
                ["workers", "peak open files", "per further worker", "podrun counts", "wall s"], rows)


if __name__ == "__main__":
    main()
