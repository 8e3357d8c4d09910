#!/usr/bin/env python3
"""CPU time of one step of podrun's worker-side agent, against a bare Python start in the same run.

    python scripts/bench_agent.py [--runs 40] [--python /usr/bin/python3]

The agent runs once per worker per step, so on a pod its start-up is paid on every host. Here it is
run as the launcher runs it (transport.agent_command, its source and step on stdin, stdin kept open
until it exits) for a step of `true`, with its compiled code cached on the "worker" and with that
cache removed before every run, and compared, interleaved, with `python3 -I -S -c pass` (the floor
for any Python supervisor) and `sh -c true` (what a raw `ssh host true` runs). CPU is user + system
time of the process tree (RUSAGE_CHILDREN), per run. A job's first step on several hosts also probes
its host name and route for the interface doctor: measured as a step of its own.
"""

from __future__ import annotations

import argparse
import marshal
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from podrun.transport.base import agent_command, agent_source  # noqa: E402

from benchlib import print_table  # noqa: E402


def cpu_ms(run) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000


def agent_step(python: str, root: Path, **fields) -> None:
    """One agent step of `true` in `root`, as the launcher runs it; `fields` add to the step or replace
    its own (bench_checkout.py: cwd and code_dir). A step with a probe is told to go at once."""
    step = marshal.dumps({"job_id": "bench", "job_dir": ".podrun/jobs/bench", "worker": 0, "step": "run",
                          "cwd": str(root), "command": "true",
                          "env": {"PODRUN_JOB_ID": "bench", "PODRUN_WORKER": "0"}, "grace": 5, "heartbeat": 20,
                          "detach": False, **fields}, 4)
    agent = subprocess.Popen(["/bin/sh", "-c", agent_command(python)], cwd=root, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    agent.stdin.write(agent_source() + b"%d\n" % len(step) + step + (b"go\n" if "probe" in fields else b""))
    agent.stdin.flush()
    agent.stdout.read()
    errors = agent.stderr.read()  # end of input would stop the step, so stdin stays open until here
    agent.stdin.close()
    if agent.wait() != 0:
        raise SystemExit(f"the agent failed: {errors.decode(errors='replace')}")


def print_cpu_medians(contenders: dict, runs: int, python: str) -> None:
    """Run the contenders interleaved, `runs` times each, with `python3 -I -S -c pass` (the floor for
    any Python supervisor) among them; print each one's median CPU and its ratio to that floor."""
    floor_name = "python3 -I -S -c pass"
    contenders = {**contenders, floor_name: lambda: subprocess.run([python, "-I", "-S", "-c", "pass"], check=True)}
    for run in contenders.values():
        run()  # fills the agent's compiled-code cache on the "worker"
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(runs):
        for name, run in contenders.items():
            samples[name].append(cpu_ms(run))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    print_table(f"CPU per agent step of `true`, median of {runs} interleaved runs ({python})",
                ["process", "CPU ms", f"ratio to {floor_name}"],
                {name: [f"{ms:.1f}", f"{ms / medians[floor_name]:.2f}x"] for name, ms in medians.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--python", default="/usr/bin/python3", help="the workers' interpreter")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        cache = Path(root) / ".podrun" / "cache"

        def uncached() -> None:
            shutil.rmtree(cache, ignore_errors=True)
            agent_step(args.python, Path(root))

        print_cpu_medians({
            "agent, compiled code cached": lambda: agent_step(args.python, Path(root)),
            "agent, compiled on every run": uncached,
            # a job's first step on several hosts: the interface doctor's lookups (remote/interfaces.py);
            # the route is looked up, never used (TEST-NET-1)
            "agent, first step with the interface probe": lambda: agent_step(
                args.python, Path(root), probe={"code_dir": "absent", "route_to": "192.0.2.1"}),
            "sh -c true": lambda: subprocess.run(["/bin/sh", "-c", "true"], check=True),
        }, args.runs, args.python)


if __name__ == "__main__":
    main()
