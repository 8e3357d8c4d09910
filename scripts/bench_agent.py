#!/usr/bin/env python3
"""CPU time of one step of podrun's worker-side agent, against a bare Python start in the same run.

    python scripts/bench_agent.py [--runs 40] [--python /usr/bin/python3] [--against REV]

The agent runs once per worker per step, so on a pod its start-up is paid on every host. Here it is
run as the launcher runs it for a step of `true` (its step on stdin, stdin kept open until it exits):
from the "worker"'s cache (transport/base.py's BOOTSTRAP, the step alone sent), and with its source
ahead of the step and that cache removed before every run (what a worker without it runs), compared,
interleaved, with `python3 -I -S -c pass` (the floor for any Python supervisor) and `sh -c true`
(what a raw `ssh host true` runs). --against REV: also the agent as podrun at git revision REV starts
it (its command and source, from that tree), its compiled code cached. CPU is user + system
time of the process tree (RUSAGE_CHILDREN), per run. A job's first step on several hosts also probes
its host name and route for the interface doctor: measured as a step of its own.
"""

from __future__ import annotations

import argparse
import marshal
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from podrun.transport.base import agent_command, agent_source, script_command  # noqa: E402

from benchlib import podrun_at, print_table  # noqa: E402


def cpu_ms(run) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000


def agent_step(python: str, root: Path, started: tuple[str, bytes] | None = None, **fields) -> None:
    """One agent step of `true` in `root`, as the launcher runs it from the worker's cache, or `started`:
    (command, source sent ahead of the step); `fields` add to the step or replace its own
    (bench_checkout.py: cwd and code_dir). A step with a probe is told to go at once."""
    step = marshal.dumps({"job_id": "bench", "job_dir": ".podrun/jobs/bench", "worker": 0, "step": "run",
                          "cwd": str(root), "command": "true",
                          "env": {"PODRUN_JOB_ID": "bench", "PODRUN_WORKER": "0"}, "grace": 5, "heartbeat": 20,
                          "detach": False, **fields}, 4)
    command, source = started or (script_command(python, "agent", cached=True), b"")
    agent = subprocess.Popen(["/bin/sh", "-c", command], cwd=root, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    agent.stdin.write(source + b"%d\n" % len(step) + step + (b"go\n" if "probe" in fields else b""))
    agent.stdin.flush()
    agent.stdout.read()
    errors = agent.stderr.read()  # end of input would stop the step, so stdin stays open until here
    agent.stdin.close()
    if agent.wait() != 0 or b"podrun-script uncached" in errors:
        raise SystemExit(f"the agent failed: {errors.decode(errors='replace')}")


def print_cpu_medians(contenders: dict, runs: int, python: str) -> None:
    """Run the contenders interleaved, `runs` times each, with `python3 -I -S -c pass` (the floor for
    any Python supervisor) among them; print each one's median CPU and its ratio to that floor."""
    floor_name = "python3 -I -S -c pass"
    contenders = {**contenders, floor_name: lambda: subprocess.run([python, "-I", "-S", "-c", "pass"], check=True)}
    for run in contenders.values():
        run()
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
    parser.add_argument("--against", metavar="REV", help="also the agent of podrun at this git revision")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root, tempfile.TemporaryDirectory() as other_root:
        cache = Path(root) / ".podrun" / "cache"
        with_source = (agent_command(args.python), agent_source())

        def uncached() -> None:
            shutil.rmtree(cache, ignore_errors=True)
            agent_step(args.python, Path(root), with_source)

        agent_step(args.python, Path(root), with_source)  # the worker's cache, filled
        against = {}
        if args.against:
            old = started_at(args.against, Path(other_root) / "tree", args.python)
            against[f"agent at {args.against}, compiled code cached"] = lambda: agent_step(args.python,
                                                                                           Path(other_root), old)
        print_cpu_medians({
            "agent, compiled code cached": lambda: agent_step(args.python, Path(root)),
            **against,
            "agent, compiled on every run": uncached,
            # a job's first step on several hosts: the interface doctor's lookups (remote/interfaces.py);
            # the route is looked up, never used (TEST-NET-1)
            "agent, first step with the interface probe": lambda: agent_step(
                args.python, Path(root), probe={"code_dir": "absent", "route_to": "192.0.2.1"}),
            "sh -c true": lambda: subprocess.run(["/bin/sh", "-c", "true"], check=True),
        }, args.runs, args.python)


def started_at(revision: str, folder: Path, python: str) -> tuple[str, bytes]:
    """The command that starts the agent and the source sent ahead of its step as podrun at `revision`
    does it (agent_command and agent_source, asked of that tree)."""
    asked = subprocess.run([sys.executable, "-P", "-c", "import sys; from podrun.transport.base import agent_command, "
                            "agent_source; sys.stdout.buffer.write(agent_command(sys.argv[1]).encode() + b'\\0' + "
                            "agent_source())", python], env={**os.environ, "PYTHONPATH": str(podrun_at(revision, folder))},
                           check=True, capture_output=True).stdout
    command, _, source = asked.partition(b"\0")
    return command.decode(), source


if __name__ == "__main__":
    main()
