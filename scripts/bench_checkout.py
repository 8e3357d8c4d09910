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
import marshal
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_agent import cpu_ms  # noqa: E402

from podrun.transport.base import agent_command, agent_source  # noqa: E402

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


def agent_step(python: str, root: Path, code_dir: str | None) -> None:
    """One step of `true`, as bench_agent.py runs it; with code_dir, the agent checks it out first."""
    step = {"job_id": "bench", "worker": 0, "step": "run", "cwd": "podrun/bench/run" if code_dir else ".",
            "command": "true", "env": {"PODRUN_JOB_ID": "bench", "PODRUN_WORKER": "0"}, "grace": 5,
            "heartbeat": 20, "detach": False, **({"code_dir": code_dir} if code_dir else {})}
    blob = marshal.dumps(step, 4)
    agent = subprocess.Popen(["/bin/sh", "-c", agent_command(python)], cwd=root, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    agent.stdin.write(agent_source() + b"%d\n" % len(blob) + blob)
    agent.stdin.flush()
    agent.stdout.read()
    errors = agent.stderr.read()  # end of input would stop the step, so stdin stays open until here
    agent.stdin.close()
    if agent.wait() != 0:
        raise SystemExit(f"the agent failed: {errors.decode(errors='replace')}")


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
        code_dir = str(second.relative_to(root))  # checked out: the agent steps take the fast path
        contenders = {
            "agent step, with the checkout (fast path)": lambda: agent_step(args.python, root, code_dir),
            "agent step, no checkout": lambda: agent_step(args.python, root, None),
            "python3 -I -S -c pass": lambda: subprocess.run([args.python, "-I", "-S", "-c", "pass"], check=True),
        }
        for run in contenders.values():
            run()  # fills the compiled-code cache
        samples: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(args.runs):
            for name, run in contenders.items():
                samples[name].append(cpu_ms(run))
        medians = {name: statistics.median(values) for name, values in samples.items()}
        floor = medians["python3 -I -S -c pass"]
        print_table(f"CPU per agent step of `true`, median of {args.runs} interleaved runs ({args.python})",
                    ["process", "CPU ms", "ratio to python3 -I -S -c pass"],
                    {name: [f"{ms:.1f}", f"{ms / floor:.2f}x"] for name, ms in medians.items()})
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
