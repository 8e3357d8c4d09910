#!/usr/bin/env python3
"""`podrun exec` on a Slurm cluster against the same job by hand, in the same run, on the Slurm lab.

    sudo python scripts/bench_slurm.py [--rounds 3] [--nodes 16] [--allocation]

On the lab's cluster (tests/slurm_lab.py: slurmctld on a login node, slurmd on --nodes compute nodes,
one shared home), reached over SSH as a user reaches a login node, interleaved round by round:
  start   from the command to the job's first line on every node (each node prints its time.time();
          the lab's nodes share this machine's clock):
            podrun exec, one step (code shipped before; salloc, the node list, ONE srun whose task on
            each node connects back to the login node and runs the agent: transport/slurm_step.py)
            podrun exec, a step per node (PODRUN_SLURM_STEPS=per-node: one srun per node, as before)
            by hand: `salloc --no-shell -N N` then ONE `srun --jobid J -N N python3 -c ...`, one ssh command
            the floor: the same by hand with a bare `python3 -I -S -c pass` on each node before the job (the
            least any launcher with a Python process of its own on each node, as podrun's agent, adds)
          with the CPU seconds the whole machine spent on each start (it runs to its end: the release too)
  stop    from a failure (the failing node, once every other node sleeps, prints its time, then exits 7)
          to every node's processes gone (ps on this machine, which shares the nodes' pid namespace,
          polled while the command goes on), and to the command's exit:
            podrun exec, one step and a step per node (fail-fast: SIGTERM to the others through their agents)
            by hand: `srun --kill-on-bad-exit=1` in a salloc allocation (Slurm kills the other tasks)
  allocate  (--allocation) the allocation alone, until squeue shows it RUNNING: `salloc --no-shell`
          (returns when granted) against `sbatch --wrap` + squeue polling
Prints medians and podrun's ratios to the job by hand.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from benchlib import busy_cpu_seconds  # noqa: E402
from slurm_lab import SlurmLab  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PRINT_TIME = "python3 -c 'import time,socket; print(\"T\", time.time(), socket.gethostname(), flush=True)'"
MARK = "bench-slurm-sleeper"


def times_in(text: str) -> list[float]:
    return [float(match) for match in re.findall(r"^(?:\[\S+\]\s+)?T (\d+\.\d+) ", text, re.M)]


def spec(path: Path, lab: SlurmLab, nodes: int, run: str, workdir: Path) -> Path:
    path.write_text(f"name: bench\ntarget: {{slurm: {{login: {lab.login_address}, nodes: {nodes}}}}}\n"
                    f"ssh: {{identity_file: {lab.client_key}}}\nworkdir: {workdir}\n"
                    f"env: {{PATH: '{Path(sys.executable).parent}:/usr/bin:/bin'}}\nrun: |\n  {run}\n")
    return path


def on_login(lab: SlurmLab, command: str) -> list[str]:
    return [*lab.ssh_args(), command]


PER_NODE = {"PODRUN_SLURM_STEPS": "per-node"}
FLOOR = "by hand, python3 -I -S -c pass first on each node"


def podrun(spec_path: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "podrun", "exec", "--no-collapse", str(spec_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def start_podrun(lab: SlurmLab, spec_path: Path, env: dict, nodes: int) -> tuple[float, float]:
    """Seconds to the job's line on every node, and the machine's CPU seconds for the whole command."""
    started, busy = time.time(), busy_cpu_seconds()
    result = podrun(spec_path, env)
    assert result.returncode == 0, result.stderr
    stamps = times_in(result.stdout)
    assert len(stamps) == nodes, result.stdout
    return max(stamps) - started, busy_cpu_seconds() - busy


def start_by_hand(lab: SlurmLab, nodes: int, before: str = "") -> tuple[float, float]:
    """As start_podrun, by hand; `before`: a command each node runs ahead of the job."""
    task = f"sh -c {shlex.quote(f'{before}; exec {PRINT_TIME}')}" if before else PRINT_TIME
    command = (f"J=$(salloc --no-shell -N {nodes} 2>&1 | sed -n 's/.*Granted job allocation //p'); "
               f"srun --jobid=$J -N {nodes} --ntasks-per-node=1 {task}; scancel $J")
    started, busy = time.time(), busy_cpu_seconds()
    result = subprocess.run(on_login(lab, command), capture_output=True, text=True, timeout=300)
    stamps = times_in(result.stdout)
    assert len(stamps) == nodes, result.stdout + result.stderr
    return max(stamps) - started, busy_cpu_seconds() - busy


def sleepers_gone(timeout: float = 120) -> float:
    """When no process of the job (marked MARK on its command line) is left on this machine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True).stdout
        if not any(MARK in line and "ps -eo" not in line for line in listed.splitlines()):
            return time.time()
        time.sleep(0.02)
    raise RuntimeError("the job's processes are still there")


