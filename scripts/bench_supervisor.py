#!/usr/bin/env python3
"""A supervisor host (issue 28): what handing a job over costs, and what a job costs the supervisor.

    sudo python scripts/bench_supervisor.py --hosts 4 16 [--rounds 5] [--jobs 1 4 8] [--sample-seconds 20]

One lab (tests/lab.py) of max(--hosts) workers and one more host, the supervisor, whose podrun is
this checkout's (a wrapper script on a path the lab hosts see). The job is `exec sleep 600`, its code
already shipped, host keys already trusted everywhere.
  - handover: `podrun exec SPEC --detach` as a whole process on N workers, with `supervisor:` in the
    spec against the same spec without it, interleaved (the order alternates from round to round);
    each job is stopped after with `podrun stop ID`, and every host is then checked to run nothing
    but its sshd. Then a few more supervised rounds with the handover's steps timed inside the
    laptop's podrun (a wrapper around podrun/supervisor/ functions): the handover begun (SSH
    connection, `_supervise` started: early.py), the laptop's own start-up meanwhile, `_supervise`'s
    start-up to the job's id, the supervisor's launch to run started. The first handover to the host
    (the podrun found there, then remembered) is not among the rounds timed.
  - cost per job: K detached supervised jobs on 4 workers each (spread over the workers); on the
    supervisor each has its launcher (an attached exec there, for as long as the job runs); for each
    K, every process on the supervisor host but its sshd: count, RSS (VmRSS) and PSS (smaps_rollup),
    and their CPU (utime + stime) over --sample-seconds of idle running; and how many of them are the
    launchers the supervisor's job records name (job.json's `launcher`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchlib import Lab, print_table, require_lab_tools, timed_with_cpu, write_lab_spec

REPO = Path(__file__).resolve().parents[1]
PODRUN = [sys.executable, "-P", "-m", "podrun"]  # -P: PYTHONPATH alone picks which podrun runs
CLEAN_TIMEOUT_S = 20
SETTLE_S = 5  # before sampling the supervisor: the handovers' SSH sessions end
# the laptop's podrun with the handover's steps timed: each wrapped function's start and end, written
# to $BENCH_STEPS before the process exits
TIMED_STEPS = """
import importlib.abc, importlib.util, json, os, sys, time
steps = [("process", time.time(), None)]

def wrap(module, name, asynchronous=True):
    inner = getattr(module, name)
    if asynchronous:
        async def timed(*args, **kwargs):
            begin = time.time()
            try:
                return await inner(*args, **kwargs)
            finally:
                steps.append((name, begin, time.time()))
    else:
        def timed(*args, **kwargs):
            begin = time.time()
            try:
                return inner(*args, **kwargs)
            finally:
                steps.append((name, begin, time.time()))
    setattr(module, name, timed)

class AfterHandover(importlib.abc.MetaPathFinder):
    # wraps handover.py's steps once the CLI imports it: importing it here would load pydantic before the
    # handover begins (supervisor/early.py), which is what is timed
    def find_spec(self, name, path, target=None):
        if name != "podrun.supervisor.handover":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            wrap(module, "_supervise")
            wrap(module, "_follow")
            wrap(module, "_pointer", asynchronous=False)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, AfterHandover())
from podrun.supervisor import early
wrap(early, "begin", asynchronous=False)
from podrun import cli
code = cli.main()
with open(os.environ["BENCH_STEPS"], "w") as record:
    record.write(json.dumps(steps))
