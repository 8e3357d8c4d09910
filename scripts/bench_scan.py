#!/usr/bin/env python3
"""What `podrun exec` spends naming the workdir (sync.scan: the ignore rules, then every file's
sha256), against reading the same tree raw, in the same run.

    python scripts/bench_scan.py [--rounds 9]

The workdir is bench_ship's (999 source files and a 30 MB binary, 46 MB). Interleaved, median of
the rounds, seconds:
  - scan, no digest cache (every file read and hashed: what each exec paid before podrun/shipping/digests.py)
  - scan, unchanged workdir (digests reused by their stat signature)
  - scan, one file rewritten (only it is read again)
  - `tar -cf - . | sha256sum`: the raw cost of reading and hashing the tree once
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
from bench_ship import make_workdir  # noqa: E402

from podrun.shipping import digests  # noqa: E402
from podrun.shipping.scan import scan  # noqa: E402

from benchlib import print_table, timed  # noqa: E402

RAW = "`tar -cf - . \\| sha256sum` (the raw read)"


def seconds(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        code = Path(root) / "code"
        code.mkdir()
        make_workdir(code)
        os.environ["PODRUN_HOME"] = str(Path(root) / "podrun-home")
        cache = Path(root) / "podrun-home" / "cache"
        time.sleep(digests.RACY_S)  # files changed within this window are hashed again on purpose
        changed = code / "changed.txt"
        samples: dict[str, list[float]] = {}

        def rewrite_one_file() -> None:
            changed.write_text(str(time.time_ns()))
            scan(code)

        contenders = {
            "scan, no digest cache": lambda: (shutil.rmtree(cache, ignore_errors=True), scan(code)),
            "scan, unchanged workdir": lambda: scan(code),
            "scan, one file rewritten": rewrite_one_file,
        }
        for _ in range(args.rounds):
            scan(code)  # the cache as an unchanged re-run finds it
            for name, work in contenders.items():
                samples.setdefault(name, []).append(seconds(work))
            samples.setdefault(RAW, []).append(timed(f"tar -C {code} -cf - . | sha256sum"))
        raw = statistics.median(samples[RAW])
        print_table(f"naming a 46 MB workdir of 1,000 files, median of {args.rounds} interleaved rounds",
                    ["contender", "seconds", "ratio to the raw read"],
                    {name: [f"{statistics.median(values):.3f}", f"{statistics.median(values) / raw:.2f}x"]
                     for name, values in samples.items()})


if __name__ == "__main__":
    main()