def failing(nodes: int, worker: str) -> str:
    """The job of the fail-fast rounds: every node but worker 1 says it is up (a file in the shared home) and
    sleeps in a process marked MARK on its command line; worker 1 waits until all of them are up, prints
    its time and exits 7."""
    return (f"if [ \"{worker}\" = 1 ]; then until [ $(ls ~/.bench-up-* 2>/dev/null | wc -l) -ge {nodes - 1} ]; "
            f"do sleep 0.01; done; rm -f ~/.bench-up-*; {PRINT_TIME}; exit 7; fi; "
            f"touch ~/.bench-up-{worker}; exec python3 -c 'import time; time.sleep(300)' {MARK}")


def fail_fast(argv: list[str], env: dict | None = None) -> tuple[float, float, subprocess.CompletedProcess]:
    """From the failing node's line to every process of the job gone (ps, polled while the command goes on),
    and to the command's exit; and what it printed."""
    process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    said = ""
    while not (stamps := times_in(said)):
        line = process.stdout.readline()
        assert line, f"no line from the failing node: {said}"
        said += line
    gone = sleepers_gone()
    out, err = process.communicate(timeout=300)
    exited = time.time()
    return gone - stamps[0], exited - stamps[0], subprocess.CompletedProcess(argv, process.returncode, said + out, err)


def stop_podrun(lab: SlurmLab, spec_path: Path, env: dict) -> tuple[float, float]:
    """From the failure to every process gone, and to podrun's exit (after scancel, squeue empty)."""
    gone, exited, result = fail_fast([sys.executable, "-m", "podrun", "exec", "--no-collapse", str(spec_path)], env)
    assert result.returncode == 7, result.stderr
    return gone, exited


def stop_by_hand(lab: SlurmLab, nodes: int) -> tuple[float, float]:
    command = (f"J=$(salloc --no-shell -N {nodes} 2>&1 | sed -n 's/.*Granted job allocation //p'); "
               f"srun --jobid=$J -N {nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 "
               f"sh -c {shlex.quote(failing(nodes, '$SLURM_NODEID'))}; scancel $J; "
               f"while squeue -h -j $J 2>/dev/null | grep -q .; do sleep 0.05; done")
    gone, exited, _ = fail_fast(on_login(lab, command))
    return gone, exited


