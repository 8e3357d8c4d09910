#!/usr/bin/env python3
"""Start-up of the everyday commands against `python -c pass`, measured in the same run.

    python scripts/bench_startup.py [--runs 30]

Runs the installed `podrun` console script (the one beside this interpreter) against a throwaway
PODRUN_HOME holding one finished job, and prints a table of medians and ratios. The commands take
turns in every round, so drift in the machine's load hits them alike. Measure a regular install
(`pip install .`): an editable install's import hook slows every Python start, `pass` included.
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

from benchlib import print_table


def medians(commands: dict[str, list[str]], runs: int, env: dict[str, str]) -> dict[str, float]:
    samples: dict[str, list[float]] = {label: [] for label in commands}
    for _ in range(runs):
        for label, command in commands.items():
            started = time.perf_counter()
            subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
            samples[label].append(time.perf_counter() - started)
    return {label: statistics.median(values) for label, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    runs = parser.parse_args().runs
    podrun = Path(sys.executable).with_name("podrun")
    if not podrun.exists():
        sys.exit(f"no podrun console script beside {sys.executable}: pip install -e . first")
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "PODRUN_HOME": home}
        spec = Path(home) / "hello.yaml"
        spec.write_text(f"run: seq 1 200\nworkdir: {home}\n")
        subprocess.run([podrun, "exec", spec], env=env, check=True, capture_output=True)
        # json alone: the job records need it, and with it `re` and `enum`, the floor for `jobs` and `logs`
        commands = {"python -c pass": [sys.executable, "-c", "pass"],
                    "python -c 'import json'": [sys.executable, "-c", "import json"]}
        for args in (["--help"], ["jobs"], ["logs"]):
            commands[f"podrun {' '.join(args)}"] = [str(podrun), *args]
        results = medians(commands, runs, env)
    baseline = results["python -c pass"]
    print_table(f"start-up, median of {runs} interleaved runs each", ["command", "median", "ratio to python -c pass"],
                {f"`{label}`": [f"{seconds * 1000:.1f} ms", f"{seconds / baseline:.2f}x"]
                 for label, seconds in results.items()})


if __name__ == "__main__":
    main()
