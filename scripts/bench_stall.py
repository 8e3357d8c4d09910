#!/usr/bin/env python3
"""A hung job caught (`stall`): the time from its last output to the end of the stop, and what the
watch costs the agents.

    python scripts/bench_stall.py [--workers 4] [--runs 3] [--chatty-s 20]

1. Local workers each print a line and then hang in a Python function; `stall` is 1, 2 and 5 s. For
   an attached job: from the last line's arrival at podrun's stdout to podrun's exit (the stacks
   saved, every worker stopped). For a detached job: from the last write to a worker's output.log
   to the last process of the job gone (worker 0's agent watches). The floor is `stall` itself.
2. A detached job whose workers print 200 lines a second each, for --chatty-s seconds, with and
   without `stall` (the other agents then tell worker 0's agent "alive", at most every min(5 s,
   stall/4)): each agent's CPU (utime + stime from /proc), as CPU seconds per hour of run.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from benchlib import print_table  # noqa: E402
from helpers import processes_of_job  # noqa: E402

HANG = """\
import time
def hang_in_collective():
    time.sleep(600)
print("step 1", flush=True)
hang_in_collective()
"""
CHATTY = "import time\nwhile True:\n    print('loss 0.1234 step', flush=True)\n    time.sleep(0.005)\n"
STALLS_S = (1, 2, 5)


def podrun(home: Path, *args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PODRUN_HOME": str(home), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.Popen([sys.executable, "-m", "podrun", *args], cwd=REPO, env=env, **kwargs)


def write_job(work: Path, script: str, workers: int, stall: str | None) -> Path:
    (work / "code").mkdir(exist_ok=True)
    (work / "code" / "job.py").write_text(script)
    spec = work / "job.yaml"
    spec.write_text(f"run: python3 job.py\nworkdir: code\nstop_grace: 1s\ntarget: {{local: {{workers: {workers}}}}}\n"
                    + (f"stall: {stall}\n" if stall else ""))
    return spec


def job_id(stderr: bytes) -> str:
    return next(line.split()[2].rstrip(":") for line in stderr.decode().splitlines() if line.startswith("podrun: job "))


def attached_s(work: Path, workers: int, stall_s: int) -> float:
    """From the last line at podrun's stdout to podrun's exit."""
    launcher = podrun(work / "home", "exec", str(write_job(work, HANG, workers, f"{stall_s}s")),
                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert launcher.stdout is not None
    last_line_at = time.monotonic()
    for _ in launcher.stdout:
        last_line_at = time.monotonic()
    assert launcher.wait() == 124
    return time.monotonic() - last_line_at


def detached_s(work: Path, workers: int, stall_s: int) -> float:
    """From the last write to a worker's output.log to the last process of the job gone."""
    home = work / "home"
    launched = podrun(home, "exec", "--detach", str(write_job(work, HANG, workers, f"{stall_s}s")),
                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, stderr = launched.communicate()
    job = job_id(stderr)
    while processes_of_job(job):
        time.sleep(0.01)
    gone_at = time.time()
    logs = [home / "local" / f"w{index}" / ".podrun" / "jobs" / job / "output.log" for index in range(workers)]
    return gone_at - max(log.stat().st_mtime for log in logs)


def agents_cpu_per_hour(work: Path, workers: int, seconds: float, stall: str | None) -> float:
    """CPU seconds per hour of run of every agent of a chatty detached job, together."""
    home = work / "home"
    launched = podrun(home, "exec", "--detach", str(write_job(work, CHATTY, workers, stall)),
                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    job = job_id(launched.communicate()[1])
    job_dirs = [home / "local" / f"w{index}" / ".podrun" / "jobs" / job for index in range(workers)]
    agents = [int((job_dir / "run.agent").read_text()) for job_dir in job_dirs]
    before, started = sum(map(cpu_s, agents)), time.monotonic()
    time.sleep(seconds)  # the measured stretch of the run itself
    used, elapsed = sum(map(cpu_s, agents)) - before, time.monotonic() - started
    podrun(home, "stop", job, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).wait()
    return used / elapsed * 3600


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--chatty-s", type=float, default=20.0)
    args = parser.parse_args()
    rows: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        for stall_s in STALLS_S:
            for mode, measure in (("attached", attached_s), ("detached", detached_s)):
                times = sorted(measure(work, args.workers, stall_s) for _ in range(args.runs))
                rows[f"stall {stall_s}s, {mode}"] = [
                    f"{times[0]:.2f} / {statistics.median(times):.2f} / {times[-1]:.2f} s",
                    f"+{statistics.median(times) - stall_s:.2f} s"]
        print_table(f"last output -> job stopped ({args.workers} local workers, min / median / max of {args.runs})",
                    ["time", "over stall"], rows)
        cpu = {label: agents_cpu_per_hour(work, args.workers, args.chatty_s, stall)
               for label, stall in (("no stall", None), ("stall: 15m", "15m"), ("stall: 4s", "4s"))}
        print_table(f"agents' CPU, {args.workers} workers printing 200 lines/s each ({args.chatty_s:g} s of run)",
                    ["CPU s per hour, all agents", "against no stall"],
                    {label: [f"{value:.1f}", f"{value / cpu['no stall']:.2f}x"] for label, value in cpu.items()})


if __name__ == "__main__":
    main()