cli._exit(code)  # as `podrun` exits
"""


class Bench:
    def __init__(self, lab: Lab, work: Path):
        self.lab, self.work = lab, work
        self.supervisor = len(lab.hosts) - 1
        (work / "code").mkdir()
        self.wrapper = work / "podrun-on-supervisor"
        self.wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m podrun "$@"\n')
        self.wrapper.chmod(0o755)
        self.home = work / "home"
        self.env = {**os.environ, "PODRUN_HOME": str(self.home), "PYTHONPATH": str(REPO)}

    def spec(self, name: str, workers: Sequence[int], supervised: bool) -> Path:
        spec = write_lab_spec(self.work / f"{name}.yaml", self.lab, "code", "exec sleep 600",
                              [self.lab.hosts[i] for i in workers])
        supervisor = f"supervisor: {{host: root@{self.lab.hosts[self.supervisor].ip}, podrun: {self.wrapper}}}\n"
        spec.write_text(spec.read_text() + (supervisor if supervised else ""))
        return spec

    def detach(self, spec: Path, command: list[str] | None = None, env: dict | None = None) -> tuple[str, tuple]:
        """`podrun exec SPEC --detach`: the new job's id and (wall, launcher CPU, machine CPU)."""
        before = self._jobs()
        measured = timed_with_cpu([*(command or PODRUN), "exec", str(spec), "--detach"], env or self.env)
        (job,) = self._jobs() - before
        return job, measured

    def _jobs(self) -> set[str]:
        jobs = self.home / "jobs"
        return set(os.listdir(jobs)) if jobs.is_dir() else set()

    def stop(self, job: str) -> float:
        started = time.monotonic()
        stopped = subprocess.run([*PODRUN, "stop", job], env=self.env, capture_output=True, text=True)
        if stopped.returncode:
            raise SystemExit(f"`podrun stop {job}` exited {stopped.returncode}: {stopped.stderr.strip()}")
        return time.monotonic() - started

    def host_processes(self, index: int) -> list[int]:
        """Every process on lab host `index` (in its mount namespace) but its sshd's listener and its warm
        podrun (supervisor/warm.py: it stays between jobs)."""
        listener = self.lab.hosts[index].sshd.pid
        namespace = os.readlink(f"/proc/{listener}/ns/mnt")
        found = []
        warm = self.warm(index)
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and int(entry) not in {listener, *warm} \
                        and os.readlink(f"/proc/{entry}/ns/mnt") == namespace:
                    found.append(int(entry))
            except OSError:  # it ended meanwhile
                pass
        return found

    def warm(self, index: int) -> list[int]:
        """The warm podruns on lab host `index`: the pid each wrote in its lock file."""
        found = []
        for lock in (self.lab.hosts[index].home / ".podrun" / "warm").glob("*.lock"):
            with contextlib.suppress(OSError, ValueError):
                found.append(int(lock.read_text()))
        return [pid for pid in found if os.path.exists(f"/proc/{pid}")]

    def wait_clean(self, hosts: list[int]) -> float:
        """Seconds until `hosts` run nothing but their sshd; stops the benchmark if they still do after
        CLEAN_TIMEOUT_S."""
        started = time.monotonic()
        while left := {i: pids for i in hosts if (pids := self.host_processes(i))}:
            if time.monotonic() - started > CLEAN_TIMEOUT_S:
                listing = "; ".join(f"host {i}: " + ", ".join(_command_line(pid) for pid in pids)
                                    for i, pids in left.items())
                raise SystemExit(f"left running {CLEAN_TIMEOUT_S}s after `podrun stop`: {listing}")
            time.sleep(0.05)
        return time.monotonic() - started

    def supervisor_job(self, job: str) -> dict:
        """The job's record on the supervisor (its own job store, under the host's home)."""
        return json.loads((self.lab.hosts[self.supervisor].home / ".podrun" / "jobs" / job / "job.json").read_text())


def handover(bench: Bench, counts: list[int], rounds: int, step_rounds: int) -> tuple[dict, dict]:
    """Per N: medians of each measure; and per N: median seconds of each handover step."""
    results, steps = {}, {}
    everyone = [*range(max(counts)), bench.supervisor]
    for count in counts:
        specs = {"with a supervisor": bench.spec(f"supervised{count}", range(count), True),
                 "without": bench.spec(f"plain{count}", range(count), False)}
        for spec in specs.values():  # trust the host keys, ship the (empty) code, everywhere
            bench.stop(bench.detach(spec)[0])
        bench.wait_clean(everyone)
        samples: dict[str, list[tuple]] = {name: [] for name in specs}
        for round_ in range(rounds):
            order = list(specs) if round_ % 2 == 0 else list(specs)[::-1]
            for name in order:
                job, measured = bench.detach(specs[name])
                stopped = bench.stop(job)
                samples[name].append((*measured, stopped, bench.wait_clean(everyone)))
        results[count] = {name: [statistics.median(sample[field] for sample in values) for field in range(5)]
                          for name, values in samples.items()}
        steps[count] = handover_steps(bench, specs["with a supervisor"], step_rounds, everyone)
    return results, steps


def handover_steps(bench: Bench, spec: Path, rounds: int, everyone: list[int]) -> dict[str, float]:
    """Median seconds of each step of a handover, timed inside the laptop's podrun."""
    names = ["laptop's start-up to the handover begun (Python, podrun's CLI, the spec read as YAML)",
             "SSH connection and `podrun _supervise` started there (asyncssh imported here)",
             "laptop: arguments, spec checked, code scanned; `_supervise` answered its version meanwhile",
             "`_supervise`: the rest of its start-up, to the job's id", "the supervisor's launch, to run started",
             "laptop's exit", "whole `exec --detach`"]
    samples: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        record = bench.work / "steps.json"
        env = {**bench.env, "BENCH_STEPS": str(record)}
        started = time.time()
        job, _ = bench.detach(spec, [sys.executable, "-P", "-c", TIMED_STEPS], env)
        ended = time.time()
        bench.stop(job)
        bench.wait_clean(everyone)
        marks = {name: (begin, end) for name, begin, end in json.loads(record.read_text())}
        points = [started, marks["begin"][0], marks["begin"][1], marks["_supervise"][1], marks["_pointer"][0],
                  marks["_follow"][1], ended]
        for name, begin, end in zip(names, points, points[1:]):
            samples[name].append(end - begin)
        samples[names[-1]].append(ended - started)
    return {name: statistics.median(values) for name, values in samples.items()}


