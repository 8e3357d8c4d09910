#!/usr/bin/env python3
"""The restart gap: from a worker's failure to the next attempt's first line on every worker, against a
cached `podrun exec` of the same job (its code on every worker already), in the same run.

    sudo python scripts/bench_restart.py [--hosts 16] [--local 256] [--rounds 3]

For each target (N lab hosts, M local workers): the job's `run` writes the time it started on each
worker into a file under /tmp (which lab hosts share with this machine); with FAIL set, attempt 0's
worker 0 writes the time it fails and exits 3 while the others sleep, and `restarts: {max: 1, on:
[failure]}` runs attempt 1 (PODRUN_RESTART_BACKOFF=0: no wait). The gap is the last worker's start
in attempt 1 less the failure; the exec is the last worker's start less the moment `podrun exec` was
started. Rounds interleave the two. Where the gap goes comes from the restart's job record: from the
failure to attempt 0's end (the other workers stopped, the failure judged), then attempt 1's connect,
ship (the code's digest checked: nothing to send) and the rest, up to the last worker's first line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import Lab, print_table, require_lab_tools

STAMPS = Path("/tmp/podrun-bench-restart")
RUN = """\
stamps=/tmp/podrun-bench-restart/$PODRUN_JOB_ID
mkdir -p "$stamps"
if [ "$PODRUN_ATTEMPT" = 0 ] && [ -n "$FAIL" ]; then
  if [ "$PODRUN_WORKER" = 0 ]; then date +%s.%N > "$stamps/failed"; exit 3; fi
  exec sleep 600
fi
date +%s.%N > "$stamps/started.$PODRUN_WORKER"
"""


def spec_text(target: str, fail: bool) -> str:
    run = "".join(f"  {line}\n" for line in RUN.splitlines())
    return (f"name: restart\n{target}workdir: .\nrun: |\n{run}"
            + ("restarts: {max: 1, on: [failure]}\nenv: {FAIL: '1'}\n" if fail else ""))


def run_job(spec: Path, env: dict) -> tuple[float, str]:
    """`podrun exec` of the spec: when it was started (epoch seconds) and the job's id."""
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "podrun", "exec", "--no-collapse", str(spec)], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"podrun exec {spec} failed: {done.stderr}")
    job_id = done.stderr.split("podrun: job ", 1)[1].split(":", 1)[0]
    return started, job_id


def last_start(job_id: str, workers: int) -> float:
    stamps = STAMPS / job_id
    return max(float((stamps / f"started.{index}").read_text()) for index in range(workers))


def where_it_went(home: Path, job_id: str, failed: float, last: float) -> dict[str, float]:
    """The gap's parts, from the restart's record: the failure to attempt 0's end, then attempt 1's connect
    and ship, and the rest (its run's start on every worker, up to the last first line)."""
    record = json.loads((home / "jobs" / job_id / "job.json").read_text())
    phases = {entry["phase"]: entry for entry in record["phases"] if entry["attempt"] == 1}
    ended = record["attempts"][0]["ended_at"]
    connect, ship = phases["connect"], phases.get("ship")
    shipped = ship["end"] if ship else connect["end"]
    return {"failure to attempt's end": ended - failed, "to the next connect": connect["start"] - ended,
            "connect": connect["end"] - connect["start"], "ship": shipped - connect["end"],
            "run's start to last first line": last - shipped}


def measure(name: str, target: str, workers: int, rounds: int, work: Path) -> tuple[list[str], dict[str, float]]:
    home = work / f"home-{name}"
    env = {**os.environ, "PODRUN_HOME": str(home), "PODRUN_RESTART_BACKOFF": "0"}
    (work / name).mkdir()
    cached, failing = work / name / "cached.yaml", work / name / "failing.yaml"
    cached.write_text(spec_text(target, fail=False))
    failing.write_text(spec_text(target, fail=True))
    run_job(cached, env)  # the code on every worker, the agent cached: as a second exec finds them
    gaps, execs, parts = [], [], []
    for _ in range(rounds):
        started, job_id = run_job(cached, env)
        execs.append(last_start(job_id, workers) - started)
        _, job_id = run_job(failing, env)
        failed = float((STAMPS / job_id / "failed").read_text())
        last = last_start(job_id, workers)
        gaps.append(last - failed)
        parts.append(where_it_went(home, job_id, failed, last))
    gap, exec_s = statistics.median(gaps), statistics.median(execs)
    breakdown = {part: statistics.median(each[part] for each in parts) for part in parts[0]}
    return [f"{gap:.2f} s", f"{exec_s:.2f} s", f"{gap / exec_s:.2f}"], breakdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=16, help="0: no lab hosts, local workers only")
    parser.add_argument("--local", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    require_lab_tools()
    rows, parts = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        if args.hosts:
            with Lab(args.hosts, work / "lab") as lab:
                hosts = (f"target: {{hosts: [{', '.join(host.ip for host in lab.hosts)}]}}\n"
                         f"ssh: {{user: root, identity_file: {lab.client_key}}}\n")
                label = f"{args.hosts} SSH hosts"
                rows[label], parts[label] = measure("hosts", hosts, args.hosts, args.rounds, work)
        label = f"{args.local} local workers"
        rows[label], parts[label] = measure("local", f"target: {{local: {{workers: {args.local}}}}}\n", args.local,
                                            args.rounds, work)
    print_table(f"the restart gap against a cached exec, median of {args.rounds}",
                ["target", "restart gap", "cached exec", "gap / exec"], rows)
    print()
    columns = list(next(iter(parts.values())))
    print_table("where the gap goes (median)", ["target", *columns],
                {label: [f"{seconds:.2f} s" for seconds in breakdown.values()] for label, breakdown in parts.items()})


if __name__ == "__main__":
    main()
