#!/usr/bin/env python3
"""The run directory's checkout (remote/checkout.py) on a 5,000-file tree, and what it adds to an agent step.

    python scripts/bench_checkout.py [--files 5000] [--runs 30] [--python /usr/bin/python3]

Times, on a tree of --files small files: the first checkout into an empty run/, a new version (one
file edited; shipped as a whole new tree, so every file is linked again), and the same version again
(the fast path every step of an unchanged job takes). Then the CPU of one agent step of `true`, as
the launcher runs it, with the checkout (code_dir in its step) and without, interleaved, against
`python3 -I -S -c pass`.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_agent import agent_step, print_cpu_medians  # noqa: E402

from benchlib import print_table  # noqa: E402


def make_version(name_dir: Path, version: str, files: int, edited: str) -> Path:
    root = name_dir / version
    for index in range(files):
        path = root / f"pkg{index % 50}" / f"module{index}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(edited if index == 0 else f"VALUE = {index}\n")
    return root


def timed_checkout(version: Path, run_dir: Path) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"from podrun.remote.checkout import check_out; "
                    f"check_out({str(version)!r}, {str(run_dir)!r}, 'bench')"], check=True,
                   cwd=Path(__file__).resolve().parents[1])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--python", default="/usr/bin/python3", help="the workers' interpreter")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp())
    try:
        name_dir = root / "podrun" / "bench"
        first, second = (make_version(name_dir, version, args.files, f"EDIT = {version!r}\n")
                         for version in ("aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"))
        run_dir = name_dir / "run"
        checkouts = {"first checkout, empty run/": timed_checkout(first, run_dir),
                     "a new version (every file linked again)": timed_checkout(second, run_dir),
                     "the same version again (fast path)": timed_checkout(second, run_dir)}
        print_table(f"checkout of {args.files:,} files (a process each: python start-up included)",
                    ["checkout", "seconds"], {name: [f"{seconds:.3f}"] for name, seconds in checkouts.items()})
        # checked out already: the agent steps take the fast path
        with_checkout = {"cwd": "podrun/bench/run", "code_dir": str(second.relative_to(root))}
        print_cpu_medians({
            "agent step, with the checkout (fast path)": lambda: agent_step(args.python, root, **with_checkout),
            "agent step, no checkout": lambda: agent_step(args.python, root),
        }, args.runs, args.python)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