def cost_per_job(bench: Bench, counts: list[int], workers: int, seconds: float) -> dict:
    """Per K: what runs on the supervisor while K supervised jobs run, idle."""
    measured = {}
    worker_count = bench.supervisor
    jobs: list[str] = []
    for count in counts:
        while len(jobs) < count:
            first = len(jobs) * workers % worker_count
            hosts = [(first + i) % worker_count for i in range(workers)]
            jobs.append(bench.detach(bench.spec(f"job{len(jobs)}", hosts, True))[0])
        measured[count] = sample_supervisor(bench, jobs, seconds)
    for job in jobs:
        bench.stop(job)
    bench.wait_clean([*range(worker_count), bench.supervisor])
    return measured


def sample_supervisor(bench: Bench, jobs: list[str], seconds: float) -> dict:
    """Every process on the supervisor host but sshd's listener, over `seconds` of idle running."""
    time.sleep(SETTLE_S)
    processes = bench.host_processes(bench.supervisor)
    recorded = {bench.supervisor_job(job)["launcher"]["pid"] for job in jobs}
    before, started = {pid: _cpu_seconds(pid) for pid in processes}, time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    after = {pid: _cpu_seconds(pid) for pid in processes}
    memory = {pid: _memory_kib(pid) for pid in processes}
    warm = [_memory_kib(pid)[1] for pid in bench.warm(bench.supervisor)]
    return {"processes": len(processes), "recorded": len(recorded & set(processes)),
            "rss_kib": sum(rss for rss, _ in memory.values()), "pss_kib": sum(pss for _, pss in memory.values()),
            "cpu_s_per_s": sum(after[pid] - before[pid] for pid in processes) / elapsed,
            "commands": sorted({_command_line(pid) for pid in processes}), "warm_pss_kib": sum(warm)}


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _memory_kib(pid: int) -> tuple[int, int]:
    """The process's VmRSS and PSS, KiB."""
    def field(path: str, name: str) -> int:
        line = next(line for line in Path(path).read_text().splitlines() if line.startswith(name + ":"))
        return int(line.split()[1])

    return field(f"/proc/{pid}/status", "VmRSS"), field(f"/proc/{pid}/smaps_rollup", "Pss")


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:80]
    except OSError:
        return f"{pid} (ended)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--step-rounds", type=int, default=3, help="supervised rounds with the steps timed")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--job-workers", type=int, default=4)
    parser.add_argument("--sample-seconds", type=float, default=20)
    args = parser.parse_args()
    if problem := require_lab_tools():
        sys.exit(problem)
    with tempfile.TemporaryDirectory() as workdir, Lab(max(args.hosts) + 1, Path(workdir)) as lab:
        bench = Bench(lab, Path(workdir))
        results, steps = handover(bench, args.hosts, args.rounds, args.step_rounds)
        costs = cost_per_job(bench, args.jobs, args.job_workers, args.sample_seconds)
    report(args, results, steps, costs)


def report(args, results: dict, steps: dict, costs: dict) -> None:
    counts = list(results)
    table = {}
    for field, measure in enumerate(("wall", "launcher CPU", "machine CPU", "`podrun stop`, wall",
                                     "from the stop to nothing left, wall")):
        for name in ("with a supervisor", "without"):
            table[f"exec --detach {name}, {measure}"] = [f"{results[n][name][field]:.2f}" for n in counts]
    for field, measure in ((0, "wall"), (2, "machine CPU")):
        table[f"with / without, {measure}"] = [
            f"{results[n]['with a supervisor'][field] / results[n]['without'][field]:.2f}x" for n in counts]
    print_table(f"`podrun exec SPEC --detach` on N workers, median of {args.rounds} interleaved rounds (s)",
                ["measure", *(f"N={n}" for n in counts)], table)
    print()
    print_table(f"the handover's steps, timed inside the laptop's podrun, median of {args.step_rounds} rounds (s)",
                ["step", *(f"N={n}" for n in counts)],
                {name: [f"{steps[n][name]:.3f}" for n in counts] for name in steps[counts[0]]})
    print()
    rows = {}
    for count, sample in costs.items():
        per_job = max(count, 1)
        rows[f"K={count}"] = [
            str(sample["processes"]), str(sample["recorded"]), f"{sample['rss_kib'] / 1024:.1f}",
            f"{sample['pss_kib'] / 1024:.1f}", f"{sample['pss_kib'] / 1024 / per_job:.1f}",
            f"{sample['cpu_s_per_s'] * 1000 / per_job:.2f}"]
    print_table(f"the supervisor host with K jobs running on {args.job_workers} workers each "
                f"(CPU over {args.sample_seconds:g} s idle)",
                ["jobs", "processes", "of them the jobs' launchers", "RSS, MiB", "PSS, MiB",
                 "PSS per job, MiB", "CPU per job, ms/s"], rows)
    for count, sample in costs.items():
        print(f"K={count}: {sample['commands']}; beside them, the warm podrun: "
              f"{sample['warm_pss_kib'] / 1024:.1f} MiB of PSS")


if __name__ == "__main__":
    main()
