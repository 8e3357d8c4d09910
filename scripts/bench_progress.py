"""What tracking a job's progress (the spec's `progress`) costs per output line, against the collapse's cost.

The step is read on each worker, by its agent (remote/step_reader.py): its cost is per line, on the
worker. The launcher gets one `step` event per worker per second at most, whatever the job prints: its
cost is per event (the event's JSON read, progress.advance).

    python scripts/bench_progress.py [--workers 1024] [--lines 20] [--end-to-end 1024]

In-process (each worker's reader fed its own output, 64 KiB reads as the agent gets them): the agent's
CPU per line with a pattern; the launcher's CPU per step event, and per line where each worker prints
LINES lines a second; the collapse's CPU per line for the same workers (scripts/bench_collapse.py).
--end-to-end N: N local workers each print 200 lines (one in ten a step) through `podrun exec`, with
and without `progress`, interleaved, 3 rounds: the wall time and the CPU of podrun and every process
it started (its agents and the job), from wait4.
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

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

PRINTER = """import sys
for line in range(200):
    print(f"step {line // 10} loss 0.{line}" if line % 10 == 0 else f"telemetry gpu0 util 97% mem {line}")
"""


def agent_cost_per_line(workers: int, rounds: int = 20, lines_per_round: int = 20) -> float:
    """Seconds of CPU per line that StepReader.feed takes."""
    from podrun.remote.step_reader import StepReader

    readers = [StepReader({"pattern": r"step (\d+)"}, ".") for _ in range(workers)]
    chunks = [b"".join(b"step %d loss 0.1\n" % (round_number * lines_per_round + line) if line % 10 == 0
                       else b"telemetry gpu0 util 97%% mem %d\n" % line for line in range(lines_per_round))
              for round_number in range(rounds)]
    started = time.process_time()
    for chunk in chunks:
        for reader in readers:
            reader.feed(chunk)
    return (time.process_time() - started) / (workers * rounds * lines_per_round)


def launcher_cost_per_event(workers: int, rounds: int = 20) -> float:
    """Seconds of CPU per `step` event: its JSON line read (as WorkerStep._take does) and progress.advance."""
    from podrun import jobstore, progress

    record = jobstore.JobRecord("bench", "bench", f"local:{workers}", "job.yaml",
                                [jobstore.WorkerRecord(index, f"w{index}") for index in range(workers)])
    events = [[b'{"event": "step", "step": %d, "at": %r}\n' % (round_number * 10, 1000.0 + round_number + index / 1e4)
               for index in range(workers)] for round_number in range(rounds)]
    started = time.process_time()
    for batch in events:
        for worker, line in zip(record.workers, batch):
            event = json.loads(line.decode())
            progress.advance(record, worker, int(event["step"]), float(event["at"]))
    return (time.process_time() - started) / (workers * rounds)


def end_to_end(workers: int, with_progress: bool, printer: Path, home: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of podrun and everything it started) of one exec."""
    spec = printer.parent.parent / ("progress.yaml" if with_progress else "plain.yaml")
    spec.write_text(f"target: {{local: {{workers: {workers}}}}}\nworkdir: code\nrun: {sys.executable} -I -S printer.py\n"
                    + ("progress: 'step (\\d+)'\n" if with_progress else ""))
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "podrun", "exec", str(spec)], cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "PODRUN_HOME": str(home)})
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.monotonic() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"podrun exec failed with {os.waitstatus_to_exitcode(status)} at {workers} workers")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=1024)
    parser.add_argument("--lines", type=int, default=20, help="lines each worker prints a second")
    parser.add_argument("--end-to-end", type=int, help="local workers for the end-to-end comparison")
    args = parser.parse_args()
    from bench_collapse import cost_per_line

    agent = agent_cost_per_line(args.workers)
    event = launcher_cost_per_event(args.workers)
    collapse = cost_per_line(args.workers)
    print(f"| at {args.workers} workers | CPU |\n|---|---|")
    print(f"| agent, per line (a step line in ten) | {agent * 1e6:.2f} µs |")
    print(f"| launcher, per step event | {event * 1e6:.2f} µs |")
    print(f"| launcher, per line at {args.lines} lines a second per worker | {event / args.lines * 1e6:.2f} µs |")
    print(f"| collapse, per line (for comparison) | {collapse * 1e6:.2f} µs |")
    if not args.end_to_end:
        return
    with tempfile.TemporaryDirectory() as work:
        (Path(work) / "code").mkdir()
        printer = Path(work) / "code" / "printer.py"
        printer.write_text(PRINTER)
        runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(3):
            for with_progress in (False, True):
                runs[with_progress].append(end_to_end(args.end_to_end, with_progress, printer, Path(work) / "home"))
        print(f"\n| {args.end_to_end} local workers x 200 lines | wall (median) | CPU of all (median) |\n|---|---|---|")
        for with_progress, label in ((False, "without progress"), (True, "with progress")):
            walls, cpus = zip(*runs[with_progress])
            print(f"| {label} | {statistics.median(walls):.2f} s | {statistics.median(cpus):.2f} s |")


if __name__ == "__main__":
    main()