def allocate(lab: SlurmLab, nodes: int, how: str) -> float:
    if how == "salloc":
        command = f"salloc --no-shell -N {nodes} 2>&1 | sed -n 's/.*Granted job allocation //p'"
    else:
        command = (f"J=$(sbatch --parsable -N {nodes} --output=/dev/null --wrap='exec sleep 600'); "
                   f"until squeue -h -j $J -o %T | grep -q RUNNING; do sleep 0.05; done; echo $J")
    started = time.time()
    result = subprocess.run(on_login(lab, command), capture_output=True, text=True, timeout=120)
    took = time.time() - started
    lab.slurm(f"scancel {result.stdout.strip()}")
    lab.wait_until_no_jobs()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--allocation", action="store_true", help="also time salloc against sbatch + squeue")
    args = parser.parse_args()
    ours = {"one step": {}, "a step per node": PER_NODE}
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as work_dir:
        work = Path(work_dir)
        (work / "code").mkdir()
        env = {**os.environ, "PODRUN_HOME": str(work / "podrun-home")}
        with SlurmLab(work / "lab", compute_nodes=max(3, args.nodes), login_sessions=10) as lab:  # sshd's default
            lab.wait_until_idle()
            starting = spec(work / "start.yaml", lab, args.nodes, PRINT_TIME, work / "code")
            failing_job = spec(work / "fail.yaml", lab, args.nodes, failing(args.nodes, "$PODRUN_WORKER"), work / "code")
            podrun(starting, env)  # the code shipped, the login node's host key trusted
            for _ in range(args.rounds):
                starts = {f"podrun exec, {how}": start_podrun(lab, starting, {**env, **knobs}, args.nodes)
                          for how, knobs in ours.items()}
                starts["salloc + one srun by hand"] = start_by_hand(lab, args.nodes)
                starts[FLOOR] = start_by_hand(lab, args.nodes, f"{Path(sys.executable).parent}/python3 -I -S -c pass")
                for name, (seconds, cpu) in starts.items():
                    rows.setdefault(f"start: {name}", []).append(seconds)
                    rows.setdefault(f"machine CPU s, start: {name}", []).append(cpu)
                for how, knobs in ours.items():
                    gone, exited = stop_podrun(lab, failing_job, {**env, **knobs})
                    rows.setdefault(f"fail-fast, processes gone: podrun, {how}", []).append(gone)
                    rows.setdefault(f"fail-fast, to exit + squeue empty: podrun, {how}", []).append(exited)
                gone, exited = stop_by_hand(lab, args.nodes)
                rows.setdefault("fail-fast, processes gone: srun --kill-on-bad-exit", []).append(gone)
                rows.setdefault("fail-fast, to exit + squeue empty: by hand", []).append(exited)
                if args.allocation:
                    rows.setdefault("allocate: salloc --no-shell", []).append(allocate(lab, args.nodes, "salloc"))
                    rows.setdefault("allocate: sbatch + squeue", []).append(allocate(lab, args.nodes, "sbatch"))
    median = {name: statistics.median(values) for name, values in rows.items()}
    print(f"Slurm lab, {args.nodes} nodes, median of {args.rounds} rounds (seconds)")
    print("| what | median | min | max |")
    print("| --- | ---: | ---: | ---: |")
    for name, values in rows.items():
        print(f"| {name} | {median[name]:.3f} | {min(values):.3f} | {max(values):.3f} |")
    print(f"ratio start, the floor (by hand, a bare Python on each node first): "
          f"{median[f'start: {FLOOR}'] / median['start: salloc + one srun by hand']:.2f}x")
    for how in ours:
        for what, mine, theirs in (
                ("start", f"start: podrun exec, {how}", "start: salloc + one srun by hand"),
                ("start, to the floor", f"start: podrun exec, {how}", f"start: {FLOOR}"),
                ("machine CPU of the start", f"machine CPU s, start: podrun exec, {how}",
                 "machine CPU s, start: salloc + one srun by hand"),
                ("fail-fast (processes gone)", f"fail-fast, processes gone: podrun, {how}",
                 "fail-fast, processes gone: srun --kill-on-bad-exit"),
                ("fail-fast (to exit, squeue empty)", f"fail-fast, to exit + squeue empty: podrun, {how}",
                 "fail-fast, to exit + squeue empty: by hand")):
            print(f"ratio {what}, {how}: {median[mine] / median[theirs]:.2f}x")
    if args.allocation:
        print(f"ratio allocation, sbatch to salloc: "
              f"{median['allocate: sbatch + squeue'] / median['allocate: salloc --no-shell']:.2f}x")


if __name__ == "__main__":
    main()
